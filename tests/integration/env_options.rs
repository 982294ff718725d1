//! `${NAME}` in option values, through the `gcp-sql` binary run on a pipeline file (`-f`), as a
//! deployment without a terminal runs it: the secret comes from the environment, reaches the
//! service (read back from the Cloud Tasks emulator), and appears nowhere in what the tool
//! prints (results, `\d`, `SHOW CREATE TABLE`, `EXPLAIN`, logs, errors).

use std::process::{Command, Stdio};

use crate::cloud_tasks_sink::{TasksAdmin, http_request};

const BIN: &str = env!("CARGO_BIN_EXE_gcp-sql");
const SECRET: &str = "tok-3f9c-not-for-logs";

/// Runs the tool on the file `script`, with `env` set and logging on (`info`, `trace` for the
/// crate's own events); returns (success, stdout, stderr).
fn run_file(script: &str, env: &[(&str, &str)]) -> (bool, String, String) {
    let home = tempfile::tempdir().unwrap();
    let file = home.path().join("pipeline.sql");
    std::fs::write(&file, script).unwrap();
    let mut command = Command::new(BIN);
    command
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("HOME", home.path())
        .env("RUST_LOG", "info,gcp_sql=trace")
        .env_remove("PUBSUB_EMULATOR_HOST")
        .env_remove("BIGTABLE_EMULATOR_HOST")
        .env_remove("CLOUD_TASKS_EMULATOR_HOST")
        .stdin(Stdio::null())
        .arg("-f")
        .arg(&file);
    for (k, v) in env {
        command.env(k, v);
    }
    let output = command.output().expect("the gcp-sql binary runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[track_caller]
fn assert_not_echoed(value: &str, stdout: &str, stderr: &str) {
    assert!(!stdout.contains(value), "'{value}' in stdout:\n{stdout}");
    assert!(!stderr.contains(value), "'{value}' in stderr:\n{stderr}");
}

/// A pipeline file whose header value and emulator address come from the environment, with an
/// escaped `$${` kept literally: the tasks carry the expanded values, and the secret is not in
/// anything the tool printed, though the file shows the declaration, explains the INSERT and
/// logs at trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_file_takes_its_secret_from_the_environment_and_never_echoes_it() {
    let admin = TasksAdmin::connect().await;
    let queue = admin.paused_queue("env-opts", "env").await;
    let script = format!(
        "CREATE TABLE jobs (id BIGINT) WITH (connector = 'cloud_tasks', \
           emulator_host = '${{GCP_SQL_TEST_TASKS_HOST}}', queue = '{queue}', \
           url = 'https://worker.example.com/run', \
           headers = 'Authorization: Bearer ${{GCP_SQL_TEST_TOKEN}}; X-Template: $${{id}}');
         \\d jobs
         SHOW CREATE TABLE jobs;
         EXPLAIN INSERT INTO jobs VALUES (1), (2);
         INSERT INTO jobs VALUES (1), (2);\n"
    );
    let host = admin.host.clone();
    let (ok, stdout, stderr) = tokio::task::spawn_blocking(move || {
        run_file(
            &script,
            &[
                ("GCP_SQL_TEST_TOKEN", SECRET),
                ("GCP_SQL_TEST_TASKS_HOST", &host),
            ],
        )
    })
    .await
    .unwrap();
    assert!(ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_not_echoed(SECRET, &stdout, &stderr);
    // `\d` shows the options as written (the header values hidden besides).
    assert!(
        stdout.contains("${GCP_SQL_TEST_TASKS_HOST}"),
        "the declaration as written:\n{stdout}"
    );
    let tasks = admin.list_tasks(&queue).await;
    assert_eq!(tasks.len(), 2, "{tasks:?}");
    for task in &tasks {
        let headers = &http_request(task).headers;
        assert_eq!(
            headers.get("Authorization").map(String::as_str),
            Some(format!("Bearer {SECRET}").as_str()),
            "{headers:?}"
        );
        assert_eq!(
            headers.get("X-Template").map(String::as_str),
            Some("${id}"),
            "$${{ is a literal ${{: {headers:?}"
        );
    }
}

/// An unset variable fails the declaration with an error naming the variable and the option;
/// a variable whose value the option refuses names the variable, not the value.
#[test]
fn an_unset_or_refused_variable_is_named_and_its_value_is_not() {
    let unset = "CREATE TABLE t (data VARCHAR) WITH (connector = 'pubsub', \
                 topic = 'projects/p/topics/t', emulator_host = '${GCP_SQL_TEST_UNSET_HOST}');\n";
    let (ok, stdout, stderr) = run_file(unset, &[]);
    assert!(!ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stderr.contains("'GCP_SQL_TEST_UNSET_HOST'") && stderr.contains("'emulator_host'"),
        "{stderr}"
    );
    let refused = "CREATE TABLE t (data VARCHAR) WITH (connector = 'pubsub', \
                   topic = 'projects/p/topics/t', \
                   batch_element_count_threshold = '${GCP_SQL_TEST_BATCH}');\n";
    let value = "many-3f9c-not-for-logs";
    let (ok, stdout, stderr) = run_file(refused, &[("GCP_SQL_TEST_BATCH", value)]);
    assert!(!ok, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_not_echoed(value, &stdout, &stderr);
    assert!(
        stderr.contains("batch_element_count_threshold")
            && stderr.contains("${GCP_SQL_TEST_BATCH}"),
        "{stderr}"
    );
}
