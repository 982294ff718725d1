//! The `gcp-sql` binary as a shell like datafusion-cli, driven as a process: `SHOW TABLES`
//! without a `SET`, the backslash commands (`\d`, `\d NAME`, `\?`) in `-c` sources and on the
//! shell's piped input, the result formats, and log lines without colour codes off a terminal.
//!
//! Declaring a sink contacts no service, so the `\d` tests need no emulator; the `ndjson` test
//! publishes to the shared Pub/Sub emulator and reads the messages back.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Output, Stdio};
use std::sync::Arc;

use crate::support::{output as run, text, tool as gcp_sql};

use datafusion::arrow::array::{Array, Int64Array, StringArray};
use datafusion::arrow::csv::ReaderBuilder;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use gcp_sql::connectors::ConnectorKind;
use gcp_sql::connectors::catalog::options_for;
use gcp_sql::emulators::{EmulatorKind, shared};

const PUBSUB: &str = "CREATE TABLE clicks (user_id BIGINT NOT NULL, url VARCHAR) WITH (connector = 'pubsub', \
     topic = 'projects/demo/topics/clicks', batch_element_count_threshold = 500)";
/// A Cloud Tasks sink whose URL and headers carry secrets that `\d` must not show.
const CLOUD_TASKS: &str = "CREATE TABLE jobs (body VARCHAR) WITH (connector = 'cloud_tasks', \
     queue = 'projects/demo/locations/us-central1/queues/jobs', \
     url = 'https://user:hunter2@worker.example.com/run?key=TOPSECRET', \
     headers = 'Authorization: Bearer TOPSECRET; X-Source: demo', body_column = 'body')";
/// The native form: the destination comes from `LOCATION`.
const BIGTABLE: &str = "CREATE EXTERNAL TABLE events (user_id BIGINT, url VARCHAR) STORED AS BIGTABLE \
     LOCATION 'projects/demo/instances/main/tables/events' \
     OPTIONS ('row_key' 'user_id', 'column_family' 'c', 'max_in_flight_entries' '2000')";

/// Runs `-q --format csv` with one `-c` per item and returns stdout, asserting success.
fn csv_run(items: &[&str]) -> String {
    let home = tempfile::tempdir().unwrap();
    let mut command = gcp_sql(home.path());
    command.args(["-q", "--format", "csv"]);
    for item in items {
        command.args(["-c", item]);
    }
    let output = run(&mut command);
    assert!(output.status.success(), "stderr: {}", text(&output.stderr));
    text(&output.stdout)
}

/// Runs the shell on `input` (piped stdin) and returns its output.
fn shell(args: &[&str], input: &str) -> Output {
    let home = tempfile::tempdir().unwrap();
    let mut child = gcp_sql(home.path())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// The rows of a CSV text of one table, header first, read with arrow's CSV reader (every
/// column as text; an empty field is an empty string).
fn csv_rows(table: &str) -> Vec<Vec<String>> {
    let header: Vec<String> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split(',')
        .map(str::to_string)
        .collect();
    let schema = Arc::new(Schema::new(
        header
            .iter()
            .map(|name| Field::new(name, DataType::Utf8, true))
            .collect::<Vec<_>>(),
    ));
    let reader = ReaderBuilder::new(schema)
        .with_header(true)
        .build(table.as_bytes())
        .unwrap();
    let mut rows = vec![header];
    for batch in reader {
        let batch = batch.unwrap();
        for row in 0..batch.num_rows() {
            rows.push(
                batch
                    .columns()
                    .iter()
                    .map(|c| {
                        let c = c.as_any().downcast_ref::<StringArray>().unwrap();
                        if c.is_null(row) {
                            String::new()
                        } else {
                            c.value(row).to_string()
                        }
                    })
                    .collect(),
            );
        }
    }
    rows
}

/// `\d NAME` in CSV: the columns table, then the options table (from its `option,value`
/// header).
fn describe_csv(create: &str, table: &str) -> (Vec<Vec<String>>, Vec<(String, String)>) {
    let out = csv_run(&[create, &format!("\\d {table}")]);
    let at = out
        .find("option,value\n")
        .unwrap_or_else(|| panic!("no options table in:\n{out}"));
    let options = csv_rows(&out[at..])
        .into_iter()
        .skip(1)
        .map(|row| (row[0].clone(), row[1].clone()))
        .collect();
    (csv_rows(&out[..at]), options)
}

/// Asserts that `options` lists every option of `kind` once, in the connector list's order,
/// that the given ones carry their value and all others a `(default: ...)`.
fn assert_options_in_force(
    kind: ConnectorKind,
    options: &[(String, String)],
    given: &[(&str, &str)],
) {
    let names: Vec<&str> = options.iter().map(|(n, _)| n.as_str()).collect();
    let expected: Vec<&str> = options_for(kind).map(|s| s.name).collect();
    assert_eq!(names, expected, "{kind}");
    for (name, value) in options {
        match given.iter().find(|(n, _)| n == name) {
            Some((_, v)) => assert_eq!(value, v, "{kind} option {name}"),
            None => assert!(
                value.starts_with("(default: ") && value.ends_with(')'),
                "{kind} option {name}: {value}"
            ),
        }
    }
}

fn option<'a>(options: &'a [(String, String)], name: &str) -> &'a str {
    &options.iter().find(|(n, _)| n == name).unwrap().1
}

#[test]
fn show_tables_and_show_columns_need_no_set() {
    let out = csv_run(&[PUBSUB, "SHOW TABLES"]);
    let rows = csv_rows(&out);
    assert!(
        rows.contains(&vec![
            "datafusion".into(),
            "public".into(),
            "clicks".into(),
            "BASE TABLE".into()
        ]),
        "{out}"
    );
    let out = csv_run(&[PUBSUB, "SHOW COLUMNS FROM clicks"]);
    let rows = csv_rows(&out);
    let user_id = rows
        .iter()
        .find(|r| r.get(3).map(String::as_str) == Some("user_id"))
        .unwrap_or_else(|| panic!("no user_id column in:\n{out}"));
    assert_eq!(user_id.get(4).map(String::as_str), Some("Int64"), "{out}");
    assert_eq!(user_id.get(5).map(String::as_str), Some("NO"), "{out}");
}

#[test]
fn backslash_d_lists_every_table_with_its_kind() {
    let csv = format!(
        "CREATE EXTERNAL TABLE source STORED AS CSV LOCATION '{}' OPTIONS ('format.has_header' 'true')",
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/events.csv")
            .display()
    );
    let out = csv_run(&[
        PUBSUB,
        CLOUD_TASKS,
        BIGTABLE,
        &csv,
        "CREATE VIEW recent AS SELECT 1 AS x",
        "\\d",
    ]);
    let rows = csv_rows(&out);
    let expected: Vec<Vec<String>> = [
        ["table_name", "kind"],
        ["clicks", "pubsub sink"],
        ["events", "bigtable sink"],
        ["jobs", "cloud_tasks sink"],
        ["recent", "view"],
        ["source", "table"],
    ]
    .iter()
    .map(|r| r.iter().map(|c| c.to_string()).collect())
    .collect();
    assert_eq!(rows, expected, "{out}");
}

#[test]
fn backslash_d_describes_a_pubsub_sink() {
    let (columns, options) = describe_csv(PUBSUB, "clicks");
    assert_eq!(
        columns,
        vec![
            vec!["column_name", "data_type", "is_nullable"],
            vec!["user_id", "Int64", "NO"],
            vec!["url", "Utf8View", "YES"],
        ]
    );
    assert_options_in_force(
        gcp_sql::connectors::pubsub::KIND,
        &options,
        &[
            ("connector", "pubsub"),
            ("topic", "projects/demo/topics/clicks"),
            ("batch_element_count_threshold", "500"),
        ],
    );
    assert_eq!(
        option(&options, "max_in_flight_messages"),
        "(default: 1,000)"
    );
    assert_eq!(
        option(&options, "emulator_host"),
        "(default: none, $PUBSUB_EMULATOR_HOST is unset: the service's own endpoint)"
    );
}

#[test]
fn backslash_d_describes_a_cloud_tasks_sink_without_its_secrets() {
    let (columns, options) = describe_csv(CLOUD_TASKS, "jobs");
    assert_eq!(columns[1], vec!["body", "Utf8View", "YES"]);
    assert_options_in_force(
        gcp_sql::connectors::cloud_tasks::KIND,
        &options,
        &[
            ("connector", "cloud_tasks"),
            ("queue", "projects/demo/locations/us-central1/queues/jobs"),
            ("url", "https://worker.example.com/... (rest hidden)"),
            ("headers", "Authorization, X-Source (values hidden)"),
            ("body_column", "body"),
        ],
    );
    assert_eq!(option(&options, "http_method"), "(default: POST)");
    // The table format, on the shell's input, says the same without the secrets either.
    let output = shell(&[], &format!("{CLOUD_TASKS};\n\\d jobs\n"));
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        stdout.contains(
            "Table jobs: cloud_tasks sink, queue projects/demo/locations/us-central1/queues/jobs"
        ),
        "{stdout}"
    );
    for secret in ["TOPSECRET", "hunter2", "user:"] {
        assert!(!stdout.contains(secret), "{secret} shown:\n{stdout}");
        assert!(!text(&output.stderr).contains(secret), "{secret} logged");
    }
}

#[test]
fn backslash_d_describes_a_bigtable_sink_declared_with_location() {
    let (columns, options) = describe_csv(BIGTABLE, "events");
    assert_eq!(columns[1], vec!["user_id", "Int64", "YES"]);
    assert_options_in_force(
        gcp_sql::connectors::bigtable::KIND,
        &options,
        &[
            ("connector", "bigtable"),
            ("table", "projects/demo/instances/main/tables/events"),
            ("row_key", "user_id"),
            ("column_family", "c"),
            ("max_in_flight_entries", "2000"),
        ],
    );
    assert_eq!(option(&options, "row_key_delimiter"), "(default: #)");
}

#[test]
fn the_shell_reads_backslash_commands_before_sql() {
    let input = format!(
        "\\?\n{PUBSUB};\n-- only a comment\n\\d\n\\d clicks\nSELECT '\n\\d' AS not_a_command;\n\\q\nSELECT 'unreached';\n"
    );
    let output = shell(&[], &input);
    let stdout = text(&output.stdout);
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    for command in ["\\d NAME", "\\format", "\\?", "\\q"] {
        assert!(stdout.contains(command), "{command} not in help:\n{stdout}");
    }
    assert!(stdout.contains("| clicks     | pubsub sink |"), "{stdout}");
    assert!(
        stdout.contains("Table clicks: pubsub sink, topic projects/demo/topics/clicks"),
        "{stdout}"
    );
    assert!(
        stdout.contains("| batch_element_count_threshold | 500 "),
        "{stdout}"
    );
    // A `\` line inside an open string belongs to the statement.
    assert!(stdout.contains("not_a_command"), "{stdout}");
    assert!(!stdout.contains("unreached"), "{stdout}");
}

#[test]
fn describing_a_missing_table_names_the_nearest_one() {
    let home = tempfile::tempdir().unwrap();
    let output = run(gcp_sql(home.path()).args([
        "-c",
        PUBSUB,
        "-c",
        "\\d clikcs",
        "-c",
        "SELECT 'after' AS step",
    ]));
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("Error: no table 'clikcs'; did you mean 'clicks'?"),
        "{stderr}"
    );
    assert!(!text(&output.stdout).contains("after"));
    // In the shell the error is reported and the shell goes on; the exit code says it failed.
    let output = shell(
        &[],
        &format!("{PUBSUB};\n\\d clikcs\nSELECT 'after' AS step;\n"),
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("did you mean 'clicks'?"),
        "{}",
        text(&output.stderr)
    );
    assert!(text(&output.stdout).contains("after"));
}

#[test]
fn csv_results_parse_as_csv() {
    let out = csv_run(&[
        "SELECT * FROM (VALUES (1, 'plain'), (2, 'a, \"quoted\" value'), (3, NULL)) AS t(id, note) ORDER BY id",
    ]);
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("note", DataType::Utf8, true),
    ]));
    let mut reader = ReaderBuilder::new(schema)
        .with_header(true)
        .build(out.as_bytes())
        .unwrap();
    let batch = reader.next().unwrap().unwrap();
    assert!(reader.next().is_none());
    let ids = batch
        .column(0)
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap();
    let notes = batch
        .column(1)
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap();
    assert_eq!(ids.values(), &[1, 2, 3]);
    assert_eq!(notes.value(0), "plain");
    assert_eq!(notes.value(1), "a, \"quoted\" value");
    assert!(notes.is_null(2), "{out}");
}

#[tokio::test]
async fn ndjson_results_of_messages_pulled_from_the_emulator_parse_line_by_line() {
    let emulator = shared(EmulatorKind::PubSub).await;
    let id = std::process::id();
    let topic = format!("projects/cli-shell/topics/ndjson-{id}");
    let subscription = format!("projects/cli-shell/subscriptions/ndjson-{id}");
    let create = format!(
        "CREATE TABLE out (id BIGINT, name VARCHAR) WITH (connector = 'pubsub', topic = '{topic}', \
         auto_create_topic = true)"
    );
    let subscribe = format!("SELECT * FROM pubsub_subscribe('{topic}', '{subscription}')");
    let insert = "INSERT INTO out VALUES (1, 'one'), (2, 'two'), (3, 'three')";
    let pull = format!("SELECT data FROM pubsub_pull('{subscription}', 10)");
    let home = tempfile::tempdir().unwrap();
    let mut command = gcp_sql(home.path());
    command
        .env("PUBSUB_EMULATOR_HOST", emulator.host())
        .args(["-q", "--format", "ndjson"])
        .args(["-c", &create, "-c", &subscribe, "-c", insert, "-c", &pull]);
    let output = tokio::task::spawn_blocking(move || run(&mut command))
        .await
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(lines[0]["created"], serde_json::json!(true), "{stdout}");
    assert_eq!(lines[1]["count"], serde_json::json!(3), "{stdout}");
    let mut rows: Vec<serde_json::Value> = lines[2..]
        .iter()
        .map(|l| serde_json::from_str(l["data"].as_str().unwrap()).unwrap())
        .collect();
    rows.sort_by_key(|r| r["id"].as_i64());
    assert_eq!(
        rows,
        vec![
            serde_json::json!({"id": 1, "name": "one"}),
            serde_json::json!({"id": 2, "name": "two"}),
            serde_json::json!({"id": 3, "name": "three"}),
        ],
        "{stdout}"
    );
}

/// A Bigtable declaration whose `max_in_flight_entries` is above what one client admits logs
/// a WARN line when declared (no service contacted).
const WARNS: &str = "CREATE TABLE bt (k VARCHAR, v VARCHAR) WITH (connector = 'bigtable', \
     table = 'projects/demo/instances/main/tables/t', row_key = 'k', column_family = 'c', \
     max_in_flight_entries = 30000)";

#[test]
fn logs_to_a_pipe_carry_no_colour_codes() {
    let home = tempfile::tempdir().unwrap();
    let output = run(gcp_sql(home.path()).args(["-q", "-c", WARNS]));
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("WARN") && stderr.contains("max_in_flight_entries"),
        "{stderr}"
    );
    assert!(!stderr.contains("\x1b["), "{stderr:?}");
}

/// Runs the tool with stderr on a pseudo-terminal and returns what it wrote there.
fn stderr_on_a_terminal(no_color: Option<&str>) -> String {
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two new descriptors into the given integers; the other arguments
    // may be null (no name, default settings and size).
    let opened = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(opened, 0, "openpty failed");
    for fd in [master, slave] {
        // SAFETY: sets the close-on-exec flag of a descriptor this function owns, so that no
        // other child of this test process (an emulator, say) keeps the terminal open.
        assert_eq!(
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) },
            0
        );
    }
    // SAFETY: both descriptors were just opened and are owned by nothing else.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let home = tempfile::tempdir().unwrap();
    let mut command = gcp_sql(home.path());
    command
        .args(["-q", "-c", WARNS])
        .stdout(Stdio::null())
        .stderr(Stdio::from(slave));
    if let Some(value) = no_color {
        command.env("NO_COLOR", value);
    }
    let status = command.status().unwrap();
    drop(command);
    assert!(status.success());
    // The tool has exited: all it wrote is buffered in the terminal. Read without blocking
    // until nothing is left (EAGAIN, or EIO once no slave side is open).
    // SAFETY: sets a status flag of the master descriptor this function owns.
    let flags = unsafe { libc::fcntl(master.as_raw_fd(), libc::F_GETFL) };
    assert!(flags >= 0);
    // SAFETY: as above.
    assert_eq!(
        unsafe { libc::fcntl(master.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) },
        0
    );
    let mut master = std::fs::File::from(master);
    let mut written = Vec::new();
    let mut chunk = [0u8; 4096];
    while let Ok(n) = master.read(&mut chunk) {
        if n == 0 {
            break;
        }
        written.extend_from_slice(&chunk[..n]);
    }
    text(&written)
}

#[test]
fn logs_on_a_terminal_are_coloured_unless_no_color_is_set() {
    let coloured = stderr_on_a_terminal(None);
    assert!(coloured.contains("max_in_flight_entries"), "{coloured:?}");
    assert!(coloured.contains("\x1b["), "{coloured:?}");
    let plain = stderr_on_a_terminal(Some("1"));
    assert!(plain.contains("max_in_flight_entries"), "{plain:?}");
    assert!(!plain.contains("\x1b["), "{plain:?}");
    // An empty NO_COLOR does not count.
    assert!(stderr_on_a_terminal(Some("")).contains("\x1b["));
}
