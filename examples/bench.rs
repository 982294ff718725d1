//! Throughput and memory benchmarks of the three sinks; see `docs/benchmarks.md`.
//!
//! ```text
//! cargo run --release --example bench -- --workload w1 --target null
//! cargo run --release --example bench -- --workload w1 --untuned --target null-and-google --repeat 3
//! cargo run --release --example bench -- --workload w2 --partitions 2
//! cargo run --release --example bench -- --workload w3 --target null-and-ceiling
//! cargo run --release --example bench -- --workload w1k --target emulator
//! cargo run --release --example bench -- --workload mem-1k --target null --latency 200ms
//! cargo run --release --example bench -- --workload w1 --target null --metrics-endpoint --scrape-interval 100ms --repeat 5
//! ```
//!
//! Each run generates rows in SQL (`generate_series` plus string functions) and inserts them into
//! a `pubsub` (W1, W1-K, the memory workloads), `bigtable` (W2) or `cloud_tasks` (W3) table
//! through the crate's SQL surface, so the whole path is measured: SQL -> Arrow -> encoding ->
//! protobuf -> batch -> send -> acknowledgement.
//!
//! Targets:
//! - `null`: the null server of the workload's service (`gcp_sql::bench::null_server`) in a
//!   **child process** (this binary started again with `--serve-null-child`), so its CPU time is
//!   not counted in this process's `getrusage(RUSAGE_SELF)`. It prints its own totals at the end.
//! - `ceiling`: the same request bytes, pre-encoded from the first rows of the same SQL through
//!   the same mapping and grouped under the same thresholds, sent by a minimal tonic loop at
//!   several concurrencies against the same null server process; the best is the ceiling the
//!   sink is compared to.
//! - `google` (W1 only): Google's Rust publisher (`google-cloud-pubsub`) at its defaults,
//!   publishing the same JSON rows to the same null server process; built separately from
//!   `examples/google_publisher` and started as a child process.
//! - `emulator` (Pub/Sub workloads): the Pub/Sub emulator of the Google Cloud CLI.
//!
//! Every phase prints one `RESULT` line: rows, seconds, rows/s, MB/s of record bytes, CPU
//! seconds of this process (user + system), and the phase's peak RSS (`VmHWM`, reset before the
//! phase through `/proc/self/clear_refs`).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Parser, ValueEnum};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::SessionContext;
use gcloud_sdk::google::bigtable::v2::MutateRowsResponse;
use gcloud_sdk::google::cloud::tasks::v2::Task;
use gcloud_sdk::google::pubsub::v1::publisher_client::PublisherClient;
use gcloud_sdk::google::pubsub::v1::{PublishResponse, Topic};
use gcp_sql::bench::null_server::{NullServerOptions, NullService};
use gcp_sql::bench::{ResourceUsage, peak_rss_bytes, reset_peak_rss};
use gcp_sql::cli::serve_null::serve_until_signal;
use gcp_sql::connectors::TableOptions;
use gcp_sql::connectors::bigtable::mapping::{self as bt, BigtableMapping};
use gcp_sql::connectors::bigtable::options::BigtableSinkOptions;
use gcp_sql::connectors::cloud_tasks::mapping::{self as ct, CloudTasksMapping};
use gcp_sql::connectors::cloud_tasks::options::CloudTasksSinkOptions;
use gcp_sql::connectors::pubsub::sink::mapping::{
    self as ps, MappingSpec, PubSubMapping, write_publish_request,
};
use gcp_sql::connectors::pubsub::sink::options::PubSubSinkOptions;
use gcp_sql::connectors::registry;
use gcp_sql::core::metrics::names;
use gcp_sql::emulators::{Emulator, EmulatorKind, plaintext_endpoint};
use gcp_sql::google::PreEncoded;
use gcp_sql::options::RawOptions;
use tonic::codegen::http;

/// The first argument that turns this binary into the null server child.
const CHILD_FLAG: &str = "--serve-null-child";
/// Project of the benchmark topics, tables and queues.
const PROJECT: &str = "bench";
/// Rows encoded up front for the ceiling's request pool.
const CEILING_POOL_ROWS: u64 = 16_384;
/// Cells per W2 row.
const W2_CELLS: u64 = 5;
/// The URL of every W3 task (the null server never calls it).
const W3_URL: &str = "https://worker.example.com/bench";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Workload {
    /// Pub/Sub: 1,000,000 rows of ~200-byte JSON, one topic.
    W1,
    /// W1 with 16 ordering keys (enable_message_ordering = true).
    W1k,
    /// Bigtable: 1,000,000 rows, a row key and 5 cells of 30 bytes each.
    W2,
    /// Cloud Tasks: 200,000 tasks with a 200-byte body each.
    W3,
    /// 2,000,000 rows of ~1 KB through a slow null server (issue 4): peak RSS vs the byte cap.
    #[value(name = "mem-1k")]
    Mem1k,
    /// 20,000,000 rows of ~200 B (10x W1, issue 5) through a null server answering after 50 ms:
    /// peak RSS stays near the byte cap.
    #[value(name = "mem-10x")]
    Mem10x,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Target {
    /// The sink against the null server (child process).
    Null,
    /// The pre-encoded tonic loop against the null server.
    Ceiling,
    /// The sink and then the ceiling against one null server: the ratio.
    NullAndCeiling,
    /// Google's Rust publisher (google-cloud-pubsub, its defaults) against the null server (W1).
    Google,
    /// The sink and then Google's Rust publisher against one null server: the ratio (W1).
    NullAndGoogle,
    /// The sink against the Pub/Sub emulator (Pub/Sub workloads).
    Emulator,
    /// No sending: the SELECT alone, then the SELECT plus the mapping (JSON and protobuf), to
    /// split the sink's CPU time into its stages (Pub/Sub workloads).
    Stages,
}

/// Which sink a workload writes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SinkKind {
    PubSub,
    Bigtable,
    CloudTasks,
}

impl SinkKind {
    fn connector(self) -> &'static str {
        match self {
            SinkKind::PubSub => "pubsub",
            SinkKind::Bigtable => "bigtable",
            SinkKind::CloudTasks => "cloud_tasks",
        }
    }

    /// The null service of the connector, as the registry lists it.
    fn service(self) -> NullService {
        let kind = registry::kind_named(self.connector()).expect("a registered connector");
        registry::registered(kind)
            .testing
            .null_service
            .expect("every benchmarked connector has a null server")
    }
}

#[derive(Debug, Clone, Parser)]
#[command(about = "Sink benchmarks: Pub/Sub, Bigtable, Cloud Tasks (see docs/benchmarks.md)")]
struct Args {
    /// The workload: sets the sink, rows, row size and keys (each can be overridden)
    #[arg(long, value_enum, default_value_t = Workload::W1)]
    workload: Workload,
    /// What to send to (default: null-and-ceiling for w1/w1k/w2/w3, null for the memory workloads)
    #[arg(long, value_enum)]
    target: Option<Target>,
    /// Rows to insert (default: the workload's)
    #[arg(long)]
    rows: Option<u64>,
    /// Approximate JSON bytes per row (Pub/Sub), bytes per cell (W2) or body bytes (W3)
    /// (default: the workload's)
    #[arg(long)]
    row_bytes: Option<u64>,
    /// Ordering keys (0: none; default: the workload's)
    #[arg(long)]
    keys: Option<u64>,
    /// Latency of the null server's answers (default: the workload's)
    #[arg(long, value_parser = humantime::parse_duration)]
    latency: Option<Duration>,
    /// Set none of the bulk-load settings the Pub/Sub workloads otherwise use: the table gets
    /// the connector's defaults, except for the options given explicitly below
    #[arg(long)]
    untuned: bool,
    /// The payload format of the Pub/Sub workloads without ordering keys: json (the default),
    /// avro or protobuf (binary, with a schema of the workload's five columns). With W3, the
    /// tasks' bodies become W1's five columns in that format instead of one body column
    #[arg(long)]
    format: Option<String>,
    /// batch_element_count_threshold (Pub/Sub default here: 1000 unless --untuned)
    #[arg(long)]
    batch_count: Option<u64>,
    /// batch_request_byte_threshold (Pub/Sub default here: 5000000 unless --untuned)
    #[arg(long)]
    batch_bytes: Option<u64>,
    /// batch_delay_threshold (Pub/Sub only; default here: 10ms unless --untuned)
    #[arg(long, value_parser = humantime::parse_duration)]
    batch_delay: Option<Duration>,
    /// max_in_flight_messages / max_in_flight_entries / max_in_flight_tasks (Pub/Sub default
    /// here unless --untuned: 10000 for w1/w1k, 1000000 for the memory workloads, so that the
    /// 64 MiB byte cap is the one that binds)
    #[arg(long, alias = "max-in-flight-messages")]
    max_in_flight: Option<u64>,
    /// max_in_flight_bytes (Pub/Sub and Bigtable; default: the option's default, 64 MiB)
    #[arg(long)]
    max_in_flight_bytes: Option<u64>,
    /// Runs `SET datafusion.execution.target_partitions = N` before the statements
    #[arg(long)]
    partitions: Option<usize>,
    /// Runs the measured phases this many times (alternating sink and comparison against the
    /// same null server) and prints the medians
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Concurrent streams tried by the ceiling loop
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    concurrency: Vec<usize>,
    /// Tokio worker threads of this process (default: one per core)
    #[arg(long)]
    threads: Option<usize>,
    /// Rows per record batch of the SELECT (`datafusion.execution.batch_size`; default
    /// DataFusion's 8192). Lower it for large rows: 8192 rows of 1 MB are 8 GB of input, which
    /// the plan holds whatever the sink's caps
    #[arg(long)]
    sql_batch_rows: Option<usize>,
    /// The `gcp-sql-google-publisher` binary (default: beside this one's `examples/` directory,
    /// where `cargo build --release --manifest-path examples/google_publisher/Cargo.toml` puts it
    /// with the same target dir)
    #[arg(long)]
    google_publisher: Option<PathBuf>,
    /// Against the null server, also runs the sink with the metrics endpoint serving (and
    /// scraped every --scrape-interval) after each run without it, and prints the difference
    /// (`METRICS-OVERHEAD`; with --repeat, the medians)
    #[arg(long)]
    metrics_endpoint: bool,
    /// How often --metrics-endpoint scrapes /metrics (Prometheus' default is 15 s)
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    scrape_interval: Duration,
}

/// The settings of one run after the workload's defaults are applied.
#[derive(Debug, Clone)]
struct Plan {
    name: &'static str,
    sink: SinkKind,
    rows: u64,
    row_bytes: u64,
    keys: u64,
    latency: Duration,
    /// W3 with `--format`: the tasks' bodies are W1's five columns in that format.
    w1_columns: bool,
}

impl Args {
    fn is_memory_workload(&self) -> bool {
        matches!(self.workload, Workload::Mem1k | Workload::Mem10x)
    }

    fn target(&self) -> Target {
        self.target.unwrap_or(if self.is_memory_workload() {
            Target::Null
        } else {
            Target::NullAndCeiling
        })
    }

    fn plan(&self) -> Plan {
        use SinkKind::*;
        let (name, sink, rows, row_bytes, keys, latency) = match self.workload {
            Workload::W1 => ("w1", PubSub, 1_000_000, 200, 0, Duration::ZERO),
            Workload::W1k => ("w1k", PubSub, 1_000_000, 200, 16, Duration::ZERO),
            Workload::W2 => ("w2", Bigtable, 1_000_000, 30, 0, Duration::ZERO),
            Workload::W3 => ("w3", CloudTasks, 200_000, 200, 0, Duration::ZERO),
            Workload::Mem1k => (
                "mem-1k",
                PubSub,
                2_000_000,
                1_000,
                0,
                Duration::from_millis(200),
            ),
            Workload::Mem10x => (
                "mem-10x",
                PubSub,
                20_000_000,
                200,
                0,
                Duration::from_millis(50),
            ),
        };
        Plan {
            name,
            sink,
            rows: self.rows.unwrap_or(rows),
            row_bytes: self.row_bytes.unwrap_or(row_bytes),
            keys: self.keys.unwrap_or(keys),
            latency: self.latency.unwrap_or(latency),
            w1_columns: sink == CloudTasks && self.format.is_some(),
        }
    }

    /// The writer options the table gets, as (option, value) pairs.
    fn tuning(&self, plan: &Plan) -> Result<Vec<(String, String)>, String> {
        let mut options = Vec::new();
        let mut set = |name: &str, value: Option<String>| {
            if let Some(value) = value {
                options.push((name.to_string(), value));
            }
        };
        let bulk = !self.untuned && plan.sink == SinkKind::PubSub;
        let delay = |d: Duration| humantime::format_duration(d).to_string();
        match plan.sink {
            SinkKind::PubSub => {
                let in_flight = if self.is_memory_workload() {
                    1_000_000
                } else {
                    10_000
                };
                set(
                    "batch_element_count_threshold",
                    self.batch_count
                        .or(bulk.then_some(1000))
                        .map(|v| v.to_string()),
                );
                set(
                    "batch_request_byte_threshold",
                    self.batch_bytes
                        .or(bulk.then_some(5_000_000))
                        .map(|v| v.to_string()),
                );
                set(
                    "batch_delay_threshold",
                    self.batch_delay
                        .or(bulk.then_some(Duration::from_millis(10)))
                        .map(delay),
                );
                set(
                    "max_in_flight_messages",
                    self.max_in_flight
                        .or(bulk.then_some(in_flight))
                        .map(|v| v.to_string()),
                );
            }
            SinkKind::Bigtable => {
                if self.batch_delay.is_some() {
                    return Err("the Bigtable sink has no batch delay option".into());
                }
                set(
                    "batch_element_count_threshold",
                    self.batch_count.map(|v| v.to_string()),
                );
                set(
                    "batch_request_byte_threshold",
                    self.batch_bytes.map(|v| v.to_string()),
                );
                set(
                    "max_in_flight_entries",
                    self.max_in_flight.map(|v| v.to_string()),
                );
            }
            SinkKind::CloudTasks => {
                if self.batch_count.is_some()
                    || self.batch_bytes.is_some()
                    || self.batch_delay.is_some()
                    || self.max_in_flight_bytes.is_some()
                {
                    return Err(
                        "the Cloud Tasks sink does not batch and has no byte cap: only \
                                --max-in-flight applies"
                            .into(),
                    );
                }
                set(
                    "max_in_flight_tasks",
                    self.max_in_flight.map(|v| v.to_string()),
                );
            }
        }
        if plan.sink != SinkKind::CloudTasks {
            set(
                "max_in_flight_bytes",
                self.max_in_flight_bytes.map(|v| v.to_string()),
            );
        }
        Ok(options)
    }
}

/// JSON bytes of a Pub/Sub row besides the padding, for ids of about 6-7 digits:
/// `{"id":N,"user_id":"user-N","event":"page_view","url":"https://example.com/catalog/item/N?ref=bench","pad":"..."}`.
const ROW_OVERHEAD: u64 = 122;

/// `width` characters starting with the decimal `value_sql`, padded with `fill`.
fn fixed_width(value_sql: &str, width: u64, fill: char) -> String {
    format!("substr(concat(CAST({value_sql} AS VARCHAR), repeat('{fill}', {width})), 1, {width})")
}

/// The SELECT generating `rows` rows (ids from 1) of the workload's shape.
fn select_sql(plan: &Plan, rows: u64) -> String {
    match plan.sink {
        SinkKind::PubSub => {
            let pad = plan.row_bytes.saturating_sub(ROW_OVERHEAD).max(1);
            let key = if plan.keys > 0 {
                format!(
                    ", concat('key-', CAST(value % {} AS VARCHAR)) AS ordering_key",
                    plan.keys
                )
            } else {
                String::new()
            };
            format!(
                "SELECT value AS id, \
                        concat('user-', CAST(value % 100000 AS VARCHAR)) AS user_id, \
                        'page_view' AS event, \
                        concat('https://example.com/catalog/item/', CAST(value AS VARCHAR), '?ref=bench') AS url, \
                        repeat('x', {pad}) AS pad{key} \
                 FROM generate_series(1, {rows})"
            )
        }
        SinkKind::Bigtable => {
            let cells: Vec<String> = (1..=W2_CELLS)
                .map(|i| {
                    format!(
                        "{} AS c{i}",
                        fixed_width(&format!("value * {i}"), plan.row_bytes.max(1), 'v')
                    )
                })
                .collect();
            format!(
                "SELECT concat('row-', CAST(value AS VARCHAR)) AS id, {} FROM generate_series(1, {rows})",
                cells.join(", ")
            )
        }
        SinkKind::CloudTasks if plan.w1_columns => select_sql(
            &Plan {
                sink: SinkKind::PubSub,
                ..plan.clone()
            },
            rows,
        ),
        SinkKind::CloudTasks => format!(
            "SELECT {} AS body FROM generate_series(1, {rows})",
            fixed_width("value", plan.row_bytes.max(1), 'x')
        ),
    }
}

/// The topic, table or queue of the workload.
fn destination(plan: &Plan) -> String {
    match plan.sink {
        SinkKind::PubSub => format!("projects/{PROJECT}/topics/bench-{}", plan.name),
        SinkKind::Bigtable => {
            format!(
                "projects/{PROJECT}/instances/bench/tables/bench-{}",
                plan.name
            )
        }
        SinkKind::CloudTasks => format!(
            "projects/{PROJECT}/locations/us-central1/queues/bench-{}",
            plan.name
        ),
    }
}

/// The Avro schema of W1's columns (`--format avro`).
const W1_AVRO_SCHEMA: &str = r#"{"type": "record", "name": "Event", "fields": [{"name": "id", "type": "long"}, {"name": "user_id", "type": "string"}, {"name": "event", "type": "string"}, {"name": "url", "type": "string"}, {"name": "pad", "type": "string"}]}"#;
/// The Protobuf schema of W1's columns (`--format protobuf`).
const W1_PROTO_SCHEMA: &str = r#"syntax = "proto3"; message Event { int64 id = 1; string user_id = 2; string event = 3; string url = 4; string pad = 5; }"#;

/// The table's options (without `connector`), as (option, value) pairs.
fn table_options(args: &Args, plan: &Plan, host: &str) -> gcp_sql::Result<Vec<(String, String)>> {
    let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
    let mut options = match plan.sink {
        SinkKind::PubSub => vec![pair("topic", &destination(plan))],
        SinkKind::Bigtable => vec![
            pair("table", &destination(plan)),
            pair("row_key", "id"),
            pair("column_family", "cf"),
        ],
        SinkKind::CloudTasks if plan.w1_columns => {
            vec![pair("queue", &destination(plan)), pair("url", W3_URL)]
        }
        SinkKind::CloudTasks => vec![
            pair("queue", &destination(plan)),
            pair("url", W3_URL),
            pair("body_column", "body"),
        ],
    };
    options.push(pair("emulator_host", host));
    options.extend(args.tuning(plan).map_err(gcp_sql::Error::Unsupported)?);
    if plan.sink == SinkKind::PubSub && plan.keys > 0 {
        options.push(pair("enable_message_ordering", "true"));
    }
    if plan.sink == SinkKind::PubSub || plan.w1_columns {
        match args.format.as_deref().unwrap_or("json") {
            "json" => {}
            "avro" => {
                options.push(pair("format", "avro"));
                options.push(pair("schema", W1_AVRO_SCHEMA));
            }
            "protobuf" => {
                options.push(pair("format", "protobuf"));
                options.push(pair("schema", W1_PROTO_SCHEMA));
            }
            other => {
                return Err(gcp_sql::Error::Unsupported(format!(
                    "--format {other}: expected json, avro or protobuf"
                )));
            }
        }
    }
    Ok(options)
}

fn table_sql(args: &Args, plan: &Plan, host: &str) -> gcp_sql::Result<String> {
    let columns = match plan.sink {
        SinkKind::PubSub if plan.keys > 0 => {
            "id BIGINT, user_id VARCHAR, event VARCHAR, url VARCHAR, pad VARCHAR, ordering_key VARCHAR"
                .to_string()
        }
        SinkKind::PubSub => "id BIGINT, user_id VARCHAR, event VARCHAR, url VARCHAR, pad VARCHAR".to_string(),
        SinkKind::CloudTasks if plan.w1_columns => {
            "id BIGINT, user_id VARCHAR, event VARCHAR, url VARCHAR, pad VARCHAR".to_string()
        }
        SinkKind::Bigtable => std::iter::once("id VARCHAR".to_string())
            .chain((1..=W2_CELLS).map(|i| format!("c{i} VARCHAR")))
            .collect::<Vec<_>>()
            .join(", "),
        SinkKind::CloudTasks => "body VARCHAR".to_string(),
    };
    let options: Vec<String> = std::iter::once(format!("connector = '{}'", plan.sink.connector()))
        .chain(
            table_options(args, plan, host)?
                .into_iter()
                .map(|(k, v)| format!("{k} = '{v}'")),
        )
        .collect();
    Ok(format!(
        "CREATE TABLE bench ({columns}) WITH ({})",
        options.join(", ")
    ))
}

/// One measured phase.
#[derive(Debug, Clone)]
struct Measured {
    what: String,
    rows: u64,
    record_bytes: u64,
    wall: Duration,
    cpu: Duration,
    peak_rss: Option<u64>,
    extra: String,
}

impl Measured {
    fn rows_per_s(&self) -> f64 {
        self.rows as f64 / self.wall.as_secs_f64()
    }

    /// CPU time of this process per row, in microseconds.
    fn cpu_us_per_row(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.rows.max(1) as f64
    }

    fn print(&self) {
        let mb = |b: u64| b as f64 / (1024.0 * 1024.0);
        println!(
            "RESULT {} rows={} seconds={:.3} rows_per_s={:.0} mb_per_s={:.2} cpu_s={:.3} cpu_us_per_row={:.2} peak_rss_mib={} {}",
            self.what,
            self.rows,
            self.wall.as_secs_f64(),
            self.rows_per_s(),
            self.record_bytes as f64 / 1e6 / self.wall.as_secs_f64(),
            self.cpu.as_secs_f64(),
            self.cpu.as_secs_f64() * 1e6 / self.rows.max(1) as f64,
            self.peak_rss
                .map_or("n/a".to_string(), |b| format!("{:.1}", mb(b))),
            self.extra,
        );
    }
}

/// Sums a metric over every node of a plan.
fn metric(plan: &Arc<dyn ExecutionPlan>, name: &str) -> u64 {
    let mut total = 0;
    let mut pending = vec![plan.clone()];
    while let Some(node) = pending.pop() {
        if let Some(m) = node.metrics().and_then(|m| m.sum_by_name(name)) {
            total += m.as_usize() as u64;
        }
        pending.extend(node.children().into_iter().cloned());
    }
    total
}

/// A session with the run's `batch_size` and `target_partitions`.
async fn session(args: &Args) -> gcp_sql::Result<SessionContext> {
    let ctx: SessionContext = gcp_sql::sql::new_context();
    if let Some(rows) = args.sql_batch_rows {
        gcp_sql::sql::run(
            &ctx,
            &format!("SET datafusion.execution.batch_size = {}", rows.max(1)),
        )
        .await?;
    }
    if let Some(partitions) = args.partitions {
        gcp_sql::sql::run(
            &ctx,
            &format!(
                "SET datafusion.execution.target_partitions = {}",
                partitions.max(1)
            ),
        )
        .await?;
    }
    Ok(ctx)
}

/// Declares the table and runs the INSERT, measuring the INSERT alone.
async fn run_sink(args: &Args, plan: &Plan, host: &str, target: &str) -> gcp_sql::Result<Measured> {
    let ctx = session(args).await?;
    gcp_sql::sql::run(&ctx, &table_sql(args, plan, host)?).await?;
    let insert = format!("INSERT INTO bench {}", select_sql(plan, plan.rows));
    let reset = reset_peak_rss();
    let before = ResourceUsage::now();
    let started = Instant::now();
    let frame = gcp_sql::sql::statement_to_dataframe(&ctx, &insert).await?;
    let physical = frame.create_physical_plan().await?;
    let batches = collect(physical.clone(), ctx.task_ctx()).await?;
    let wall = started.elapsed();
    let after = ResourceUsage::now();
    let count = batches
        .first()
        .and_then(|b| {
            b.column(0)
                .as_any()
                .downcast_ref::<datafusion::arrow::array::UInt64Array>()
                .map(|a| a.value(0))
        })
        .unwrap_or(0);
    let record_bytes = metric(&physical, names::BYTES_SENT);
    let high_water = metric(&physical, names::IN_FLIGHT_BYTES_HIGH_WATER);
    let records_high_water = metric(&physical, names::IN_FLIGHT_RECORDS_HIGH_WATER);
    let rpcs = metric(&physical, names::SEND_RPCS);
    let retries = metric(&physical, names::RETRIES);
    let send_errors = metric(&physical, names::SEND_ERRORS);
    Ok(Measured {
        what: format!(
            "workload={} target={target} path=sink partitions={}",
            plan.name,
            ctx.state().config().target_partitions()
        ),
        rows: count,
        record_bytes,
        wall,
        cpu: after.cpu() - before.cpu(),
        peak_rss: if reset {
            peak_rss_bytes()
        } else {
            Some(after.max_rss_bytes)
        },
        extra: format!(
            "avg_record_bytes={:.1} rpcs={rpcs} retries={retries} send_errors={send_errors} in_flight_bytes_high_water_mib={:.1} in_flight_records_high_water={records_high_water} process_max_rss_mib={:.1}",
            record_bytes as f64 / count.max(1) as f64,
            high_water as f64 / (1024.0 * 1024.0),
            after.max_rss_bytes as f64 / (1024.0 * 1024.0),
        ),
    })
}

/// Runs the workload's SELECT, and with `encode` the mapping of every batch, sending nothing.
async fn run_stage(plan: &Plan, encode: bool) -> gcp_sql::Result<Measured> {
    use futures::StreamExt;
    let ctx = gcp_sql::sql::new_context();
    let topic = destination(plan);
    let before = ResourceUsage::now();
    let started = Instant::now();
    let frame = ctx.sql(&select_sql(plan, plan.rows)).await?;
    let mut stream = frame.execute_stream().await?;
    let (mut rows, mut record_bytes) = (0u64, 0u64);
    let mut out = Vec::new();
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        rows += batch.num_rows() as u64;
        if encode {
            let spec = MappingSpec {
                ordering_key_column: (plan.keys > 0).then(|| "ordering_key".to_string()),
                ..MappingSpec::default()
            };
            let mapping = PubSubMapping::new(&spec, &batch.schema(), Some(&topic), None)?;
            mapping.encode_batch(&batch, 0, &mut out)?;
            for envelope in out.drain(..) {
                record_bytes += envelope?.bytes;
            }
        }
    }
    let wall = started.elapsed();
    let after = ResourceUsage::now();
    Ok(Measured {
        what: format!(
            "workload={} target=none path={}",
            plan.name,
            if encode { "sql+encode" } else { "sql" }
        ),
        rows,
        record_bytes,
        wall,
        cpu: after.cpu() - before.cpu(),
        peak_rss: None,
        extra: String::new(),
    })
}

/// One pre-encoded request of the ceiling: its body, its records and their bytes.
type PooledRequest = (Bytes, u64, u64);

/// The first rows of the workload encoded by the sink's own mapping, and the batch thresholds
/// the table's options give the sink.
struct PoolRecords {
    /// Each record's serialized bytes.
    records: Vec<Box<[u8]>>,
    /// Records per request.
    max_records: usize,
    /// Record bytes per request.
    max_bytes: u64,
}

fn encode_pool_records(
    args: &Args,
    plan: &Plan,
    batches: &[RecordBatch],
) -> gcp_sql::Result<PoolRecords> {
    let raw = RawOptions::from_pairs(table_options(args, plan, "127.0.0.1:1")?)?;
    let mut records = Vec::new();
    let thresholds = match plan.sink {
        SinkKind::PubSub => {
            let options = PubSubSinkOptions::from_raw(None, &raw)?;
            let topic = destination(plan);
            for batch in batches {
                let mapping = PubSubMapping::new(
                    &MappingSpec::default(),
                    &batch.schema(),
                    Some(&topic),
                    None,
                )?;
                let mut out = Vec::new();
                mapping.encode_batch(batch, 0, &mut out)?;
                for envelope in out {
                    records.push(envelope?.record.encoded().into());
                }
            }
            let p = &options.publisher;
            (
                usize::try_from(p.batch_element_count_threshold())
                    .unwrap_or(usize::MAX)
                    .min(ps::MAX_MESSAGES_PER_REQUEST),
                u64::try_from(p.batch_request_byte_threshold())
                    .unwrap_or(u64::MAX)
                    .min(ps::MAX_REQUEST_BYTES / 2),
            )
        }
        SinkKind::Bigtable => {
            let options = BigtableSinkOptions::from_raw(None, &raw)?;
            for batch in batches {
                let mapping = BigtableMapping::new(&options, &batch.schema())?;
                let mut out = Vec::new();
                mapping.encode_batch(batch, 0, &mut out)?;
                for envelope in out {
                    records.push(envelope?.record.encoded().into());
                }
            }
            let w = &options.writer;
            (
                usize::try_from(w.batch_element_count_threshold()).unwrap_or(usize::MAX),
                u64::try_from(w.batch_request_byte_threshold()).unwrap_or(u64::MAX),
            )
        }
        SinkKind::CloudTasks => {
            let options = CloudTasksSinkOptions::from_raw(None, &raw)?;
            for batch in batches {
                let mapping = CloudTasksMapping::new(&options, &batch.schema())?;
                let mut out = Vec::new();
                mapping.encode_batch(batch, 0, &mut out)?;
                for envelope in out {
                    records.push(envelope?.record.encoded().into());
                }
            }
            // One task per CreateTask.
            (1, u64::MAX)
        }
    };
    Ok(PoolRecords {
        records,
        max_records: thresholds.0.max(1),
        max_bytes: thresholds.1.max(1),
    })
}

/// The request body carrying `records` for the workload's destination.
fn request_body(plan: &Plan, records: &[Box<[u8]>]) -> Vec<u8> {
    let target = destination(plan);
    let mut body = Vec::new();
    match plan.sink {
        SinkKind::PubSub => {
            write_publish_request(&mut body, &target, records.iter().map(|m| &m[..]))
        }
        SinkKind::Bigtable => {
            bt::write_mutate_rows_request(&mut body, &target, "", records.iter().map(|e| &e[..]))
        }
        SinkKind::CloudTasks => {
            for task in records {
                ct::write_create_task_request(&mut body, &target, task);
            }
        }
    }
    body
}

/// The pool of pre-encoded requests: the first rows of the same SQL through the same mapping,
/// grouped under the same thresholds.
async fn request_pool(args: &Args, plan: &Plan) -> gcp_sql::Result<Vec<PooledRequest>> {
    let ctx = gcp_sql::sql::new_context();
    let rows = plan.rows.min(CEILING_POOL_ROWS);
    let batches = gcp_sql::sql::run(&ctx, &select_sql(plan, rows)).await?;
    let PoolRecords {
        records,
        max_records,
        max_bytes,
    } = encode_pool_records(args, plan, &batches)?;
    let mut pool = Vec::new();
    let mut current: Vec<Box<[u8]>> = Vec::new();
    let mut current_bytes = 0u64;
    let flush = |current: &mut Vec<Box<[u8]>>, current_bytes: &mut u64, pool: &mut Vec<_>| {
        if current.is_empty() {
            return;
        }
        let body = request_body(plan, current);
        pool.push((Bytes::from(body), current.len() as u64, *current_bytes));
        current.clear();
        *current_bytes = 0;
    };
    for record in records {
        let len = record.len() as u64;
        if !current.is_empty() && current_bytes + len > max_bytes {
            flush(&mut current, &mut current_bytes, &mut pool);
        }
        current.push(record);
        current_bytes += len;
        if current.len() >= max_records || current_bytes >= max_bytes {
            flush(&mut current, &mut current_bytes, &mut pool);
        }
    }
    flush(&mut current, &mut current_bytes, &mut pool);
    // Cycle through full requests only, so every request carries as many records as the first
    // (a short last request would make the record count drift from --rows).
    if pool.len() > 1 {
        let full = pool[0].1;
        pool.retain(|(_, records, _)| *records == full);
    }
    Ok(pool)
}

/// Sends one pre-encoded request the way the workload's client does and checks the answer
/// accounts for `records` records.
async fn send_pooled(
    grpc: &mut tonic::client::Grpc<tonic::transport::Channel>,
    sink: SinkKind,
    request: tonic::Request<PreEncoded<Bytes>>,
    records: u64,
) -> Result<(), tonic::Status> {
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let path = http::uri::PathAndQuery::from_static(sink.service().method_path());
    let answered = match sink {
        SinkKind::PubSub => {
            let codec = tonic_prost::ProstCodec::<PreEncoded<Bytes>, PublishResponse>::default();
            let response = grpc.unary(request, path, codec).await?;
            response.get_ref().message_ids.len() as u64
        }
        SinkKind::Bigtable => {
            let codec = tonic_prost::ProstCodec::<PreEncoded<Bytes>, MutateRowsResponse>::default();
            let mut stream = grpc
                .server_streaming(request, path, codec)
                .await?
                .into_inner();
            let mut ok = 0u64;
            while let Some(response) = stream.message().await? {
                ok += response
                    .entries
                    .iter()
                    .filter(|e| e.status.as_ref().is_none_or(|s| s.code == 0))
                    .count() as u64;
            }
            ok
        }
        SinkKind::CloudTasks => {
            let codec = tonic_prost::ProstCodec::<PreEncoded<Bytes>, Task>::default();
            let response = grpc.unary(request, path, codec).await?;
            u64::from(!response.get_ref().name.is_empty())
        }
    };
    if answered != records {
        return Err(tonic::Status::internal(format!(
            "{answered} records acknowledged of {records}"
        )));
    }
    Ok(())
}

/// Sends requests from `pool` round-robin, `concurrency` at a time on one channel, until
/// `rows` records have gone.
async fn run_ceiling(
    plan: &Plan,
    pool: Arc<Vec<PooledRequest>>,
    host: &str,
    concurrency: usize,
) -> gcp_sql::Result<Measured> {
    let channel =
        plaintext_endpoint(host)?
            .connect()
            .await
            .map_err(|e| gcp_sql::Error::Connect {
                endpoint: host.to_string(),
                message: e.to_string(),
            })?;
    let routing_field = match plan.sink {
        SinkKind::PubSub => "topic",
        SinkKind::Bigtable => "table_name",
        SinkKind::CloudTasks => "parent",
    };
    let routing: tonic::metadata::AsciiMetadataValue =
        format!("{routing_field}={}", destination(plan).replace('/', "%2F"))
            .parse()
            .map_err(|_| gcp_sql::Error::Unsupported("routing header".into()))?;
    let per_request = pool[0].1;
    let requests = plan.rows.div_ceil(per_request);
    let next = Arc::new(AtomicU64::new(0));
    let sent = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let sink = plan.sink;
    let before = ResourceUsage::now();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (channel, pool, next, sent, bytes, routing) = (
            channel.clone(),
            pool.clone(),
            next.clone(),
            sent.clone(),
            bytes.clone(),
            routing.clone(),
        );
        tasks.spawn(async move {
            let mut grpc = tonic::client::Grpc::new(channel);
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= requests {
                    return Ok::<(), tonic::Status>(());
                }
                let (body, records, record_bytes) = &pool[(i as usize) % pool.len()];
                let mut request = tonic::Request::new(PreEncoded(body.clone()));
                request
                    .metadata_mut()
                    .insert("x-goog-request-params", routing.clone());
                send_pooled(&mut grpc, sink, request, *records).await?;
                sent.fetch_add(*records, Ordering::Relaxed);
                bytes.fetch_add(*record_bytes, Ordering::Relaxed);
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        let status = done.map_err(|e| gcp_sql::Error::Failed(format!("ceiling task: {e}")))?;
        status.map_err(|s| gcp_sql::Error::Failed(format!("ceiling request: {s}")))?;
    }
    let wall = started.elapsed();
    let after = ResourceUsage::now();
    Ok(Measured {
        what: format!(
            "workload={} target=null path=ceiling concurrency={concurrency}",
            plan.name
        ),
        rows: sent.load(Ordering::Relaxed),
        record_bytes: bytes.load(Ordering::Relaxed),
        wall,
        cpu: after.cpu() - before.cpu(),
        peak_rss: None,
        extra: format!("records_per_request={per_request}"),
    })
}

/// The best of the ceiling loop's concurrencies.
async fn run_ceilings(
    args: &Args,
    plan: &Plan,
    pool: &Arc<Vec<PooledRequest>>,
    host: &str,
) -> gcp_sql::Result<Option<Measured>> {
    let mut best: Option<Measured> = None;
    for &concurrency in &args.concurrency {
        let measured = run_ceiling(plan, pool.clone(), host, concurrency.max(1)).await?;
        measured.print();
        if best
            .as_ref()
            .is_none_or(|b| measured.rows_per_s() > b.rows_per_s())
        {
            best = Some(measured);
        }
    }
    Ok(best)
}

/// Google's Rust publisher, run once as a child against `host`; its rows/s.
fn run_google(args: &Args, plan: &Plan, host: &str) -> gcp_sql::Result<f64> {
    let binary = match &args.google_publisher {
        Some(path) => path.clone(),
        None => std::env::current_exe()?
            .parent()
            .and_then(|examples| examples.parent())
            .map(|dir| dir.join("gcp-sql-google-publisher"))
            .ok_or_else(|| gcp_sql::Error::Unsupported("no directory for the binary".into()))?,
    };
    let output = Command::new(&binary)
        .args(["--host", host, "--topic", &destination(plan)])
        .args(["--rows", &plan.rows.to_string()])
        .args(["--row-bytes", &plan.row_bytes.to_string()])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            gcp_sql::Error::Failed(format!(
                "cannot run {} ({e}); build it with `cargo build --release --manifest-path \
                 examples/google_publisher/Cargo.toml` or pass --google-publisher",
                binary.display()
            ))
        })?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let Some(line) = stdout.lines().find(|l| l.starts_with("RESULT ")) else {
        return Err(gcp_sql::Error::Failed(format!(
            "Google's publisher printed no RESULT line: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    };
    println!("{line}");
    line.split_whitespace()
        .find_map(|field| field.strip_prefix("rows_per_s="))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| gcp_sql::Error::Failed(format!("no rows_per_s in: {line}")))
}

/// The median of `values` (the mean of the middle two for an even count).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// The null server running as a child process.
struct NullChild {
    child: Child,
    host: String,
    lines: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl NullChild {
    fn start(latency: Duration, service: NullService) -> std::io::Result<NullChild> {
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .arg(CHILD_FLAG)
            .arg(humantime::format_duration(latency).to_string())
            .arg(service.name())
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout from the null server"))?;
        let mut reader = BufReader::new(stdout);
        let mut first = String::new();
        reader.read_line(&mut first)?;
        let host = first
            .strip_prefix("listening on ")
            .and_then(|rest| rest.split_whitespace().next())
            .ok_or_else(|| std::io::Error::other(format!("unexpected first line: {first}")))?
            .to_string();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let reader = std::thread::spawn(move || {
            for line in reader.lines().map_while(Result::ok) {
                sink.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
        Ok(NullChild {
            child,
            host,
            lines,
            reader: Some(reader),
        })
    }

    /// Stops the server (SIGTERM) and returns its final `total:` line.
    fn stop(mut self) -> Option<String> {
        let pid = libc::pid_t::try_from(self.child.id()).ok()?;
        // SAFETY: signalling a child process this struct owns and has not reaped yet.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let _ = self.child.wait();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        let lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        lines.iter().find(|l| l.starts_with("total:")).cloned()
    }
}

impl Drop for NullChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve_child(latency: &str, service: &str) -> std::process::ExitCode {
    let Ok(latency) = humantime::parse_duration(latency) else {
        eprintln!("bad latency {latency}");
        return std::process::ExitCode::from(2);
    };
    let Some(service) = registry::null_service_named(service) else {
        eprintln!("bad service {service}");
        return std::process::ExitCode::from(2);
    };
    let Ok(runtime) = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    else {
        return std::process::ExitCode::FAILURE;
    };
    let options = NullServerOptions {
        latency,
        service,
        feed: Default::default(),
    };
    match runtime.block_on(serve_until_signal(0, options, None)) {
        Ok(_) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("null server: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn create_topic(host: &str, topic: &str) -> gcp_sql::Result<()> {
    let channel = gcp_sql::emulators::plaintext_channel(host).await?;
    let created = PublisherClient::new(channel)
        .create_topic(Topic {
            name: topic.to_string(),
            ..Default::default()
        })
        .await;
    match created {
        Ok(_) => Ok(()),
        Err(s) if s.code() == tonic::Code::AlreadyExists => Ok(()),
        Err(s) => Err(gcp_sql::Error::Failed(format!("CreateTopic: {s}"))),
    }
}

/// Runs the sink once more with the metrics endpoint serving on a free loopback port and
/// scraped every `--scrape-interval` by a task of this process (whose CPU time counts in the
/// measurement); returns what it measured.
async fn with_endpoint(args: &Args, plan: &Plan, host: &str) -> gcp_sql::Result<Measured> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let endpoint = gcp_sql::ops::MetricsServer::start("127.0.0.1:0").await?;
    let at = endpoint.local_addr();
    let scrapes = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let every = args.scrape_interval.max(Duration::from_millis(1));
    let scraper = tokio::spawn({
        let scrapes = scrapes.clone();
        async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                let Ok(mut stream) = tokio::net::TcpStream::connect(at).await else {
                    continue;
                };
                let request = b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n";
                let mut body = Vec::new();
                if stream.write_all(request).await.is_ok()
                    && stream.read_to_end(&mut body).await.is_ok()
                {
                    scrapes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
    });
    let measured = run_sink(args, plan, host, "null+metrics-endpoint").await;
    scraper.abort();
    endpoint.stop().await;
    let measured = measured?;
    measured.print();
    println!(
        "SCRAPES {} of /metrics during the run",
        scrapes.load(std::sync::atomic::Ordering::Relaxed)
    );
    Ok(measured)
}

/// Runs the sink and its comparisons against one null server, `--repeat` times.
async fn against_null(args: &Args, plan: &Plan, target: Target) -> gcp_sql::Result<()> {
    if matches!(target, Target::Google | Target::NullAndGoogle)
        && (plan.sink != SinkKind::PubSub || plan.keys > 0)
    {
        return Err(gcp_sql::Error::Unsupported(
            "the Google publisher comparison runs W1 (Pub/Sub without ordering keys) only".into(),
        ));
    }
    let server = NullChild::start(plan.latency, plan.sink.service())?;
    let with_sink = !matches!(target, Target::Ceiling | Target::Google);
    let with_ceiling = matches!(target, Target::Ceiling | Target::NullAndCeiling);
    let with_google = matches!(target, Target::Google | Target::NullAndGoogle);
    let pool = if with_ceiling {
        Some(Arc::new(request_pool(args, plan).await?))
    } else {
        None
    };
    let (mut sinks, mut others, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let mut with_metrics = Vec::new();
    let mut other_name = "";
    for _ in 0..args.repeat.max(1) {
        let mut sink = None;
        let mut cpu_without = None;
        if with_sink {
            let measured = run_sink(args, plan, &server.host, "null").await?;
            measured.print();
            sink = Some(measured.rows_per_s());
            cpu_without = Some(measured.cpu_us_per_row());
        }
        if let (Some(without), Some(cpu_without)) = (sink, cpu_without)
            && args.metrics_endpoint
        {
            let measured = with_endpoint(args, plan, &server.host).await?;
            let (with, cpu_with) = (measured.rows_per_s(), measured.cpu_us_per_row());
            println!(
                "METRICS-OVERHEAD workload={} without_rows_per_s={without:.0} with_rows_per_s={with:.0} \
                 rows_per_s_overhead_pct={:.1} without_cpu_us_per_row={cpu_without:.2} \
                 with_cpu_us_per_row={cpu_with:.2} cpu_overhead_pct={:.1}",
                plan.name,
                (1.0 - with / without) * 100.0,
                (cpu_with / cpu_without - 1.0) * 100.0
            );
            with_metrics.push((with, cpu_without, cpu_with));
        }
        let mut other = None;
        if let Some(pool) = &pool
            && let Some(best) = run_ceilings(args, plan, pool, &server.host).await?
        {
            if let Some(sink) = sink {
                println!(
                    "RATIO workload={} sink_rows_per_s={sink:.0} ceiling_rows_per_s={:.0} ({}) ratio={:.2}",
                    plan.name,
                    best.rows_per_s(),
                    best.what,
                    sink / best.rows_per_s()
                );
            }
            other = Some(best.rows_per_s());
            other_name = "ceiling";
        }
        if with_google {
            let google = run_google(args, plan, &server.host)?;
            if let Some(sink) = sink {
                println!(
                    "RATIO workload={} sink_rows_per_s={sink:.0} google_rows_per_s={google:.0} ratio={:.2}",
                    plan.name,
                    sink / google
                );
            }
            other = Some(google);
            other_name = "google";
        }
        sinks.extend(sink);
        others.extend(other);
        if let (Some(sink), Some(other)) = (sink, other) {
            ratios.push(sink / other);
        }
    }
    if args.repeat > 1 {
        let mut line = format!("MEDIAN workload={} runs={}", plan.name, args.repeat);
        if !sinks.is_empty() {
            line += &format!(" sink_rows_per_s={:.0}", median(&mut sinks));
        }
        if !others.is_empty() {
            line += &format!(" {other_name}_rows_per_s={:.0}", median(&mut others));
        }
        if !ratios.is_empty() {
            line += &format!(" ratio={:.2}", median(&mut ratios));
        }
        if !with_metrics.is_empty() && !sinks.is_empty() {
            let without = median(&mut sinks.clone());
            let with = median(&mut with_metrics.iter().map(|m| m.0).collect::<Vec<_>>());
            let cpu_without = median(&mut with_metrics.iter().map(|m| m.1).collect::<Vec<_>>());
            let cpu_with = median(&mut with_metrics.iter().map(|m| m.2).collect::<Vec<_>>());
            line += &format!(
                " with_metrics_endpoint_rows_per_s={with:.0} rows_per_s_overhead_pct={:.1} \
                 cpu_us_per_row={cpu_without:.2} with_metrics_endpoint_cpu_us_per_row={cpu_with:.2} \
                 cpu_overhead_pct={:.1}",
                (1.0 - with / without) * 100.0,
                (cpu_with / cpu_without - 1.0) * 100.0
            );
        }
        println!("{line}");
    }
    match server.stop() {
        Some(total) => println!("NULL-SERVER {total}"),
        None => println!("NULL-SERVER (no totals printed)"),
    }
    Ok(())
}

async fn bench(args: Args) -> gcp_sql::Result<()> {
    let plan = args.plan();
    let tuning = args.tuning(&plan).map_err(gcp_sql::Error::Unsupported)?;
    let tuning: Vec<String> = tuning.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!(
        "# workload={} sink={} rows={} row_bytes~{} keys={} latency={:?} sql_batch_rows={:?} partitions={:?} options=[{}]",
        plan.name,
        plan.sink.connector(),
        plan.rows,
        plan.row_bytes,
        plan.keys,
        plan.latency,
        args.sql_batch_rows,
        args.partitions,
        if tuning.is_empty() {
            "connector defaults".to_string()
        } else {
            tuning.join(" ")
        },
    );
    let target = args.target();
    match target {
        Target::Emulator | Target::Stages if plan.sink != SinkKind::PubSub => {
            return Err(gcp_sql::Error::Unsupported(format!(
                "target {target:?} runs the Pub/Sub workloads only"
            )));
        }
        Target::Emulator => {
            let emulator = Emulator::start(EmulatorKind::PubSub).await?;
            create_topic(emulator.host(), &destination(&plan)).await?;
            let measured = run_sink(&args, &plan, emulator.host(), "emulator").await?;
            measured.print();
        }
        Target::Stages => {
            run_stage(&plan, false).await?.print();
            run_stage(&plan, true).await?.print();
        }
        Target::Null
        | Target::Ceiling
        | Target::NullAndCeiling
        | Target::Google
        | Target::NullAndGoogle => against_null(&args, &plan, target).await?,
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let raw: Vec<String> = std::env::args().collect();
    if raw.get(1).map(String::as_str) == Some(CHILD_FLAG) {
        return serve_child(
            raw.get(2).map_or("0s", String::as_str),
            raw.get(3).map_or("pubsub", String::as_str),
        );
    }
    let args = Args::parse();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if let Some(threads) = args.threads {
        runtime.worker_threads(threads.max(1));
    }
    let runtime = match runtime.build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(bench(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
