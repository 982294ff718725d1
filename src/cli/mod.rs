//! The `gcp-sql` command-line tool: a DataFusion SQL shell with the Pub/Sub, Cloud Tasks and
//! Bigtable sinks registered, that can also start the local emulators.
//!
//! ```text
//! gcp-sql [OPTIONS]
//!   -f, --file FILE        run the statements of FILE (repeatable)
//!   -c, --command SQL      run SQL (repeatable)
//!       --emulators        start the local emulators and point the sinks at them
//!   -q, --quiet            print only results and errors
//!       --format FORMAT    table (default), automatic (as table), csv, tsv, json or ndjson (nd-json)
//!       --maxrows N|inf    rows the table format prints (default 40, as datafusion-cli)
//!       --metrics-addr HOST:PORT   serve /metrics, /healthz and /readyz there ([`crate::ops`])
//! gcp-sql serve-null [--service S] [--port P] [--latency D]   a null Pub/Sub, Bigtable or Cloud Tasks server (see [`serve_null`])
//! gcp-sql emulators    start the three emulators, print their `export` lines, keep them up until Ctrl-C
//! gcp-sql scheduler | executor [...]   a Ballista cluster of this crate (feature `ballista`, docs/cluster.md)
//!       --cluster df://HOST:PORT       run the statements on it (feature `ballista`)
//! ```
//!
//! Besides SQL, the shell and `-f` / `-c` sources read backslash commands, one per line where a
//! statement may start: `\d` lists the tables with their kind (the connector of a sink, else
//! the table type), `\d NAME` describes one (columns; for a sink its connector, destination
//! and every option in force with its default), `\format FORMAT` changes the result format,
//! `\?` lists the commands and `\q` stops. The session has `information_schema` on, as in
//! datafusion-cli, so `SHOW TABLES` and `SHOW COLUMNS FROM t` work without a `SET`.
//!
//! Log lines (`RUST_LOG`, default warnings) go to stderr, in colour only when stderr is a
//! terminal and `NO_COLOR` is unset or empty.
//!
//! `-f` and `-c` run in the order they are given on the command line, and the tool stops at the
//! first statement that fails (its error goes to stderr as `Error: ...` and the exit code is 1).
//! With neither, an interactive shell reads statements (history in `$HOME/.gcp_sql_history`).
//! Result rows go to stdout; timing lines, sink summaries, live progress and emulator messages
//! go to stderr, so stdout stays machine-readable with `--format csv|json|ndjson`.
//!
//! Besides the sinks, every DataFusion source works: `CREATE EXTERNAL TABLE ... STORED AS
//! CSV|PARQUET|JSON|AVRO LOCATION '...'`, and files queried directly (`SELECT * FROM
//! 'data/*.parquet'`), on the local disk or at `gs://`, `s3://` and `http(s)://` URLs (see
//! [`LazyObjectStoreRegistry`]).
//!
//! Exit codes: 0 success (also after a graceful stop that delivered every row read), 1 a
//! statement or file failed (a stop that left rows undelivered included), 2 bad arguments, 130
//! interrupted or aborted by Ctrl-C, 143 by SIGTERM. While an `INSERT` into a sink runs, the
//! first Ctrl-C or SIGTERM stops it gracefully (no more input is read; what was read is
//! delivered within `shutdown_timeout`) and a second one aborts it. Emulators started with
//! `--emulators` stop when the tool exits, whatever the reason (short of SIGKILL, where the
//! kernel stops them).

#[cfg(feature = "ballista")]
pub mod cluster;
mod commands;
mod exec;
mod progress;
pub mod serve_null;
mod shell;
mod stores;

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock, mpsc};
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use tokio::sync::watch;

use crate::core::StopKind;
use crate::emulators::{Emulator, start_all};
use crate::error::Result;
use crate::sql::StatementControl;

use commands::Flow;
use exec::run_script;
pub use exec::{PrintOptions, run_sql, run_statement};
pub use progress::SinkCounters;
pub use shell::{HISTORY_FILE, history_path, run_shell};
pub use stores::{LAZY_SCHEMES, LazyObjectStoreRegistry, build_store};

/// Exit code after a Ctrl-C (128 + SIGINT, as shells report it).
pub const EXIT_INTERRUPTED: u8 = 130;

/// Exit code after a SIGTERM (128 + SIGTERM).
pub const EXIT_TERMINATED: u8 = 143;

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
    /// One JSON object per row and line (newline-delimited JSON); `nd-json` is
    /// datafusion-cli's name for it.
    #[value(alias = "nd-json")]
    Ndjson,
    /// Tab-separated values with a header line.
    Tsv,
    /// datafusion-cli's default name: the grid of `table`.
    Automatic,
}

/// How many rows the table format prints (`--maxrows`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxRows {
    /// Every row.
    Unlimited,
    /// At most this many rows; the statement's line on stderr says how many there were.
    Limited(usize),
}

impl Default for MaxRows {
    /// datafusion-cli's default: 40 rows.
    fn default() -> Self {
        MaxRows::Limited(DEFAULT_MAXROWS)
    }
}

/// The default of `--maxrows`, as in datafusion-cli.
pub const DEFAULT_MAXROWS: usize = 40;

/// Reads `--maxrows`: a count, or `inf` / `infinite` / `none` for every row.
fn parse_maxrows(word: &str) -> std::result::Result<MaxRows, String> {
    match word.to_ascii_lowercase().as_str() {
        "inf" | "infinite" | "none" => Ok(MaxRows::Unlimited),
        other => other
            .parse::<usize>()
            .map(MaxRows::Limited)
            .map_err(|_| format!("expected a number of rows or 'inf', found '{word}'")),
    }
}

/// Reads `--metrics-addr` (see [`crate::ops::parse_address`]).
fn parse_metrics_addr(word: &str) -> std::result::Result<std::net::SocketAddr, String> {
    crate::ops::parse_address(word, "--metrics-addr").map_err(|e| match e {
        crate::Error::InvalidOption { rule, .. } => rule,
        other => other.to_string(),
    })
}

/// The command-line arguments.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "gcp-sql",
    version,
    about = "SQL on Apache DataFusion with Google Cloud Pub/Sub, Cloud Tasks and Bigtable as table sinks",
    after_help = "-f and -c run in the order given; the first failing statement stops the run (exit code 1).\n\
                  With neither, an interactive shell starts (history in $HOME/.gcp_sql_history).\n\
                  Commands, in the shell and in -f/-c, one per line: \\d (tables), \\d NAME (columns, and a sink's\n\
                  connector, destination and options in force), \\format FORMAT, \\? (help), \\q (stop).\n\
                  SHOW TABLES and SHOW COLUMNS FROM t work as in datafusion-cli (information_schema is on).\n\
                  Logs (RUST_LOG, default warn) go to stderr, in colour only on a terminal without NO_COLOR.",
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
    /// Format of result rows on stdout: a grid, CSV with a header line, one JSON array per
    /// statement, or one JSON object per line
    #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
    pub format: OutputFormat,
    /// Most rows the table format prints per statement (the others are counted); `inf` prints
    /// every row. As in datafusion-cli
    #[arg(long, value_name = "N|inf", value_parser = parse_maxrows, default_value = "40")]
    pub maxrows: MaxRows,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics, and /healthz and /readyz, while
    /// the tool runs (port 0 picks a free one, printed on stderr)
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_metrics_addr)]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Run the statements on the Ballista cluster whose scheduler is at df://HOST:PORT (a
    /// `gcp-sql scheduler` with `gcp-sql executor`s; docs/cluster.md)
    #[cfg(feature = "ballista")]
    #[arg(long, value_name = "df://HOST:PORT")]
    pub cluster: Option<String>,
}

/// The subcommands of `gcp-sql`.
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum Command {
    /// Serve a null Pub/Sub, Bigtable or Cloud Tasks endpoint on a loopback port that
    /// acknowledges everything and counts what it receives (the client-side ceiling for
    /// benchmarks)
    ServeNull(serve_null::ServeNullArgs),
    /// Start the local Pub/Sub, Bigtable and Cloud Tasks emulators, print the `export` lines
    /// that point clients at them (stdout), and keep them running until Ctrl-C or SIGTERM
    Emulators,
    /// Run a Ballista scheduler that carries this crate's sinks (feature `ballista`)
    #[cfg(feature = "ballista")]
    Scheduler(cluster::SchedulerArgs),
    /// Run a Ballista executor that runs this crate's sink tasks (feature `ballista`)
    #[cfg(feature = "ballista")]
    Executor(cluster::ExecutorArgs),
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
    /// The cluster's scheduler (`df://HOST:PORT`) the statements run on; `None`: in this
    /// process.
    pub cluster: Option<String>,
    /// Where to serve `/metrics`, `/healthz` and `/readyz` (`--metrics-addr`); `None`: nowhere.
    pub metrics_addr: Option<std::net::SocketAddr>,
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
                maxrows: args.maxrows,
            },
            #[cfg(feature = "ballista")]
            cluster: args.cluster,
            #[cfg(not(feature = "ballista"))]
            cluster: None,
            metrics_addr: args.metrics_addr,
        })
    }
}

/// Which signal asked the tool to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignalKind {
    /// SIGINT (Ctrl-C).
    Interrupt,
    /// SIGTERM (a service manager stopping the tool).
    Terminate,
}

impl StopSignalKind {
    /// The exit code of a run this signal ended: 128 + the signal number, as shells report it.
    pub fn exit_code(self) -> u8 {
        match self {
            StopSignalKind::Interrupt => EXIT_INTERRUPTED,
            StopSignalKind::Terminate => EXIT_TERMINATED,
        }
    }

    /// How the tool names it to the user.
    pub fn name(self) -> &'static str {
        match self {
            StopSignalKind::Interrupt => "Ctrl-C",
            StopSignalKind::Terminate => "SIGTERM",
        }
    }
}

/// SIGINT and SIGTERM, counted for the whole process by one signal thread, so that a signal
/// is never lost between two phases of the run (emulator start-up, statements, the shell).
#[derive(Debug, Clone)]
pub struct Interrupts {
    presses: watch::Receiver<(u64, Option<StopSignalKind>)>,
}

impl Interrupts {
    /// Starts listening for SIGINT and SIGTERM (once per process) and returns a listener that
    /// sees every signal from now on. Once installed, neither ends the process by itself: the
    /// tool decides what it stops.
    pub fn install() -> Interrupts {
        type Presses = (u64, Option<StopSignalKind>);
        static PRESSES: OnceLock<watch::Sender<Presses>> = OnceLock::new();
        let sender = PRESSES.get_or_init(|| {
            let (sender, _) = watch::channel((0u64, None));
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
                        let Ok(mut sigterm) = signal(SignalKind::terminate()) else {
                            return;
                        };
                        let _ = ready.send(());
                        loop {
                            let kind = tokio::select! {
                                got = sigint.recv() => got.map(|()| StopSignalKind::Interrupt),
                                got = sigterm.recv() => got.map(|()| StopSignalKind::Terminate),
                            };
                            let Some(kind) = kind else { return };
                            counter.send_modify(|(presses, last)| {
                                *presses += 1;
                                *last = Some(kind);
                            });
                        }
                    });
                });
            if spawned.is_ok() {
                // Without the handlers the signals keep their default effect, which is still
                // safe: the emulators die with the process.
                let _ = listening.recv_timeout(SIGNAL_SETUP_TIMEOUT);
            }
            sender
        });
        Interrupts {
            presses: sender.subscribe(),
        }
    }

    /// Waits for the next SIGINT or SIGTERM and says which; one received since the last call
    /// returns at once.
    pub async fn next(&mut self) -> StopSignalKind {
        if self.presses.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        self.presses
            .borrow_and_update()
            .1
            .unwrap_or(StopSignalKind::Interrupt)
    }
}

/// The session the tool runs statements in: [`crate::sql::new_state_builder`] (DataFusion's
/// defaults and the three sink factories) with `information_schema` on (as in datafusion-cli,
/// so that `SHOW TABLES` and `SHOW COLUMNS FROM t` work), the emulator inspection functions
/// ([`crate::sql::register_inspection`]: `pubsub_subscribe`, `pubsub_pull`, the snapshot
/// functions, `bigtable_read`, `cloud_tasks_create_queue`, `cloud_tasks_list`), the
/// [`LazyObjectStoreRegistry`], and direct file queries (`SELECT * FROM 'file.parquet'`).
pub fn new_session() -> Result<SessionContext> {
    new_session_with_control(&StatementControl::new())
}

/// [`new_session`] whose sink statements obey `control` (the tool's stop requests and its
/// flush-point reporting).
pub fn new_session_with_control(control: &StatementControl) -> Result<SessionContext> {
    let ctx = SessionContext::new_with_state(session_state(control)?).enable_url_table();
    crate::sql::register_inspection(&ctx);
    Ok(ctx)
}

/// The state of [`new_session_with_control`], before the context around it enables direct
/// file queries and the inspection functions.
fn session_state(
    control: &StatementControl,
) -> Result<datafusion::execution::session_state::SessionState> {
    let runtime = RuntimeEnvBuilder::new()
        .with_object_store_registry(Arc::new(LazyObjectStoreRegistry::new()))
        .build_arc()?;
    // As in datafusion-cli: `SHOW TABLES` and `SHOW COLUMNS FROM t` work without a `SET`.
    let config = control.install(SessionConfig::new().with_information_schema(true));
    Ok(crate::sql::new_state_builder()
        .with_config(config)
        .with_runtime_env(runtime)
        .build())
}

/// The tool's entry point: parses the process arguments and runs.
pub fn main() -> ExitCode {
    if let Ok(Args {
        command: Some(command),
        ..
    }) = Args::try_parse_from(std::env::args_os())
    {
        return match command {
            Command::ServeNull(args) => serve_null::run(&args),
            Command::Emulators => run_emulators(),
            #[cfg(feature = "ballista")]
            Command::Scheduler(args) => cluster::run_scheduler(&args),
            #[cfg(feature = "ballista")]
            Command::Executor(args) => cluster::run_executor(&args),
        };
    }
    let invocation = match Invocation::parse_from(std::env::args_os()) {
        Ok(invocation) => invocation,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    restore_sigpipe();
    // Warnings by default.
    init_tracing("warn");
    run(invocation)
}

/// Gives SIGPIPE back its default action, as in C tools: output into a pipe whose reader went
/// away (`gcp-sql ... | head -1`, `2>&1 | head -3`) ends the process quietly, the way `cat`
/// ends, instead of a panic in a print (exit 101) or an `Error: Broken pipe`. Rust's runtime
/// ignores the signal, which turns every such write into an error. Emulators started with
/// `--emulators` still stop with the process (the kernel kills them when it dies).
fn restore_sigpipe() {
    // SAFETY: setting a signal's disposition to its default has no preconditions; no handler
    // of ours is involved.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// `RUST_LOG` selects log output on stderr (default: `default_level`), in colour only on a
/// terminal and without `NO_COLOR` (see [`log_colours`]).
fn init_tracing(default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let colours = log_colours(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colours)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Whether log lines carry ANSI colour codes: only when stderr is a terminal and `NO_COLOR`
/// is unset or empty (the convention of no-color.org). A file or a pipe gets plain text.
pub fn log_colours(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
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
    let Some(runtime) = new_runtime() else {
        return ExitCode::FAILURE;
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
            outcome = start_all(crate::connectors::registry::emulators()) => Some(outcome),
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
    // What a user must do before the first write (the Cloud Tasks emulator starts without a
    // queue, and the sink never creates one): each emulator's spec says.
    for note in started.iter().filter_map(|e| e.kind().spec().started_note) {
        if !quiet {
            eprintln!("{note}");
        }
    }
    for (kind, error) in &failed {
        eprintln!("Could not start the {kind} emulator: {error}");
    }
    Ok(started)
}

/// `gcp-sql emulators`: starts the emulators, prints one `export VAR=HOST` line per emulator
/// on stdout (so `eval "$(gcp-sql emulators | head -3)"` or a copy into another terminal points
/// clients at them), and keeps them up until Ctrl-C or SIGTERM. An emulator that cannot start is
/// reported on stderr and the others keep running; none starting is exit code 1.
fn run_emulators() -> ExitCode {
    use std::io::Write;
    crate::connectors::install_crypto_provider();
    let mut interrupts = Interrupts::install();
    let started = match start_emulators(false, &mut interrupts) {
        Ok(started) => started,
        Err(code) => return code,
    };
    if started.is_empty() {
        return ExitCode::FAILURE;
    }
    let mut exports = String::new();
    for emulator in &started {
        exports.push_str(&format!(
            "export {}={}\n",
            emulator.env_var(),
            emulator.host()
        ));
    }
    // A closed stdout (`| head -1`) is no reason to stop the emulators.
    let mut stdout = std::io::stdout();
    let _ = stdout
        .write_all(exports.as_bytes())
        .and_then(|()| stdout.flush());
    eprintln!(
        "The emulators run until Ctrl-C. In another terminal, paste the export lines above, then \
         run gcp-sql (without --emulators) or any client."
    );
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        eprintln!("Error: cannot start the async runtime");
        return ExitCode::FAILURE;
    };
    let signal = runtime.block_on(interrupts.next());
    let names: Vec<&str> = started.iter().map(|e| e.kind().name()).collect();
    drop(started);
    eprintln!(
        "Stopped the {} emulator(s) ({}).",
        names.join(", "),
        signal.name()
    );
    ExitCode::SUCCESS
}

async fn run_session(invocation: &Invocation, interrupts: &mut Interrupts) -> ExitCode {
    // Served until the run ends (dropped with this frame).
    let _metrics = match invocation.metrics_addr {
        Some(at) => match crate::ops::MetricsServer::start(&at.to_string()).await {
            Ok(server) => {
                if !invocation.options.quiet {
                    eprintln!(
                        "Serving metrics at http://{}/metrics (and /healthz, /readyz).",
                        server.local_addr()
                    );
                }
                Some(server)
            }
            Err(e) => {
                let why = match e {
                    crate::Error::InvalidOption { rule, .. } => rule,
                    other => other.to_string(),
                };
                eprintln!("Error: --metrics-addr {at}: {why}");
                return ExitCode::FAILURE;
            }
        },
        None => None,
    };
    let control = progress::statement_control(invocation.options.quiet);
    let ctx = match &invocation.cluster {
        None => new_session_with_control(&control),
        #[cfg(feature = "ballista")]
        Some(url) => cluster::new_cluster_session(url, &control).await,
        #[cfg(not(feature = "ballista"))]
        Some(_) => Err(crate::Error::Unsupported(
            "--cluster needs a gcp-sql built with --features ballista".into(),
        )),
    };
    let ctx = match ctx {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("Error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if invocation.sources.is_empty() {
        return run_shell(&ctx, invocation.options, interrupts).await;
    }
    let sources = run_sources(&ctx, &invocation.sources, invocation.options);
    tokio::pin!(sources);
    // The first signal that arrives while sink writers run stops them gracefully; a second
    // one aborts. With no sink writer running, a signal ends the run at once.
    let mut stopping: Option<StopSignalKind> = None;
    loop {
        tokio::select! {
            code = &mut sources => {
                return match (stopping, control.stopped()) {
                    (Some(_), Some(StopKind::Drain)) if code == ExitCode::SUCCESS => {
                        eprintln!("Stopped on request: every row read was delivered.");
                        ExitCode::SUCCESS
                    }
                    (Some(signal), Some(StopKind::Abort)) => {
                        eprintln!("Aborted.");
                        ExitCode::from(signal.exit_code())
                    }
                    _ => code,
                };
            }
            signal = interrupts.next() => {
                if stopping.is_some() {
                    eprintln!(
                        "{}: aborting; rows still in flight are counted as not delivered (some may have landed).",
                        signal.name()
                    );
                    control.stop(StopKind::Abort, format!("aborted ({} again)", signal.name()));
                    stopping = Some(signal);
                } else if control.running_writers() > 0 {
                    eprintln!(
                        "{}: stopping; no more input is read, and what was read is being delivered \
                         (within shutdown_timeout). {} again to abort.",
                        signal.name(),
                        signal.name()
                    );
                    control.stop(StopKind::Drain, format!("stop requested ({})", signal.name()));
                    stopping = Some(signal);
                } else {
                    eprintln!("Interrupted.");
                    return ExitCode::from(signal.exit_code());
                }
            }
        }
    }
}

/// Runs every source in order; stops at the first failure, printing `Error: ...` on stderr,
/// and after a `\q`. A `\format` in one source holds for the sources after it.
async fn run_sources(ctx: &SessionContext, sources: &[Source], options: PrintOptions) -> ExitCode {
    let mut options = options;
    for source in sources {
        let outcome = match source {
            Source::File(path) => match tokio::fs::read_to_string(path).await {
                Ok(sql) => run_script(ctx, &sql, &mut options).await,
                Err(e) => {
                    eprintln!("Error: cannot read {}: {e}", path.display());
                    return ExitCode::FAILURE;
                }
            },
            Source::Command(sql) => run_script(ctx, sql, &mut options).await,
        };
        match outcome {
            Ok(Flow::Continue) => {}
            Ok(Flow::Quit) => break,
            Err(e) => {
                eprintln!("Error: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

/// The tool's multi-threaded async runtime; `None`, with the reason on stderr, when it cannot
/// start.
pub(crate) fn new_runtime() -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => Some(runtime),
        Err(e) => {
            eprintln!("Error: cannot start the async runtime: {e}");
            None
        }
    }
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
                quiet: false,
                maxrows: MaxRows::Limited(40),
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
                quiet: true,
                maxrows: MaxRows::default(),
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
    fn ndjson_format_is_parsed() {
        let run = Invocation::parse_from(["gcp-sql", "--format", "ndjson"]).unwrap();
        assert_eq!(run.options.format, OutputFormat::Ndjson);
    }

    #[test]
    fn log_colours_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(log_colours(true, None));
        assert!(log_colours(true, Some(OsStr::new(""))));
        assert!(!log_colours(true, Some(OsStr::new("1"))));
        assert!(!log_colours(false, None));
        assert!(!log_colours(false, Some(OsStr::new(""))));
    }

    #[tokio::test]
    async fn the_session_has_information_schema_on() {
        let ctx = new_session().unwrap();
        let batches = crate::sql::run(&ctx, "SHOW TABLES").await.unwrap();
        assert!(batches.iter().map(|b| b.num_rows()).sum::<usize>() > 0);
    }

    #[test]
    fn a_bad_metrics_address_is_refused_naming_the_flag() {
        let run = Invocation::parse_from(["gcp-sql", "--metrics-addr", "127.0.0.1:9464"]).unwrap();
        assert_eq!(run.metrics_addr, Some("127.0.0.1:9464".parse().unwrap()));
        let err = Invocation::parse_from(["gcp-sql", "--metrics-addr", "9464"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let text = err.to_string();
        assert!(text.contains("--metrics-addr"), "{text}");
        assert!(text.contains("expected HOST:PORT"), "{text}");
    }

    #[test]
    fn file_option_needs_a_value() {
        assert!(Invocation::parse_from(["gcp-sql", "-f"]).is_err());
    }
}
