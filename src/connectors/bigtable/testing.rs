//! What the tests and the benchmarks need of the Bigtable connector (feature `testing`): how its
//! emulator is found, started and probed ([`EMULATOR`]) and the null method its null server
//! answers ([`super::null`]; [`super::null_read`] for reading), as the registry lists them beside the descriptor. Production code
//! never reads this part.

use gcloud_sdk::google::bigtable::admin::v2::ListTablesRequest;
use prost::Message as _;

use crate::bench::null_method::NullService;
use crate::connectors::descriptor::{SampleTable, TestingPart};
use crate::emulators::kind::EmulatorKind;
use crate::emulators::spec::{EmulatorSpec, Probe};

/// The connector's testing part, as the registry lists it.
pub static TESTING: TestingPart = TestingPart {
    emulator: Some(EmulatorKind::Bigtable),
    null_service: Some(NullService::Bigtable),
    sample: SampleTable {
        name: "profiles",
        create: "CREATE EXTERNAL TABLE profiles (k VARCHAR, name VARCHAR) STORED AS BIGTABLE \
         LOCATION 'projects/demo/instances/main-instance/tables/profiles' OPTIONS ('row_key' 'k', \
         'column_family' 'cf', 'emulator_host' 'localhost:8086', 'sink_parallelism' '3')",
        insert: "INSERT INTO profiles VALUES ('k1', 'n1'), ('k2', 'n2')",
    },
};

/// The null servers of the reading side: the `ReadRows` server of [`super::null_read`].
pub static NULL_SOURCES: [NullService; 1] = [NullService::BigtableRead];

/// The Bigtable emulator (`cbtemulator`) of the Google Cloud CLI, as the launcher runs it.
pub static EMULATOR: EmulatorSpec = EmulatorSpec {
    name: "Bigtable",
    env_var: super::SERVICE.emulator_env_var,
    slug: "bigtable",
    program_name: "cbtemulator",
    program_override_var: "GCP_SQL_BIGTABLE_EMULATOR_BIN",
    sdk_relative_path: Some("platform/bigtable-emulator/cbtemulator"),
    listen_args: |port| {
        vec![
            "-host".into(),
            "127.0.0.1".into(),
            "-port".into(),
            port.to_string(),
        ]
    },
    python_loopback_hook: false,
    install_hint: "apt-get install google-cloud-cli-bigtable-emulator",
    private_install: None,
    probe: Probe {
        path: "/google.bigtable.admin.v2.BigtableTableAdmin/ListTables",
        request: || {
            ListTablesRequest {
                parent: "projects/readiness/instances/readiness".into(),
                ..Default::default()
            }
            .encode_to_vec()
        },
    },
    started_note: None,
};

impl EmulatorKind {
    /// The Bigtable emulator.
    #[allow(non_upper_case_globals)]
    pub const Bigtable: EmulatorKind = EmulatorKind::of(&EMULATOR);
}
