//! The connectors, and what the rest of the crate reaches them through. Each connector is one
//! folder split the same way: `options` (the typed option model and its builder), `mapping`
//! (Arrow rows to records, pure), `client` (the gRPC side, a [`crate::core::Transport`]),
//! `writer` (the connector's [`sink::Connector`] impl: what the one generic [`sink::Sink`]
//! needs from it), and a `CONNECTOR` [`ConnectorDescriptor`] that [`registry`] lists.

pub mod bigtable;
pub mod catalog;
pub mod cloud_tasks;
pub mod dead_letter;
pub mod descriptor;
pub mod lookup;
pub mod pubsub;
pub mod registry;
pub mod shared;
pub mod sink;

pub use descriptor::{
    ConnectorDescriptor, ConnectorKind, Routing, SinkConnector, SourceDescriptor,
};
pub use registry::build_sink;
pub use shared::TableOptions;

/// The process-wide TLS crypto provider lives with the rest of the transport, in
/// [`crate::google`]; re-exported here, where the connectors' users call it.
pub use crate::google::install_crypto_provider;
