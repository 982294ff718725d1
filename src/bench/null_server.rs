//! A "null" Pub/Sub server: acknowledges every `Publish` and counts what it received.
//!
//! It serves `/google.pubsub.v1.Publisher/Publish` over plaintext HTTP/2 on a loopback port and
//! answers each request with one message id per message, at once or after a fixed latency.
//! Everything else answers `UNIMPLEMENTED`. Point a sink at it with `emulator_host`, exactly as at
//! the Pub/Sub emulator; create no topic first (every topic name is accepted).
//!
//! # Built so that it is not the bottleneck
//!
//! - The request is not decoded into a `PublishRequest`: a counting message type walks the
//!   top-level fields, skipping the topic and each message by its length prefix, so a request
//!   costs one pass over its varints (the bytes themselves are only copied once, by tonic, into
//!   its receive buffer).
//! - The response is written straight from a counter: ids are decimal numbers, formatted while
//!   encoding, with no `Vec<String>` built.
//! - HTTP/2 flow-control windows are large (16 MiB per stream, 64 MiB per connection) instead of
//!   tonic's 64 KiB defaults, so a 10 MB request never waits for window updates; requests up to
//!   [`MAX_REQUEST_BYTES`] are accepted (tonic's default limit is 4 MiB, under Pub/Sub's 10 MB).
//!
//! ```no_run
//! use gcp_sql::bench::null_server::{NullServer, NullServerOptions};
//!
//! # async fn demo() -> std::io::Result<()> {
//! let server = NullServer::start("127.0.0.1:0".parse().unwrap(), NullServerOptions::default()).await?;
//! println!("emulator_host = '{}'", server.addr());
//! // ... run an INSERT into a pubsub table with that emulator_host ...
//! let totals = server.totals();
//! println!("{} messages, {} bytes", totals.messages, totals.message_bytes);
//! # Ok(()) }
//! ```

use std::convert::Infallible;
use std::net::Ipv4Addr;
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

/// The gRPC method the server answers.
pub const PUBLISH_PATH: &str = "/google.pubsub.v1.Publisher/Publish";

/// Largest request the server accepts. Pub/Sub's own limit is 10,000,000 bytes per request
/// (Pub/Sub quotas and limits; docs/service_facts.md); the margin lets an over-limit request
/// through to be counted rather than refused, since measuring is the point.
pub const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;

/// HTTP/2 per-stream receive window: larger than any request, so a request never stalls on it.
const STREAM_WINDOW: u32 = 16 * 1024 * 1024;
/// HTTP/2 per-connection receive window: room for several large requests at once.
const CONNECTION_WINDOW: u32 = 64 * 1024 * 1024;

/// How the server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NullServerOptions {
    /// How long each `Publish` waits before it is acknowledged (zero: at once). The wait does not
    /// hold a thread, so concurrent requests wait in parallel, as at a real service.
    pub latency: Duration,
}

/// What the server has received so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NullTotals {
    /// `Publish` requests received.
    pub requests: u64,
    /// Messages received (the `messages` entries of every request).
    pub messages: u64,
    /// Serialized bytes of those messages (each `PubsubMessage`, without its length prefix),
    /// the same unit as the sink's `bytes_sent` metric.
    pub message_bytes: u64,
    /// Bytes of the request bodies (topic names and framing included).
    pub request_bytes: u64,
}

impl NullTotals {
    /// The difference `self - earlier`, for rates over an interval.
    pub fn since(&self, earlier: &NullTotals) -> NullTotals {
        NullTotals {
            requests: self.requests.saturating_sub(earlier.requests),
            messages: self.messages.saturating_sub(earlier.messages),
            message_bytes: self.message_bytes.saturating_sub(earlier.message_bytes),
            request_bytes: self.request_bytes.saturating_sub(earlier.request_bytes),
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    messages: AtomicU64,
    message_bytes: AtomicU64,
    request_bytes: AtomicU64,
}

#[derive(Debug)]
struct State {
    options: NullServerOptions,
    counters: Counters,
    /// Arrival of the first and of the latest request.
    active: Mutex<Option<(Instant, Instant)>>,
}

impl State {
    fn totals(&self) -> NullTotals {
        let c = &self.counters;
        NullTotals {
            requests: c.requests.load(Ordering::Relaxed),
            messages: c.messages.load(Ordering::Relaxed),
            message_bytes: c.message_bytes.load(Ordering::Relaxed),
            request_bytes: c.request_bytes.load(Ordering::Relaxed),
        }
    }
}

/// A `PublishRequest` read only as far as counting goes: field 2 (`messages`) is counted and
/// skipped, every other field skipped.
#[derive(Debug, Default)]
struct CountedPublishRequest {
    messages: u64,
    message_bytes: u64,
    body_bytes: u64,
}

/// Field number of `PublishRequest.messages`.
const MESSAGES_FIELD: u32 = 2;

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

impl prost::Message for CountedPublishRequest {
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
        prost::encoding::skip_field(wire_type, tag, buf, ctx)?;
        let consumed = (before - buf.remaining()) as u64;
        let key = (u64::from(tag) << 3) | wire_type as u64;
        self.body_bytes += prost::encoding::encoded_len_varint(key) as u64 + consumed;
        if tag == MESSAGES_FIELD && wire_type == WireType::LengthDelimited {
            self.messages += 1;
            self.message_bytes += payload_len(consumed);
        }
        Ok(())
    }

    fn encoded_len(&self) -> usize {
        0
    }

    fn clear(&mut self) {
        *self = CountedPublishRequest::default();
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

impl prost::Message for NullPublishResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        let mut text = itoa::Buffer::new();
        for id in self.first..self.first + self.count {
            let id = text.format(id);
            prost::encoding::encode_key(MESSAGE_IDS_FIELD, WireType::LengthDelimited, buf);
            prost::encoding::encode_varint(id.len() as u64, buf);
            buf.put_slice(id.as_bytes());
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        let mut text = itoa::Buffer::new();
        (self.first..self.first + self.count)
            // Key (1 byte), length (1 byte: an id has at most 20 digits), digits.
            .map(|id| 2 + text.format(id).len())
            .sum()
    }

    fn clear(&mut self) {
        self.count = 0;
    }
}

/// Counts each request and answers it, after the configured latency.
#[derive(Clone)]
struct PublishCall {
    state: Arc<State>,
    next_id: Arc<AtomicU64>,
}

impl tonic::server::UnaryService<CountedPublishRequest> for PublishCall {
    type Response = NullPublishResponse;
    type Future = BoxFuture<'static, Result<tonic::Response<NullPublishResponse>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<CountedPublishRequest>) -> Self::Future {
        let counted = request.into_inner();
        let now = Instant::now();
        {
            let mut active = self.state.active.lock().unwrap_or_else(|p| p.into_inner());
            let first = active.map_or(now, |(first, _)| first);
            *active = Some((first, now));
        }
        let c = &self.state.counters;
        c.requests.fetch_add(1, Ordering::Relaxed);
        c.messages.fetch_add(counted.messages, Ordering::Relaxed);
        c.message_bytes
            .fetch_add(counted.message_bytes, Ordering::Relaxed);
        c.request_bytes
            .fetch_add(counted.body_bytes, Ordering::Relaxed);
        let first = self.next_id.fetch_add(counted.messages, Ordering::Relaxed);
        let latency = self.state.options.latency;
        let response = NullPublishResponse {
            first,
            count: counted.messages,
        };
        Box::pin(async move {
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            Ok(tonic::Response::new(response))
        })
    }
}

/// The `google.pubsub.v1.Publisher` service, answering `Publish` only.
#[derive(Clone)]
struct NullPublisher {
    call: PublishCall,
}

impl NamedService for NullPublisher {
    const NAME: &'static str = "google.pubsub.v1.Publisher";
}

impl Service<http::Request<tonic::body::Body>> for NullPublisher {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        if request.uri().path() != PUBLISH_PATH {
            let status = tonic::Status::unimplemented(format!(
                "the null server answers only {PUBLISH_PATH}, not {}",
                request.uri().path()
            ));
            return Box::pin(async move { Ok(status.into_http()) });
        }
        let call = self.call.clone();
        Box::pin(async move {
            let codec =
                tonic_prost::ProstCodec::<NullPublishResponse, CountedPublishRequest>::default();
            let mut grpc =
                tonic::server::Grpc::new(codec).max_decoding_message_size(MAX_REQUEST_BYTES);
            Ok(grpc.unary(call, request).await)
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
    /// Binds `addr` (port 0 picks a free port) and serves on the current tokio runtime until
    /// the server is dropped.
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
        });
        let service = NullPublisher {
            call: PublishCall {
                state: state.clone(),
                next_id: Arc::new(AtomicU64::new(1)),
            },
        };
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .initial_stream_window_size(STREAM_WINDOW)
                .initial_connection_window_size(CONNECTION_WINDOW)
                .add_service(service)
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

/// Runs a null server on `127.0.0.1:port` (0: a free port) until SIGINT or SIGTERM, printing to
/// stdout: first `listening on 127.0.0.1:PORT`, then every `report_every` (when something
/// arrived) the interval's rates and the running totals, and at the end one `total:` line with
/// the totals, the active window (first to latest request), and this process's CPU time and peak
/// RSS. This is `gcp-sql serve-null`; the benchmarks run it as a child process.
pub async fn serve_until_signal(
    port: u16,
    options: NullServerOptions,
    report_every: Option<Duration>,
) -> std::io::Result<NullTotals> {
    use std::io::Write as _;
    use tokio::signal::unix::{SignalKind, signal};

    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let server = NullServer::start(SocketAddr::from((Ipv4Addr::LOCALHOST, port)), options).await?;
    let say = |line: String| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };
    say(format!(
        "listening on {} (latency {:?}); stop with Ctrl-C",
        server.addr(),
        options.latency
    ));
    let start = Instant::now();
    let (mut last, mut last_at) = (NullTotals::default(), start);
    // A period of zero would spin; reports then stay off.
    let mut ticker = report_every
        .filter(|d| !d.is_zero())
        .map(|d| tokio::time::interval_at(tokio::time::Instant::now() + d, d));
    loop {
        let tick = async {
            match ticker.as_mut() {
                Some(t) => {
                    t.tick().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = interrupt.recv() => break,
            _ = terminate.recv() => break,
            _ = tick => {
                let now = server.totals();
                if now != last {
                    let at = Instant::now();
                    say(format!(
                        "[{:>8.1}s] interval: {} | total messages={} message_bytes={}",
                        (at - start).as_secs_f64(),
                        format_totals(&now.since(&last), at - last_at),
                        now.messages,
                        now.message_bytes,
                    ));
                    (last, last_at) = (now, at);
                }
            }
        }
    }
    let totals = server.totals();
    let window = server.active_window().unwrap_or_default();
    let usage = crate::bench::ResourceUsage::now();
    say(format!(
        "total: {} cpu_s={:.3} max_rss_mb={:.1}",
        format_totals(&totals, window),
        usage.cpu().as_secs_f64(),
        usage.max_rss_bytes as f64 / (1024.0 * 1024.0),
    ));
    Ok(totals)
}

impl Drop for NullServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.abort();
    }
}

/// One line of figures: totals and, over `elapsed`, rates.
///
/// ```
/// use std::time::Duration;
/// use gcp_sql::bench::null_server::{NullTotals, format_totals};
///
/// let t = NullTotals { requests: 10, messages: 10_000, message_bytes: 2_000_000, request_bytes: 2_030_000 };
/// let line = format_totals(&t, Duration::from_secs(2));
/// assert!(line.contains("messages=10000"), "{line}");
/// assert!(line.contains("messages_per_s=5000"), "{line}");
/// ```
pub fn format_totals(totals: &NullTotals, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    let rate = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
    format!(
        "requests={} messages={} message_bytes={} request_bytes={} elapsed_s={:.3} messages_per_s={:.0} mb_per_s={:.2}",
        totals.requests,
        totals.messages,
        totals.message_bytes,
        totals.request_bytes,
        secs,
        rate(totals.messages),
        rate(totals.message_bytes) / 1e6,
    )
}

#[cfg(test)]
mod tests {
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
        let counted = CountedPublishRequest::decode(req.encode_to_vec().as_slice()).unwrap();
        assert_eq!(counted.messages, 3);
        assert_eq!(counted.message_bytes, sizes);
        assert_eq!(counted.body_bytes, req.encoded_len() as u64);
    }

    #[test]
    fn counting_decode_refuses_a_truncated_request() {
        let bytes = request(&[b"hello"]).encode_to_vec();
        assert!(CountedPublishRequest::decode(&bytes[..bytes.len() - 2]).is_err());
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
        let response = NullPublishResponse {
            first: 98,
            count: 4,
        };
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
        assert_eq!(totals.messages, 4);
        assert_eq!(totals.message_bytes, 2 * sizes);
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

    #[tokio::test(start_paused = true)]
    async fn latency_delays_the_acknowledgement() {
        let server = NullServer::start(
            "127.0.0.1:0".parse().unwrap(),
            NullServerOptions {
                latency: Duration::from_secs(30),
            },
        )
        .await
        .unwrap();
        let mut client = PublisherClient::connect(format!("http://{}", server.addr()))
            .await
            .unwrap();
        let publish = tokio::spawn(async move { client.publish(request(&[b"x"])).await });
        // The request arrives and is counted, but is not answered before the latency passes.
        while server.totals().requests == 0 {
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_secs(29)).await;
        assert!(!publish.is_finished());
        let response = publish.await.unwrap().unwrap().into_inner();
        assert_eq!(response.message_ids, vec!["1"]);
    }
}
