//! The sinks on a Ballista cluster (feature `ballista`): a scheduler and two executors of this
//! crate, in this process, each listening on its own loopback ports and talking gRPC as
//! separate processes would; the statements go through Ballista's client.
//!
//! Each test starts its own cluster, writes to the real emulators (shared by the binary, as in
//! the integration tests) and reads what landed back with the emulators' own clients.
//!
//! Run: `cargo test --features ballista --test cluster`.

#[path = "../integration/support/mod.rs"]
#[allow(dead_code)]
mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use arrow::array::AsArray;
use arrow::datatypes::UInt64Type;
use datafusion::physical_plan::collect;
use datafusion::prelude::{SessionConfig, SessionContext};
use gcp_sql::cluster::{
    ExecutorSettings, SINK_OPERATOR, SchedulerSettings, job_id, job_metrics, operator_metrics,
    sink_stage_partitions,
};
use gcp_sql::core::metrics::names;

use support::bigtable::{Bigtable, Cell};
use support::{PubSubAdmin, exec};

const ROWS: i64 = 100_000;
const KEYS: i64 = 50;
const PARTITIONS: usize = 8;

/// A free loopback port (bound, then released for the executor to bind).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A scheduler and two executors (four task slots each); returns the scheduler's `http://`
/// URL.
async fn start_cluster() -> String {
    gcp_sql::connectors::install_crypto_provider();
    let scheduler = SchedulerSettings {
        bind_host: "127.0.0.1".into(),
        bind_port: 0,
    }
    .spawn()
    .await
    .expect("the scheduler starts");
    for _ in 0..2 {
        let work_dir = tempfile::tempdir().expect("a work dir").keep();
        let executor = ExecutorSettings {
            scheduler_host: "127.0.0.1".into(),
            scheduler_port: scheduler.port(),
            bind_host: "127.0.0.1".into(),
            bind_port: free_port(),
            grpc_port: free_port(),
            concurrent_tasks: Some(4),
            work_dir: Some(work_dir.display().to_string()),
        };
        tokio::spawn(async move {
            if let Err(e) = executor.run().await {
                panic!("executor stopped: {e}");
            }
        });
    }
    format!("http://127.0.0.1:{}", scheduler.port())
}

/// A client session on the cluster at `url`, planning with [`PARTITIONS`] partitions.
async fn client(url: &str) -> SessionContext {
    let state = gcp_sql::sql::new_state_builder()
        .with_config(SessionConfig::new().with_target_partitions(PARTITIONS))
        .build();
    let df_url = url.replacen("http://", "df://", 1);
    gcp_sql::cluster::remote_context(&df_url, state)
        .await
        .expect("a client of the cluster")
}

/// What an INSERT on the cluster did: the count it returned, how many partitions its sink
/// stage had, the sink's metrics from the job, and the sink tasks the executors logged.
struct ClusterInsert {
    count: u64,
    sink_partitions: u32,
    acked: usize,
    /// Per task id, the rows its writers logged as acknowledged.
    tasks: BTreeMap<String, u64>,
}

/// One `sink task done` line an executor logged.
#[derive(Debug, Clone)]
struct TaskLine {
    table: String,
    task: String,
    rows: u64,
}

/// Every `sink task done` line logged in this process (the executors run here).
fn task_lines() -> &'static Mutex<Vec<TaskLine>> {
    static LINES: OnceLock<Mutex<Vec<TaskLine>>> = OnceLock::new();
    LINES.get_or_init(|| {
        use tracing_subscriber::layer::SubscriberExt;
        let subscriber = tracing_subscriber::registry().with(TaskLines);
        tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
        Mutex::new(Vec::new())
    })
}

/// A tracing layer that keeps the sink's task lines.
struct TaskLines;

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        self.0
            .insert(field.name().to_string(), text.trim_matches('"').to_string());
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for TaskLines {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() != "gcp_sql::core::statement::log" {
            return;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        let f = fields.0;
        if f.get("message").map(String::as_str) != Some("sink task done") {
            return;
        }
        let line = TaskLine {
            table: f.get("table").cloned().unwrap_or_default(),
            task: f.get("task").cloned().unwrap_or_default(),
            rows: f
                .get("rows")
                .and_then(|r| r.parse().ok())
                .unwrap_or_default(),
        };
        task_lines().lock().unwrap().push(line);
    }
}

async fn insert_on_cluster(
    ctx: &SessionContext,
    url: &str,
    table: &str,
    sql: &str,
) -> ClusterInsert {
    task_lines();
    let frame = gcp_sql::sql::statement_to_dataframe(ctx, sql)
        .await
        .expect("the INSERT plans");
    let plan = frame.create_physical_plan().await.expect("a physical plan");
    let batches = collect(plan.clone(), ctx.task_ctx())
        .await
        .unwrap_or_else(|e| panic!("the INSERT failed on the cluster: {e}"));
    let count = batches
        .iter()
        .map(|b| b.column(0).as_primitive::<UInt64Type>().value(0))
        .sum();
    let job = job_id(&plan).expect("the plan ran as a cluster job");
    let metrics = job_metrics(url, &job).await.expect("the job's metrics");
    let sink_partitions = sink_stage_partitions(&metrics).expect("a stage ran the sink");
    let acked = operator_metrics(&metrics, SINK_OPERATOR)
        .iter()
        .filter_map(|m| m.sum_by_name(names::RECORDS_ACKED))
        .map(|v| v.as_usize())
        .sum();
    let mut tasks = BTreeMap::new();
    for line in task_lines().lock().unwrap().iter() {
        if line.table == table && line.task.contains(&job) {
            *tasks.entry(line.task.clone()).or_insert(0) += line.rows;
        }
    }
    eprintln!(
        "job {job}: count {count}, {acked} acknowledged, sink stage of {sink_partitions} \
         partitions run as tasks {tasks:?}"
    );
    ClusterInsert {
        count,
        sink_partitions,
        acked,
        tasks,
    }
}

/// `ROWS` rows `id` 1..=ROWS over `KEYS` keys `key-(id % KEYS)`, in descending `id` order
/// (the order comes from the ORDER BY, not from the source).
fn keyed_rows(table: &str, extra: &str) -> String {
    format!(
        "INSERT INTO {table} SELECT id, concat('key-', CAST(id % {KEYS} AS VARCHAR)) AS k{extra} \
         FROM (SELECT unnest(range(1, {})) AS id) ORDER BY id DESC",
        ROWS + 1
    )
}

fn expected_ids(key: i64) -> Vec<i64> {
    (1..=ROWS).rev().filter(|v| v % KEYS == key).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_insert_on_two_executors_delivers_each_ordering_key_once_and_in_order() {
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription) = admin
        .topic_with_subscription("cluster", "cluster", true)
        .await;
    let url = start_cluster().await;
    let ctx = client(&url).await;
    exec(
        &ctx,
        &format!(
            "CREATE TABLE events (id BIGINT, k VARCHAR) WITH (connector = 'pubsub', \
             emulator_host = '{}', topic = '{topic}', enable_message_ordering = 'true', \
             ordering_key_column = 'k', batch_element_count_threshold = '500')",
            admin.host
        ),
    )
    .await;
    let done = insert_on_cluster(&ctx, &url, "events", &keyed_rows("events", "")).await;
    assert_eq!(done.count, ROWS as u64);
    assert_eq!(done.acked, ROWS as usize, "the job's sink metrics");
    assert_eq!(done.sink_partitions, PARTITIONS as u32);
    assert!(done.tasks.len() > 1, "sink tasks: {:?}", done.tasks);
    assert_eq!(
        done.tasks.values().sum::<u64>(),
        ROWS as u64,
        "rows the sink tasks logged"
    );

    let messages = admin.pull_all(&subscription, ROWS as usize).await;
    assert_eq!(messages.len(), ROWS as usize);
    assert_each_key_once_in_order(&messages, ROWS);
}

/// Each of the `KEYS` ordering keys got exactly its ids of 1..=`rows`, in descending order.
fn assert_each_key_once_in_order(
    messages: &[gcloud_sdk::google::pubsub::v1::PubsubMessage],
    rows: i64,
) {
    let order: Vec<i64> = (1..=rows).rev().collect();
    support::assert_each_key_once_in_order(messages, &order, KEYS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_insert_on_two_executors_writes_every_bigtable_cell_once() {
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("cluster");
    bt.create_table(&table, &["cf"]).await;
    let url = start_cluster().await;
    let ctx = client(&url).await;
    exec(
        &ctx,
        &bt.create_sql(
            "cells",
            "seq BIGINT, k VARCHAR, ts TIMESTAMP",
            &table,
            &[
                ("row_key", "k"),
                ("timestamp_column", "ts"),
                ("batch_element_count_threshold", "500"),
            ],
        ),
    )
    .await;
    // One version per row: the row's id is its cell's value and (in milliseconds) its
    // timestamp, so every row of the statement is one cell of its key's row.
    let sql = keyed_rows(
        "cells",
        ", CAST(to_timestamp_micros(1700000000000000 + id * 1000) AS TIMESTAMP) AS ts",
    );
    let done = insert_on_cluster(&ctx, &url, "cells", &sql).await;
    assert_eq!(done.count, ROWS as u64);
    assert_eq!(done.acked, ROWS as usize, "the job's sink metrics");
    assert_eq!(done.sink_partitions, PARTITIONS as u32);
    assert!(done.tasks.len() > 1, "sink tasks: {:?}", done.tasks);
    assert_eq!(
        done.tasks.values().sum::<u64>(),
        ROWS as u64,
        "rows the sink tasks logged"
    );

    let rows = bt.read(&table).await;
    assert_eq!(rows.len(), KEYS as usize);
    for k in 0..KEYS {
        let key = format!("key-{k}");
        let mut expected: Vec<Cell> = expected_ids(k)
            .into_iter()
            .map(|id| {
                support::bigtable::cell(
                    "cf",
                    "seq",
                    1_700_000_000_000_000 + id * 1000,
                    id.to_be_bytes().to_vec(),
                )
            })
            .collect();
        expected.sort();
        let landed = &rows[key.as_bytes()];
        assert_eq!(landed.len(), expected.len(), "cells of {key}");
        assert!(landed == &expected, "cells of {key} differ");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn explain_analyze_on_the_cluster_shows_the_sinks_metrics() {
    let admin = PubSubAdmin::connect().await;
    let (topic, _subscription) = admin
        .topic_with_subscription("cluster", "analyze", false)
        .await;
    let url = start_cluster().await;
    let ctx = client(&url).await;
    exec(
        &ctx,
        &format!(
            "CREATE TABLE analyzed (id BIGINT) WITH (connector = 'pubsub', \
             emulator_host = '{}', topic = '{topic}')",
            admin.host
        ),
    )
    .await;
    let batches = gcp_sql::sql::run(
        &ctx,
        "EXPLAIN ANALYZE INSERT INTO analyzed SELECT unnest(range(1, 1001))",
    )
    .await
    .expect("EXPLAIN ANALYZE runs on the cluster");
    let text = arrow::util::pretty::pretty_format_batches(&batches)
        .unwrap()
        .to_string();
    let sink = text
        .lines()
        .find(|l| l.contains("SinkWriterExec: connector=pubsub table=analyzed"))
        .unwrap_or_else(|| panic!("no sink line in\n{text}"));
    assert!(sink.contains("records_acked=1.00 K"), "{sink}");
    assert!(text.contains("SinkCountExec"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_sink_task_fails_the_job_with_the_sinks_message() {
    let admin = PubSubAdmin::connect().await;
    let url = start_cluster().await;
    let ctx = client(&url).await;
    // A topic that does not exist, without auto_create_topic: the sink's NOT_FOUND error.
    let topic = format!("projects/cluster/topics/{}", support::unique("missing"));
    exec(
        &ctx,
        &format!(
            "CREATE TABLE nowhere (id BIGINT) WITH (connector = 'pubsub', \
             emulator_host = '{}', topic = '{topic}')",
            admin.host
        ),
    )
    .await;
    let frame = gcp_sql::sql::statement_to_dataframe(
        &ctx,
        "INSERT INTO nowhere SELECT unnest(range(1, 1001))",
    )
    .await
    .expect("the INSERT plans");
    let err = frame
        .collect()
        .await
        .expect_err("a missing topic fails the job")
        .to_string();
    // The sink's own message, not a debug dump of its error.
    assert!(
        err.contains(&format!("Publish to '{topic}' failed with NOT_FOUND")),
        "{err}"
    );
    assert!(!err.contains("Incomplete {"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_without_a_declaration_is_refused_before_the_job() {
    let url = start_cluster().await;
    let ctx = client(&url).await;
    let raw = gcp_sql::options::RawOptions::from_pairs([(
        "emulator_host".to_string(),
        "localhost:1".to_string(),
    )])
    .unwrap();
    let schema = Arc::new(arrow::datatypes::Schema::new(vec![
        arrow::datatypes::Field::new("id", arrow::datatypes::DataType::Int64, false),
    ]));
    let sink = gcp_sql::connectors::pubsub::sink::writer::PubSubSink::try_new(
        schema,
        Some("projects/demo/topics/events"),
        &raw,
    )
    .unwrap();
    ctx.register_table(
        "typed",
        Arc::new(gcp_sql::sql::SinkTable::new("typed", Arc::new(sink))),
    )
    .unwrap();
    let err = gcp_sql::sql::run(&ctx, "INSERT INTO typed VALUES (1)")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot be sent to a cluster"), "{err}");
}

/// Starts the tool's scheduler and two executors (`--concurrent-tasks concurrent_tasks` each)
/// as processes whose logs are `scheduler.log`, `executor1.log` and `executor2.log` in `logs`,
/// and waits until both executors registered. Returns the processes and the scheduler's port.
fn start_tool_cluster(logs: &std::path::Path, concurrent_tasks: &str) -> (Processes, String) {
    let log = |name: &str| std::fs::File::create(logs.join(name)).expect("a log file");
    let scheduler_port = free_port().to_string();
    let mut processes = Processes(Vec::new());
    processes.0.push(
        support::tool(logs)
            .args(["scheduler", "--bind-host", "127.0.0.1", "--bind-port"])
            .arg(&scheduler_port)
            .stderr(log("scheduler.log"))
            .spawn()
            .expect("the scheduler starts"),
    );
    wait_for(
        &logs.join("scheduler.log"),
        "gcp-sql scheduler listening",
        1,
    );
    for name in ["executor1.log", "executor2.log"] {
        let (flight, grpc) = (free_port().to_string(), free_port().to_string());
        processes.0.push(
            support::tool(logs)
                .args(["executor", "--scheduler-host", "127.0.0.1"])
                .args(["--scheduler-port", &scheduler_port])
                .args(["--bind-host", "127.0.0.1", "--bind-port", &flight])
                .args(["--grpc-port", &grpc, "--concurrent-tasks", concurrent_tasks])
                .stderr(log(name))
                .spawn()
                .expect("an executor starts"),
        );
    }
    wait_for(
        &logs.join("scheduler.log"),
        "Received register executor request",
        2,
    );
    (processes, scheduler_port)
}

/// Processes this test started, killed (by their own handles) when it ends.
struct Processes(Vec<std::process::Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Waits until `file` holds `needle` `times` times; panics with the file past a bound that
/// only a broken start reaches.
fn wait_for(file: &std::path::Path, needle: &str, times: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        if text.matches(needle).count() >= times {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} never said '{needle}' {times} time(s):\n{text}",
            file.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tool_runs_an_insert_on_its_own_scheduler_and_two_executors() {
    const TOOL_ROWS: i64 = 20_000;
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription) = admin.topic_with_subscription("cluster", "tool", true).await;
    let home = tempfile::tempdir().expect("a home");
    let logs = home.path();
    let (processes, scheduler_port) = start_tool_cluster(logs, "2");

    // The emulator address comes from the client's environment only: the executors have no
    // emulator variable, so they write where the client's declaration resolved.
    let sql = format!(
        "SET datafusion.execution.target_partitions = 8;
         CREATE TABLE events (id BIGINT, k VARCHAR) WITH (connector = 'pubsub', \
           topic = '{topic}', enable_message_ordering = 'true', ordering_key_column = 'k');
         INSERT INTO events SELECT id, concat('key-', CAST(id % {KEYS} AS VARCHAR)) AS k \
           FROM (SELECT unnest(range(1, {})) AS id) ORDER BY id DESC;",
        TOOL_ROWS + 1
    );
    let out = support::output(
        support::tool(home.path())
            .env("PUBSUB_EMULATOR_HOST", &admin.host)
            .args(["--cluster", &format!("df://127.0.0.1:{scheduler_port}")])
            .args(["--format", "csv", "-c", &sql]),
    );
    let (stdout, stderr) = (support::text(&out.stdout), support::text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("count\n{TOOL_ROWS}\n")),
        "{stdout}"
    );
    assert!(
        stderr.contains(&format!(
            "Sink: {TOOL_ROWS} row(s) acknowledged of {TOOL_ROWS} sent"
        )),
        "{stderr}"
    );

    let messages = admin.pull_all(&subscription, TOOL_ROWS as usize).await;
    assert_eq!(messages.len(), TOOL_ROWS as usize);
    assert_each_key_once_in_order(&messages, TOOL_ROWS);
    let mut logged = 0u64;
    let mut executors_with_tasks = 0;
    for name in ["executor1.log", "executor2.log"] {
        let text = std::fs::read_to_string(logs.join(name)).unwrap();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("sink task done") && l.contains("table=events"))
            .collect();
        executors_with_tasks += usize::from(!lines.is_empty());
        for line in lines {
            assert!(
                line.contains(&format!("destination=\"topic {topic}\"")),
                "{line}"
            );
            let rows = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("rows="))
                .and_then(|r| r.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no rows in {line}"));
            logged += rows;
        }
    }
    assert_eq!(logged, TOOL_ROWS as u64, "rows the executors logged");
    assert!(executors_with_tasks >= 1);

    // A source only the local engine can run is refused before any job, naming it, and not
    // as Ballista's "internal error ... bug in DataFusion".
    let refused = support::output(
        support::tool(home.path())
            .env("PUBSUB_EMULATOR_HOST", &admin.host)
            .args(["--cluster", &format!("df://127.0.0.1:{scheduler_port}")])
            .args([
                "-c",
                &format!(
                    "CREATE TABLE g (k VARCHAR, v BIGINT) WITH (connector = 'pubsub', \
                       topic = '{topic}');
                     INSERT INTO g SELECT 'k', value FROM generate_series(1, 3);"
                ),
            ]),
    );
    let stderr = support::text(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the source 'generate_series()' cannot be sent to a cluster"),
        "{stderr}"
    );
    assert!(!stderr.contains("bug"), "{stderr}");
    drop(processes);
}

/// `needle` lines over every executor log.
fn count_in_logs(logs: &std::path::Path, needle: &str) -> usize {
    ["executor1.log", "executor2.log"]
        .iter()
        .map(|name| {
            std::fs::read_to_string(logs.join(name))
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains(needle))
                .count()
        })
        .sum()
}

/// Waits until `done()` holds; panics with `what` past a bound only a hang reaches.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_under_the_tool_on_a_cluster_cancels_the_job_reports_and_ends_the_sink_tasks() {
    const SLOW_ROWS: i64 = 200_000;
    let admin = PubSubAdmin::connect().await;
    let (topic, _subscription) = admin.topic_with_subscription("cluster", "stop", true).await;
    let home = tempfile::tempdir().expect("a home");
    let logs = home.path().to_path_buf();
    let log = |name: &str| std::fs::File::create(logs.join(name)).expect("a log file");
    let (mut processes, scheduler_port) = start_tool_cluster(&logs, "4");

    // One message per publish and one publish in flight per writer: the INSERT runs for
    // far longer than the test waits before its Ctrl-C.
    let sql = format!(
        "SET datafusion.execution.target_partitions = 8;
         SET datafusion.execution.batch_size = 64;
         CREATE TABLE events (id BIGINT, k VARCHAR) WITH (connector = 'pubsub', \
           topic = '{topic}', enable_message_ordering = 'true', ordering_key_column = 'k', \
           batch_element_count_threshold = '1', max_in_flight_messages = '1', \
           shutdown_timeout = '5s');
         INSERT INTO events SELECT id, concat('key-', CAST(id % {KEYS} AS VARCHAR)) AS k \
           FROM (SELECT unnest(range(1, {})) AS id);",
        SLOW_ROWS + 1
    );
    processes.0.push(
        support::tool(home.path())
            .env("PUBSUB_EMULATOR_HOST", &admin.host)
            .args(["--cluster", &format!("df://127.0.0.1:{scheduler_port}")])
            .args(["--format", "csv", "-c", &sql])
            .stdout(log("client.out"))
            .stderr(log("client.err"))
            .spawn()
            .expect("the client starts"),
    );
    let client_pid = processes.0.last().expect("the client").id();
    wait_until("no sink task started", || {
        count_in_logs(&logs, "sink task started") >= 1
    });
    std::thread::sleep(std::time::Duration::from_secs(1));
    let killed = std::process::Command::new("kill")
        .args(["-INT", &client_pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let mut status = None;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while status.is_none() {
        let client = processes.0.last_mut().expect("the client");
        status = client.try_wait().expect("the client's status");
        if std::time::Instant::now() > deadline {
            panic!(
                "the client did not exit after SIGINT:\n{}\n{}",
                std::fs::read_to_string(logs.join("client.err")).unwrap_or_default(),
                std::fs::read_to_string(logs.join("scheduler.log")).unwrap_or_default()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let stderr = std::fs::read_to_string(logs.join("client.err")).unwrap();
    // As a local run whose graceful stop could not confirm every row: exit code 1, with the
    // stop and the counts named.
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{stderr}");
    assert!(stderr.contains("Ctrl-C: stopping"), "{stderr}");
    assert!(stderr.contains("Cancelling job"), "{stderr}");
    assert!(
        stderr.contains("stop requested (Ctrl-C): job ")
            && stderr.contains("was cancelled on the cluster")
            && stderr.contains("row(s)"),
        "{stderr}"
    );
    // Every sink writer that started on an executor ends: drained on the cancel (or done, had
    // it finished first), each with its line.
    let sink_lines = || {
        ["executor1.log", "executor2.log"]
            .iter()
            .flat_map(|name| {
                std::fs::read_to_string(logs.join(name))
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| l.contains("sink task") || l.contains("ancel"))
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    loop {
        let started = count_in_logs(&logs, "sink task started");
        let ended = count_in_logs(&logs, "sink task cancelled")
            + count_in_logs(&logs, "sink task done")
            + count_in_logs(&logs, "sink task failed");
        if ended >= started {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{started} sink writer(s) started, {ended} ended:\n{}",
            sink_lines()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        count_in_logs(&logs, "sink task cancelled") >= 1,
        "{}",
        sink_lines()
    );
    drop(processes);
}
