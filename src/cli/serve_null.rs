//! `gcp-sql serve-null`: a null server for one sink's service as its own process.
//!
//! ```text
//! gcp-sql serve-null [--service S] [--port P] [--latency D] [--report-interval D]
//! ```
//!
//! `S` is one of the registry's null services (`connectors::registry::null_services`: `pubsub`,
//! the default, `pubsub-subscribe`, `cloud-tasks`, `bigtable`, `bigtable-read`). It listens on `127.0.0.1:P`
//! (loopback only), acknowledges every request of the service's one method (`Publish`,
//! `CreateTask`, `MutateRows`) at once or after `--latency`, and prints what it receives; see
//! [`crate::bench::null_server`]. Point a table of that connector at it with
//! `emulator_host = '127.0.0.1:P'` to see how fast this machine can produce acknowledged writes
//! when the service costs nothing: the client-side ceiling. Ctrl-C (or SIGTERM) stops it after
//! a final `total:` line.
//!
//! `pubsub-subscribe` is the reading side: every subscription name a reader asks for gets a
//! backlog of `--messages` messages of `--message-size` bytes, streamed over StreamingPull as
//! fast as the reader's flow control allows, with the service's leases (`--max-ack-deadline`
//! shortens them), nacks and ordering keys (`--ordering-keys`); its figures count
//! acknowledgements, and its `total:` line adds the deliveries, redeliveries and lapsed leases
//! (the Pub/Sub connector's `null_subscribe`).
//!
//! `bigtable-read` is Bigtable's reading side: every table name holds the same `--rows` rows
//! (key `user-0000000`…, cells `cf:name` and `cf:visits`), which `ReadRows` streams by the
//! request's keys and ranges and `SampleRowKeys` samples; its figures count the rows sent
//! (the Bigtable connector's `null_read`).

use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::bench::ResourceUsage;
use crate::bench::null_method::MIN_MESSAGE_SIZE;
use crate::bench::null_server::{
    FeedOptions, NullServer, NullServerOptions, NullService, NullTotals, format_totals,
};
use crate::connectors::registry;

/// Arguments of `gcp-sql serve-null`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct ServeNullArgs {
    /// The service to stand in for; the help shows [`service_help`], derived from the
    /// registry's null services (the first is the default)
    #[arg(long, value_parser = parse_service, default_value_t = default_service(), help = service_help())]
    pub service: NullService,
    /// Loopback port to listen on; 0 picks a free port (printed at start)
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// How long each request waits before it is answered, e.g. 50ms (0s: at once)
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    pub latency: Duration,
    /// How often to print the rates of the last interval (0s: only the final totals)
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    pub report_interval: Duration,
    /// pubsub-subscribe: messages in each subscription's backlog (every subscription name
    /// asked for gets its own); bigtable-read: rows in every table (--rows)
    #[arg(long, visible_alias = "rows", default_value_t = FeedOptions::default().messages)]
    pub messages: u64,
    /// pubsub-subscribe: data bytes of each message (a JSON object {"id":N,"body":"xx..."}
    /// padded to this size; at least 38)
    #[arg(long, value_parser = parse_message_size, default_value_t = FeedOptions::default().message_size)]
    pub message_size: usize,
    /// pubsub-subscribe: ordering keys the messages cycle through (0: none, the subscription
    /// is not ordered)
    #[arg(long, default_value_t = 0)]
    pub ordering_keys: u32,
    /// pubsub-subscribe: the longest lease granted, whatever the client asks, e.g. 2s (a
    /// test knob: a killed reader's messages come back this soon; default: as asked)
    #[arg(long, value_parser = humantime::parse_duration)]
    pub max_ack_deadline: Option<Duration>,
    /// pubsub-subscribe: message n's publish time is the server's start plus n times this,
    /// e.g. 1ms (default: every message has the start), so windows over the publish time
    /// close as a reader goes through the backlog
    #[arg(long, value_parser = humantime::parse_duration)]
    pub publish_time_step: Option<Duration>,
    /// pubsub-subscribe: a fault: the first lease of every n-th message is lost after 50 ms
    /// whatever the client extends it to, so the message is delivered again while the client
    /// still has it (Pub/Sub's at-least-once duplicate; at least 1; default: none lost)
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub lose_lease_every: Option<u64>,
}

/// Reads `--message-size`: a number of bytes, at least the JSON object's length.
fn parse_message_size(text: &str) -> Result<usize, String> {
    let size: usize = text
        .parse()
        .map_err(|e| format!("expected a number of bytes: {e}"))?;
    if size < MIN_MESSAGE_SIZE {
        return Err(format!(
            "at least {MIN_MESSAGE_SIZE} bytes (the JSON object {{\"id\":N,\"body\":\"\"}} with the longest N)"
        ));
    }
    Ok(size)
}

impl ServeNullArgs {
    /// What `--service pubsub-subscribe` hands out.
    pub fn feed(&self) -> FeedOptions {
        FeedOptions {
            messages: self.messages,
            message_size: self.message_size,
            ordering_keys: self.ordering_keys,
            max_ack_deadline: self.max_ack_deadline,
            payload: None,
            publish_time_step: self.publish_time_step,
            lose_lease_every: self.lose_lease_every,
        }
    }
}

/// The default of `--service`: the registry's first null service (Pub/Sub's).
fn default_service() -> NullService {
    registry::null_services()
        .next()
        .expect("the registry lists a null service")
}

/// The help of `--service`: each of the registry's null services by its word and the method it
/// answers (`The service to stand in for: pubsub (Publish), cloud-tasks (CreateTask) or
/// bigtable (MutateRows)`).
fn service_help() -> String {
    let words: Vec<String> = registry::null_services()
        .map(|s| {
            let method = s.method_path().rsplit('/').next().unwrap_or_default();
            format!("{} ({method})", s.name())
        })
        .collect();
    match words.split_last() {
        Some((last, rest)) if !rest.is_empty() => {
            format!("The service to stand in for: {} or {last}", rest.join(", "))
        }
        _ => format!("The service to stand in for: {}", words.concat()),
    }
}

/// Reads `--service`: one of [`NullService::name`]'s words.
fn parse_service(word: &str) -> Result<NullService, String> {
    registry::null_service_named(word).ok_or_else(|| {
        let names: Vec<&str> = registry::null_services().map(|s| s.name()).collect();
        format!("expected one of {}", names.join(", "))
    })
}

/// Runs a null server on `127.0.0.1:port` (0: a free port) until SIGINT or SIGTERM, printing to
/// stdout: first `listening on 127.0.0.1:PORT (service ...)`, then every `report_every` (when something
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
    let server = NullServer::start(
        SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        options.clone(),
    )
    .await?;
    let say = |line: String| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };
    say(format!(
        "listening on {} (service {}, {}, latency {:?}); stop with Ctrl-C",
        server.addr(),
        options.service,
        options.service.method_path(),
        options.latency
    ));
    let start = Instant::now();
    let (mut last, mut last_at) = (NullTotals::default(), start);
    // A period of zero would spin; reports then stay off.
    let mut ticker = report_every
        .filter(|d| !d.is_zero())
        .map(|d| tokio::time::interval_at(tokio::time::Instant::now() + d, d));
    loop {
        let tick = crate::core::run::next_tick(&mut ticker);
        tokio::select! {
            _ = interrupt.recv() => break,
            _ = terminate.recv() => break,
            _ = tick => {
                let now = server.totals();
                if now != last {
                    let at = Instant::now();
                    say(format!(
                        "[{:>8.1}s] interval: {} | total records={} record_bytes={}",
                        (at - start).as_secs_f64(),
                        format_totals(&now.since(&last), at - last_at),
                        now.records,
                        now.record_bytes,
                    ));
                    (last, last_at) = (now, at);
                }
            }
        }
    }
    let totals = server.totals();
    let window = server.active_window().unwrap_or_default();
    let usage = ResourceUsage::now();
    let details = server
        .details()
        .map(|d| format!(" {}", d.report()))
        .unwrap_or_default();
    say(format!(
        "total: {} cpu_s={:.3} max_rss_mb={:.1}{details}",
        format_totals(&totals, window),
        usage.cpu().as_secs_f64(),
        usage.max_rss_bytes as f64 / (1024.0 * 1024.0),
    ));
    Ok(totals)
}

/// Runs the server until SIGINT/SIGTERM; exit code 0, or 1 when it cannot start (port taken).
pub fn run(args: &ServeNullArgs) -> ExitCode {
    let Some(runtime) = super::new_runtime() else {
        return ExitCode::FAILURE;
    };
    let options = NullServerOptions {
        latency: args.latency,
        service: args.service,
        feed: args.feed(),
    };
    let report = Some(args.report_interval).filter(|d| !d.is_zero());
    match runtime.block_on(serve_until_signal(args.port, options, report)) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: cannot serve on 127.0.0.1:{}: {e}", args.port);
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::cli::{Args, Command};
    use crate::test_util::assert_contains_all;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("gcp-sql").chain(args.iter().copied()))
    }

    #[test]
    fn serve_null_takes_port_and_latency_with_units() {
        let args = parse(&["serve-null", "--port", "9000", "--latency", "50ms"]).unwrap();
        assert_eq!(
            args.command,
            Some(Command::ServeNull(ServeNullArgs {
                service: NullService::PubSub,
                port: 9000,
                latency: Duration::from_millis(50),
                report_interval: Duration::from_secs(1),
                messages: 100_000,
                message_size: 200,
                ordering_keys: 0,
                max_ack_deadline: None,
                publish_time_step: None,
                lose_lease_every: None,
            }))
        );
    }

    #[test]
    fn serve_null_defaults_to_a_free_port_and_no_latency() {
        let Some(Command::ServeNull(args)) = parse(&["serve-null"]).unwrap().command else {
            panic!("serve-null not parsed");
        };
        assert_eq!(
            (args.port, args.latency, args.service),
            (0, Duration::ZERO, NullService::PubSub)
        );
    }

    #[test]
    fn serve_null_takes_each_service_by_name() {
        for service in registry::null_services() {
            let Some(Command::ServeNull(args)) =
                parse(&["serve-null", "--service", service.name()])
                    .unwrap()
                    .command
            else {
                panic!("serve-null not parsed");
            };
            assert_eq!(args.service, service);
        }
    }

    #[test]
    fn serve_null_rejects_an_unknown_service_naming_the_choices() {
        let err = parse(&["serve-null", "--service", "spanner"]).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("pubsub, pubsub-subscribe, cloud-tasks, bigtable, bigtable-read"),
            "{text}"
        );
    }

    #[test]
    fn the_service_help_names_each_service_and_its_method() {
        assert_eq!(
            service_help(),
            "The service to stand in for: pubsub (Publish), pubsub-subscribe (StreamingPull), cloud-tasks (CreateTask), bigtable (MutateRows) or bigtable-read (ReadRows)"
        );
        let help = <Args as clap::CommandFactory>::command()
            .find_subcommand_mut("serve-null")
            .expect("serve-null is a subcommand")
            .render_help()
            .to_string();
        assert_contains_all(&help, &["pubsub (Publish)", "[default: pubsub]"]);
    }

    #[test]
    fn the_subscription_server_takes_its_backlog_and_refuses_a_message_too_small() {
        let Some(Command::ServeNull(args)) = parse(&[
            "serve-null",
            "--service",
            "pubsub-subscribe",
            "--messages",
            "5000",
            "--message-size",
            "1000",
            "--ordering-keys",
            "8",
            "--max-ack-deadline",
            "2s",
            "--publish-time-step",
            "1ms",
            "--lose-lease-every",
            "100",
        ])
        .unwrap()
        .command
        else {
            panic!("serve-null not parsed");
        };
        assert_eq!(args.service, NullService::PubSubSubscribe);
        assert_eq!(
            args.feed(),
            FeedOptions {
                messages: 5000,
                message_size: 1000,
                ordering_keys: 8,
                max_ack_deadline: Some(Duration::from_secs(2)),
                payload: None,
                publish_time_step: Some(Duration::from_millis(1)),
                lose_lease_every: Some(100),
            }
        );
        let err = parse(&["serve-null", "--message-size", "37"]).unwrap_err();
        assert_contains_all(&err.to_string(), &["--message-size", "at least 38 bytes"]);
        // Every 0th message is no message: refused rather than read as "none lost".
        let err = parse(&["serve-null", "--lose-lease-every", "0"]).unwrap_err();
        assert_contains_all(&err.to_string(), &["--lose-lease-every", "0"]);
    }

    #[test]
    fn serve_null_rejects_a_latency_without_unit() {
        let err = parse(&["serve-null", "--latency", "50"]).unwrap_err();
        assert!(err.to_string().contains("latency"), "{err}");
    }

    #[test]
    fn serve_null_does_not_mix_with_shell_flags() {
        assert!(parse(&["-c", "SELECT 1", "serve-null"]).is_err());
    }

    #[test]
    fn shell_flags_still_parse_without_a_subcommand() {
        let args = parse(&["-q", "-c", "SELECT 1"]).unwrap();
        assert_eq!(args.command, None);
        assert_eq!(args.commands, vec!["SELECT 1".to_string()]);
    }
}
