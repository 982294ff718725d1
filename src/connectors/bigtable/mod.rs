//! The Bigtable connector: rows written as row mutations (`MutateRows`), one entry per row.
//!
//! Split like every connector: [`options`] (the typed options and their builder), [`mapping`]
//! (Arrow rows to serialized entries, pure), [`client`] (the gRPC side, a
//! [`Transport`](crate::core::Transport)) and [`writer`] (the glue onto the flow-control core).
//! See `docs/bigtable.md` for the user's view.

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
use crate::emulators::spec::{EmulatorSpec, Probe};
use crate::options::Service;
#[cfg(any(test, feature = "testing"))]
use gcloud_sdk::google::bigtable::admin::v2::ListTablesRequest;
#[cfg(any(test, feature = "testing"))]
use prost::Message as _;

/// The service: its emulator variable and public endpoint.
pub const SERVICE: Service = Service {
    emulator_env_var: "BIGTABLE_EMULATOR_HOST",
    public_endpoint: "https://bigtable.googleapis.com",
};

/// The Bigtable connector, as the registry lists it.
pub static CONNECTOR: ConnectorDescriptor = ConnectorDescriptor {
    name: "bigtable",
    stored_as: "BIGTABLE",
    display_name: "Bigtable",
    destination: "table",
    service: SERVICE,
    options: options::options,
    group_notes: &[],
    fixed_budgets: options::FIXED_BUDGETS,
    declare: crate::connectors::sink::declare::<writer::Bigtable>,
    inspection: inspect::inspection_functions,
    source: None,
    #[cfg(any(test, feature = "testing"))]
    emulator: Some(&EMULATOR),
    #[cfg(any(test, feature = "testing"))]
    null_service: Some(&null::NULL_METHOD),
};

/// This connector's handle.
pub const KIND: ConnectorKind = ConnectorKind::of(&CONNECTOR);

/// The Bigtable emulator (`cbtemulator`) of the Google Cloud CLI, as the launcher runs it.
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub static EMULATOR: EmulatorSpec = EmulatorSpec {
    name: "Bigtable",
    slug: "bigtable",
    program_name: "cbtemulator",
    program_override_var: "GCP_SQL_BIGTABLE_EMULATOR_BIN",
    sdk_relative_path: Some("platform/bigtable-emulator/cbtemulator"),
    listen_args: |port| {
        vec![
            "-host".into(),
            "127.0.0.1".into(),
            "-port".into(),
            port.to_string(),
        ]
    },
    python_loopback_hook: false,
    install_hint: "apt-get install google-cloud-cli-bigtable-emulator",
    private_install: None,
    probe: Probe {
        path: "/google.bigtable.admin.v2.BigtableTableAdmin/ListTables",
        request: || {
            ListTablesRequest {
                parent: "projects/readiness/instances/readiness".into(),
                ..Default::default()
            }
            .encode_to_vec()
        },
    },
    started_note: None,
};

#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
impl EmulatorKind {
    /// The Bigtable emulator.
    #[allow(non_upper_case_globals)]
    pub const Bigtable: EmulatorKind = EmulatorKind::of(KIND);
}
