//! Connections to the local Google Cloud emulators and, with the `testing` feature, a launcher
//! that starts them.
//!
//! [`plaintext_endpoint`] and [`plaintext_channel`] are what every connector uses when an
//! emulator address is configured (`emulator_host`, `PUBSUB_EMULATOR_HOST`, ...): plaintext
//! gRPC, no credentials, no HTTP/2 keepalive pings. They live with the rest of the transport in
//! [`crate::google`] and are re-exported here; they are always available.
//!
//! # The launcher (feature `testing`)
//!
//! With the `testing` feature (on by default through `cli`), this module also starts the
//! emulators on free loopback ports, for the tests and for `gcp-sql --emulators`.
//!
//! Each connector's folder describes its emulator in an [`EmulatorSpec`] in its testing part
//! (`connectors/<name>/testing.rs`: program, arguments, override variable, install step,
//! private install, readiness probe), which the registry lists beside its descriptor; this
//! module reads only those specs, and names and imports no connector. Three emulators are
//! supported, each a separate program found on the machine, listed by
//! `connectors::registry::emulators()`:
//!
//! | kind | program | install |
//! |---|---|---|
//! | [`EmulatorKind::PubSub`] | `cloud-pubsub-emulator` (Java) | `apt-get install google-cloud-cli-pubsub-emulator` |
//! | [`EmulatorKind::Bigtable`] | `cbtemulator` | `apt-get install google-cloud-cli-bigtable-emulator` |
//! | [`EmulatorKind::CloudTasks`] | `gcloud-tasks-emulator` (Python) | `pip install gcloud-tasks-emulator==0.6.2` ([`EmulatorKind::private_install`]) |
//!
//! Each program is looked up in this order: the override variable
//! ([`EmulatorKind::program_override_var`], e.g. `GCP_SQL_PUBSUB_EMULATOR_BIN`), the `PATH`, then
//! the `platform/` folder of a Google Cloud SDK (the folder `gcloud` lives in, and the usual
//! install places such as `/usr/lib/google-cloud-sdk`), and for an emulator whose spec names a
//! [`PipPackage`] (Cloud Tasks) a private install in the cache folder ([`cache_dir`]). A missing program is an error that says how to install it;
//! nothing is skipped silently.
//!
//! The Cloud Tasks emulator is the one that does not come with the Google Cloud CLI: when it is
//! found nowhere, [`Emulator::start`] and [`EmulatorKind::locate`] install the pinned release
//! into a Python virtual environment of their own under the cache folder
//! ([`install_privately`]: one progress line on stderr, tens of seconds, once; a lock
//! file makes concurrent processes wait for one install). Where that cannot work (no `python3`,
//! no `venv` module, no network, [`NO_INSTALL_VAR`] set to `1`) the error names the one command
//! that fixes the machine. [`EmulatorKind::locate`] runs the same
//! lookup without starting anything.
//!
//! [`Emulator::start`] picks a free loopback port, starts the program with its output captured
//! in a log file, and returns once the emulator answers a real gRPC call (Pub/Sub `ListTopics`,
//! Bigtable admin `ListTables`, Cloud Tasks `ListQueues`). If it exits or does not answer in
//! time, the error carries the tail of its log, and the log is kept at the path the error names.
//! Otherwise no file stays behind, however the process ends: the log's name is removed as soon
//! as the emulator is spawned (it keeps writing to the open file).
//!
//! Every emulator listens on 127.0.0.1 only. `gcloud-tasks-emulator` has no listen-address
//! option and would bind every interface, so it is started with a Python start-up hook
//! (`sitecustomize` on `PYTHONPATH`, in a private folder the hook deletes as it runs) that turns
//! its wildcard address into 127.0.0.1.
//!
//! An emulator runs in its own process group and is killed with that whole group when its
//! [`Emulator`] is dropped. It is also tied to the life of this process: on Linux the kernel
//! kills it when the process that started it dies, even by `SIGKILL`
//! (`PR_SET_PDEATHSIG`), so neither a crashed test binary nor a killed `gcp-sql` leaves an
//! emulator behind.
//!
//! ```no_run
//! use gcp_sql::emulators::{Emulator, EmulatorKind};
//!
//! # async fn demo() -> gcp_sql::Result<()> {
//! let pubsub = Emulator::start(EmulatorKind::PubSub).await?;
//! println!("{}={}", pubsub.env_var(), pubsub.host());
//! let channel = gcp_sql::emulators::plaintext_channel(pubsub.host()).await?;
//! # drop(channel);
//! // The emulator stops when `pubsub` goes out of scope.
//! # Ok(())
//! # }
//! ```

#[cfg(any(test, feature = "testing"))]
mod discover;
#[cfg(any(test, feature = "testing"))]
mod hook;
#[cfg(any(test, feature = "testing"))]
mod install;
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod kind;
#[cfg(any(test, feature = "testing"))]
mod launch;
#[cfg(any(test, feature = "testing"))]
mod process;
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod spec;

/// The plaintext endpoint lives with the rest of the transport in
/// [`crate::google`]; it is re-exported here, where the emulators' users look for it.
pub use crate::google::{plaintext_channel, plaintext_endpoint};

#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub use discover::locate_program;
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub use install::{
    CACHE_DIR_VAR, NO_INSTALL_VAR, cache_dir, install_privately, private_venv, python_environment,
};
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub use kind::EmulatorKind;
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub use launch::*;
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub use spec::{EmulatorSpec, PipPackage, Probe};
