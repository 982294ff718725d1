//! The gRPC side of the Pub/Sub sink: a [`Transport`] over the `google.pubsub.v1.Publisher`
//! service.
//!
//! # Connections
//!
//! - **Emulator** (`emulator_host`, else `PUBSUB_EMULATOR_HOST`): a plaintext channel without
//!   HTTP/2 keepalive pings — the Pub/Sub emulator never answers them, and a client that sends
//!   them sees its idle connections reset — and without credentials.
//! - **Google** (`endpoint`, default [`DEFAULT_ENDPOINT`]): TLS with the webpki roots and OAuth
//!   tokens through gcloud-sdk's auth middleware. Credentials come from `credentials_file` when
//!   set (a service account key, an authorized user, an impersonated service account or an
//!   external account file), else from Application Default Credentials (which read
//!   `GOOGLE_APPLICATION_CREDENTIALS`, then the gcloud user file, then the metadata server).
//!
//! One channel is shared by every topic of a transport; [`Transport::open`] hands out a cheap
//! per-topic handle.
//!
//! # Publishing
//!
//! A batch of [`PubsubRecord`]s, already serialized `PubsubMessage`s, becomes a `PublishRequest`
//! body by concatenation (no re-encoding), sent with a custom prost message type on the same
//! method path the generated client uses. The per-attempt timeout travels as `grpc-timeout`.
//! A response whose `message_ids` count differs from the batch size is treated as `INTERNAL`.
//!
//! # Classification
//!
//! | status | class |
//! |---|---|
//! | `ABORTED`, `CANCELLED`, `DEADLINE_EXCEEDED`, `INTERNAL`, `RESOURCE_EXHAUSTED`, `UNKNOWN`, `UNAVAILABLE` | [`Class::Retryable`] (the official clients' Publish retry codes) |
//! | `NOT_FOUND` | [`Class::NotFound`] (the topic is missing) |
//! | `INVALID_ARGUMENT` | [`Class::Rejected`] (the service refuses the messages) |
//! | anything else (`PERMISSION_DENIED`, `UNAUTHENTICATED`, `FAILED_PRECONDITION`, ...) | [`Class::Fatal`] |

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use gcloud_sdk::google::pubsub::v1::publisher_client::PublisherClient;
use gcloud_sdk::google::pubsub::v1::{PublishResponse, Topic};
use gcloud_sdk::google_cloud_auth::credentials::{
    Credentials, external_account, impersonated, service_account, user_account,
};
use gcloud_sdk::{GoogleApi, GoogleAuthMiddleware, RequestTimeouts};
use tonic::Code;
use tonic::codegen::{Body, Bytes, StdError, http};
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::transport::Channel;

use super::mapping::{PubsubRecord, request_base_len, request_entry_len, write_publish_request};
use crate::core::{Class, Destination, SendOutcome, Transport};
use crate::error::{Error, Result};

/// The Pub/Sub service endpoint used when no `endpoint` is set.
pub const DEFAULT_ENDPOINT: &str = "https://pubsub.googleapis.com";
/// The environment variable the official clients read for an emulator address.
pub const EMULATOR_HOST_ENV: &str = "PUBSUB_EMULATOR_HOST";
/// The OAuth scope requested for credentials read from `credentials_file`.
pub const CLOUD_PLATFORM_SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// Deadline of a `CreateTopic` call made by the auto-create recovery. Our bound (the service sets
/// none); it matches the Java publisher's default maximum RPC timeout of 60 s.
pub const CREATE_TOPIC_TIMEOUT: Duration = Duration::from_secs(60);

const PUBLISH_PATH: &str = "/google.pubsub.v1.Publisher/Publish";
const ROUTING_HEADER: &str = "x-goog-request-params";

/// Connection settings of a [`PubSubTransport`], as plain values (filled from the table's
/// connection options).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientSettings {
    /// The service endpoint (`endpoint`); [`DEFAULT_ENDPOINT`] when `None`.
    pub endpoint: Option<String>,
    /// An emulator address, `host:port` or `http://host:port` (`emulator_host`); when `None`,
    /// `PUBSUB_EMULATOR_HOST` is read.
    pub emulator_host: Option<String>,
    /// A credentials JSON file (`credentials_file`); Application Default Credentials when `None`.
    pub credentials_file: Option<PathBuf>,
    /// Whether the transport may create missing topics (`auto_create_topic`).
    pub auto_create_topic: bool,
}

impl ClientSettings {
    /// The emulator address in effect: the setting, else `PUBSUB_EMULATOR_HOST` (ignored when
    /// empty).
    pub fn effective_emulator_host(&self) -> Option<String> {
        self.emulator_host
            .clone()
            .or_else(|| std::env::var(EMULATOR_HOST_ENV).ok())
            .filter(|h| !h.trim().is_empty())
    }
}

#[derive(Clone)]
enum Connection {
    Emulator(Channel),
    Google(GoogleApi<GoogleAuthMiddleware>),
}

/// The Pub/Sub [`Transport`]: one shared channel, a [`PubSubClient`] handle per topic.
#[derive(Clone)]
pub struct PubSubTransport {
    connection: Connection,
    endpoint: String,
    auto_create_topic: bool,
}

impl std::fmt::Debug for PubSubTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PubSubTransport")
            .field("endpoint", &self.endpoint)
            .field(
                "emulator",
                &matches!(self.connection, Connection::Emulator(_)),
            )
            .field("auto_create_topic", &self.auto_create_topic)
            .finish()
    }
}

/// A per-topic handle: the shared channel plus the topic's routing header.
#[derive(Clone)]
pub struct PubSubClient {
    service: Service,
    routing: AsciiMetadataValue,
}

impl std::fmt::Debug for PubSubClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PubSubClient")
            .field("routing", &self.routing)
            .finish()
    }
}

#[derive(Clone)]
enum Service {
    Emulator(Channel),
    Google(GoogleAuthMiddleware),
}

impl PubSubTransport {
    /// Prepares the connection.
    ///
    /// For an emulator the channel connects lazily, on the first call. For Google, the
    /// credentials are loaded and the TLS channel is connected here; failures are
    /// [`Error::Connect`] naming the endpoint.
    pub async fn connect(settings: &ClientSettings) -> Result<Self> {
        if let Some(host) = settings.effective_emulator_host() {
            let channel = crate::emulators::plaintext_endpoint(&host)?.connect_lazy();
            return Ok(PubSubTransport {
                connection: Connection::Emulator(channel),
                endpoint: host,
                auto_create_topic: settings.auto_create_topic,
            });
        }
        let endpoint = settings
            .endpoint
            .clone()
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        crate::connectors::install_crypto_provider();
        let connect_error = |message: String| Error::Connect {
            endpoint: endpoint.clone(),
            message,
        };
        let api = match &settings.credentials_file {
            Some(path) => {
                let credentials = credentials_from_file(path).map_err(connect_error)?;
                GoogleApi::from_function_with_credentials(
                    std::convert::identity,
                    &endpoint,
                    None,
                    credentials,
                )
                .await
            }
            None => GoogleApi::from_function(std::convert::identity, &endpoint, None).await,
        }
        .map_err(|e| connect_error(e.to_string()))?;
        Ok(PubSubTransport {
            connection: Connection::Google(api),
            endpoint,
            auto_create_topic: settings.auto_create_topic,
        })
    }

    /// Builds a transport on an existing plaintext channel (an emulator or a fake server).
    pub fn from_channel(
        channel: Channel,
        endpoint: impl Into<String>,
        auto_create_topic: bool,
    ) -> Self {
        PubSubTransport {
            connection: Connection::Emulator(channel),
            endpoint: endpoint.into(),
            auto_create_topic,
        }
    }

    /// The endpoint or emulator address this transport talks to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn service(&self) -> Service {
        match &self.connection {
            Connection::Emulator(channel) => Service::Emulator(channel.clone()),
            Connection::Google(api) => Service::Google(api.get()),
        }
    }
}

/// Builds credentials from a JSON credentials file, by its `type`.
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

/// The `x-goog-request-params` value routing a call to `topic`'s backend.
fn routing_value(topic: &str) -> std::result::Result<AsciiMetadataValue, String> {
    let mut value = String::with_capacity(topic.len() + 16);
    value.push_str("topic=");
    for b in topic.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            value.push(b as char);
        } else {
            value.push_str(&format!("%{b:02X}"));
        }
    }
    MetadataValue::try_from(value).map_err(|e| e.to_string())
}

/// A `PublishRequest` already serialized: written to the wire as it is.
struct EncodedPublishRequest(Vec<u8>);

impl prost::Message for EncodedPublishRequest {
    fn encode_raw(&self, buf: &mut impl prost::bytes::BufMut) {
        buf.put_slice(&self.0);
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
        self.0.len()
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

async fn publish_on<T>(
    service: T,
    request: tonic::Request<EncodedPublishRequest>,
) -> std::result::Result<tonic::Response<PublishResponse>, tonic::Status>
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
    let codec = tonic_prost::ProstCodec::<EncodedPublishRequest, PublishResponse>::default();
    grpc.unary(
        request,
        http::uri::PathAndQuery::from_static(PUBLISH_PATH),
        codec,
    )
    .await
}

/// Applies the per-attempt deadline. A zero timeout means no deadline, as it does in gax.
fn with_deadline<M>(
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

/// The class of a Publish status; see the module docs.
pub fn classify_publish_status(code: Code) -> Class {
    match code {
        Code::Ok => Class::Ok,
        Code::Aborted
        | Code::Cancelled
        | Code::DeadlineExceeded
        | Code::Internal
        | Code::ResourceExhausted
        | Code::Unknown
        | Code::Unavailable => Class::Retryable,
        Code::NotFound => Class::NotFound,
        Code::InvalidArgument => Class::Rejected,
        _ => Class::Fatal,
    }
}

#[async_trait]
impl Transport for PubSubTransport {
    type Record = PubsubRecord;
    type Client = PubSubClient;

    fn operation(&self) -> &'static str {
        "Publish"
    }

    async fn open(&self, destination: &Destination) -> Result<PubSubClient> {
        let routing = routing_value(destination).map_err(|e| {
            Error::invalid(
                "topic",
                destination.to_string(),
                format!("cannot route to it: {e}"),
            )
        })?;
        Ok(PubSubClient {
            service: self.service(),
            routing,
        })
    }

    async fn send(
        &self,
        client: &PubSubClient,
        destination: &Destination,
        batch: &[&PubsubRecord],
        timeout: Option<Duration>,
    ) -> SendOutcome {
        let size = request_base_len(destination)
            + batch
                .iter()
                .map(|r| request_entry_len(r.encoded_len() as u64))
                .sum::<u64>();
        let mut body = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        write_publish_request(&mut body, destination, batch.iter().map(|r| r.encoded()));
        let google = matches!(client.service, Service::Google(_));
        let mut request = with_deadline(
            tonic::Request::new(EncodedPublishRequest(body)),
            timeout,
            google,
        );
        request
            .metadata_mut()
            .insert(ROUTING_HEADER, client.routing.clone());
        let result = match &client.service {
            Service::Emulator(channel) => publish_on(channel.clone(), request).await,
            Service::Google(service) => publish_on(service.clone(), request).await,
        };
        SendOutcome::Whole(result.and_then(|response| {
            let ids = response.get_ref().message_ids.len();
            if ids == batch.len() {
                Ok(())
            } else {
                Err(tonic::Status::internal(format!(
                    "Publish of {} message(s) to '{destination}' returned {ids} message id(s)",
                    batch.len()
                )))
            }
        }))
    }

    fn classify(&self, status: &tonic::Status, _solo: bool) -> Class {
        classify_publish_status(status.code())
    }

    async fn create_destination(
        &self,
        client: &PubSubClient,
        destination: &Destination,
    ) -> Result<bool> {
        if !self.auto_create_topic {
            return Err(Error::Unsupported(format!(
                "topic '{destination}' is missing and 'auto_create_topic' is off, so it is not created"
            )));
        }
        let topic = Topic {
            name: destination.to_string(),
            ..Default::default()
        };
        let google = matches!(client.service, Service::Google(_));
        let mut request = with_deadline(
            tonic::Request::new(topic),
            Some(CREATE_TOPIC_TIMEOUT),
            google,
        );
        request.metadata_mut().insert(
            ROUTING_HEADER,
            routing_value(destination)
                .and_then(|v| {
                    // CreateTopic routes by the topic's `name`.
                    let text = v
                        .to_str()
                        .map_err(|e| e.to_string())?
                        .replacen("topic=", "name=", 1);
                    MetadataValue::try_from(text).map_err(|e| e.to_string())
                })
                .map_err(|e| Error::invalid("topic", destination.to_string(), e))?,
        );
        let result = match &client.service {
            Service::Emulator(channel) => {
                PublisherClient::new(channel.clone())
                    .create_topic(request)
                    .await
            }
            Service::Google(service) => {
                PublisherClient::new(service.clone())
                    .create_topic(request)
                    .await
            }
        };
        match result {
            Ok(_) => Ok(true),
            Err(status) if status.code() == Code::AlreadyExists => Ok(false),
            Err(status) => Err(Error::Rpc {
                operation: "CreateTopic",
                destination: destination.to_string(),
                code: status.code(),
                message: status.message().to_string(),
                attempts: 1,
            }),
        }
    }

    async fn close(&self, client: PubSubClient) {
        // The channel is shared; dropping the handle releases nothing else.
        drop(client);
    }
}

#[cfg(test)]
mod tests;
