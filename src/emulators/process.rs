//! Process control: a free loopback port, a child tied to this process's life (killed with it,
//! even by `SIGKILL`), spawned from one long-lived thread, and its log file.

use std::fs::{File, OpenOptions};
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
#[cfg(target_os = "linux")]
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::{Mutex, OnceLock, mpsc};

use crate::error::Result;

/// How many log lines a start failure shows.
const LOG_TAIL_LINES: usize = 25;

/// Asks the OS for a free port on 127.0.0.1 by binding port 0 and releasing it.
pub(super) fn free_loopback_port() -> Result<u16> {
    let listener = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

/// Makes the kernel kill the child when the thread that spawned it dies (Linux only).
#[cfg(target_os = "linux")]
pub(super) fn tie_to_parent(command: &mut Command) {
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
pub(super) fn tie_to_parent(_command: &mut Command) {}

type SpawnRequest = (Command, mpsc::SyncSender<io::Result<Child>>);

/// Spawns `command` from a thread that lives as long as the process.
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not the process. Test
/// threads, tokio's blocking threads and short-lived runtimes all end long before the process
/// does, so every emulator is forked from one dedicated thread that never returns: the signal
/// then comes exactly when the process dies.
pub(super) fn spawn_from_long_lived_thread(command: Command) -> io::Result<Child> {
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

/// Everything written to the (unlinked) log so far. Positioned reads: the emulator's writes
/// share the file offset with this handle, which must not move.
pub(super) fn read_log(log: &File) -> io::Result<Vec<u8>> {
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
pub(super) fn keep_log(log: &File, path: &Path) -> io::Result<()> {
    let bytes = read_log(log)?;
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    io::Write::write_all(&mut file, &bytes)
}

pub(super) fn log_tail(log: &File) -> String {
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
