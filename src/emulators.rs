//! Connections to the local Google Cloud emulators and, with the `testing` feature, a launcher
//! that starts them.
//!
//! [`plaintext_endpoint`] and [`plaintext_channel`] are what every connector uses when an
//! emulator address is configured (`emulator_host`, `PUBSUB_EMULATOR_HOST`, ...): plaintext
//! gRPC, no credentials, no HTTP/2 keepalive pings. They are always available.
//!
//! # The launcher (feature `testing`)
//!
//! With the `testing` feature (on by default through `cli`), this module also starts the
//! emulators on free loopback ports, for the tests and for `gcp-sql --emulators`.
//!
//! Three emulators are supported, each a separate program found on the machine:
//!
//! | kind | program | install |
//! |---|---|---|
//! | [`EmulatorKind::PubSub`] | `cloud-pubsub-emulator` (Java) | `apt-get install google-cloud-cli-pubsub-emulator` |
//! | [`EmulatorKind::Bigtable`] | `cbtemulator` | `apt-get install google-cloud-cli-bigtable-emulator` |
//! | [`EmulatorKind::CloudTasks`] | `gcloud-tasks-emulator` (Python) | `pip install gcloud-tasks-emulator==0.6.2` ([`CLOUD_TASKS_EMULATOR_VERSION`]) |
//!
//! Each program is looked up in this order: the override variable
//! ([`EmulatorKind::program_override_var`], e.g. `GCP_SQL_PUBSUB_EMULATOR_BIN`), the `PATH`, then
//! the `platform/` folder of a Google Cloud SDK (the folder `gcloud` lives in, and the usual
//! install places such as `/usr/lib/google-cloud-sdk`), and for Cloud Tasks a private install in
//! the cache folder ([`cache_dir`]). A missing program is an error that says how to install it;
//! nothing is skipped silently.
//!
//! The Cloud Tasks emulator is the one that does not come with the Google Cloud CLI: when it is
//! found nowhere, [`Emulator::start`] and [`EmulatorKind::locate`] install the pinned release
//! into a Python virtual environment of their own under the cache folder
//! ([`install_cloud_tasks_emulator`]: one progress line on stderr, tens of seconds, once; a lock
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
mod install;
#[cfg(any(test, feature = "testing"))]
mod launch;

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use crate::error::{Error, Result};

#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub use install::{
    CACHE_DIR_VAR, NO_INSTALL_VAR, cache_dir, cloud_tasks_venv, install_cloud_tasks_emulator,
};
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub use launch::*;

/// TCP connect timeout of [`plaintext_endpoint`]: a loopback emulator either accepts at once or
/// is not there.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Renders an error with its chain of causes (tonic's transport errors say little on their own).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// An endpoint for a plaintext gRPC connection to an emulator at `host` (`127.0.0.1:8085`, or a
/// full `http://` URL).
///
/// It sends no HTTP/2 keepalive pings: the Pub/Sub emulator never answers them, so a client that
/// sends them sees its idle connections reset. Keepalive settings meant for Google's endpoints
/// must not be applied to it.
pub fn plaintext_endpoint(host: &str) -> Result<Endpoint> {
    let uri = if host.contains("://") {
        host.to_string()
    } else {
        format!("http://{host}")
    };
    let endpoint = Endpoint::from_shared(uri).map_err(|e| Error::Connect {
        endpoint: host.to_string(),
        message: format!("not a valid emulator address: {}", error_chain(&e)),
    })?;
    Ok(endpoint.connect_timeout(CONNECT_TIMEOUT).tcp_nodelay(true))
}

/// Connects a plaintext gRPC channel to an emulator at `host`; see [`plaintext_endpoint`].
///
/// ```no_run
/// use gcloud_sdk::google::pubsub::v1::publisher_client::PublisherClient;
///
/// # async fn demo() -> gcp_sql::Result<()> {
/// let channel = gcp_sql::emulators::plaintext_channel("127.0.0.1:8085").await?;
/// let publisher = PublisherClient::new(channel);
/// # drop(publisher);
/// # Ok(())
/// # }
/// ```
pub async fn plaintext_channel(host: &str) -> Result<Channel> {
    plaintext_endpoint(host)?
        .connect()
        .await
        .map_err(|e| Error::Connect {
            endpoint: host.to_string(),
            message: error_chain(&e),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_accepts_host_port_and_url() {
        assert_eq!(
            plaintext_endpoint("127.0.0.1:8085")
                .unwrap()
                .uri()
                .to_string(),
            "http://127.0.0.1:8085/"
        );
        assert_eq!(
            plaintext_endpoint("http://localhost:9")
                .unwrap()
                .uri()
                .to_string(),
            "http://localhost:9/"
        );
        assert!(plaintext_endpoint("not a host").is_err());
    }
}
