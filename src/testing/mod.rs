//! Test support, usable by the crate's own tests and by connector tests.
//!
//! - [`FakeTransport`]: an in-process [`Transport`](crate::core::Transport) scripted per send,
//!   recording every batch, for tests of the flow-control core and of connector writers.
//! - [`FakeServer`]: a gRPC server on a loopback port that serves the generated message types
//!   (unary and server-streaming) from a [`Script`] of per-call [`Reply`]s, for the faults the
//!   emulators cannot produce.

mod grpc;
#[cfg(all(test, feature = "cli"))]
pub(crate) mod logs;
mod transport;

pub(crate) use grpc::Serving;
pub use grpc::{FakeServer, FakeServerBuilder, Reply, Script};
pub use transport::{FakeCall, FakeClient, FakeReply, FakeTransport};
