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
//! and the latency ([`crate::bench::null_method`]); each method only says how its answer is
//! encoded, in its connector's folder (`connectors::<name>::null`, which the connector's testing
//! part hands to the registry). The registry (`connectors::registry::null_services`) lists the
//! services; this file names none and imports no connector.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use gcp_sql::bench::null_server::{NullServer, NullServerOptions, NullService};
//!
//! # async fn demo() -> std::io::Result<()> {
//! let options = NullServerOptions {
//!     service: NullService::Bigtable,
//!     latency: Duration::ZERO,
//!     feed: Default::default(),
//! };
//! let server = NullServer::start("127.0.0.1:0".parse().unwrap(), options).await?;
//! println!("emulator_host = '{}'", server.addr());
//! // ... run an INSERT into a bigtable table with that emulator_host ...
//! let totals = server.totals();
//! println!("{} entries, {} bytes", totals.records, totals.record_bytes);
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::null_method::NullState;
pub use super::null_method::{
    FeedOptions, MAX_MUTATE_ROWS_REQUEST_BYTES, MAX_REQUEST_BYTES, NullDetails, NullMethod,
    NullService, NullTotals, Payload,
};

/// HTTP/2 per-stream receive window: larger than any request, so a request never stalls on it.
const STREAM_WINDOW: u32 = 16 * 1024 * 1024;
/// HTTP/2 per-connection receive window: room for several large requests at once.
const CONNECTION_WINDOW: u32 = 64 * 1024 * 1024;

/// How the server answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NullServerOptions {
    /// How long each request waits before it is answered (zero: at once). The wait does not
    /// hold a thread, so concurrent requests wait in parallel, as at a real service.
    pub latency: Duration,
    /// Which service (and so which method) it answers.
    pub service: NullService,
    /// What a service that serves messages (`pubsub-subscribe`) hands out; the others ignore
    /// it.
    pub feed: FeedOptions,
}

impl NullServerOptions {
    /// `service`, answering at once (no latency), serving `feed` if it serves messages.
    ///
    /// ```
    /// use gcp_sql::bench::null_server::{FeedOptions, NullServerOptions, NullService};
    ///
    /// let options = NullServerOptions::new(NullService::Bigtable, FeedOptions::default());
    /// assert!(options.latency.is_zero());
    /// ```
    pub fn new(service: NullService, feed: FeedOptions) -> Self {
        NullServerOptions {
            service,
            latency: Duration::ZERO,
            feed,
        }
    }
}

/// A running null server; stops when dropped.
#[derive(Debug)]
pub struct NullServer {
    addr: SocketAddr,
    options: NullServerOptions,
    state: Arc<NullState>,
    /// Held for its drop, which stops the server.
    _serving: crate::testing::Serving,
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
        let state = Arc::new(NullState::new(
            options.latency,
            options.service.method(),
            options.feed.clone(),
        ));
        let routes = (options.service.method().routes)(state.clone());
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let server = tonic::transport::Server::builder()
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW);
        let serving = crate::testing::Serving::spawn(server, routes, incoming, "null server");
        Ok(NullServer {
            addr,
            options,
            state,
            _serving: serving,
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
        self.options.clone()
    }

    /// What the service keeps beyond the totals (a subscription server's leases and
    /// deliveries), if it keeps anything.
    pub fn details(&self) -> Option<Arc<dyn NullDetails>> {
        self.state.details()
    }

    /// Time from the arrival of the first request to the arrival of the latest one (`None`
    /// before any request).
    pub fn active_window(&self) -> Option<Duration> {
        self.state.active_window()
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
    use gcloud_sdk::google::cloud::tasks::v2::cloud_tasks_client::CloudTasksClient;
    use gcloud_sdk::google::pubsub::v1::Topic;
    use gcloud_sdk::google::pubsub::v1::publisher_client::PublisherClient;
    use prost::Message as _;

    use super::super::null_method::test_requests::{
        create_task_request, mutate_rows_request, request,
    };
    use super::*;

    #[tokio::test]
    async fn generated_client_publishes_and_the_server_counts() {
        let server = start(NullService::PubSub).await;
        let mut client = PublisherClient::connect(url(&server)).await.unwrap();
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
        let server = start(NullService::PubSub).await;
        let mut client = PublisherClient::connect(url(&server)).await.unwrap();
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
                feed: FeedOptions::default(),
            },
        )
        .await
        .unwrap();
        let answer = tokio::spawn(call(url(&server)));
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

    /// The plaintext URL a generated client connects to.
    fn url(server: &NullServer) -> String {
        format!("http://{}", server.addr())
    }

    /// A server of `service` answering at once, on a free port.
    async fn start(service: NullService) -> NullServer {
        NullServer::start(
            "127.0.0.1:0".parse().unwrap(),
            NullServerOptions {
                service,
                latency: Duration::ZERO,
                feed: FeedOptions::default(),
            },
        )
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn generated_bigtable_client_gets_an_ok_status_for_every_entry() {
        let server = start(NullService::Bigtable).await;
        let mut client = BigtableClient::connect(url(&server)).await.unwrap();
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
        let mut client = CloudTasksClient::connect(url(&server)).await.unwrap();
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
        let mut publisher = PublisherClient::connect(url(&server)).await.unwrap();
        let status = publisher.publish(request(&[b"x"])).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unimplemented);
        let mut tasks = CloudTasksClient::connect(url(&server)).await.unwrap();
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
        let mut client = BigtableClient::connect(url(&server)).await.unwrap();
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
}
