//! What a connector's folder says about its emulator: one [`EmulatorSpec`], in the connector's
//! testing part (`connectors/<name>/emulator.rs`), which the registry lists beside its
//! descriptor. The launcher reads only this; it names no connector and imports none.

/// One readiness probe: a real unary call on the emulator's main service (Pub/Sub
/// `ListTopics`, Bigtable admin `ListTables`, Cloud Tasks `ListQueues`), which an emulator
/// answers only once it serves its API. The launcher makes it for every emulator the same way.
#[derive(Debug, Clone, Copy)]
pub struct Probe {
    /// The method's gRPC path (`/google.pubsub.v1.Publisher/ListTopics`).
    pub path: &'static str,
    /// The request message, serialized.
    pub request: fn() -> Vec<u8>,
}

/// A Python package the launcher installs into a private virtual environment of its own when
/// the emulator is found nowhere else (see [`crate::emulators`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipPackage {
    /// The package's name on PyPI (`gcloud-tasks-emulator`); its program has the emulator's
    /// [`EmulatorSpec::program_name`].
    pub name: &'static str,
    /// The pinned release, the one the tests run against and `.ci/run` installs.
    pub version: &'static str,
}

/// How one emulator is found, installed, started and probed.
#[derive(Debug)]
pub struct EmulatorSpec {
    /// The service's name as users know it (`Pub/Sub`, `Bigtable`, `Cloud Tasks`).
    pub name: &'static str,
    /// The variable the connector (and Google's own clients) reads to reach the emulator
    /// (`PUBSUB_EMULATOR_HOST`): the connector's own, as its descriptor's service names it.
    pub env_var: &'static str,
    /// A short word for file names (`pubsub`, `cloud-tasks`): the log file is
    /// `gcp-sql-<slug>-emulator-<pid>-<port>.log`.
    pub slug: &'static str,
    /// The program's file name, as looked up on the `PATH`.
    pub program_name: &'static str,
    /// The variable that, when set, names the program to run instead of looking it up.
    pub program_override_var: &'static str,
    /// Where the program sits inside a Google Cloud SDK folder, for those that ship with it.
    pub sdk_relative_path: Option<&'static str>,
    /// The arguments that make the program listen on `127.0.0.1:port`.
    pub listen_args: fn(port: u16) -> Vec<String>,
    /// A Python program: started unbuffered, with the start-up hook that narrows its wildcard
    /// listen address to 127.0.0.1 (for a program without a listen-address option).
    pub python_loopback_hook: bool,
    /// The one command that installs it.
    pub install_hint: &'static str,
    /// Installed privately when found nowhere: the package and its pinned release.
    pub private_install: Option<PipPackage>,
    /// The readiness probe: which call to make.
    pub probe: Probe,
    /// A line `gcp-sql --emulators` prints once this emulator has started (what a user must do
    /// before the first write), if any.
    pub started_note: Option<&'static str>,
}
