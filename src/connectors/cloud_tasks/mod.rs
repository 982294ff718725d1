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
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
pub mod writer;

use crate::connectors::descriptor::{ConnectorDescriptor, ConnectorKind};
use crate::options::Service;

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
};

/// This connector's handle.
pub const KIND: ConnectorKind = ConnectorKind::of(&CONNECTOR);

/// The `gcloud-tasks-emulator` release this crate is tested with, and the one its install hint
/// names (`.ci/run` installs the same one): the emulator's behaviour (how it answers for a
/// missing queue, what it lists) is part of what the tests check.
pub const EMULATOR_VERSION: &str = "0.6.2";
