//! No row value in the logs or errors of the `gcp-sql` binary: a Cloud Tasks sink whose row URLs
//! carry `user:password@` and `?key=SECRET` (and a task name with the same words), run with
//! logging on, under `failure_policy = 'drop'` (every refusal logged at WARN) and `fail` (the
//! first refusal in the statement's error). Neither word may appear in stdout or stderr.
//!
//! The service is a scripted fake `CloudTasks` on a loopback port of this test process: it
//! accepts the task of the one good row and refuses, with `INVALID_ARGUMENT`, a task whose URL
//! names the host `refuse.example.com` (so the service-side rejection path logs too). No task is
//! ever dispatched anywhere.

use std::process::{Command, Stdio};
use std::time::Duration;

use gcloud_sdk::google::cloud::tasks::v2::{CreateTaskRequest, Task, task};
use gcp_sql::connectors::cloud_tasks::client::CREATE_TASK_PATH;
use gcp_sql::testing::{FakeServer, Reply, Script};
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_gcp-sql");
const QUEUE: &str = "projects/redact/locations/us-central1/queues/jobs";
/// Bound on one run of the tool; only reached when something is broken.
const RUN_BOUND: Duration = Duration::from_secs(120);

/// Whether the task's URL goes to the host the fake refuses.
fn refused(request: &CreateTaskRequest) -> bool {
    matches!(
        request.task.as_ref().and_then(|t| t.message_type.as_ref()),
        Some(task::MessageType::HttpRequest(r)) if r.url.contains("refuse.example.com")
    )
}

async fn fake_tasks() -> FakeServer {
    let create: Script<CreateTaskRequest, Task> = Script::new();
    create.fallback(|request| {
        if refused(request) {
            Reply::Status(Code::InvalidArgument, "the task was refused".into())
        } else {
            Reply::Ok(request.task.clone().unwrap_or_default())
        }
    });
    FakeServer::builder()
        .unary(CREATE_TASK_PATH, create)
        .start()
        .await
        .expect("start the fake CloudTasks service")
}

/// The statements: a table on the fake and an insert of rows whose URLs (and one task name)
/// hold the secrets, each refused in another place: by the encoder (a scheme that is not HTTP,
/// a URL that does not parse, a task name of another queue) and by the service.
fn script(host: &str, policy: &str) -> String {
    format!(
        "CREATE TABLE t (id BIGINT, target VARCHAR, tid VARCHAR) WITH (connector = 'cloud_tasks', \
         emulator_host = '{host}', queue = '{QUEUE}', url_column = 'target', \
         task_name_column = 'tid', failure_policy = '{policy}'); \
         INSERT INTO t VALUES \
         (1, 'ftp://user:password@files.example.com/x?key=SECRET', NULL), \
         (2, 'http://user:password@bad host/run?key=SECRET', NULL), \
         (3, 'https://user:password@worker.example.com/run?key=SECRET', \
             'projects/redact/locations/us-central1/queues/other/tasks/password-SECRET'), \
         (4, 'https://user:password@refuse.example.com/run?key=SECRET', NULL), \
         (5, 'https://user:password@worker.example.com/run?key=SECRET', NULL)"
    )
}

/// Runs the tool on `script` with logging on (`info`, and `trace` for the crate's own events);
/// returns (success, stdout, stderr).
async fn run_tool(script: String) -> (bool, String, String) {
    let home = tempfile::tempdir().unwrap();
    let home_path = home.path().to_path_buf();
    let run = tokio::task::spawn_blocking(move || {
        Command::new(BIN)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("HOME", &home_path)
            .env("RUST_LOG", "info,gcp_sql=trace")
            .env_remove("PUBSUB_EMULATOR_HOST")
            .env_remove("BIGTABLE_EMULATOR_HOST")
            .env_remove("CLOUD_TASKS_EMULATOR_HOST")
            .stdin(Stdio::null())
            .args(["-c", &script])
            .output()
            .expect("the gcp-sql binary runs")
    });
    let output = tokio::time::timeout(RUN_BOUND, run)
        .await
        .expect("gcp-sql finished in time")
        .expect("the run task");
    drop(home);
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[track_caller]
fn assert_no_secret(stdout: &str, stderr: &str) {
    for secret in ["password", "SECRET"] {
        assert!(!stdout.contains(secret), "'{secret}' in stdout:\n{stdout}");
        assert!(!stderr.contains(secret), "'{secret}' in stderr:\n{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_policy_logs_every_refused_row_without_its_url_or_task_name() {
    let fake = fake_tasks().await;
    let (ok, stdout, stderr) = run_tool(script(&fake.addr().to_string(), "drop")).await;
    assert!(ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_no_secret(&stdout, &stderr);
    // The refusals are there, named by row, column and rule: three rows the encoder refused
    // and one record the service refused, one delivered.
    let skipped = stderr
        .matches("skipping a row the encoder rejected")
        .count();
    assert_eq!(skipped, 3, "{stderr}");
    for reason in [
        "row 0: column 'target': the URL (scheme 'ftp')",
        "row 1: column 'target': the value (",
        "row 2: column 'tid' (task_name_column): the task name does not belong to queue",
    ] {
        assert!(stderr.contains(reason), "no '{reason}' in:\n{stderr}");
    }
    assert!(stderr.contains("dropping a rejected record"), "{stderr}");
    assert!(stdout.contains('1'), "one row written:\n{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_policy_ends_with_an_error_naming_the_row_not_its_url() {
    let fake = fake_tasks().await;
    let (ok, stdout, stderr) = run_tool(script(&fake.addr().to_string(), "fail")).await;
    assert!(
        !ok,
        "the statement fails:\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert_no_secret(&stdout, &stderr);
    assert!(
        stderr.contains("row 0: column 'target': the URL (scheme 'ftp')"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_policy_on_a_service_rejection_names_the_queue_not_the_url() {
    let fake = fake_tasks().await;
    let host = fake.addr().to_string();
    let script = format!(
        "CREATE TABLE t (id BIGINT, target VARCHAR) WITH (connector = 'cloud_tasks', \
         emulator_host = '{host}', queue = '{QUEUE}', url_column = 'target'); \
         INSERT INTO t VALUES (1, 'https://user:password@refuse.example.com/run?key=SECRET')"
    );
    let (ok, stdout, stderr) = run_tool(script).await;
    assert!(
        !ok,
        "the statement fails:\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert_no_secret(&stdout, &stderr);
    assert!(
        stderr.contains("INVALID_ARGUMENT") && stderr.contains(QUEUE),
        "{stderr}"
    );
}
