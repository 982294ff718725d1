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
//!
//! A connection the emulator's address refuses before anything has answered there is
//! [`Class::Fatal`] too, with a message saying that nothing answers at that address (see
//! [`Reachability`]); once the emulator has answered, a refused or broken connection is
//! `UNAVAILABLE` and retried.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use gcloud_sdk::google::pubsub::v1::publisher_client::PublisherClient;
use gcloud_sdk::google::pubsub::v1::schema_service_client::SchemaServiceClient;
use gcloud_sdk::google::pubsub::v1::subscriber_client::SubscriberClient;
use gcloud_sdk::google::pubsub::v1::{
    Encoding, GetSchemaRequest, GetSubscriptionRequest, GetTopicRequest, PublishResponse,
    SchemaView, Topic, schema,
};
use tonic::Code;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::Channel;

use super::sink::mapping::{
    PubsubRecord, request_base_len, request_entry_len, write_publish_request,
};
use crate::core::{Class, Destination, SendOutcome, Transport};
use crate::encode::schema::{PayloadSchema, SchemaEncoding, SchemaType};
use crate::error::{Error, Result};
use crate::google::{
    Connection, GrpcChannel, PreEncoded, ROUTING_HEADER, Reachability, emulator_setting,
    nothing_listens, routing_value, unary_pre_encoded, with_deadline,
};

pub use crate::google::{CLOUD_PLATFORM_SCOPE, credentials_from_file};

/// The Pub/Sub service endpoint used when no `endpoint` is set.
pub const DEFAULT_ENDPOINT: &str = "https://pubsub.googleapis.com";
/// Bound of the `GetTopic` call that looks up a topic's schema when a statement starts (ours:
/// the service answers it in milliseconds; the bound keeps a slow or silent service from
/// holding the statement before its first publish, ADR 0046).
pub const TOPIC_SCHEMA_LOOKUP_TIMEOUT: Duration = Duration::from_secs(1);
/// Deadline of a `CreateTopic` call made by the auto-create recovery. Our bound (the service sets
/// none); it matches the Java publisher's default maximum RPC timeout of 60 s.
pub const CREATE_TOPIC_TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) const PUBLISH_PATH: &str = "/google.pubsub.v1.Publisher/Publish";

/// Connection settings of a [`PubSubTransport`], as plain values (filled from the table's
/// connection options).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientSettings {
    /// The service endpoint (`endpoint`); [`DEFAULT_ENDPOINT`] when `None`.
    pub endpoint: Option<String>,
    /// An emulator address, `host:port` or `http://host:port` (`emulator_host`, or
    /// `PUBSUB_EMULATOR_HOST` as the table options resolved it).
    pub emulator_host: Option<String>,
    /// A credentials JSON file (`credentials_file`); Application Default Credentials when `None`.
    pub credentials_file: Option<PathBuf>,
    /// Whether the transport may create missing topics (`auto_create_topic`).
    pub auto_create_topic: bool,
}

impl ClientSettings {
    /// The emulator address in effect (an empty one counts as none).
    ///
    /// `PUBSUB_EMULATOR_HOST` is not read here: the table options resolved it when the table was
    /// declared, where an explicit `endpoint` turns it off. Reading it again at connect time
    /// would send a table with an explicit endpoint to the emulator.
    pub fn effective_emulator_host(&self) -> Option<String> {
        self.emulator_host.clone().filter(|h| !h.trim().is_empty())
    }
}

/// The Pub/Sub [`Transport`]: one shared channel, a [`PubSubClient`] handle per topic.
#[derive(Clone)]
pub struct PubSubTransport {
    channel: GrpcChannel,
    endpoint: String,
    auto_create_topic: bool,
    reach: Reachability,
}

impl std::fmt::Debug for PubSubTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PubSubTransport")
            .field("endpoint", &self.endpoint)
            .field("emulator", &!self.channel.is_google())
            .field("auto_create_topic", &self.auto_create_topic)
            .finish()
    }
}

/// A per-topic handle: the shared channel plus the topic's routing header.
#[derive(Clone)]
pub struct PubSubClient {
    channel: GrpcChannel,
    routing: AsciiMetadataValue,
    reach: Reachability,
}

impl std::fmt::Debug for PubSubClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PubSubClient")
            .field("routing", &self.routing)
            .finish()
    }
}

/// Opens the channel of a Pub/Sub client (the sink's transport and the subscription source's
/// partitions): plaintext to `emulator` when one is set (it connects lazily, on the first call),
/// else TLS to `endpoint` (the public endpoint when `None`) with the credentials of
/// `credentials_file` or Application Default Credentials, connected here ([`Error::Connect`]
/// naming the endpoint). Returns the channel, the address it reaches and what its failures
/// are reported against.
pub(crate) async fn open_channel(
    emulator: Option<String>,
    endpoint: Option<&str>,
    credentials_file: Option<&Path>,
) -> Result<(GrpcChannel, String, Reachability)> {
    let endpoint = match &emulator {
        Some(host) => host.clone(),
        None => endpoint.unwrap_or(DEFAULT_ENDPOINT).to_string(),
    };
    let connection = Connection::open(emulator.as_deref(), &endpoint, credentials_file).await?;
    let reach = match &emulator {
        Some(host) => Reachability::emulator(
            host,
            emulator_setting(host, crate::connectors::pubsub::KIND.emulator_env_var()),
        ),
        None => Reachability::endpoint(&endpoint),
    };
    Ok((connection.channel(), endpoint, reach))
}

impl PubSubTransport {
    /// Prepares the connection.
    ///
    /// For an emulator the channel connects lazily, on the first call. For Google, the
    /// credentials are loaded and the TLS channel is connected here; failures are
    /// [`Error::Connect`] naming the endpoint.
    pub async fn connect(settings: &ClientSettings) -> Result<Self> {
        let (channel, endpoint, reach) = open_channel(
            settings.effective_emulator_host(),
            settings.endpoint.as_deref(),
            settings.credentials_file.as_deref(),
        )
        .await?;
        Ok(PubSubTransport {
            channel,
            endpoint,
            auto_create_topic: settings.auto_create_topic,
            reach,
        })
    }

    /// Builds a transport on an existing plaintext channel (an emulator or a fake server).
    pub fn from_channel(
        channel: Channel,
        endpoint: impl Into<String>,
        auto_create_topic: bool,
    ) -> Self {
        let endpoint = endpoint.into();
        PubSubTransport {
            channel: GrpcChannel::Plaintext(channel),
            reach: Reachability::emulator(&endpoint, "emulator_host"),
            endpoint,
            auto_create_topic,
        }
    }

    /// The endpoint or emulator address this transport talks to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// One short, unretried lookup: its answer, or DEADLINE_EXCEEDED past
    /// [`TOPIC_SCHEMA_LOOKUP_TIMEOUT`].
    async fn short_lookup<T>(
        &self,
        lookup: impl std::future::Future<Output = std::result::Result<T, tonic::Status>>,
    ) -> std::result::Result<T, tonic::Status> {
        match tokio::time::timeout(TOPIC_SCHEMA_LOOKUP_TIMEOUT, lookup).await {
            Ok(answer) => self.reach.observe(answer),
            Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                "no answer within {TOPIC_SCHEMA_LOOKUP_TIMEOUT:?}"
            ))),
        }
    }

    /// The Pub/Sub schema of the topic `subscription` is attached to (`GetSubscription`, then
    /// [`topic_schema_revision`](Self::topic_schema_revision)), for a source given no `format`.
    /// `None` when the topic has no schema or was deleted, and when `GetSubscription` fails or
    /// does not answer within [`TOPIC_SCHEMA_LOOKUP_TIMEOUT`] (a warning is logged; the source
    /// then decodes JSON, and reading the subscription reports a real fault). ADR 0053.
    pub async fn subscription_schema(&self, subscription: &str) -> Result<Option<TopicSchema>> {
        let mut request = with_deadline(
            tonic::Request::new(GetSubscriptionRequest {
                subscription: subscription.to_string(),
            }),
            Some(TOPIC_SCHEMA_LOOKUP_TIMEOUT),
            self.channel.is_google(),
        );
        request.metadata_mut().insert(
            ROUTING_HEADER,
            routing_value(&[("subscription", subscription)])
                .map_err(|e| Error::invalid("subscription", subscription, e))?,
        );
        let mut subscriber = SubscriberClient::new(self.channel.clone());
        let topic = match self
            .short_lookup(subscriber.get_subscription(request))
            .await
        {
            Ok(s) => s.into_inner().topic,
            Err(status) => {
                tracing::warn!(
                    subscription = %subscription,
                    code = ?status.code(),
                    "cannot read the topic of subscription {subscription} (GetSubscription: {:?}); \
                     decoding its messages as format 'json' (give 'format' explicitly to skip \
                     this lookup)",
                    status.code()
                );
                return Ok(None);
            }
        };
        if topic.is_empty() || topic == "_deleted-topic_" {
            return Ok(None);
        }
        self.topic_schema_revision(&topic).await
    }

    /// The Pub/Sub schema of `topic`, when it has one: the definition and encoding of
    /// [`topic_schema_revision`](Self::topic_schema_revision).
    pub async fn topic_schema(&self, topic: &str) -> Result<Option<PayloadSchema>> {
        Ok(self.topic_schema_revision(topic).await?.map(|t| t.schema))
    }

    /// The Pub/Sub schema of `topic`, when it has one (`Topic.schema_settings`): the definition
    /// of its newest allowed revision (`last_revision_id` when set, else the schema's current
    /// one, read with `SchemaService.GetSchema`), the topic's encoding, the schema's name and the
    /// revision read. `None` when the topic has no schema or does not exist yet (publishing then
    /// reports the missing topic), and when `GetTopic` fails or does not answer within
    /// [`TOPIC_SCHEMA_LOOKUP_TIMEOUT`] (the caller may not read the topic, the server does not
    /// serve it, the connection is slow or down): then a warning is logged and the table keeps
    /// JSON. Once the topic is known to have a schema, failing to read it fails the statement.
    pub async fn topic_schema_revision(&self, topic: &str) -> Result<Option<TopicSchema>> {
        let mut request = with_deadline(
            tonic::Request::new(GetTopicRequest {
                topic: topic.to_string(),
            }),
            Some(TOPIC_SCHEMA_LOOKUP_TIMEOUT),
            self.channel.is_google(),
        );
        request.metadata_mut().insert(
            ROUTING_HEADER,
            routing_value(&[("topic", topic)]).map_err(|e| Error::invalid("topic", topic, e))?,
        );
        let mut publisher = PublisherClient::new(self.channel.clone());
        let found = self.short_lookup(publisher.get_topic(request)).await;
        let settings = match found {
            Ok(t) => t.into_inner().schema_settings,
            Err(status) if status.code() == Code::NotFound => return Ok(None),
            // The lookup is one short, unretried call: a caller that may publish but not read
            // the topic (`roles/pubsub.publisher`: PERMISSION_DENIED), a server that only
            // publishes (UNIMPLEMENTED), or a slow, silent or failing connection keeps the
            // JSON encoding the table had before topic schemas were looked up, and publishing
            // then meets the service as it always did (its retries, its errors; a topic that
            // does have a schema refuses the JSON with INVALID_ARGUMENT). ADR 0046.
            Err(status) => {
                tracing::warn!(
                    topic = %topic,
                    code = ?status.code(),
                    "cannot read the schema settings of topic {topic} (GetTopic: {:?}); publishing \
                     with format 'json' (give 'format' explicitly to skip this lookup)",
                    status.code()
                );
                return Ok(None);
            }
        };
        let Some(settings) = settings.filter(|s| !s.schema.is_empty()) else {
            return Ok(None);
        };
        if settings.schema == "_deleted-schema_" {
            return Err(Error::Unsupported(format!(
                "topic '{topic}' names a schema that was deleted; its messages cannot be validated"
            )));
        }
        let encoding = match Encoding::try_from(settings.encoding) {
            Ok(Encoding::Json) => SchemaEncoding::Json,
            Ok(Encoding::Binary) => SchemaEncoding::Binary,
            _ => {
                return Err(Error::Unsupported(format!(
                    "topic '{topic}' has schema '{}' with no encoding (neither JSON nor BINARY)",
                    settings.schema
                )));
            }
        };
        let (schema, revision_id) = self
            .schema_revision(
                &settings.schema,
                &settings.last_revision_id,
                encoding,
                &format!("topic '{topic}'"),
            )
            .await?;
        Ok(Some(TopicSchema {
            schema,
            name: settings.schema,
            revision_id,
        }))
    }

    /// Revision `revision` of the schema `name` (its current revision when `revision` is
    /// empty), read with `SchemaService.GetSchema` of `name@revision`: its definition with
    /// `encoding`, and the revision id the service answered with. `user` names what the schema
    /// is read for (`topic 'projects/p/topics/t'`) in errors and in the schema's origin. A
    /// status is an [`Error::Rpc`] naming `name@revision` (NOT_FOUND for a deleted revision).
    pub async fn schema_revision(
        &self,
        name: &str,
        revision: &str,
        encoding: SchemaEncoding,
        user: &str,
    ) -> Result<(PayloadSchema, String)> {
        let at = if revision.is_empty() {
            name.to_string()
        } else {
            format!("{name}@{revision}")
        };
        let mut request = with_deadline(
            tonic::Request::new(GetSchemaRequest {
                name: at.clone(),
                view: SchemaView::Full as i32,
            }),
            Some(CREATE_TOPIC_TIMEOUT),
            self.channel.is_google(),
        );
        request.metadata_mut().insert(
            ROUTING_HEADER,
            routing_value(&[("name", &at)]).map_err(|e| Error::invalid("schema", &at, e))?,
        );
        let got = self.reach.observe(
            SchemaServiceClient::new(self.channel.clone())
                .get_schema(request)
                .await,
        );
        let definition = match got {
            Ok(s) => s.into_inner(),
            Err(status) => return Err(Error::rpc("GetSchema", &at, &status, 1)),
        };
        let kind = match schema::Type::try_from(definition.r#type) {
            Ok(schema::Type::Avro) => SchemaType::Avro,
            Ok(schema::Type::ProtocolBuffer) => SchemaType::Protobuf,
            _ => {
                return Err(Error::Unsupported(format!(
                    "schema '{at}' of {user} has type {}, neither Avro nor Protocol Buffer",
                    definition.r#type
                )));
            }
        };
        let shown = if definition.revision_id.is_empty() {
            String::new()
        } else {
            format!(" revision {}", definition.revision_id)
        };
        Ok((
            PayloadSchema {
                kind,
                definition: definition.definition,
                encoding,
                origin: format!(
                    "schema '{name}'{shown} of {user}, {} encoding",
                    encoding.name()
                ),
            },
            definition.revision_id,
        ))
    }
}

/// A topic's Pub/Sub schema as read when a statement starts: what decodes or encodes its
/// messages, and which schema and revision that is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSchema {
    /// The definition, its language and the topic's encoding.
    pub schema: PayloadSchema,
    /// The schema's name, `projects/P/schemas/S` (what Pub/Sub stamps as
    /// `googclient_schemaname`).
    pub name: String,
    /// The revision read (what Pub/Sub stamps as `googclient_schemarevisionid`); empty when the
    /// service did not say.
    pub revision_id: String,
}

/// Whether an `Acknowledge` or `ModifyAckDeadline` status (a source's acknowledgement, nack
/// or lease extension) is worth another attempt: the codes the official clients retry for
/// those calls, `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`, `ABORTED`, `INTERNAL`,
/// `UNAVAILABLE` and `UNKNOWN` ([`classify_publish_status`]'s retryable codes but `CANCELLED`).
pub fn retryable_ack_status(code: Code) -> bool {
    code != Code::Cancelled && classify_publish_status(code) == Class::Retryable
}

/// Whether a StreamingPull status is transient: the stream is opened again. These are the
/// codes the official subscribers reconnect on (the Node.js client's pull retry list,
/// `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`, `ABORTED`, `INTERNAL`, `UNAVAILABLE`, and the
/// Python client's `UNKNOWN`), plus `CANCELLED`, which a stream the server closes on its side
/// reports: the acknowledgement side's list ([`retryable_ack_status`]) and `CANCELLED`.
pub fn retryable_pull_status(code: Code) -> bool {
    retryable_ack_status(code) || code == Code::Cancelled
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
        let routing = routing_value(&[("topic", &**destination)]).map_err(|e| {
            Error::invalid(
                "topic",
                destination.to_string(),
                format!("cannot route to it: {e}"),
            )
        })?;
        Ok(PubSubClient {
            channel: self.channel.clone(),
            routing,
            reach: self.reach.clone(),
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
        let google = client.channel.is_google();
        let mut request = with_deadline(tonic::Request::new(PreEncoded(body)), timeout, google);
        request
            .metadata_mut()
            .insert(ROUTING_HEADER, client.routing.clone());
        let result: std::result::Result<tonic::Response<PublishResponse>, _> = client
            .reach
            .observe(unary_pre_encoded(client.channel.clone(), request, PUBLISH_PATH).await);
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
        if nothing_listens(status) {
            // A refused first connection to the emulator: nothing to retry against.
            return Class::Fatal;
        }
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
        let google = client.channel.is_google();
        let mut request = with_deadline(
            tonic::Request::new(topic),
            Some(CREATE_TOPIC_TIMEOUT),
            google,
        );
        request.metadata_mut().insert(
            ROUTING_HEADER,
            // CreateTopic routes by the topic's `name`.
            routing_value(&[("name", &**destination)])
                .map_err(|e| Error::invalid("topic", destination.to_string(), e))?,
        );
        let result = client.reach.observe(
            PublisherClient::new(client.channel.clone())
                .create_topic(request)
                .await,
        );
        match result {
            Ok(_) => {
                tracing::info!(topic = %destination, "created topic {destination} (auto_create_topic)");
                Ok(true)
            }
            Err(status) if status.code() == Code::AlreadyExists => Ok(false),
            Err(status) => Err(Error::rpc("CreateTopic", destination, &status, 1)),
        }
    }

    async fn close(&self, client: PubSubClient) {
        // The channel is shared; dropping the handle releases nothing else.
        drop(client);
    }
}

#[cfg(test)]
mod tests;
