//! Discovery: where an emulator's program is (the override variable, the `PATH`, a Google
//! Cloud SDK folder, the private install), and the error that says how to install a missing one.

use std::ffi::OsString;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::kind::EmulatorKind;
use crate::error::{Error, Result};

/// Google Cloud SDK install folders looked into after the `PATH`.
const SDK_ROOTS: [&str; 3] = [
    "/usr/lib/google-cloud-sdk",
    "/usr/share/google-cloud-sdk",
    "/opt/google-cloud-sdk",
];

/// The error for an emulator program that cannot be found; `detail` says where it was looked for.
pub(super) fn not_installed(kind: EmulatorKind, detail: &str) -> Error {
    Error::Io(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "the {} emulator is not installed: {} ({detail}; or set {} to its executable)",
            kind.name(),
            kind.install_hint(),
            kind.program_override_var()
        ),
    ))
}

pub(crate) fn is_executable_file(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Finds the program of `kind`, reading variables through `env` (so a caller can test the
/// lookup without touching the process environment): the override variable first, then `PATH`,
/// then the `platform/` folder of a Google Cloud SDK, then (for an emulator with a private install)
/// the private install under the cache folder.
///
/// An override that names no executable file is an error, not a reason to look elsewhere.
///
/// ```
/// use gcp_sql::emulators::{locate_program, EmulatorKind};
///
/// let err = locate_program(EmulatorKind::CloudTasks, |var| {
///     (var == "GCP_SQL_CLOUD_TASKS_EMULATOR_BIN").then(|| "/nonexistent/emulator".into())
/// })
/// .unwrap_err();
/// assert!(err.to_string().contains("pip install gcloud-tasks-emulator==0.6.2"));
/// ```
pub fn locate_program(
    kind: EmulatorKind,
    env: impl Fn(&str) -> Option<OsString>,
) -> Result<PathBuf> {
    if let Some(value) = env(kind.program_override_var()).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(value);
        if is_executable_file(&path) {
            return Ok(path);
        }
        return Err(not_installed(
            kind,
            &format!(
                "{} is '{}', which is not an executable file",
                kind.program_override_var(),
                path.display()
            ),
        ));
    }
    let path_dirs: Vec<PathBuf> = env("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(found) = path_dirs
        .iter()
        .map(|d| d.join(kind.program_name()))
        .find(|p| is_executable_file(p))
    {
        return Ok(found);
    }
    if let Some(relative) = kind.sdk_relative_path() {
        let mut roots: Vec<PathBuf> = Vec::new();
        // `gcloud` lives in `<sdk>/bin/`; it is often a symlink into the SDK.
        if let Some(gcloud) = path_dirs
            .iter()
            .map(|d| d.join("gcloud"))
            .find(|p| is_executable_file(p))
            && let Some(root) = std::fs::canonicalize(&gcloud)
                .ok()
                .and_then(|p| p.parent()?.parent().map(Path::to_path_buf))
        {
            roots.push(root);
        }
        roots.extend(SDK_ROOTS.iter().map(PathBuf::from));
        if let Some(home) = env("HOME") {
            roots.push(PathBuf::from(home).join("google-cloud-sdk"));
        }
        if let Some(found) = roots
            .iter()
            .map(|r| r.join(relative))
            .find(|p| is_executable_file(p))
        {
            return Ok(found);
        }
        if kind.private_install().is_none() {
            return Err(not_installed(
                kind,
                &format!(
                    "'{}' is neither on PATH nor in a Google Cloud SDK folder",
                    kind.program_name()
                ),
            ));
        }
    }
    let Some(package) = kind.private_install() else {
        return Err(not_installed(
            kind,
            &format!("'{}' is not on PATH", kind.program_name()),
        ));
    };
    if let Some(program) = super::install::cache_dir(&env)
        .and_then(|cache| super::install::installed_program(kind, package, &cache))
    {
        return Ok(program);
    }
    Err(not_installed(
        kind,
        &format!(
            "'{}' is neither on PATH nor installed privately under the cache folder",
            kind.program_name()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{assert_contains_all, error_text};

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> + use<> {
        let pairs: Vec<(String, OsString)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |var| pairs.iter().find(|(k, _)| k == var).map(|(_, v)| v.clone())
    }

    fn executable(dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn override_naming_a_missing_file_is_an_install_error() {
        let err = error_text(locate_program(
            EmulatorKind::Bigtable,
            env_of(&[("GCP_SQL_BIGTABLE_EMULATOR_BIN", "/nonexistent/cbtemulator")]),
        ));
        assert_contains_all(
            &err,
            &[
                "apt-get install google-cloud-cli-bigtable-emulator",
                "/nonexistent/cbtemulator",
            ],
        );
    }

    #[test]
    fn override_naming_a_non_executable_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("not-executable");
        std::fs::write(&plain, "data").unwrap();
        let err = error_text(locate_program(
            EmulatorKind::PubSub,
            env_of(&[("GCP_SQL_PUBSUB_EMULATOR_BIN", plain.to_str().unwrap())]),
        ));
        assert_contains_all(
            &err,
            &["not an executable file", "google-cloud-cli-pubsub-emulator"],
        );
    }

    #[test]
    fn override_wins_over_path() {
        let dir = tempfile::tempdir().unwrap();
        let on_path = executable(dir.path(), "gcloud-tasks-emulator");
        let other = executable(dir.path(), "my-tasks-emulator");
        let env = env_of(&[
            ("PATH", dir.path().to_str().unwrap()),
            ("GCP_SQL_CLOUD_TASKS_EMULATOR_BIN", other.to_str().unwrap()),
        ]);
        assert_eq!(
            locate_program(EmulatorKind::CloudTasks, env).unwrap(),
            other
        );
        let env = env_of(&[("PATH", dir.path().to_str().unwrap())]);
        assert_eq!(
            locate_program(EmulatorKind::CloudTasks, env).unwrap(),
            on_path
        );
    }

    #[test]
    fn missing_tasks_emulator_names_pip_install() {
        let dir = tempfile::tempdir().unwrap();
        let err = locate_program(
            EmulatorKind::CloudTasks,
            env_of(&[("PATH", dir.path().to_str().unwrap())]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with(
                "the Cloud Tasks emulator is not installed: pip install gcloud-tasks-emulator==0.6.2 "
            ),
            "{err}"
        );
    }

    #[test]
    fn sdk_program_is_found_next_to_gcloud() {
        let sdk = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(sdk.path().join("bin")).unwrap();
        std::fs::create_dir_all(sdk.path().join("platform/bigtable-emulator")).unwrap();
        executable(&sdk.path().join("bin"), "gcloud");
        let cbt = executable(
            &sdk.path().join("platform/bigtable-emulator"),
            "cbtemulator",
        );
        let env = env_of(&[("PATH", sdk.path().join("bin").to_str().unwrap())]);
        assert_eq!(
            locate_program(EmulatorKind::Bigtable, env).unwrap(),
            std::fs::canonicalize(&cbt).unwrap()
        );
    }
}
