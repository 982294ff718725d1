//! The gRPC side of the Cloud Tasks sink: a [`Transport`] over the
//! `google.cloud.tasks.v2.CloudTasks` service, one `CreateTask` per record.
//!
//! # Connections
//!
//! - **Emulator** (`emulator_host`, else `CLOUD_TASKS_EMULATOR_HOST`, resolved when the options
//!   are built): one plaintext channel from [`crate::google::plaintext_endpoint`], without
//!   HTTP/2 keepalive pings and without credentials. A channel pool is refused with an emulator
//!   when the sink is declared (the option `channel_pool_size`), and again here.
//! - **Google** (`endpoint`, default [`DEFAULT_ENDPOINT`]): TLS with the webpki roots and OAuth
//!   tokens through gcloud-sdk's auth middleware, with credentials from `credentials_file` or
//!   Application Default Credentials (as for Pub/Sub). `channel_pool_size` channels are opened,
//!   all sharing one token source; sends take them in turn (round robin). One HTTP/2 channel
//!   carries about 100 concurrent calls, so a writer with more creations in flight needs about
//!   one channel per 100.
//!
//! Every queue of a transport shares its channels; [`Transport::open`] hands out a cheap
//! per-queue handle carrying the queue's routing header.
//!
//! # Creating tasks
//!
//! A batch always holds one task (the writer's batch size is 1, since `CreateTask` takes one).
//! Its `CreateTaskRequest` body is the queue name and the pre-serialized task, concatenated
//! (see [`write_create_task_request`]); the response is read only for its task name. The
//! per-attempt deadline, [`CREATE_TASK_TIMEOUT`] unless the core gives another, travels as
//! `grpc-timeout`.
//!
//! # Classification
//!
//! | status | class |
//! |---|---|
//! | `UNAVAILABLE`, `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`, `CANCELLED` | [`Class::Retryable`] (the option contract's transient-failure retry, `recovery_*`; `CANCELLED` is what a gRPC C-core server answers to a call it drops from an overfull queue of unstarted calls, see ADR 0032) |
//! | `NOT_FOUND` | [`Class::NotFound`] (the queue is missing: re-sent under `not_found_recovery_*`; never created) |
//! | `FAILED_PRECONDITION` whose message says the queue does not exist | [`Class::NotFound`]: how `gcloud-tasks-emulator` answers for a missing queue |
//! | `ALREADY_EXISTS` | [`Class::Duplicate`]: a named task that exists or ran recently, i.e. delivered before (only named tasks can collide) |
//! | `INVALID_ARGUMENT` | [`Class::Rejected`] (the service refuses the task itself) |
//! | anything else (`PERMISSION_DENIED`, `UNAUTHENTICATED`, other `FAILED_PRECONDITION`s, `INTERNAL`, ...) | [`Class::Fatal`] |
//!
//! A connection the emulator's address refuses before anything has answered there is
//! [`Class::Fatal`] too, with a message saying that nothing answers at that address (see
//! [`Reachability`]); once the emulator has answered, a refused or broken connection is
//! `UNAVAILABLE` and retried.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tonic::Code;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::Channel;

use super::mapping::{TaskRecord, create_task_request_len, write_create_task_request};
use crate::core::{Class, Destination, SendOutcome, Transport};
use crate::error::{Error, Result};
use crate::google::{
    self, Connection, GrpcChannel, PreEncoded, ROUTING_HEADER, Reachability, emulator_setting,
    nothing_listens, unary_pre_encoded, with_deadline,
};

/// The Cloud Tasks service endpoint used when no `endpoint` is set.
pub const DEFAULT_ENDPOINT: &str = "https://cloudtasks.googleapis.com";
/// Deadline of one `CreateTask` attempt. Source: googleapis
/// `google/cloud/tasks/v2/cloudtasks_grpc_service_config.json`, which gives `CreateTask` a
/// 20 s timeout (and no retry policy).
pub const CREATE_TASK_TIMEOUT: Duration = Duration::from_secs(20);
/// The `CreateTask` method path.
pub const CREATE_TASK_PATH: &str = "/google.cloud.tasks.v2.CloudTasks/CreateTask";

/// Connection settings of a [`CloudTasksTransport`], as plain values (filled from the table's
/// connection and writer options).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientSettings {
    /// The service endpoint (`endpoint`); [`DEFAULT_ENDPOINT`] when `None`.
    pub endpoint: Option<String>,
    /// The emulator address, `host:port` (`emulator_host` or `CLOUD_TASKS_EMULATOR_HOST`).
    pub emulator_host: Option<String>,
    /// A credentials JSON file (`credentials_file`); Application Default Credentials when `None`.
    pub credentials_file: Option<PathBuf>,
    /// gRPC channels to open to Google (`channel_pool_size`; `None`: one).
    pub channel_pool_size: Option<usize>,
}

/// The channels of a transport and the round-robin cursor over them.
struct Channels {
    services: Vec<GrpcChannel>,
    next: AtomicUsize,
    /// Whether anything answered at the address yet (shared by every channel).
    reach: Reachability,
}

impl Channels {
    fn pick(&self) -> Option<&GrpcChannel> {
        let n = self.services.len();
        if n == 0 {
            return None;
        }
        self.services
            .get(self.next.fetch_add(1, Ordering::Relaxed) % n)
    }
}

/// The Cloud Tasks [`Transport`]: one channel, or a pool of channels to Google, shared by every
/// queue; a [`QueueClient`] handle per queue.
#[derive(Clone)]
pub struct CloudTasksTransport {
    channels: Arc<Channels>,
    endpoint: String,
    emulator: bool,
}

impl std::fmt::Debug for CloudTasksTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CloudTasksTransport")
            .field("endpoint", &self.endpoint)
            .field("emulator", &self.emulator)
            .field("channels", &self.channels.services.len())
            .finish()
    }
}

/// A per-queue handle: the shared channels plus the queue's routing header.
#[derive(Clone)]
pub struct QueueClient {
    channels: Arc<Channels>,
    routing: AsciiMetadataValue,
}

impl std::fmt::Debug for QueueClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueClient")
            .field("routing", &self.routing)
            .finish()
    }
}

impl CloudTasksTransport {
    /// Prepares the connection.
    ///
    /// For an emulator the channel connects lazily, on the first call. For Google, the
    /// credentials are loaded and every channel of the pool is connected here; failures are
    /// [`Error::Connect`] naming the endpoint.
    pub async fn connect(settings: &ClientSettings) -> Result<Self> {
        if let Some(host) = settings
            .emulator_host
            .as_deref()
            .filter(|h| !h.trim().is_empty())
        {
            if let Some(pool) = settings.channel_pool_size {
                return Err(Error::invalid(
                    "channel_pool_size",
                    pool.to_string(),
                    format!(
                        "cannot be combined with an emulator endpoint ('{host}'): the emulator always uses one \
                         plaintext channel, so the pool would be silently ignored"
                    ),
                ));
            }
            let channel = crate::google::plaintext_endpoint(host)?.connect_lazy();
            let setting = emulator_setting(host, super::SERVICE.emulator_env_var);
            return Ok(Self::plaintext(
                channel,
                host.to_string(),
                Reachability::emulator(host, setting),
            ));
        }
        let endpoint = settings
            .endpoint
            .clone()
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let connection =
            Connection::open(None, &endpoint, settings.credentials_file.as_deref()).await?;
        let size = settings.channel_pool_size.unwrap_or(1).max(1);
        let mut services = Vec::with_capacity(size);
        services.push(connection.channel());
        for _ in 1..size {
            // Another channel to the same endpoint, sharing the first one's token source.
            let more =
                connection
                    .channel_to(&endpoint)
                    .await
                    .map_err(|message| Error::Connect {
                        endpoint: endpoint.clone(),
                        message,
                    })?;
            services.push(more);
        }
        Ok(CloudTasksTransport {
            channels: Arc::new(Channels {
                services,
                next: AtomicUsize::new(0),
                reach: Reachability::endpoint(&endpoint),
            }),
            endpoint,
            emulator: false,
        })
    }

    /// Builds a transport on an existing plaintext channel (an emulator or a fake server).
    pub fn from_channel(channel: Channel, endpoint: impl Into<String>) -> Self {
        let endpoint = endpoint.into();
        let reach = Reachability::emulator(&endpoint, "emulator_host");
        Self::plaintext(channel, endpoint, reach)
    }

    fn plaintext(channel: Channel, endpoint: String, reach: Reachability) -> Self {
        CloudTasksTransport {
            channels: Arc::new(Channels {
                services: vec![GrpcChannel::Plaintext(channel)],
                next: AtomicUsize::new(0),
                reach,
            }),
            endpoint,
            emulator: true,
        }
    }

    /// The endpoint or emulator address this transport talks to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// How many channels the transport spreads its calls over.
    pub fn channel_count(&self) -> usize {
        self.channels.services.len()
    }
}

/// The `x-goog-request-params` value routing a call to `queue`'s backend (`parent=...`,
/// percent-encoded; see [`google::routing_value`]).
pub fn routing_value(queue: &str) -> std::result::Result<AsciiMetadataValue, String> {
    google::routing_value(&[("parent", queue)])
}

/// The part of the `Task` a `CreateTask` answers with that the sink reads: its name.
#[derive(Clone, PartialEq, prost::Message)]
struct CreatedTask {
    #[prost(string, tag = "1")]
    name: String,
}

/// Whether a `FAILED_PRECONDITION` message says that the queue does not exist: the emulator's
/// answer for a missing queue ("Queue projects/.../queues/q does not exist.").
pub fn says_queue_is_missing(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("queue") && m.contains("does not exist")
}

/// The class of a `CreateTask` status; see the module docs.
pub fn classify_create_task_status(status: &tonic::Status) -> Class {
    match status.code() {
        Code::Ok => Class::Ok,
        Code::Unavailable | Code::DeadlineExceeded | Code::ResourceExhausted => Class::Retryable,
        // A server that cancels a call it had not started (gRPC C-core drops calls past its
        // pending-request limit): transient, and a named task stays idempotent (ADR 0032).
        Code::Cancelled => Class::Retryable,
        Code::NotFound => Class::NotFound,
        Code::FailedPrecondition if says_queue_is_missing(status.message()) => Class::NotFound,
        Code::AlreadyExists => Class::Duplicate,
        Code::InvalidArgument => Class::Rejected,
        _ => Class::Fatal,
    }
}

#[async_trait]
impl Transport for CloudTasksTransport {
    type Record = TaskRecord;
    type Client = QueueClient;

    fn operation(&self) -> &'static str {
        "CreateTask"
    }

    async fn open(&self, destination: &Destination) -> Result<QueueClient> {
        let routing = routing_value(destination).map_err(|e| {
            Error::invalid(
                "queue",
                destination.to_string(),
                format!("cannot route to it: {e}"),
            )
        })?;
        Ok(QueueClient {
            channels: self.channels.clone(),
            routing,
        })
    }

    async fn send(
        &self,
        client: &QueueClient,
        destination: &Destination,
        batch: &[&TaskRecord],
        timeout: Option<Duration>,
    ) -> SendOutcome {
        // One task per call; a larger batch (which the writer never forms) is sent task by
        // task, so each still gets its own status.
        let mut statuses = Vec::with_capacity(batch.len());
        for record in batch {
            statuses.push(create_one(client, destination, record, timeout).await);
        }
        match statuses.len() {
            1 => SendOutcome::Whole(statuses.remove(0)),
            _ => SendOutcome::PerRecord(statuses),
        }
    }

    fn classify(&self, status: &tonic::Status, _solo: bool) -> Class {
        if nothing_listens(status) {
            // A refused first connection to the emulator: nothing to retry against.
            return Class::Fatal;
        }
        classify_create_task_status(status)
    }

    async fn create_destination(
        &self,
        _client: &QueueClient,
        destination: &Destination,
    ) -> Result<bool> {
        // The writer's recovery never asks (its `create` is false); answer clearly if anything
        // ever does, rather than create a queue nobody configured.
        Err(Error::Unsupported(format!(
            "queue '{destination}' is missing, and the Cloud Tasks sink never creates queues: create it first \
             (gcloud tasks queues create), then run the statement again"
        )))
    }

    async fn close(&self, client: QueueClient) {
        // The channels are shared; dropping the handle releases nothing else.
        drop(client);
    }
}

async fn create_one(
    client: &QueueClient,
    destination: &Destination,
    record: &TaskRecord,
    timeout: Option<Duration>,
) -> std::result::Result<(), tonic::Status> {
    let Some(service) = client.channels.pick() else {
        return Err(tonic::Status::unavailable("the transport has no channel"));
    };
    let mut body = Vec::with_capacity(create_task_request_len(destination, record.encoded_len()));
    write_create_task_request(&mut body, destination, record.encoded());
    // The core always gives a deadline; a zero or absent one falls back to the service config's.
    let timeout = timeout
        .filter(|t| !t.is_zero())
        .unwrap_or(CREATE_TASK_TIMEOUT);
    let mut request = with_deadline(
        tonic::Request::new(PreEncoded(body)),
        Some(timeout),
        service.is_google(),
    );
    request
        .metadata_mut()
        .insert(ROUTING_HEADER, client.routing.clone());
    let result: std::result::Result<tonic::Response<CreatedTask>, _> = client
        .channels
        .reach
        .observe(unary_pre_encoded(service.clone(), request, CREATE_TASK_PATH).await);
    result.map(|response| {
        // The task name can be a row's value (task_name_column): not logged.
        tracing::trace!(
            named = !response.get_ref().name.is_empty(),
            "created a task"
        );
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{assert_contains_all, error_text};

    fn status(code: Code, message: &str) -> tonic::Status {
        tonic::Status::new(code, message)
    }

    #[test]
    fn classifies_create_task_statuses() {
        let cases = [
            (Code::Unavailable, "", Class::Retryable),
            (Code::DeadlineExceeded, "", Class::Retryable),
            (Code::ResourceExhausted, "", Class::Retryable),
            (Code::Cancelled, "CANCELLED", Class::Retryable),
            (Code::NotFound, "Queue not found", Class::NotFound),
            (
                Code::FailedPrecondition,
                "Queue projects/p/locations/l/queues/q does not exist.",
                Class::NotFound,
            ),
            (
                Code::FailedPrecondition,
                "The queue is being deleted",
                Class::Fatal,
            ),
            (Code::AlreadyExists, "", Class::Duplicate),
            (Code::InvalidArgument, "", Class::Rejected),
            (Code::PermissionDenied, "", Class::Fatal),
            (Code::Unauthenticated, "", Class::Fatal),
            (Code::Internal, "", Class::Fatal),
            (Code::Aborted, "", Class::Fatal),
        ];
        for (code, message, class) in cases {
            assert_eq!(
                classify_create_task_status(&status(code, message)),
                class,
                "{code:?} {message}"
            );
        }
    }

    #[test]
    fn routing_header_percent_encodes_the_queue() {
        let value = routing_value("projects/p/locations/us-central1/queues/q-1").unwrap();
        assert_eq!(
            value.to_str().unwrap(),
            "parent=projects%2Fp%2Flocations%2Fus-central1%2Fqueues%2Fq-1"
        );
    }

    /// Settings for an emulator at a port nothing listens on, with `channel_pool_size`.
    fn emulator_settings(channel_pool_size: Option<usize>) -> ClientSettings {
        ClientSettings {
            endpoint: None,
            emulator_host: Some("127.0.0.1:1".into()),
            credentials_file: None,
            channel_pool_size,
        }
    }

    #[tokio::test]
    async fn refuses_a_channel_pool_with_an_emulator() {
        let err = error_text(CloudTasksTransport::connect(&emulator_settings(Some(2))).await);
        assert_contains_all(&err, &["channel_pool_size", "emulator"]);
    }

    #[tokio::test]
    async fn an_emulator_transport_has_one_lazy_channel() {
        let transport = CloudTasksTransport::connect(&emulator_settings(None))
            .await
            .unwrap();
        assert_eq!(transport.channel_count(), 1);
        assert_eq!(transport.endpoint(), "127.0.0.1:1");
    }

    #[tokio::test]
    async fn never_creates_a_missing_queue() {
        let transport = CloudTasksTransport::from_channel(
            crate::google::plaintext_endpoint("127.0.0.1:1")
                .unwrap()
                .connect_lazy(),
            "127.0.0.1:1",
        );
        let queue = Destination::from("projects/p/locations/l/queues/q");
        let client = transport.open(&queue).await.unwrap();
        let err = error_text(transport.create_destination(&client, &queue).await);
        assert_contains_all(&err, &["never creates queues", "queues/q"]);
    }

    #[tokio::test]
    async fn round_robin_visits_every_channel() {
        let channel = || {
            GrpcChannel::Plaintext(
                tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy(),
            )
        };
        let channels = Channels {
            services: vec![channel(), channel(), channel()],
            next: AtomicUsize::new(0),
            reach: Reachability::emulator("127.0.0.1:1", "emulator_host"),
        };
        let picks: Vec<usize> = (0..6)
            .map(|_| {
                let picked = channels.pick().unwrap() as *const GrpcChannel;
                channels
                    .services
                    .iter()
                    .position(|s| std::ptr::eq(s, picked))
                    .unwrap()
            })
            .collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
    }
}
