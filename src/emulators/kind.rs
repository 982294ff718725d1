//! Which emulator: [`EmulatorKind`], a copyable handle on an [`EmulatorSpec`], and what the
//! launcher reads of it. This file names no connector and imports no connector: each
//! connector's testing part (`connectors/<name>/emulator.rs`) defines its spec and handle
//! (`EmulatorKind::PubSub`, ...), and the registry (`connectors::registry::emulators`) lists them.

use std::fmt;
use std::path::PathBuf;

use crate::error::Result;
use crate::google::{GrpcChannel, PreEncoded, plaintext_channel, unary_pre_encoded};

use super::discover::locate_program;
use super::spec::{EmulatorSpec, PipPackage};

/// An emulator: a handle on the [`EmulatorSpec`] its connector's folder gives. Two handles are
/// equal when their specs have the same [`slug`](EmulatorSpec::slug).
///
/// ```
/// use gcp_sql::connectors::registry;
/// use gcp_sql::emulators::EmulatorKind;
///
/// let names: Vec<&str> = registry::emulators().map(|k| k.name()).collect();
/// assert_eq!(names, ["Pub/Sub", "Cloud Tasks", "Bigtable"]);
/// assert_eq!(EmulatorKind::Bigtable.env_var(), "BIGTABLE_EMULATOR_HOST");
/// ```
#[derive(Clone, Copy)]
pub struct EmulatorKind(&'static EmulatorSpec);

impl EmulatorKind {
    /// The handle of `spec` (each connector's testing part defines its constant with it).
    pub const fn of(spec: &'static EmulatorSpec) -> EmulatorKind {
        EmulatorKind(spec)
    }

    /// What the connector's folder says about its emulator.
    pub fn spec(self) -> &'static EmulatorSpec {
        self.0
    }

    /// The service's name as users know it (`Pub/Sub`, `Bigtable`, `Cloud Tasks`).
    pub fn name(self) -> &'static str {
        self.spec().name
    }

    /// The variable the connectors (and Google's own clients) read to reach this emulator.
    pub fn env_var(self) -> &'static str {
        self.spec().env_var
    }

    /// The variable that, when set, names the emulator program to run instead of looking it up.
    pub fn program_override_var(self) -> &'static str {
        self.spec().program_override_var
    }

    /// How to install the emulator on a Debian machine with the Google Cloud CLI repository
    /// (Pub/Sub, Bigtable) or with pip (Cloud Tasks, pinned to its
    /// [`private_install`](Self::private_install) release).
    ///
    /// ```
    /// use gcp_sql::emulators::EmulatorKind;
    /// let package = EmulatorKind::CloudTasks.private_install().unwrap();
    /// assert_eq!(
    ///     EmulatorKind::CloudTasks.install_hint(),
    ///     format!("pip install {}=={}", package.name, package.version)
    /// );
    /// ```
    pub fn install_hint(self) -> &'static str {
        self.spec().install_hint
    }

    /// The package installed privately when the program is found nowhere (only the emulator
    /// that does not come with the Google Cloud CLI has one).
    pub fn private_install(self) -> Option<PipPackage> {
        self.spec().private_install
    }

    /// Finds the emulator's program the way [`Emulator::start`](super::Emulator::start) does
    /// (over this process's environment), without starting it: the error of a missing program
    /// names it and the command that installs it.
    ///
    /// Tests that run the `gcp-sql` tool with `--emulators` call it first, so that a machine
    /// without an emulator fails them with that one message rather than with an assertion on
    /// what the tool went on to do without it.
    ///
    /// An emulator with a [`private_install`](Self::private_install), missing from the `PATH`
    /// and from the private install, is installed there first
    /// ([`install_privately`](super::install_privately)), unless that is turned off.
    pub fn locate(self) -> Result<PathBuf> {
        let env = |var: &str| std::env::var_os(var);
        match locate_program(self, env) {
            Err(_)
                if self.private_install().is_some()
                    && env(self.program_override_var()).is_none_or(|v| v.is_empty()) =>
            {
                super::install::install_privately(self, env)
            }
            found => found,
        }
    }

    /// The program's file name, as looked up on the `PATH`.
    pub fn program_name(self) -> &'static str {
        self.spec().program_name
    }

    /// Where the program sits inside a Google Cloud SDK folder, for those that ship with it.
    pub(super) fn sdk_relative_path(self) -> Option<&'static str> {
        self.spec().sdk_relative_path
    }

    /// The arguments that make the program listen on `127.0.0.1:port`.
    pub(super) fn args(self, port: u16) -> Vec<String> {
        (self.spec().listen_args)(port)
    }

    pub(super) fn slug(self) -> &'static str {
        self.spec().slug
    }

    /// One readiness probe: the emulator's [`Probe`](super::spec::Probe) call at `host`,
    /// through the crate's plaintext channel; `Ok` once it answers (the answer is not read).
    /// The error is the failure as one line.
    pub(super) async fn probe(self, host: &str) -> std::result::Result<(), String> {
        let channel =
            GrpcChannel::Plaintext(plaintext_channel(host).await.map_err(|e| e.to_string())?);
        let probe = self.spec().probe;
        let request = tonic::Request::new(PreEncoded((probe.request)()));
        unary_pre_encoded::<_, Vec<u8>, PreEncoded>(channel, request, probe.path)
            .await
            .map(drop)
            .map_err(|status| format!("{:?}: {}", status.code(), status.message()))
    }
}

impl PartialEq for EmulatorKind {
    fn eq(&self, other: &Self) -> bool {
        self.0.slug == other.0.slug
    }
}

impl Eq for EmulatorKind {}

impl std::hash::Hash for EmulatorKind {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.slug.hash(state);
    }
}

impl fmt::Debug for EmulatorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("EmulatorKind").field(&self.0.slug).finish()
    }
}

impl fmt::Display for EmulatorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
