//! The Pub/Sub connector: messages published to topics ([`sink`]) and read from subscriptions
//! ([`source`]).
//!
//! Both directions share what is Pub/Sub's alone: [`names`] (topic and subscription names),
//! [`client`] (the channel and the `Publisher` transport, a [`Transport`](crate::core::Transport)),
//! [`dead_letter`] (dead-letter topics, for every connector), [`inspect`] (the emulator
//! helpers) and [`snapshots`] (the snapshot functions of a replay). [`CONNECTOR`] is what the rest of the crate knows of it.

pub mod client;
pub mod dead_letter;
pub mod inspect;
pub mod names;
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod null;
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod null_subscribe;
pub mod sink;
pub mod snapshots;
pub mod source;
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

use crate::connectors::descriptor::{ConnectorDescriptor, ConnectorKind};
use crate::options::Service;

/// The service: its emulator variable and public endpoint.
pub const SERVICE: Service = Service {
    emulator_env_var: "PUBSUB_EMULATOR_HOST",
    public_endpoint: "https://pubsub.googleapis.com",
};

/// The Pub/Sub connector, as the registry lists it.
pub static CONNECTOR: ConnectorDescriptor = ConnectorDescriptor {
    name: "pubsub",
    stored_as: "PUBSUB",
    display_name: "Pub/Sub",
    destination: "topic",
    service: SERVICE,
    options: sink::options::options,
    group_notes: &[(
        crate::options::OptionGroup::Writer,
        "Where a default says *Java SDK default*, it is the default of the official Java client's \
         publisher settings, which this connector takes over so that a pipeline moved from Java \
         behaves the same.",
    )],
    fixed_budgets: &[],
    declare: crate::connectors::sink::declare::<sink::writer::PubSub>,
    inspection: inspect::inspection_functions,
    source: Some(&source::SOURCE),
};

/// This connector's handle.
pub const KIND: ConnectorKind = ConnectorKind::of(&CONNECTOR);
