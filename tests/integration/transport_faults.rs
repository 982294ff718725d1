//! Every sink survives a broken connection: each of the three sinks writes to its **real**
//! emulator through a TCP proxy ([`Proxy`]) that resets connections, stalls them, or cuts one
//! mid-response, and every row is read back with an independent client (straight to the
//! emulator, not through the proxy).
//!
//! What tonic reports for these faults (a reset as `UNKNOWN` "transport error", a client-side
//! deadline as `CANCELLED` "Timeout expired") reaches the connectors as `UNAVAILABLE` and
//! `DEADLINE_EXCEEDED` (`gcp_sql::google::transport_status`), which each retries
//! under its own budget. Per sink:
//!
//! - resets every 400 ms during an `INSERT` that spans several: it succeeds and every row is
//!   read back (Pub/Sub and unnamed Cloud Tasks at least once, Bigtable exactly, its mutations
//!   being idempotent);
//! - a stall longer than one attempt deadline but within the retry budget: it succeeds, every
//!   row read back;
//! - a stall past the budget: it fails naming `DEADLINE_EXCEEDED`, and the rows it counts as
//!   acknowledged are all read back (a few more may be: an attempt the service applied but
//!   whose answer the stall held is not counted);
//! - connections cut a few hundred bytes into the server's answers (three of them): it
//!   succeeds, every row read back.
//!
//! Deadlines and budgets are small (hundreds of milliseconds, a few seconds) so each test takes
//! seconds; Bigtable and Cloud Tasks take them through their sinks' `with_retry`, as neither
//! has table options for them.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::datatypes::{DataType, Field, Schema};
use datafusion::prelude::SessionContext;
use gcloud_sdk::google::bigtable::admin::v2::bigtable_table_admin_client::BigtableTableAdminClient;
use gcloud_sdk::google::bigtable::admin::v2::{ColumnFamily, CreateTableRequest, Table};
use gcloud_sdk::google::bigtable::v2::bigtable_client::BigtableClient;
use gcloud_sdk::google::bigtable::v2::{ReadRowsRequest, RowRange, RowSet, row_range};
use gcloud_sdk::google::cloud::tasks::v2::cloud_tasks_client::CloudTasksClient;
use gcloud_sdk::google::cloud::tasks::v2::{
    CreateQueueRequest, ListTasksRequest, PauseQueueRequest, Queue, task,
};
use gcp_sql::connectors::SinkConnector;
use gcp_sql::connectors::bigtable::writer::BigtableSink;
use gcp_sql::connectors::cloud_tasks::writer::CloudTasksSink;
use gcp_sql::core::RetrySettings;
use gcp_sql::core::metrics::names;
use gcp_sql::emulators::{EmulatorKind, plaintext_channel, shared};
use gcp_sql::options::RawOptions;
use gcp_sql::sql::SinkTable;
use tonic::transport::Channel;

use crate::support::proxy::Proxy;
use crate::support::{Insert, PubSubAdmin, exec, ids, insert, multiplicities, unique};

/// How often the reset tests break every connection: short enough that an `INSERT` of a few
/// seconds against a fast emulator meets several.
const RESET_PERIOD: Duration = Duration::from_millis(400);

/// Retry timing with a short attempt deadline: `attempt` per attempt, delays from 20 ms up to
/// 200 ms, `total` in all (zero: `attempts` only).
fn quick_retry(attempt: Duration, total: Duration, attempts: u32) -> RetrySettings {
    RetrySettings {
        total_timeout: total,
        max_attempts: attempts,
        initial_retry_delay: Duration::from_millis(20),
        retry_delay_multiplier: 2.0,
        max_retry_delay: Duration::from_millis(200),
        initial_rpc_timeout: attempt,
        rpc_timeout_multiplier: 1.0,
        max_rpc_timeout: attempt,
        jitter: false,
    }
}

/// The rows a failed statement acknowledged: the `N` of "N row(s) were acknowledged before
/// the failure", which every failed statement carries, checked against the sink's metric.
fn acknowledged(done: &Insert) -> usize {
    let metric = done.metric(names::RECORDS_ACKED);
    let error = done.error();
    let head = error
        .split_once(" row(s) were acknowledged")
        .map(|(head, _)| head)
        .unwrap_or_else(|| panic!("the error does not say what was acknowledged: {error}"));
    let n: usize = head
        .rsplit(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count before 'row(s) were acknowledged': {error}"));
    assert_eq!(n, metric, "the error's count against the metric: {error}");
    n
}

/// Runs `sql` while the proxy cuts connections `bytes` into the server's answers, re-arming
/// the cut until three connections were cut.
async fn insert_with_cuts(ctx: &SessionContext, sql: &str, proxy: &Proxy, bytes: u64) -> Insert {
    proxy.close_after_server_bytes(bytes);
    let cutter = async {
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if proxy.closes() < 3 {
                proxy.close_after_server_bytes(bytes);
            }
        }
    };
    tokio::select! {
        done = insert(ctx, sql) => done,
        _ = cutter => unreachable!(),
    }
}

/// Runs `sql` while the proxy stalls for `stall`, starting `after` into the statement.
async fn insert_with_stall(
    ctx: &SessionContext,
    sql: &str,
    proxy: &Proxy,
    after: Duration,
    stall: Duration,
) -> Insert {
    let run = insert(ctx, sql);
    let stall_later = async {
        tokio::time::sleep(after).await;
        proxy.stall_for(stall);
        std::future::pending::<()>().await
    };
    tokio::select! {
        done = run => done,
        _ = stall_later => unreachable!(),
    }
}

fn register(ctx: &SessionContext, name: &str, sink: Arc<dyn SinkConnector>) {
    ctx.register_table(name, Arc::new(SinkTable::new(name, sink)))
        .expect("register the sink table");
}

fn raw(options: &[(&str, &str)]) -> RawOptions {
    RawOptions::from_pairs(options.iter().map(|(k, v)| (k.to_string(), v.to_string())))
        .expect("option pairs")
}

// --- Pub/Sub -----------------------------------------------------------------------------------

/// A topic with a subscription on the shared emulator, a proxy in front of it, and a sink
/// table `t (id BIGINT, label VARCHAR)` on the proxy with `options` added.
async fn pubsub_setup(
    prefix: &str,
    options: &[(&str, &str)],
) -> (PubSubAdmin, String, Proxy, SessionContext) {
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription) = admin.topic_with_subscription("faults", prefix, false).await;
    let proxy = Proxy::start(&admin.host).await;
    let mut with = format!(
        "connector = 'pubsub', emulator_host = '{}', topic = '{topic}'",
        proxy.host()
    );
    for (k, v) in options {
        with.push_str(&format!(", {k} = '{v}'"));
    }
    let ctx = gcp_sql::sql::new_context();
    exec(
        &ctx,
        &format!("CREATE TABLE t (id BIGINT, label VARCHAR) WITH ({with})"),
    )
    .await;
    (admin, subscription, proxy, ctx)
}

fn rows_sql(rows: usize) -> String {
    format!(
        "INSERT INTO t SELECT value AS id, concat('row-', CAST(value AS VARCHAR)) AS label \
         FROM generate_series(1, {rows})"
    )
}

/// Every id of 1..=rows arrived at least once (and nothing else).
fn assert_every_id_at_least_once(ids: &[i64], rows: usize) {
    let counts = multiplicities(ids);
    assert_eq!(counts.len(), rows, "distinct ids read back");
    assert!((1..=rows as i64).all(|id| counts.contains_key(&id)));
    assert!(ids.len() >= rows);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubsub_insert_survives_resets_every_400ms() {
    const ROWS: usize = 40_000;
    // Small requests on one writer, so that the INSERT spans several resets however fast the
    // machine is (at 100 messages a request and two writers it could end before the first; at
    // 25 and 200 in flight, a quiet CI machine once finished in 0.76 s, one reset).
    let (admin, subscription, proxy, ctx) = pubsub_setup(
        "resets",
        &[
            ("batch_element_count_threshold", "10"),
            ("max_in_flight_messages", "50"),
            ("sink_parallelism", "1"),
        ],
    )
    .await;
    proxy.reset_every(RESET_PERIOD);
    let start = Instant::now();
    let done = insert(&ctx, &rows_sql(ROWS)).await;
    let took = start.elapsed();
    assert_eq!(done.count(), ROWS as u64, "after {took:?}");
    assert!(
        proxy.resets() >= 2,
        "only {} resets in {took:?}",
        proxy.resets()
    );
    assert!(done.metric(names::SEND_ERRORS) > 0, "no send failed");
    drop(proxy);
    let messages = admin.pull_all(&subscription, ROWS).await;
    assert_every_id_at_least_once(&ids(&messages, "id"), ROWS);
    eprintln!(
        "pubsub resets: {ROWS} rows in {took:?}, {} send errors, {} read back",
        done.metric(names::SEND_ERRORS),
        messages.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubsub_insert_survives_connections_cut_mid_response() {
    const ROWS: usize = 5_000;
    let (admin, subscription, proxy, ctx) = pubsub_setup(
        "cut",
        &[
            ("batch_element_count_threshold", "100"),
            ("max_in_flight_messages", "200"),
        ],
    )
    .await;
    let start = Instant::now();
    // A few hundred bytes into the server's answers: past the HTTP/2 settings, inside the
    // answers to the first Publish calls.
    let done = insert_with_cuts(&ctx, &rows_sql(ROWS), &proxy, 300).await;
    let took = start.elapsed();
    assert_eq!(done.count(), ROWS as u64, "after {took:?}");
    assert!(proxy.closes() >= 1, "no connection was cut");
    assert!(done.metric(names::SEND_ERRORS) > 0, "no send failed");
    let cuts = proxy.closes();
    drop(proxy);
    let messages = admin.pull_all(&subscription, ROWS).await;
    assert_every_id_at_least_once(&ids(&messages, "id"), ROWS);
    eprintln!(
        "pubsub cuts: {ROWS} rows in {took:?}, {cuts} cut, {} send errors, {} read back",
        done.metric(names::SEND_ERRORS),
        messages.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubsub_insert_survives_a_stall_longer_than_an_attempt_deadline() {
    const ROWS: usize = 2_000;
    let (admin, subscription, proxy, ctx) = pubsub_setup(
        "stall",
        &[
            ("retry_initial_rpc_timeout", "400ms"),
            ("retry_rpc_timeout_multiplier", "1.0"),
            ("retry_max_rpc_timeout", "400ms"),
            ("retry_initial_delay", "20ms"),
            ("retry_max_delay", "200ms"),
            ("retry_total_timeout", "20s"),
        ],
    )
    .await;
    let start = Instant::now();
    let done = insert_with_stall(
        &ctx,
        &rows_sql(ROWS),
        &proxy,
        Duration::ZERO,
        Duration::from_millis(1_500),
    )
    .await;
    let took = start.elapsed();
    assert_eq!(done.count(), ROWS as u64);
    assert!(took >= Duration::from_millis(1_500), "{took:?}");
    assert!(done.errors_with_code("DEADLINE_EXCEEDED") > 0);
    drop(proxy);
    let messages = admin.pull_all(&subscription, ROWS).await;
    assert_every_id_at_least_once(&ids(&messages, "id"), ROWS);
    eprintln!("pubsub stall: {ROWS} rows in {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubsub_insert_fails_naming_deadline_exceeded_after_a_stall_past_its_budget() {
    const ROWS: usize = 50_000;
    const IN_FLIGHT: usize = 200;
    let (admin, subscription, proxy, ctx) = pubsub_setup(
        "stall-out",
        &[
            ("batch_element_count_threshold", "100"),
            ("max_in_flight_messages", "200"),
            ("retry_initial_rpc_timeout", "300ms"),
            ("retry_rpc_timeout_multiplier", "1.0"),
            ("retry_max_rpc_timeout", "300ms"),
            ("retry_initial_delay", "20ms"),
            ("retry_max_delay", "100ms"),
            ("retry_total_timeout", "1500ms"),
        ],
    )
    .await;
    let start = Instant::now();
    let done = insert_with_stall(
        &ctx,
        &rows_sql(ROWS),
        &proxy,
        Duration::from_millis(200),
        Duration::from_secs(60),
    )
    .await;
    let took = start.elapsed();
    let error = done.error().to_string();
    assert!(error.contains("DEADLINE_EXCEEDED"), "{error}");
    assert!(took < Duration::from_secs(20), "{took:?}");
    // What the stall held is dropped, never delivered.
    proxy.reset_all();
    drop(proxy);
    let acknowledged = acknowledged(&done);
    let messages = admin.pull_all(&subscription, acknowledged).await;
    let read = multiplicities(&ids(&messages, "id")).len();
    // Every acknowledged row is there; beyond them, at most what was in flight at the stall
    // (published, but the answer held), in each writer.
    let writers = done.metric("writers");
    assert!(
        read >= acknowledged && read <= acknowledged + IN_FLIGHT * writers,
        "{read} read back, {acknowledged} acknowledged"
    );
    eprintln!(
        "pubsub stall past budget: failed after {took:?}, {acknowledged} acknowledged, {read} read back: {error}"
    );
}

// --- Bigtable ----------------------------------------------------------------------------------

/// A table with family `cf` on the shared emulator, a proxy in front of it, and a sink table
/// `t (id BIGINT, label VARCHAR)` keyed by `id` on the proxy, with `options` added and `retry`
/// (when given) replacing the `MutateRows` retry timing.
async fn bigtable_setup(
    prefix: &str,
    options: &[(&str, &str)],
    retry: Option<RetrySettings>,
) -> (Channel, String, Proxy, SessionContext) {
    let host = shared(EmulatorKind::Bigtable).await.host().to_string();
    let channel = plaintext_channel(&host).await.expect("channel to Bigtable");
    let instance = "projects/faults/instances/main";
    let id = unique(prefix);
    BigtableTableAdminClient::new(channel.clone())
        .create_table(CreateTableRequest {
            parent: instance.into(),
            table_id: id.clone(),
            table: Some(Table {
                column_families: [("cf".to_string(), ColumnFamily::default())].into(),
                ..Default::default()
            }),
            initial_splits: vec![],
        })
        .await
        .unwrap_or_else(|s| panic!("CreateTable {id}: {s}"));
    let table = format!("{instance}/tables/{id}");
    let proxy = Proxy::start(&host).await;
    let proxy_host = proxy.host();
    let mut pairs = vec![
        ("emulator_host", proxy_host.as_str()),
        ("table", table.as_str()),
        ("row_key", "id"),
    ];
    pairs.extend_from_slice(options);
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("label", DataType::Utf8, true),
    ]));
    let mut sink = BigtableSink::try_new(schema, None, &raw(&pairs))
        .unwrap_or_else(|e| panic!("cannot build the sink: {e}"));
    if let Some(retry) = retry {
        sink = sink.with_retry(retry);
    }
    let ctx = gcp_sql::sql::new_context();
    register(&ctx, "t", Arc::new(sink));
    (channel, table, proxy, ctx)
}

/// The row keys of `table`, read straight from the emulator, 5,000 rows per `ReadRows` (the
/// emulator's server ends one long stream with a GOAWAY, ENHANCE_YOUR_CALM "too_many_data_frames").
async fn bigtable_keys(channel: &Channel, table: &str) -> BTreeSet<Vec<u8>> {
    let mut keys: BTreeSet<Vec<u8>> = BTreeSet::new();
    loop {
        let rows = keys.last().map(|last| RowSet {
            row_keys: vec![],
            row_ranges: vec![RowRange {
                start_key: Some(row_range::StartKey::StartKeyOpen(last.clone())),
                end_key: None,
            }],
        });
        let mut stream = BigtableClient::new(channel.clone())
            .read_rows(ReadRowsRequest {
                table_name: table.into(),
                rows,
                rows_limit: 5_000,
                ..Default::default()
            })
            .await
            .unwrap_or_else(|s| panic!("ReadRows {table}: {s}"))
            .into_inner();
        let before = keys.len();
        while let Some(response) = stream.message().await.expect("ReadRows message") {
            for chunk in response.chunks {
                if !chunk.row_key.is_empty() {
                    keys.insert(chunk.row_key);
                }
            }
        }
        if keys.len() == before {
            return keys;
        }
    }
}

/// Every id of 1..=rows is a row of `keys` (an integer key is written as its decimal text), and
/// nothing else is.
fn assert_bigtable_rows(keys: &BTreeSet<Vec<u8>>, rows: usize) {
    let missing: Vec<i64> = (1..=rows as i64)
        .filter(|v| !keys.contains(v.to_string().as_bytes()))
        .take(10)
        .collect();
    assert!(missing.is_empty(), "rows missing (first 10): {missing:?}");
    assert_eq!(keys.len(), rows, "rows read back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bigtable_insert_survives_resets_every_400ms() {
    // About 2.5 s of writing alone: enough resets land on a call in flight even when the
    // machine is busy with other tests (60,000 rows took under a second, and once saw none).
    const ROWS: usize = 150_000;
    let (channel, table, proxy, ctx) = bigtable_setup(
        "resets",
        &[
            ("batch_element_count_threshold", "50"),
            ("max_in_flight_entries", "100"),
        ],
        None,
    )
    .await;
    proxy.reset_every(RESET_PERIOD);
    let start = Instant::now();
    let done = insert(&ctx, &rows_sql(ROWS)).await;
    let took = start.elapsed();
    assert_eq!(done.count(), ROWS as u64, "after {took:?}");
    assert!(
        proxy.resets() >= 2,
        "only {} resets in {took:?}",
        proxy.resets()
    );
    assert!(done.metric(names::SEND_ERRORS) > 0, "no send failed");
    drop(proxy);
    assert_bigtable_rows(&bigtable_keys(&channel, &table).await, ROWS);
    eprintln!(
        "bigtable resets: {ROWS} rows in {took:?}, {} send errors",
        done.metric(names::SEND_ERRORS)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bigtable_insert_survives_a_stall_longer_than_an_attempt_deadline() {
    const ROWS: usize = 2_000;
    let (channel, table, proxy, ctx) = bigtable_setup(
        "stall",
        &[],
        Some(quick_retry(
            Duration::from_millis(400),
            Duration::from_secs(20),
            0,
        )),
    )
    .await;
    let start = Instant::now();
    let done = insert_with_stall(
        &ctx,
        &rows_sql(ROWS),
        &proxy,
        Duration::ZERO,
        Duration::from_millis(1_500),
    )
    .await;
    let took = start.elapsed();
    assert_eq!(done.count(), ROWS as u64);
    assert!(done.errors_with_code("DEADLINE_EXCEEDED") > 0);
    drop(proxy);
    assert_bigtable_rows(&bigtable_keys(&channel, &table).await, ROWS);
    eprintln!("bigtable stall: {ROWS} rows in {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bigtable_insert_fails_naming_deadline_exceeded_after_a_stall_past_its_budget() {
    const ROWS: usize = 50_000;
    const IN_FLIGHT: usize = 200;
    let (channel, table, proxy, ctx) = bigtable_setup(
        "stall-out",
        &[
            ("batch_element_count_threshold", "50"),
            ("max_in_flight_entries", "200"),
        ],
        Some(quick_retry(
            Duration::from_millis(300),
            Duration::from_millis(1_500),
            0,
        )),
    )
    .await;
    let start = Instant::now();
    let done = insert_with_stall(
        &ctx,
        &rows_sql(ROWS),
        &proxy,
        Duration::from_millis(200),
        Duration::from_secs(60),
    )
    .await;
    let took = start.elapsed();
    let error = done.error().to_string();
    assert!(error.contains("DEADLINE_EXCEEDED"), "{error}");
    assert!(took < Duration::from_secs(20), "{took:?}");
    proxy.reset_all();
    drop(proxy);
    let acknowledged = acknowledged(&done);
    let read = bigtable_keys(&channel, &table).await.len();
    // Every acknowledged row is there; beyond them, at most what was in flight at the stall
    // (applied, but the answer held), in each writer.
    let writers = done.metric("writers");
    assert!(
        read >= acknowledged && read <= acknowledged + IN_FLIGHT * writers,
        "{read} read back, {acknowledged} acknowledged"
    );
    eprintln!(
        "bigtable stall past budget: failed after {took:?}, {acknowledged} acknowledged, {read} read back: {error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bigtable_insert_survives_connections_cut_mid_response() {
    const ROWS: usize = 5_000;
    let (channel, table, proxy, ctx) = bigtable_setup(
        "cut",
        &[
            ("batch_element_count_threshold", "500"),
            ("max_in_flight_entries", "1000"),
        ],
        None,
    )
    .await;
    let start = Instant::now();
    // A few hundred bytes into the server's answers: past the HTTP/2 settings and headers,
    // inside a MutateRows response stream.
    let done = insert_with_cuts(&ctx, &rows_sql(ROWS), &proxy, 300).await;
    let took = start.elapsed();
    assert_eq!(done.count(), ROWS as u64, "after {took:?}");
    assert!(proxy.closes() >= 1, "no connection was cut");
    assert!(done.metric(names::SEND_ERRORS) > 0, "no send failed");
    let (cuts, connections) = (proxy.closes(), proxy.connections());
    drop(proxy);
    assert_bigtable_rows(&bigtable_keys(&channel, &table).await, ROWS);
    eprintln!(
        "bigtable cuts: {ROWS} rows in {took:?}, {cuts} cut over {connections} connections, {} send errors",
        done.metric(names::SEND_ERRORS)
    );
}

// --- Cloud Tasks -------------------------------------------------------------------------------

/// A paused queue on the shared emulator, a proxy in front of it, and a sink table
/// `t (id BIGINT, label VARCHAR)` creating unnamed tasks in it, with `options` added and `retry`
/// (when given) replacing the `CreateTask` retry timing.
async fn tasks_setup(
    prefix: &str,
    options: &[(&str, &str)],
    retry: Option<RetrySettings>,
) -> (CloudTasksClient<Channel>, String, Proxy, SessionContext) {
    let host = shared(EmulatorKind::CloudTasks).await.host().to_string();
    let channel = plaintext_channel(&host)
        .await
        .expect("channel to Cloud Tasks");
    let mut client = CloudTasksClient::new(channel);
    let parent = "projects/faults/locations/us-central1";
    let queue = format!("{parent}/queues/{}", unique(prefix));
    client
        .create_queue(CreateQueueRequest {
            parent: parent.into(),
            queue: Some(Queue {
                name: queue.clone(),
                ..Default::default()
            }),
        })
        .await
        .unwrap_or_else(|s| panic!("CreateQueue {queue}: {s}"));
    client
        .pause_queue(PauseQueueRequest {
            name: queue.clone(),
        })
        .await
        .unwrap_or_else(|s| panic!("PauseQueue {queue}: {s}"));
    let proxy = Proxy::start(&host).await;
    let proxy_host = proxy.host();
    let mut pairs = vec![
        ("emulator_host", proxy_host.as_str()),
        ("queue", queue.as_str()),
        ("url", "http://127.0.0.1:9/never-dispatched"),
    ];
    pairs.extend_from_slice(options);
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("label", DataType::Utf8, true),
    ]));
    let mut sink = CloudTasksSink::try_new(schema, None, &raw(&pairs))
        .unwrap_or_else(|e| panic!("cannot build the sink: {e}"));
    if let Some(retry) = retry {
        sink = sink.with_retry(retry);
    }
    let ctx = gcp_sql::sql::new_context();
    register(&ctx, "t", Arc::new(sink));
    (client, queue, proxy, ctx)
}

/// The `id` of every task's JSON body in `queue`, read straight from the emulator.
async fn task_ids(client: &CloudTasksClient<Channel>, queue: &str) -> Vec<i64> {
    let mut out = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .clone()
            .list_tasks(ListTasksRequest {
                parent: queue.to_string(),
                response_view: task::View::Full as i32,
                page_size: 1000,
                page_token: page_token.clone(),
            })
            .await
            .unwrap_or_else(|s| panic!("ListTasks {queue}: {s}"))
            .into_inner();
        for t in page.tasks {
            let Some(task::MessageType::HttpRequest(r)) = t.message_type else {
                panic!("task {} has no HTTP request", t.name);
            };
            let body: serde_json::Value = serde_json::from_slice(&r.body).expect("a JSON body");
            out.push(body["id"].as_i64().expect("an integer id"));
        }
        if page.next_page_token.is_empty() {
            return out;
        }
        page_token = page.next_page_token;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloud_tasks_insert_survives_resets_every_400ms() {
    const ROWS: usize = 3_000;
    let (client, queue, proxy, ctx) =
        tasks_setup("resets", &[("max_in_flight_tasks", "20")], None).await;
    proxy.reset_every(RESET_PERIOD);
    let start = Instant::now();
    let done = insert(&ctx, &rows_sql(ROWS)).await;
    let took = start.elapsed();
    assert_eq!(done.count(), ROWS as u64, "after {took:?}");
    assert!(
        proxy.resets() >= 2,
        "only {} resets in {took:?}",
        proxy.resets()
    );
    assert!(done.metric(names::SEND_ERRORS) > 0, "no send failed");
    drop(proxy);
    let ids = task_ids(&client, &queue).await;
    assert_every_id_at_least_once(&ids, ROWS);
    eprintln!(
        "cloud tasks resets: {ROWS} rows in {took:?}, {} send errors, {} tasks",
        done.metric(names::SEND_ERRORS),
        ids.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloud_tasks_insert_survives_connections_cut_mid_response() {
    const ROWS: usize = 500;
    let (client, queue, proxy, ctx) =
        tasks_setup("cut", &[("max_in_flight_tasks", "20")], None).await;
    let start = Instant::now();
    let done = insert_with_cuts(&ctx, &rows_sql(ROWS), &proxy, 300).await;
    let took = start.elapsed();
    assert_eq!(done.count(), ROWS as u64, "after {took:?}");
    assert!(proxy.closes() >= 1, "no connection was cut");
    assert!(done.metric(names::SEND_ERRORS) > 0, "no send failed");
    let cuts = proxy.closes();
    drop(proxy);
    let ids = task_ids(&client, &queue).await;
    assert_every_id_at_least_once(&ids, ROWS);
    eprintln!(
        "cloud tasks cuts: {ROWS} rows in {took:?}, {cuts} cut, {} send errors, {} tasks",
        done.metric(names::SEND_ERRORS),
        ids.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloud_tasks_insert_survives_a_stall_longer_than_an_attempt_deadline() {
    const ROWS: usize = 200;
    let (client, queue, proxy, ctx) = tasks_setup(
        "stall",
        &[],
        Some(quick_retry(Duration::from_millis(400), Duration::ZERO, 20)),
    )
    .await;
    let start = Instant::now();
    let done = insert_with_stall(
        &ctx,
        &rows_sql(ROWS),
        &proxy,
        Duration::ZERO,
        Duration::from_millis(1_500),
    )
    .await;
    let took = start.elapsed();
    assert_eq!(done.count(), ROWS as u64);
    assert!(done.errors_with_code("DEADLINE_EXCEEDED") > 0);
    drop(proxy);
    let ids = task_ids(&client, &queue).await;
    assert_every_id_at_least_once(&ids, ROWS);
    eprintln!(
        "cloud tasks stall: {ROWS} rows in {took:?}, {} tasks",
        ids.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloud_tasks_insert_fails_naming_deadline_exceeded_after_a_stall_past_its_budget() {
    const ROWS: usize = 5_000;
    const IN_FLIGHT: usize = 20;
    let (client, queue, proxy, ctx) = tasks_setup(
        "stall-out",
        &[("max_in_flight_tasks", "20")],
        Some(quick_retry(Duration::from_millis(300), Duration::ZERO, 3)),
    )
    .await;
    let start = Instant::now();
    let done = insert_with_stall(
        &ctx,
        &rows_sql(ROWS),
        &proxy,
        Duration::from_millis(300),
        Duration::from_secs(60),
    )
    .await;
    let took = start.elapsed();
    let error = done.error().to_string();
    assert!(error.contains("DEADLINE_EXCEEDED"), "{error}");
    assert!(took < Duration::from_secs(20), "{took:?}");
    proxy.reset_all();
    drop(proxy);
    let acknowledged = acknowledged(&done);
    let ids = task_ids(&client, &queue).await;
    let distinct: HashMap<i64, usize> = multiplicities(&ids);
    // At most what each writer had in flight at the stall landed unacknowledged.
    let writers = done.metric("writers");
    assert!(
        distinct.len() >= acknowledged && distinct.len() <= acknowledged + IN_FLIGHT * writers,
        "{} read back, {acknowledged} acknowledged",
        distinct.len()
    );
    eprintln!(
        "cloud tasks stall past budget: failed after {took:?}, {acknowledged} acknowledged, {} read back: {error}",
        distinct.len()
    );
}
