//! What a new user meets in the first hour, through the `gcp-sql` binary: `gcp-sql emulators`
//! keeping the emulators up for an independent client, a runtime error printed once, output
//! into a pipe that closes, and the hints of declaration errors.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use gcloud_sdk::google::pubsub::v1::ListTopicsRequest;
use gcloud_sdk::google::pubsub::v1::publisher_client::PublisherClient;
use gcp_sql::emulators::EmulatorKind;

use crate::support::{output as run, text, tool as gcp_sql};

/// Bound on waiting for the emulators to start (a JVM on a loaded machine); only reached when
/// something is broken.
const START_BOUND: Duration = Duration::from_secs(180);

/// Kills the child if a test fails before it ended.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcp_sql_emulators_prints_the_exports_and_keeps_them_up_until_ctrl_c() {
    crate::support::require_emulators(&crate::support::all_emulators());
    let home = tempfile::tempdir().unwrap();
    let mut command = gcp_sql(home.path());
    command
        .arg("emulators")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = Reaped(command.spawn().expect("the gcp-sql binary runs"));
    let stdout = child.0.stdout.take().unwrap();
    let mut stderr = child.0.stderr.take().unwrap();
    let (lines, read) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut exports = Vec::new();
    let deadline = Instant::now() + START_BOUND;
    while exports.len() < 3 {
        let left = deadline.saturating_duration_since(Instant::now());
        match read.recv_timeout(left) {
            Ok(line) => exports.push(line),
            Err(e) => panic!("no export lines ({e:?}); got {exports:?}"),
        }
    }
    let host = |var: &str| -> String {
        exports
            .iter()
            .find_map(|l| l.strip_prefix(&format!("export {var}=")))
            .unwrap_or_else(|| panic!("no export of {var} in {exports:?}"))
            .to_string()
    };
    for kind in crate::support::all_emulators() {
        assert!(
            host(kind.env_var()).starts_with("127.0.0.1:"),
            "{exports:?}"
        );
    }
    // Still up a while later, and an independent client reads from it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(child.0.try_wait().unwrap().is_none(), "it exited early");
    let channel = gcp_sql::emulators::plaintext_channel(&host("PUBSUB_EMULATOR_HOST"))
        .await
        .unwrap();
    PublisherClient::new(channel)
        .list_topics(ListTopicsRequest {
            project: "projects/independent".into(),
            ..Default::default()
        })
        .await
        .expect("the Pub/Sub emulator answers another client");
    // Ctrl-C stops them and the tool, with exit code 0.
    // SAFETY: kill only sends a signal to our own child, which has not been reaped.
    unsafe {
        libc::kill(child.0.id() as libc::pid_t, libc::SIGINT);
    }
    let status = child.0.wait().unwrap();
    let mut err = String::new();
    stderr.read_to_string(&mut err).unwrap();
    assert!(status.success(), "{status:?}: {err}");
    assert!(
        err.contains("Stopped the Pub/Sub, Cloud Tasks, Bigtable emulator(s)"),
        "{err}"
    );
    let address: std::net::SocketAddr = host("PUBSUB_EMULATOR_HOST").parse().unwrap();
    assert!(
        std::net::TcpStream::connect_timeout(&address, Duration::from_secs(1)).is_err(),
        "the Pub/Sub emulator still listens after the stop"
    );
}

#[test]
fn a_runtime_error_is_printed_once() {
    let home = tempfile::tempdir().unwrap();
    let output = run(gcp_sql(home.path()).args([
        "-c",
        "CREATE TABLE t (data VARCHAR) WITH (connector = 'pubsub', \
         topic = 'projects/p/topics/clicks', emulator_host = '127.0.0.1:9')",
        "-c",
        "INSERT INTO t VALUES ('a')",
    ]));
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert_eq!(
        stderr.matches("connection refused at 127.0.0.1:9").count(),
        1,
        "{stderr}"
    );
    assert!(!stderr.contains("ERROR"), "{stderr}");
    assert!(stderr.contains("Error: "), "{stderr}");
}

/// Many rows, so that the tool is still writing when the reader goes away.
const MANY_ROWS: &str = "SELECT value, repeat('x', 100) AS pad FROM generate_series(1, 200000)";

#[test]
fn stdout_into_a_pipe_that_closes_ends_quietly() {
    let home = tempfile::tempdir().unwrap();
    let mut command = gcp_sql(home.path());
    command
        .args(["--format", "csv", "-c", MANY_ROWS])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = Reaped(command.spawn().unwrap());
    let mut stdout = BufReader::new(child.0.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert_eq!(first, "value,pad\n");
    drop(stdout); // `| head -1`
    let mut stderr = String::new();
    child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.0.wait().unwrap();
    assert!(!stderr.contains("Broken pipe"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(status.signal(), Some(libc::SIGPIPE), "{status:?}: {stderr}");
}

#[test]
fn stderr_into_a_pipe_that_closes_does_not_panic() {
    let home = tempfile::tempdir().unwrap();
    let mut command = gcp_sql(home.path());
    command
        .args([
            "--format",
            "csv",
            "-c",
            "SELECT 1 AS x",
            "-c",
            "SELECT 2 AS y",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = Reaped(command.spawn().unwrap());
    drop(child.0.stderr.take()); // `2>&1 | head -3`, the reader gone before the first line
    let status = child.0.wait().unwrap();
    assert_ne!(status.code(), Some(101), "a panic: {status:?}");
    assert_eq!(status.signal(), Some(libc::SIGPIPE), "{status:?}");
}

#[test]
fn declaration_errors_name_the_nearest_type_and_the_table() {
    let home = tempfile::tempdir().unwrap();
    let output = run(gcp_sql(home.path()).args([
        "-c",
        "CREATE EXTERNAL TABLE t (data VARCHAR) STORED AS PUB_SUB \
         LOCATION 'projects/p/topics/clicks'",
    ]));
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("(did you mean 'PUBSUB'?)"), "{stderr}");

    let output = run(gcp_sql(home.path()).args([
        "-c",
        "CREATE TABLE t WITH (connector = 'pubsub', topic = 'projects/p/topics/clicks')",
    ]));
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("column 't'"), "{stderr}");
    assert!(stderr.contains("table 't' declares no columns"), "{stderr}");
}

#[test]
fn backslash_d_shows_the_emulator_address_in_force() {
    let home = tempfile::tempdir().unwrap();
    let output = run(gcp_sql(home.path())
        .env("PUBSUB_EMULATOR_HOST", "127.0.0.1:8681")
        .args([
            "--format",
            "csv",
            "-c",
            "CREATE TABLE t (data VARCHAR) WITH (connector = 'pubsub', \
             topic = 'projects/p/topics/clicks')",
            "-c",
            "\\d t",
        ]));
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        stdout.contains("emulator_host,\"(default: 127.0.0.1:8681, from $PUBSUB_EMULATOR_HOST)\""),
        "{stdout}"
    );
}

#[test]
fn datafusion_cli_conventions_maxrows_tsv_automatic_and_nd_json() {
    let home = tempfile::tempdir().unwrap();
    let many = "SELECT value AS v FROM generate_series(1, 100)";
    // The table format shows 40 rows by default, then a row of dots, and says so.
    let output = run(gcp_sql(home.path()).args(["-c", many]));
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "{stderr}");
    assert!(stdout.contains("| 40 |"), "{stdout}");
    assert!(!stdout.contains("| 41 |"), "{stdout}");
    assert!(stdout.contains("| .  |"), "{stdout}");
    assert!(
        stderr.contains("100 row(s) fetched. (First 40 displayed. Use --maxrows to adjust)"),
        "{stderr}"
    );
    // --maxrows N and inf; automatic is the table.
    let output =
        run(gcp_sql(home.path()).args(["--format", "automatic", "--maxrows", "3", "-c", many]));
    let stdout = text(&output.stdout);
    assert!(
        stdout.contains("| 3 |") && !stdout.contains("| 4 |"),
        "{stdout}"
    );
    let output = run(gcp_sql(home.path()).args(["--maxrows", "inf", "-c", many]));
    assert!(text(&output.stdout).contains("| 100 |"));
    // Other formats print every row.
    let output =
        run(gcp_sql(home.path()).args(["--format", "tsv", "-c", "SELECT 1 AS a, 'x' AS b"]));
    assert_eq!(text(&output.stdout), "a\tb\n1\tx\n");
    let output = run(gcp_sql(home.path()).args(["--format", "nd-json", "-c", many]));
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout).lines().count(), 100);
    // \pset format in a source.
    let output = run(gcp_sql(home.path()).args(["-c", "\\pset format csv\nSELECT 1 AS a;"]));
    assert_eq!(text(&output.stdout), "a\n1\n", "{}", text(&output.stderr));
}

/// The main job on a machine without `gcloud-tasks-emulator` on PATH: `--emulators` installs it
/// into a private virtual environment under a fresh cache folder (one progress line) and the
/// Cloud Tasks statements run. Needs `python3` with `venv` and access to PyPI, as the README says.
#[test]
fn emulators_install_the_cloud_tasks_emulator_when_it_is_not_on_path() {
    let home = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    // A PATH without the emulator: this Python's interpreter alone, then every folder of the
    // current PATH that has no gcloud-tasks-emulator (java, the SDK).
    let python = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 runs");
    let python = text(&python.stdout).trim().to_string();
    let python_dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(&python, python_dir.path().join("python3")).unwrap();
    let mut dirs = vec![python_dir.path().to_path_buf()];
    dirs.extend(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .filter(|d| !d.join("gcloud-tasks-emulator").exists()),
    );
    let path = std::env::join_paths(dirs).unwrap();
    let queue = "projects/fresh/locations/here/queues/q";
    let output = run(gcp_sql(home.path())
        .env("PATH", &path)
        .env(gcp_sql::emulators::CACHE_DIR_VAR, cache.path())
        .env_remove(gcp_sql::emulators::NO_INSTALL_VAR)
        .env_remove("GCP_SQL_CLOUD_TASKS_EMULATOR_BIN")
        .args([
            "--emulators",
            "--format",
            "csv",
            "-c",
            &format!("SELECT state FROM cloud_tasks_create_queue('{queue}')"),
        ]));
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(
        stderr
            .matches("Installing gcloud-tasks-emulator 0.6.2")
            .count(),
        1,
        "{stderr}"
    );
    assert!(
        stderr.contains("Started the Cloud Tasks emulator at 127.0.0.1:"),
        "{stderr}"
    );
    assert_eq!(text(&output.stdout), "state\nPAUSED\n");
    assert!(
        gcp_sql::emulators::private_venv(
            EmulatorKind::CloudTasks.private_install().unwrap(),
            cache.path()
        )
        .join("bin/gcloud-tasks-emulator")
        .exists()
    );
}
