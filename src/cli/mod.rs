//! The `gcp-sql` command-line tool: a DataFusion SQL shell with the Pub/Sub, Cloud Tasks and
//! Bigtable sinks registered, that can also start the local emulators.
//!
//! ```text
//! gcp-sql [OPTIONS]
//!   -f, --file FILE        run the statements of FILE (repeatable)
//!   -c, --command SQL      run SQL (repeatable)
//!       --emulators        start the local emulators and point the sinks at them
//!   -q, --quiet            print only results and errors
//!       --format FORMAT    table (default), csv or json
//! gcp-sql serve-null [--service S] [--port P] [--latency D]   a null Pub/Sub, Bigtable or Cloud Tasks server (see [`serve_null`])
//! ```
//!
//! `-f` and `-c` run in the order they are given on the command line, and the tool stops at the
//! first statement that fails (its error goes to stderr as `Error: ...` and the exit code is 1).
//! With neither, an interactive shell reads statements (history in `$HOME/.gcp_sql_history`).
//! Result rows go to stdout; timing lines, sink summaries, live progress and emulator messages
//! go to stderr, so stdout stays machine-readable with `--format csv|json`.
//!
//! Besides the sinks, every DataFusion source works: `CREATE EXTERNAL TABLE ... STORED AS
//! CSV|PARQUET|JSON|AVRO LOCATION '...'`, and files queried directly (`SELECT * FROM
//! 'data/*.parquet'`), on the local disk or at `gs://`, `s3://` and `http(s)://` URLs (see
//! [`LazyObjectStoreRegistry`]).
//!
//! Exit codes: 0 success, 1 a statement or file failed, 2 bad arguments, 130 interrupted by
//! Ctrl-C. Emulators started with `--emulators` stop when the tool exits, whatever the reason.

mod exec;
mod progress;
pub mod serve_null;
mod shell;
mod stores;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock, mpsc};
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::SessionContext;
use tokio::sync::watch;

use crate::emulators::{Emulator, start_all};
use crate::error::Result;

pub use exec::{PrintOptions, run_sql, run_statement};
pub use progress::SinkCounters;
pub use shell::{HISTORY_FILE, history_path, run_shell};
pub use stores::{LAZY_SCHEMES, LazyObjectStoreRegistry, build_store};

/// Exit code after a Ctrl-C (128 + SIGINT, as shells report it).
pub const EXIT_INTERRUPTED: u8 = 130;

/// How long the runtime is given at exit to finish its tasks; a shell's reader thread blocked
/// on the terminal is abandoned after it.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(200);

/// How long [`Interrupts::install`] waits for its signal thread to be listening.
const SIGNAL_SETUP_TIMEOUT: Duration = Duration::from_secs(5);

/// The format of result rows on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum OutputFormat {
    /// A grid, like `datafusion-cli`.
    #[default]
    Table,
    /// Comma-separated values with a header line.
    Csv,
    /// One JSON array of objects per statement.
    Json,
}

/// The command-line arguments.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "gcp-sql",
    version,
    about = "SQL on Apache DataFusion with Google Cloud Pub/Sub, Cloud Tasks and Bigtable as table sinks",
    after_help = "-f and -c run in the order given; the first failing statement stops the run (exit code 1).\n\
                  With neither, an interactive shell starts (history in $HOME/.gcp_sql_history).",
    args_conflicts_with_subcommands = true
)]
pub struct Args {
    /// A tool other than the SQL shell
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Run the SQL statements in FILE (repeatable)
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Run the SQL statements in SQL (repeatable)
    #[arg(short = 'c', long = "command", value_name = "SQL")]
    pub commands: Vec<String>,
    /// Start the local Pub/Sub, Bigtable and Cloud Tasks emulators, point the sinks at them, and
    /// stop them on exit
    #[arg(long)]
    pub emulators: bool,
    /// Print only results and errors (no timing, summaries, progress or banners)
    #[arg(short, long)]
    pub quiet: bool,
    /// Format of result rows
    #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
    pub format: OutputFormat,
}

/// The subcommands of `gcp-sql`.
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum Command {
    /// Serve a null Pub/Sub, Bigtable or Cloud Tasks endpoint on a loopback port that
    /// acknowledges everything and counts what it receives (the client-side ceiling for
    /// benchmarks)
    ServeNull(serve_null::ServeNullArgs),
}

/// One piece of SQL to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The statements of a file (`-f`).
    File(PathBuf),
    /// Statements given inline (`-c`).
    Command(String),
}

/// What one run of the tool does, from its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// The `-f` and `-c` arguments in command-line order; empty for the interactive shell.
    pub sources: Vec<Source>,
    /// Whether to start the emulators.
    pub emulators: bool,
    /// How results print.
    pub options: PrintOptions,
}

impl Invocation {
    /// Parses the arguments (the first is the program name), keeping `-f` and `-c` in the order
    /// they were given.
    ///
    /// ```
    /// use gcp_sql::cli::{Invocation, Source};
    ///
    /// let run = Invocation::parse_from(["gcp-sql", "-c", "SELECT 1", "-f", "a.sql", "-c", "SELECT 2"]).unwrap();
    /// assert_eq!(
    ///     run.sources,
    ///     vec![
    ///         Source::Command("SELECT 1".into()),
    ///         Source::File("a.sql".into()),
    ///         Source::Command("SELECT 2".into()),
    ///     ]
    /// );
    /// ```
    pub fn parse_from<I, T>(args: I) -> std::result::Result<Invocation, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let matches = Args::command().try_get_matches_from(args)?;
        let args = Args::from_arg_matches(&matches)?;
        let mut ordered: Vec<(usize, Source)> = Vec::new();
        if let Some(indices) = matches.indices_of("files") {
            ordered.extend(indices.zip(args.files.iter().cloned().map(Source::File)));
        }
        if let Some(indices) = matches.indices_of("commands") {
            ordered.extend(indices.zip(args.commands.iter().cloned().map(Source::Command)));
        }
        ordered.sort_by_key(|(index, _)| *index);
        Ok(Invocation {
            sources: ordered.into_iter().map(|(_, source)| source).collect(),
            emulators: args.emulators,
            options: PrintOptions {
                format: args.format,
                quiet: args.quiet,
            },
        })
    }
}

/// Ctrl-C presses, counted for the whole process by one signal thread, so that a press is
/// never lost between two phases of the run (emulator start-up, statements, the shell).
#[derive(Debug, Clone)]
pub struct Interrupts {
    presses: watch::Receiver<u64>,
}

impl Interrupts {
    /// Starts listening for SIGINT (once per process) and returns a listener that sees every
    /// press from now on. Once installed, Ctrl-C no longer ends the process by itself: the
    /// tool decides what it cancels.
    pub fn install() -> Interrupts {
        static PRESSES: OnceLock<watch::Sender<u64>> = OnceLock::new();
        let sender = PRESSES.get_or_init(|| {
            let (sender, _) = watch::channel(0u64);
            let counter = sender.clone();
            let (ready, listening) = mpsc::channel::<()>();
            let spawned = std::thread::Builder::new()
                .name("gcp-sql-signals".into())
                .spawn(move || {
                    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    else {
                        return;
                    };
                    runtime.block_on(async move {
                        use tokio::signal::unix::{SignalKind, signal};
                        let Ok(mut sigint) = signal(SignalKind::interrupt()) else {
                            return;
                        };
                        let _ = ready.send(());
                        while sigint.recv().await.is_some() {
                            counter.send_modify(|presses| *presses += 1);
                        }
                    });
                });
            if spawned.is_ok() {
                // Without the handler Ctrl-C keeps its default effect, which is still safe:
                // the emulators die with the process.
                let _ = listening.recv_timeout(SIGNAL_SETUP_TIMEOUT);
            }
            sender
        });
        Interrupts {
            presses: sender.subscribe(),
        }
    }

    /// Waits for the next Ctrl-C; one pressed since the last call returns at once.
    pub async fn next(&mut self) {
        if self.presses.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// The session the tool runs statements in: [`crate::sql::new_state_builder`] (DataFusion's
/// defaults and the three sink factories), the emulator inspection functions
/// ([`crate::sql::register_inspection`]: `pubsub_subscribe`, `pubsub_pull`), the
/// [`LazyObjectStoreRegistry`], and direct file queries (`SELECT * FROM 'file.parquet'`).
pub fn new_session() -> Result<SessionContext> {
    let runtime = RuntimeEnvBuilder::new()
        .with_object_store_registry(Arc::new(LazyObjectStoreRegistry::new()))
        .build_arc()?;
    let state = crate::sql::new_state_builder()
        .with_runtime_env(runtime)
        .build();
    let ctx = SessionContext::new_with_state(state).enable_url_table();
    crate::sql::register_inspection(&ctx);
    Ok(ctx)
}

/// The tool's entry point: parses the process arguments and runs.
pub fn main() -> ExitCode {
    if let Ok(Args {
        command: Some(Command::ServeNull(args)),
        ..
    }) = Args::try_parse_from(std::env::args_os())
    {
        return serve_null::run(&args);
    }
    let invocation = match Invocation::parse_from(std::env::args_os()) {
        Ok(invocation) => invocation,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    init_tracing();
    run(invocation)
}

/// `RUST_LOG` selects log output on stderr (default: warnings).
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Runs one invocation and returns the process exit code. Emulators it started are stopped
/// before it returns.
pub fn run(invocation: Invocation) -> ExitCode {
    crate::connectors::install_crypto_provider();
    let mut interrupts = Interrupts::install();
    let quiet = invocation.options.quiet;
    let emulators = if invocation.emulators {
        match start_emulators(quiet, &mut interrupts) {
            Ok(emulators) => emulators,
            Err(code) => return code,
        }
    } else {
        Vec::new()
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("Error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(run_session(&invocation, &mut interrupts));
    runtime.shutdown_timeout(SHUTDOWN_GRACE);
    if !emulators.is_empty() {
        let names: Vec<&str> = emulators.iter().map(|e| e.kind().name()).collect();
        drop(emulators);
        if !quiet {
            eprintln!("Stopped the {} emulator(s).", names.join(", "));
        }
    }
    code
}

/// Starts the emulators (all it can, concurrently), reports them, and exports their addresses.
fn start_emulators(
    quiet: bool,
    interrupts: &mut Interrupts,
) -> std::result::Result<Vec<Emulator>, ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("Error: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        })?;
    if !quiet {
        eprintln!("Starting the emulators...");
    }
    let outcome = runtime.block_on(async {
        tokio::select! {
            outcome = start_all() => Some(outcome),
            _ = interrupts.next() => None,
        }
    });
    drop(runtime);
    let Some((started, failed)) = outcome else {
        eprintln!("Interrupted while starting the emulators.");
        return Err(ExitCode::from(EXIT_INTERRUPTED));
    };
    for emulator in &started {
        if !quiet {
            eprintln!(
                "Started the {} emulator at {} ({}={})",
                emulator.kind().name(),
                emulator.host(),
                emulator.env_var(),
                emulator.host()
            );
        }
        // SAFETY: no other thread reads or writes the environment now. The start-up runtime
        // is gone, the main runtime is not built yet, and the only other threads are the
        // emulator spawner (idle; it reads the environment only while spawning, which is
        // over) and the signal thread (waiting for a signal).
        unsafe { std::env::set_var(emulator.env_var(), emulator.host()) };
    }
    for (kind, error) in &failed {
        eprintln!("Could not start the {kind} emulator: {error}");
    }
    Ok(started)
}

async fn run_session(invocation: &Invocation, interrupts: &mut Interrupts) -> ExitCode {
    let ctx = match new_session() {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("Error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if invocation.sources.is_empty() {
        return run_shell(&ctx, invocation.options, interrupts).await;
    }
    tokio::select! {
        code = run_sources(&ctx, &invocation.sources, invocation.options) => code,
        _ = interrupts.next() => {
            eprintln!("Interrupted.");
            ExitCode::from(EXIT_INTERRUPTED)
        }
    }
}

/// Runs every source in order; stops at the first failure, printing `Error: ...` on stderr.
async fn run_sources(ctx: &SessionContext, sources: &[Source], options: PrintOptions) -> ExitCode {
    for source in sources {
        let outcome = match source {
            Source::File(path) => match tokio::fs::read_to_string(path).await {
                Ok(sql) => run_sql(ctx, &sql, options).await,
                Err(e) => {
                    eprintln!("Error: cannot read {}: {e}", path.display());
                    return ExitCode::FAILURE;
                }
            },
            Source::Command(sql) => run_sql(ctx, sql, options).await,
        };
        if let Err(e) = outcome {
            eprintln!("Error: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_and_commands_keep_command_line_order() {
        let run = Invocation::parse_from([
            "gcp-sql", "-f", "one.sql", "-c", "SELECT 1", "--file", "two.sql",
        ])
        .unwrap();
        assert_eq!(
            run.sources,
            vec![
                Source::File("one.sql".into()),
                Source::Command("SELECT 1".into()),
                Source::File("two.sql".into()),
            ]
        );
        assert!(!run.emulators);
    }

    #[test]
    fn no_sources_means_the_shell_with_table_output() {
        let run = Invocation::parse_from(["gcp-sql", "--emulators"]).unwrap();
        assert!(run.sources.is_empty());
        assert!(run.emulators);
        assert_eq!(
            run.options,
            PrintOptions {
                format: OutputFormat::Table,
                quiet: false
            }
        );
    }

    #[test]
    fn format_and_quiet_are_parsed() {
        let run = Invocation::parse_from(["gcp-sql", "-q", "--format", "json", "-c", "SELECT 1"])
            .unwrap();
        assert_eq!(
            run.options,
            PrintOptions {
                format: OutputFormat::Json,
                quiet: true
            }
        );
    }

    #[test]
    fn unknown_format_is_refused() {
        let err = Invocation::parse_from(["gcp-sql", "--format", "xml"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("xml"), "{err}");
    }

    #[test]
    fn file_option_needs_a_value() {
        assert!(Invocation::parse_from(["gcp-sql", "-f"]).is_err());
    }
}
