//! gRPC plumbing the connectors' clients, the inspection functions and the emulator launcher
//! share when they talk to Google or to an emulator, one file per concern. It sits below every
//! one of them and imports none:
//!
//! | file | concern |
//! |---|---|
//! | `plaintext` | the plaintext endpoint to an emulator or a fake server ([`plaintext_endpoint`]) |
//! | `tls` | the authenticated TLS connection to Google ([`connect`], [`require_tls`], [`install_crypto_provider`]) |
//! | `credentials` | credentials files ([`credentials_from_file`]) |
//! | `connection` | where a transport's channels come from ([`Connection`]) |
//! | `channel` | the one channel type every call goes through ([`GrpcChannel`]) |
//! | `status` | the one place a broken connection becomes a retryable status ([`transport_status`]) |
//! | `reachability` | "nothing answers there" ([`Reachability`], [`nothing_listens`]) |
//! | `routing` | the `x-goog-request-params` routing header ([`routing_value`]) |
//! | `deadline` | per-attempt deadlines ([`with_deadline`]) |
//! | `pre_encoded` | request bodies that are already serialized ([`unary_pre_encoded`]) |
//!
//! What is specific to a service (its endpoints, method paths, how statuses are classified,
//! how many channels it opens) stays in that connector's `client` module.

mod channel;
mod connection;
mod credentials;
mod deadline;
mod plaintext;
mod pre_encoded;
mod reachability;
mod routing;
mod status;
#[cfg(test)]
mod test_support;
mod tls;

pub use channel::GrpcChannel;
pub use connection::Connection;
pub use credentials::{CLOUD_PLATFORM_SCOPE, credentials_from_file};
pub use deadline::with_deadline;
pub use plaintext::{plaintext_channel, plaintext_endpoint};
pub use pre_encoded::{PreEncoded, ready, unary_pre_encoded};
pub use reachability::{NO_ANSWER_WARN_ATTEMPTS, Reachability, emulator_setting, nothing_listens};
pub use routing::{ROUTING_HEADER, routing_value};
pub use status::transport_status;
pub use tls::{connect, install_crypto_provider, require_tls};
