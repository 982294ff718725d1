//! Cloud Tasks bodies in `format = 'avro'` and `format = 'protobuf'`, against the real
//! `gcloud-tasks-emulator`.
//!
//! A table is declared in SQL with the schema options, rows are written with `INSERT INTO ...
//! SELECT`, the tasks are listed back from the paused queue, and then the queue is resumed so
//! that the emulator dispatches every task to a local HTTP listener. The bodies the listener
//! received are decoded by independent libraries (Python `fastavro` and `google.protobuf`,
//! through the Pub/Sub schema tests' checks, which compare them with the values inserted:
//! timestamps, decimals, nulls, nested structs and lists) and the `Content-Type` each request
//! carried is compared with the one of its encoding (ADR 0061). The row the schema refuses goes
//! to the dead-letter folder (or is dropped) with the field named.
//!
//! Run: `cargo test --test integration cloud_tasks_schema::`.

use std::sync::Arc;

use datafusion::datasource::MemTable;
use gcloud_sdk::google::pubsub::v1::PubsubMessage;
use gcp_sql::core::metrics::names;

use crate::cloud_tasks_sink::{HttpTarget, Received, TasksAdmin, create_table, http_request};
use crate::dead_letter::dead_letter_lines;
use crate::pubsub_schema::{
    AVRO_SCHEMA, PROTO_SCHEMA, check_avro, check_proto, context_with_the_schema_in_a_store, rows,
    table_schema,
};
use crate::support::{exec, insert};

/// The columns of `pubsub_schema::table_schema`, in SQL.
fn columns(with_count: bool) -> String {
    let mut columns = "id BIGINT NOT NULL, ts TIMESTAMP, amount DECIMAL(10, 2), note VARCHAR, \
                       address STRUCT<city VARCHAR, zip BIGINT>, tags VARCHAR[]"
        .to_string();
    if with_count {
        columns.push_str(", count BIGINT");
    }
    columns
}

/// What a run left: the requests the listener received, and the reason of each dead letter.
struct Landed {
    received: Vec<Received>,
    dead_reasons: Vec<String>,
}

impl Landed {
    /// The bodies as messages, and the dead-letter reasons as `error_message` attributes: the
    /// shape the Pub/Sub schema checks read.
    fn as_messages(&self) -> (Vec<PubsubMessage>, Vec<PubsubMessage>) {
        let bodies = self
            .received
            .iter()
            .map(|r| PubsubMessage {
                data: r.body.clone(),
                ..Default::default()
            })
            .collect();
        let dead = self
            .dead_reasons
            .iter()
            .map(|why| PubsubMessage {
                attributes: [("error_message".to_string(), why.clone())].into(),
                ..Default::default()
            })
            .collect();
        (bodies, dead)
    }

    /// Every request carried `content_type`.
    fn assert_content_type(&self, content_type: &str) {
        for r in &self.received {
            assert_eq!(r.method, "POST");
            assert_eq!(
                r.headers.get("content-type").map(String::as_str),
                Some(content_type),
                "{:?}",
                r.headers
            );
        }
    }
}

/// Declares `orders` on a paused queue with `format_options` and `failure_policy =
/// 'dead_letter'` (a local folder), inserts the four rows of `pubsub_schema::rows` (the fourth
/// breaks the schema), checks the counts and the tasks listed back, resumes the queue, checks
/// that every request the listener received carried `content_type`, and returns the bodies and
/// the dead letters in the shape of the Pub/Sub schema checks.
async fn insert_orders(
    prefix: &str,
    format_options: &[(&str, &str)],
    with_count: bool,
    content_type: &str,
) -> (Vec<PubsubMessage>, Vec<PubsubMessage>) {
    let admin = TasksAdmin::connect().await;
    let queue = admin.paused_queue("ct-schema", prefix).await;
    let target = HttpTarget::start().await;
    let dir = tempfile::tempdir().unwrap();
    let dead_path = format!("file://{}", dir.path().display());
    let ctx = context_with_the_schema_in_a_store().await;
    let url = target.url("/orders");
    let mut options = vec![
        ("queue", queue.as_str()),
        ("url", url.as_str()),
        ("failure_policy", "dead_letter"),
        ("dead_letter_path", dead_path.as_str()),
    ];
    options.extend_from_slice(format_options);
    exec(
        &ctx,
        &create_table("orders", &columns(with_count), &admin.host, &options),
    )
    .await;
    let schema = table_schema(with_count);
    let source = MemTable::try_new(schema.clone(), vec![vec![rows(&schema, with_count)]]).unwrap();
    ctx.register_table("src", Arc::new(source)).unwrap();
    let done = insert(&ctx, "INSERT INTO orders SELECT * FROM src").await;
    assert_eq!(done.count(), 3, "three rows fit the schema");
    assert_eq!(done.metric(names::RECORDS_DEAD_LETTERED), 1);
    assert_eq!(done.metric(names::RECORDS_SENT), 3);

    // Listed back while the queue is paused: three tasks, whose stored Content-Type is the one
    // the listener must see.
    let tasks = admin.list_tasks(&queue).await;
    assert_eq!(tasks.len(), 3);
    let stored: Vec<_> = tasks
        .iter()
        .map(|t| http_request(t).headers.get("Content-Type").cloned())
        .collect();

    admin.resume(&queue).await;
    let received = target.wait_for(3).await;
    assert_eq!(received.len(), 3, "each task dispatched once");
    for (r, stored) in received.iter().zip(&stored) {
        assert_eq!(r.headers.get("content-type"), stored.as_ref());
    }

    let (_, lines) = dead_letter_lines(dir.path());
    assert_eq!(lines.len(), 1);
    let line = &lines[0];
    assert_eq!(line["connector"], "cloud_tasks");
    assert_eq!(line["error_class"], "encoding");
    assert_eq!(line["row"]["id"], 4, "{line:?}");
    let why = line["error_message"]
        .as_str()
        .expect("a reason")
        .to_string();
    assert!(
        !why.contains("1099511627776"),
        "the reason shows no value: {why}"
    );
    let landed = Landed {
        received,
        dead_reasons: vec![why],
    };
    landed.assert_content_type(content_type);
    landed.as_messages()
}

/// The table options of each run: the format and where its schema is.
const AVRO_INLINE: &[(&str, &str)] = &[("format", "avro"), ("schema", AVRO_SCHEMA)];
const AVRO_JSON_IN_A_STORE: &[(&str, &str)] = &[
    ("format", "avro"),
    ("schema_location", "memory://schemas/order.avsc"),
    ("schema_encoding", "json"),
];
const PROTO_JSON: &[(&str, &str)] = &[
    ("format", "protobuf"),
    ("schema", PROTO_SCHEMA),
    ("schema_encoding", "json"),
];
const PROTO_BINARY: &[(&str, &str)] = &[("format", "protobuf"), ("schema", PROTO_SCHEMA)];

// In the Avro runs the fourth row's null note breaks the schema's plain `string`; in the
// Protobuf runs its count is past `int32`. The checks find that field named in the dead letter.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn format_avro_bodies_are_bare_datums_that_fastavro_reads_back() {
    let landed = insert_orders("avro", AVRO_INLINE, false, "application/octet-stream");
    check_avro(landed.await, "binary");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn format_avro_json_with_a_schema_in_an_object_store_reads_it_when_the_statement_starts() {
    let landed = insert_orders(
        "avro-store",
        AVRO_JSON_IN_A_STORE,
        false,
        "application/json",
    );
    check_avro(landed.await, "json");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn format_protobuf_with_json_encoding_gives_proto3_json_that_google_protobuf_parses() {
    check_proto(
        insert_orders("proto-json", PROTO_JSON, true, "application/json").await,
        "json",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn format_protobuf_binary_gives_the_wire_format_that_google_protobuf_parses() {
    let landed = insert_orders("proto-bin", PROTO_BINARY, true, "application/protobuf");
    check_proto(landed.await, "binary");
}

/// A protobuf job table that skips the rows its schema refuses, with a Content-Type of its own.
const DROP_OPTIONS: &[(&str, &str)] = &[
    ("url", "http://127.0.0.1:9/jobs"),
    ("format", "protobuf"),
    (
        "schema",
        "syntax = \"proto3\"; message Job { int64 id = 1; int32 n = 2; }",
    ),
    ("failure_policy", "drop"),
    ("headers", "Content-Type: application/x-protobuf"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_the_schema_refuses_is_dropped_and_counted_under_the_drop_policy() {
    let admin = TasksAdmin::connect().await;
    let queue = admin.paused_queue("ct-schema", "drop").await;
    let ctx = gcp_sql::sql::new_context();
    let options = [&[("queue", queue.as_str())][..], DROP_OPTIONS].concat();
    let ddl = create_table(
        "jobs",
        "id BIGINT NOT NULL, n BIGINT",
        &admin.host,
        &options,
    );
    exec(&ctx, &ddl).await;
    let values = "(1, 10), (2, 3000000000), (3, NULL), (4, -2147483648)";
    let done = insert(&ctx, &format!("INSERT INTO jobs VALUES {values}")).await;
    assert_eq!((done.count(), done.metric(names::RECORDS_SKIPPED)), (3, 1));
    let tasks = admin.list_tasks(&queue).await;
    let mut bodies: Vec<Vec<u8>> = tasks.iter().map(|t| http_request(t).body.clone()).collect();
    bodies.sort();
    // Field 1 (id) and field 2 (n) as varints; a NULL n is absent, int32 -2^31 is ten bytes.
    let min_int32 = [0x80, 0x80, 0x80, 0x80, 0xf8, 0xff, 0xff, 0xff, 0xff, 0x01];
    let mut expected = vec![
        vec![0x08, 0x01, 0x10, 0x0a],
        vec![0x08, 0x03],
        [&[0x08, 0x04, 0x10][..], &min_int32].concat(),
    ];
    expected.sort();
    assert_eq!(bodies, expected);
    for t in &tasks {
        // The explicit Content-Type wins over the encoding's.
        let content_type = http_request(t).headers.get("Content-Type").cloned();
        assert_eq!(content_type.as_deref(), Some("application/x-protobuf"));
    }
}

/// Declares `bad` with `options` and returns the error; the table must be refused.
async fn refused(columns: &str, options: &[(&str, &str)]) -> String {
    let ctx = gcp_sql::sql::new_context();
    let mut all = vec![
        ("queue", "projects/p/locations/l/queues/q"),
        ("url", "http://127.0.0.1:9/x"),
    ];
    all.extend_from_slice(options);
    let sql = create_table("bad", columns, "127.0.0.1:9", &all);
    match gcp_sql::sql::run(&ctx, &sql).await {
        Ok(_) => panic!("declared, but {options:?} should be refused"),
        Err(e) => e.to_string(),
    }
}

/// A table's option pairs.
type Options = Vec<(&'static str, &'static str)>;

const AVRO_ID_N: &str = r#"{"type":"record","name":"R","fields":[{"name":"id","type":"long"},{"name":"n","type":"int"}]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_declarations_name_the_options_or_the_column_the_field_and_both_types() {
    let avro = [("format", "avro"), ("schema", AVRO_ID_N)];
    let with = |extra: (&'static str, &'static str)| [&avro[..], &[extra]].concat();
    // (columns, options, what the error names)
    let cases: Vec<(&str, Options, &[&str])> = vec![
        // A column the schema lacks.
        (
            "id BIGINT, n BIGINT, extra VARCHAR",
            avro.to_vec(),
            &["'extra'"],
        ),
        // A required field with no column.
        ("id BIGINT", avro.to_vec(), &["'n'"]),
        // A type that does not convert: the column, the field and both types.
        (
            "id VARCHAR, n BIGINT",
            avro.to_vec(),
            &["'id'", "Utf8", "long"],
        ),
        // The body comes from a column, or there is no body: the schema would encode nothing.
        (
            "id BIGINT, n BIGINT, b VARCHAR",
            with(("body_column", "b")),
            &["body_column", "format 'avro'"],
        ),
        (
            "id BIGINT, n BIGINT",
            with(("http_method", "GET")),
            &["http_method", "format 'avro'"],
        ),
        // A schema option with a format that takes none, and a schema format without a schema.
        (
            "b VARCHAR",
            vec![("format", "raw"), ("schema", AVRO_ID_N)],
            &["schema", "format is 'raw'"],
        ),
        (
            "id BIGINT",
            vec![("format", "protobuf")],
            &["'schema'", "'schema_location'"],
        ),
    ];
    for (columns, options, parts) in cases {
        let e = refused(columns, &options).await;
        assert!(parts.iter().all(|p| e.contains(p)), "{options:?}: {e}");
    }
    // An object-store schema that is not there fails the first statement, naming the option.
    let admin = TasksAdmin::connect().await;
    let queue = admin.paused_queue("ct-schema", "missing").await;
    let missing = [
        ("queue", queue.as_str()),
        ("url", "http://127.0.0.1:9/x"),
        ("format", "avro"),
        ("schema_location", "memory://nowhere/none.avsc"),
    ];
    let ctx = gcp_sql::sql::new_context();
    exec(
        &ctx,
        &create_table("later", "id BIGINT", &admin.host, &missing),
    )
    .await;
    let done = insert(&ctx, "INSERT INTO later VALUES (1)").await;
    assert!(done.error().contains("schema_location"), "{}", done.error());
    assert!(admin.list_tasks(&queue).await.is_empty());
}
