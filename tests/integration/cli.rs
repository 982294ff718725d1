//! The `gcp-sql` binary driven as a process: sources, output, errors and exit codes, the
//! interactive shell on piped input, and the emulators it starts and must stop.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::support::{output as run, text, tool as gcp_sql};

use datafusion::arrow::array::{Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::parquet::arrow::ArrowWriter;
use gcp_sql::emulators::EmulatorKind;

/// Bound on waiting for the tool to report its emulators (a JVM start on a loaded machine);
/// only reached when something is broken.
const EMULATOR_START_BOUND: Duration = Duration::from_secs(180);

/// Bound on waiting for the tool to exit after it was told to.
const EXIT_BOUND: Duration = Duration::from_secs(30);

fn test_data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

#[test]
fn commands_and_files_run_in_the_order_given() {
    let home = tempfile::tempdir().unwrap();
    let script = home.path().join("middle.sql");
    std::fs::write(&script, "SELECT 'two' AS step;\nSELECT 'three' AS step;\n").unwrap();
    let output = run(gcp_sql(home.path()).args([
        "--format",
        "csv",
        "-c",
        "SELECT 'one' AS step",
        "-f",
        script.to_str().unwrap(),
        "-c",
        "SELECT 'four' AS step",
    ]));
    assert!(output.status.success(), "stderr: {}", text(&output.stderr));
    assert_eq!(
        text(&output.stdout),
        "step\none\nstep\ntwo\nstep\nthree\nstep\nfour\n"
    );
    assert_eq!(
        text(&output.stderr).matches("1 row(s) fetched.").count(),
        4,
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn csv_source_declared_as_external_table_is_queried() {
    let home = tempfile::tempdir().unwrap();
    let create = format!(
        "CREATE EXTERNAL TABLE events STORED AS CSV LOCATION '{}' OPTIONS ('format.has_header' 'true');",
        test_data("events.csv").display()
    );
    let output = run(gcp_sql(home.path()).args([
        "-c",
        &create,
        "-c",
        "SELECT kind, count(*) AS n, sum(amount) AS total FROM events GROUP BY kind ORDER BY kind",
    ]));
    assert!(output.status.success(), "stderr: {}", text(&output.stderr));
    let stdout = text(&output.stdout);
    assert!(stdout.contains("| kind     | n | total |"), "{stdout}");
    assert!(stdout.contains("| click    | 2 | 3.25  |"), "{stdout}");
    assert!(stdout.contains("| purchase | 1 | 19.99 |"), "{stdout}");
    assert!(stdout.contains("| view     | 2 | 1.25  |"), "{stdout}");
    assert!(
        text(&output.stderr).contains("3 row(s) fetched."),
        "{}",
        text(&output.stderr)
    );
}

fn write_parquet(path: &Path) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("user_id", DataType::Int64, false),
        Field::new("url", DataType::Utf8, false),
    ]));
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(Int64Array::from(vec![7, 8, 9])),
            Arc::new(StringArray::from(vec!["/a", "/b", "/c"])),
        ],
    )
    .unwrap();
    let mut writer =
        ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema, None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
}

#[test]
fn parquet_file_is_queried_directly_by_path_and_glob() {
    let home = tempfile::tempdir().unwrap();
    let data = home.path().join("data");
    std::fs::create_dir(&data).unwrap();
    write_parquet(&data.join("part-0.parquet"));
    write_parquet(&data.join("part-1.parquet"));
    let one = format!(
        "SELECT url FROM '{}' WHERE user_id = 8",
        data.join("part-0.parquet").display()
    );
    let all = format!(
        "SELECT count(*) AS n, sum(user_id) AS s FROM '{}/*.parquet'",
        data.display()
    );
    let output = run(gcp_sql(home.path()).args(["--format", "json", "-c", &one, "-c", &all]));
    assert!(output.status.success(), "stderr: {}", text(&output.stderr));
    assert_eq!(
        text(&output.stdout),
        "[{\"url\":\"/b\"}]\n[{\"n\":6,\"s\":48}]\n"
    );
}

#[test]
fn failing_statement_stops_the_run_with_its_error_and_exit_code_1() {
    let home = tempfile::tempdir().unwrap();
    let output = run(gcp_sql(home.path()).args([
        "-c",
        "SELECT 'before' AS step",
        "-c",
        "SELECT * FROM no_such_table",
        "-c",
        "SELECT 'after' AS step",
    ]));
    assert_eq!(output.status.code(), Some(1));
    let stdout = text(&output.stdout);
    let stderr = text(&output.stderr);
    assert!(stdout.contains("before"), "{stdout}");
    assert!(
        !stdout.contains("after"),
        "the run went on after a failure: {stdout}"
    );
    let error_line = stderr
        .lines()
        .find(|l| l.starts_with("Error: "))
        .unwrap_or_default();
    assert!(error_line.contains("no_such_table"), "{stderr}");
}

#[test]
fn unreadable_file_is_an_error() {
    let home = tempfile::tempdir().unwrap();
    let missing = home.path().join("missing.sql");
    let output = run(gcp_sql(home.path()).args(["-f", missing.to_str().unwrap()]));
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("Error: cannot read") && stderr.contains("missing.sql"),
        "{stderr}"
    );
}

#[test]
fn quiet_prints_only_results() {
    let home = tempfile::tempdir().unwrap();
    let output = run(gcp_sql(home.path()).args(["-q", "--format", "csv", "-c", "SELECT 1 AS x"]));
    assert!(output.status.success());
    assert_eq!(text(&output.stdout), "x\n1\n");
    assert_eq!(text(&output.stderr), "");
}

/// `--metrics-addr` serves while the tool runs and says where on stderr; an address the tool
/// cannot listen on fails the run naming the flag (exit code 1), and one it cannot read is a
/// bad argument (exit code 2).
#[test]
fn metrics_addr_serves_while_the_tool_runs_and_a_bad_or_busy_one_names_the_flag() {
    let home = tempfile::tempdir().unwrap();
    let output =
        run(gcp_sql(home.path()).args(["--metrics-addr", "127.0.0.1:0", "-c", "SELECT 1"]));
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("Serving metrics at http://127.0.0.1:"),
        "{stderr}"
    );
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = busy.local_addr().unwrap().to_string();
    let output = run(gcp_sql(home.path()).args(["--metrics-addr", &taken, "-c", "SELECT 1"]));
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains(&format!("Error: --metrics-addr {taken}: cannot listen")),
        "{stderr}"
    );
    assert_eq!(text(&output.stdout), "", "nothing ran");
    let output = run(gcp_sql(home.path()).args(["--metrics-addr", "localhost", "-c", "SELECT 1"]));
    assert_eq!(output.status.code(), Some(2));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("--metrics-addr") && stderr.contains("expected HOST:PORT"),
        "{stderr}"
    );
}

#[test]
fn bad_arguments_exit_with_2() {
    let home = tempfile::tempdir().unwrap();
    let output = run(gcp_sql(home.path()).args(["--format", "yaml"]));
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("yaml"));
}

#[test]
fn shell_reads_piped_statements_reports_errors_and_goes_on() {
    let home = tempfile::tempdir().unwrap();
    let mut child = gcp_sql(home.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(
            b"SELECT 40 +\n  2 AS answer;\nSELECT * FROM nowhere;\nSELECT 'still here' AS s;\n",
        )
        .unwrap();
    drop(stdin);
    let output = child.wait_with_output().unwrap();
    let stdout = text(&output.stdout);
    let stderr = text(&output.stderr);
    assert!(stdout.contains("| 42     |"), "{stdout}");
    assert!(stdout.contains("| still here |"), "{stdout}");
    assert!(
        stderr.contains("Error: ") && stderr.contains("nowhere"),
        "{stderr}"
    );
    // A statement failed: the shell went on, and says so in its exit code.
    assert_eq!(output.status.code(), Some(1));
    let history = std::fs::read_to_string(home.path().join(".gcp_sql_history")).unwrap();
    assert!(history.contains("SELECT 'still here' AS s;"), "{history}");
}

#[test]
fn shell_quits_on_backslash_q() {
    let home = tempfile::tempdir().unwrap();
    let mut child = gcp_sql(home.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"SELECT 1 AS one;\n\\q\nSELECT 'unreached' AS u;\n")
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(text(&output.stdout).contains("| one |"));
    assert!(!text(&output.stdout).contains("unreached"));
}

/// A running `gcp-sql --emulators` whose stderr is read line by line on a thread.
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Running {
    fn spawn(mut command: Command) -> Running {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Running {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Reads stderr until `count` emulator reports ("Started ..." or "Could not start ...").
    fn wait_for_emulator_reports(&mut self, count: usize) -> Vec<SocketAddr> {
        let deadline = Instant::now() + EMULATOR_START_BOUND;
        let reports = |seen: &[String]| {
            seen.iter()
                .filter(|l| l.starts_with("Started the ") || l.starts_with("Could not start the "))
                .count()
        };
        while reports(&self.seen) < count {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => panic!(
                    "only {} emulator report(s) arrived:\n{}",
                    reports(&self.seen),
                    self.seen.join("\n")
                ),
            }
        }
        started_addresses(&self.seen)
    }

    fn wait(&mut self) -> (ExitStatus, String) {
        let deadline = Instant::now() + EXIT_BOUND;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "gcp-sql did not exit:\n{}",
                self.seen.join("\n")
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        self.seen.extend(self.lines.iter());
        (status, self.seen.join("\n"))
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        // SAFETY: sends a signal to our own child, which has not been reaped yet.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The addresses in "Started the X emulator at 127.0.0.1:P (...)" lines.
fn started_addresses(lines: &[String]) -> Vec<SocketAddr> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("Started the "))
        .filter_map(|l| l.split(" emulator at ").nth(1))
        .filter_map(|l| l.split_whitespace().next())
        .map(|a| a.parse().unwrap())
        .collect()
}

fn accepts(address: &SocketAddr) -> bool {
    TcpStream::connect_timeout(address, Duration::from_secs(1)).is_ok()
}

/// Waits (bounded) until nothing listens on any of `addresses`: after a SIGKILL the kernel
/// kills the emulators asynchronously.
fn assert_all_closed(addresses: &[SocketAddr], context: &str) {
    let deadline = Instant::now() + EXIT_BOUND;
    while addresses.iter().any(accepts) {
        assert!(
            Instant::now() < deadline,
            "an emulator still listens after {context}: {addresses:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn emulators_start_for_the_run_and_stop_at_exit() {
    crate::support::require_emulators(&crate::support::all_emulators());
    let home = tempfile::tempdir().unwrap();
    let mut command = gcp_sql(home.path());
    command.args(["--emulators", "-c", "SELECT 1 AS x"]);
    let mut running = Running::spawn(command);
    let addresses = running.wait_for_emulator_reports(3);
    let (status, stderr) = running.wait();
    assert!(status.success(), "{stderr}");
    for name in ["Pub/Sub", "Bigtable", "Cloud Tasks"] {
        assert!(
            stderr.contains(&format!("Started the {name} emulator at 127.0.0.1:")),
            "{stderr}"
        );
    }
    for variable in [
        "PUBSUB_EMULATOR_HOST=",
        "BIGTABLE_EMULATOR_HOST=",
        "CLOUD_TASKS_EMULATOR_HOST=",
    ] {
        assert!(stderr.contains(variable), "{stderr}");
    }
    assert_eq!(addresses.len(), 3, "{stderr}");
    // Drop ran before exit: nothing listens any more, at once.
    for address in &addresses {
        assert!(
            !accepts(address),
            "{address} still accepts connections after exit"
        );
    }
    assert!(
        stderr.contains("Stopped the Pub/Sub, Cloud Tasks, Bigtable emulator(s)."),
        "{stderr}"
    );
    assert_no_emulator_files_left(running.child.id());
}

#[test]
fn missing_emulator_is_reported_with_its_install_step_and_the_others_start() {
    crate::support::require_emulators(&[EmulatorKind::PubSub, EmulatorKind::Bigtable]);
    let home = tempfile::tempdir().unwrap();
    let mut command = gcp_sql(home.path());
    command
        .env(
            "GCP_SQL_CLOUD_TASKS_EMULATOR_BIN",
            "/nonexistent/gcloud-tasks-emulator",
        )
        .args(["--emulators", "-c", "SELECT 1 AS x"]);
    let mut running = Running::spawn(command);
    let addresses = running.wait_for_emulator_reports(3);
    let (status, stderr) = running.wait();
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "Could not start the Cloud Tasks emulator: the Cloud Tasks emulator is not installed: pip install gcloud-tasks-emulator"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("/nonexistent/gcloud-tasks-emulator"),
        "{stderr}"
    );
    assert_eq!(addresses.len(), 2, "{stderr}");
    for address in &addresses {
        assert!(
            !accepts(address),
            "{address} still accepts connections after exit"
        );
    }
}

#[test]
fn ctrl_c_in_the_shell_stops_the_emulators() {
    crate::support::require_emulators(&crate::support::all_emulators());
    let home = tempfile::tempdir().unwrap();
    let mut command = gcp_sql(home.path());
    // A shell whose input stays open: it waits for a statement until the Ctrl-C.
    command.arg("--emulators").stdin(Stdio::piped());
    let mut running = Running::spawn(command);
    let addresses = running.wait_for_emulator_reports(3);
    assert_eq!(addresses.len(), 3, "{}", running.seen.join("\n"));
    assert!(addresses.iter().all(accepts));
    running.signal(libc::SIGINT);
    let (status, stderr) = running.wait();
    assert_eq!(status.code(), Some(130), "{stderr}");
    for address in &addresses {
        assert!(
            !accepts(address),
            "{address} still accepts connections after Ctrl-C"
        );
    }
    assert_no_emulator_files_left(running.child.id());
}

#[test]
fn killed_tool_takes_its_emulators_with_it() {
    crate::support::require_emulators(&crate::support::all_emulators());
    let home = tempfile::tempdir().unwrap();
    let mut command = gcp_sql(home.path());
    command.arg("--emulators").stdin(Stdio::piped());
    let mut running = Running::spawn(command);
    let addresses = running.wait_for_emulator_reports(3);
    assert_eq!(addresses.len(), 3, "{}", running.seen.join("\n"));
    // SIGKILL runs no code in the tool: only the kernel's parent-death signal stops them.
    running.signal(libc::SIGKILL);
    let (status, stderr) = running.wait();
    assert!(!status.success(), "{stderr}");
    assert_all_closed(&addresses, "the tool was killed");
    // The killed tool ran no code, yet nothing of its emulators stays in the temporary folder:
    // their logs were unlinked as they started.
    assert_no_emulator_files_left(running.child.id());
}

#[test]
fn terminated_tool_takes_its_emulators_and_their_logs_with_it() {
    crate::support::require_emulators(&crate::support::all_emulators());
    let home = tempfile::tempdir().unwrap();
    let mut command = gcp_sql(home.path());
    command.arg("--emulators").stdin(Stdio::piped());
    let mut running = Running::spawn(command);
    let addresses = running.wait_for_emulator_reports(3);
    assert_eq!(addresses.len(), 3, "{}", running.seen.join("\n"));
    // With no statement running, SIGTERM ends the tool at once (exit code 143), and the tool
    // stops its emulators on the way out.
    running.signal(libc::SIGTERM);
    let (status, stderr) = running.wait();
    assert!(!status.success(), "{stderr}");
    assert_eq!(status.code(), Some(143), "{stderr}");
    assert_all_closed(&addresses, "the tool was terminated");
    assert_no_emulator_files_left(running.child.id());
}

/// Asserts that the temporary folder holds no file of the emulators started by the tool with
/// process id `pid` (their logs and start-up hooks are named `gcp-sql-<kind>-emulator-<pid>-...`).
fn assert_no_emulator_files_left(pid: u32) {
    let marker = format!("-emulator-{pid}-");
    let left: Vec<PathBuf> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            name.starts_with("gcp-sql-") && name.contains(&marker)
        })
        .map(|entry| entry.path())
        .collect();
    for path in &left {
        let _ = std::fs::remove_file(path);
        let _ = std::fs::remove_dir_all(path);
    }
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[tokio::test]
async fn summary_counts_the_rows_the_encoder_skipped_under_the_drop_policy() {
    let emulator = gcp_sql::emulators::shared(gcp_sql::emulators::EmulatorKind::PubSub).await;
    let home = tempfile::tempdir().unwrap();
    let topic = format!("projects/cli-summary/topics/skipped-{}", std::process::id());
    let create = format!(
        "CREATE TABLE oversize (id BIGINT, big VARCHAR) WITH (connector = 'pubsub', \
         emulator_host = '{}', topic = '{topic}', auto_create_topic = true, \
         attribute_columns = 'big', failure_policy = 'drop')",
        emulator.host()
    );
    // Every tenth row carries a 1025-byte attribute, one over the limit: the encoder rejects
    // it and the drop policy skips it; the other 90 are published.
    let insert = "INSERT INTO oversize SELECT value, \
           CASE WHEN value % 10 = 3 THEN repeat('x', 1025) ELSE repeat('y', 1024) END \
         FROM generate_series(1, 100)";
    let mut command = gcp_sql(home.path());
    command.args(["-c", &create, "-c", insert]);
    let output = tokio::task::spawn_blocking(move || run(&mut command))
        .await
        .unwrap();
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("Sink: 90 row(s) acknowledged of 90 sent"),
        "{stderr}"
    );
    assert!(stderr.contains("; 10 skipped, 0 dropped, "), "{stderr}");
}

#[tokio::test]
async fn summary_counts_the_rows_written_to_the_dead_letter_folder() {
    let emulator = gcp_sql::emulators::shared(gcp_sql::emulators::EmulatorKind::PubSub).await;
    let home = tempfile::tempdir().unwrap();
    let dead = tempfile::tempdir().unwrap();
    let topic = format!("projects/cli-summary/topics/dead-{}", std::process::id());
    let create = format!(
        "CREATE TABLE oversize (id BIGINT, big VARCHAR) WITH (connector = 'pubsub', \
         emulator_host = '{}', topic = '{topic}', auto_create_topic = true, \
         attribute_columns = 'big', failure_policy = 'dead_letter', \
         dead_letter_path = 'file://{}')",
        emulator.host(),
        dead.path().display()
    );
    // The same ten oversize rows as above, written to the folder instead of skipped.
    let insert = "INSERT INTO oversize SELECT value, \
           CASE WHEN value % 10 = 3 THEN repeat('x', 1025) ELSE repeat('y', 1024) END \
         FROM generate_series(1, 100)";
    let mut command = gcp_sql(home.path());
    command.args(["-c", &create, "-c", insert]);
    let output = tokio::task::spawn_blocking(move || run(&mut command))
        .await
        .unwrap();
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("Sink: 90 row(s) acknowledged of 90 sent"),
        "{stderr}"
    );
    assert!(stderr.contains("; 0 skipped, 0 dropped, "), "{stderr}");
    assert!(stderr.contains("; 10 dead-lettered"), "{stderr}");
    let mut ids: Vec<i64> = Vec::new();
    for entry in std::fs::read_dir(dead.path()).unwrap() {
        let body = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for line in body.lines() {
            let value: serde_json::Value = serde_json::from_str(line).unwrap();
            ids.push(value["row"]["id"].as_i64().unwrap());
        }
    }
    ids.sort_unstable();
    assert_eq!(ids, (1..=100).filter(|v| v % 10 == 3).collect::<Vec<i64>>());
}

/// A subscription read into a table that is not one of this crate's sinks (a Parquet folder):
/// the summary reports the source's messages, and no `Sink:` line of zeros (it used to print
/// "Sink: 0 row(s) acknowledged of 0 sent" while the statement's count was 200).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_into_parquet_is_summarised_by_its_source_alone() {
    let admin = crate::support::PubSubAdmin::connect().await;
    let (topic, subscription) = admin
        .topic_with_subscription("cli-summary", "toparquet", false)
        .await;
    let home = tempfile::tempdir().unwrap();
    let folder = tempfile::tempdir().unwrap();
    let host = &admin.host;
    let statements = [
        format!(
            "CREATE TABLE clicks (id BIGINT) WITH (connector = 'pubsub', \
             emulator_host = '{host}', topic = '{topic}')"
        ),
        "INSERT INTO clicks SELECT value FROM generate_series(1, 200)".to_string(),
        format!(
            "CREATE TABLE clicks_in (id BIGINT) WITH (connector = 'pubsub', \
             emulator_host = '{host}', subscription = '{subscription}', stop_after_idle = '2s')"
        ),
        format!(
            "CREATE EXTERNAL TABLE clicks_pq (id BIGINT) STORED AS PARQUET LOCATION '{}/'",
            folder.path().display()
        ),
        "INSERT INTO clicks_pq SELECT id FROM clicks_in".to_string(),
    ];
    let mut command = gcp_sql(home.path());
    for statement in &statements {
        command.args(["-c", statement]);
    }
    let output = tokio::task::spawn_blocking(move || run(&mut command))
        .await
        .unwrap();
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let summaries: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("Sink:") || l.starts_with("Source:"))
        .collect();
    // The publishing INSERT's summary, then the pipeline's: its source line alone.
    assert_eq!(summaries.len(), 2, "{stderr}");
    assert!(
        summaries[0].starts_with("Sink: 200 row(s) acknowledged of 200 sent"),
        "{stderr}"
    );
    assert_eq!(
        summaries[1], "Source: 200 message(s) read, 200 acknowledged, 0 nacked",
        "{stderr}"
    );
    // What landed, read by DataFusion's own Parquet reader.
    let ctx = datafusion::prelude::SessionContext::new();
    let landed = ctx
        .read_parquet(
            folder.path().to_str().unwrap(),
            datafusion::prelude::ParquetReadOptions::default(),
        )
        .await
        .unwrap()
        .count()
        .await
        .unwrap();
    assert_eq!(landed, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bigtable_sink_publishes_its_dead_letters_to_the_topic_of_pubsub_emulator_host() {
    // The child process has PUBSUB_EMULATOR_HOST set (this process never changes its own
    // environment): the Bigtable sink's dead-letter topic goes through it.
    let admin = crate::support::PubSubAdmin::connect().await;
    let (dead_topic, dead_subscription) = admin
        .topic_with_subscription("cli-dlq", "bigtable", false)
        .await;
    let bigtable = gcp_sql::emulators::shared(gcp_sql::emulators::EmulatorKind::Bigtable).await;
    let home = tempfile::tempdir().unwrap();
    let table = format!(
        "projects/cli-dlq/instances/main/tables/t{}",
        std::process::id()
    );
    let create = format!(
        "CREATE TABLE users (id VARCHAR, v BIGINT) WITH (connector = 'bigtable', \
         emulator_host = '{}', table = '{table}', row_key = 'id', auto_create_table = true, \
         failure_policy = 'dead_letter', dead_letter_topic = '{dead_topic}')",
        bigtable.host()
    );
    // Every fifth row has a null row key: refused by the encoder.
    let insert = "INSERT INTO users SELECT CASE WHEN value % 5 = 0 THEN NULL \
           ELSE concat('k', value) END, value FROM generate_series(1, 20)";
    let mut command = gcp_sql(home.path());
    command
        .env("PUBSUB_EMULATOR_HOST", &admin.host)
        .args(["-c", &create, "-c", insert]);
    let output = tokio::task::spawn_blocking(move || run(&mut command))
        .await
        .unwrap();
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("Sink: 16 row(s) acknowledged"), "{stderr}");
    assert!(stderr.contains("; 4 dead-lettered"), "{stderr}");
    let dead = admin.pull_all(&dead_subscription, 4).await;
    let mut values: Vec<i64> = dead
        .iter()
        .map(|m| {
            assert_eq!(
                m.attributes.get("connector").map(String::as_str),
                Some("bigtable")
            );
            assert_eq!(m.attributes.get("table").map(String::as_str), Some("users"));
            let row: serde_json::Value = serde_json::from_slice(&m.data).unwrap();
            assert!(row["id"].is_null(), "{row}");
            row["v"].as_i64().unwrap()
        })
        .collect();
    values.sort_unstable();
    assert_eq!(values, vec![5, 10, 15, 20]);
}

// --- streaming: a graceful stop, and an abort -------------------------------------------------

/// Waits until a line of stderr contains `needle`; returns it.
fn wait_for_line(running: &mut Running, needle: &str) -> String {
    let deadline = Instant::now() + EXIT_BOUND;
    loop {
        if let Some(line) = running.seen.iter().find(|l| l.contains(needle)) {
            return line.clone();
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match running.lines.recv_timeout(left) {
            Ok(line) => running.seen.push(line),
            Err(_) => panic!("no line with {needle:?} in:\n{}", running.seen.join("\n")),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_a_streaming_insert_gracefully_and_every_line_read_lands_once() {
    const LINES: i64 = 20;
    let admin = crate::support::PubSubAdmin::connect().await;
    let (topic, subscription) = admin
        .topic_with_subscription("clistream", "fifo", false)
        .await;
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("lines.csv");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);

    let home = tempfile::tempdir().unwrap();
    let mut command = gcp_sql(home.path());
    command
        .arg("-c")
        .arg("SET datafusion.execution.batch_size = 1")
        .arg("-c")
        .arg(format!(
            "CREATE UNBOUNDED EXTERNAL TABLE lines (id BIGINT, name VARCHAR) STORED AS CSV \
             LOCATION '{}' OPTIONS ('format.has_header' 'false')",
            fifo.display()
        ))
        .arg("-c")
        .arg(format!(
            "CREATE TABLE live (id BIGINT, name VARCHAR) WITH (connector = 'pubsub', \
             emulator_host = '{}', topic = '{topic}', batch_delay_threshold = '10ms', \
             flush_interval = '200ms')",
            admin.host
        ))
        .arg("-c")
        .arg("INSERT INTO live SELECT id, name FROM lines");
    let mut running = Running::spawn(command);
    let mut writer = std::fs::OpenOptions::new()
        .write(true)
        .open(&fifo)
        .expect("the tool opens the fifo");
    for id in 1..=LINES {
        writeln!(writer, "{id},name-{id}").unwrap();
        writer.flush().unwrap();
    }
    // Delivered while the input is still open, and reported at flush points (stderr is a
    // pipe here, as in a service: one line per flush point, no redrawn bar).
    let live = admin.pull_all(&subscription, LINES as usize).await;
    assert_eq!(live.len(), LINES as usize);
    wait_for_line(&mut running, "flush point");
    running.signal(libc::SIGTERM);
    let (status, stderr) = running.wait();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("SIGTERM: stopping"), "{stderr}");
    assert!(
        stderr.contains("Stopped on request: every row read was delivered."),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "Sink: {LINES} row(s) acknowledged of {LINES} sent"
        )),
        "{stderr}"
    );
    drop(writer);
    let mut ids = crate::support::ids(&live, "id");
    ids.sort_unstable();
    assert_eq!(ids, (1..=LINES).collect::<Vec<_>>());
    // Nothing more was published.
    assert!(admin.pull_all(&subscription, 0).await.is_empty());
}

#[test]
fn a_second_ctrl_c_aborts_a_stop_that_cannot_drain_and_names_what_is_unresolved() {
    // A "service" that accepts connections and never answers: every send stalls.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = silent.local_addr().unwrap();
    let (connected, first_connection) = std::sync::mpsc::channel::<()>();
    let held = std::thread::spawn(move || {
        let mut open = Vec::new();
        for stream in silent.incoming().take(16).flatten() {
            let _ = connected.send(());
            open.push(stream);
        }
        open
    });
    let home = tempfile::tempdir().unwrap();
    let mut command = gcp_sql(home.path());
    command
        .arg("-c")
        .arg(format!(
            "CREATE TABLE stalled (id BIGINT) WITH (connector = 'pubsub', \
             emulator_host = '{address}', topic = 'projects/p/topics/stalled')"
        ))
        .arg("-c")
        .arg("INSERT INTO stalled SELECT value FROM generate_series(1, 5000)");
    let mut running = Running::spawn(command);
    // Let the writers start and stall: the first Ctrl-C comes once a writer has connected (so
    // the tool is inside the INSERT, its handler long installed; a fixed 2 s was too short for
    // a debug binary to get there on a loaded machine, and the default action ended it
    // silently). The first connection is the sink's topic-schema lookup, which gives up after
    // 1 s; 3 s more let rows be admitted behind the stalled sends.
    first_connection
        .recv_timeout(EXIT_BOUND)
        .expect("a writer connects to the silent service");
    std::thread::sleep(Duration::from_secs(3));
    running.signal(libc::SIGINT);
    wait_for_line(&mut running, "Ctrl-C: stopping");
    running.signal(libc::SIGINT);
    let (status, stderr) = running.wait();
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("Ctrl-C: aborting"), "{stderr}");
    assert!(stderr.contains("stop requested (Ctrl-C)"), "{stderr}");
    assert!(
        stderr.contains("0 row(s) were acknowledged before the failure"),
        "{stderr}"
    );
    assert!(
        stderr.contains("admitted row(s) were not delivered"),
        "{stderr}"
    );
    drop(held);
}
