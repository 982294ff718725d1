//! Throughput and memory benchmarks of the Pub/Sub sink; see `docs/benchmarks.md`.
//!
//! ```text
//! cargo run --release --example bench_pubsub -- --workload w1 --target null
//! cargo run --release --example bench_pubsub -- --workload w1k --target emulator
//! cargo run --release --example bench_pubsub -- --workload mem-1k --target null --latency 200ms
//! ```
//!
//! Each run generates rows in SQL (`generate_series` plus string concatenation into JSON of about
//! `--row-bytes` bytes) and inserts them into a `pubsub` table through the crate's SQL surface,
//! so the whole path is measured: SQL -> Arrow -> JSON -> protobuf -> batch -> send.
//!
//! Targets:
//! - `null`: a null Pub/Sub server (`gcp_sql::bench::null_server`) in a **child process** (this
//!   binary started again with `--serve-null-child`), so its CPU time is not counted in this
//!   process's `getrusage(RUSAGE_SELF)`. It prints its own totals at the end.
//! - `ceiling`: the same `PublishRequest` bytes, pre-encoded from the first rows of the same SQL
//!   through the same mapping, sent by a minimal tonic loop at several concurrencies against the
//!   same null server process; the best is the ceiling the sink is compared to.
//! - `emulator`: the Pub/Sub emulator of the Google Cloud CLI, started on a free port.
//!
//! Every phase prints one `RESULT` line: rows, seconds, rows/s, MB/s of message bytes, CPU
//! seconds of this process (user + system), and the phase's peak RSS (`VmHWM`, reset before the
//! phase through `/proc/self/clear_refs`).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Parser, ValueEnum};
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::SessionContext;
use gcloud_sdk::google::pubsub::v1::publisher_client::PublisherClient;
use gcloud_sdk::google::pubsub::v1::{PublishResponse, Topic};
use gcp_sql::bench::null_server::{NullServerOptions, serve_until_signal};
use gcp_sql::bench::{ResourceUsage, peak_rss_bytes, reset_peak_rss};
use gcp_sql::connectors::google::PreEncoded;
use gcp_sql::connectors::pubsub::mapping::{
    MappingSpec, PubSubMapping, request_base_len, request_entry_len, write_publish_request,
};
use gcp_sql::core::metrics::names;
use gcp_sql::emulators::{Emulator, EmulatorKind, plaintext_endpoint};
use tonic::codegen::http;

/// The first argument that turns this binary into the null server child.
const CHILD_FLAG: &str = "--serve-null-child";
/// Project of the benchmark topics.
const PROJECT: &str = "bench";
/// Rows encoded up front for the ceiling's request pool.
const CEILING_POOL_ROWS: u64 = 16_384;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Workload {
    /// 1,000,000 rows of ~200-byte JSON, one topic.
    W1,
    /// W1 with 16 ordering keys (enable_message_ordering = true).
    W1k,
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
    /// The sink against the Pub/Sub emulator.
    Emulator,
    /// No sending: the SELECT alone, then the SELECT plus the mapping (JSON and protobuf), to
    /// split the sink's CPU time into its stages.
    Stages,
}

#[derive(Debug, Clone, Parser)]
#[command(about = "Pub/Sub sink benchmarks (see docs/benchmarks.md)")]
struct Args {
    /// The workload: sets rows, row size and keys (each can be overridden)
    #[arg(long, value_enum, default_value_t = Workload::W1)]
    workload: Workload,
    /// What to send to (default: null-and-ceiling for w1/w1k, null for the memory workloads)
    #[arg(long, value_enum)]
    target: Option<Target>,
    /// Rows to insert (default: the workload's)
    #[arg(long)]
    rows: Option<u64>,
    /// Approximate JSON bytes per row (default: the workload's)
    #[arg(long)]
    row_bytes: Option<u64>,
    /// Ordering keys (0: none; default: the workload's)
    #[arg(long)]
    keys: Option<u64>,
    /// Latency of the null server's acknowledgements (default: the workload's)
    #[arg(long, value_parser = humantime::parse_duration)]
    latency: Option<Duration>,
    /// batch_element_count_threshold
    #[arg(long, default_value_t = 1000)]
    batch_count: u64,
    /// batch_request_byte_threshold
    #[arg(long, default_value_t = 5_000_000)]
    batch_bytes: u64,
    /// batch_delay_threshold
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10ms")]
    batch_delay: Duration,
    /// max_in_flight_messages (default: 10000 for w1/w1k; 1000000 for the memory workloads, so
    /// that the 64 MiB byte cap is the one that binds)
    #[arg(long)]
    max_in_flight_messages: Option<u64>,
    /// max_in_flight_bytes (default: the option's default, 64 MiB)
    #[arg(long)]
    max_in_flight_bytes: Option<u64>,
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
}

/// The settings of one run after the workload's defaults are applied.
#[derive(Debug, Clone)]
struct Plan {
    name: &'static str,
    rows: u64,
    row_bytes: u64,
    keys: u64,
    latency: Duration,
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

    fn in_flight_messages(&self) -> u64 {
        self.max_in_flight_messages
            .unwrap_or(if self.is_memory_workload() {
                1_000_000
            } else {
                10_000
            })
    }

    fn plan(&self) -> Plan {
        let (name, rows, row_bytes, keys, latency) = match self.workload {
            Workload::W1 => ("w1", 1_000_000, 200, 0, Duration::ZERO),
            Workload::W1k => ("w1k", 1_000_000, 200, 16, Duration::ZERO),
            Workload::Mem1k => ("mem-1k", 2_000_000, 1_000, 0, Duration::from_millis(200)),
            Workload::Mem10x => ("mem-10x", 20_000_000, 200, 0, Duration::from_millis(50)),
        };
        Plan {
            name,
            rows: self.rows.unwrap_or(rows),
            row_bytes: self.row_bytes.unwrap_or(row_bytes),
            keys: self.keys.unwrap_or(keys),
            latency: self.latency.unwrap_or(latency),
        }
    }
}

/// JSON bytes of a row besides the padding, for ids of about 6-7 digits:
/// `{"id":N,"user_id":"user-N","event":"page_view","url":"https://example.com/catalog/item/N?ref=bench","pad":"..."}`.
const ROW_OVERHEAD: u64 = 122;

/// The SELECT generating `rows` rows (ids from 1) of about `row_bytes` JSON bytes each.
fn select_sql(plan: &Plan, rows: u64) -> String {
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

fn topic(plan: &Plan) -> String {
    format!("projects/{PROJECT}/topics/bench-{}", plan.name)
}

fn table_sql(args: &Args, plan: &Plan, host: &str) -> String {
    let key_column = if plan.keys > 0 {
        ", ordering_key VARCHAR"
    } else {
        ""
    };
    let mut options = vec![
        "connector = 'pubsub'".to_string(),
        format!("topic = '{}'", topic(plan)),
        format!("emulator_host = '{host}'"),
        format!("batch_element_count_threshold = '{}'", args.batch_count),
        format!("batch_request_byte_threshold = '{}'", args.batch_bytes),
        format!(
            "batch_delay_threshold = '{}'",
            humantime::format_duration(args.batch_delay)
        ),
        format!("max_in_flight_messages = '{}'", args.in_flight_messages()),
    ];
    if let Some(bytes) = args.max_in_flight_bytes {
        options.push(format!("max_in_flight_bytes = '{bytes}'"));
    }
    if plan.keys > 0 {
        options.push("enable_message_ordering = 'true'".into());
    }
    format!(
        "CREATE TABLE bench (id BIGINT, user_id VARCHAR, event VARCHAR, url VARCHAR, pad VARCHAR{key_column}) \
         WITH ({})",
        options.join(", ")
    )
}

/// One measured phase.
#[derive(Debug, Clone)]
struct Measured {
    what: String,
    rows: u64,
    message_bytes: u64,
    wall: Duration,
    cpu: Duration,
    peak_rss: Option<u64>,
    extra: String,
}

impl Measured {
    fn rows_per_s(&self) -> f64 {
        self.rows as f64 / self.wall.as_secs_f64()
    }

    fn print(&self) {
        let mb = |b: u64| b as f64 / (1024.0 * 1024.0);
        println!(
            "RESULT {} rows={} seconds={:.3} rows_per_s={:.0} mb_per_s={:.2} cpu_s={:.3} cpu_us_per_row={:.2} peak_rss_mib={} {}",
            self.what,
            self.rows,
            self.wall.as_secs_f64(),
            self.rows_per_s(),
            self.message_bytes as f64 / 1e6 / self.wall.as_secs_f64(),
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

/// Declares the table and runs the INSERT, measuring the INSERT alone.
async fn run_sink(args: &Args, plan: &Plan, host: &str, target: &str) -> gcp_sql::Result<Measured> {
    let ctx: SessionContext = gcp_sql::sql::new_context();
    if let Some(rows) = args.sql_batch_rows {
        gcp_sql::sql::run(
            &ctx,
            &format!("SET datafusion.execution.batch_size = {}", rows.max(1)),
        )
        .await?;
    }
    gcp_sql::sql::run(&ctx, &table_sql(args, plan, host)).await?;
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
    let message_bytes = metric(&physical, names::BYTES_SENT);
    let high_water = metric(&physical, names::IN_FLIGHT_BYTES_HIGH_WATER);
    let records_high_water = metric(&physical, names::IN_FLIGHT_RECORDS_HIGH_WATER);
    let rpcs = metric(&physical, names::SEND_RPCS);
    let retries = metric(&physical, names::RETRIES);
    let send_errors = metric(&physical, names::SEND_ERRORS);
    Ok(Measured {
        what: format!("workload={} target={target} path=sink", plan.name),
        rows: count,
        message_bytes,
        wall,
        cpu: after.cpu() - before.cpu(),
        peak_rss: if reset {
            peak_rss_bytes()
        } else {
            Some(after.max_rss_bytes)
        },
        extra: format!(
            "avg_message_bytes={:.1} publish_rpcs={rpcs} retries={retries} send_errors={send_errors} in_flight_bytes_high_water_mib={:.1} in_flight_records_high_water={records_high_water} process_max_rss_mib={:.1}",
            message_bytes as f64 / count.max(1) as f64,
            high_water as f64 / (1024.0 * 1024.0),
            after.max_rss_bytes as f64 / (1024.0 * 1024.0),
        ),
    })
}

/// Runs the workload's SELECT, and with `encode` the mapping of every batch, sending nothing.
async fn run_stage(plan: &Plan, encode: bool) -> gcp_sql::Result<Measured> {
    use futures::StreamExt;
    let ctx = gcp_sql::sql::new_context();
    let topic = topic(plan);
    let before = ResourceUsage::now();
    let started = Instant::now();
    let frame = ctx.sql(&select_sql(plan, plan.rows)).await?;
    let mut stream = frame.execute_stream().await?;
    let (mut rows, mut message_bytes) = (0u64, 0u64);
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
                message_bytes += envelope?.bytes;
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
        message_bytes,
        wall,
        cpu: after.cpu() - before.cpu(),
        peak_rss: None,
        extra: String::new(),
    })
}

/// The pool of pre-encoded requests: the first rows of the same SQL through the same mapping,
/// grouped under the same thresholds. Returns (body, messages, message bytes) per request.
async fn request_pool(args: &Args, plan: &Plan) -> gcp_sql::Result<Vec<(Bytes, u64, u64)>> {
    let ctx = gcp_sql::sql::new_context();
    let rows = plan.rows.min(CEILING_POOL_ROWS);
    let batches = gcp_sql::sql::run(&ctx, &select_sql(plan, rows)).await?;
    let topic = topic(plan);
    let max_records = args.batch_count.min(1000) as usize;
    let mut pool = Vec::new();
    let mut current: Vec<Box<[u8]>> = Vec::new();
    let mut current_bytes = 0u64;
    let flush = |current: &mut Vec<Box<[u8]>>, current_bytes: &mut u64, pool: &mut Vec<_>| {
        if current.is_empty() {
            return;
        }
        let size = request_base_len(&topic)
            + current
                .iter()
                .map(|m| request_entry_len(m.len() as u64))
                .sum::<u64>();
        let mut body = Vec::with_capacity(size as usize);
        write_publish_request(&mut body, &topic, current.iter().map(|m| &m[..]));
        pool.push((Bytes::from(body), current.len() as u64, *current_bytes));
        current.clear();
        *current_bytes = 0;
    };
    for batch in &batches {
        let mapping =
            PubSubMapping::new(&MappingSpec::default(), &batch.schema(), Some(&topic), None)?;
        let mut out = Vec::new();
        mapping.encode_batch(batch, 0, &mut out)?;
        for envelope in out {
            let record = envelope?.record;
            let len = record.encoded_len() as u64;
            if !current.is_empty() && current_bytes + len > args.batch_bytes {
                flush(&mut current, &mut current_bytes, &mut pool);
            }
            current.push(record.encoded().into());
            current_bytes += len;
            if current.len() >= max_records || current_bytes >= args.batch_bytes {
                flush(&mut current, &mut current_bytes, &mut pool);
            }
        }
    }
    flush(&mut current, &mut current_bytes, &mut pool);
    // Cycle through full requests only, so every request carries as many messages as the first
    // (a short last request would make the message count drift from --rows).
    if pool.len() > 1 {
        let full = pool[0].1;
        pool.retain(|(_, messages, _)| *messages == full);
    }
    Ok(pool)
}

/// Sends requests from `pool` round-robin, `concurrency` at a time on one channel, until
/// `rows` messages have gone.
async fn run_ceiling(
    plan: &Plan,
    pool: Arc<Vec<(Bytes, u64, u64)>>,
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
    let routing: tonic::metadata::AsciiMetadataValue =
        format!("topic={}", topic(plan).replace('/', "%2F"))
            .parse()
            .map_err(|_| gcp_sql::Error::Unsupported("routing header".into()))?;
    let per_request = pool[0].1;
    let requests = plan.rows.div_ceil(per_request);
    let next = Arc::new(AtomicU64::new(0));
    let sent = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
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
                let (body, messages, message_bytes) = &pool[(i as usize) % pool.len()];
                let mut request = tonic::Request::new(PreEncoded(body.clone()));
                request
                    .metadata_mut()
                    .insert("x-goog-request-params", routing.clone());
                grpc.ready()
                    .await
                    .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
                let codec =
                    tonic_prost::ProstCodec::<PreEncoded<Bytes>, PublishResponse>::default();
                let response = grpc
                    .unary(
                        request,
                        http::uri::PathAndQuery::from_static("/google.pubsub.v1.Publisher/Publish"),
                        codec,
                    )
                    .await?;
                if response.get_ref().message_ids.len() as u64 != *messages {
                    return Err(tonic::Status::internal("wrong number of message ids"));
                }
                sent.fetch_add(*messages, Ordering::Relaxed);
                bytes.fetch_add(*message_bytes, Ordering::Relaxed);
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        let status = done.map_err(|e| gcp_sql::Error::Failed(format!("ceiling task: {e}")))?;
        status.map_err(|s| gcp_sql::Error::Failed(format!("ceiling publish: {s}")))?;
    }
    let wall = started.elapsed();
    let after = ResourceUsage::now();
    Ok(Measured {
        what: format!(
            "workload={} target=null path=ceiling concurrency={concurrency}",
            plan.name
        ),
        rows: sent.load(Ordering::Relaxed),
        message_bytes: bytes.load(Ordering::Relaxed),
        wall,
        cpu: after.cpu() - before.cpu(),
        peak_rss: None,
        extra: format!("messages_per_request={per_request}"),
    })
}

/// The null server running as a child process.
struct NullChild {
    child: Child,
    host: String,
    lines: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl NullChild {
    fn start(latency: Duration) -> std::io::Result<NullChild> {
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .arg(CHILD_FLAG)
            .arg(humantime::format_duration(latency).to_string())
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

fn serve_child(latency: &str) -> std::process::ExitCode {
    let Ok(latency) = humantime::parse_duration(latency) else {
        eprintln!("bad latency {latency}");
        return std::process::ExitCode::from(2);
    };
    let Ok(runtime) = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    else {
        return std::process::ExitCode::FAILURE;
    };
    match runtime.block_on(serve_until_signal(0, NullServerOptions { latency }, None)) {
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

async fn bench(args: Args) -> gcp_sql::Result<()> {
    let plan = args.plan();
    println!(
        "# workload={} rows={} row_bytes~{} keys={} latency={:?} sql_batch_rows={:?} batch_count={} batch_bytes={} batch_delay={:?} max_in_flight_messages={} max_in_flight_bytes={}",
        plan.name,
        plan.rows,
        plan.row_bytes,
        plan.keys,
        plan.latency,
        args.sql_batch_rows,
        args.batch_count,
        args.batch_bytes,
        args.batch_delay,
        args.in_flight_messages(),
        args.max_in_flight_bytes
            .map_or("default(64MiB)".to_string(), |b| b.to_string()),
    );
    let target = args.target();
    match target {
        Target::Emulator => {
            let emulator = Emulator::start(EmulatorKind::PubSub).await?;
            create_topic(emulator.host(), &topic(&plan)).await?;
            let measured = run_sink(&args, &plan, emulator.host(), "emulator").await?;
            measured.print();
        }
        Target::Stages => {
            run_stage(&plan, false).await?.print();
            run_stage(&plan, true).await?.print();
        }
        Target::Null | Target::Ceiling | Target::NullAndCeiling => {
            let server = NullChild::start(plan.latency)?;
            let mut sink = None;
            if target != Target::Ceiling {
                let measured = run_sink(&args, &plan, &server.host, "null").await?;
                measured.print();
                sink = Some(measured);
            }
            if target != Target::Null {
                let pool = Arc::new(request_pool(&args, &plan).await?);
                let mut best: Option<Measured> = None;
                for &concurrency in &args.concurrency {
                    let measured =
                        run_ceiling(&plan, pool.clone(), &server.host, concurrency.max(1)).await?;
                    measured.print();
                    if best
                        .as_ref()
                        .is_none_or(|b| measured.rows_per_s() > b.rows_per_s())
                    {
                        best = Some(measured);
                    }
                }
                if let (Some(sink), Some(best)) = (&sink, &best) {
                    println!(
                        "RATIO workload={} sink_rows_per_s={:.0} ceiling_rows_per_s={:.0} ({}) ratio={:.2}",
                        plan.name,
                        sink.rows_per_s(),
                        best.rows_per_s(),
                        best.what,
                        sink.rows_per_s() / best.rows_per_s()
                    );
                }
            }
            match server.stop() {
                Some(total) => println!("NULL-SERVER {total}"),
                None => println!("NULL-SERVER (no totals printed)"),
            }
        }
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let raw: Vec<String> = std::env::args().collect();
    if raw.get(1).map(String::as_str) == Some(CHILD_FLAG) {
        return serve_child(raw.get(2).map_or("0s", String::as_str));
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
