//! The private install of an emulator that is a Python package (feature `testing`; its spec
//! names the package, [`PipPackage`]: today the Cloud Tasks emulator): when its program is not on
//! the `PATH`, the launcher installs the pinned release into a Python virtual environment of its
//! own, in a per-user cache folder, once.
//!
//! The folder is `$GCP_SQL_CACHE_DIR`, else `$XDG_CACHE_HOME/gcp-sql`, else
//! `$HOME/.cache/gcp-sql`; the environment is `<package>-<version>` inside it. Two
//! processes that need it at once (test binaries run concurrently by a build tool, `gcp-sql`
//! next to `cargo test`) are serialised by an exclusive `flock` on a lock file next to it: the
//! second waits, then finds the finished environment. An environment counts as finished only
//! once a marker file is written after `pip` succeeded, so an install that was killed half-way
//! is removed and redone by the next run rather than used.
//!
//! [`python_environment`] makes such environments for other pinned packages the same way: the
//! Python libraries the tests read back with.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::discover::not_installed;
use super::kind::EmulatorKind;
use super::spec::PipPackage;
use crate::error::{Error, Result};

/// The variable that names the cache folder, ahead of `XDG_CACHE_HOME` and `HOME`.
pub const CACHE_DIR_VAR: &str = "GCP_SQL_CACHE_DIR";

/// The variable that, set to `1`, turns the private install off: a missing emulator that would
/// be installed privately is then an error naming the `pip install` command.
pub const NO_INSTALL_VAR: &str = "GCP_SQL_NO_EMULATOR_INSTALL";

/// The file written into the environment once `pip` has installed the emulator into it.
const COMPLETE_MARKER: &str = ".gcp-sql-complete";

/// How many lines of `pip`'s output a failed install shows.
const PIP_TAIL_LINES: usize = 15;

/// The cache folder of this crate, from the variables read through `env`:
/// `$GCP_SQL_CACHE_DIR`, else `$XDG_CACHE_HOME/gcp-sql`, else `$HOME/.cache/gcp-sql`. `None`
/// when none of them is set (non-empty).
///
/// ```
/// use gcp_sql::emulators::cache_dir;
/// let dir = cache_dir(|var| (var == "HOME").then(|| "/home/ana".into()));
/// assert_eq!(dir.unwrap(), std::path::PathBuf::from("/home/ana/.cache/gcp-sql"));
/// ```
pub fn cache_dir(env: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let set = |var: &str| env(var).filter(|v| !v.is_empty()).map(PathBuf::from);
    set(CACHE_DIR_VAR)
        .or_else(|| set("XDG_CACHE_HOME").map(|d| d.join("gcp-sql")))
        .or_else(|| set("HOME").map(|d| d.join(".cache").join("gcp-sql")))
}

/// The folder of the private virtual environment of the pinned `package` inside the cache
/// folder `cache`: `<package>-<version>`.
///
/// ```
/// use gcp_sql::emulators::{EmulatorKind, private_venv};
/// let package = EmulatorKind::CloudTasks.private_install().unwrap();
/// let venv = private_venv(package, std::path::Path::new("/c"));
/// assert_eq!(venv, std::path::PathBuf::from(format!("/c/gcloud-tasks-emulator-{}", package.version)));
/// ```
pub fn private_venv(package: PipPackage, cache: &Path) -> PathBuf {
    cache.join(format!("{}-{}", package.name, package.version))
}

/// The program of `kind` inside a finished private environment of `package` under `cache`, if
/// there is one.
pub(crate) fn installed_program(
    kind: EmulatorKind,
    package: PipPackage,
    cache: &Path,
) -> Option<PathBuf> {
    let venv = private_venv(package, cache);
    let program = venv.join("bin").join(kind.program_name());
    (venv.join(COMPLETE_MARKER).is_file() && super::discover::is_executable_file(&program))
        .then_some(program)
}

/// The error of an install that cannot be done here: what went wrong and the one command that
/// fixes it.
fn cannot_install(kind: EmulatorKind, why: String, fix: &str) -> Error {
    Error::Io(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "the {} emulator is not installed and gcp-sql cannot install it: {why}; fix: {fix} \
             (or set {} to its executable)",
            kind.name(),
            kind.program_override_var()
        ),
    ))
}

/// Installs the pinned package of `kind` ([`EmulatorKind::private_install`]) into its private
/// environment under the cache folder (see the module docs), unless a finished one is there, and
/// returns its program. An emulator without a private install is an error naming its install
/// step.
///
/// It prints one line to stderr before installing. It blocks (creating the environment and
/// downloading the package take tens of seconds); an async caller runs it on a blocking thread.
///
/// Errors name the one command that fixes the machine: no cache folder (set
/// `GCP_SQL_CACHE_DIR`), no `python3`, no `venv` module (`apt-get install python3-venv`), or
/// `pip` failing (`pip install gcloud-tasks-emulator==0.6.2`, with the tail of pip's output).
pub fn install_privately(
    kind: EmulatorKind,
    env: impl Fn(&str) -> Option<OsString>,
) -> Result<PathBuf> {
    let Some(package) = kind.private_install() else {
        return Err(not_installed(
            kind,
            "gcp-sql installs only a Python package privately, and this emulator is none",
        ));
    };
    let pip_fix = kind.install_hint();
    let cannot = |why: String, fix: &str| cannot_install(kind, why, fix);
    if env(NO_INSTALL_VAR).is_some_and(|v| v == "1") {
        return Err(cannot(
            format!("{NO_INSTALL_VAR}=1 turns the private install off"),
            pip_fix,
        ));
    }
    let Some(cache) = cache_dir(&env) else {
        return Err(cannot(
            format!("none of {CACHE_DIR_VAR}, XDG_CACHE_HOME or HOME is set"),
            &format!("export {CACHE_DIR_VAR}=/some/writable/folder"),
        ));
    };
    if let Some(program) = installed_program(kind, package, &cache) {
        return Ok(program);
    }
    let pin = format!("{}=={}", package.name, package.version);
    let venv = make_environment(
        &private_venv(package, &cache),
        &[pin.as_str()],
        &format!("{} {} (not on PATH)", package.name, package.version),
        pip_fix,
        &env,
        &cannot,
    )?;
    installed_program(kind, package, &cache).ok_or_else(|| {
        cannot(
            format!(
                "pip succeeded but '{}' has no bin/{}",
                venv.display(),
                kind.program_name()
            ),
            pip_fix,
        )
    })
}

/// The Python of a private virtual environment with the pinned `packages` (`name==version`),
/// made under the cache folder once, as [`install_privately`] makes the Cloud Tasks
/// emulator's (a lock, a marker once `pip` succeeded, an unfinished one made again): for tests
/// that check what landed with an independent Python library. Its folder is `<prefix>-<hash>`,
/// the hash of the pins, so other pins make another one.
///
/// It blocks while it installs (tens of seconds, once), and prints one line to stderr first.
/// Errors name the one command that fixes the machine (`apt-get install python3-venv`, or the
/// `pip install` of the packages).
pub fn python_environment(
    prefix: &str,
    packages: &[&str],
    env: impl Fn(&str) -> Option<OsString>,
) -> Result<PathBuf> {
    let fix = format!("pip install {}", packages.join(" "));
    let cannot = |why: String, fix: &str| {
        Error::Io(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "the Python environment with {} cannot be made: {why}; fix: {fix}",
                packages.join(" ")
            ),
        ))
    };
    let Some(cache) = cache_dir(&env) else {
        return Err(cannot(
            format!("none of {CACHE_DIR_VAR}, XDG_CACHE_HOME or HOME is set"),
            &format!("export {CACHE_DIR_VAR}=/some/writable/folder"),
        ));
    };
    // The same folder from every build.
    let mut hash = crate::core::StableHash::new();
    hash.write(packages.join("\n").as_bytes());
    let hash = hash.finish();
    let venv = cache.join(format!("{prefix}-{hash:016x}"));
    let venv = make_environment(&venv, packages, &packages.join(" "), &fix, &env, &cannot)?;
    Ok(venv.join("bin").join("python"))
}

/// Makes the virtual environment `venv` (in the cache folder) with `packages` unless a finished
/// one is there, under an exclusive lock next to it; returns `venv`. `announce` names what is
/// installed in the one line printed before; errors are made by `cannot` (why, fix), `pip_fix`
/// being the fix when `pip` fails.
fn make_environment(
    venv: &Path,
    packages: &[&str],
    announce: &str,
    pip_fix: &str,
    env: &dyn Fn(&str) -> Option<OsString>,
    cannot: &dyn Fn(String, &str) -> Error,
) -> Result<PathBuf> {
    let finished = |venv: &Path| venv.join(COMPLETE_MARKER).is_file();
    if finished(venv) {
        return Ok(venv.to_path_buf());
    }
    let cache = venv.parent().unwrap_or(venv);
    std::fs::create_dir_all(cache).map_err(|e| {
        cannot(
            format!("cannot create the cache folder '{}': {e}", cache.display()),
            &format!("export {CACHE_DIR_VAR}=/some/writable/folder"),
        )
    })?;
    let name = venv.file_name().unwrap_or_default().to_string_lossy();
    let _lock = lock(&cache.join(format!("{name}.lock")), cannot)?;
    // Another process may have finished it while this one waited for the lock.
    if finished(venv) {
        return Ok(venv.to_path_buf());
    }
    if venv.exists() {
        // A half-done install (killed before its marker): start again.
        std::fs::remove_dir_all(venv).map_err(|e| {
            cannot(
                format!(
                    "cannot remove the unfinished install '{}': {e}",
                    venv.display()
                ),
                &format!("rm -rf '{}'", venv.display()),
            )
        })?;
    }
    eprintln!(
        "Installing {announce} into {} (once; later runs reuse it)...",
        venv.display()
    );
    let python = env("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join("python3"))
                .find(|p| super::discover::is_executable_file(p))
        })
        .ok_or_else(|| {
            cannot(
                "'python3' is not on PATH".into(),
                "apt-get install python3 python3-venv",
            )
        })?;
    run_quietly(
        Command::new(&python).arg("-m").arg("venv").arg(venv),
        "python3 -m venv",
        "apt-get install python3-venv",
        cannot,
    )
    .inspect_err(|_| {
        let _ = std::fs::remove_dir_all(venv);
    })?;
    run_quietly(
        Command::new(venv.join("bin").join("python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(packages),
        "pip install",
        pip_fix,
        cannot,
    )
    .inspect_err(|_| {
        let _ = std::fs::remove_dir_all(venv);
    })?;
    File::create(venv.join(COMPLETE_MARKER)).map_err(|e| {
        cannot(
            format!("cannot write into '{}': {e}", venv.display()),
            &format!("export {CACHE_DIR_VAR}=/some/writable/folder"),
        )
    })?;
    Ok(venv.to_path_buf())
}

/// Runs `command` with its output captured; a failure carries the tail of that output.
fn run_quietly(
    command: &mut Command,
    what: &str,
    fix: &str,
    cannot: &dyn Fn(String, &str) -> Error,
) -> Result<()> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| cannot(format!("cannot run {what}: {e}"), fix))?;
    if output.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(PIP_TAIL_LINES)..].join("\n");
    Err(cannot(
        format!("{what} failed ({}):\n{tail}\n", output.status),
        fix,
    ))
}

/// An exclusive `flock` on `path`, released when the file is closed.
fn lock(path: &Path, cannot: &dyn Fn(String, &str) -> Error) -> Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| {
            cannot(
                format!("cannot open the lock file '{}': {e}", path.display()),
                &format!("export {CACHE_DIR_VAR}=/some/writable/folder"),
            )
        })?;
    loop {
        // SAFETY: flock only reads the descriptor, which `file` keeps open.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(file);
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(cannot(
                format!("cannot lock '{}': {error}", path.display()),
                &format!("export {CACHE_DIR_VAR}=/some/writable/folder"),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The emulator whose spec says it is installed privately, and its package (the registry's
    /// tests check that it is the only one).
    fn privately_installed() -> (EmulatorKind, PipPackage) {
        let kind = EmulatorKind::CloudTasks;
        (kind, kind.private_install().expect("installed privately"))
    }

    #[test]
    fn cache_dir_prefers_its_own_variable_then_xdg_then_home() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |var: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == var)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        assert_eq!(
            cache_dir(env(&[
                ("GCP_SQL_CACHE_DIR", "/c"),
                ("XDG_CACHE_HOME", "/x"),
                ("HOME", "/h")
            ])),
            Some(PathBuf::from("/c"))
        );
        assert_eq!(
            cache_dir(env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")])),
            Some(PathBuf::from("/x/gcp-sql"))
        );
        assert_eq!(
            cache_dir(env(&[("XDG_CACHE_HOME", ""), ("HOME", "/h")])),
            Some(PathBuf::from("/h/.cache/gcp-sql"))
        );
        assert_eq!(cache_dir(env(&[])), None);
    }

    /// Writes an executable `kind` program into the private environment of `package` under
    /// `cache` (an install that is not marked complete yet) and returns its path.
    fn fake_private_program(kind: EmulatorKind, package: PipPackage, cache: &Path) -> PathBuf {
        let bin = private_venv(package, cache).join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let program = bin.join(kind.program_name());
        std::fs::write(&program, "#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        program
    }

    #[test]
    fn an_unfinished_install_is_not_used() {
        let (kind, package) = privately_installed();
        let cache = tempfile::tempdir().unwrap();
        let program = fake_private_program(kind, package, cache.path());
        assert_eq!(installed_program(kind, package, cache.path()), None);
        File::create(private_venv(package, cache.path()).join(COMPLETE_MARKER)).unwrap();
        assert_eq!(
            installed_program(kind, package, cache.path()),
            Some(program)
        );
    }

    #[test]
    fn the_lookup_finds_a_finished_private_install_after_the_path() {
        let (kind, package) = privately_installed();
        let cache = tempfile::tempdir().unwrap();
        let empty_path = tempfile::tempdir().unwrap();
        let program = fake_private_program(kind, package, cache.path());
        File::create(private_venv(package, cache.path()).join(COMPLETE_MARKER)).unwrap();
        let env = |var: &str| match var {
            "PATH" => Some(empty_path.path().as_os_str().to_owned()),
            CACHE_DIR_VAR => Some(cache.path().as_os_str().to_owned()),
            _ => None,
        };
        assert_eq!(
            super::super::discover::locate_program(kind, env).unwrap(),
            program
        );
    }

    #[test]
    fn turned_off_or_without_a_cache_folder_it_names_the_fix() {
        let (kind, _) = privately_installed();
        let off = install_privately(kind, |var| (var == NO_INSTALL_VAR).then(|| "1".into()))
            .unwrap_err()
            .to_string();
        assert!(
            off.contains("fix: pip install gcloud-tasks-emulator==0.6.2"),
            "{off}"
        );
        let nowhere = install_privately(kind, |_| None).unwrap_err().to_string();
        assert!(
            nowhere.contains("fix: export GCP_SQL_CACHE_DIR="),
            "{nowhere}"
        );
    }
}
