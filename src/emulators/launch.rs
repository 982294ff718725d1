//! The emulator launcher (feature `testing`), re-exported by [`crate::emulators`] and
//! documented there.

use std::ffi::OsString;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use gcloud_sdk::google::bigtable::admin::v2::ListTablesRequest;
use gcloud_sdk::google::bigtable::admin::v2::bigtable_table_admin_client::BigtableTableAdminClient;
use gcloud_sdk::google::cloud::tasks::v2::ListQueuesRequest;
use gcloud_sdk::google::cloud::tasks::v2::cloud_tasks_client::CloudTasksClient;
use gcloud_sdk::google::pubsub::v1::ListTopicsRequest;
use gcloud_sdk::google::pubsub::v1::publisher_client::PublisherClient;

use super::plaintext_channel;
use crate::error::{Error, Result};

/// The `gcloud-tasks-emulator` release this crate is tested with, and the one its install hint
/// names (`.ci/run` installs the same one): the emulator's behaviour (how it answers for a
/// missing queue, what it lists) is part of what the tests check.
pub const CLOUD_TASKS_EMULATOR_VERSION: &str = "0.6.2";

/// How long an emulator may take to answer its first gRPC call. The Pub/Sub emulator is a JVM
/// and the Cloud Tasks emulator imports the Python gRPC stack: both take a few seconds on an
/// idle machine and much longer on a loaded 2-core CI machine, so the bound is generous. It
/// only matters when something is wrong.
pub const DEFAULT_READINESS_TIMEOUT: Duration = Duration::from_secs(90);

/// Deadline of one readiness probe call.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Pause between two readiness probes.
const PROBE_INTERVAL: Duration = Duration::from_millis(200);

/// How many ports are tried when the chosen free port is taken between the pick and the bind.
const PORT_ATTEMPTS: u32 = 3;

/// How many log lines a start failure shows.
const LOG_TAIL_LINES: usize = 25;

/// Python's start-up hook (a `sitecustomize` module found through `PYTHONPATH`) that makes
/// `gcloud-tasks-emulator` listen on 127.0.0.1 only.
///
/// The emulator (0.6) has no listen-address option and asks gRPC for `[::]:PORT`, every
/// interface, while we announce 127.0.0.1. The hook wraps `grpc.server` so that a wildcard
/// address given to `add_insecure_port` becomes `127.0.0.1:PORT`; any other address is left
/// alone. It then deletes its own folder (Python has read it by then, so nothing is left
/// behind even when the tool is killed) and hands over to any other `sitecustomize` on the
/// path, so an environment that has one keeps it.
const LOOPBACK_SITECUSTOMIZE: &str = r#"# Written by gcp-sql for gcloud-tasks-emulator: listen on 127.0.0.1 only.
import os
import shutil
import sys

_here = os.path.dirname(os.path.abspath(__file__))
try:
    import grpc

    _server = grpc.server

    def _loopback_server(*args, **kwargs):
        server = _server(*args, **kwargs)
        add_insecure_port = server.add_insecure_port

        def loopback_port(address):
            host, _, port = address.rpartition(":")
            if host in ("[::]", "0.0.0.0", ""):
                address = "127.0.0.1:" + port
            return add_insecure_port(address)

        server.add_insecure_port = loopback_port
        return server

    grpc.server = _loopback_server
except Exception as error:
    print("gcp-sql: cannot limit the emulator to 127.0.0.1:", error, file=sys.stderr)
shutil.rmtree(_here, ignore_errors=True)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_self = sys.modules.pop("sitecustomize")
try:
    import sitecustomize  # noqa: F401  (another one further on the path)
except ImportError:
    # None: the import machinery expects to find this module under its name when it returns.
    sys.modules["sitecustomize"] = _self
"#;

/// Google Cloud SDK install folders looked into after the `PATH`.
const SDK_ROOTS: [&str; 3] = [
    "/usr/lib/google-cloud-sdk",
    "/usr/share/google-cloud-sdk",
    "/opt/google-cloud-sdk",
];

/// One of the three emulators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EmulatorKind {
    /// The Pub/Sub emulator of the Google Cloud CLI.
    PubSub,
    /// The Bigtable emulator (`cbtemulator`) of the Google Cloud CLI.
    Bigtable,
    /// The `gcloud-tasks-emulator` package from PyPI.
    CloudTasks,
}

impl EmulatorKind {
    /// Every kind, in the order `gcp-sql --emulators` reports them.
    pub const ALL: [EmulatorKind; 3] = [
        EmulatorKind::PubSub,
        EmulatorKind::Bigtable,
        EmulatorKind::CloudTasks,
    ];

    /// The service's name as users know it (`Pub/Sub`, `Bigtable`, `Cloud Tasks`).
    pub fn name(self) -> &'static str {
        match self {
            EmulatorKind::PubSub => "Pub/Sub",
            EmulatorKind::Bigtable => "Bigtable",
            EmulatorKind::CloudTasks => "Cloud Tasks",
        }
    }

    /// The variable the connectors (and Google's own clients) read to reach this emulator.
    pub fn env_var(self) -> &'static str {
        self.connector().emulator_env_var()
    }

    /// The connector this emulator serves.
    pub fn connector(self) -> crate::connectors::ConnectorKind {
        match self {
            EmulatorKind::PubSub => crate::connectors::pubsub::KIND,
            EmulatorKind::Bigtable => crate::connectors::bigtable::KIND,
            EmulatorKind::CloudTasks => crate::connectors::cloud_tasks::KIND,
        }
    }

    /// The variable that, when set, names the emulator program to run instead of looking it up.
    pub fn program_override_var(self) -> &'static str {
        match self {
            EmulatorKind::PubSub => "GCP_SQL_PUBSUB_EMULATOR_BIN",
            EmulatorKind::Bigtable => "GCP_SQL_BIGTABLE_EMULATOR_BIN",
            EmulatorKind::CloudTasks => "GCP_SQL_CLOUD_TASKS_EMULATOR_BIN",
        }
    }

    /// How to install the emulator on a Debian machine with the Google Cloud CLI repository
    /// (the first two) or with pip (the third, pinned to [`CLOUD_TASKS_EMULATOR_VERSION`]).
    ///
    /// ```
    /// use gcp_sql::emulators::{CLOUD_TASKS_EMULATOR_VERSION, EmulatorKind};
    /// assert_eq!(
    ///     EmulatorKind::CloudTasks.install_hint(),
    ///     format!("pip install gcloud-tasks-emulator=={CLOUD_TASKS_EMULATOR_VERSION}")
    /// );
    /// ```
    pub fn install_hint(self) -> &'static str {
        match self {
            EmulatorKind::PubSub => {
                "apt-get install google-cloud-cli-pubsub-emulator (it also needs a Java runtime: apt-get install default-jre-headless)"
            }
            EmulatorKind::Bigtable => "apt-get install google-cloud-cli-bigtable-emulator",
            EmulatorKind::CloudTasks => "pip install gcloud-tasks-emulator==0.6.2",
        }
    }

    /// Finds the emulator's program the way [`Emulator::start`] does (over this process's
    /// environment), without starting it: the error of a missing program names it and the
    /// command that installs it.
    ///
    /// Tests that run the `gcp-sql` tool with `--emulators` call it first, so that a machine
    /// without an emulator fails them with that one message rather than with an assertion on
    /// what the tool went on to do without it.
    ///
    /// For Cloud Tasks, a program missing from the `PATH` and from the private install is
    /// installed there first ([`install_cloud_tasks_emulator`]), unless that is turned off.
    pub fn locate(self) -> Result<PathBuf> {
        let env = |var: &str| std::env::var_os(var);
        match locate_program(self, env) {
            Err(_)
                if self == EmulatorKind::CloudTasks
                    && env(self.program_override_var()).is_none_or(|v| v.is_empty()) =>
            {
                super::install::install_cloud_tasks_emulator(env)
            }
            found => found,
        }
    }

    /// The program's file name, as looked up on the `PATH`.
    pub fn program_name(self) -> &'static str {
        match self {
            EmulatorKind::PubSub => "cloud-pubsub-emulator",
            EmulatorKind::Bigtable => "cbtemulator",
            EmulatorKind::CloudTasks => "gcloud-tasks-emulator",
        }
    }

    /// Where the program sits inside a Google Cloud SDK folder, for those that ship with it.
    fn sdk_relative_path(self) -> Option<&'static str> {
        match self {
            EmulatorKind::PubSub => Some("platform/pubsub-emulator/bin/cloud-pubsub-emulator"),
            EmulatorKind::Bigtable => Some("platform/bigtable-emulator/cbtemulator"),
            EmulatorKind::CloudTasks => None,
        }
    }

    /// The arguments that make the program listen on `127.0.0.1:port`.
    fn args(self, port: u16) -> Vec<String> {
        match self {
            EmulatorKind::PubSub => vec!["--host=127.0.0.1".into(), format!("--port={port}")],
            EmulatorKind::Bigtable => vec![
                "-host".into(),
                "127.0.0.1".into(),
                "-port".into(),
                port.to_string(),
            ],
            // gcloud-tasks-emulator 0.6 has no listen-address option (its gRPC server binds
            // `[::]:port`, every interface): `LOOPBACK_SITECUSTOMIZE` narrows it to 127.0.0.1.
            EmulatorKind::CloudTasks => vec!["start".into(), format!("--port={port}")],
        }
    }

    fn slug(self) -> &'static str {
        match self {
            EmulatorKind::PubSub => "pubsub",
            EmulatorKind::Bigtable => "bigtable",
            EmulatorKind::CloudTasks => "cloud-tasks",
        }
    }

    fn index(self) -> usize {
        match self {
            EmulatorKind::PubSub => 0,
            EmulatorKind::Bigtable => 1,
            EmulatorKind::CloudTasks => 2,
        }
    }
}

impl fmt::Display for EmulatorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The error for an emulator program that cannot be found; `detail` says where it was looked for.
fn not_installed(kind: EmulatorKind, detail: &str) -> Error {
    Error::Io(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "the {} emulator is not installed: {} ({detail}; or set {} to its executable)",
            kind.name(),
            kind.install_hint(),
            kind.program_override_var()
        ),
    ))
}

pub(crate) fn is_executable_file(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Finds the program of `kind`, reading variables through `env` (so a caller can test the
/// lookup without touching the process environment): the override variable first, then `PATH`,
/// then the `platform/` folder of a Google Cloud SDK.
///
/// An override that names no executable file is an error, not a reason to look elsewhere.
///
/// ```
/// use gcp_sql::emulators::{locate_program, EmulatorKind};
///
/// let err = locate_program(EmulatorKind::CloudTasks, |var| {
///     (var == "GCP_SQL_CLOUD_TASKS_EMULATOR_BIN").then(|| "/nonexistent/emulator".into())
/// })
/// .unwrap_err();
/// assert!(err.to_string().contains("pip install gcloud-tasks-emulator==0.6.2"));
/// ```
pub fn locate_program(
    kind: EmulatorKind,
    env: impl Fn(&str) -> Option<OsString>,
) -> Result<PathBuf> {
    if let Some(value) = env(kind.program_override_var()).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(value);
        if is_executable_file(&path) {
            return Ok(path);
        }
        return Err(not_installed(
            kind,
            &format!(
                "{} is '{}', which is not an executable file",
                kind.program_override_var(),
                path.display()
            ),
        ));
    }
    let path_dirs: Vec<PathBuf> = env("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(found) = path_dirs
        .iter()
        .map(|d| d.join(kind.program_name()))
        .find(|p| is_executable_file(p))
    {
        return Ok(found);
    }
    if let Some(relative) = kind.sdk_relative_path() {
        let mut roots: Vec<PathBuf> = Vec::new();
        // `gcloud` lives in `<sdk>/bin/`; it is often a symlink into the SDK.
        if let Some(gcloud) = path_dirs
            .iter()
            .map(|d| d.join("gcloud"))
            .find(|p| is_executable_file(p))
            && let Some(root) = std::fs::canonicalize(&gcloud)
                .ok()
                .and_then(|p| p.parent()?.parent().map(Path::to_path_buf))
        {
            roots.push(root);
        }
        roots.extend(SDK_ROOTS.iter().map(PathBuf::from));
        if let Some(home) = env("HOME") {
            roots.push(PathBuf::from(home).join("google-cloud-sdk"));
        }
        if let Some(found) = roots
            .iter()
            .map(|r| r.join(relative))
            .find(|p| is_executable_file(p))
        {
            return Ok(found);
        }
        return Err(not_installed(
            kind,
            &format!(
                "'{}' is neither on PATH nor in a Google Cloud SDK folder",
                kind.program_name()
            ),
        ));
    }
    if let Some(program) =
        super::install::cache_dir(&env).and_then(|cache| super::install::installed_program(&cache))
    {
        return Ok(program);
    }
    Err(not_installed(
        kind,
        &format!(
            "'{}' is neither on PATH nor installed privately under the cache folder",
            kind.program_name()
        ),
    ))
}

/// How to start one emulator; [`Emulator::start`] uses the defaults.
#[derive(Debug, Clone, Default)]
pub struct EmulatorOptions {
    program: Option<PathBuf>,
    readiness_timeout: Option<Duration>,
    log_dir: Option<PathBuf>,
}

impl EmulatorOptions {
    /// The defaults: look the program up ([`locate_program`]) and wait up to
    /// [`DEFAULT_READINESS_TIMEOUT`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs this program instead of looking one up.
    pub fn program(mut self, program: impl Into<PathBuf>) -> Self {
        self.program = Some(program.into());
        self
    }

    /// How long to wait for the emulator's first answer.
    pub fn readiness_timeout(mut self, timeout: Duration) -> Self {
        self.readiness_timeout = Some(timeout);
        self
    }

    /// The folder for the emulator's log file and, for Cloud Tasks, its start-up hook (default:
    /// the system's temporary folder). Neither stays there unless the start fails, which keeps
    /// the log.
    pub fn log_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.log_dir = Some(dir.into());
        self
    }
}

/// A running emulator on `127.0.0.1`. Dropping it kills the emulator's whole process group and
/// waits for it.
#[derive(Debug)]
pub struct Emulator {
    kind: EmulatorKind,
    host: String,
    child: Child,
    /// The leader was reaped (it exited on its own): its id may be reused, never signal it.
    reaped: bool,
    /// Where the log is written back if the start fails (the name is unlinked at spawn).
    log_path: PathBuf,
    /// The log, open: the emulator writes to it, we read it back through this handle.
    log: File,
    keep_log: bool,
    /// The folder of the Cloud Tasks start-up hook, if it is still there.
    site_dir: Option<PathBuf>,
}

impl Emulator {
    /// Starts the emulator of `kind` on a free loopback port and returns once it answers a gRPC
    /// call. The program is found with [`locate_program`] over the process environment.
    ///
    /// Errors: the program is missing (the message says how to install it), it exits early, or
    /// it does not answer within [`DEFAULT_READINESS_TIMEOUT`] (both with the tail of its log).
    pub async fn start(kind: EmulatorKind) -> Result<Emulator> {
        Self::start_with(kind, EmulatorOptions::new()).await
    }

    /// Like [`Emulator::start`], with explicit options.
    pub async fn start_with(kind: EmulatorKind, options: EmulatorOptions) -> Result<Emulator> {
        let program = match options.program {
            Some(program) if is_executable_file(&program) => program,
            Some(program) => {
                return Err(not_installed(
                    kind,
                    &format!(
                        "the program '{}' is not an executable file",
                        program.display()
                    ),
                ));
            }
            // Blocking: the Cloud Tasks emulator may be installed first.
            None => tokio::task::spawn_blocking(move || kind.locate())
                .await
                .map_err(|e| {
                    Error::Io(io::Error::other(format!(
                        "looking up the {} emulator failed: {e}",
                        kind.name()
                    )))
                })??,
        };
        let timeout = options
            .readiness_timeout
            .unwrap_or(DEFAULT_READINESS_TIMEOUT);
        let log_dir = options.log_dir.unwrap_or_else(std::env::temp_dir);
        let mut attempt = 1;
        loop {
            let port = free_loopback_port()?;
            let mut emulator = Self::spawn(kind, &program, port, &log_dir)?;
            let ready = emulator.wait_ready(timeout).await;
            // A Python emulator has read its start-up hook long before it answers (the hook
            // removes its folder itself; this covers a program that never ran it).
            emulator.remove_site_dir();
            match ready {
                Ok(()) => return Ok(emulator),
                Err(NotReady::PortTaken(_)) if attempt < PORT_ATTEMPTS => attempt += 1,
                Err(NotReady::PortTaken(error) | NotReady::Failed(error)) => {
                    emulator.keep_log = true;
                    return Err(error);
                }
            }
        }
    }

    fn spawn(kind: EmulatorKind, program: &Path, port: u16, log_dir: &Path) -> Result<Emulator> {
        let stem = format!(
            "gcp-sql-{}-emulator-{}-{port}",
            kind.slug(),
            std::process::id()
        );
        let log_path = log_dir.join(format!("{stem}.log"));
        // A new file only (never one that exists, nor a link planted in a shared temporary
        // folder), readable by us alone.
        let log = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&log_path)
            .map_err(|e| {
                Error::Io(io::Error::new(
                    e.kind(),
                    format!("cannot create the log file '{}': {e}", log_path.display()),
                ))
            })?;
        let mut command = Command::new(program);
        command
            .args(kind.args(port))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log.try_clone()?)
            // Its own group: Ctrl-C in a terminal does not reach it, and Drop kills the whole
            // group (the Pub/Sub program is a shell script that execs a JVM).
            .process_group(0);
        let mut site_dir = None;
        if kind == EmulatorKind::CloudTasks {
            // Python buffers its output into a file: without this, the log tail of a failed
            // start can be empty. Its FutureWarnings about Python versions are noise there.
            command
                .env("PYTHONUNBUFFERED", "1")
                .env("PYTHONWARNINGS", "ignore::FutureWarning");
            let dir = log_dir.join(format!("{stem}.site"));
            let hook = write_loopback_hook(&dir);
            // Whatever fails from here on, the folder must not stay behind.
            site_dir = Some(dir.clone());
            if let Err(e) = hook {
                let _ = std::fs::remove_dir_all(&dir);
                let _ = std::fs::remove_file(&log_path);
                return Err(e);
            }
            let mut path = std::ffi::OsString::from(&dir);
            if let Some(existing) = std::env::var_os("PYTHONPATH").filter(|p| !p.is_empty()) {
                path.push(":");
                path.push(existing);
            }
            command.env("PYTHONPATH", path);
        }
        tie_to_parent(&mut command);
        let spawned = spawn_from_long_lived_thread(command);
        // The emulator holds the log open; its name goes now, so that no way this process
        // ends (Drop, Ctrl-C, SIGTERM, SIGKILL) leaves it behind. A failed start writes it
        // back (see Drop).
        let _ = std::fs::remove_file(&log_path);
        let child = spawned.map_err(|e| {
            if let Some(dir) = &site_dir {
                let _ = std::fs::remove_dir_all(dir);
            }
            Error::Io(io::Error::new(
                e.kind(),
                format!(
                    "cannot run the {} emulator '{}': {e}",
                    kind.name(),
                    program.display()
                ),
            ))
        })?;
        Ok(Emulator {
            kind,
            host: format!("127.0.0.1:{port}"),
            child,
            reaped: false,
            log_path,
            log,
            keep_log: false,
            site_dir,
        })
    }

    fn remove_site_dir(&mut self) {
        if let Some(dir) = self.site_dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    async fn wait_ready(&mut self, timeout: Duration) -> std::result::Result<(), NotReady> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    self.reaped = true;
                    return Err(self.exited_early(status));
                }
                Ok(None) => {}
                Err(e) => return Err(NotReady::Failed(Error::Io(e))),
            }
            let last_error =
                match tokio::time::timeout(PROBE_TIMEOUT, probe(self.kind, &self.host)).await {
                    Ok(Ok(())) => return Ok(()),
                    Ok(Err(e)) => e,
                    Err(_) => format!("the probe got no answer within {PROBE_TIMEOUT:?}"),
                };
            if Instant::now() >= deadline {
                return Err(NotReady::Failed(Error::Connect {
                    endpoint: format!("the {} emulator at {}", self.kind.name(), self.host),
                    message: format!(
                        "it did not answer within {timeout:?} (last attempt: {last_error}); its log {}:\n{}",
                        self.log_path.display(),
                        log_tail(&self.log)
                    ),
                }));
            }
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
    }

    fn exited_early(&self, status: ExitStatus) -> NotReady {
        let tail = log_tail(&self.log);
        let lower = tail.to_lowercase();
        let error = Error::Connect {
            endpoint: format!("the {} emulator at {}", self.kind.name(), self.host),
            message: format!(
                "it exited ({status}) before answering; its log {}:\n{tail}",
                self.log_path.display()
            ),
        };
        if [
            "address already in use",
            "failed to bind",
            "failed to add port",
        ]
        .iter()
        .any(|m| lower.contains(m))
        {
            NotReady::PortTaken(error)
        } else {
            NotReady::Failed(error)
        }
    }

    /// The emulator's address, `127.0.0.1:PORT`: the value of [`Emulator::env_var`].
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Which emulator this is.
    pub fn kind(&self) -> EmulatorKind {
        self.kind
    }

    /// The variable that points clients at this emulator (`PUBSUB_EMULATOR_HOST`, ...).
    pub fn env_var(&self) -> &'static str {
        self.kind.env_var()
    }

    /// The operating-system id of the emulator process (also its process group id).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Where the emulator's standard output and error are kept when it fails to start (the
    /// path its start error names).
    ///
    /// The file is unlinked as soon as the emulator is spawned: the emulator keeps writing to
    /// it (read it through `/proc/<pid>/fd/1` while it runs), and no way this process ends
    /// leaves it behind. A failed start writes the whole log back to this path.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        if !self.reaped {
            if let Ok(group) = libc::pid_t::try_from(self.child.id()) {
                // SAFETY: killpg only sends a signal; the group id is our own child's pid (it
                // leads its own group), and that child has not been reaped, so the id cannot
                // have been reused.
                unsafe {
                    libc::killpg(group, libc::SIGKILL);
                }
            }
            // Kills the leader if the group signal failed; a no-op otherwise.
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        self.remove_site_dir();
        if self.keep_log {
            // After the kill, so that the kept log is complete.
            if let Err(e) = keep_log(&self.log, &self.log_path) {
                tracing::warn!(
                    path = %self.log_path.display(),
                    error = %e,
                    "cannot keep the log of an emulator that failed to start"
                );
            }
        }
    }
}

enum NotReady {
    /// The emulator could not bind its port (taken between the pick and the bind): try another.
    PortTaken(Error),
    Failed(Error),
}

/// Asks the OS for a free port on 127.0.0.1 by binding port 0 and releasing it.
fn free_loopback_port() -> Result<u16> {
    let listener = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

/// Makes the kernel kill the child when the thread that spawned it dies (Linux only).
#[cfg(target_os = "linux")]
fn tie_to_parent(command: &mut Command) {
    let parent = libc::pid_t::try_from(std::process::id()).unwrap_or(0);
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe calls
    // (prctl, getppid) and builds errors without allocating.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent died between fork and prctl: the signal will never come.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn tie_to_parent(_command: &mut Command) {}

type SpawnRequest = (Command, mpsc::SyncSender<io::Result<Child>>);

/// Spawns `command` from a thread that lives as long as the process.
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not the process. Test
/// threads, tokio's blocking threads and short-lived runtimes all end long before the process
/// does, so every emulator is forked from one dedicated thread that never returns: the signal
/// then comes exactly when the process dies.
fn spawn_from_long_lived_thread(command: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<std::result::Result<Mutex<mpsc::Sender<SpawnRequest>>, String>> =
        OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (sender, receiver) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("gcp-sql-emulator-spawner".into())
            .spawn(move || {
                // The sender lives in a static, so this loop runs until the process exits.
                for (mut command, reply) in receiver {
                    let _ = reply.send(command.spawn());
                }
            })
            .map(|_| Mutex::new(sender))
            .map_err(|e| format!("cannot start the emulator spawner thread: {e}"))
    });
    let sender = spawner.as_ref().map_err(|e| io::Error::other(e.clone()))?;
    let (reply, answer) = mpsc::sync_channel(1);
    sender
        .lock()
        .map_err(|_| io::Error::other("the emulator spawner lock is poisoned"))?
        .send((command, reply))
        .map_err(|_| io::Error::other("the emulator spawner thread is gone"))?;
    answer
        .recv()
        .map_err(|_| io::Error::other("the emulator spawner thread is gone"))?
}

/// One readiness probe: a real call on the emulator's main service.
async fn probe(kind: EmulatorKind, host: &str) -> std::result::Result<(), String> {
    let channel = plaintext_channel(host).await.map_err(|e| e.to_string())?;
    let outcome = match kind {
        EmulatorKind::PubSub => PublisherClient::new(channel)
            .list_topics(ListTopicsRequest {
                project: "projects/readiness".into(),
                ..Default::default()
            })
            .await
            .map(drop),
        EmulatorKind::Bigtable => BigtableTableAdminClient::new(channel)
            .list_tables(ListTablesRequest {
                parent: "projects/readiness/instances/readiness".into(),
                ..Default::default()
            })
            .await
            .map(drop),
        EmulatorKind::CloudTasks => CloudTasksClient::new(channel)
            .list_queues(ListQueuesRequest {
                parent: "projects/readiness/locations/readiness".into(),
                ..Default::default()
            })
            .await
            .map(drop),
    };
    outcome.map_err(|status| format!("{:?}: {}", status.code(), status.message()))
}

/// Creates `dir` (only if it does not exist, readable by us alone) holding the Cloud Tasks
/// start-up hook [`LOOPBACK_SITECUSTOMIZE`].
fn write_loopback_hook(dir: &Path) -> Result<()> {
    let written = std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .and_then(|()| {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(dir.join("sitecustomize.py"))
        })
        .and_then(|mut file| io::Write::write_all(&mut file, LOOPBACK_SITECUSTOMIZE.as_bytes()));
    written.map_err(|e| {
        Error::Io(io::Error::new(
            e.kind(),
            format!(
                "cannot write the Cloud Tasks emulator's start-up hook in '{}': {e}",
                dir.display()
            ),
        ))
    })
}

/// Everything written to the (unlinked) log so far. Positioned reads: the emulator's writes
/// share the file offset with this handle, which must not move.
fn read_log(log: &File) -> io::Result<Vec<u8>> {
    let len = usize::try_from(log.metadata()?.len()).unwrap_or(usize::MAX);
    let mut bytes = vec![0; len];
    let mut read = 0;
    while read < bytes.len() {
        match log.read_at(&mut bytes[read..], read as u64)? {
            0 => break,
            n => read += n,
        }
    }
    bytes.truncate(read);
    Ok(bytes)
}

/// Writes the log of a failed start back to `path`, where its error said it is.
fn keep_log(log: &File, path: &Path) -> io::Result<()> {
    let bytes = read_log(log)?;
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    io::Write::write_all(&mut file, &bytes)
}

fn log_tail(log: &File) -> String {
    match read_log(log) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
            if tail.trim().is_empty() {
                "(empty)".into()
            } else {
                tail
            }
        }
        Err(e) => format!("(cannot read it: {e})"),
    }
}

/// Starts every emulator concurrently. Returns those that started and, for each that did not,
/// why (a missing program names its install step).
pub async fn start_all() -> (Vec<Emulator>, Vec<(EmulatorKind, Error)>) {
    let outcomes = futures::future::join_all(
        EmulatorKind::ALL.map(|kind| async move { (kind, Emulator::start(kind).await) }),
    )
    .await;
    let mut started = Vec::new();
    let mut failed = Vec::new();
    for (kind, outcome) in outcomes {
        match outcome {
            Ok(emulator) => started.push(emulator),
            Err(error) => failed.push((kind, error)),
        }
    }
    (started, failed)
}

/// The emulator of `kind` shared by every test of one test binary, started on first use.
///
/// It is never dropped: it dies with the test process (see the module docs). A start failure
/// panics with the reason, in every test that asks, without retrying the start.
///
/// Create channels per test (with [`plaintext_channel`]): a channel belongs to the tokio runtime
/// that made it, and each `#[tokio::test]` has its own.
#[doc(hidden)]
pub async fn shared(kind: EmulatorKind) -> &'static Emulator {
    type Slot = tokio::sync::OnceCell<std::result::Result<Emulator, String>>;
    static SLOTS: [Slot; 3] = [const { Slot::const_new() }; 3];
    let outcome = SLOTS[kind.index()]
        .get_or_init(|| async move {
            // It is never dropped; its log was unlinked at spawn, so nothing stays behind.
            Emulator::start(kind).await.map_err(|e| e.to_string())
        })
        .await;
    match outcome {
        Ok(emulator) => emulator,
        Err(message) => panic!("{}", start_failure(kind, message)),
    }
}

/// The panic message of a test that needs an emulator that cannot start: the whole reason in
/// the first test of the process that meets it, a one-line reminder (still naming what to
/// install) in every later one, so a missing emulator reads as one failure, not as dozens of
/// copies of the same log.
#[doc(hidden)]
pub fn start_failure(kind: EmulatorKind, message: &str) -> String {
    use std::sync::atomic::{AtomicBool, Ordering};
    static REPORTED: [AtomicBool; 3] = [const { AtomicBool::new(false) }; 3];
    let first = !REPORTED[kind.index()].swap(true, Ordering::Relaxed);
    let missing = message.contains("emulator is not installed");
    match (first, missing) {
        (true, _) => format!("cannot start the {kind} emulator for these tests: {message}"),
        (false, true) => format!(
            "the {kind} emulator is not installed: {} (the first test that needed it says where it was looked for)",
            kind.install_hint()
        ),
        (false, false) => format!(
            "cannot start the {kind} emulator for these tests (the first test that needed it has the emulator's log): {}",
            message.lines().next().unwrap_or_default()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> + use<> {
        let pairs: Vec<(String, OsString)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |var| pairs.iter().find(|(k, _)| k == var).map(|(_, v)| v.clone())
    }

    fn executable(dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn override_naming_a_missing_file_is_an_install_error() {
        let err = locate_program(
            EmulatorKind::Bigtable,
            env_of(&[("GCP_SQL_BIGTABLE_EMULATOR_BIN", "/nonexistent/cbtemulator")]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("apt-get install google-cloud-cli-bigtable-emulator"),
            "{err}"
        );
        assert!(err.contains("/nonexistent/cbtemulator"), "{err}");
    }

    #[test]
    fn override_naming_a_non_executable_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("not-executable");
        std::fs::write(&plain, "data").unwrap();
        let err = locate_program(
            EmulatorKind::PubSub,
            env_of(&[("GCP_SQL_PUBSUB_EMULATOR_BIN", plain.to_str().unwrap())]),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("not an executable file"), "{err}");
        assert!(err.contains("google-cloud-cli-pubsub-emulator"), "{err}");
    }

    #[test]
    fn override_wins_over_path() {
        let dir = tempfile::tempdir().unwrap();
        let on_path = executable(dir.path(), "gcloud-tasks-emulator");
        let other = executable(dir.path(), "my-tasks-emulator");
        let env = env_of(&[
            ("PATH", dir.path().to_str().unwrap()),
            ("GCP_SQL_CLOUD_TASKS_EMULATOR_BIN", other.to_str().unwrap()),
        ]);
        assert_eq!(
            locate_program(EmulatorKind::CloudTasks, env).unwrap(),
            other
        );
        let env = env_of(&[("PATH", dir.path().to_str().unwrap())]);
        assert_eq!(
            locate_program(EmulatorKind::CloudTasks, env).unwrap(),
            on_path
        );
    }

    #[test]
    fn missing_tasks_emulator_names_pip_install() {
        let dir = tempfile::tempdir().unwrap();
        let err = locate_program(
            EmulatorKind::CloudTasks,
            env_of(&[("PATH", dir.path().to_str().unwrap())]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with(
                "the Cloud Tasks emulator is not installed: pip install gcloud-tasks-emulator==0.6.2 "
            ),
            "{err}"
        );
    }

    #[test]
    fn the_install_hint_pins_the_version_ci_installs() {
        let ci = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/run")).unwrap();
        assert!(
            ci.contains(&format!(
                "GCLOUD_TASKS_EMULATOR_VERSION={CLOUD_TASKS_EMULATOR_VERSION}\n"
            )),
            ".ci/run pins another version than {CLOUD_TASKS_EMULATOR_VERSION}"
        );
        assert!(
            EmulatorKind::CloudTasks
                .install_hint()
                .ends_with(&format!("=={CLOUD_TASKS_EMULATOR_VERSION}"))
        );
    }

    #[test]
    fn a_start_failure_is_told_whole_once_then_in_one_line() {
        let kind = EmulatorKind::CloudTasks;
        let missing = not_installed(kind, "'gcloud-tasks-emulator' is not on PATH").to_string();
        // Nothing else in this test binary reports a Cloud Tasks start failure.
        let first = start_failure(kind, &missing);
        assert!(first.contains("is not on PATH"), "{first}");
        assert!(
            first.contains("pip install gcloud-tasks-emulator==0.6.2"),
            "{first}"
        );
        let later = start_failure(kind, &missing);
        assert_eq!(
            later,
            "the Cloud Tasks emulator is not installed: pip install gcloud-tasks-emulator==0.6.2 \
             (the first test that needed it says where it was looked for)"
        );
        let other = start_failure(
            kind,
            "it exited (exit status: 1) before answering; its log x:\nboom",
        );
        assert!(!other.contains("boom"), "{other}");
        assert!(other.contains("it exited (exit status: 1)"), "{other}");
    }

    #[test]
    fn sdk_program_is_found_next_to_gcloud() {
        let sdk = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(sdk.path().join("bin")).unwrap();
        std::fs::create_dir_all(sdk.path().join("platform/bigtable-emulator")).unwrap();
        executable(&sdk.path().join("bin"), "gcloud");
        let cbt = executable(
            &sdk.path().join("platform/bigtable-emulator"),
            "cbtemulator",
        );
        let env = env_of(&[("PATH", sdk.path().join("bin").to_str().unwrap())]);
        assert_eq!(
            locate_program(EmulatorKind::Bigtable, env).unwrap(),
            std::fs::canonicalize(&cbt).unwrap()
        );
    }

    #[tokio::test]
    async fn program_that_exits_at_once_reports_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("broken-emulator");
        std::fs::write(
            &script,
            "#!/bin/sh\necho 'cannot start: no java here' >&2\nexit 3\n",
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let options = EmulatorOptions::new().program(&script).log_dir(dir.path());
        let err = Emulator::start_with(EmulatorKind::PubSub, options)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("exited"), "{err}");
        assert!(err.contains("cannot start: no java here"), "{err}");
        // The log of a failed start is kept where the error says, whole; nothing else stays.
        let left: Vec<PathBuf> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p != &script)
            .collect();
        assert_eq!(left.len(), 1, "{left:?}");
        assert!(err.contains(&left[0].display().to_string()), "{err}");
        assert_eq!(
            std::fs::read_to_string(&left[0]).unwrap(),
            "cannot start: no java here\n"
        );
    }

    #[tokio::test]
    async fn a_failed_cloud_tasks_start_keeps_its_log_and_removes_its_hook() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("not-python");
        // Reports where Python would look for the hook, then exits.
        std::fs::write(&script, "#!/bin/sh\necho \"path=$PYTHONPATH\"\nexit 1\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let options = EmulatorOptions::new().program(&script).log_dir(dir.path());
        let err = Emulator::start_with(EmulatorKind::CloudTasks, options)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(".site"),
            "the hook's folder is on PYTHONPATH: {err}"
        );
        let left: Vec<PathBuf> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p != &script)
            .collect();
        assert_eq!(left.len(), 1, "only the log stays: {left:?}");
        assert!(left[0].to_string_lossy().ends_with(".log"), "{left:?}");
    }

    #[tokio::test]
    async fn program_that_never_answers_times_out_with_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("silent-emulator");
        std::fs::write(&script, "#!/bin/sh\necho 'listening soon'\nexec sleep 60\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let options = EmulatorOptions::new()
            .program(&script)
            .readiness_timeout(Duration::from_secs(1))
            .log_dir(dir.path());
        let err = Emulator::start_with(EmulatorKind::Bigtable, options)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("did not answer"), "{err}");
        assert!(err.contains("listening soon"), "{err}");
    }
}
