//! The Python start-up hook that makes `gcloud-tasks-emulator` listen on 127.0.0.1 only.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use crate::error::{Error, Result};

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

/// Creates `dir` (only if it does not exist, readable by us alone) holding the Cloud Tasks
/// start-up hook [`LOOPBACK_SITECUSTOMIZE`].
pub(super) fn write_loopback_hook(dir: &Path) -> Result<()> {
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
