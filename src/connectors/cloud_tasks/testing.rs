//! What the tests and the benchmarks need of the Cloud Tasks connector (feature `testing`): how its
//! emulator is found, started and probed ([`EMULATOR`]) and the null method its null server
//! answers ([`super::null`]), as the registry lists them beside the descriptor. Production code
//! never reads this part.

use gcloud_sdk::google::cloud::tasks::v2::ListQueuesRequest;
use prost::Message as _;

use crate::bench::null_method::NullService;
use crate::connectors::descriptor::{SampleTable, TestingPart};
use crate::emulators::kind::EmulatorKind;
use crate::emulators::spec::{EmulatorSpec, PipPackage, Probe};

/// The connector's testing part, as the registry lists it.
pub static TESTING: TestingPart = TestingPart {
    emulator: Some(EmulatorKind::CloudTasks),
    null_service: Some(NullService::CloudTasks),
    sample: SampleTable {
        name: "jobs",
        create: "CREATE EXTERNAL TABLE jobs (body VARCHAR) STORED AS CLOUD_TASKS \
         LOCATION 'projects/demo/locations/us-central1/queues/jobs' OPTIONS ('url' \
         'https://worker.example.com/run', 'emulator_host' 'localhost:8123', \
         'max_in_flight_tasks' '7')",
        insert: "INSERT INTO jobs VALUES ('{}')",
    },
};

/// The `gcloud-tasks-emulator` package from PyPI (a Python program), as the launcher runs it
/// and, when it is found nowhere, installs it privately.
pub static EMULATOR: EmulatorSpec = EmulatorSpec {
    name: "Cloud Tasks",
    env_var: super::SERVICE.emulator_env_var,
    slug: "cloud-tasks",
    program_name: "gcloud-tasks-emulator",
    program_override_var: "GCP_SQL_CLOUD_TASKS_EMULATOR_BIN",
    sdk_relative_path: None,
    // gcloud-tasks-emulator 0.6 has no listen-address option (its gRPC server binds
    // `[::]:port`, every interface): the launcher's Python start-up hook narrows it to
    // 127.0.0.1.
    listen_args: |port| vec!["start".into(), format!("--port={port}")],
    python_loopback_hook: true,
    install_hint: "pip install gcloud-tasks-emulator==0.6.2",
    private_install: Some(PipPackage {
        name: "gcloud-tasks-emulator",
        version: super::EMULATOR_VERSION,
    }),
    probe: Probe {
        path: "/google.cloud.tasks.v2.CloudTasks/ListQueues",
        request: || {
            ListQueuesRequest {
                parent: "projects/readiness/locations/readiness".into(),
                ..Default::default()
            }
            .encode_to_vec()
        },
    },
    // The emulator starts without a queue and the sink never creates one.
    started_note: Some(
        "The Cloud Tasks emulator has no queue yet: create one with \
         SELECT * FROM cloud_tasks_create_queue('projects/P/locations/L/queues/Q');",
    ),
};

impl EmulatorKind {
    /// The Cloud Tasks emulator.
    #[allow(non_upper_case_globals)]
    pub const CloudTasks: EmulatorKind = EmulatorKind::of(&EMULATOR);
}
