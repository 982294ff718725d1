//! A "null" server for each sink's service: it acknowledges every request and counts what it
//! received.
//!
//! It serves one method over plaintext HTTP/2 on a loopback port, chosen by [`NullService`]:
//!
//! | service | method | answer |
//! |---|---|---|
//! | [`NullService::PubSub`] | `google.pubsub.v1.Publisher/Publish` | one message id per message |
//! | [`NullService::Bigtable`] | `google.bigtable.v2.Bigtable/MutateRows` | one streamed response with an OK status for every entry |
//! | [`NullService::CloudTasks`] | `google.cloud.tasks.v2.CloudTasks/CreateTask` | the task, named `QUEUE/tasks/N` |
//!
//! Each request is answered at once or after a fixed latency; every other method answers
//! `UNIMPLEMENTED`. Point a sink at it with `emulator_host`, exactly as at an emulator; create no
//! topic, table or queue first (every name is accepted).
//!
//! # Built so that it is not the bottleneck
//!
//! - The request is not decoded into its generated type: a counting message type walks the
//!   top-level fields, skipping each record (message, entry or task) by its length prefix, so a
//!   request costs one pass over its varints (the bytes themselves are only copied once, by
//!   tonic, into its receive buffer). The three requests keep their records in field 2 and their
//!   destination (topic, table, queue) in field 1, so one counting type serves all three.
//! - The responses are written straight from a counter: message ids are decimal numbers, formatted
//!   while encoding, with no `Vec<String>` built; a `MutateRows` answer is written entry by entry.
//! - HTTP/2 flow-control windows are large (16 MiB per stream, 64 MiB per connection) instead of
//!   tonic's 64 KiB defaults, so a 10 MB request never waits for window updates; requests up to
//!   [`NullService::max_request_bytes`] are accepted (tonic's default limit is 4 MiB).
//!
//! One generic gRPC service ([`NullService`] picks its method) does the routing, the counting
//! and the latency; each method only says how its answer is encoded.
//!
//! ```no_run
//! use gcp_sql::bench::null_server::{NullServer, NullServerOptions, NullService};
//!
//! # async fn demo() -> std::io::Result<()> {
//! let options = NullServerOptions { service: NullService::Bigtable, ..Default::default() };
//! let server = NullServer::start("127.0.0.1:0".parse().unwrap(), options).await?;
//! println!("emulator_host = '{}'", server.addr());
//! // ... run an INSERT into a bigtable table with that emulator_host ...
//! let totals = server.totals();
//! println!("{} entries, {} bytes", totals.records, totals.record_bytes);
//! # Ok(()) }
//! ```

use std::convert::Infallible;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType};
use tonic::codegen::{Service, http};
use tonic::server::NamedService;

/// The Pub/Sub method a [`NullService::PubSub`] server answers.
pub const PUBLISH_PATH: &str = "/google.pubsub.v1.Publisher/Publish";
/// The Bigtable method a [`NullService::Bigtable`] server answers.
pub const MUTATE_ROWS_PATH: &str = "/google.bigtable.v2.Bigtable/MutateRows";
/// The Cloud Tasks method a [`NullService::CloudTasks`] server answers.
pub const CREATE_TASK_PATH: &str = crate::connectors::cloud_tasks::client::CREATE_TASK_PATH;

/// Largest `Publish` or `CreateTask` request the server accepts. Pub/Sub's own limit is
/// 10,000,000 bytes per request and a task is at most 100 KB (docs/service_facts.md); the
/// margin lets an over-limit request through to be counted rather than refused, since measuring
/// is the point.
pub const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;
/// Largest `MutateRows` request the server accepts: the Bigtable sink's largest
/// `batch_request_byte_threshold` is one byte under 100 MiB, plus the request's framing.
pub const MAX_MUTATE_ROWS_REQUEST_BYTES: usize = 128 * 1024 * 1024;

/// HTTP/2 per-stream receive window: larger than any request, so a request never stalls on it.
const STREAM_WINDOW: u32 = 16 * 1024 * 1024;
/// HTTP/2 per-connection receive window: room for several large requests at once.
const CONNECTION_WINDOW: u32 = 64 * 1024 * 1024;

/// The service a null server stands in for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum NullService {
    /// Pub/Sub: `Publish`, answered with one message id per message.
    #[default]
    PubSub,
    /// Bigtable: `MutateRows`, answered on its stream with an OK status for every entry.
    Bigtable,
    /// Cloud Tasks: `CreateTask`, answered with the task, named.
    CloudTasks,
}

impl NullService {
    /// Every service, in the order of the table above.
    pub const ALL: [NullService; 3] = [
        NullService::PubSub,
        NullService::Bigtable,
        NullService::CloudTasks,
    ];

    /// The service's name on the command line (`pubsub`, `bigtable`, `cloud-tasks`).
    ///
    /// ```
    /// use gcp_sql::bench::null_server::NullService;
    /// assert_eq!(NullService::CloudTasks.name(), "cloud-tasks");
    /// assert_eq!(NullService::from_name("bigtable"), Some(NullService::Bigtable));
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            NullService::PubSub => "pubsub",
            NullService::Bigtable => "bigtable",
            NullService::CloudTasks => "cloud-tasks",
        }
    }

    /// The service named `name` (as [`name`](Self::name) spells it).
    pub fn from_name(name: &str) -> Option<NullService> {
        NullService::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The gRPC method path it answers.
    pub fn method_path(self) -> &'static str {
        match self {
            NullService::PubSub => PUBLISH_PATH,
            NullService::Bigtable => MUTATE_ROWS_PATH,
            NullService::CloudTasks => CREATE_TASK_PATH,
        }
    }

    /// What one record of a request is called for this service (`messages`, `entries`, `tasks`).
    pub fn records_word(self) -> &'static str {
        match self {
            NullService::PubSub => "messages",
            NullService::Bigtable => "entries",
            NullService::CloudTasks => "tasks",
        }
    }

    /// The largest request body the server accepts for this service.
    pub fn max_request_bytes(self) -> usize {
        match self {
            NullService::Bigtable => MAX_MUTATE_ROWS_REQUEST_BYTES,
            NullService::PubSub | NullService::CloudTasks => MAX_REQUEST_BYTES,
        }
    }
}

impl std::fmt::Display for NullService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How the server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NullServerOptions {
    /// How long each request waits before it is answered (zero: at once). The wait does not
    /// hold a thread, so concurrent requests wait in parallel, as at a real service.
    pub latency: Duration,
    /// Which service (and so which method) it answers.
    pub service: NullService,
}

/// What the server has received so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NullTotals {
    /// Requests received (`Publish`, `MutateRows` or `CreateTask` calls).
    pub requests: u64,
    /// Records received: Pub/Sub messages, Bigtable entries (rows), or Cloud Tasks tasks.
    pub records: u64,
    /// Serialized bytes of those records (each `PubsubMessage`, `MutateRowsRequest.Entry` or
    /// `Task`, without its length prefix), the same unit as the sink's `bytes_sent` metric.
    pub record_bytes: u64,
    /// Bytes of the request bodies (destination names and framing included).
    pub request_bytes: u64,
}

impl NullTotals {
    /// The difference `self - earlier`, for rates over an interval.
    pub fn since(&self, earlier: &NullTotals) -> NullTotals {
        NullTotals {
            requests: self.requests.saturating_sub(earlier.requests),
            records: self.records.saturating_sub(earlier.records),
            record_bytes: self.record_bytes.saturating_sub(earlier.record_bytes),
            request_bytes: self.request_bytes.saturating_sub(earlier.request_bytes),
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    records: AtomicU64,
    record_bytes: AtomicU64,
    request_bytes: AtomicU64,
}

#[derive(Debug)]
struct State {
    options: NullServerOptions,
    counters: Counters,
    /// Arrival of the first and of the latest request.
    active: Mutex<Option<(Instant, Instant)>>,
    /// The id of the next record (message ids and task numbers count from 1).
    next_id: AtomicU64,
}

impl State {
    fn totals(&self) -> NullTotals {
        let c = &self.counters;
        NullTotals {
            requests: c.requests.load(Ordering::Relaxed),
            records: c.records.load(Ordering::Relaxed),
            record_bytes: c.record_bytes.load(Ordering::Relaxed),
            request_bytes: c.request_bytes.load(Ordering::Relaxed),
        }
    }

    /// Counts one request; returns the id of its first record.
    fn count(&self, counted: &CountedRequest) -> u64 {
        let now = Instant::now();
        {
            let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
            let first = active.map_or(now, |(first, _)| first);
            *active = Some((first, now));
        }
        let c = &self.counters;
        c.requests.fetch_add(1, Ordering::Relaxed);
        c.records.fetch_add(counted.records, Ordering::Relaxed);
        c.record_bytes
            .fetch_add(counted.record_bytes, Ordering::Relaxed);
        c.request_bytes
            .fetch_add(counted.body_bytes, Ordering::Relaxed);
        self.next_id.fetch_add(counted.records, Ordering::Relaxed)
    }
}

/// A `PublishRequest`, `MutateRowsRequest` or `CreateTaskRequest` read only as far as counting
/// goes: field 2 (`messages`, `entries`, `task`) is counted and skipped, field 1 (`topic`,
/// `table_name`, `parent`) kept, every other field skipped.
#[derive(Debug, Default)]
struct CountedRequest {
    records: u64,
    record_bytes: u64,
    body_bytes: u64,
    destination: Vec<u8>,
}

/// Field number of the records (`PublishRequest.messages`, `MutateRowsRequest.entries`,
/// `CreateTaskRequest.task`).
const RECORDS_FIELD: u32 = 2;
/// Field number of the destination (`PublishRequest.topic`, `MutateRowsRequest.table_name`,
/// `CreateTaskRequest.parent`).
const DESTINATION_FIELD: u32 = 1;

/// The payload length of a length-delimited field that took `consumed` bytes in all (length
/// prefix included).
fn payload_len(consumed: u64) -> u64 {
    (1..=10u64)
        .find(|&prefix| {
            consumed >= prefix
                && prost::encoding::encoded_len_varint(consumed - prefix) as u64 == prefix
        })
        .map_or(0, |prefix| consumed - prefix)
}

impl prost::Message for CountedRequest {
    fn encode_raw(&self, _buf: &mut impl BufMut) {
        // Only ever decoded.
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        let before = buf.remaining();
        if tag == DESTINATION_FIELD && wire_type == WireType::LengthDelimited {
            prost::encoding::bytes::merge(wire_type, &mut self.destination, buf, ctx)?;
        } else {
            prost::encoding::skip_field(wire_type, tag, buf, ctx)?;
        }
        let consumed = (before - buf.remaining()) as u64;
        let key = (u64::from(tag) << 3) | wire_type as u64;
        self.body_bytes += prost::encoding::encoded_len_varint(key) as u64 + consumed;
        if tag == RECORDS_FIELD && wire_type == WireType::LengthDelimited {
            self.records += 1;
            self.record_bytes += payload_len(consumed);
        }
        Ok(())
    }

    fn encoded_len(&self) -> usize {
        0
    }

    fn clear(&mut self) {
        *self = CountedRequest::default();
    }
}

/// A response written straight from what the server counted, never decoded: the three answers
/// implement only this, and [`Answer`] makes each a `prost::Message` for tonic's codec.
trait WriteOnly: std::fmt::Debug + Send + Sync + 'static {
    /// Writes the serialized message.
    fn write(&self, buf: &mut impl BufMut);
    /// Its serialized length.
    fn len(&self) -> usize;
}

/// A [`WriteOnly`] response as a `prost::Message`.
#[derive(Debug)]
struct Answer<T>(T);

impl<T: WriteOnly> prost::Message for Answer<T> {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        self.0.write(buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        // Only ever encoded.
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.0.len()
    }

    fn clear(&mut self) {
        // Only ever encoded: nothing is merged into an answer, so there is nothing to clear.
    }
}

/// A `PublishResponse` with ids `first .. first + count`, written as decimal strings.
#[derive(Debug)]
struct NullPublishResponse {
    first: u64,
    count: u64,
}

/// Field number of `PublishResponse.message_ids`.
const MESSAGE_IDS_FIELD: u32 = 1;

impl WriteOnly for NullPublishResponse {
    fn write(&self, buf: &mut impl BufMut) {
        let mut text = itoa::Buffer::new();
        for id in self.first..self.first + self.count {
            let id = text.format(id);
            prost::encoding::encode_key(MESSAGE_IDS_FIELD, WireType::LengthDelimited, buf);
            prost::encoding::encode_varint(id.len() as u64, buf);
            buf.put_slice(id.as_bytes());
        }
    }

    fn len(&self) -> usize {
        let mut text = itoa::Buffer::new();
        (self.first..self.first + self.count)
            // Key (1 byte), length (1 byte: an id has at most 20 digits), digits.
            .map(|id| 2 + text.format(id).len())
            .sum()
    }
}

/// A `MutateRowsResponse` with one entry per request entry, indexes `0 .. count`, each with an
/// OK status (an empty `google.rpc.Status`, as proto3 writes code 0).
#[derive(Debug)]
struct NullMutateRowsResponse {
    count: u64,
}

/// Field number of `MutateRowsResponse.entries`.
const MUTATE_ENTRIES_FIELD: u32 = 1;
/// Field numbers of `MutateRowsResponse.Entry.index` and `.status`.
const ENTRY_INDEX_FIELD: u32 = 1;
const ENTRY_STATUS_FIELD: u32 = 2;

impl NullMutateRowsResponse {
    /// Bytes of the `Entry` for `index` (without its key and length prefix): the index (left out
    /// at 0, as proto3 does) and the empty status.
    fn entry_len(index: u64) -> usize {
        let index_len = if index == 0 {
            0
        } else {
            1 + prost::encoding::encoded_len_varint(index)
        };
        index_len + 2
    }
}

impl WriteOnly for NullMutateRowsResponse {
    fn write(&self, buf: &mut impl BufMut) {
        for index in 0..self.count {
            prost::encoding::encode_key(MUTATE_ENTRIES_FIELD, WireType::LengthDelimited, buf);
            prost::encoding::encode_varint(Self::entry_len(index) as u64, buf);
            if index != 0 {
                prost::encoding::encode_key(ENTRY_INDEX_FIELD, WireType::Varint, buf);
                prost::encoding::encode_varint(index, buf);
            }
            prost::encoding::encode_key(ENTRY_STATUS_FIELD, WireType::LengthDelimited, buf);
            prost::encoding::encode_varint(0, buf);
        }
    }

    fn len(&self) -> usize {
        (0..self.count)
            // Key (1 byte), length (1 byte: an entry is at most 13 bytes), the entry.
            .map(|index| 2 + Self::entry_len(index))
            .sum()
    }
}

/// A `Task` carrying only its name, `QUEUE/tasks/ID`.
#[derive(Debug)]
struct NullTask {
    queue: Vec<u8>,
    id: u64,
}

/// Field number of `Task.name`.
const TASK_NAME_FIELD: u32 = 1;
/// What joins the queue and the task id in a task name.
const TASKS_SEGMENT: &[u8] = b"/tasks/";

impl NullTask {
    fn name_len(&self) -> usize {
        self.queue.len() + TASKS_SEGMENT.len() + itoa::Buffer::new().format(self.id).len()
    }
}

impl WriteOnly for NullTask {
    fn write(&self, buf: &mut impl BufMut) {
        prost::encoding::encode_key(TASK_NAME_FIELD, WireType::LengthDelimited, buf);
        prost::encoding::encode_varint(self.name_len() as u64, buf);
        buf.put_slice(&self.queue);
        buf.put_slice(TASKS_SEGMENT);
        buf.put_slice(itoa::Buffer::new().format(self.id).as_bytes());
    }

    fn len(&self) -> usize {
        let name = self.name_len();
        1 + prost::encoding::encoded_len_varint(name as u64) + name
    }
}

/// What one method of a null service answers, built from the counted request. The routing, the
/// counting, the latency and the codec are the same for every method ([`NullGrpc`]).
trait NullAnswer: WriteOnly + Sized {
    /// Whether the method is server-streaming (`MutateRows`) rather than unary.
    const STREAMING: bool;
    /// The answer to `request`, whose first record got id `first_id`.
    fn answer(request: CountedRequest, first_id: u64) -> Self;
}

impl NullAnswer for NullPublishResponse {
    const STREAMING: bool = false;
    fn answer(request: CountedRequest, first_id: u64) -> Self {
        NullPublishResponse {
            first: first_id,
            count: request.records,
        }
    }
}

impl NullAnswer for NullMutateRowsResponse {
    const STREAMING: bool = true;
    fn answer(request: CountedRequest, _first_id: u64) -> Self {
        NullMutateRowsResponse {
            count: request.records,
        }
    }
}

impl NullAnswer for NullTask {
    const STREAMING: bool = false;
    fn answer(request: CountedRequest, first_id: u64) -> Self {
        NullTask {
            queue: request.destination,
            id: first_id,
        }
    }
}

/// Counts a request and answers it with `M` after the configured latency; the same
/// value serves as tonic's unary and server-streaming handler.
struct NullCall<M> {
    state: Arc<State>,
    method: PhantomData<fn() -> M>,
}

impl<M> Clone for NullCall<M> {
    fn clone(&self) -> Self {
        NullCall {
            state: self.state.clone(),
            method: PhantomData,
        }
    }
}

impl<M: NullAnswer> NullCall<M> {
    /// Counts `request` and returns the future of its answer.
    fn respond(
        &self,
        request: tonic::Request<CountedRequest>,
    ) -> BoxFuture<'static, Result<Answer<M>, tonic::Status>> {
        let counted = request.into_inner();
        let first_id = self.state.count(&counted);
        let latency = self.state.options.latency;
        let response = Answer(M::answer(counted, first_id));
        Box::pin(async move {
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            Ok(response)
        })
    }
}

impl<M: NullAnswer> tonic::server::UnaryService<CountedRequest> for NullCall<M> {
    type Response = Answer<M>;
    type Future = BoxFuture<'static, Result<tonic::Response<Self::Response>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<CountedRequest>) -> Self::Future {
        let answer = self.respond(request);
        Box::pin(async move { answer.await.map(tonic::Response::new) })
    }
}

/// The answer of a streaming method: one message on the stream, then its end.
type OneMessage<T> = futures::stream::Iter<std::option::IntoIter<Result<T, tonic::Status>>>;

impl<M: NullAnswer> tonic::server::ServerStreamingService<CountedRequest> for NullCall<M> {
    type Response = Answer<M>;
    type ResponseStream = OneMessage<Answer<M>>;
    type Future = BoxFuture<'static, Result<tonic::Response<Self::ResponseStream>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<CountedRequest>) -> Self::Future {
        let answer = self.respond(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(tonic::Response::new(futures::stream::iter(Some(Ok(
                response,
            )))))
        })
    }
}

/// The gRPC service of a null server: answers `method_path` through `M`, and `UNIMPLEMENTED`
/// to every other method of the service.
struct NullGrpc<M> {
    call: NullCall<M>,
    method_path: &'static str,
    max_request_bytes: usize,
}

impl<M> Clone for NullGrpc<M> {
    fn clone(&self) -> Self {
        NullGrpc {
            call: self.call.clone(),
            method_path: self.method_path,
            max_request_bytes: self.max_request_bytes,
        }
    }
}

/// The gRPC service names, one per answer type (tonic routes on `NamedService::NAME`).
impl NamedService for NullGrpc<NullPublishResponse> {
    const NAME: &'static str = "google.pubsub.v1.Publisher";
}
impl NamedService for NullGrpc<NullMutateRowsResponse> {
    const NAME: &'static str = "google.bigtable.v2.Bigtable";
}
impl NamedService for NullGrpc<NullTask> {
    const NAME: &'static str = "google.cloud.tasks.v2.CloudTasks";
}

impl<M: NullAnswer> NullGrpc<M> {
    fn new(state: Arc<State>) -> Self {
        let service = state.options.service;
        NullGrpc {
            call: NullCall {
                state,
                method: PhantomData,
            },
            method_path: service.method_path(),
            max_request_bytes: service.max_request_bytes(),
        }
    }
}

impl<M: NullAnswer> Service<http::Request<tonic::body::Body>> for NullGrpc<M> {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        if request.uri().path() != self.method_path {
            let status = tonic::Status::unimplemented(format!(
                "the null server answers only {}, not {}",
                self.method_path,
                request.uri().path()
            ));
            return Box::pin(async move { Ok(status.into_http()) });
        }
        let call = self.call.clone();
        let limit = self.max_request_bytes;
        Box::pin(async move {
            let codec = tonic_prost::ProstCodec::<Answer<M>, CountedRequest>::default();
            let mut grpc = tonic::server::Grpc::new(codec).max_decoding_message_size(limit);
            Ok(if M::STREAMING {
                grpc.server_streaming(call, request).await
            } else {
                grpc.unary(call, request).await
            })
        })
    }
}

/// A running null server; stops when dropped.
#[derive(Debug)]
pub struct NullServer {
    addr: SocketAddr,
    state: Arc<State>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl NullServer {
    /// Binds `addr` (port 0 picks a free port) and serves `options.service` on the current tokio
    /// runtime until the server is dropped.
    pub async fn start(
        addr: SocketAddr,
        options: NullServerOptions,
    ) -> std::io::Result<NullServer> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            options,
            counters: Counters::default(),
            active: Mutex::new(None),
            next_id: AtomicU64::new(1),
        });
        let routes = match options.service {
            NullService::PubSub => {
                tonic::service::Routes::new(NullGrpc::<NullPublishResponse>::new(state.clone()))
            }
            NullService::Bigtable => {
                tonic::service::Routes::new(NullGrpc::<NullMutateRowsResponse>::new(state.clone()))
            }
            NullService::CloudTasks => {
                tonic::service::Routes::new(NullGrpc::<NullTask>::new(state.clone()))
            }
        };
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .initial_stream_window_size(STREAM_WINDOW)
                .initial_connection_window_size(CONNECTION_WINDOW)
                .add_routes(routes)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(error) = served {
                tracing::warn!(%error, "null server ended");
            }
        });
        Ok(NullServer {
            addr,
            state,
            stop: Some(stop),
            task,
        })
    }

    /// The bound address (`127.0.0.1:PORT`), usable as `emulator_host`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What the server has received so far.
    pub fn totals(&self) -> NullTotals {
        self.state.totals()
    }

    /// The options it answers with.
    pub fn options(&self) -> NullServerOptions {
        self.state.options
    }

    /// Time from the arrival of the first request to the arrival of the latest one (`None`
    /// before any request).
    pub fn active_window(&self) -> Option<Duration> {
        let active = *self.state.active.lock().unwrap_or_else(|p| p.into_inner());
        active.map(|(first, last)| last - first)
    }
}

impl Drop for NullServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.abort();
    }
}

/// One line of figures: totals and, over `elapsed`, rates (records are messages, entries or
/// tasks, as [`NullService::records_word`] names them).
///
/// ```
/// use std::time::Duration;
/// use gcp_sql::bench::null_server::{NullTotals, format_totals};
///
/// let t = NullTotals { requests: 10, records: 10_000, record_bytes: 2_000_000, request_bytes: 2_030_000 };
/// let line = format_totals(&t, Duration::from_secs(2));
/// assert!(line.contains("records=10000"), "{line}");
/// assert!(line.contains("records_per_s=5000"), "{line}");
/// ```
pub fn format_totals(totals: &NullTotals, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    let rate = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
    format!(
        "requests={} records={} record_bytes={} request_bytes={} elapsed_s={:.3} records_per_s={:.0} mb_per_s={:.2}",
        totals.requests,
        totals.records,
        totals.record_bytes,
        totals.request_bytes,
        secs,
        rate(totals.records),
        rate(totals.record_bytes) / 1e6,
    )
}

#[cfg(test)]
mod tests {
    use gcloud_sdk::google::bigtable::v2::bigtable_client::BigtableClient;
    use gcloud_sdk::google::bigtable::v2::{
        MutateRowsRequest, MutateRowsResponse, Mutation, mutate_rows_request, mutation,
    };
    use gcloud_sdk::google::cloud::tasks::v2::cloud_tasks_client::CloudTasksClient;
    use gcloud_sdk::google::cloud::tasks::v2::{CreateTaskRequest, HttpRequest, Task, task};
    use gcloud_sdk::google::pubsub::v1::publisher_client::PublisherClient;
    use gcloud_sdk::google::pubsub::v1::{PublishRequest, PubsubMessage, Topic};
    use prost::Message as _;

    use super::*;

    fn request(messages: &[&[u8]]) -> PublishRequest {
        PublishRequest {
            topic: "projects/p/topics/null".into(),
            messages: messages
                .iter()
                .map(|data| PubsubMessage {
                    data: data.to_vec(),
                    ..Default::default()
                })
                .collect(),
        }
    }

    #[test]
    fn counting_decode_sees_every_message_and_its_size() {
        let big = vec![7u8; 300];
        let req = request(&[b"a", &big, b""]);
        let sizes: u64 = req.messages.iter().map(|m| m.encoded_len() as u64).sum();
        let counted = CountedRequest::decode(req.encode_to_vec().as_slice()).unwrap();
        assert_eq!(counted.records, 3);
        assert_eq!(counted.record_bytes, sizes);
        assert_eq!(counted.destination, b"projects/p/topics/null");
        assert_eq!(counted.body_bytes, req.encoded_len() as u64);
    }

    #[test]
    fn counting_decode_refuses_a_truncated_request() {
        let bytes = request(&[b"hello"]).encode_to_vec();
        assert!(CountedRequest::decode(&bytes[..bytes.len() - 2]).is_err());
    }

    #[test]
    fn payload_length_undoes_the_length_prefix() {
        for len in [0u64, 1, 127, 128, 16_383, 16_384, 10_000_000] {
            let consumed = len + prost::encoding::encoded_len_varint(len) as u64;
            assert_eq!(payload_len(consumed), len);
        }
    }

    #[test]
    fn response_encodes_as_the_generated_type_with_one_id_per_message() {
        let response = Answer(NullPublishResponse {
            first: 98,
            count: 4,
        });
        let bytes = response.encode_to_vec();
        assert_eq!(bytes.len(), response.encoded_len());
        let decoded =
            gcloud_sdk::google::pubsub::v1::PublishResponse::decode(bytes.as_slice()).unwrap();
        assert_eq!(decoded.message_ids, vec!["98", "99", "100", "101"]);
    }

    #[tokio::test]
    async fn generated_client_publishes_and_the_server_counts() {
        let server =
            NullServer::start("127.0.0.1:0".parse().unwrap(), NullServerOptions::default())
                .await
                .unwrap();
        let mut client = PublisherClient::connect(format!("http://{}", server.addr()))
            .await
            .unwrap();
        let req = request(&[b"one", b"two"]);
        let sizes: u64 = req.messages.iter().map(|m| m.encoded_len() as u64).sum();
        let first = client.publish(req.clone()).await.unwrap().into_inner();
        let second = client.publish(req).await.unwrap().into_inner();
        assert_eq!(first.message_ids, vec!["1", "2"]);
        assert_eq!(second.message_ids, vec!["3", "4"]);
        let totals = server.totals();
        assert_eq!(totals.requests, 2);
        assert_eq!(totals.records, 4);
        assert_eq!(totals.record_bytes, 2 * sizes);
    }

    #[tokio::test]
    async fn methods_other_than_publish_are_unimplemented() {
        let server =
            NullServer::start("127.0.0.1:0".parse().unwrap(), NullServerOptions::default())
                .await
                .unwrap();
        let mut client = PublisherClient::connect(format!("http://{}", server.addr()))
            .await
            .unwrap();
        let status = client
            .create_topic(Topic {
                name: "projects/p/topics/null".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unimplemented);
        assert!(
            status.message().contains("CreateTopic"),
            "{}",
            status.message()
        );
    }

    /// Starts a `service` server answering after 30 s, runs `call` against it, and checks that
    /// the request is counted at once but answered only after the latency; returns the answer.
    async fn answered_after_latency<F, T>(service: NullService, call: impl FnOnce(String) -> F) -> T
    where
        F: std::future::Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let server = NullServer::start(
            "127.0.0.1:0".parse().unwrap(),
            NullServerOptions {
                latency: Duration::from_secs(30),
                service,
            },
        )
        .await
        .unwrap();
        let answer = tokio::spawn(call(format!("http://{}", server.addr())));
        // The request arrives and is counted, but is not answered before the latency passes.
        while server.totals().requests == 0 {
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_secs(29)).await;
        assert!(!answer.is_finished());
        answer.await.unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn latency_delays_the_acknowledgement() {
        let response = answered_after_latency(NullService::PubSub, |url| async move {
            let mut client = PublisherClient::connect(url).await?;
            client.publish(request(&[b"x"])).await.map_err(Into::into)
        })
        .await
        .map_err(|e: Box<dyn std::error::Error + Send + Sync>| e.to_string())
        .unwrap()
        .into_inner();
        assert_eq!(response.message_ids, vec!["1"]);
    }

    async fn start(service: NullService) -> NullServer {
        NullServer::start(
            "127.0.0.1:0".parse().unwrap(),
            NullServerOptions {
                service,
                ..Default::default()
            },
        )
        .await
        .unwrap()
    }

    fn mutate_rows_request(rows: usize) -> MutateRowsRequest {
        MutateRowsRequest {
            table_name: "projects/p/instances/i/tables/null".into(),
            entries: (0..rows)
                .map(|i| mutate_rows_request::Entry {
                    row_key: format!("row-{i}").into_bytes(),
                    mutations: vec![Mutation {
                        mutation: Some(mutation::Mutation::SetCell(mutation::SetCell {
                            family_name: "cf".into(),
                            column_qualifier: b"c".to_vec(),
                            timestamp_micros: 1_000,
                            value: vec![b'v'; 30],
                        })),
                        ..Default::default()
                    }],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn create_task_request(body: &[u8]) -> CreateTaskRequest {
        CreateTaskRequest {
            parent: "projects/p/locations/l/queues/null".into(),
            task: Some(Task {
                message_type: Some(task::MessageType::HttpRequest(HttpRequest {
                    url: "https://example.com/work".into(),
                    body: body.to_vec(),
                    ..Default::default()
                })),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn mutate_rows_response_encodes_as_the_generated_type_with_ok_for_every_entry() {
        for count in [0u64, 1, 3, 200] {
            let response = Answer(NullMutateRowsResponse { count });
            let bytes = response.encode_to_vec();
            assert_eq!(bytes.len(), response.encoded_len(), "{count} entries");
            let decoded = MutateRowsResponse::decode(bytes.as_slice()).unwrap();
            let indexes: Vec<i64> = decoded.entries.iter().map(|e| e.index).collect();
            assert_eq!(indexes, (0..count as i64).collect::<Vec<_>>());
            assert!(
                decoded
                    .entries
                    .iter()
                    .all(|e| e.status.as_ref().is_some_and(|s| s.code == 0)),
                "every entry has an OK status"
            );
        }
    }

    #[test]
    fn task_response_encodes_as_the_generated_type_named_after_the_queue() {
        let response = Answer(NullTask {
            queue: b"projects/p/locations/l/queues/q".to_vec(),
            id: 1234,
        });
        let bytes = response.encode_to_vec();
        assert_eq!(bytes.len(), response.encoded_len());
        let decoded = Task::decode(bytes.as_slice()).unwrap();
        assert_eq!(decoded.name, "projects/p/locations/l/queues/q/tasks/1234");
    }

    #[test]
    fn counting_decode_counts_entries_and_a_task_in_field_two() {
        let req = mutate_rows_request(5);
        let sizes: u64 = req.entries.iter().map(|e| e.encoded_len() as u64).sum();
        let counted = CountedRequest::decode(req.encode_to_vec().as_slice()).unwrap();
        assert_eq!((counted.records, counted.record_bytes), (5, sizes));
        assert_eq!(counted.body_bytes, req.encoded_len() as u64);

        let req = create_task_request(&[b'x'; 200]);
        let size = req.task.as_ref().unwrap().encoded_len() as u64;
        let counted = CountedRequest::decode(req.encode_to_vec().as_slice()).unwrap();
        assert_eq!((counted.records, counted.record_bytes), (1, size));
        assert_eq!(counted.destination, req.parent.as_bytes());
    }

    #[tokio::test]
    async fn generated_bigtable_client_gets_an_ok_status_for_every_entry() {
        let server = start(NullService::Bigtable).await;
        let mut client = BigtableClient::connect(format!("http://{}", server.addr()))
            .await
            .unwrap();
        let req = mutate_rows_request(150);
        let sizes: u64 = req.entries.iter().map(|e| e.encoded_len() as u64).sum();
        let mut stream = client.mutate_rows(req).await.unwrap().into_inner();
        let mut indexes = Vec::new();
        while let Some(response) = stream.message().await.unwrap() {
            for entry in response.entries {
                assert_eq!(entry.status.map(|s| s.code), Some(0));
                indexes.push(entry.index);
            }
        }
        assert_eq!(indexes, (0..150).collect::<Vec<i64>>());
        let totals = server.totals();
        assert_eq!((totals.requests, totals.records), (1, 150));
        assert_eq!(totals.record_bytes, sizes);
    }

    #[tokio::test]
    async fn generated_cloud_tasks_client_gets_each_task_back_named() {
        let server = start(NullService::CloudTasks).await;
        let mut client = CloudTasksClient::connect(format!("http://{}", server.addr()))
            .await
            .unwrap();
        let req = create_task_request(&[b'x'; 200]);
        let size = req.task.as_ref().unwrap().encoded_len() as u64;
        let first = client.create_task(req.clone()).await.unwrap().into_inner();
        let second = client.create_task(req).await.unwrap().into_inner();
        assert_eq!(first.name, "projects/p/locations/l/queues/null/tasks/1");
        assert_eq!(second.name, "projects/p/locations/l/queues/null/tasks/2");
        let totals = server.totals();
        assert_eq!((totals.requests, totals.records), (2, 2));
        assert_eq!(totals.record_bytes, 2 * size);
    }

    #[tokio::test]
    async fn a_server_answers_only_its_own_service() {
        let server = start(NullService::Bigtable).await;
        let mut publisher = PublisherClient::connect(format!("http://{}", server.addr()))
            .await
            .unwrap();
        let status = publisher.publish(request(&[b"x"])).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unimplemented);
        let mut tasks = CloudTasksClient::connect(format!("http://{}", server.addr()))
            .await
            .unwrap();
        let status = tasks
            .create_task(create_task_request(b"x"))
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unimplemented);
        assert_eq!(server.totals(), NullTotals::default());
    }

    #[tokio::test]
    async fn other_bigtable_methods_are_unimplemented() {
        let server = start(NullService::Bigtable).await;
        let mut client = BigtableClient::connect(format!("http://{}", server.addr()))
            .await
            .unwrap();
        let status = client
            .mutate_row(gcloud_sdk::google::bigtable::v2::MutateRowRequest {
                table_name: "projects/p/instances/i/tables/null".into(),
                row_key: b"k".to_vec(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unimplemented);
        assert!(
            status
                .message()
                .ends_with("not /google.bigtable.v2.Bigtable/MutateRow"),
            "{}",
            status.message()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn latency_delays_the_mutate_rows_stream() {
        let entries = answered_after_latency(NullService::Bigtable, |url| async move {
            let mut client = BigtableClient::connect(url).await?;
            let mut stream = client
                .mutate_rows(mutate_rows_request(2))
                .await?
                .into_inner();
            let mut entries = 0;
            while let Some(response) = stream.message().await? {
                entries += response.entries.len();
            }
            Ok::<usize, Box<dyn std::error::Error + Send + Sync>>(entries)
        })
        .await
        .map_err(|e| e.to_string())
        .unwrap();
        assert_eq!(entries, 2);
    }

    #[test]
    fn service_names_round_trip() {
        for service in NullService::ALL {
            assert_eq!(NullService::from_name(service.name()), Some(service));
            assert!(service.method_path().starts_with("/google."));
        }
        assert_eq!(NullService::from_name("pub-sub"), None);
        assert_eq!(NullService::default(), NullService::PubSub);
    }
}
