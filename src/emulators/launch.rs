//! The emulator launcher (feature `testing`), re-exported by [`crate::emulators`] and
//! documented there: starting an emulator, waiting until it answers, stopping it, and the
//! emulators the tests share. Discovery, the Python hook, process control and the per-service
//! probes are in the sibling files and in the connectors' folders.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::discover::{is_executable_file, not_installed};
use super::hook::write_loopback_hook;
use super::kind::EmulatorKind;
use super::process::{
    free_loopback_port, keep_log, log_tail, spawn_from_long_lived_thread, tie_to_parent,
};
use crate::error::{Error, Result};

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

    /// The folder for the emulator's log file and, for a Python emulator, its start-up hook (default:
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
    /// The folder of a Python emulator's start-up hook, if it is still there.
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
            // Blocking: an emulator with a private install may be installed first.
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
        if kind.spec().python_loopback_hook {
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
                match tokio::time::timeout(PROBE_TIMEOUT, self.kind.probe(&self.host)).await {
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

/// Starts the emulators `kinds` concurrently (the registry lists every one:
/// `connectors::registry::emulators()`). Returns those that started and, for each that did
/// not, why (a missing program names its install step).
pub async fn start_all(
    kinds: impl IntoIterator<Item = EmulatorKind>,
) -> (Vec<Emulator>, Vec<(EmulatorKind, Error)>) {
    let outcomes = futures::future::join_all(
        kinds
            .into_iter()
            .map(|kind| async move { (kind, Emulator::start(kind).await) }),
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
/// Create channels per test (with [`plaintext_channel`](super::plaintext_channel)): a channel belongs to the tokio runtime
/// that made it, and each `#[tokio::test]` has its own.
#[doc(hidden)]
pub async fn shared(kind: EmulatorKind) -> &'static Emulator {
    type Slot = tokio::sync::OnceCell<std::result::Result<Emulator, String>>;
    static SLOTS: std::sync::Mutex<Vec<(EmulatorKind, &'static Slot)>> =
        std::sync::Mutex::new(Vec::new());
    // One slot per emulator, made on its first use and kept for the life of the process.
    let slot: &'static Slot = {
        let mut slots = SLOTS.lock().unwrap_or_else(|p| p.into_inner());
        match slots.iter().find(|(k, _)| *k == kind) {
            Some((_, slot)) => slot,
            None => {
                let slot: &'static Slot = Box::leak(Box::new(Slot::const_new()));
                slots.push((kind, slot));
                slot
            }
        }
    };
    let outcome = slot
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
    static REPORTED: std::sync::Mutex<Vec<EmulatorKind>> = std::sync::Mutex::new(Vec::new());
    let first = {
        let mut reported = REPORTED.lock().unwrap_or_else(|p| p.into_inner());
        let first = !reported.contains(&kind);
        if first {
            reported.push(kind);
        }
        first
    };
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
    use std::os::unix::fs::PermissionsExt;

    use super::*;

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

    /// Starts `kind` with a fake program: a shell script `name` running `body`, written in a
    /// temporary folder that also takes the logs, with `more` options on top. The start must
    /// fail: returns the folder, the script and the error as text.
    async fn failed_start(
        kind: EmulatorKind,
        name: &str,
        body: &str,
        more: impl FnOnce(EmulatorOptions) -> EmulatorOptions,
    ) -> (tempfile::TempDir, PathBuf, String) {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join(name);
        std::fs::write(&script, body).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let options = more(EmulatorOptions::new().program(&script).log_dir(dir.path()));
        let err = Emulator::start_with(kind, options)
            .await
            .unwrap_err()
            .to_string();
        (dir, script, err)
    }

    /// The files in `dir` besides `script`.
    fn files_besides(dir: &Path, script: &Path) -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p != script)
            .collect()
    }

    #[tokio::test]
    async fn program_that_exits_at_once_reports_its_log() {
        let (dir, script, err) = failed_start(
            EmulatorKind::PubSub,
            "broken-emulator",
            "#!/bin/sh\necho 'cannot start: no java here' >&2\nexit 3\n",
            |o| o,
        )
        .await;
        assert!(err.contains("exited"), "{err}");
        assert!(err.contains("cannot start: no java here"), "{err}");
        // The log of a failed start is kept where the error says, whole; nothing else stays.
        let left = files_besides(dir.path(), &script);
        assert_eq!(left.len(), 1, "{left:?}");
        assert!(err.contains(&left[0].display().to_string()), "{err}");
        assert_eq!(
            std::fs::read_to_string(&left[0]).unwrap(),
            "cannot start: no java here\n"
        );
    }

    #[tokio::test]
    async fn a_failed_cloud_tasks_start_keeps_its_log_and_removes_its_hook() {
        // Reports where Python would look for the hook, then exits.
        let (dir, script, err) = failed_start(
            EmulatorKind::CloudTasks,
            "not-python",
            "#!/bin/sh\necho \"path=$PYTHONPATH\"\nexit 1\n",
            |o| o,
        )
        .await;
        assert!(
            err.contains(".site"),
            "the hook's folder is on PYTHONPATH: {err}"
        );
        let left = files_besides(dir.path(), &script);
        assert_eq!(left.len(), 1, "only the log stays: {left:?}");
        assert!(left[0].to_string_lossy().ends_with(".log"), "{left:?}");
    }

    #[tokio::test]
    async fn program_that_never_answers_times_out_with_its_log() {
        let (_dir, _script, err) = failed_start(
            EmulatorKind::Bigtable,
            "silent-emulator",
            "#!/bin/sh\necho 'listening soon'\nexec sleep 60\n",
            |o| o.readiness_timeout(Duration::from_secs(1)),
        )
        .await;
        assert!(err.contains("did not answer"), "{err}");
        assert!(err.contains("listening soon"), "{err}");
    }
}
