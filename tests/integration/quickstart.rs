//! The quickstart (`sql/quickstart.sql`) run by the `gcp-sql` binary with `--emulators`, and
//! the inspection functions it reads back with (`bigtable_read`, `cloud_tasks_create_queue`,
//! `cloud_tasks_list`), driven through the binary: they read the emulator variables, which a
//! test of this process may not set (see the binary's module docs).

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gcp_sql::emulators::{EmulatorKind, shared};
use serde_json::Value;

use crate::support::{require_emulators, unique};

/// Bound on one run of the tool, emulator start-up included (a JVM start on a loaded machine);
/// only reached when something is broken.
const RUN_BOUND: Duration = Duration::from_secs(300);

/// What one run of the tool printed.
struct Run {
    success: bool,
    stdout: String,
    stderr: String,
}

/// The tool's command (see [`crate::support::tool`]) with its output captured.
fn gcp_sql(home: &Path) -> Command {
    let mut command = crate::support::tool(home);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    command
}

/// Runs `command` to its end, bounded by [`RUN_BOUND`] (the tool is killed past it).
fn run(mut command: Command) -> Run {
    let mut child = command.spawn().expect("the gcp-sql binary runs");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + RUN_BOUND;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "gcp-sql did not end within {RUN_BOUND:?}:\n{}",
                err.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Run {
        success: status.success(),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// The result rows of every statement that printed some, in order (`--format json` prints one
/// JSON array per statement with columns).
fn results(stdout: &str) -> Vec<Vec<Value>> {
    stdout
        .lines()
        .filter(|l| l.starts_with('['))
        .map(|l| match serde_json::from_str::<Value>(l) {
            Ok(Value::Array(rows)) => rows,
            other => panic!("not a JSON array of rows ({other:?}): {l}"),
        })
        .collect()
}

/// The first result whose rows carry every one of `columns` (an empty result has no rows, so
/// it never matches).
fn result_with<'a>(results: &'a [Vec<Value>], columns: &[&str]) -> &'a [Value] {
    results
        .iter()
        .find(|rows| {
            rows.first()
                .is_some_and(|row| columns.iter().all(|c| row.get(*c).is_some()))
        })
        .unwrap_or_else(|| panic!("no result has the columns {columns:?}: {results:?}"))
}

fn field<'a>(row: &'a Value, name: &str) -> &'a str {
    row.get(name)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("row {row} has no text '{name}'"))
}

/// The clicks of `sql/data/clicks.csv` as `(user_id, url)`, sorted.
fn clicks() -> Vec<(i64, String)> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/sql/data/clicks.csv"))
        .unwrap();
    let mut clicks: Vec<(i64, String)> = text
        .lines()
        .skip(1)
        .map(|line| {
            let mut parts = line.split(',');
            let user = parts.next().unwrap().parse().unwrap();
            (user, parts.next().unwrap().to_string())
        })
        .collect();
    clicks.sort();
    clicks
}

#[test]
fn quickstart_writes_to_every_sink_and_reads_back_what_landed() {
    require_emulators(&crate::support::all_emulators());
    let home = tempfile::tempdir().unwrap();
    let mut command = gcp_sql(home.path());
    command.env("RUST_LOG", "gcp_sql=info").args([
        "--emulators",
        "--format",
        "json",
        "-f",
        "sql/quickstart.sql",
    ]);
    let Run {
        success,
        stdout,
        stderr,
    } = run(command);
    assert!(success, "{stderr}");
    let expected = clicks();
    assert_eq!(expected.len(), 20);
    // Four INSERTs (two topics, a table, a queue), each acknowledged whole, none retried.
    assert_eq!(
        stderr
            .matches("Sink: 20 row(s) acknowledged of 20 sent")
            .count(),
        4,
        "{stderr}"
    );
    assert_eq!(stderr.matches(" 0 retries").count(), 4, "{stderr}");
    assert!(stderr.contains("20 row(s) fetched."), "{stderr}");
    // The table the quickstart asks the sink to create: logged once, counted as a creation.
    assert_eq!(
        stderr
            .matches("created table projects/demo/instances/quickstart/tables/clicks")
            .count(),
        1,
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("; 1 destination(s) created").count(),
        1,
        "{stderr}"
    );
    assert!(!stderr.contains("WARN"), "{stderr}");
    assert!(!stderr.contains("retrying a send"), "{stderr}");

    let results = results(&stdout);
    // Pub/Sub: one JSON message per click, then the same with the url as an attribute.
    let messages = result_with(&results, &["data"]);
    let mut landed: Vec<(i64, String)> = messages
        .iter()
        .map(|m| {
            let data: Value = serde_json::from_str(field(m, "data")).unwrap();
            (
                data["user_id"].as_i64().unwrap(),
                data["url"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    landed.sort();
    assert_eq!(landed, expected, "Pub/Sub messages");
    let keyed = result_with(&results, &["ordering_key", "attributes", "data"]);
    let mut landed: Vec<(i64, String)> = keyed
        .iter()
        .map(|m| {
            let data: Value = serde_json::from_str(field(m, "data")).unwrap();
            let attributes: Value = serde_json::from_str(field(m, "attributes")).unwrap();
            let user = data["user_id"].as_i64().unwrap();
            assert_eq!(field(m, "ordering_key"), format!("user-{user}"));
            (user, attributes["url"].as_str().unwrap().to_string())
        })
        .collect();
    landed.sort();
    assert_eq!(landed, expected, "Pub/Sub messages with ordering keys");

    // Bigtable: one cell version per click, the user as the row key, the url as the value.
    let cells = result_with(&results, &["row_key", "family", "qualifier", "value"]);
    let mut landed: Vec<(i64, String)> = cells
        .iter()
        .map(|c| {
            assert_eq!(field(c, "family"), "c", "{c}");
            assert_eq!(field(c, "qualifier"), "url", "{c}");
            (
                field(c, "row_key").parse().unwrap(),
                field(c, "value").to_string(),
            )
        })
        .collect();
    landed.sort();
    assert_eq!(landed, expected, "Bigtable cells");

    // Cloud Tasks: one POST per click, the row as its JSON body (the map column is not in it),
    // its X-User header from the map column, kept in the paused queue.
    let queue = result_with(&results, &["queue", "created", "state"]);
    assert_eq!(queue[0]["created"], Value::Bool(true), "{queue:?}");
    assert_eq!(field(&queue[0], "state"), "PAUSED");
    let tasks = result_with(&results, &["http_method", "url", "headers", "body"]);
    let mut landed: Vec<(i64, String)> = tasks
        .iter()
        .map(|t| {
            assert_eq!(field(t, "http_method"), "POST", "{t}");
            assert_eq!(field(t, "url"), "http://localhost:8080/clicks", "{t}");
            let body: Value = serde_json::from_str(field(t, "body")).unwrap();
            assert!(body.get("request_headers").is_none(), "{t}");
            let user = body["user_id"].as_i64().unwrap();
            let headers: Value = serde_json::from_str(field(t, "headers")).unwrap();
            assert_eq!(headers["X-User"], user.to_string(), "{t}");
            (user, body["page"].as_str().unwrap().to_string())
        })
        .collect();
    landed.sort();
    assert_eq!(landed, expected, "Cloud Tasks tasks");
}

/// Runs `sql` with the tool pointed at the shared emulator of `kind`, results as JSON.
async fn run_on(kind: EmulatorKind, sql: &[&str]) -> Run {
    let emulator = shared(kind).await;
    let home = tempfile::tempdir().unwrap();
    let mut command = gcp_sql(home.path());
    command.env(emulator.env_var(), emulator.host());
    command.args(["--format", "json"]);
    for statement in sql {
        command.args(["-c", statement]);
    }
    tokio::task::spawn_blocking(move || {
        let run = run(command);
        drop(home);
        run
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn bigtable_read_returns_every_cell_and_version_of_the_first_rows() {
    let table = format!("projects/inspect/instances/read/tables/{}", unique("t"));
    let create = format!(
        "CREATE TABLE cells (k VARCHAR, ts TIMESTAMP, name VARCHAR, n BIGINT, raw BYTEA) \
         WITH (connector = 'bigtable', table = '{table}', row_key = 'k', column_family = 'f', \
         timestamp_column = 'ts', auto_create_table = true)"
    );
    let insert = "INSERT INTO cells VALUES \
        ('a', TIMESTAMP '2024-01-01T00:00:01', 'first', 1, X'FF00'), \
        ('a', TIMESTAMP '2024-01-01T00:00:02', 'second', 2, X'FF01'), \
        ('b', TIMESTAMP '2024-01-01T00:00:03', 'bee', 3, X'FF02'), \
        ('c', TIMESTAMP '2024-01-01T00:00:04', 'sea', 4, X'FF03')";
    let read_two = format!(
        "SELECT row_key, qualifier, value, encode(value_bytes, 'hex') AS hex, \
         CAST(timestamp AS VARCHAR) AS ts \
         FROM bigtable_read('{table}', 2) ORDER BY row_key, qualifier, timestamp"
    );
    let Run {
        success,
        stdout,
        stderr,
    } = run_on(EmulatorKind::Bigtable, &[&create, insert, &read_two]).await;
    assert!(success, "{stderr}");
    let results = results(&stdout);
    let cells = result_with(&results, &["row_key", "qualifier", "hex"]);
    let seen: Vec<(String, String, Option<String>, String, String)> = cells
        .iter()
        .map(|c| {
            (
                field(c, "row_key").to_string(),
                field(c, "qualifier").to_string(),
                c.get("value").and_then(Value::as_str).map(str::to_string),
                field(c, "hex").to_string(),
                field(c, "ts").to_string(),
            )
        })
        .collect();
    let cell = |k: &str, q: &str, v: Option<&str>, hex: &str, ts: &str| {
        (
            k.to_string(),
            q.to_string(),
            v.map(str::to_string),
            hex.to_string(),
            ts.to_string(),
        )
    };
    // Two rows (a and b): every cell, both versions of a's; a BIGINT is 8 bytes big-endian
    // (valid UTF-8 here, so it has a text too); 0xFF.. is not UTF-8, so it has no text.
    assert_eq!(
        seen,
        vec![
            cell(
                "a",
                "n",
                Some("\0\0\0\0\0\0\0\u{1}"),
                "0000000000000001",
                "2024-01-01T00:00:01Z"
            ),
            cell(
                "a",
                "n",
                Some("\0\0\0\0\0\0\0\u{2}"),
                "0000000000000002",
                "2024-01-01T00:00:02Z"
            ),
            cell(
                "a",
                "name",
                Some("first"),
                "6669727374",
                "2024-01-01T00:00:01Z"
            ),
            cell(
                "a",
                "name",
                Some("second"),
                "7365636f6e64",
                "2024-01-01T00:00:02Z"
            ),
            cell("a", "raw", None, "ff00", "2024-01-01T00:00:01Z"),
            cell("a", "raw", None, "ff01", "2024-01-01T00:00:02Z"),
            cell(
                "b",
                "n",
                Some("\0\0\0\0\0\0\0\u{3}"),
                "0000000000000003",
                "2024-01-01T00:00:03Z"
            ),
            cell("b", "name", Some("bee"), "626565", "2024-01-01T00:00:03Z"),
            cell("b", "raw", None, "ff02", "2024-01-01T00:00:03Z"),
        ]
    );
}

#[tokio::test]
async fn bigtable_read_of_a_missing_table_names_it() {
    let table = format!("projects/inspect/instances/read/tables/{}", unique("none"));
    let read = format!("SELECT * FROM bigtable_read('{table}')");
    let Run {
        success, stderr, ..
    } = run_on(EmulatorKind::Bigtable, &[&read]).await;
    assert!(!success, "{stderr}");
    assert!(stderr.contains("ReadRows"), "{stderr}");
    assert!(stderr.contains(&table), "{stderr}");
    assert!(stderr.contains("NOT_FOUND"), "{stderr}");
}

#[tokio::test]
async fn cloud_tasks_queue_is_created_once_paused_and_lists_the_tasks_written_to_it() {
    let queue = format!("projects/inspect/locations/here/queues/{}", unique("q"));
    let create_queue = format!("SELECT * FROM cloud_tasks_create_queue('{queue}')");
    let sink = format!(
        "CREATE TABLE jobs (body VARCHAR) WITH (connector = 'cloud_tasks', queue = '{queue}', \
         url = 'http://localhost:9/run', headers = 'X-Source: test', body_column = 'body')"
    );
    let insert = "INSERT INTO jobs SELECT concat('job-', CAST(value AS VARCHAR)) \
                  FROM generate_series(1, 5)";
    let list_three =
        format!("SELECT task, http_method, url, headers, body FROM cloud_tasks_list('{queue}', 3)");
    let list_all = format!("SELECT body FROM cloud_tasks_list('{queue}') ORDER BY body");
    let Run {
        success,
        stdout,
        stderr,
    } = run_on(
        EmulatorKind::CloudTasks,
        &[
            &create_queue,
            &create_queue,
            &sink,
            insert,
            &list_three,
            &list_all,
        ],
    )
    .await;
    assert!(success, "{stderr}");
    let results = results(&stdout);
    assert_eq!(results.len(), 5, "{stdout}");
    // Created by the first call only; paused both times.
    assert_eq!(results[0][0]["created"], Value::Bool(true), "{stdout}");
    assert_eq!(results[1][0]["created"], Value::Bool(false), "{stdout}");
    for created in &results[..2] {
        assert_eq!(field(&created[0], "queue"), queue);
        assert_eq!(field(&created[0], "state"), "PAUSED");
    }
    // max_tasks caps the listing.
    let three = &results[3];
    assert_eq!(three.len(), 3, "{stdout}");
    for task in three {
        assert!(
            field(task, "task").starts_with(&format!("{queue}/tasks/")),
            "{task}"
        );
        assert_eq!(field(task, "http_method"), "POST");
        assert_eq!(field(task, "url"), "http://localhost:9/run");
        let headers: Value = serde_json::from_str(field(task, "headers")).unwrap();
        assert_eq!(headers["X-Source"], "test", "{headers}");
    }
    // The paused queue keeps every task listed.
    let bodies: Vec<&str> = results[4].iter().map(|t| field(t, "body")).collect();
    assert_eq!(bodies, vec!["job-1", "job-2", "job-3", "job-4", "job-5"]);
}

#[tokio::test]
async fn cloud_tasks_create_queue_can_leave_it_running_and_list_refuses_a_missing_queue() {
    let queue = format!("projects/inspect/locations/here/queues/{}", unique("run"));
    let missing = format!("projects/inspect/locations/here/queues/{}", unique("none"));
    let running = format!("SELECT state FROM cloud_tasks_create_queue('{queue}', false)");
    let Run {
        success,
        stdout,
        stderr,
    } = run_on(EmulatorKind::CloudTasks, &[&running]).await;
    assert!(success, "{stderr}");
    assert_eq!(
        results(&stdout),
        vec![vec![serde_json::json!({"state": "RUNNING"})]]
    );

    let list = format!("SELECT * FROM cloud_tasks_list('{missing}')");
    let Run {
        success, stderr, ..
    } = run_on(EmulatorKind::CloudTasks, &[&list]).await;
    assert!(!success, "{stderr}");
    assert!(
        stderr.contains(&format!("queue '{missing}' does not exist on the emulator")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "SELECT * FROM cloud_tasks_create_queue('{missing}')"
        )),
        "{stderr}"
    );
}

/// The Cloud Tasks emulator ignores `page_size` and answers `ListTasks` with the whole queue in
/// one message: 6,000 tasks with 1 KiB bodies make about 8 MiB, past tonic's default 4 MiB
/// decode limit (which failed this listing with `decoded message length too large`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloud_tasks_list_lists_a_queue_whose_listing_exceeds_four_mib() {
    const TASKS: usize = 6_000;
    let queue = format!("projects/inspect/locations/here/queues/{}", unique("big"));
    let create_queue = format!("SELECT * FROM cloud_tasks_create_queue('{queue}')");
    let sink = format!(
        "CREATE TABLE jobs (body VARCHAR) WITH (connector = 'cloud_tasks', queue = '{queue}', \
         url = 'http://localhost:9/run', body_column = 'body')"
    );
    let insert = format!(
        "INSERT INTO jobs SELECT concat(repeat('x', 1024), CAST(value AS VARCHAR)) \
         FROM generate_series(1, {TASKS})"
    );
    let count = format!(
        "SELECT count(*) AS tasks, count(DISTINCT body) AS bodies \
         FROM cloud_tasks_list('{queue}', 100000)"
    );
    let Run {
        success,
        stdout,
        stderr,
    } = run_on(
        EmulatorKind::CloudTasks,
        &[&create_queue, &sink, &insert, &count],
    )
    .await;
    assert!(success, "{stderr}");
    let results = results(&stdout);
    assert_eq!(
        results.last().unwrap(),
        &vec![serde_json::json!({"tasks": TASKS, "bodies": TASKS})],
        "{stdout}"
    );
}

/// The pipeline script (`sql/pipeline.sql`): clicks published to a topic, read back from its
/// subscription as a source, reshaped and written to Bigtable; every click lands once, every
/// message is acknowledged (the summary says so, and nothing is left to pull).
#[test]
fn pipeline_reads_a_subscription_into_bigtable_and_acknowledges_every_message() {
    require_emulators(&[EmulatorKind::PubSub, EmulatorKind::Bigtable]);
    let home = tempfile::tempdir().unwrap();
    let mut command = gcp_sql(home.path());
    command.args(["--emulators", "--format", "json", "-f", "sql/pipeline.sql"]);
    let Run {
        success,
        stdout,
        stderr,
    } = run(command);
    assert!(success, "{stderr}");
    assert!(
        stderr.contains("Source: 20 message(s) read, 20 acknowledged, 0 nacked"),
        "{stderr}"
    );
    let results = results(&stdout);
    let cells = result_with(&results, &["row_key", "qualifier", "value"]);
    let mut landed: Vec<(i64, String)> = cells
        .iter()
        .map(|row| {
            let user = field(row, "row_key")
                .trim_start_matches("user-")
                .parse()
                .unwrap();
            (user, field(row, "value").to_string())
        })
        .collect();
    landed.sort();
    let expected: Vec<(i64, String)> = clicks()
        .into_iter()
        .map(|(user, url)| (user, url.to_uppercase()))
        .collect();
    assert_eq!(landed, expected, "every click once, reshaped");
    let left = result_with(&results, &["left_on_the_subscription"]);
    assert_eq!(left[0]["left_on_the_subscription"], 0, "{left:?}");
}

/// The windows script (`sql/windows.sql`): clicks per user and minute of event time land in
/// Bigtable, one row per user and minute with the window's end as the cell version, equal to a
/// count over the CSV; the open window of the closing click is not emitted.
#[test]
fn windows_count_clicks_per_user_and_minute_into_bigtable() {
    require_emulators(&[EmulatorKind::PubSub, EmulatorKind::Bigtable]);
    let _ = std::fs::remove_dir_all(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/target/windows-demo-progress"
    ));
    let home = tempfile::tempdir().unwrap();
    let mut command = gcp_sql(home.path());
    command.args(["--emulators", "--format", "json", "-f", "sql/windows.sql"]);
    let Run {
        success,
        stdout,
        stderr,
    } = run(command);
    assert!(success, "{stderr}");
    assert!(
        stderr.contains("Source: 21 message(s) read, 20 acknowledged, 1 nacked"),
        "each click is acknowledged once its window landed; the closing one's window is \
         open, and it goes back: {stderr}"
    );
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/sql/data/clicks.csv"))
        .unwrap();
    let mut expected: std::collections::BTreeMap<String, u64> = Default::default();
    for line in text.lines().skip(1) {
        let parts: Vec<&str> = line.split(',').collect();
        let minute = &parts[2][11..16];
        *expected
            .entry(format!("user-{}#{minute}", parts[0]))
            .or_default() += 1;
    }
    let results = results(&stdout);
    let cells = result_with(&results, &["row_key", "value", "timestamp"]);
    let landed: std::collections::BTreeMap<String, u64> = cells
        .iter()
        .map(|row| {
            let value = field(row, "value");
            (
                field(row, "row_key").to_string(),
                value.parse().unwrap_or(u64::MAX),
            )
        })
        .collect();
    assert_eq!(
        landed.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>(),
        "one row per user and minute, none for the open window: {cells:?}"
    );
}

/// The changelog script (`sql/bigtable_changelog.sql`): nine insert / update / delete events
/// (Debezium codes among them) delivered twice leave each key's last row exactly, one version
/// per cell, and the deleted key gone; the increments add up; the first row of a key wins under
/// `insert_if_absent`, and a later statement does not replace it.
#[test]
fn bigtable_changelog_script_ends_in_the_changelogs_final_state() {
    require_emulators(&[EmulatorKind::Bigtable]);
    let home = tempfile::tempdir().unwrap();
    let mut command = gcp_sql(home.path());
    command.args([
        "--emulators",
        "--format",
        "json",
        "-f",
        "sql/bigtable_changelog.sql",
    ]);
    let Run {
        success,
        stdout,
        stderr,
    } = run(command);
    assert!(success, "{stderr}");
    let results = results(&stdout);
    let cells: Vec<(String, String, String, String)> =
        result_with(&results, &["row_key", "qualifier", "value", "timestamp"])
            .iter()
            .map(|row| {
                (
                    field(row, "row_key").to_string(),
                    field(row, "qualifier").to_string(),
                    field(row, "value").to_string(),
                    field(row, "timestamp").to_string(),
                )
            })
            .collect();
    let cell = |k: &str, q: &str, v: &str, t: &str| {
        (k.to_string(), q.to_string(), v.to_string(), t.to_string())
    };
    assert_eq!(
        cells,
        vec![
            cell("c-1", "name", "Ada L.", "2023-11-14T22:13:22Z"),
            cell("c-1", "tier", "gold", "2023-11-14T22:13:22Z"),
            cell("c-3", "name", "Chen", "2023-11-14T22:13:25Z"),
            cell("c-3", "tier", "bronze", "2023-11-14T22:13:25Z"),
            cell("c-4", "name", "Dana", "2023-11-14T22:13:27Z"),
            cell("c-4", "tier", "gold", "2023-11-14T22:13:27Z"),
        ],
        "{stdout}"
    );
    let visits: Vec<(&str, &str)> = result_with(&results, &["row_key", "visits_hex"])
        .iter()
        .map(|row| (field(row, "row_key"), field(row, "visits_hex")))
        .collect();
    assert_eq!(
        visits,
        vec![("c-1", "0000000000000004"), ("c-3", "0000000000000001")]
    );
    let first: Vec<(&str, &str)> = result_with(&results, &["row_key", "first_source"])
        .iter()
        .map(|row| (field(row, "row_key"), field(row, "first_source")))
        .collect();
    assert_eq!(first, vec![("c-1", "web"), ("c-2", "app")]);
}

/// The reading script (`sql/bigtable_read.sql`): the clicks written to Bigtable read back by
/// `SELECT`: all of them, one user's by prefix with the click time back from the cell version,
/// a time range under the prefix, and an `EXPLAIN` that shows the row ranges.
#[test]
fn bigtable_read_script_selects_the_rows_it_wrote() {
    require_emulators(&[EmulatorKind::Bigtable]);
    let home = tempfile::tempdir().unwrap();
    let mut command = gcp_sql(home.path());
    command.args([
        "--emulators",
        "--format",
        "json",
        "-f",
        "sql/bigtable_read.sql",
    ]);
    let Run {
        success,
        stdout,
        stderr,
    } = run(command);
    assert!(success, "{stderr}");
    let results = results(&stdout);
    let total = result_with(&results, &["clicks"]);
    assert_eq!(total[0]["clicks"], clicks().len(), "{total:?}");
    let user = result_with(&results, &["user_id", "at", "url", "ts"]);
    let expected: Vec<String> =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/sql/data/clicks.csv"))
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("101,"))
            .map(|l| l.rsplit(',').next().unwrap().to_string())
            .collect();
    let at: Vec<&str> = user.iter().map(|r| field(r, "at")).collect();
    assert_eq!(at, expected);
    for row in user {
        assert_eq!(field(row, "user_id"), "101");
        // The click time, back from the cell version.
        assert!(field(row, "ts").starts_with(field(row, "at")), "{row}");
    }
    let range = result_with(&results, &["clicked_at"]);
    let in_range: Vec<&str> = range.iter().map(|r| field(r, "clicked_at")).collect();
    let expected_range: Vec<&str> = expected
        .iter()
        .map(String::as_str)
        .filter(|a| *a >= "2024-05-01T09:05" && *a < "2024-05-01T09:10")
        .collect();
    assert!(!expected_range.is_empty());
    assert_eq!(in_range, expected_range);
    assert!(
        stdout.contains("keys=[['100#'..'100$'), ['102#'..'102$')]"),
        "{stdout}"
    );
}
