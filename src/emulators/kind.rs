//! Which emulator: [`EmulatorKind`], a copyable handle on a connector whose descriptor carries
//! an [`EmulatorSpec`], and what the launcher reads of it. This file names no connector: each
//! connector's folder defines its handle (`EmulatorKind::PubSub`, ...), and the registry lists
//! them in [`EmulatorKind::ALL`].
//!
//! It imports nothing that imports the registry, so a connector's folder may import it.

use std::fmt;
use std::path::PathBuf;

use crate::connectors::descriptor::ConnectorKind;
use crate::connectors::google::{GrpcChannel, PreEncoded, plaintext_channel, unary_pre_encoded};
use crate::error::Result;

use super::discover::locate_program;
use super::spec::{EmulatorSpec, PipPackage};

/// An emulator: the handle of a connector that has one. Two handles are equal when they name
/// the same connector.
///
/// ```
/// use gcp_sql::emulators::EmulatorKind;
///
/// let names: Vec<&str> = EmulatorKind::ALL.iter().map(|k| k.name()).collect();
/// assert_eq!(names, ["Pub/Sub", "Bigtable", "Cloud Tasks"]);
/// assert_eq!(EmulatorKind::Bigtable.env_var(), "BIGTABLE_EMULATOR_HOST");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct EmulatorKind(ConnectorKind);

impl EmulatorKind {
    /// The emulator of `connector`, whose descriptor must carry an emulator spec (checked when
    /// the handle is built; a connector folder builds its handle as a constant, so a missing
    /// spec fails the build).
    pub const fn of(connector: ConnectorKind) -> EmulatorKind {
        if connector.descriptor().emulator.is_none() {
            panic!("EmulatorKind::of: this connector's descriptor has no emulator");
        }
        EmulatorKind(connector)
    }

    /// The emulator of `connector`, if its descriptor has one.
    pub fn of_connector(connector: ConnectorKind) -> Option<EmulatorKind> {
        connector
            .descriptor()
            .emulator
            .is_some()
            .then_some(EmulatorKind(connector))
    }

    /// What the connector's folder says about its emulator.
    pub fn spec(self) -> &'static EmulatorSpec {
        self.0
            .descriptor()
            .emulator
            .expect("an EmulatorKind is only built for a descriptor with an emulator")
    }

    /// The service's name as users know it (`Pub/Sub`, `Bigtable`, `Cloud Tasks`).
    pub fn name(self) -> &'static str {
        self.spec().name
    }

    /// The variable the connectors (and Google's own clients) read to reach this emulator.
    pub fn env_var(self) -> &'static str {
        self.0.emulator_env_var()
    }

    /// The connector this emulator serves.
    pub fn connector(self) -> ConnectorKind {
        self.0
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

impl fmt::Debug for EmulatorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("EmulatorKind").field(&self.0).finish()
    }
}

impl fmt::Display for EmulatorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_install_hint_pins_the_version_ci_installs() {
        let ci = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/run")).unwrap();
        let private: Vec<(EmulatorKind, PipPackage)> = EmulatorKind::ALL
            .iter()
            .filter_map(|k| Some((*k, k.private_install()?)))
            .collect();
        assert!(!private.is_empty(), "one emulator is installed privately");
        for (kind, package) in private {
            // `gcloud-tasks-emulator` is pinned as `GCLOUD_TASKS_EMULATOR_VERSION=...`.
            let variable = format!(
                "{}_VERSION",
                package.name.to_ascii_uppercase().replace('-', "_")
            );
            assert!(
                ci.contains(&format!("{variable}={}\n", package.version)),
                ".ci/run pins another version than {}",
                package.version
            );
            assert!(
                kind.install_hint()
                    .ends_with(&format!("=={}", package.version))
            );
        }
    }

    #[test]
    fn the_list_holds_every_connector_with_an_emulator_once() {
        for connector in crate::connectors::registry::kinds() {
            let listed = EmulatorKind::ALL
                .iter()
                .filter(|k| k.connector() == connector)
                .count();
            let has = usize::from(connector.descriptor().emulator.is_some());
            assert_eq!(listed, has, "{connector}");
        }
    }
}
