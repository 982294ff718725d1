//! The Pub/Sub source decoding `format = 'avro'` and `'protobuf'`, against the real emulator:
//! Avro datums written by an independent library (Python `fastavro`) into a topic with an Avro
//! schema, read with no `format` option (the source reads the topic's schema); the sink's own
//! Avro and Protobuf messages read back by the source to the values inserted (timestamps,
//! decimals, nulls, nested structs, lists); a message that is not a datum of the schema.
//!
//! Run: `cargo test --test integration pubsub_source_schema::`.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use base64::Engine as _;
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use gcloud_sdk::google::pubsub::v1::publisher_client::PublisherClient;
use gcloud_sdk::google::pubsub::v1::schema_service_client::SchemaServiceClient;
use gcloud_sdk::google::pubsub::v1::{
    CommitSchemaRequest, Encoding, GetSchemaRequest, PublishRequest, PubsubMessage,
    Schema as PubSubSchema, SchemaSettings, SchemaView, Topic, UpdateTopicRequest, schema,
};
use gcp_sql::connectors::pubsub::source::PubSubSourceTable;
use gcp_sql::connectors::pubsub::source::options::PubSubSourceOptions;
use gcp_sql::options::RawOptions;
use serde_json::{Value, json};

use crate::pubsub_schema::{
    AVRO_SCHEMA, PROTO_SCHEMA, decode_with_python, rows, schema_topic, table_schema,
};
use crate::support::{PubSubAdmin, insert, register_pubsub_table};

/// The independent publisher: `fastavro.schemaless_writer` writes each JSON record (a base64
/// line of stdin) as one bare datum of the schema (argv[1]); out, one JSON string per record:
/// the datum in base64.
const FASTAVRO_WRITER: &str = r#"
import base64, datetime, decimal, io, json, sys
import fastavro
schema = fastavro.parse_schema(json.loads(sys.argv[1]))
for line in sys.stdin:
    r = json.loads(base64.b64decode(line))
    if r.get("ts") is not None:
        r["ts"] = datetime.datetime.fromisoformat(r["ts"])
    r["amount"] = decimal.Decimal(r["amount"])
    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema, r)
    print(json.dumps(base64.b64encode(out.getvalue()).decode()))
"#;

/// `records` written by fastavro as bare datums of `AVRO_SCHEMA`.
fn fastavro_datums(records: &[Value]) -> Vec<Vec<u8>> {
    fastavro_datums_of(AVRO_SCHEMA, records)
}

/// `records` written by fastavro as bare datums of the Avro schema `definition`.
fn fastavro_datums_of(definition: &str, records: &[Value]) -> Vec<Vec<u8>> {
    let input: Vec<PubsubMessage> = records
        .iter()
        .map(|r| PubsubMessage {
            data: r.to_string().into_bytes(),
            ..Default::default()
        })
        .collect();
    decode_with_python(FASTAVRO_WRITER, &[definition], &input)
        .iter()
        .map(|datum| {
            base64::engine::general_purpose::STANDARD
                .decode(datum.as_str().expect("a base64 string"))
                .expect("base64")
        })
        .collect()
}

async fn publish(host: &str, topic: &str, datas: Vec<Vec<u8>>) -> Vec<String> {
    let channel = gcp_sql::emulators::plaintext_channel(host)
        .await
        .expect("channel");
    PublisherClient::new(channel)
        .publish(PublishRequest {
            topic: topic.to_string(),
            messages: datas
                .into_iter()
                .map(|data| PubsubMessage {
                    data,
                    ..Default::default()
                })
                .collect(),
        })
        .await
        .expect("Publish")
        .into_inner()
        .message_ids
}

/// Declares the subscription as a source table from SQL-style options (no `format` unless
/// `options` gives one) and reads it with `SELECT *` until it is idle for 2 s.
async fn read(
    schema: SchemaRef,
    host: &str,
    subscription: &str,
    options: &[(&str, &str)],
) -> datafusion::error::Result<Vec<RecordBatch>> {
    let mut pairs = vec![
        ("emulator_host", host),
        ("stop_after_idle", "2s"),
        ("ack_deadline", "10s"),
    ];
    pairs.extend_from_slice(options);
    let raw = RawOptions::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
        .expect("options");
    let opts = PubSubSourceOptions::from_raw(Some(subscription), &raw).expect("source options");
    let table = Arc::new(PubSubSourceTable::try_new("orders_in", schema, opts).expect("table"));
    let ctx = SessionContext::new();
    ctx.register_table("orders_in", table.clone())?;
    let result = async { ctx.sql("SELECT * FROM orders_in").await?.collect().await }.await;
    drop(ctx);
    for handle in table.handles() {
        handle.settled().await;
    }
    result
}

/// Rows as JSON objects (Arrow's JSON writer; NULLs left out), sorted by `id`.
fn render(batches: &[RecordBatch]) -> Vec<Value> {
    let mut out = Vec::new();
    let mut writer = arrow::json::ArrayWriter::new(&mut out);
    for b in batches {
        writer.write(b).expect("JSON");
    }
    writer.finish().expect("JSON");
    drop(writer);
    let mut rows: Vec<Value> = if out.is_empty() {
        Vec::new()
    } else {
        serde_json::from_slice(&out).expect("JSON rows")
    };
    rows.sort_by_key(|r| r["id"].as_i64());
    rows
}

/// A topic with an Avro schema (BINARY) fed by fastavro, read through SQL with no `format`
/// option: the source looks the schema up through the subscription's topic. Timestamps,
/// decimals, nulls, a nested record and lists come out as fastavro wrote them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_avro_topic_fed_by_fastavro_is_read_with_the_topics_schema() {
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription, _, _) = schema_topic(
        &admin,
        "source-avro",
        schema::Type::Avro,
        AVRO_SCHEMA,
        Encoding::Binary,
    )
    .await;
    let datums = fastavro_datums(&[
        json!({"id": 10, "ts": "2024-05-06T07:08:09.123456+00:00", "amount": "12.34",
               "note": "x", "address": {"city": "Paris", "zip": 75001}, "tags": ["a", "b"]}),
        json!({"id": 11, "ts": null, "amount": "-0.05", "note": "",
               "address": null, "tags": []}),
        json!({"id": 12, "ts": "1969-12-31T23:59:59.999999+00:00", "amount": "99999999.99",
               "note": "z", "address": {"city": "", "zip": -1}, "tags": ["c"]}),
    ]);
    publish(&admin.host, &topic, datums).await;
    let batches = read(table_schema(false), &admin.host, &subscription, &[])
        .await
        .expect("SELECT over the Avro topic");
    assert_eq!(
        render(&batches),
        vec![
            json!({"id": 10, "ts": "2024-05-06T07:08:09.123456", "amount": 12.34, "note": "x",
                   "address": {"city": "Paris", "zip": 75001}, "tags": ["a", "b"]}),
            json!({"id": 11, "amount": -0.05, "note": "", "tags": []}),
            json!({"id": 12, "ts": "1969-12-31T23:59:59.999999", "amount": 99999999.99,
                   "note": "z", "address": {"city": "", "zip": -1}, "tags": ["c"]}),
        ]
    );
}

/// A subscription of `topic` for the source to read (the sink's own test subscription is left
/// alone).
async fn source_subscription(admin: &PubSubAdmin, topic: &str) -> String {
    let subscription = format!("{}-source", topic.replace("/topics/", "/subscriptions/"));
    admin.create_subscription(&subscription, topic, false).await;
    subscription
}

/// The sink inserts the rows of `pubsub_schema` into a topic with an Avro schema (no `format`
/// option, so the topic's schema and `encoding`), and the source, with no `format` option
/// either, reads back exactly the rows that were published (the fourth, a NULL in a required
/// field, was dead-lettered by the sink).
async fn avro_round_trip(encoding: Encoding) {
    let admin = PubSubAdmin::connect().await;
    let project = "source-avro-trip";
    let (topic, _, dead, _) =
        schema_topic(&admin, project, schema::Type::Avro, AVRO_SCHEMA, encoding).await;
    let subscription = source_subscription(&admin, &topic).await;
    let schema = table_schema(false);
    let inserted = rows(&schema, false);
    sink_insert(&admin.host, &topic, &dead, &schema, &inserted, &[]).await;
    let batches = read(schema, &admin.host, &subscription, &[])
        .await
        .expect("SELECT over the Avro topic");
    assert_eq!(render(&batches), render(&[inserted.slice(0, 3)]));
}

async fn sink_insert(
    host: &str,
    topic: &str,
    dead: &str,
    schema: &SchemaRef,
    batch: &RecordBatch,
    format: &[(&str, &str)],
) {
    let ctx = gcp_sql::sql::new_context();
    let mut options = vec![
        ("emulator_host", host),
        ("topic", topic),
        ("failure_policy", "dead_letter"),
        ("dead_letter_topic", dead),
    ];
    options.extend_from_slice(format);
    register_pubsub_table(&ctx, "orders", schema.clone(), &options);
    let source = MemTable::try_new(schema.clone(), vec![vec![batch.clone()]]).unwrap();
    ctx.register_table("src", Arc::new(source)).unwrap();
    let done = insert(&ctx, "INSERT INTO orders SELECT * FROM src").await;
    assert_eq!(done.count(), 3, "three rows fit the schema");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sinks_avro_binary_datums_read_back_to_the_inserted_rows() {
    avro_round_trip(Encoding::Binary).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sinks_avro_json_messages_read_back_to_the_inserted_rows() {
    avro_round_trip(Encoding::Json).await;
}

/// Protobuf with an inline schema (the emulator holds no Protobuf schema): the sink publishes
/// to a plain topic, the source with the same options reads back the inserted rows. proto3
/// cannot tell an unset `int32` from 0, so the NULL count of id 2 reads back as 0; the NULL
/// `ts` (a proto3 `string` read into a TIMESTAMP) reads back as NULL.
async fn protobuf_round_trip(encoding: &str) {
    let admin = PubSubAdmin::connect().await;
    let (topic, _) = admin
        .topic_with_subscription("source-proto", "plain", false)
        .await;
    let (dead, _) = admin
        .topic_with_subscription("source-proto", "dead", false)
        .await;
    let subscription = source_subscription(&admin, &topic).await;
    let schema = table_schema(true);
    let inserted = rows(&schema, true);
    let format = [
        ("format", "protobuf"),
        ("schema", PROTO_SCHEMA),
        ("schema_encoding", encoding),
    ];
    sink_insert(&admin.host, &topic, &dead, &schema, &inserted, &format).await;
    let batches = read(schema, &admin.host, &subscription, &format)
        .await
        .expect("SELECT over the Protobuf topic");
    let mut expected = render(&[inserted.slice(0, 3)]);
    expected[1]["count"] = json!(0);
    assert_eq!(render(&batches), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sinks_protobuf_wire_messages_read_back_to_the_inserted_rows() {
    protobuf_round_trip("binary").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sinks_proto3_json_messages_read_back_to_the_inserted_rows() {
    protobuf_round_trip("json").await;
}

/// A message that is not a datum of the schema, under `failure_policy = 'fail'` (the default):
/// the statement fails naming the message id and the format, never the data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_is_not_an_avro_datum_fails_the_statement_naming_it() {
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription) = admin
        .topic_with_subscription("source-avro-bad", "plain", false)
        .await;
    let mut datas = fastavro_datums(&[json!({"id": 1, "ts": null, "amount": "1.00",
        "note": "ok", "address": null, "tags": []})]);
    datas.push(b"\x02secret".to_vec());
    let ids = publish(&admin.host, &topic, datas).await;
    let err = read(
        table_schema(false),
        &admin.host,
        &subscription,
        &[("format", "avro"), ("schema", AVRO_SCHEMA)],
    )
    .await
    .expect_err("a message that is not a datum")
    .to_string();
    assert!(
        err.contains(&format!("message '{}'", ids[1]))
            && err.contains("format 'avro' (binary)")
            && !err.contains(&format!("message '{}'", ids[0]))
            && !err.contains("secret"),
        "{err}"
    );
}

/// Declaration errors of a source name the column, the field and both types.
#[test]
fn a_source_column_the_schema_cannot_fill_is_refused_naming_column_field_and_types() {
    let declare = |columns: &[(&str, arrow::datatypes::DataType)], schema: &str| {
        let table = Arc::new(arrow::datatypes::Schema::new(
            columns
                .iter()
                .map(|(n, t)| arrow::datatypes::Field::new(*n, t.clone(), true))
                .collect::<Vec<_>>(),
        ));
        let raw = RawOptions::from_pairs(
            [
                ("emulator_host", "localhost:1"),
                ("format", "avro"),
                ("schema", schema),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string())),
        )
        .unwrap();
        let opts = PubSubSourceOptions::from_raw(Some("projects/demo/subscriptions/orders"), &raw)
            .unwrap();
        PubSubSourceTable::try_new("t", table, opts)
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    use arrow::datatypes::DataType;
    let e = declare(&[("id", DataType::Utf8)], AVRO_SCHEMA);
    for part in ["'id'", "Utf8", "long", "read from the Avro schema"] {
        assert!(e.contains(part), "{part}: {e}");
    }
    let e = declare(&[("nope", DataType::Int64)], AVRO_SCHEMA);
    assert!(e.contains("'nope'") && e.contains("no field"), "{e}");
    // A field without a column is skipped when reading, required or not.
    let table = Arc::new(arrow::datatypes::Schema::new(vec![
        arrow::datatypes::Field::new("id", DataType::Int64, true),
    ]));
    let raw = RawOptions::from_pairs(
        [("format", "avro"), ("schema", AVRO_SCHEMA)]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string())),
    )
    .unwrap();
    let opts =
        PubSubSourceOptions::from_raw(Some("projects/demo/subscriptions/orders"), &raw).unwrap();
    PubSubSourceTable::try_new("t", table, opts).expect("a subset of the fields");
}

/// A source whose `schema_encoding` disagrees with the topic's encoding reads each message in
/// the encoding the emulator stamped on it (`googclient_schemaencoding`, pinned by
/// `pubsub_schema::the_emulator_stamps_the_schema_attributes_on_messages_to_a_schema_topic`):
/// the sink writes Avro JSON to a JSON topic and bare datums to a BINARY one, and a source
/// declared with the schema inline and the other encoding reads back the inserted rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stamped_encoding_wins_over_schema_encoding() {
    let admin = PubSubAdmin::connect().await;
    for (topic_encoding, declared) in [(Encoding::Json, "binary"), (Encoding::Binary, "json")] {
        let (topic, _, dead, _) = schema_topic(
            &admin,
            "source-stamped",
            schema::Type::Avro,
            AVRO_SCHEMA,
            topic_encoding,
        )
        .await;
        let subscription = source_subscription(&admin, &topic).await;
        let schema = table_schema(false);
        let inserted = rows(&schema, false);
        sink_insert(&admin.host, &topic, &dead, &schema, &inserted, &[]).await;
        let batches = read(
            schema,
            &admin.host,
            &subscription,
            &[
                ("format", "avro"),
                ("schema", AVRO_SCHEMA),
                ("schema_encoding", declared),
            ],
        )
        .await
        .unwrap_or_else(|e| panic!("{topic_encoding:?} topic read as '{declared}': {e}"));
        assert_eq!(
            render(&batches),
            render(&[inserted.slice(0, 3)]),
            "{topic_encoding:?} topic read as '{declared}'"
        );
    }
}

/// A topic whose schema is `AVRO_SCHEMA` (revision A, `BINARY`), and its subscription.
async fn revision_a_topic(admin: &PubSubAdmin, project: &str) -> (String, String) {
    let created = schema_topic(
        admin,
        project,
        schema::Type::Avro,
        AVRO_SCHEMA,
        Encoding::Binary,
    );
    let (topic, subscription, ..) = created.await;
    (topic, subscription)
}

/// Revision B of `AVRO_SCHEMA`: a nullable `coupon` field added at the end.
fn avro_schema_b() -> String {
    let mut schema: Value = serde_json::from_str(AVRO_SCHEMA).expect("the Avro schema");
    schema["fields"]
        .as_array_mut()
        .expect("fields")
        .push(json!({"name": "coupon", "type": ["null", "string"], "default": null}));
    schema.to_string()
}

/// Two records of revision A (ids 1, 2) as fastavro wrote them.
fn revision_a_datums() -> Vec<Vec<u8>> {
    fastavro_datums_of(
        AVRO_SCHEMA,
        &[
            json!({"id": 1, "ts": null, "amount": "1.00", "note": "a1", "address": null,
                   "tags": ["x"]}),
            json!({"id": 2, "ts": null, "amount": "2.00", "note": "a2", "address": null,
                   "tags": []}),
        ],
    )
}

/// Two records of revision B (ids 3, 4; `coupon` set on 3 only) as fastavro wrote them.
fn revision_b_datums() -> Vec<Vec<u8>> {
    fastavro_datums_of(
        &avro_schema_b(),
        &[
            json!({"id": 3, "ts": null, "amount": "3.00", "note": "b3", "address": null,
                   "tags": [], "coupon": "SAVE"}),
            json!({"id": 4, "ts": null, "amount": "4.00", "note": "b4", "address": null,
                   "tags": ["y"], "coupon": null}),
        ],
    )
}

/// Commits revision B of the schema of `topic` (named as the topic: `schema_topic` gives both
/// one id) with the generated client; its revision id.
async fn commit_revision_b(host: &str, topic: &str) -> String {
    let channel = gcp_sql::emulators::plaintext_channel(host)
        .await
        .expect("channel");
    let name = topic.replace("/topics/", "/schemas/");
    SchemaServiceClient::new(channel)
        .commit_schema(CommitSchemaRequest {
            name: name.clone(),
            schema: Some(PubSubSchema {
                name: name.clone(),
                r#type: schema::Type::Avro as i32,
                definition: avro_schema_b(),
                ..Default::default()
            }),
        })
        .await
        .unwrap_or_else(|s| panic!("CommitSchema {name}: {s}"))
        .into_inner()
        .revision_id
}

/// The table of revision A's fields, with `coupon` (revision B's) when `coupon`.
fn revised_table(coupon: bool) -> SchemaRef {
    let mut fields: Vec<arrow::datatypes::Field> = table_schema(false)
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    if coupon {
        fields.push(arrow::datatypes::Field::new(
            "coupon",
            arrow::datatypes::DataType::Utf8,
            true,
        ));
    }
    Arc::new(arrow::datatypes::Schema::new(fields))
}

/// The four rows as read (`coupon` only when the table has it).
fn revised_rows(coupon: bool) -> Vec<Value> {
    let mut rows = vec![
        json!({"id": 1, "amount": 1.0, "note": "a1", "tags": ["x"]}),
        json!({"id": 2, "amount": 2.0, "note": "a2", "tags": []}),
        json!({"id": 3, "amount": 3.0, "note": "b3", "tags": []}),
        json!({"id": 4, "amount": 4.0, "note": "b4", "tags": ["y"]}),
    ];
    if coupon {
        rows[2]["coupon"] = json!("SAVE");
    }
    rows
}

/// A scan bound to revision A when it started meets messages Pub/Sub stamped with revision B,
/// committed while it runs: it reads them with B (fetched once), so every row comes out right.
/// (Decoded with A, B's datums have bytes left over: the statement failed naming them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_scan_reads_messages_of_a_revision_committed_after_it_started() {
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription) = revision_a_topic(&admin, "source-revision-live").await;
    publish(&admin.host, &topic, revision_a_datums()).await;
    let raw = RawOptions::from_pairs(
        [
            ("emulator_host", admin.host.as_str()),
            ("stop_after_idle", "5s"),
            ("ack_deadline", "10s"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string())),
    )
    .expect("options");
    let opts = PubSubSourceOptions::from_raw(Some(&subscription), &raw).expect("source options");
    let table = Arc::new(
        PubSubSourceTable::try_new("orders_in", revised_table(false), opts).expect("table"),
    );
    let ctx = SessionContext::new();
    ctx.register_table("orders_in", table.clone())
        .expect("register");
    let scan =
        tokio::spawn(async move { ctx.sql("SELECT * FROM orders_in").await?.collect().await });
    // The scan has bound revision A once it has read A's two messages (a scan that ended
    // already fails below with its result).
    while !scan.is_finished()
        && table
            .handles()
            .iter()
            .map(|h| h.counts().messages_read)
            .sum::<u64>()
            < 2
    {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let revision_b = commit_revision_b(&admin.host, &topic).await;
    assert!(!revision_b.is_empty());
    publish(&admin.host, &topic, revision_b_datums()).await;
    let batches = scan
        .await
        .expect("scan task")
        .expect("SELECT over a topic whose schema gained a revision");
    for handle in table.handles() {
        handle.settled().await;
    }
    assert_eq!(render(&batches), revised_rows(false));
}

/// A scan started after revision B was committed (B bound) reads the backlog published with
/// revision A with A: `coupon`, which A lacks, is NULL there and set where B's messages have it.
/// (Decoded with B, A's datums end early: the statement failed naming them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_bound_to_a_newer_revision_reads_the_older_revisions_backlog() {
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription) = revision_a_topic(&admin, "source-revision-backlog").await;
    let declared_subscription = source_subscription(&admin, &topic).await;
    publish(&admin.host, &topic, revision_a_datums()).await;
    commit_revision_b(&admin.host, &topic).await;
    publish(&admin.host, &topic, revision_b_datums()).await;
    // A declared schema decodes every message with itself, whatever revision is stamped: A's
    // datums end early for B (read from a subscription of its own).
    let declared = avro_schema_b();
    let options = [("format", "avro"), ("schema", declared.as_str())];
    match read(
        revised_table(true),
        &admin.host,
        &declared_subscription,
        &options,
    )
    .await
    {
        Ok(_) => panic!("A's datums read with a declared revision B"),
        Err(e) => {
            let e = e.to_string();
            assert!(
                e.contains("option 'schema'") && e.contains("not a datum of the Avro schema"),
                "{e}"
            );
        }
    }
    let batches = read(revised_table(true), &admin.host, &subscription, &[])
        .await
        .expect("SELECT over the backlog of two revisions");
    assert_eq!(render(&batches), revised_rows(true));
}

/// What the emulator stamps once a schema has two revisions (docs/service_facts.md): each
/// message carries the revision it validated against, newest first (a B datum: B; an A datum
/// published after the commit: A). A topic pinned to revision A
/// (`first_revision_id = last_revision_id = A`) takes a B datum too, stamped A: the emulator
/// does not refuse the bytes A leaves over, so a stamp does not prove the writer's schema (the
/// source then reports such a message as a bad message: bytes left over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_emulator_stamps_each_message_with_the_revision_it_validated_against() {
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription) = revision_a_topic(&admin, "source-revision-stamps").await;
    let channel = gcp_sql::emulators::plaintext_channel(&admin.host)
        .await
        .expect("channel");
    let name = topic.replace("/topics/", "/schemas/");
    let revision_a = SchemaServiceClient::new(channel.clone())
        .get_schema(GetSchemaRequest {
            name: name.clone(),
            view: SchemaView::Basic as i32,
        })
        .await
        .expect("GetSchema")
        .into_inner()
        .revision_id;
    let a = revision_a_datums();
    let b = revision_b_datums();
    publish(&admin.host, &topic, vec![a[0].clone()]).await;
    let revision_b = commit_revision_b(&admin.host, &topic).await;
    assert_ne!(revision_a, revision_b);
    publish(&admin.host, &topic, vec![b[0].clone(), a[1].clone()]).await;
    PublisherClient::new(channel)
        .update_topic(UpdateTopicRequest {
            topic: Some(Topic {
                name: topic.clone(),
                schema_settings: Some(SchemaSettings {
                    schema: name.clone(),
                    encoding: Encoding::Binary as i32,
                    first_revision_id: revision_a.clone(),
                    last_revision_id: revision_a.clone(),
                }),
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["schema_settings".into()],
            }),
        })
        .await
        .expect("UpdateTopic pinning revision A");
    publish(&admin.host, &topic, vec![b[1].clone()]).await;
    let stamped: Vec<(Vec<u8>, String, String)> = admin
        .pull_all(&subscription, 4)
        .await
        .into_iter()
        .map(|m| {
            (
                m.data.clone(),
                m.attributes["googclient_schemaname"].clone(),
                m.attributes["googclient_schemarevisionid"].clone(),
            )
        })
        .collect();
    let revision_of = |data: &[u8]| {
        let (_, schema, revision) = stamped
            .iter()
            .find(|(d, ..)| d.as_slice() == data)
            .expect("every published message arrives");
        assert_eq!(schema, &name);
        revision.clone()
    };
    assert_eq!(revision_of(&a[0]), revision_a, "A before the commit");
    assert_eq!(revision_of(&b[0]), revision_b, "B after the commit");
    assert_eq!(revision_of(&a[1]), revision_a, "A after the commit");
    assert_eq!(revision_of(&b[1]), revision_a, "B on a topic pinned to A");
}
