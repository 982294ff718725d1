//! Google's Rust Pub/Sub publisher (`google-cloud-pubsub`) at its defaults, publishing the rows
//! of the W1 workload of `examples/bench.rs` to a null server, and one `RESULT` line in the
//! benchmark's format.
//!
//! ```text
//! gcp-sql-google-publisher --host 127.0.0.1:PORT [--topic T] [--rows N] [--row-bytes B]
//! ```
//!
//! Each row is built as the sink's JSON encoding of the benchmark's SELECT would write it
//! (`{"id":N,"user_id":"user-N","event":"page_view","url":"...","pad":"xxxx"}`), inside the
//! measured time, as an application publishing JSON events would; every message is handed to
//! `Publisher::publish` as it is built and every returned future is awaited. Nothing about the
//! publisher is tuned: batching, retries and concurrency are the crate's defaults.

use std::time::{Duration, Instant};

use google_cloud_pubsub::client::Publisher;
use google_cloud_pubsub::model::Message;

/// JSON bytes of a row besides the padding, for ids of about 6-7 digits (as in examples/bench.rs).
const ROW_OVERHEAD: u64 = 122;

struct Args {
    host: String,
    topic: String,
    rows: u64,
    row_bytes: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        host: String::new(),
        topic: "projects/bench/topics/bench-w1".into(),
        rows: 1_000_000,
        row_bytes: 200,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--host" => args.host = value()?,
            "--topic" => args.topic = value()?,
            "--rows" => args.rows = value()?.parse().map_err(|e| format!("--rows: {e}"))?,
            "--row-bytes" => {
                args.row_bytes = value()?.parse().map_err(|e| format!("--row-bytes: {e}"))?
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.host.is_empty() {
        return Err("--host HOST:PORT is required".into());
    }
    Ok(args)
}

/// User plus system CPU time of this process.
fn cpu_time() -> Duration {
    // SAFETY: `usage` is a plain C struct that getrusage fills; zeroed is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid pointer to a rusage struct.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let time = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// Peak resident set size of this process (`VmHWM`), in MiB.
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

/// Serialized size of a `PubsubMessage` holding only `data` of `len` bytes.
fn message_len(len: usize) -> u64 {
    let prefix = match len {
        0..=0x7f => 1,
        0x80..=0x3fff => 2,
        0x4000..=0x1f_ffff => 3,
        _ => 4,
    };
    (1 + prefix + len) as u64
}

async fn run(args: Args) -> Result<(), String> {
    let publisher = Publisher::builder(args.topic.clone())
        .with_endpoint(format!("http://{}", args.host))
        .with_credentials(google_cloud_auth::credentials::anonymous::Builder::new().build())
        .build()
        .await
        .map_err(|e| format!("cannot build the publisher: {e}"))?;
    let pad = "x".repeat(args.row_bytes.saturating_sub(ROW_OVERHEAD).max(1) as usize);
    let cpu_before = cpu_time();
    let started = Instant::now();
    let mut pending = Vec::with_capacity(args.rows as usize);
    let mut message_bytes = 0u64;
    for id in 1..=args.rows {
        let json = format!(
            r#"{{"id":{id},"user_id":"user-{}","event":"page_view","url":"https://example.com/catalog/item/{id}?ref=bench","pad":"{pad}"}}"#,
            id % 100_000
        );
        message_bytes += message_len(json.len());
        pending.push(publisher.publish(Message::new().set_data(json)));
    }
    let mut acked = 0u64;
    for future in pending {
        future.await.map_err(|e| format!("publish failed: {e}"))?;
        acked += 1;
    }
    let wall = started.elapsed();
    let cpu = cpu_time() - cpu_before;
    let secs = wall.as_secs_f64();
    println!(
        "RESULT workload=w1 target=null path=google-publisher rows={acked} seconds={secs:.3} rows_per_s={:.0} mb_per_s={:.2} cpu_s={:.3} cpu_us_per_row={:.2} peak_rss_mib={} avg_message_bytes={:.1}",
        acked as f64 / secs,
        message_bytes as f64 / 1e6 / secs,
        cpu.as_secs_f64(),
        cpu.as_secs_f64() * 1e6 / acked.max(1) as f64,
        peak_rss_mib().map_or("n/a".to_string(), |m| format!("{m:.1}")),
        message_bytes as f64 / acked.max(1) as f64,
    );
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("Error: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("Error: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
