//! gRPC plumbing the three connectors' clients share when they talk to Google: the
//! authenticated TLS connection, the one channel type every client calls through (plaintext to
//! an emulator, or TLS with OAuth tokens), credentials files, the `x-goog-request-params`
//! routing header, per-attempt deadlines, request bodies that are already serialized, and the
//! one place a broken connection becomes a retryable status ([`transport_status`]).
//!
//! What is specific to a service (its endpoints, method paths, how statuses are classified,
//! how many channels it opens) stays in that connector's `client` module.

use std::fmt::Debug;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::TryFutureExt;
use futures::future::{Either, MapErr, MapOk};
use gcloud_sdk::google_cloud_auth::credentials::{
    Credentials, external_account, impersonated, service_account, user_account,
};
use gcloud_sdk::{GoogleApi, GoogleAuthMiddleware, RequestTimeouts};
use http_body_util::BodyExt;
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

type GrpcResponse = http::Response<tonic::body::Body>;

fn boxed_error(error: tonic::transport::Error) -> StdError {
    error.into()
}

/// A call's failure as tonic would turn it into a status, passed through [`transport_status`];
/// tonic takes a boxed `Status` as it is.
fn call_error(error: StdError) -> StdError {
    Box::new(transport_status(tonic::Status::from_error(error)))
}

/// The response with its body's failures (a connection broken mid-response) passed through
/// [`transport_status`].
fn response_errors(response: GrpcResponse) -> GrpcResponse {
    response.map(|body| tonic::body::Body::new(body.map_err(transport_status)))
}

impl Service<http::Request<tonic::body::Body>> for GrpcChannel {
    type Response = GrpcResponse;
    type Error = StdError;
    /// The channel's own future, its failures and its response body's failures passed through
    /// [`transport_status`].
    type Future = MapOk<
        MapErr<
            Either<PlaintextFuture, BoxFuture<GrpcResponse, StdError>>,
            fn(StdError) -> StdError,
        >,
        fn(GrpcResponse) -> GrpcResponse,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), StdError>> {
        match self {
            GrpcChannel::Plaintext(channel) => channel.poll_ready(cx).map_err(Into::into),
            GrpcChannel::Google(service) => service.poll_ready(cx),
        }
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let call = match self {
            GrpcChannel::Plaintext(channel) => Either::Left(
                channel
                    .call(request)
                    .map_err(boxed_error as fn(tonic::transport::Error) -> StdError),
            ),
            GrpcChannel::Google(service) => Either::Right(service.call(request)),
        };
        call.map_err(call_error as fn(StdError) -> StdError)
            .map_ok(response_errors as fn(GrpcResponse) -> GrpcResponse)
    }
}

/// What broke, when a status's source chain shows the call never got the server's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TransportFailure {
    /// The connection: refused, reset, closed, a GOAWAY, a reset stream, an I/O error.
    Connection,
    /// The client's own per-attempt deadline (tonic's `TimeoutExpired`, which it reports as
    /// `CANCELLED` "Timeout expired").
    ClientDeadline,
}

/// Walks `status`'s source chain for a transport failure: the first error in it that is a
/// client-side timeout or a connection-level error decides; a `Status` nested in the chain (one
/// a middleware returned) is an answer and stops the walk.
fn transport_failure(status: &tonic::Status) -> Option<TransportFailure> {
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if error.is::<tonic::Status>() {
            return None;
        }
        if error.is::<tonic::TimeoutExpired>() {
            return Some(TransportFailure::ClientDeadline);
        }
        if let Some(h2) = error.downcast_ref::<h2::Error>() {
            // A peer refusing the connection's security is not going to change on a retry.
            return (h2.reason() != Some(h2::Reason::INADEQUATE_SECURITY))
                .then_some(TransportFailure::Connection);
        }
        if let Some(hyper) = error.downcast_ref::<hyper::Error>() {
            // A timeout or a cancellation from hyper itself is the connection's; whatever else
            // it carries is read further down the chain (an h2 or I/O error) first.
            if hyper.is_timeout() || hyper.is_canceled() || hyper.is_closed() {
                return Some(TransportFailure::Connection);
            }
        }
        if error.is::<tonic::ConnectError>() || error.is::<std::io::Error>() {
            return Some(TransportFailure::Connection);
        }
        source = error.source();
    }
    // A chain without a more specific cause: tonic's `transport::Error` or a hyper error alone
    // (tonic words the first "transport error") is still the connection's.
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if let Some(transport) = error.downcast_ref::<tonic::transport::Error>()
            && transport.to_string().starts_with("transport error")
        {
            return Some(TransportFailure::Connection);
        }
        if error.is::<hyper::Error>() {
            return Some(TransportFailure::Connection);
        }
        source = error.source();
    }
    None
}

/// Turns a failure of the transport into the status Google's clients give it, before a
/// connector's `classify` sees it: a broken connection (refused, reset, closed, a GOAWAY or a
/// reset stream, an I/O error) is `UNAVAILABLE`, and the client's own attempt deadline is
/// `DEADLINE_EXCEEDED`. tonic reports the first as `UNKNOWN` ("transport error", "error reading
/// a body from connection"), `INTERNAL` or `CANCELLED` ("h2 protocol error: ...", "operation was
/// canceled"), and the second as `CANCELLED` ("Timeout expired"); each connector retries both
/// under its own retry budget.
///
/// Only a status whose source chain shows the failure is changed: a status the server sent
/// (from its trailers, so with no source), whatever its code, is returned as it is. The new
/// status keeps the old one's message after the cause, the error chain, and its metadata.
///
/// Every call through a [`GrpcChannel`] (its own failure and its response body's) already
/// passes through here.
///
/// # Example
///
/// ```
/// use gcp_sql::connectors::google::transport_status;
/// use tonic::{Code, Status};
///
/// let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
/// let status = Status::from_error(Box::new(reset));
/// assert_eq!(status.code(), Code::Unknown);
/// assert_eq!(transport_status(status).code(), Code::Unavailable);
///
/// // A status the server sent stays what it is.
/// let server = Status::unknown("the server could not say");
/// assert_eq!(transport_status(server).code(), Code::Unknown);
/// ```
pub fn transport_status(status: tonic::Status) -> tonic::Status {
    let Some(failure) = transport_failure(&status) else {
        return status;
    };
    let code = match failure {
        TransportFailure::Connection => tonic::Code::Unavailable,
        TransportFailure::ClientDeadline => tonic::Code::DeadlineExceeded,
    };
    if status.code() == code {
        // Already what a retry looks for (tonic's own `UNAVAILABLE` for a refused connection).
        return status;
    }
    let mut chain = String::new();
    let mut source = std::error::Error::source(&status);
    while let Some(error) = source {
        let text = error.to_string();
        if !text.is_empty() && !status.message().contains(&text) && !chain.contains(&text) {
            chain.push_str(": ");
            chain.push_str(&text);
        }
        source = error.source();
    }
    let cause = match failure {
        TransportFailure::Connection => "the connection failed",
        TransportFailure::ClientDeadline => "the attempt deadline passed on the client",
    };
    let message = format!(
        "{cause} (reported as {}: {}{chain})",
        crate::core::metrics::code_name(status.code()),
        status.message()
    );
    let mut normalised = tonic::Status::with_metadata(code, message, status.metadata().clone());
    // The original status, its chain with it, is the new one's source; a status in the chain
    // also makes a second pass leave the new one as it is.
    normalised.set_source(std::sync::Arc::new(status));
    normalised
}

/// Failed attempts in a row, with no answer from the address yet, after which a transport
/// logs one warning that nothing answers there (it goes on retrying within its budget).
pub const NO_ANSWER_WARN_ATTEMPTS: u32 = 3;

/// Whether anything has answered at a transport's address yet, to tell "nothing listens
/// there" from a connection that broke.
///
/// A statement's transport starts knowing nothing. A refused connection to an **emulator**
/// before anything answered there means nothing listens at that address (a wrong
/// `emulator_host`, an emulator not started): [`observe`](Self::observe) turns that failure
/// into a status that says so and that [`nothing_listens`] recognises, which each connector
/// classifies as fatal rather than retrying it for its whole budget. Once anything has answered
/// (any response or status from the server), a refused or broken connection is transient (an
/// emulator restarting, a proxy resetting) and is retried as before. A Google endpoint is never
/// failed this way (its TLS channel is connected before the first send); for it, and for an
/// address that does not refuse but never answers, one warning says after
/// [`NO_ANSWER_WARN_ATTEMPTS`] failed attempts that nothing has answered yet.
///
/// Cloning shares the state: every channel and client of one transport observes through it.
///
/// ```
/// use gcp_sql::connectors::google::{Reachability, nothing_listens};
///
/// let reach = Reachability::emulator("127.0.0.1:9", "emulator_host");
/// let refused = tonic::Status::from_error(Box::new(std::io::Error::from(
///     std::io::ErrorKind::ConnectionRefused,
/// )));
/// let seen = reach.observe::<()>(Err(refused)).unwrap_err();
/// assert!(nothing_listens(&seen));
/// assert!(seen.message().starts_with("connection refused at 127.0.0.1:9 (emulator_host)"));
/// ```
#[derive(Clone)]
pub struct Reachability(Arc<ReachState>);

struct ReachState {
    address: String,
    setting: String,
    emulator: bool,
    answered: AtomicBool,
    failures: AtomicU32,
    warned: AtomicBool,
}

impl Debug for Reachability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reachability")
            .field("address", &self.0.address)
            .field("emulator", &self.0.emulator)
            .field("answered", &self.0.answered.load(Ordering::Relaxed))
            .finish()
    }
}

/// The marker [`Reachability::observe`] puts in the source chain of a "nothing listens" status.
#[derive(Debug)]
struct NothingListens(tonic::Status);

impl std::fmt::Display for NothingListens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("nothing listens at the address")
    }
}

impl std::error::Error for NothingListens {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

impl Reachability {
    /// The state of an emulator at `address`, set by `setting` (`emulator_host`, or the
    /// environment variable it came from; see [`emulator_setting`]).
    pub fn emulator(address: impl Into<String>, setting: impl Into<String>) -> Self {
        Self::new(address.into(), setting.into(), true)
    }

    /// The state of a Google endpoint (`endpoint`, or the service's default).
    pub fn endpoint(address: impl Into<String>) -> Self {
        Self::new(address.into(), "endpoint".into(), false)
    }

    /// The state of `address`: an emulator (plaintext) one or not.
    pub fn for_address(address: &str, emulator: bool, setting: &str) -> Self {
        Self::new(address.to_string(), setting.to_string(), emulator)
    }

    fn new(address: String, setting: String, emulator: bool) -> Self {
        Reachability(Arc::new(ReachState {
            address,
            setting,
            emulator,
            answered: AtomicBool::new(false),
            failures: AtomicU32::new(0),
            warned: AtomicBool::new(false),
        }))
    }

    /// Records that the server answered (a response, or a stream that reported something).
    pub fn answered(&self) {
        self.0.answered.store(true, Ordering::Relaxed);
    }

    /// Whether anything has answered at the address yet.
    pub fn has_answered(&self) -> bool {
        self.0.answered.load(Ordering::Relaxed)
    }

    /// Passes one call's result through: an `Ok` or a status the server sent records an answer;
    /// a transport failure before any answer is counted (one warning at
    /// [`NO_ANSWER_WARN_ATTEMPTS`]), and a refused connection to an emulator becomes the
    /// "nothing listens" status.
    pub fn observe<T>(
        &self,
        result: std::result::Result<T, tonic::Status>,
    ) -> std::result::Result<T, tonic::Status> {
        let status = match result {
            Ok(value) => {
                self.answered();
                return Ok(value);
            }
            Err(status) => status,
        };
        if !is_transport_failure(&status) {
            self.answered();
            return Err(status);
        }
        if self.has_answered() {
            return Err(status);
        }
        let failures = self.0.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if self.0.emulator && chain_has_refused(&status) {
            return Err(self.nothing_listens_status(status));
        }
        if failures >= NO_ANSWER_WARN_ATTEMPTS && !self.0.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                address = %self.0.address,
                setting = %self.0.setting,
                attempts = failures,
                code = crate::core::metrics::code_name(status.code()),
                "no answer from {} after {failures} attempts; still retrying (check {})",
                self.0.address,
                self.0.setting
            );
        }
        Err(status)
    }

    fn nothing_listens_status(&self, status: tonic::Status) -> tonic::Status {
        let state = &self.0;
        let message = format!(
            "connection refused at {} ({}): nothing answers at that address; start the emulator \
             there, or point {} at the one that runs",
            state.address, state.setting, state.setting
        );
        let mut marked =
            tonic::Status::with_metadata(status.code(), message, status.metadata().clone());
        marked.set_source(Arc::new(NothingListens(status)));
        marked
    }
}

/// Whether `status` is the one [`Reachability::observe`] gives a refused first connection to
/// an emulator: nothing listens at the address, so retrying cannot help.
pub fn nothing_listens(status: &tonic::Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if error.is::<NothingListens>() {
            return true;
        }
        source = error.source();
    }
    false
}

/// The setting an emulator address came from, for messages: `env_var` when that variable holds
/// `host` (the `emulator_host` option overrides it, but then it would rarely be the same),
/// else `emulator_host`.
pub fn emulator_setting(host: &str, env_var: &'static str) -> String {
    match std::env::var(env_var) {
        Ok(v) if v.trim() == host.trim() => env_var.to_string(),
        _ => "emulator_host".to_string(),
    }
}

/// Whether the call failed in the transport (never got the server's answer), before or after
/// [`transport_status`] rewrote its status.
fn is_transport_failure(status: &tonic::Status) -> bool {
    if transport_failure(status).is_some() {
        return true;
    }
    std::error::Error::source(status)
        .and_then(|e| e.downcast_ref::<tonic::Status>())
        .is_some_and(|inner| transport_failure(inner).is_some())
}

/// Whether a refused TCP connection is anywhere in `status`'s source chain.
fn chain_has_refused(status: &tonic::Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if let Some(io) = error.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return true;
        }
        source = error.source();
    }
    false
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

    /// Runs `openssl` with `args`, failing the test with its stderr when it does not succeed.
    fn openssl(args: &[&str]) -> Vec<u8> {
        let out = std::process::Command::new("openssl")
            .args(args)
            .output()
            .expect("the openssl command (it makes a throwaway RSA key for this test)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    /// Without aws-lc-rs in the build, a service-account key is signed by the ring provider
    /// `install_crypto_provider` installs: the credentials make a self-signed JWT whose
    /// RS256 signature verifies against the key's public half.
    #[tokio::test]
    async fn a_service_account_key_signs_its_token_with_the_installed_provider() {
        use base64::Engine as _;
        use base64::prelude::BASE64_URL_SAFE_NO_PAD;
        use gcloud_sdk::google_cloud_auth::credentials::CacheableResource;

        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key.pem");
        let key_path = key.to_str().unwrap();
        openssl(&[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            key_path,
        ]);
        let public = openssl(&[
            "rsa",
            "-in",
            key_path,
            "-RSAPublicKey_out",
            "-outform",
            "DER",
        ]);
        let file = dir.path().join("service-account.json");
        let json = serde_json::json!({
            "type": "service_account",
            "project_id": "test-project",
            "private_key_id": "test-key-id",
            "private_key": std::fs::read_to_string(&key).unwrap(),
            "client_email": "sink@test-project.iam.gserviceaccount.com",
            "client_id": "1",
            "token_uri": "https://oauth2.googleapis.com/token",
        });
        std::fs::write(&file, json.to_string()).unwrap();

        crate::connectors::install_crypto_provider();
        let credentials = credentials_from_file(&file).unwrap();
        let headers = match credentials.headers(http::Extensions::new()).await.unwrap() {
            CacheableResource::New { data, .. } => data,
            CacheableResource::NotModified => panic!("fresh credentials had no headers"),
        };
        let bearer = headers
            .get(http::header::AUTHORIZATION)
            .expect("an Authorization header")
            .to_str()
            .unwrap();
        let jwt = bearer.strip_prefix("Bearer ").expect("a bearer token");
        let (signed, signature) = jwt.rsplit_once('.').expect("a signed JWT");
        let claims = signed.split('.').nth(1).unwrap();
        let claims: serde_json::Value =
            serde_json::from_slice(&BASE64_URL_SAFE_NO_PAD.decode(claims).unwrap()).unwrap();
        assert_eq!(claims["scope"], CLOUD_PLATFORM_SCOPE, "{claims}");
        assert_eq!(claims["iss"], "sink@test-project.iam.gserviceaccount.com");
        ring::signature::UnparsedPublicKey::new(
            &ring::signature::RSA_PKCS1_2048_8192_SHA256,
            public,
        )
        .verify(
            signed.as_bytes(),
            &BASE64_URL_SAFE_NO_PAD.decode(signature).unwrap(),
        )
        .expect("the token's signature verifies against the service account's public key");
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

    /// An error with a source, as a middleware might wrap one.
    #[derive(Debug)]
    struct Wrapped(Box<dyn std::error::Error + Send + Sync>);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("wrapped")
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(self.0.as_ref())
        }
    }

    fn from_error(error: impl std::error::Error + Send + Sync + 'static) -> tonic::Status {
        tonic::Status::from_error(Box::new(error))
    }

    #[test]
    fn an_io_error_in_the_chain_is_unavailable_whatever_tonic_called_it() {
        for kind in [
            std::io::ErrorKind::ConnectionReset,
            std::io::ErrorKind::ConnectionRefused,
            std::io::ErrorKind::BrokenPipe,
            std::io::ErrorKind::UnexpectedEof,
        ] {
            let status = from_error(Wrapped(Box::new(std::io::Error::from(kind))));
            assert_eq!(status.code(), tonic::Code::Unknown, "{kind:?}");
            let normalised = transport_status(status);
            assert_eq!(normalised.code(), tonic::Code::Unavailable, "{kind:?}");
            assert!(
                normalised
                    .message()
                    .starts_with("the connection failed (reported as UNKNOWN: wrapped"),
                "{}",
                normalised.message()
            );
        }
    }

    #[test]
    fn a_client_side_timeout_is_deadline_exceeded_not_cancelled() {
        let status = from_error(Wrapped(Box::new(tonic::TimeoutExpired(()))));
        assert_eq!(status.code(), tonic::Code::Cancelled);
        assert_eq!(status.message(), "Timeout expired");
        let normalised = transport_status(status);
        assert_eq!(normalised.code(), tonic::Code::DeadlineExceeded);
        assert!(
            normalised.message().contains("Timeout expired"),
            "{}",
            normalised.message()
        );
    }

    #[test]
    fn h2_stream_and_connection_errors_are_unavailable_except_a_security_refusal() {
        for reason in [
            h2::Reason::REFUSED_STREAM,
            h2::Reason::CANCEL,
            h2::Reason::INTERNAL_ERROR,
            h2::Reason::PROTOCOL_ERROR,
            h2::Reason::NO_ERROR,
        ] {
            let status = from_error(h2::Error::from(reason));
            assert_eq!(
                transport_status(status).code(),
                tonic::Code::Unavailable,
                "{reason:?}"
            );
        }
        let security = from_error(h2::Error::from(h2::Reason::INADEQUATE_SECURITY));
        let code = security.code();
        assert_eq!(transport_status(security).code(), code);
    }

    #[test]
    fn statuses_the_server_sent_stay_as_they_are() {
        for status in [
            tonic::Status::unknown("transport error"),
            tonic::Status::cancelled("Timeout expired"),
            tonic::Status::internal("h2 protocol error"),
            tonic::Status::aborted("contention"),
            tonic::Status::invalid_argument("bad row"),
        ] {
            let (code, message) = (status.code(), status.message().to_string());
            let same = transport_status(status);
            assert_eq!((same.code(), same.message()), (code, message.as_str()));
        }
    }

    #[test]
    fn a_status_nested_in_the_chain_is_an_answer_and_stays() {
        let inner = tonic::Status::cancelled("the caller gave up");
        let status = from_error(Wrapped(Box::new(Wrapped(Box::new(inner)))));
        assert_eq!(status.code(), tonic::Code::Cancelled);
        assert_eq!(transport_status(status).code(), tonic::Code::Cancelled);
    }

    #[test]
    fn a_status_already_retryable_is_kept_and_normalising_twice_changes_nothing() {
        let refused = from_error(tonic::ConnectError(Box::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        ))));
        assert_eq!(refused.code(), tonic::Code::Unavailable);
        let message = refused.message().to_string();
        assert_eq!(transport_status(refused).message(), message);

        let mut metadata = tonic::metadata::MetadataMap::new();
        metadata.insert("x-kept", MetadataValue::from_static("1"));
        let reset = tonic::Status::with_metadata(tonic::Code::Unknown, "transport error", metadata);
        let mut reset = reset;
        reset.set_source(std::sync::Arc::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )));
        let once = transport_status(reset);
        assert_eq!(once.code(), tonic::Code::Unavailable);
        assert!(once.metadata().get("x-kept").is_some());
        let message = once.message().to_string();
        let twice = transport_status(once);
        assert_eq!(
            (twice.code(), twice.message()),
            (tonic::Code::Unavailable, message.as_str())
        );
    }

    /// A loopback port where nothing listens (bound, then released).
    fn closed_port() -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        drop(listener);
        address
    }

    #[tokio::test]
    async fn a_refused_first_call_to_an_emulator_says_nothing_listens() {
        let address = closed_port();
        let status = call_through_channel(&address, Some(Duration::from_secs(5))).await;
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        let reach = Reachability::emulator(&address, "emulator_host");
        let seen = reach.observe::<()>(Err(status)).unwrap_err();
        assert!(nothing_listens(&seen), "{seen:?}");
        assert_eq!(seen.code(), tonic::Code::Unavailable);
        assert!(
            seen.message()
                .starts_with(&format!("connection refused at {address} (emulator_host)")),
            "{}",
            seen.message()
        );
    }

    #[tokio::test]
    async fn a_refused_call_after_an_answer_stays_retryable() {
        let address = closed_port();
        let reach = Reachability::emulator(&address, "emulator_host");
        // A status the server sent is an answer.
        let answer = reach
            .observe::<()>(Err(tonic::Status::not_found("no topic")))
            .unwrap_err();
        assert!(!nothing_listens(&answer));
        assert!(reach.has_answered());
        let status = call_through_channel(&address, Some(Duration::from_secs(5))).await;
        let seen = reach.observe::<()>(Err(status)).unwrap_err();
        assert!(!nothing_listens(&seen), "{seen:?}");
        assert_eq!(seen.code(), tonic::Code::Unavailable);
    }

    #[tokio::test]
    async fn a_google_endpoint_is_never_failed_as_unreachable() {
        let address = closed_port();
        let reach = Reachability::endpoint(format!("https://{address}"));
        for _ in 0..NO_ANSWER_WARN_ATTEMPTS + 1 {
            let status = call_through_channel(&address, Some(Duration::from_secs(5))).await;
            let seen = reach.observe::<()>(Err(status)).unwrap_err();
            assert!(!nothing_listens(&seen), "{seen:?}");
        }
        assert!(!reach.has_answered());
    }

    #[test]
    fn a_normalised_transport_failure_is_not_an_answer() {
        let reach = Reachability::emulator("127.0.0.1:9", "emulator_host");
        let reset = tonic::Status::from_error(Box::new(Wrapped(Box::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )))));
        let normalised = transport_status(reset);
        assert_eq!(normalised.code(), tonic::Code::Unavailable);
        let seen = reach.observe::<()>(Err(normalised)).unwrap_err();
        assert!(!nothing_listens(&seen), "a reset is not a refusal");
        assert!(!reach.has_answered());
        reach.observe(Ok(())).unwrap();
        assert!(reach.has_answered());
    }

    /// A writer of log lines into a shared buffer.
    #[cfg(feature = "cli")]
    #[derive(Clone, Default)]
    struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

    #[cfg(feature = "cli")]
    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[cfg(feature = "cli")]
    #[test]
    fn an_address_that_keeps_failing_without_an_answer_is_warned_about_once() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let reach = Reachability::endpoint("https://pubsub.example.test");
        let reset = || {
            tonic::Status::from_error(Box::new(Wrapped(Box::new(std::io::Error::from(
                std::io::ErrorKind::ConnectionReset,
            )))))
        };
        for attempt in 1..=NO_ANSWER_WARN_ATTEMPTS + 3 {
            let seen = reach
                .observe::<()>(Err(transport_status(reset())))
                .unwrap_err();
            assert!(!nothing_listens(&seen), "attempt {attempt}");
            let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
            assert_eq!(
                log.contains("no answer from"),
                attempt >= NO_ANSWER_WARN_ATTEMPTS,
                "attempt {attempt}: {log}"
            );
        }
        let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert_eq!(log.matches("no answer from").count(), 1, "{log}");
        assert!(
            log.contains(&format!(
                "no answer from https://pubsub.example.test after {NO_ANSWER_WARN_ATTEMPTS} attempts; \
                 still retrying (check endpoint)"
            )),
            "{log}"
        );
    }

    #[test]
    fn the_emulator_setting_names_the_option_unless_the_variable_holds_the_address() {
        assert_eq!(
            emulator_setting("127.0.0.1:9", "GCP_SQL_TEST_UNSET_EMULATOR_HOST"),
            "emulator_host"
        );
    }

    /// A listener that takes one connection and then does `then` with it.
    async fn one_connection<F, Fut>(then: F) -> String
    where
        F: FnOnce(tokio::net::TcpStream) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            if let Ok((stream, _)) = listener.accept().await {
                then(stream).await;
            }
        });
        address
    }

    async fn call_through_channel(address: &str, timeout: Option<Duration>) -> tonic::Status {
        let endpoint = crate::emulators::plaintext_endpoint(address).unwrap();
        let request = with_deadline(
            tonic::Request::new(PreEncoded(vec![0x0a, 0x01, b't'])),
            timeout,
            false,
        );
        let result: std::result::Result<tonic::Response<PreEncoded>, _> = unary_pre_encoded(
            GrpcChannel::Plaintext(endpoint.connect_lazy()),
            request,
            "/google.pubsub.v1.Publisher/Publish",
        )
        .await;
        result.unwrap_err()
    }

    #[tokio::test]
    async fn a_connection_reset_by_the_server_is_unavailable_through_a_grpc_channel() {
        let address = one_connection(|mut stream| async move {
            let mut buf = [0u8; 64];
            let _ = tokio::io::AsyncReadExt::read(&mut stream, &mut buf).await;
            // A reset (RST) rather than an orderly close.
            stream.set_zero_linger().unwrap();
            drop(stream);
        })
        .await;
        let status = call_through_channel(&address, Some(Duration::from_secs(5))).await;
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    }

    #[tokio::test]
    async fn a_silent_server_past_the_attempt_deadline_is_deadline_exceeded() {
        let address = one_connection(|stream| async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(stream);
        })
        .await;
        let status = call_through_channel(&address, Some(Duration::from_millis(200))).await;
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
        assert!(status.message().contains("Timeout expired"), "{status:?}");
    }
}
