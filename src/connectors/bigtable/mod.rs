//! The Bigtable connector: rows written as row mutations (`MutateRows`), one entry per row.
//!
//! Split like every connector: [`options`] (the typed options and their builder), [`mapping`]
//! (Arrow rows to serialized entries, pure), [`client`] (the gRPC side, a
//! [`Transport`](crate::core::Transport)) and [`writer`] (the glue onto the flow-control core);
//! [`scan`] reads a declared table back for `SELECT`, and [`dml`] plans `DELETE` and `UPDATE`
//! on it.
//! See `docs/bigtable.md` for the user's view.

pub mod client;
pub mod dml;
pub mod inspect;
pub mod lookup;
pub mod lookup_options;
pub mod mapping;
pub mod names;
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod null;
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod null_read;
pub mod options;
pub mod scan;
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
pub mod writer;

use crate::connectors::descriptor::{ConnectorDescriptor, ConnectorKind};
use crate::options::Service;

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
};

/// This connector's handle.
pub const KIND: ConnectorKind = ConnectorKind::of(&CONNECTOR);
