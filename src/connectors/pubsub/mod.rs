//! The Pub/Sub connector: messages published to topics ([`sink`]) and read from subscriptions
//! ([`source`]).
//!
//! Both directions share what is Pub/Sub's alone: [`names`] (topic and subscription names),
//! [`client`] (the channel and the `Publisher` transport, a [`Transport`](crate::core::Transport)),
//! [`dead_letter`] (dead-letter topics, for every connector) and [`inspect`] (the emulator
//! helpers). [`CONNECTOR`] is what the rest of the crate knows of it.

pub mod client;
pub mod dead_letter;
pub mod inspect;
pub mod names;
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod null;
pub mod sink;
pub mod source;

use crate::connectors::descriptor::{ConnectorDescriptor, ConnectorKind};
#[cfg(any(test, feature = "testing"))]
use crate::emulators::kind::EmulatorKind;
#[cfg(any(test, feature = "testing"))]
use crate::emulators::spec::{EmulatorSpec, Probe};
use crate::options::Service;
#[cfg(any(test, feature = "testing"))]
use gcloud_sdk::google::pubsub::v1::ListTopicsRequest;
#[cfg(any(test, feature = "testing"))]
use prost::Message as _;

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
    #[cfg(any(test, feature = "testing"))]
    emulator: Some(&EMULATOR),
    #[cfg(any(test, feature = "testing"))]
    null_service: Some(&null::NULL_METHOD),
};

/// This connector's handle.
pub const KIND: ConnectorKind = ConnectorKind::of(&CONNECTOR);

/// The Pub/Sub emulator of the Google Cloud CLI (a Java program), as the launcher runs it.
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub static EMULATOR: EmulatorSpec = EmulatorSpec {
    name: "Pub/Sub",
    slug: "pubsub",
    program_name: "cloud-pubsub-emulator",
    program_override_var: "GCP_SQL_PUBSUB_EMULATOR_BIN",
    sdk_relative_path: Some("platform/pubsub-emulator/bin/cloud-pubsub-emulator"),
    listen_args: |port| vec!["--host=127.0.0.1".into(), format!("--port={port}")],
    python_loopback_hook: false,
    install_hint: "apt-get install google-cloud-cli-pubsub-emulator (it also needs a Java runtime: apt-get install default-jre-headless)",
    private_install: None,
    probe: Probe {
        path: "/google.pubsub.v1.Publisher/ListTopics",
        request: || {
            ListTopicsRequest {
                project: "projects/readiness".into(),
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
    /// The Pub/Sub emulator.
    #[allow(non_upper_case_globals)]
    pub const PubSub: EmulatorKind = EmulatorKind::of(KIND);
}
