//! What every null server shares, and what one service's null method is made of (feature
//! `testing`): the counting request type, the write-only answers, the generic gRPC handler,
//! the router every null service goes through ([`NullRoutes`], [`Routed`]), and
//! [`NullMethod`], the description each connector's folder gives of its method
//! (`connectors::<name>::null`, which its testing part hands to the registry). The server itself
//! is in [`crate::bench::null_server`]; the list of services is the registry's
//! (`connectors::registry::null_services`). This file names no connector and imports none.

use std::convert::Infallible;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType};
use tonic::codegen::{Service, http};
use tonic::server::NamedService;

/// Largest `Publish` or `CreateTask` request the server accepts. Pub/Sub's own limit is
/// 10,000,000 bytes per request and a task is at most 100 KB (docs/service_facts.md); the
/// margin lets an over-limit request through to be counted rather than refused, since measuring
/// is the point.
pub const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;
/// Largest `MutateRows` request the server accepts: the Bigtable sink's largest
/// `batch_request_byte_threshold` is one byte under 100 MiB, plus the request's framing.
pub const MAX_MUTATE_ROWS_REQUEST_BYTES: usize = 128 * 1024 * 1024;

/// One service's null method, as its connector's folder describes it.
#[derive(Debug)]
pub struct NullMethod {
    /// The service's name on the command line (`pubsub`, `bigtable`, `cloud-tasks`).
    pub name: &'static str,
    /// The gRPC method path it answers (`/google.pubsub.v1.Publisher/Publish`).
    pub method_path: &'static str,
    /// What one record of a request is called (`messages`, `entries`, `tasks`).
    pub records_word: &'static str,
    /// The largest request body the server accepts.
    pub max_request_bytes: usize,
    /// The routes of a server answering this method over `state` (the connector's answer type
    /// through [`routes`]).
    pub routes: fn(state: Arc<NullState>) -> tonic::service::Routes,
}

/// The smallest message a null subscription makes: `{"id":N,"body":""}` with the longest `N`
/// ([`FeedOptions::message_size`] is at least this).
pub const MIN_MESSAGE_SIZE: usize = 38;

/// What a null server that serves messages (`pubsub-subscribe`) hands out: every subscription
/// name it is asked for gets its own backlog of `messages` canned messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedOptions {
    /// Messages in each subscription's backlog; for `bigtable-read`, rows in every table.
    pub messages: u64,
    /// Data bytes of each message.
    pub message_size: usize,
    /// Ordering keys the messages cycle through (message `n` has key `n % keys`); 0: no keys,
    /// and the subscription is not ordered.
    pub ordering_keys: u32,
    /// The longest lease the server grants, whatever the client asks (`None`: what it asks,
    /// 10 to 600 s as at the service). A test knob: a short one brings a killed reader's
    /// messages back within seconds.
    pub max_ack_deadline: Option<Duration>,
    /// The data of message `n`, in place of the canned JSON (`None`: the canned one). Flow
    /// control and the byte counts still reckon every message at `message_size` bytes, so set
    /// that near the payloads' size.
    pub payload: Option<Payload>,
    /// Message `n`'s publish time is the server's start plus `n` times this (`None`: every
    /// message has the start), so that windows over the publish time close as a reader goes
    /// through the backlog.
    pub publish_time_step: Option<Duration>,
    /// A fault: the first lease of every `n`-th message (message 0, n, 2n, ...) is lost after
    /// 50 ms (the subscription server's `LOST_LEASE`) whatever the reader extends it to, so
    /// the server delivers it again while the reader still has the first copy: Pub/Sub's
    /// at-least-once duplicate (`None` or `Some(0)`: no lease is lost).
    pub lose_lease_every: Option<u64>,
}

/// What a null subscription's message `n` carries, for a test that needs its own bodies (event
/// times, keys): a function of the message's number, called at every delivery of it, so it must
/// return the same bytes each time.
///
/// ```
/// use gcp_sql::bench::null_server::{FeedOptions, Payload};
/// let feed = FeedOptions {
///     payload: Some(Payload::new(|n| format!("{{\"n\":{n}}}").into_bytes())),
///     ..FeedOptions::default()
/// };
/// assert_eq!(feed.payload.unwrap().data(7), b"{\"n\":7}".to_vec());
/// ```
#[derive(Clone)]
pub struct Payload(Arc<dyn Fn(u64) -> Vec<u8> + Send + Sync>);

impl Payload {
    /// The payload `make(n)` for message `n`.
    pub fn new(make: impl Fn(u64) -> Vec<u8> + Send + Sync + 'static) -> Payload {
        Payload(Arc::new(make))
    }

    /// The data of message `n`.
    pub fn data(&self, n: u64) -> Vec<u8> {
        (self.0)(n)
    }
}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Payload(fn)")
    }
}

/// Two payloads are equal when they are the same function (one `Arc`).
impl PartialEq for Payload {
    fn eq(&self, other: &Payload) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Payload {}

impl Default for FeedOptions {
    /// 100,000 messages of 200 bytes, unordered, leases as asked.
    fn default() -> Self {
        FeedOptions {
            messages: 100_000,
            message_size: 200,
            ordering_keys: 0,
            max_ack_deadline: None,
            payload: None,
            publish_time_step: None,
            lose_lease_every: None,
        }
    }
}

/// What a null server keeps beyond [`NullTotals`] (a subscription server's leases), for its
/// report and for tests that look inside.
pub trait NullDetails: std::fmt::Debug + Send + Sync + 'static {
    /// One line of figures for the server's report (`key=value` pairs).
    fn report(&self) -> String;
    /// The value itself, for a downcast to the connector's type.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// The service a null server stands in for: a copyable handle on its [`NullMethod`]. Two
/// handles are equal when they have the same name. Each connector's folder defines its handle
/// (`NullService::PubSub`, ...); the registry lists them (`connectors::registry::null_services`).
#[derive(Clone, Copy)]
pub struct NullService(&'static NullMethod);

impl NullService {
    /// The handle of `method` (each connector's folder defines its constant with it).
    pub const fn of(method: &'static NullMethod) -> NullService {
        NullService(method)
    }

    /// What the connector's folder says about the method.
    pub fn method(self) -> &'static NullMethod {
        self.0
    }

    /// The service's name on the command line (`pubsub`, `bigtable`, `cloud-tasks`).
    ///
    /// ```
    /// use gcp_sql::bench::null_server::NullService;
    /// assert_eq!(NullService::CloudTasks.name(), "cloud-tasks");
    /// ```
    pub fn name(self) -> &'static str {
        self.0.name
    }

    /// The gRPC method path it answers.
    pub fn method_path(self) -> &'static str {
        self.0.method_path
    }

    /// What one record of a request is called for this service (`messages`, `entries`, `tasks`).
    pub fn records_word(self) -> &'static str {
        self.0.records_word
    }

    /// The largest request body the server accepts for this service.
    pub fn max_request_bytes(self) -> usize {
        self.0.max_request_bytes
    }
}

impl PartialEq for NullService {
    fn eq(&self, other: &Self) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for NullService {}

impl std::hash::Hash for NullService {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.name.hash(state);
    }
}

impl std::fmt::Debug for NullService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::fmt::Display for NullService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
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

/// What a running null server shares between its connections: its latency, its method and
/// what it has counted.
#[derive(Debug)]
pub struct NullState {
    latency: Duration,
    method: &'static NullMethod,
    counters: Counters,
    /// Arrival of the first and of the latest request.
    active: Mutex<Option<(Instant, Instant)>>,
    /// The id of the next record (message ids and task numbers count from 1).
    next_id: AtomicU64,
    /// What a server that serves messages hands out.
    feed: FeedOptions,
    /// What the method keeps beyond the totals, once its routes are built.
    details: std::sync::OnceLock<Arc<dyn NullDetails>>,
}

impl NullState {
    /// A server's state before its first request.
    pub(crate) fn new(
        latency: Duration,
        method: &'static NullMethod,
        feed: FeedOptions,
    ) -> NullState {
        NullState {
            latency,
            method,
            counters: Counters::default(),
            active: Mutex::new(None),
            next_id: AtomicU64::new(1),
            feed,
            details: std::sync::OnceLock::new(),
        }
    }

    /// How long each request waits before it is answered.
    pub fn latency(&self) -> Duration {
        self.latency
    }

    /// What a server that serves messages hands out.
    pub fn feed(&self) -> FeedOptions {
        self.feed.clone()
    }

    /// Keeps `details` as what the method keeps beyond the totals (the first call wins).
    pub fn set_details(&self, details: Arc<dyn NullDetails>) {
        let _ = self.details.set(details);
    }

    /// What the method keeps beyond the totals, if it keeps anything.
    pub(crate) fn details(&self) -> Option<Arc<dyn NullDetails>> {
        self.details.get().cloned()
    }

    /// Counts one request that settled `records` records of `record_bytes` bytes (a
    /// subscription server's acknowledgements), the body being `body_bytes` long.
    pub fn count_settled(&self, records: u64, record_bytes: u64, body_bytes: u64) {
        self.count(&CountedRequest {
            records,
            record_bytes,
            body_bytes,
            destination: Vec::new(),
        });
    }

    /// Time from the arrival of the first request to the arrival of the latest one.
    pub(crate) fn active_window(&self) -> Option<Duration> {
        let active = *self.active.lock().unwrap_or_else(|p| p.into_inner());
        active.map(|(first, last)| last - first)
    }

    /// What has been received so far.
    pub(crate) fn totals(&self) -> NullTotals {
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
pub struct CountedRequest {
    /// How many records (field 2) it holds.
    pub records: u64,
    /// Their serialized bytes, without length prefixes.
    pub record_bytes: u64,
    /// Bytes of the whole body.
    pub body_bytes: u64,
    /// Field 1, as sent.
    pub destination: Vec<u8>,
}

/// Field number of the records (`PublishRequest.messages`, `MutateRowsRequest.entries`,
/// `CreateTaskRequest.task`).
const RECORDS_FIELD: u32 = 2;
/// Field number of the destination (`PublishRequest.topic`, `MutateRowsRequest.table_name`,
/// `CreateTaskRequest.parent`).
const DESTINATION_FIELD: u32 = 1;

/// The payload length of a length-delimited field that took `consumed` bytes in all (length
/// prefix included).
pub(crate) fn payload_len(consumed: u64) -> u64 {
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

/// A response written straight from what the server counted, never decoded: each connector's
/// answer implements only this, and [`Answer`] makes it a `prost::Message` for tonic's codec.
pub trait WriteOnly: std::fmt::Debug + Send + Sync + 'static {
    /// Writes the serialized message.
    fn write(&self, buf: &mut impl BufMut);
    /// Its serialized length.
    fn written_len(&self) -> usize;
}

/// A [`WriteOnly`] response as a `prost::Message`.
#[derive(Debug)]
pub struct Answer<T>(pub T);

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
        self.0.written_len()
    }

    fn clear(&mut self) {
        // Only ever encoded: nothing is merged into an answer, so there is nothing to clear.
    }
}

/// What one method of a null service answers, built from the counted request. The routing, the
/// counting, the latency and the codec are the same for every method ([`NullGrpc`]).
pub trait NullAnswer: WriteOnly + Sized {
    /// The gRPC service the method belongs to (`google.pubsub.v1.Publisher`): tonic routes on
    /// it.
    const SERVICE: &'static str;
    /// Whether the method is server-streaming (`MutateRows`) rather than unary.
    const STREAMING: bool;
    /// The answer to `request`, whose first record got id `first_id`.
    fn answer(request: CountedRequest, first_id: u64) -> Self;
}

/// Counts a request and answers it with `M` after the configured latency; the same
/// value serves as tonic's unary and server-streaming handler.
struct NullCall<M> {
    state: Arc<NullState>,
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
        let latency = self.state.latency;
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

impl<M: NullAnswer> NullGrpc<M> {
    fn new(state: Arc<NullState>) -> Self {
        let method = state.method;
        NullGrpc {
            call: NullCall {
                state,
                method: PhantomData,
            },
            method_path: method.method_path,
            max_request_bytes: method.max_request_bytes,
        }
    }
}

/// The routes of a server that answers `M`'s method over `state`, and `UNIMPLEMENTED` to every
/// other method of its service: what a connector's [`NullMethod::routes`] is.
pub fn routes<M: NullAnswer>(state: Arc<NullState>) -> tonic::service::Routes {
    tonic::service::Routes::new(Routed(NullGrpc::<M>::new(state)))
}

impl<M: NullAnswer> NullRoutes for NullGrpc<M> {
    const NAME: &'static str = M::SERVICE;
    const SERVER: &'static str = "null server";

    fn route(
        &self,
        method: &str,
        request: GrpcRequest,
    ) -> Option<BoxFuture<'static, GrpcResponse>> {
        if Some(method) != self.method_path.rsplit('/').next() {
            return None;
        }
        let call = self.call.clone();
        let mut grpc = grpc::<Answer<M>, CountedRequest>(self.max_request_bytes);
        Some(Box::pin(async move {
            if M::STREAMING {
                grpc.server_streaming(call, request).await
            } else {
                grpc.unary(call, request).await
            }
        }))
    }

    fn refusal(&self, path: &str) -> String {
        format!(
            "the null server answers only {}, not {path}",
            self.method_path
        )
    }
}

/// A request as a gRPC service receives it.
pub type GrpcRequest = http::Request<tonic::body::Body>;
/// A response as a gRPC service sends it.
pub type GrpcResponse = http::Response<tonic::body::Body>;

/// One gRPC service of a null server: its name, and its answer to each method it serves.
/// [`Routed`] makes it a tonic service, which answers every other method `UNIMPLEMENTED`.
pub trait NullRoutes: Clone + Send + 'static {
    /// The service's full name (`google.pubsub.v1.Subscriber`): tonic routes on it.
    const NAME: &'static str;
    /// What the server is called in the answer to a method it does not serve.
    const SERVER: &'static str;

    /// The answer to a call of `method` (the last part of the request's path), or `None` when
    /// the service does not serve it.
    fn route(&self, method: &str, request: GrpcRequest)
    -> Option<BoxFuture<'static, GrpcResponse>>;

    /// The message of the `UNIMPLEMENTED` answer to a call of `path`, which it does not serve.
    fn refusal(&self, path: &str) -> String {
        format!("the {} does not answer {path}", Self::SERVER)
    }
}

/// A [`NullRoutes`] as a tonic service.
#[derive(Clone)]
pub struct Routed<R>(pub R);

impl<R: NullRoutes> NamedService for Routed<R> {
    const NAME: &'static str = R::NAME;
}

impl<R: NullRoutes> Service<GrpcRequest> for Routed<R> {
    type Response = GrpcResponse;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<GrpcResponse, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: GrpcRequest) -> Self::Future {
        let path = request.uri().path().to_string();
        let method = path.rsplit('/').next().unwrap_or_default();
        match self.0.route(method, request) {
            Some(answer) => Box::pin(async move { Ok(answer.await) }),
            None => {
                let status = tonic::Status::unimplemented(self.0.refusal(&path));
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}

/// tonic's server side of one method with prost's codec, refusing requests over `limit` bytes.
pub fn grpc<Resp, Req>(limit: usize) -> tonic::server::Grpc<tonic_prost::ProstCodec<Resp, Req>>
where
    Resp: prost::Message + Send + 'static,
    Req: prost::Message + Default + Send + 'static,
{
    tonic::server::Grpc::new(tonic_prost::ProstCodec::default()).max_decoding_message_size(limit)
}

/// Requests of the three services, for the tests of the null servers.
#[cfg(test)]
pub(crate) mod test_requests {
    use gcloud_sdk::google::bigtable::v2::{
        MutateRowsRequest, Mutation, mutate_rows_request, mutation,
    };
    use gcloud_sdk::google::cloud::tasks::v2::{CreateTaskRequest, HttpRequest, Task, task};
    use gcloud_sdk::google::pubsub::v1::{PublishRequest, PubsubMessage};

    pub(crate) fn request(messages: &[&[u8]]) -> PublishRequest {
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

    pub(crate) fn mutate_rows_request(rows: usize) -> MutateRowsRequest {
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

    pub(crate) fn create_task_request(body: &[u8]) -> CreateTaskRequest {
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
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::test_requests::{create_task_request, mutate_rows_request, request};
    use super::*;

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
}
