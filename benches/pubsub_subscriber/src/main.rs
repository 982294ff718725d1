//! Google's Rust Pub/Sub subscriber (`google-cloud-pubsub`) draining a subscription: every
//! message is acknowledged (`Handler::ack`) as it arrives, and the program ends once no message
//! came for `--stop-after-idle`, after the subscriber's own shutdown has sent every pending
//! acknowledgement. One `RESULT` line in the format of the project's benchmarks.
//!
//! ```text
//! gcp-sql-google-subscriber --host 127.0.0.1:PORT --subscription projects/P/subscriptions/S
//!     [--streams N] [--stop-after-idle MS] [--max-outstanding-messages M] [--progress]
//! ```
//!
//! The measured time runs from before the client is built until the last stream's shutdown has
//! completed (every acknowledgement sent and answered), less the idle wait: the same span as
//! the `Elapsed` of a `gcp-sql` `INSERT ... SELECT ... FROM source` with `stop_after_idle`,
//! less its idle wait. `--streams N` opens N message streams on one client, each in its own
//! task (the counterpart of the source's `parallel_pull_count = N`). Nothing else is tuned:
//! flow control (1,000 messages, 100 MiB a stream), leases and acknowledgement batching are
//! the crate's defaults unless `--max-outstanding-messages` says otherwise.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use google_cloud_pubsub::client::Subscriber;

struct Args {
    host: String,
    subscription: String,
    streams: usize,
    idle: Duration,
    max_outstanding_messages: Option<i64>,
    progress: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        host: String::new(),
        subscription: String::new(),
        streams: 1,
        idle: Duration::from_secs(2),
        max_outstanding_messages: None,
        progress: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--host" => args.host = value()?,
            "--subscription" => args.subscription = value()?,
            "--streams" => {
                args.streams = value()?.parse().map_err(|e| format!("--streams: {e}"))?;
                if args.streams == 0 {
                    return Err("--streams must be at least 1".into());
                }
            }
            "--stop-after-idle" => {
                let ms: u64 = value()?
                    .parse()
                    .map_err(|e| format!("--stop-after-idle (milliseconds): {e}"))?;
                args.idle = Duration::from_millis(ms);
            }
            "--max-outstanding-messages" => {
                args.max_outstanding_messages = Some(
                    value()?
                        .parse()
                        .map_err(|e| format!("--max-outstanding-messages: {e}"))?,
                )
            }
            "--progress" => args.progress = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.host.is_empty() || args.subscription.is_empty() {
        return Err(
            "--host HOST:PORT and --subscription projects/P/subscriptions/S are required".into(),
        );
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

/// What the streams counted, shared between their tasks.
#[derive(Default)]
struct Counts {
    messages: AtomicU64,
    data_bytes: AtomicU64,
}

/// Drains one stream: acknowledges each message as it arrives; after `idle` without one, shuts
/// the stream down (which waits for its pending acknowledgements) and returns.
async fn drain(client: Subscriber, args: Arc<Args>, counts: Arc<Counts>) -> Result<(), String> {
    let mut subscribe = client.subscribe(args.subscription.clone());
    if let Some(max) = args.max_outstanding_messages {
        subscribe = subscribe.set_max_outstanding_messages(max);
    }
    let mut stream = subscribe.build();
    let token = stream.shutdown_token();
    loop {
        match tokio::time::timeout(args.idle, stream.next()).await {
            Ok(Some(Ok((message, handler)))) => {
                counts.messages.fetch_add(1, Ordering::Relaxed);
                counts
                    .data_bytes
                    .fetch_add(message.data.len() as u64, Ordering::Relaxed);
                handler.ack();
            }
            Ok(Some(Err(e))) => return Err(format!("the stream failed: {e}")),
            Ok(None) | Err(_) => break,
        }
    }
    token.shutdown().await;
    Ok(())
}

async fn run(args: Args) -> Result<(), String> {
    let args = Arc::new(args);
    let cpu_before = cpu_time();
    let started = Instant::now();
    let client = Subscriber::builder()
        .with_endpoint(format!("http://{}", args.host))
        .with_credentials(google_cloud_auth::credentials::anonymous::Builder::new().build())
        .build()
        .await
        .map_err(|e| format!("cannot build the subscriber: {e}"))?;
    let counts = Arc::new(Counts::default());
    if args.progress {
        // Every 500 ms on stderr: seconds since the start and messages received so far.
        let counts = Arc::clone(&counts);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(500));
            loop {
                every.tick().await;
                eprintln!(
                    "[{:7.1}s] messages={}",
                    started.elapsed().as_secs_f64(),
                    counts.messages.load(Ordering::Relaxed)
                );
            }
        });
    }
    let tasks: Vec<_> = (0..args.streams)
        .map(|_| {
            tokio::spawn(drain(
                client.clone(),
                Arc::clone(&args),
                Arc::clone(&counts),
            ))
        })
        .collect();
    for task in tasks {
        task.await
            .map_err(|e| format!("a stream task panicked: {e}"))??;
    }
    let wall = started.elapsed();
    let cpu = cpu_time() - cpu_before;
    let messages = counts.messages.load(Ordering::Relaxed);
    let data_bytes = counts.data_bytes.load(Ordering::Relaxed);
    let secs = wall.saturating_sub(args.idle).as_secs_f64();
    println!(
        "RESULT path=google-subscriber streams={} messages={messages} seconds={secs:.3} messages_per_s={:.0} mb_per_s={:.2} wall_s={:.3} idle_s={:.3} cpu_s={:.3} cpu_us_per_message={:.2} peak_rss_mib={}",
        args.streams,
        messages as f64 / secs,
        data_bytes as f64 / 1e6 / secs,
        wall.as_secs_f64(),
        args.idle.as_secs_f64(),
        cpu.as_secs_f64(),
        cpu.as_secs_f64() * 1e6 / messages.max(1) as f64,
        peak_rss_mib().map_or("n/a".to_string(), |m| format!("{m:.1}")),
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
