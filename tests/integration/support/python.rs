//! The Python environments of the tests that check what landed with an independent library
//! (`fastavro` and `google.protobuf` for schema'd payloads, Google's Python Bigtable client for
//! tables). `cargo test` makes each once, on first use, as a virtual environment under gcp-sql's
//! cache folder (the one of the Cloud Tasks emulator's private install, README
//! "Requirements"), so a fresh machine needs only `python3` with `venv` and access to PyPI.
//!
//! Each environment is named after a hash of its pinned packages, so a change of pins makes a
//! new one. It is built under a temporary name and renamed into place once `pip` succeeded: a
//! killed install never counts as done, and of two processes installing at once one keeps its
//! environment and the other discards its own. `GCP_SQL_TEST_PYTHON` names a Python to use
//! instead, for every environment.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

/// The variable naming a Python to use instead of the tests' own environments.
pub const TEST_PYTHON_VAR: &str = "GCP_SQL_TEST_PYTHON";

/// The decoders of the Avro and Protobuf payload tests.
pub const SCHEMA_DECODERS: &[&str] = &["fastavro==1.13.1", "protobuf==4.25.9"];

/// Google's Python Bigtable client (it needs a newer `protobuf` than [`SCHEMA_DECODERS`] pins,
/// hence an environment of its own).
pub const BIGTABLE_CLIENT: &[&str] = &["google-cloud-bigtable==2.50.2"];

/// One install at a time in this process (the tests of one binary run on threads).
static INSTALLING: Mutex<()> = Mutex::new(());

/// The Python of the environment with `packages` (pinned `name==version`), made on first use.
/// Panics with the command that fixes the machine when it cannot be made.
pub fn python_with(packages: &[&str]) -> PathBuf {
    if let Some(python) = std::env::var_os(TEST_PYTHON_VAR).filter(|p| !p.is_empty()) {
        return PathBuf::from(python);
    }
    let cache = gcp_sql::emulators::cache_dir(|v| std::env::var_os(v)).unwrap_or_else(|| {
        panic!(
            "no folder for the tests' Python environments: set {} (or HOME)",
            gcp_sql::emulators::CACHE_DIR_VAR
        )
    });
    let venv = cache.join(format!("test-python-{:016x}", pins_hash(packages)));
    let python = venv.join("bin").join("python");
    if python.is_file() {
        return python;
    }
    let _one = INSTALLING.lock().unwrap_or_else(|e| e.into_inner());
    if python.is_file() {
        return python;
    }
    std::fs::create_dir_all(&cache)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", cache.display()));
    let building = cache.join(format!(
        ".{}-{}",
        venv.file_name().unwrap().to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&building);
    eprintln!(
        "Installing {} for the read-back tests into {} (once; later runs reuse it)...",
        packages.join(" "),
        venv.display()
    );
    let fix = format!(
        "`apt-get install python3-venv` if venv is missing; or `pip install {}` into a Python \
         and set {TEST_PYTHON_VAR} to it",
        packages.join(" ")
    );
    run(
        Command::new("python3").arg("-m").arg("venv").arg(&building),
        &fix,
    );
    run(
        Command::new(building.join("bin").join("python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(packages),
        &fix,
    );
    // Only `bin/python -c` is run from it, which finds its packages from where it is (the
    // scripts pip wrote name the temporary folder, and are not used).
    if std::fs::rename(&building, &venv).is_err() {
        // Another process finished first: its environment is as good.
        let _ = std::fs::remove_dir_all(&building);
    }
    python
}

/// Runs `command`, panicking with its output and `fix` if it fails.
fn run(command: &mut Command, fix: &str) {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}; fix: {fix}"));
    assert!(
        out.status.success(),
        "{command:?} failed; fix: {fix}\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// FNV-1a over the pins, for a stable environment name.
fn pins_hash(packages: &[&str]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for byte in packages.join("\n").bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}
