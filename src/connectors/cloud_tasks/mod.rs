//! The Cloud Tasks connector: one HTTP task created in a queue per row.
//!
//! Split as the other connectors are: [`options`] (the typed options and their builder),
//! [`mapping`] (rows to serialized tasks, pure), [`client`] (the `CreateTask` transport) and
//! [`writer`] (the sink, glue onto the flow-control core). See `docs/cloud_tasks.md`.

pub mod client;
pub mod inspect;
pub mod mapping;
pub mod names;
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod null;
pub mod options;
pub mod writer;

use crate::connectors::descriptor::{ConnectorDescriptor, ConnectorKind};
#[cfg(any(test, feature = "testing"))]
use crate::emulators::kind::EmulatorKind;
#[cfg(any(test, feature = "testing"))]
use crate::emulators::spec::{EmulatorSpec, PipPackage, Probe};
use crate::options::Service;
#[cfg(any(test, feature = "testing"))]
use gcloud_sdk::google::cloud::tasks::v2::ListQueuesRequest;
#[cfg(any(test, feature = "testing"))]
use prost::Message as _;

/// The service: its emulator variable and public endpoint.
pub const SERVICE: Service = Service {
    emulator_env_var: "CLOUD_TASKS_EMULATOR_HOST",
    public_endpoint: "https://cloudtasks.googleapis.com",
};

/// The Cloud Tasks connector, as the registry lists it.
pub static CONNECTOR: ConnectorDescriptor = ConnectorDescriptor {
    name: "cloud_tasks",
    stored_as: "CLOUD_TASKS",
    display_name: "Cloud Tasks",
    destination: "queue",
    service: SERVICE,
    options: options::options,
    group_notes: &[],
    fixed_budgets: options::FIXED_BUDGETS,
    declare: crate::connectors::sink::declare::<writer::CloudTasks>,
    inspection: inspect::inspection_functions,
    source: None,
    #[cfg(any(test, feature = "testing"))]
    emulator: Some(&EMULATOR),
    #[cfg(any(test, feature = "testing"))]
    null_service: Some(&null::NULL_METHOD),
};

/// This connector's handle.
pub const KIND: ConnectorKind = ConnectorKind::of(&CONNECTOR);

/// The `gcloud-tasks-emulator` release this crate is tested with, and the one its install hint
/// names (`.ci/run` installs the same one): the emulator's behaviour (how it answers for a
/// missing queue, what it lists) is part of what the tests check.
pub const EMULATOR_VERSION: &str = "0.6.2";

/// The `gcloud-tasks-emulator` package from PyPI (a Python program), as the launcher runs it
/// and, when it is found nowhere, installs it privately.
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub static EMULATOR: EmulatorSpec = EmulatorSpec {
    name: "Cloud Tasks",
    slug: "cloud-tasks",
    program_name: "gcloud-tasks-emulator",
    program_override_var: "GCP_SQL_CLOUD_TASKS_EMULATOR_BIN",
    sdk_relative_path: None,
    // gcloud-tasks-emulator 0.6 has no listen-address option (its gRPC server binds
    // `[::]:port`, every interface): the launcher's Python start-up hook narrows it to
    // 127.0.0.1.
    listen_args: |port| vec!["start".into(), format!("--port={port}")],
    python_loopback_hook: true,
    install_hint: "pip install gcloud-tasks-emulator==0.6.2",
    private_install: Some(PipPackage {
        name: "gcloud-tasks-emulator",
        version: EMULATOR_VERSION,
    }),
    probe: Probe {
        path: "/google.cloud.tasks.v2.CloudTasks/ListQueues",
        request: || {
            ListQueuesRequest {
                parent: "projects/readiness/locations/readiness".into(),
                ..Default::default()
            }
            .encode_to_vec()
        },
    },
    // The emulator starts without a queue and the sink never creates one.
    started_note: Some(
        "The Cloud Tasks emulator has no queue yet: create one with \
         SELECT * FROM cloud_tasks_create_queue('projects/P/locations/L/queues/Q');",
    ),
};

#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
impl EmulatorKind {
    /// The Cloud Tasks emulator.
    #[allow(non_upper_case_globals)]
    pub const CloudTasks: EmulatorKind = EmulatorKind::of(KIND);
}
