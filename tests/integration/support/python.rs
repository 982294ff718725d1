//! The Python environments of the tests that check what landed with an independent library
//! (`fastavro` and `google.protobuf` for schema'd payloads, Google's Python Bigtable client for
//! tables). `cargo test` makes each once, on first use, in gcp-sql's cache folder, the way the
//! Cloud Tasks emulator is installed privately ([`gcp_sql::emulators::python_environment`]),
//! so a fresh machine needs only `python3` with `venv` and access to PyPI.
//! `GCP_SQL_TEST_PYTHON` names a Python to use instead, for every environment.

use std::path::PathBuf;

/// The variable naming a Python to use instead of the tests' own environments.
pub const TEST_PYTHON_VAR: &str = "GCP_SQL_TEST_PYTHON";

/// The decoders of the Avro and Protobuf payload tests.
pub const SCHEMA_DECODERS: &[&str] = &["fastavro==1.13.1", "protobuf==4.25.9"];

/// Google's Python Bigtable client (it needs a newer `protobuf` than [`SCHEMA_DECODERS`] pins,
/// hence an environment of its own).
pub const BIGTABLE_CLIENT: &[&str] = &["google-cloud-bigtable==2.50.2"];

/// The Python of the environment with `packages` (pinned `name==version`), made on first use.
/// Panics with the command that fixes the machine when it cannot be made.
pub fn python_with(packages: &[&str]) -> PathBuf {
    if let Some(python) = std::env::var_os(TEST_PYTHON_VAR).filter(|p| !p.is_empty()) {
        return PathBuf::from(python);
    }
    gcp_sql::emulators::python_environment("test-python", packages, |v| std::env::var_os(v))
        .unwrap_or_else(|e| panic!("{e} (or set {TEST_PYTHON_VAR} to a Python that has them)"))
}
