//! gRPC plumbing the three connectors' clients share when they talk to Google: the
//! authenticated TLS connection, the one channel type every client calls through (plaintext to
//! an emulator, or TLS with OAuth tokens), credentials files, the `x-goog-request-params`
//! routing header, per-attempt deadlines, and request bodies that are already serialized.
//!
//! What is specific to a service (its endpoints, method paths, how statuses are classified,
//! how many channels it opens) stays in that connector's `client` module.

use std::fmt::Debug;
use std::path::Path;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::TryFutureExt;
use futures::future::{Either, MapErr};
use gcloud_sdk::google_cloud_auth::credentials::{
    Credentials, external_account, impersonated, service_account, user_account,
};
use gcloud_sdk::{GoogleApi, GoogleAuthMiddleware, RequestTimeouts};
use tonic::codegen::{Body, BoxFuture, Bytes, Service, StdError, http};
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::transport::{Endpoint, channel::ResponseFuture};

use crate::error::{Error, Result};

/// The OAuth scope requested for credentials read from `credentials_file`.
pub const CLOUD_PLATFORM_SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";

/// The metadata key of the routing header Google front ends use to send a call to the backend
/// that owns its resource (AIP-4222).
pub const ROUTING_HEADER: &str = "x-goog-request-params";

/// Opens an authenticated TLS connection to a Google endpoint.
///
/// Installs the process-wide crypto provider first
/// ([`install_crypto_provider`](crate::connectors::install_crypto_provider)). Credentials come
/// from `credentials_file` when given (see [`credentials_from_file`]), else from Application
/// Default Credentials. The channel is connected here, so every failure — an unreadable
/// credentials file as much as an unreachable endpoint — is an [`Error::Connect`] naming
/// `endpoint`.
///
/// More channels sharing the same token source can be opened from the result with
/// `GoogleApi::connect_with_endpoint`.
///
/// Credentials never travel in plaintext: an `endpoint` that is not `https://` is refused
/// before any credential is loaded (see [`require_tls`]). An emulator is reached through
/// [`Connection::plaintext`] instead, which carries none.
pub async fn connect(
    endpoint: &str,
    credentials_file: Option<&Path>,
) -> Result<GoogleApi<GoogleAuthMiddleware>> {
    crate::connectors::install_crypto_provider();
    let connect_error = |message: String| Error::Connect {
        endpoint: endpoint.to_string(),
        message,
    };
    require_tls(endpoint).map_err(connect_error)?;
    match credentials_file {
        Some(path) => {
            let credentials = credentials_from_file(path).map_err(connect_error)?;
            GoogleApi::from_function_with_credentials(
                std::convert::identity,
                endpoint,
                None,
                credentials,
            )
            .await
        }
        None => GoogleApi::from_function(std::convert::identity, endpoint, None).await,
    }
    .map_err(|e| connect_error(e.to_string()))
}

/// Refuses an endpoint that would carry credentials without TLS: anything but `https://`.
pub fn require_tls(endpoint: &str) -> std::result::Result<(), String> {
    match endpoint.trim().get(..8) {
        Some(scheme) if scheme.eq_ignore_ascii_case("https://") => Ok(()),
        _ => Err(
            "refusing to send credentials without TLS: an endpoint must be https:// (an emulator \
             is reached with emulator_host, in plaintext and without credentials)"
                .into(),
        ),
    }
}

/// One gRPC channel a client calls through: plaintext (an emulator or a fake server: no TLS,
/// no credentials) or TLS to Google with OAuth tokens added by gcloud-sdk's auth middleware.
///
/// It is a tower service, so a generated client (`PublisherClient::new(channel)`) or
/// [`unary_pre_encoded`] takes either kind without the caller matching on it. Cloning is cheap
/// and shares the underlying HTTP/2 connection.
#[derive(Clone)]
pub enum GrpcChannel {
    /// A plaintext channel (see [`crate::emulators::plaintext_endpoint`]).
    Plaintext(tonic::transport::Channel),
    /// An authenticated TLS channel to a Google endpoint.
    Google(GoogleAuthMiddleware),
}

impl GrpcChannel {
    /// Whether calls go to Google through the auth middleware (and so whether a deadline also
    /// bounds the token fetch; see [`with_deadline`]).
    pub fn is_google(&self) -> bool {
        matches!(self, GrpcChannel::Google(_))
    }
}

impl Debug for GrpcChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            GrpcChannel::Plaintext(_) => "GrpcChannel::Plaintext",
            GrpcChannel::Google(_) => "GrpcChannel::Google",
        })
    }
}

type PlaintextFuture = MapErr<ResponseFuture, fn(tonic::transport::Error) -> StdError>;

fn boxed_error(error: tonic::transport::Error) -> StdError {
    error.into()
}

impl Service<http::Request<tonic::body::Body>> for GrpcChannel {
    type Response = http::Response<tonic::body::Body>;
    type Error = StdError;
    type Future = Either<PlaintextFuture, BoxFuture<http::Response<tonic::body::Body>, StdError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), StdError>> {
        match self {
            GrpcChannel::Plaintext(channel) => channel.poll_ready(cx).map_err(Into::into),
            GrpcChannel::Google(service) => service.poll_ready(cx),
        }
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        match self {
            GrpcChannel::Plaintext(channel) => Either::Left(
                channel
                    .call(request)
                    .map_err(boxed_error as fn(tonic::transport::Error) -> StdError),
            ),
            GrpcChannel::Google(service) => Either::Right(service.call(request)),
        }
    }
}

/// Where a transport's channels come from: an emulator address (plaintext channels, connected
/// lazily, without HTTP/2 keepalive pings and without credentials) or an authenticated Google
/// endpoint (TLS, credentials from `credentials_file` or Application Default Credentials).
#[derive(Clone)]
pub enum Connection {
    /// Plaintext channels to this address.
    Plaintext(Box<Endpoint>),
    /// The authenticated client of the first endpoint; further channels share its token source.
    Google(GoogleApi<GoogleAuthMiddleware>),
}

impl Connection {
    /// Prepares the channels of a transport.
    ///
    /// With an `emulator_host` (an empty one counts as none) the address is only parsed
    /// ([`crate::emulators::plaintext_endpoint`]); nothing connects until the first call. Else
    /// the credentials are loaded and a TLS channel to `endpoint` is connected here (see
    /// [`connect`]); failures are [`Error::Connect`].
    pub async fn open(
        emulator_host: Option<&str>,
        endpoint: &str,
        credentials_file: Option<&Path>,
    ) -> Result<Self> {
        match emulator_host.filter(|h| !h.trim().is_empty()) {
            Some(host) => Self::plaintext(host),
            None => Ok(Connection::Google(
                connect(endpoint, credentials_file).await?,
            )),
        }
    }

    /// Plaintext channels to `host` (`host:port` or `http://host:port`); connects nothing.
    pub fn plaintext(host: &str) -> Result<Self> {
        Ok(Connection::Plaintext(Box::new(
            crate::emulators::plaintext_endpoint(host)?,
        )))
    }

    /// Whether the channels are plaintext ones (an emulator or a fake server).
    pub fn is_plaintext(&self) -> bool {
        matches!(self, Connection::Plaintext(_))
    }

    /// The first channel: a new lazily connected plaintext channel, or the authenticated channel
    /// [`open`](Self::open) connected.
    pub fn channel(&self) -> GrpcChannel {
        match self {
            Connection::Plaintext(endpoint) => GrpcChannel::Plaintext(endpoint.connect_lazy()),
            Connection::Google(api) => GrpcChannel::Google(api.get()),
        }
    }

    /// Another channel: plaintext ones go to the same address whatever `url` says; Google ones
    /// are connected to `url` now, sharing the first channel's credentials and token source.
    /// The error is the connection failure's message.
    pub async fn channel_to(&self, url: &str) -> std::result::Result<GrpcChannel, String> {
        match self {
            Connection::Plaintext(endpoint) => Ok(GrpcChannel::Plaintext(endpoint.connect_lazy())),
            Connection::Google(api) => {
                require_tls(url)?;
                api.connect_with_endpoint(std::convert::identity, url, None)
                    .await
                    .map(|api| GrpcChannel::Google(api.get()))
                    .map_err(|e| e.to_string())
            }
        }
    }
}

/// Builds credentials from a JSON credentials file, by its `type`: `service_account`,
/// `authorized_user`, `impersonated_service_account` or `external_account`, each asking for
/// [`CLOUD_PLATFORM_SCOPE`].
///
/// The error is a sentence naming the file: it cannot be read, is not JSON, has another
/// `type`, or its contents are refused by the credentials builder.
///
/// # Example
///
/// ```
/// use gcp_sql::connectors::google::credentials_from_file;
///
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("key.json");
/// std::fs::write(&path, r#"{"type": "api_key"}"#).unwrap();
/// let err = credentials_from_file(&path).unwrap_err();
/// assert!(err.contains("credential type 'api_key'"));
/// ```
pub fn credentials_from_file(path: &Path) -> std::result::Result<Credentials, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read credentials_file '{}': {e}", path.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("credentials_file '{}' is not JSON: {e}", path.display()))?;
    let kind = json
        .get("type")
        .and_then(|t| t.as_str())
        .unwrap_or_default()
        .to_string();
    let scopes = [CLOUD_PLATFORM_SCOPE];
    let built = match kind.as_str() {
        "service_account" => service_account::Builder::new(json)
            .with_access_specifier(service_account::AccessSpecifier::from_scopes(scopes))
            .build(),
        "authorized_user" => user_account::Builder::new(json).with_scopes(scopes).build(),
        "impersonated_service_account" => {
            impersonated::Builder::new(json).with_scopes(scopes).build()
        }
        "external_account" => external_account::Builder::new(json)
            .with_scopes(scopes)
            .build(),
        other => {
            return Err(format!(
                "credentials_file '{}' has credential type '{other}'; supported are service_account, \
                 authorized_user, impersonated_service_account and external_account",
                path.display()
            ));
        }
    };
    built.map_err(|e| format!("credentials_file '{}': {e}", path.display()))
}

/// The value of an [`ROUTING_HEADER`] header: `key=value` pairs joined by `&`, each value
/// percent-encoded (every byte except ASCII letters, digits and `-_.~`). Keys are written as
/// they are.
///
/// # Example
///
/// ```
/// use gcp_sql::connectors::google::routing_value;
///
/// let value = routing_value(&[("topic", "projects/p/topics/t")]).unwrap();
/// assert_eq!(value.to_str().unwrap(), "topic=projects%2Fp%2Ftopics%2Ft");
/// ```
pub fn routing_value(pairs: &[(&str, &str)]) -> std::result::Result<AsciiMetadataValue, String> {
    let mut value =
        String::with_capacity(pairs.iter().map(|(key, v)| key.len() + v.len() + 16).sum());
    for (n, (key, v)) in pairs.iter().enumerate() {
        if n > 0 {
            value.push('&');
        }
        value.push_str(key);
        value.push('=');
        for b in v.bytes() {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                value.push(b as char);
            } else {
                value.push_str(&format!("%{b:02X}"));
            }
        }
    }
    MetadataValue::try_from(value).map_err(|e| e.to_string())
}

/// Applies the per-attempt deadline `timeout` to `request`: it travels as `grpc-timeout`, and
/// on an authenticated channel (`google`) it also bounds the token fetch the auth middleware
/// makes before the call. A zero or absent timeout means no deadline, as it does in gax.
pub fn with_deadline<M>(
    mut request: tonic::Request<M>,
    timeout: Option<Duration>,
    google: bool,
) -> tonic::Request<M> {
    if let Some(timeout) = timeout.filter(|t| !t.is_zero()) {
        request.set_timeout(timeout);
        if google {
            // Also bounds the token fetch the auth middleware does before the call.
            request
                .extensions_mut()
                .insert(RequestTimeouts::new().with_total(timeout));
        }
    }
    request
}

/// A request message already serialized (by the connector's mapping), written to the wire as
/// it is, so a batch is sent without building and re-encoding the generated prost types.
///
/// `B` is the buffer: a `Vec<u8>` by default, or anything else that reads as bytes (such as
/// [`Bytes`], to share one body between calls). The type is only ever encoded; decoding one
/// skips every field.
///
/// # Example
///
/// ```
/// use gcp_sql::connectors::google::PreEncoded;
/// use prost::Message;
///
/// // A `Topic` whose `name` (field 1) is "t".
/// let body = PreEncoded(vec![0x0a, 0x01, b't']);
/// assert_eq!(body.encoded_len(), 3);
/// assert_eq!(body.encode_to_vec(), [0x0a, 0x01, b't']);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PreEncoded<B = Vec<u8>>(pub B);

impl<B> prost::Message for PreEncoded<B>
where
    B: AsRef<[u8]> + Default + Debug + Send + Sync,
{
    fn encode_raw(&self, buf: &mut impl prost::bytes::BufMut) {
        buf.put_slice(self.0.as_ref());
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl prost::bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> std::result::Result<(), prost::DecodeError> {
        // Only ever encoded; a decode (which nothing does) would skip every field.
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.0.as_ref().len()
    }

    fn clear(&mut self) {
        self.0 = B::default();
    }
}

/// Waits until `service` can take a call and returns a gRPC client on it; a service that
/// cannot become ready is `UNAVAILABLE` ("channel not ready: ...").
pub async fn ready<T>(service: T) -> std::result::Result<tonic::client::Grpc<T>, tonic::Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<StdError>,
    T::ResponseBody: Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as Body>::Error: Into<StdError> + Send,
{
    let mut grpc = tonic::client::Grpc::new(service);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("channel not ready: {}", e.into())))?;
    Ok(grpc)
}

/// Makes one unary call of the method at `path` (`/package.Service/Method`) on `service`,
/// sending the pre-serialized body of `request` and decoding the response as `R`.
pub async fn unary_pre_encoded<T, B, R>(
    service: T,
    request: tonic::Request<PreEncoded<B>>,
    path: &'static str,
) -> std::result::Result<tonic::Response<R>, tonic::Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<StdError>,
    T::ResponseBody: Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as Body>::Error: Into<StdError> + Send,
    B: AsRef<[u8]> + Default + Debug + Send + Sync + 'static,
    R: prost::Message + Default + Send + 'static,
{
    let mut grpc = ready(service).await?;
    let codec = tonic_prost::ProstCodec::<PreEncoded<B>, R>::default();
    grpc.unary(request, http::uri::PathAndQuery::from_static(path), codec)
        .await
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    #[test]
    fn routing_value_percent_encodes_reserved_bytes_of_a_value() {
        let value = routing_value(&[("topic", "projects/p/topics/a+b%c")]).unwrap();
        assert_eq!(
            value.to_str().unwrap(),
            "topic=projects%2Fp%2Ftopics%2Fa%2Bb%25c"
        );
    }

    #[test]
    fn routing_value_joins_pairs_with_an_ampersand() {
        let value = routing_value(&[
            ("table_name", "projects/p/instances/i/tables/t"),
            ("app_profile_id", "batch"),
        ])
        .unwrap();
        assert_eq!(
            value.to_str().unwrap(),
            "table_name=projects%2Fp%2Finstances%2Fi%2Ftables%2Ft&app_profile_id=batch"
        );
    }

    #[test]
    fn routing_value_percent_encodes_non_ascii_and_separator_bytes() {
        let value = routing_value(&[("name", "é &=x y")]).unwrap();
        assert_eq!(value.to_str().unwrap(), "name=%C3%A9%20%26%3Dx%20y");
    }

    #[test]
    fn routing_value_of_no_pairs_is_empty() {
        assert_eq!(routing_value(&[]).unwrap().to_str().unwrap(), "");
    }

    #[test]
    fn the_attempt_timeout_travels_as_grpc_timeout_and_zero_means_none() {
        let timed = with_deadline(
            tonic::Request::new(()),
            Some(Duration::from_millis(1_500)),
            true,
        );
        assert!(timed.metadata().get("grpc-timeout").is_some());
        assert_eq!(
            timed.extensions().get::<RequestTimeouts>(),
            Some(&RequestTimeouts::new().with_total(Duration::from_millis(1_500)))
        );
        let plain = with_deadline(tonic::Request::new(()), Some(Duration::from_secs(1)), false);
        assert!(plain.metadata().get("grpc-timeout").is_some());
        assert!(plain.extensions().get::<RequestTimeouts>().is_none());
        for none in [None, Some(Duration::ZERO)] {
            let request = with_deadline(tonic::Request::new(()), none, true);
            assert!(request.metadata().get("grpc-timeout").is_none(), "{none:?}");
            assert!(
                request.extensions().get::<RequestTimeouts>().is_none(),
                "{none:?}"
            );
        }
    }

    #[test]
    fn refuses_a_credentials_file_of_an_unknown_type() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("creds.json");
        std::fs::write(&path, r#"{"type": "mystery"}"#).unwrap();
        let err = credentials_from_file(&path).unwrap_err();
        assert!(
            err.contains("mystery") && err.contains("service_account"),
            "{err}"
        );
        let missing = credentials_from_file(&dir.path().join("absent.json")).unwrap_err();
        assert!(missing.contains("cannot read"), "{missing}");
        std::fs::write(&path, "not json").unwrap();
        assert!(
            credentials_from_file(&path)
                .unwrap_err()
                .contains("not JSON")
        );
    }

    #[test]
    fn refuses_a_credentials_file_without_a_type() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("creds.json");
        std::fs::write(&path, r#"{"client_email": "a@b"}"#).unwrap();
        let err = credentials_from_file(&path).unwrap_err();
        assert!(err.contains("credential type ''"), "{err}");
    }

    #[tokio::test]
    async fn an_unreadable_credentials_file_fails_the_connection_naming_the_endpoint() {
        let dir = tempfile::tempdir().unwrap();
        let absent = dir.path().join("absent.json");
        let result = connect("https://pubsub.googleapis.com", Some(&absent)).await;
        match result {
            Err(Error::Connect { endpoint, message }) => {
                assert_eq!(endpoint, "https://pubsub.googleapis.com");
                assert!(message.contains("cannot read"), "{message}");
            }
            Err(other) => panic!("expected a connect error, got {other:?}"),
            Ok(_) => panic!("connected with a credentials file that does not exist"),
        }
    }

    #[tokio::test]
    async fn a_plaintext_endpoint_with_credentials_is_refused_before_they_are_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let absent = dir.path().join("absent.json");
        for (endpoint, credentials) in [
            ("http://pubsub.googleapis.com", Some(absent.as_path())),
            ("http://127.0.0.1:1", None),
            ("pubsub.googleapis.com:443", None),
        ] {
            match connect(endpoint, credentials).await {
                Err(Error::Connect {
                    endpoint: e,
                    message,
                }) => {
                    assert_eq!(e, endpoint);
                    assert!(message.contains("without TLS"), "{message}");
                }
                Err(other) => panic!("expected a connect error, got {other:?}"),
                Ok(_) => panic!("connected to {endpoint} without TLS"),
            }
        }
        assert!(require_tls("HTTPS://pubsub.googleapis.com").is_ok());
    }

    #[tokio::test]
    async fn an_emulator_connection_never_reads_the_credentials_file() {
        // A credentials file that does not exist: reading it would fail the open.
        let dir = tempfile::tempdir().unwrap();
        let absent = dir.path().join("absent.json");
        let connection = Connection::open(
            Some("127.0.0.1:1"),
            "https://pubsub.googleapis.com",
            Some(&absent),
        )
        .await
        .unwrap();
        assert!(connection.is_plaintext());
        assert!(!connection.channel().is_google());
    }

    #[tokio::test]
    async fn an_emulator_connection_hands_out_plaintext_channels_whatever_the_url() {
        let connection =
            Connection::open(Some("127.0.0.1:1"), "https://pubsub.googleapis.com", None)
                .await
                .unwrap();
        assert!(connection.is_plaintext());
        assert!(!connection.channel().is_google());
        let admin = connection
            .channel_to("https://bigtableadmin.googleapis.com")
            .await
            .unwrap();
        assert!(!admin.is_google());
    }

    #[test]
    fn an_invalid_emulator_address_is_a_connect_error_naming_it() {
        match Connection::plaintext("http://[::1") {
            Err(Error::Connect { endpoint, .. }) => assert_eq!(endpoint, "http://[::1"),
            Err(other) => panic!("expected a connect error, got {other:?}"),
            Ok(_) => panic!("accepted an invalid address"),
        }
    }

    #[tokio::test]
    async fn a_plaintext_grpc_channel_fails_a_call_as_the_bare_channel_does() {
        let endpoint = crate::emulators::plaintext_endpoint("127.0.0.1:1").unwrap();
        let call = || tonic::Request::new(PreEncoded(vec![0x0a, 0x01, b't']));
        let path = "/google.pubsub.v1.Publisher/Publish";
        let bare: std::result::Result<tonic::Response<PreEncoded>, _> =
            unary_pre_encoded(endpoint.connect_lazy(), call(), path).await;
        let wrapped: std::result::Result<tonic::Response<PreEncoded>, _> = unary_pre_encoded(
            GrpcChannel::Plaintext(endpoint.connect_lazy()),
            call(),
            path,
        )
        .await;
        let (bare, wrapped) = (bare.unwrap_err(), wrapped.unwrap_err());
        assert_eq!(bare.code(), wrapped.code());
        assert_eq!(bare.message(), wrapped.message());
    }

    #[test]
    fn pre_encoded_bytes_go_to_the_wire_unchanged() {
        let body = vec![0x0a, 0x03, b'a', b'b', b'c', 0x10, 0x01];
        let message = PreEncoded(body.clone());
        assert_eq!(message.encoded_len(), body.len());
        assert_eq!(message.encode_to_vec(), body);
        let shared = PreEncoded(Bytes::from(body.clone()));
        assert_eq!(shared.encode_to_vec(), body);
    }

    #[test]
    fn decoding_into_pre_encoded_skips_every_field() {
        let decoded = PreEncoded::<Vec<u8>>::decode(&[0x0a, 0x01, b't', 0x10, 0x05][..]).unwrap();
        assert!(decoded.0.is_empty());
        assert!(PreEncoded::<Vec<u8>>::decode(&[0x0a, 0x05, b't'][..]).is_err());
    }
}
