//! What the tests and the benchmarks need of the Pub/Sub connector (feature `testing`): how its
//! emulator is found, started and probed ([`EMULATOR`]) and the null method its null server
//! answers ([`super::null`]), as the registry lists them beside the descriptor. Production code
//! never reads this part.

use gcloud_sdk::google::pubsub::v1::ListTopicsRequest;
use prost::Message as _;

use crate::bench::null_method::NullService;
use crate::connectors::descriptor::{SampleTable, TestingPart};
use crate::emulators::kind::EmulatorKind;
use crate::emulators::spec::{EmulatorSpec, Probe};

/// The connector's testing part, as the registry lists it.
pub static TESTING: TestingPart = TestingPart {
    emulator: Some(EmulatorKind::PubSub),
    null_service: Some(NullService::PubSub),
    sample: SampleTable {
        name: "clicks",
        create: "CREATE EXTERNAL TABLE clicks (k VARCHAR, seq BIGINT, note VARCHAR) STORED AS PUBSUB \
         LOCATION 'projects/demo/topics/clicks' OPTIONS ('enable_message_ordering' 'true', \
         'ordering_key_column' 'k', 'emulator_host' 'localhost:8085', \
         'batch_element_count_threshold' '50', 'publish_progress_timeout' '30s')",
        // Ordered by the key: the writers require that order of their input.
        insert: "INSERT INTO clicks SELECT k, seq, note FROM (VALUES ('a', 1, 'x'), ('b', 2, 'y')) \
         AS v(k, seq, note) ORDER BY k, seq",
    },
};

/// The null servers of the reading side: the StreamingPull server of [`super::null_subscribe`].
pub static NULL_SOURCES: [NullService; 1] = [NullService::PubSubSubscribe];

/// The Pub/Sub emulator of the Google Cloud CLI (a Java program), as the launcher runs it.
pub static EMULATOR: EmulatorSpec = EmulatorSpec {
    name: "Pub/Sub",
    env_var: super::SERVICE.emulator_env_var,
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

impl EmulatorKind {
    /// The Pub/Sub emulator.
    #[allow(non_upper_case_globals)]
    pub const PubSub: EmulatorKind = EmulatorKind::of(&EMULATOR);
}
