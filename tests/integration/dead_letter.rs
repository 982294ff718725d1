//! `failure_policy = 'dead_letter'` on each sink: the good rows land, every bad row is in the
//! dead-letter topic or file (read back with an independent client, its fields checked), and
//! the statement's count, the metrics and the dead letters agree. Then the destinations that
//! cannot take a row: a missing topic, an unwritable folder, a store the session lacks. Each
//! fails the statement, reporting the counts.
//!
//! | sink | bad rows | service | dead letters |
//! |---|---|---|---|
//! | Pub/Sub | attribute over 1024 bytes (encoder) | emulator | topic, pulled |
//! | Cloud Tasks | 200 kB body (encoder) | emulator | file |
//! | Cloud Tasks | `INVALID_ARGUMENT` on one task (service) | fake | file |
//! | Bigtable | null row key (encoder) | emulator | file |
//! | Bigtable | `INVALID_ARGUMENT` on one entry in a batch (service, isolated) | fake | file |
//! | Bigtable (the `gcp-sql` binary) | `INVALID_ARGUMENT` on one entry | fake | topic, pulled |
//!
//! The emulators cannot refuse a record the encoder let through, so the service rejections
//! come from the scripted fakes.
//!
//! Run: `cargo test --test integration dead_letter::`.

use std::collections::HashMap;
use std::path::Path;

use gcp_sql::core::metrics::names;
use serde_json::Value;
use tonic::Code;

use crate::bigtable_sink::{FAKE_TABLE, FakeBigtable, insert_on_fake};
use crate::cloud_tasks_sink::{FakeTasks, TasksAdmin, create_table, insert_rows, request_id};
use crate::support::bigtable::Bigtable;
use crate::support::{PubSubAdmin, exec, ids, insert};

/// Every NDJSON line of every file in `dir`, parsed, with the files' names.
pub(crate) fn dead_letter_lines(dir: &Path) -> (Vec<String>, Vec<serde_json::Map<String, Value>>) {
    let mut names = Vec::new();
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read the dead-letter folder") {
        let path = entry.expect("an entry").path();
        names.push(path.file_name().unwrap().to_string_lossy().into_owned());
        let text = std::fs::read_to_string(&path).expect("read a dead-letter file");
        for line in text.lines() {
            match serde_json::from_str::<Value>(line).expect("a JSON line") {
                Value::Object(object) => lines.push(object),
                other => panic!("not an object: {other}"),
            }
        }
    }
    names.sort();
    (names, lines)
}

fn text<'a>(object: &'a serde_json::Map<String, Value>, field: &str) -> &'a str {
    object
        .get(field)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no text field '{field}' in {object:?}"))
}

fn file_url(dir: &Path) -> String {
    format!("file://{}", dir.display())
}

/// `(acknowledged, not delivered)` as a failed statement's error prints them.
fn counts(error: &str) -> (u64, u64) {
    let before = |marker: &str| -> u64 {
        let head = error
            .split(marker)
            .next()
            .filter(|_| error.contains(marker))
            .unwrap_or_else(|| panic!("no '{marker}' in the error: {error}"));
        head.rsplit([' ', '('])
            .next()
            .unwrap_or_default()
            .parse()
            .unwrap_or_else(|_| panic!("no count before '{marker}' in: {error}"))
    };
    (
        before(" row(s) were acknowledged before the failure"),
        before(" admitted row(s) were not delivered"),
    )
}

/// A timestamp attribute or field: RFC 3339, UTC.
fn assert_timestamp(value: &str) {
    let parsed = chrono::DateTime::parse_from_rfc3339(value)
        .unwrap_or_else(|e| panic!("'{value}' is not RFC 3339: {e}"));
    assert_eq!(parsed.offset().local_minus_utc(), 0, "{value}");
}

// --- Pub/Sub: a topic -------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubsub_rows_the_encoder_refuses_are_published_to_the_dead_letter_topic_with_why() {
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription) = admin.topic_with_subscription("dlq", "rows", false).await;
    let (dead_topic, dead_subscription) = admin.topic_with_subscription("dlq", "dead", false).await;
    let ctx = gcp_sql::sql::new_context();
    exec(
        &ctx,
        &format!(
            "CREATE TABLE oversize (id BIGINT, big VARCHAR) WITH (connector = 'pubsub', \
             emulator_host = '{}', topic = '{topic}', attribute_columns = 'big', \
             failure_policy = 'dead_letter', dead_letter_topic = '{dead_topic}')",
            admin.host
        ),
    )
    .await;
    // Every tenth row carries a 1025-byte attribute, one over the limit.
    let done = insert(
        &ctx,
        "INSERT INTO oversize SELECT value, \
           CASE WHEN value % 10 = 3 THEN repeat('x', 1025) ELSE repeat('y', 1024) END \
         FROM generate_series(1, 100)",
    )
    .await;
    assert_eq!(done.count(), 90);
    assert_eq!(done.metric(names::RECORDS_DEAD_LETTERED), 10);
    assert_eq!(done.metric(names::RECORDS_SKIPPED), 0);
    assert_eq!(done.metric(names::RECORDS_ACKED), 90);

    let good: Vec<i64> = (1..=100).filter(|v| v % 10 != 3).collect();
    let mut landed = ids(&admin.pull_all(&subscription, 90).await, "id");
    landed.sort_unstable();
    assert_eq!(landed, good);

    let dead = admin.pull_all(&dead_subscription, 10).await;
    let mut dead_ids = Vec::new();
    for message in &dead {
        let a = &message.attributes;
        assert_eq!(a.get("connector").map(String::as_str), Some("pubsub"));
        assert_eq!(a.get("table").map(String::as_str), Some("oversize"));
        assert_eq!(a.get("error_class").map(String::as_str), Some("encoding"));
        assert_eq!(a.get("attempts").map(String::as_str), Some("0"));
        // Never sent: no status, no destination.
        assert!(!a.contains_key("status_code"), "{a:?}");
        let why = a.get("error_message").expect("an error message");
        assert!(why.contains("1025") && why.contains("'big'"), "{why}");
        assert_timestamp(a.get("timestamp").expect("a timestamp"));
        // The data is the source row as JSON.
        let row: Value = serde_json::from_slice(&message.data).expect("JSON data");
        assert_eq!(row["big"].as_str().map(str::len), Some(1025));
        dead_ids.push(row["id"].as_i64().expect("an id"));
    }
    dead_ids.sort_unstable();
    assert_eq!(
        dead_ids,
        (1..=100).filter(|v| v % 10 == 3).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_dead_letter_topic_fails_the_statement_reporting_the_counts() {
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription) = admin.topic_with_subscription("dlq", "nodlq", false).await;
    let missing = format!("projects/dlq/topics/{}", crate::support::unique("missing"));
    let ctx = gcp_sql::sql::new_context();
    exec(
        &ctx,
        &format!(
            "CREATE TABLE oversize (id BIGINT, big VARCHAR) WITH (connector = 'pubsub', \
             emulator_host = '{}', topic = '{topic}', attribute_columns = 'big', \
             failure_policy = 'dead_letter', dead_letter_topic = '{missing}', \
             sink_parallelism = 1, batch_element_count_threshold = 1)",
            admin.host
        ),
    )
    .await;
    // Rows 1 and 2 are good; row 3 is refused by the encoder and has nowhere to go.
    let done = insert(
        &ctx,
        "INSERT INTO oversize SELECT value, \
           CASE WHEN value = 3 THEN repeat('x', 1025) ELSE 'y' END \
         FROM generate_series(1, 10)",
    )
    .await;
    let error = done.error();
    assert!(
        error.contains(&format!("dead_letter_topic '{missing}'")),
        "{error}"
    );
    assert!(error.contains("does not exist"), "{error}");
    assert!(error.contains("NOT_FOUND"), "{error}");
    let (acknowledged, not_delivered) = counts(error);
    // The two rows before the bad one landed or are reported, and so is the bad one, which
    // is neither delivered nor dead-lettered.
    assert_eq!(acknowledged + not_delivered, 3, "{error}");
    assert!(acknowledged <= 2, "{error}");
    assert_eq!(done.metric(names::RECORDS_DEAD_LETTERED), 0);
    let landed = ids(
        &admin.pull_all(&subscription, acknowledged as usize).await,
        "id",
    );
    assert_eq!(landed.len() as u64, acknowledged);
    assert!(
        !admin.topic_exists(&missing).await,
        "a dead-letter topic is never created"
    );
}

// --- Cloud Tasks: a file ----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_task_goes_to_the_dead_letter_file_and_the_others_are_created() {
    let admin = TasksAdmin::connect().await;
    let queue = admin.paused_queue("ct-dlq", "big").await;
    let dir = tempfile::tempdir().unwrap();
    let ctx = gcp_sql::sql::new_context();
    let path = file_url(dir.path());
    exec(
        &ctx,
        &create_table(
            "big",
            "body VARCHAR, task VARCHAR",
            &admin.host,
            &[
                ("queue", &queue),
                ("url", "http://127.0.0.1:9/big"),
                ("body_column", "body"),
                ("task_name_column", "task"),
                ("failure_policy", "dead_letter"),
                ("dead_letter_path", &path),
            ],
        ),
    )
    .await;
    let done = insert(
        &ctx,
        "INSERT INTO big SELECT CASE WHEN value = 3 THEN repeat('x', 200000) \
           ELSE concat('b', value) END, concat('t', value) FROM generate_series(1, 10)",
    )
    .await;
    assert_eq!(done.count(), 9);
    assert_eq!(done.metric(names::RECORDS_DEAD_LETTERED), 1);
    assert_eq!(done.metric(names::RECORDS_SENT), 9);
    let mut created: Vec<String> = admin
        .list_tasks(&queue)
        .await
        .into_iter()
        .map(|t| t.name)
        .collect();
    created.sort();
    let mut expected: Vec<String> = (1..=10)
        .filter(|i| *i != 3)
        .map(|i| format!("{queue}/tasks/t{i}"))
        .collect();
    expected.sort();
    assert_eq!(created, expected);

    let (files, lines) = dead_letter_lines(dir.path());
    assert_eq!(lines.len(), 1, "{files:?}");
    assert!(files.iter().all(|f| f.ends_with(".ndjson")), "{files:?}");
    let line = &lines[0];
    assert_eq!(text(line, "connector"), "cloud_tasks");
    assert_eq!(text(line, "table"), "big");
    assert_eq!(text(line, "error_class"), "encoding");
    assert_eq!(text(line, "attempts"), "0");
    assert!(text(line, "error_message").contains("'body'"), "{line:?}");
    assert_timestamp(text(line, "timestamp"));
    assert_eq!(line["row"]["task"], "t3");
    assert_eq!(line["row"]["body"].as_str().map(str::len), Some(200000));
}

#[tokio::test]
async fn a_task_the_service_refuses_goes_to_the_dead_letter_file_with_its_status() {
    let fake = FakeTasks::start(|request| {
        (request_id(request) == 4)
            .then(|| gcp_sql::testing::Reply::Status(Code::InvalidArgument, "bad task".into()))
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = file_url(dir.path());
    let done = insert_rows(
        &fake,
        10,
        false,
        &[
            ("failure_policy", "dead_letter"),
            ("dead_letter_path", &path),
        ],
    )
    .await;
    assert_eq!(done.count(), 9);
    assert_eq!(done.metric(names::RECORDS_REJECTED), 1);
    assert_eq!(done.metric(names::RECORDS_DEAD_LETTERED), 1);
    assert_eq!(done.metric(names::RECORDS_DROPPED), 0);
    let expected: Vec<i64> = (1..=10).filter(|i| *i != 4).collect();
    assert_eq!(fake.accepted_ids(), expected);

    let (_, lines) = dead_letter_lines(dir.path());
    assert_eq!(lines.len(), 1);
    let line = &lines[0];
    assert_eq!(text(line, "error_class"), "rejected");
    assert_eq!(text(line, "status_code"), "INVALID_ARGUMENT");
    assert_eq!(text(line, "error_message"), "bad task");
    assert_eq!(text(line, "attempts"), "1");
    assert!(
        text(line, "destination").ends_with("/queues/jobs"),
        "{line:?}"
    );
    // The payload is the task's body; the rest of the task is the row.
    let body: Value = serde_json::from_str(text(line, "payload")).expect("a JSON body");
    assert_eq!(body["id"], 4);
    assert_eq!(line["row"]["url"], "https://worker.example.com/run");
    assert_eq!(line["row"]["http_method"], "POST");
}

// --- Bigtable: a file -------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_with_a_null_row_key_go_to_the_dead_letter_file_and_the_others_are_written() {
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("dlq");
    bt.create_table(&table, &["cf"]).await;
    let dir = tempfile::tempdir().unwrap();
    let path = file_url(&dir.path().join("nested/folder"));
    let ctx = gcp_sql::sql::new_context();
    exec(
        &ctx,
        &bt.create_sql(
            "users",
            "id VARCHAR, v BIGINT",
            &table,
            &[
                ("row_key", "id"),
                ("failure_policy", "dead_letter"),
                ("dead_letter_path", &path),
            ],
        ),
    )
    .await;
    let done = insert(
        &ctx,
        "INSERT INTO users SELECT CASE WHEN value % 5 = 0 THEN NULL \
           ELSE concat('k', value) END, value FROM generate_series(1, 20)",
    )
    .await;
    assert_eq!(done.count(), 16);
    assert_eq!(done.metric(names::RECORDS_DEAD_LETTERED), 4);
    let rows = bt.read(&table).await;
    let mut keys: Vec<String> = rows
        .keys()
        .map(|k| String::from_utf8(k.clone()).unwrap())
        .collect();
    keys.sort();
    let mut expected: Vec<String> = (1..=20)
        .filter(|v| v % 5 != 0)
        .map(|v| format!("k{v}"))
        .collect();
    expected.sort();
    assert_eq!(keys, expected);

    let (files, lines) = dead_letter_lines(&dir.path().join("nested/folder"));
    assert!(!files.is_empty());
    let mut dead: Vec<i64> = lines
        .iter()
        .map(|line| {
            assert_eq!(text(line, "connector"), "bigtable");
            assert_eq!(text(line, "table"), "users");
            assert_eq!(text(line, "error_class"), "encoding");
            assert!(
                text(line, "error_message").contains("'id' is null"),
                "{line:?}"
            );
            assert!(line["row"]["id"].is_null(), "{line:?}");
            line["row"]["v"].as_i64().expect("v")
        })
        .collect();
    dead.sort_unstable();
    assert_eq!(dead, vec![5, 10, 15, 20]);
}

#[tokio::test]
async fn an_entry_the_service_refuses_in_a_batch_is_isolated_then_dead_lettered() {
    let fake = FakeBigtable::start(|key| {
        if key == b"k5" {
            Code::InvalidArgument
        } else {
            Code::Ok
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = file_url(dir.path());
    let done = insert_on_fake(
        &fake,
        10,
        &[
            ("failure_policy", "dead_letter"),
            ("dead_letter_path", &path),
        ],
        None,
    )
    .await;
    assert_eq!(done.count(), 9);
    assert_eq!(done.metric(names::RECORDS_REJECTED), 1);
    assert_eq!(done.metric(names::RECORDS_DEAD_LETTERED), 1);
    // The batch, then k5 alone to confirm the refusal.
    assert_eq!(fake.requests().len(), 2);
    assert_eq!(fake.requests()[1], vec!["k5".to_string()]);

    let (files, lines) = dead_letter_lines(dir.path());
    assert_eq!(files.len(), 1);
    assert!(files[0].ends_with("-w0-000000.ndjson"), "{files:?}");
    assert_eq!(lines.len(), 1);
    let line = &lines[0];
    assert_eq!(text(line, "connector"), "bigtable");
    assert_eq!(text(line, "destination"), FAKE_TABLE);
    assert_eq!(text(line, "error_class"), "rejected");
    assert_eq!(text(line, "status_code"), "INVALID_ARGUMENT");
    // The transport names the row (not its key) before the service's message.
    assert_eq!(
        text(line, "error_message"),
        "row 4 (row key of 2 bytes): scripted InvalidArgument"
    );
    assert_eq!(text(line, "attempts"), "1");
    // No payload: the row is the entry, its key and its cells.
    assert!(!line.contains_key("payload"), "{line:?}");
    assert_eq!(line["row"]["row_key"], "k5");
    let cells: HashMap<String, Value> = line["row"]["mutations"]
        .as_array()
        .expect("mutations")
        .iter()
        .filter_map(|m| m.get("set_cell"))
        .map(|c| {
            (
                c["qualifier"].as_str().unwrap().to_string(),
                c["value"].clone(),
            )
        })
        .collect();
    assert!(cells.contains_key("v"), "{line:?}");
}

// --- a destination that cannot take the rows ----------------------------------------------------

#[tokio::test]
async fn an_unwritable_dead_letter_folder_fails_the_statement_reporting_the_counts() {
    let fake = FakeBigtable::start(|key| {
        if key == b"k5" {
            Code::InvalidArgument
        } else {
            Code::Ok
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    // A regular file where the folder should be: nothing can be created under it.
    let file = dir.path().join("not-a-folder");
    std::fs::write(&file, "x").unwrap();
    let path = file_url(&file.join("dead"));
    let done = insert_on_fake(
        &fake,
        10,
        &[
            ("failure_policy", "dead_letter"),
            ("dead_letter_path", &path),
        ],
        None,
    )
    .await;
    let error = done.error();
    assert!(error.contains("dead_letter_path"), "{error}");
    assert!(
        error.contains("cannot write to the dead-letter destination"),
        "{error}"
    );
    // The nine good entries were applied; k5 is neither delivered nor dead-lettered: it is
    // reported as not delivered.
    assert_eq!(counts(error), (9, 1), "{error}");
    assert_eq!(done.metric(names::RECORDS_DEAD_LETTERED), 0);
    assert!(!error.contains("dead-lettered"), "{error}");
}

#[tokio::test]
async fn a_dead_letter_store_the_session_lacks_fails_before_anything_is_sent() {
    let fake = FakeBigtable::start(|_| Code::Ok).await;
    let done = insert_on_fake(
        &fake,
        10,
        &[
            ("failure_policy", "dead_letter"),
            ("dead_letter_path", "s3://no-such-store/dead"),
        ],
        None,
    )
    .await;
    let error = done.error();
    assert!(
        error.contains("dead_letter_path 's3://no-such-store/dead'"),
        "{error}"
    );
    assert!(error.contains("no object store is registered"), "{error}");
    assert_eq!(counts(error), (0, 0), "{error}");
    assert!(fake.requests().is_empty());
}

// --- a service rejection to a topic, from a sink of another service ------------------------------

/// The `gcp-sql` binary (a child process, so that `PUBSUB_EMULATOR_HOST` can be set for it
/// alone) writes to the fake Bigtable, which refuses one entry; the sink publishes it to a
/// dead-letter topic on the Pub/Sub emulator.
#[cfg(feature = "cli")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_bigtable_entry_is_published_to_the_dead_letter_topic_with_its_status() {
    let fake = FakeBigtable::start(|key| {
        if key == b"k5" {
            Code::InvalidArgument
        } else {
            Code::Ok
        }
    })
    .await;
    let admin = PubSubAdmin::connect().await;
    let (dead_topic, dead_subscription) =
        admin.topic_with_subscription("dlq", "refused", false).await;
    let home = tempfile::tempdir().unwrap();
    let create = format!(
        "CREATE TABLE t (id VARCHAR, v BIGINT) WITH (connector = 'bigtable', \
         emulator_host = '{}', table = '{FAKE_TABLE}', row_key = 'id', sink_parallelism = 1, \
         failure_policy = 'dead_letter', dead_letter_topic = '{dead_topic}')",
        fake.host()
    );
    let insert = "INSERT INTO t SELECT concat('k', CAST(value AS VARCHAR)), value \
                  FROM generate_series(1, 10)";
    let mut command = crate::support::tool(home.path());
    command
        .env("PUBSUB_EMULATOR_HOST", &admin.host)
        .args(["-c", &create, "-c", insert]);
    let output = tokio::task::spawn_blocking(move || crate::support::output(&mut command))
        .await
        .unwrap();
    let stderr = crate::support::text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("Sink: 9 row(s) acknowledged"), "{stderr}");
    assert!(stderr.contains("; 1 dead-lettered"), "{stderr}");
    // The batch, then k5 alone.
    assert_eq!(fake.requests().last().unwrap(), &vec!["k5".to_string()]);

    let dead = admin.pull_all(&dead_subscription, 1).await;
    assert_eq!(dead.len(), 1);
    let a = &dead[0].attributes;
    assert_eq!(a.get("connector").map(String::as_str), Some("bigtable"));
    assert_eq!(a.get("destination").map(String::as_str), Some(FAKE_TABLE));
    assert_eq!(a.get("table").map(String::as_str), Some("t"));
    assert_eq!(a.get("error_class").map(String::as_str), Some("rejected"));
    assert_eq!(
        a.get("status_code").map(String::as_str),
        Some("INVALID_ARGUMENT")
    );
    assert_eq!(a.get("attempts").map(String::as_str), Some("1"));
    assert_timestamp(a.get("timestamp").expect("a timestamp"));
    // No payload in a Bigtable entry: the data is the entry as JSON.
    let row: Value = serde_json::from_slice(&dead[0].data).expect("JSON data");
    assert_eq!(row["row_key"], "k5");
    assert!(
        row["mutations"].as_array().is_some_and(|m| !m.is_empty()),
        "{row}"
    );
}
