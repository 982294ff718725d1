//! The Pub/Sub sink: rows published to topics.
//!
//! Split like every connector's sink: [`options`] (the typed options and their builder),
//! [`mapping`] (Arrow rows to messages, pure), [`writer`] (the glue onto the flow-control core;
//! the gRPC side is the connector's shared [`client`](super::client)).

pub mod mapping;
pub mod options;
pub mod writer;
