//! Which emulator: [`EmulatorKind`], its program, arguments, variable and install hint, and
//! its readiness probe (each connector's own, behind one signature).

use std::fmt;
use std::path::PathBuf;

use crate::connectors::google::{GrpcChannel, plaintext_channel};
use crate::error::Result;

use super::discover::locate_program;

/// The `gcloud-tasks-emulator` release this crate is tested with, and the one its install hint
/// names (`.ci/run` installs the same one): the emulator's behaviour (how it answers for a
/// missing queue, what it lists) is part of what the tests check.
pub const CLOUD_TASKS_EMULATOR_VERSION: &str = "0.6.2";

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
    pub(super) fn sdk_relative_path(self) -> Option<&'static str> {
        match self {
            EmulatorKind::PubSub => Some("platform/pubsub-emulator/bin/cloud-pubsub-emulator"),
            EmulatorKind::Bigtable => Some("platform/bigtable-emulator/cbtemulator"),
            EmulatorKind::CloudTasks => None,
        }
    }

    /// The arguments that make the program listen on `127.0.0.1:port`.
    pub(super) fn args(self, port: u16) -> Vec<String> {
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

    pub(super) fn slug(self) -> &'static str {
        match self {
            EmulatorKind::PubSub => "pubsub",
            EmulatorKind::Bigtable => "bigtable",
            EmulatorKind::CloudTasks => "cloud-tasks",
        }
    }

    pub(super) fn index(self) -> usize {
        match self {
            EmulatorKind::PubSub => 0,
            EmulatorKind::Bigtable => 1,
            EmulatorKind::CloudTasks => 2,
        }
    }
}

impl EmulatorKind {
    /// One readiness probe: a real call on the emulator's main service at `host`, made by the
    /// connector's own probe (`connectors::<name>::probe`) through the crate's plaintext
    /// channel. The error is the failure as one line.
    pub(super) async fn probe(self, host: &str) -> std::result::Result<(), String> {
        let channel =
            GrpcChannel::Plaintext(plaintext_channel(host).await.map_err(|e| e.to_string())?);
        let outcome = match self {
            EmulatorKind::PubSub => crate::connectors::pubsub::probe::probe(channel).await,
            EmulatorKind::Bigtable => crate::connectors::bigtable::probe::probe(channel).await,
            EmulatorKind::CloudTasks => crate::connectors::cloud_tasks::probe::probe(channel).await,
        };
        outcome.map_err(|status| format!("{:?}: {}", status.code(), status.message()))
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
}
