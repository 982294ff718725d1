//! The metrics and health endpoint (`gcp_sql::ops::MetricsServer`) over a running pipeline:
//! a subscription on the Pub/Sub emulator into a table of the Bigtable emulator. `/metrics` is
//! scraped over HTTP while the pipeline runs and after it ended, and its numbers are checked
//! against what landed in Bigtable (read back with `ReadRows`); `/readyz` is watched while the
//! Bigtable emulator is black-holed behind a stalling proxy.
//!
//! The registry is the process's: other tests of this binary run statements at the same time,
//! so every check picks this test's series by its table's name, and a readiness check looks
//! for this test's statement among the reasons `/readyz` gives.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use arrow::array::AsArray;
use gcloud_sdk::google::pubsub::v1::PublishRequest;
use gcloud_sdk::google::pubsub::v1::PubsubMessage;
use gcloud_sdk::google::pubsub::v1::publisher_client::PublisherClient;
use gcp_sql::core::StopKind;
use gcp_sql::core::telemetry::ReadinessSettings;
use gcp_sql::ops::MetricsServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::bigtable::Bigtable;
use crate::support::proxy::Proxy;
use crate::support::{PubSubAdmin, unique};

/// One HTTP GET: the status code and the body.
async fn get(at: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(at)
        .await
        .expect("connect to the metrics endpoint");
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .expect("send the request");
    let mut text = String::new();
    stream
        .read_to_string(&mut text)
        .await
        .expect("read the answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status code");
    (status, body.to_string())
}

/// The series of one scrape whose labels contain `label="value"`: metric name (with its other
/// labels, `{...}` removed but `code` and `le` kept in the name) to value.
struct Scrape {
    values: HashMap<String, f64>,
}

impl Scrape {
    async fn of(at: SocketAddr, label: &str, value: &str) -> Scrape {
        let (status, body) = get(at, "/metrics").await;
        assert_eq!(status, 200, "{body}");
        let wanted = format!("{label}=\"{value}\"");
        let mut values = HashMap::new();
        for line in body.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, number)) = line.rsplit_once(' ') else {
                continue;
            };
            let Some((name, labels)) = series.split_once('{') else {
                continue;
            };
            if !labels
                .split(',')
                .any(|l| l == wanted || l == format!("{wanted}}}"))
            {
                continue;
            }
            let extra: Vec<&str> = labels
                .trim_end_matches('}')
                .split(',')
                .filter(|l| l.starts_with("code=") || l.starts_with("le="))
                .collect();
            let key = if extra.is_empty() {
                name.to_string()
            } else {
                format!("{name}{{{}}}", extra.join(","))
            };
            values.insert(key, number.parse().expect("a number"));
        }
        Scrape { values }
    }

    /// The value of `name`, 0 when the scrape has no such series.
    fn get(&self, name: &str) -> f64 {
        self.values.get(name).copied().unwrap_or(0.0)
    }

    fn has(&self, name: &str) -> bool {
        self.values.contains_key(name)
    }
}

async fn publish(host: &str, topic: &str, ids: std::ops::Range<i64>) {
    let channel = gcp_sql::emulators::plaintext_channel(host)
        .await
        .expect("channel to the Pub/Sub emulator");
    let mut publisher = PublisherClient::new(channel);
    let messages: Vec<PubsubMessage> = ids
        .map(|i| PubsubMessage {
            data: format!("{{\"id\": {i}}}").into(),
            ..Default::default()
        })
        .collect();
    for chunk in messages.chunks(1000) {
        publisher
            .publish(PublishRequest {
                topic: topic.to_string(),
                messages: chunk.to_vec(),
            })
            .await
            .expect("Publish");
    }
}

/// A pipeline: a subscription read as SQL table `source`, into a Bigtable table written as
/// SQL table `sink`, one row per message keyed by its id.
struct Pipeline<'a> {
    pubsub_host: &'a str,
    subscription: &'a str,
    source: &'a str,
    /// The Bigtable emulator as the sink reaches it (directly, or through a proxy).
    bigtable_host: &'a str,
    table: &'a str,
    sink: &'a str,
    /// More options of the source, `, name = 'value'` each.
    source_options: &'a str,
}

impl Pipeline<'_> {
    /// Its statements: both tables, then the INSERT.
    fn sql(&self, bt: &Bigtable) -> String {
        let sink_sql = bt
            .create_sql(
                self.sink,
                "id VARCHAR, v VARCHAR",
                self.table,
                &[("row_key", "id"), ("column_family", "c")],
            )
            .replace(&bt.host, self.bigtable_host);
        format!(
            "CREATE TABLE {source} (id BIGINT) WITH (connector = 'pubsub', \
               subscription = '{subscription}', emulator_host = '{host}', format = 'json', \
               parallel_pull_count = 2, ack_deadline = '10s'{options});
             {sink_sql};
             INSERT INTO {sink} SELECT CAST(id AS VARCHAR), CAST(id * 2 AS VARCHAR) FROM {source}",
            source = self.source,
            subscription = self.subscription,
            host = self.pubsub_host,
            options = self.source_options,
            sink = self.sink,
        )
    }
}

/// A name for a SQL table no other test of this process uses.
fn sql_name(prefix: &str) -> String {
    unique(prefix).replace('-', "_")
}

/// The rows an INSERT returned as its count.
fn count(batches: &[arrow::array::RecordBatch]) -> u64 {
    batches[0]
        .column(0)
        .as_primitive::<arrow::datatypes::UInt64Type>()
        .value(0)
}

/// 20,000 messages through a subscription into Bigtable with the endpoint on: a scrape while
/// the pipeline runs shows it running with consistent counts (acknowledged never above sent,
/// messages acknowledged never above received), and a scrape after its end shows exactly what
/// landed in Bigtable (read back with `ReadRows`): every row acknowledged, every message
/// acknowledged, nothing in flight or held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_during_and_after_a_subscription_into_bigtable_matches_what_landed() {
    const MESSAGES: i64 = 20_000;
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription) = admin
        .topic_with_subscription("metrics-tests", "scrape", false)
        .await;
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("scrape");
    bt.create_table(&table, &["c"]).await;
    publish(&admin.host, &topic, 0..MESSAGES).await;
    let server = MetricsServer::start("127.0.0.1:0").await.expect("endpoint");
    let at = server.local_addr();
    let (source, sink) = (sql_name("scrape_in"), sql_name("scrape_bt"));
    let sql = Pipeline {
        pubsub_host: &admin.host,
        subscription: &subscription,
        source: &source,
        bigtable_host: &bt.host,
        table: &table,
        sink: &sink,
        source_options: ", stop_after_idle = '3s'",
    }
    .sql(&bt);
    let ctx = gcp_sql::sql::new_context();
    let running = tokio::spawn(async move { gcp_sql::sql::run(&ctx, &sql).await });

    let mut during = None;
    while !running.is_finished() {
        let s = Scrape::of(at, "table", &sink).await;
        let acked = s.get("gcp_sql_sink_records_acknowledged_total");
        if s.get("gcp_sql_statement_running") == 1.0 && acked > 0.0 && acked < MESSAGES as f64 {
            during = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let during = during.expect("a scrape while the pipeline ran, after its first rows landed");
    let sent = during.get("gcp_sql_sink_records_sent_total");
    let acked = during.get("gcp_sql_sink_records_acknowledged_total");
    assert!(acked <= sent, "acknowledged {acked} <= sent {sent}");
    assert!(during.get("gcp_sql_sink_bytes_sent_total") > 0.0);
    assert!(during.get("gcp_sql_sink_send_latency_seconds_count") > 0.0);
    assert!(during.has("gcp_sql_sink_in_flight_records"));
    let source_mid = Scrape::of(at, "source", &subscription).await;
    let received = source_mid.get("gcp_sql_source_messages_received_total");
    let source_acked = source_mid.get("gcp_sql_source_messages_acknowledged_total");
    assert!(received > 0.0, "the source read messages by then");
    assert!(source_acked <= received, "{source_acked} <= {received}");
    assert_eq!(source_mid.get("gcp_sql_source_streams"), 2.0);

    let out = running.await.expect("joined").expect("the INSERT");
    assert_eq!(count(&out), MESSAGES as u64);
    let landed = bt.read(&table).await.len() as f64;
    assert_eq!(landed, MESSAGES as f64, "rows in Bigtable");

    let after = Scrape::of(at, "table", &sink).await;
    assert_eq!(after.get("gcp_sql_statement_running"), 0.0, "ended");
    assert_eq!(after.get("gcp_sql_sink_records_acknowledged_total"), landed);
    assert_eq!(after.get("gcp_sql_sink_records_sent_total"), landed);
    assert_eq!(after.get("gcp_sql_sink_in_flight_records"), 0.0);
    assert_eq!(after.get("gcp_sql_sink_records_dropped_total"), 0.0);
    assert_eq!(
        after.get("gcp_sql_sink_send_latency_seconds_count"),
        after.get("gcp_sql_sink_send_rpcs_total"),
        "one latency per send RPC"
    );
    assert!(after.get("gcp_sql_sink_send_latency_seconds_bucket{le=\"+Inf\"}") > 0.0);
    let source = Scrape::of(at, "source", &subscription).await;
    assert_eq!(
        source.get("gcp_sql_source_messages_acknowledged_total"),
        MESSAGES as f64,
        "every message acknowledged"
    );
    assert!(source.get("gcp_sql_source_messages_received_total") >= MESSAGES as f64);
    assert_eq!(source.get("gcp_sql_source_messages_nacked_total"), 0.0);
    assert_eq!(source.get("gcp_sql_source_held_messages"), 0.0);
    assert_eq!(
        source.get("gcp_sql_source_rows_emitted_total"),
        MESSAGES as f64
    );
    server.stop().await;
}

/// Whether `/readyz` names the statement writing into SQL table `sink` among its reasons (the
/// process's other statements, other tests', may be there too).
async fn sink_not_ready(at: SocketAddr, sink: &str) -> Option<String> {
    let (status, body) = get(at, "/readyz").await;
    let mine: Vec<&str> = body
        .lines()
        .filter(|l| l.contains(&format!("INSERT INTO {sink},")))
        .collect();
    if status == 200 {
        assert!(mine.is_empty(), "a ready answer gives no reason: {body}");
        return None;
    }
    assert_eq!(status, 503, "{body}");
    (!mine.is_empty()).then(|| mine.join("\n"))
}

/// Polls until `check` returns `Some`, for at most `budget`.
async fn within<T, F: std::future::Future<Output = Option<T>>>(
    budget: Duration,
    what: &str,
    mut check: impl FnMut() -> F,
) -> T {
    let until = tokio::time::Instant::now() + budget;
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "{what} within {budget:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A pipeline into a Bigtable emulator behind a proxy that black-holes it (holds every byte,
/// both ways, for eight seconds): `/readyz` names the statement's writer as not ready while
/// nothing comes back, and the age of the oldest unacknowledged message rises; once the proxy
/// forwards again, the statement is ready again, and a graceful stop lands every row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_false_while_bigtable_is_black_holed_and_true_after() {
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription) = admin
        .topic_with_subscription("metrics-tests", "readyz", false)
        .await;
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("readyz");
    bt.create_table(&table, &["c"]).await;
    let proxy = Proxy::start(&bt.host).await;
    let server = MetricsServer::start_with(
        "127.0.0.1:0",
        ReadinessSettings {
            stalled_after: Duration::from_secs(1),
        },
    )
    .await
    .expect("endpoint");
    let at = server.local_addr();
    let (source, sink) = (sql_name("ready_in"), sql_name("ready_bt"));
    let sql = Pipeline {
        pubsub_host: &admin.host,
        subscription: &subscription,
        source: &source,
        bigtable_host: &proxy.host(),
        table: &table,
        sink: &sink,
        source_options: "",
    }
    .sql(&bt);
    let control = gcp_sql::sql::StatementControl::new();
    let ctx = gcp_sql::sql::new_context_with_control(&control);
    let running = tokio::spawn(async move { gcp_sql::sql::run(&ctx, &sql).await });

    publish(&admin.host, &topic, 0..1000).await;
    within(
        Duration::from_secs(60),
        "the first rows landed and the statement is ready",
        || async {
            let s = Scrape::of(at, "table", &sink).await;
            let landed = s.get("gcp_sql_sink_records_acknowledged_total") >= 1000.0;
            (landed
                && s.get("gcp_sql_statement_ready") == 1.0
                && sink_not_ready(at, &sink).await.is_none())
            .then_some(())
        },
    )
    .await;

    proxy.stall_for(Duration::from_secs(8));
    publish(&admin.host, &topic, 1000..2000).await;
    let reason = within(
        Duration::from_secs(6),
        "/readyz to name the black-holed writer",
        || sink_not_ready(at, &sink),
    )
    .await;
    assert!(reason.contains("writer"), "{reason}");
    let ready = Scrape::of(at, "table", &sink).await;
    assert_eq!(ready.get("gcp_sql_statement_ready"), 0.0);
    let first = Scrape::of(at, "source", &subscription)
        .await
        .get("gcp_sql_source_oldest_unacked_message_age_seconds");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let later = Scrape::of(at, "source", &subscription).await;
    let second = later.get("gcp_sql_source_oldest_unacked_message_age_seconds");
    assert!(
        first > 0.0,
        "messages are held while Bigtable answers nothing"
    );
    assert!(
        second > first,
        "the oldest unacknowledged age rises: {first} then {second}"
    );
    assert!(later.get("gcp_sql_source_held_messages") > 0.0);

    within(
        Duration::from_secs(40),
        "/readyz to be ready again after the stall",
        || async { sink_not_ready(at, &sink).await.is_none().then_some(()) },
    )
    .await;
    within(Duration::from_secs(60), "every row to land", || async {
        let s = Scrape::of(at, "table", &sink).await;
        (s.get("gcp_sql_sink_records_acknowledged_total") >= 2000.0).then_some(())
    })
    .await;
    control.stop(StopKind::Drain, "test stop");
    let out = running.await.expect("joined").expect("a graceful stop");
    assert_eq!(count(&out), 2000);
    assert_eq!(bt.read(&table).await.len(), 2000, "rows in Bigtable");
    let source = Scrape::of(at, "source", &subscription).await;
    assert_eq!(
        source.get("gcp_sql_source_messages_acknowledged_total"),
        2000.0
    );
    assert_eq!(
        source.get("gcp_sql_source_oldest_unacked_message_age_seconds"),
        0.0
    );
    server.stop().await;
}
