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
pub mod google;
pub mod pubsub;
pub mod registry;
pub mod shared;
pub mod sink;

pub use descriptor::{
    ConnectorDescriptor, ConnectorKind, Routing, SinkConnector, SourceDescriptor,
};
pub use registry::build_sink;
pub use shared::TableOptions;

/// Selects the process-wide TLS crypto provider (ring) unless one is installed already.
///
/// The dependency tree enables two rustls providers, and rustls then refuses to pick one by
/// itself; every TLS connection this crate opens (Google endpoints, `gs://`, `s3://`) calls this
/// first.
pub fn install_crypto_provider() {
    // An Err only says that a provider is installed already, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
