//! End-to-end tests of the Pub/Sub sink against the real Pub/Sub emulator.
//!
//! Every test declares a sink table in SQL (`CREATE TABLE ... WITH (connector = 'pubsub', ...)`,
//! `MAP(VARCHAR, VARCHAR)` columns included, or through the Rust API where a test wants the
//! query's own schema), writes to it
//! with `INSERT INTO ... SELECT`, and reads the messages back through a subscription created
//! beforehand with the generated `gcloud-sdk` clients, comparing them message by message.
//!
//! The emulator is started once per test binary (`gcp_sql::emulators::shared`); each test uses
//! its own project and topics, so tests run in parallel. A missing emulator fails every test
//! with the install step.
//!
//! Run: `cargo test --test integration pubsub_sink::`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::support::{
    self, PubSubAdmin, exec, ids, insert, json_payloads, register_pubsub_table, unique,
};
use arrow::array::{
    ArrayRef, BinaryViewArray, BooleanArray, Date32Array, Date64Array, Decimal32Array,
    Decimal64Array, Decimal128Array, Decimal256Array, DictionaryArray, DurationMicrosecondArray,
    DurationMillisecondArray, DurationNanosecondArray, DurationSecondArray, FixedSizeBinaryArray,
    FixedSizeListArray, Float32Array, Float64Array, Int8Array, Int32Array, Int32Builder,
    Int64Array, IntervalDayTimeArray, IntervalMonthDayNanoArray, IntervalYearMonthArray,
    LargeBinaryArray, LargeListArray, LargeStringArray, ListArray, MapBuilder, NullArray,
    RecordBatch, StringArray, StringBuilder, StringViewArray, StructArray, Time32MillisecondArray,
    Time32SecondArray, Time64MicrosecondArray, Time64NanosecondArray, TimestampMicrosecondArray,
    TimestampMillisecondArray, TimestampNanosecondArray, TimestampSecondArray, UInt16Array,
};
use arrow::datatypes::{
    DataType, Field, Fields, Int8Type, Int32Type, IntervalDayTime, IntervalMonthDayNano, Schema,
    i256,
};
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use gcp_sql::core::metrics::names;
use serde_json::{Value, json};

/// `CREATE TABLE <table> (<columns>) WITH (connector = 'pubsub', emulator_host = ..., <options>)`.
fn create_table(table: &str, columns: &str, host: &str, options: &[(&str, &str)]) -> String {
    let mut with = format!("connector = 'pubsub', emulator_host = '{host}'");
    for (k, v) in options {
        with.push_str(&format!(", {k} = '{v}'"));
    }
    format!("CREATE TABLE {table} ({columns}) WITH ({with})")
}

fn sorted(mut v: Vec<i64>) -> Vec<i64> {
    v.sort_unstable();
    v
}

// --- 1. bulk ----------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_insert_of_100k_generated_rows_delivers_every_row_exactly_once() {
    const ROWS: usize = 100_000;
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription) = admin.topic_with_subscription("bulk", "bulk", false).await;
    let ctx = gcp_sql::sql::new_context();
    // Thresholds a bulk load would use: full 1000-message requests.
    exec(
        &ctx,
        &create_table(
            "bulk",
            "id BIGINT, label VARCHAR",
            &admin.host,
            &[
                ("topic", &topic),
                ("batch_element_count_threshold", "1000"),
                ("batch_request_byte_threshold", "5000000"),
                ("batch_delay_threshold", "10ms"),
            ],
        ),
    )
    .await;

    let done = insert(
        &ctx,
        "INSERT INTO bulk SELECT value AS id, concat('row-', CAST(value AS VARCHAR)) AS label \
         FROM generate_series(1, 100000)",
    )
    .await;

    assert_eq!(done.count(), ROWS as u64);
    assert_eq!(done.metric(names::RECORDS_ACKED), ROWS);
    assert_eq!(done.metric(names::RECORDS_SENT), ROWS);
    assert_eq!(done.metric(names::SEND_ERRORS), 0);
    assert_eq!(done.metric(names::RECORDS_SKIPPED), 0);
    assert_eq!(done.metric(names::IN_FLIGHT_RECORDS), 0);
    // The in-flight cap (max_in_flight_messages, default 1000) held all along, in every writer.
    let high_water = done.metric_per_writer(names::IN_FLIGHT_RECORDS_HIGH_WATER);
    assert_eq!(high_water.len(), done.metric("writers"));
    for h in high_water {
        assert!((1..=1000).contains(&h), "high water {h}");
    }
    // A request carries at most 1000 messages.
    assert!(done.metric(names::SEND_RPCS) >= ROWS / 1000);

    let messages = admin.pull_all(&subscription, ROWS).await;
    assert_eq!(messages.len(), ROWS, "distinct messages delivered");
    for (message, payload) in messages.iter().zip(json_payloads(&messages)) {
        let id = payload["id"].as_i64().expect("integer id");
        assert_eq!(payload, json!({"id": id, "label": format!("row-{id}")}));
        assert!(message.attributes.is_empty());
        assert!(message.ordering_key.is_empty());
    }
    // Every id once: no row lost, none published twice.
    let expected: Vec<i64> = (1..=ROWS as i64).collect();
    assert_eq!(sorted(ids(&messages, "id")), expected);
}

// --- 2. several topics --------------------------------------------------------------------------

#[tokio::test]
async fn one_statement_publishes_to_short_and_full_topic_names_from_a_column() {
    let admin = PubSubAdmin::connect().await;
    let project = "multi";
    let (short_topic, short_sub) = admin.topic_with_subscription(project, "short", false).await;
    let (full_topic, full_sub) = admin.topic_with_subscription(project, "full", false).await;
    // A full name may point into another project than the one short ids resolve in.
    let (other_topic, other_sub) = admin
        .topic_with_subscription("multi-other", "other", false)
        .await;
    let short_id = short_topic.rsplit('/').next().expect("topic id");

    let ctx = gcp_sql::sql::new_context();
    exec(
        &ctx,
        &create_table(
            "fanout",
            "id BIGINT, dest VARCHAR",
            &admin.host,
            &[("project", project), ("topic_column", "dest")],
        ),
    )
    .await;
    let done = insert(
        &ctx,
        &format!(
            "INSERT INTO fanout SELECT value AS id, \
               CASE value % 3 WHEN 0 THEN '{short_id}' WHEN 1 THEN '{full_topic}' ELSE '{other_topic}' END AS dest \
             FROM generate_series(1, 300)"
        ),
    )
    .await;
    assert_eq!(done.count(), 300);
    assert_eq!(done.metric(names::RECORDS_ACKED), 300);

    for (subscription, remainder) in [(&short_sub, 0), (&full_sub, 1), (&other_sub, 2)] {
        let messages = admin.pull_all(subscription, 100).await;
        // The topic column routes the row and is not part of the payload.
        for payload in json_payloads(&messages) {
            assert_eq!(payload.as_object().map(|o| o.len()), Some(1), "{payload}");
        }
        let expected: Vec<i64> = (1..=300).filter(|v| v % 3 == remainder).collect();
        assert_eq!(sorted(ids(&messages, "id")), expected, "{subscription}");
    }
}

#[tokio::test]
async fn explain_analyze_shows_the_sink_metrics_by_their_registered_names() {
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription) = admin
        .topic_with_subscription("explain", "explain", false)
        .await;
    let ctx = gcp_sql::sql::new_context();
    exec(
        &ctx,
        &create_table("explained", "id BIGINT", &admin.host, &[("topic", &topic)]),
    )
    .await;
    let batches = gcp_sql::sql::run(
        &ctx,
        "EXPLAIN ANALYZE INSERT INTO explained SELECT value FROM generate_series(1, 25)",
    )
    .await
    .expect("EXPLAIN ANALYZE runs the INSERT");
    let text = arrow::util::pretty::pretty_format_batches(&batches)
        .expect("render")
        .to_string();
    assert!(text.contains("SinkWriterExec: connector="), "{text}");
    for metric in [
        format!("{}=25", names::RECORDS_ACKED),
        format!("{}=25", names::RECORDS_SENT),
        format!("{}=0", names::SEND_ERRORS),
    ] {
        assert!(text.contains(&metric), "missing {metric} in\n{text}");
    }
    assert_eq!(admin.pull_all(&subscription, 25).await.len(), 25);
}

// --- 3. missing topics ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_create_topic_creates_the_missing_topic_and_publishes_there() {
    let admin = PubSubAdmin::connect().await;
    let id = unique("created");
    let topic = format!("projects/autocreate/topics/{id}");
    let subscription = format!("projects/autocreate/subscriptions/{id}-sub");
    assert!(!admin.topic_exists(&topic).await, "absent before");

    let ctx = gcp_sql::sql::new_context();
    // The recovery creates the topic, then waits recovery_initial_backoff before publishing
    // again: the test subscribes in that window (a subscription sees only later messages).
    exec(
        &ctx,
        &create_table(
            "created",
            "id BIGINT",
            &admin.host,
            &[
                ("topic", &topic),
                ("auto_create_topic", "true"),
                ("recovery_initial_backoff", "4s"),
            ],
        ),
    )
    .await;
    let statement = tokio::spawn({
        let ctx = ctx.clone();
        async move {
            insert(
                &ctx,
                "INSERT INTO created SELECT value FROM generate_series(1, 40)",
            )
            .await
        }
    });
    let appeared = tokio::time::timeout(support::DELIVERY_BOUND, async {
        while !admin.topic_exists(&topic).await {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(appeared.is_ok(), "the sink never created {topic}");
    admin
        .create_subscription(&subscription, &topic, false)
        .await;

    let done = statement.await.expect("INSERT task");
    assert_eq!(done.count(), 40);
    assert_eq!(done.metric(names::RESOURCES_CREATED), 1);
    assert_eq!(done.metric(names::RECORDS_ACKED), 40);
    assert!(done.errors_with_code("NOT_FOUND") >= 1);
    assert!(admin.topic_exists(&topic).await, "present after");
    let messages = admin.pull_all(&subscription, 40).await;
    assert_eq!(sorted(ids(&messages, "id")), (1..=40).collect::<Vec<i64>>());
}

#[tokio::test]
async fn missing_topic_without_auto_create_fails_naming_not_found_and_the_topic() {
    let admin = PubSubAdmin::connect().await;
    let topic = format!("projects/missing/topics/{}", unique("absent"));
    let ctx = gcp_sql::sql::new_context();
    exec(
        &ctx,
        &create_table("absent", "id BIGINT", &admin.host, &[("topic", &topic)]),
    )
    .await;
    let done = insert(
        &ctx,
        "INSERT INTO absent SELECT value FROM generate_series(1, 5)",
    )
    .await;
    let error = done.error();
    assert!(error.contains("NOT_FOUND"), "{error}");
    assert!(error.contains(&topic), "{error}");
    assert_eq!(done.metric(names::RECORDS_ACKED), 0);
    assert_eq!(done.metric(names::RESOURCES_CREATED), 0);
    assert!(!admin.topic_exists(&topic).await, "nothing was created");
}

// --- 4. JSON encoding ----------------------------------------------------------------------------

/// Pulls `n` messages and returns their JSON payloads keyed by the integer `id` field.
async fn payloads_by_id(admin: &PubSubAdmin, subscription: &str, n: usize) -> BTreeMap<i64, Value> {
    let messages = admin.pull_all(subscription, n).await;
    assert_eq!(messages.len(), n);
    json_payloads(&messages)
        .into_iter()
        .map(|v| (v["id"].as_i64().expect("id"), v))
        .collect()
}

/// Compares two JSON objects key by key, so a failure names the column.
fn assert_fields(actual: &Value, expected: &Value) {
    let (Some(a), Some(e)) = (actual.as_object(), expected.as_object()) else {
        panic!("not objects: {actual} / {expected}");
    };
    for (key, want) in e {
        assert_eq!(a.get(key), Some(want), "column '{key}' in {actual}");
    }
    let extra: Vec<&String> = a.keys().filter(|k| !e.contains_key(*k)).collect();
    assert!(extra.is_empty(), "unexpected keys {extra:?} in {actual}");
}

#[tokio::test]
async fn json_payload_of_every_sql_declarable_type() {
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription) = admin
        .topic_with_subscription("json-sql", "typed", false)
        .await;
    let ctx = gcp_sql::sql::new_context();
    // TIMESTAMP WITH TIME ZONE takes the session's zone. (The instant inserted is given with
    // its offset: a zone-less timestamp cast to a zoned one is read as local time there.)
    exec(&ctx, "SET datafusion.execution.time_zone = '+02:00'").await;
    exec(
        &ctx,
        &create_table(
            "typed",
            "id BIGINT, b BOOLEAN, i8 TINYINT, i16 SMALLINT, i32 INT, u8 TINYINT UNSIGNED, \
             u16 SMALLINT UNSIGNED, u32 INT UNSIGNED, u64 BIGINT UNSIGNED, f32 REAL, f64 DOUBLE, \
             f64_nan DOUBLE, big DOUBLE, dec DECIMAL(10, 2), s VARCHAR, bin BYTEA, d DATE, t TIME, \
             ts TIMESTAMP, ts_ms TIMESTAMP(3), ts_s TIMESTAMP(0), tstz TIMESTAMP WITH TIME ZONE, \
             iv INTERVAL, arr INT[], st STRUCT<a INT, b VARCHAR>",
            &admin.host,
            &[("topic", &topic)],
        ),
    )
    .await;
    let done = insert(
        &ctx,
        "INSERT INTO typed VALUES (\
           1, true, -8, -16, -32, 8, 16, 32, CAST('18446744073709551615' AS BIGINT UNSIGNED), \
           1.5, 0.1, CAST('NaN' AS DOUBLE), 1e300, CAST('-123.45' AS DECIMAL(10, 2)), \
           'quote \" backslash \\ newline \n tab \t é', CAST('hi' AS BYTEA), DATE '2024-05-01', \
           TIME '12:34:56.789', TIMESTAMP '2024-05-01T12:00:00', TIMESTAMP '2024-05-01T12:00:00.123', \
           TIMESTAMP '2024-05-01T12:00:00', \
           arrow_cast('2024-05-01T12:00:00Z', 'Timestamp(Nanosecond, Some(\"+02:00\"))'), \
           INTERVAL '1 month 2 days 3 seconds', [1, NULL, 3], named_struct('a', 7, 'b', 'x')), \
         (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, \
           NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
    )
    .await;
    assert_eq!(done.count(), 2);

    let payloads = payloads_by_id(&admin, &subscription, 2).await;
    assert_fields(
        &payloads[&1],
        &json!({
            "id": 1, "b": true, "i8": -8, "i16": -16, "i32": -32, "u8": 8, "u16": 16, "u32": 32,
            "u64": 18446744073709551615u64,
            "f32": 1.5, "f64": 0.1,
            // JSON has no NaN.
            "f64_nan": null,
            "big": 1e300,
            // Decimals are exact text.
            "dec": "-123.45",
            "s": "quote \" backslash \\ newline \n tab \t é",
            // base64 of "hi".
            "bin": "aGk=",
            "d": "2024-05-01",
            "t": "12:34:56.789000000",
            "ts": "2024-05-01T12:00:00.000000000Z",
            "ts_ms": "2024-05-01T12:00:00.123Z",
            "ts_s": "2024-05-01T12:00:00Z",
            "tstz": "2024-05-01T14:00:00.000000000+02:00",
            "iv": "P1M2DT3.000000000S",
            "arr": [1, null, 3],
            "st": {"a": 7, "b": "x"},
        }),
    );
    // Null values keep their keys.
    let mut nulls = serde_json::Map::new();
    for key in payloads[&1].as_object().expect("object").keys() {
        nulls.insert(key.clone(), Value::Null);
    }
    nulls.insert("id".into(), json!(2));
    assert_fields(&payloads[&2], &Value::Object(nulls));
}

/// A batch with one column of each Arrow type SQL cannot declare; row 0 holds values, row 1
/// nulls.
fn exotic_batch() -> RecordBatch {
    let map_str_int = {
        let mut b = MapBuilder::new(None, StringBuilder::new(), Int32Builder::new());
        b.keys().append_value("k1");
        b.values().append_value(1);
        b.keys().append_value("k2");
        b.values().append_null();
        b.append(true).expect("map row");
        b.append(false).expect("null map row");
        b.finish()
    };
    let map_int_str = {
        let mut b = MapBuilder::new(None, Int32Builder::new(), StringBuilder::new());
        b.keys().append_value(1);
        b.values().append_value("one");
        b.keys().append_value(2);
        b.values().append_value("two");
        b.append(true).expect("map row");
        b.append(false).expect("null map row");
        b.finish()
    };
    let int_item = Arc::new(Field::new("item", DataType::Int32, true));
    let struct_fields = Fields::from(vec![
        Field::new("a", DataType::Int32, true),
        Field::new("tags", DataType::List(int_item.clone()), true),
    ]);
    let nested = StructArray::try_new(
        struct_fields,
        vec![
            Arc::new(Int32Array::from(vec![Some(5), None])),
            Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
                Some(vec![Some(9)]),
                None,
            ])),
        ],
        Some(vec![true, false].into()),
    )
    .expect("struct");
    let dictionary: DictionaryArray<Int8Type> = vec![Some("red"), None].into_iter().collect();
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("id", Arc::new(Int64Array::from(vec![1, 2]))),
        ("nothing", Arc::new(NullArray::new(2))),
        (
            "half",
            arrow::compute::cast(
                &Float32Array::from(vec![Some(1.5), None]),
                &DataType::Float16,
            )
            .expect("cast to Float16"),
        ),
        (
            "inf",
            Arc::new(Float32Array::from(vec![Some(f32::INFINITY), None])),
        ),
        (
            "neg_inf",
            Arc::new(Float64Array::from(vec![Some(f64::NEG_INFINITY), None])),
        ),
        ("i8", Arc::new(Int8Array::from(vec![Some(i8::MIN), None]))),
        (
            "u16",
            Arc::new(UInt16Array::from(vec![Some(u16::MAX), None])),
        ),
        (
            "i64",
            Arc::new(Int64Array::from(vec![Some(i64::MIN), None])),
        ),
        (
            "dec32",
            Arc::new(
                Decimal32Array::from(vec![Some(12345), None])
                    .with_precision_and_scale(7, 3)
                    .expect("decimal32"),
            ),
        ),
        (
            "dec64",
            Arc::new(
                Decimal64Array::from(vec![Some(-5), None])
                    .with_precision_and_scale(15, 2)
                    .expect("decimal64"),
            ),
        ),
        (
            "dec128_neg_scale",
            Arc::new(
                Decimal128Array::from(vec![Some(123), None])
                    .with_precision_and_scale(38, -2)
                    .expect("decimal128"),
            ),
        ),
        (
            "dec256",
            Arc::new(
                Decimal256Array::from(vec![
                    Some(i256::from_i128(-12_345_678_901_234_567_890_123)),
                    None,
                ])
                .with_precision_and_scale(50, 4)
                .expect("decimal256"),
            ),
        ),
        (
            "large_text",
            Arc::new(LargeStringArray::from(vec![Some("a\"b\\c\u{1}é"), None])),
        ),
        (
            "view_text",
            Arc::new(StringViewArray::from(vec![Some("view"), None])),
        ),
        (
            "large_bin",
            Arc::new(LargeBinaryArray::from(vec![Some(&[0u8, 255][..]), None])),
        ),
        (
            "view_bin",
            Arc::new(BinaryViewArray::from(vec![Some(&b"hi"[..]), None])),
        ),
        (
            "fixed_bin",
            Arc::new(
                FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                    vec![Some(b"abc".to_vec()), None].into_iter(),
                    3,
                )
                .expect("fixed size binary"),
            ),
        ),
        ("day", Arc::new(Date32Array::from(vec![Some(-1), None]))),
        // 2024-05-01T12:51:30.123Z: a Date64 is cut to its day.
        (
            "day64",
            Arc::new(Date64Array::from(vec![Some(1_714_567_890_123), None])),
        ),
        (
            "t_s",
            Arc::new(Time32SecondArray::from(vec![Some(45_296), None])),
        ),
        (
            "t_ms",
            Arc::new(Time32MillisecondArray::from(vec![Some(45_296_789), None])),
        ),
        (
            "t_us",
            Arc::new(Time64MicrosecondArray::from(vec![
                Some(45_296_789_012),
                None,
            ])),
        ),
        (
            "t_ns",
            Arc::new(Time64NanosecondArray::from(vec![
                Some(45_296_789_012_345),
                None,
            ])),
        ),
        // 1714564800 s is 2024-05-01T12:00:00Z.
        (
            "ts_s",
            Arc::new(TimestampSecondArray::from(vec![Some(1_714_564_800), None])),
        ),
        (
            "ts_ms_plus2",
            Arc::new(
                TimestampMillisecondArray::from(vec![Some(1_714_564_800_123), None])
                    .with_timezone("+02:00"),
            ),
        ),
        (
            "ts_us_utc",
            Arc::new(
                TimestampMicrosecondArray::from(vec![Some(1_714_564_800_000_001), None])
                    .with_timezone("UTC"),
            ),
        ),
        (
            "ts_ns_new_york",
            Arc::new(
                TimestampNanosecondArray::from(vec![Some(1_714_564_800_000_000_000), None])
                    .with_timezone("America/New_York"),
            ),
        ),
        (
            "dur_s",
            Arc::new(DurationSecondArray::from(vec![Some(90), None])),
        ),
        (
            "dur_ms",
            Arc::new(DurationMillisecondArray::from(vec![Some(1_500), None])),
        ),
        (
            "dur_us",
            Arc::new(DurationMicrosecondArray::from(vec![Some(-1), None])),
        ),
        (
            "dur_ns",
            Arc::new(DurationNanosecondArray::from(vec![
                Some(3_000_000_001),
                None,
            ])),
        ),
        (
            "iv_ym",
            Arc::new(IntervalYearMonthArray::from(vec![Some(14), None])),
        ),
        (
            "iv_dt",
            Arc::new(IntervalDayTimeArray::from(vec![
                Some(IntervalDayTime::new(2, -1_500)),
                None,
            ])),
        ),
        (
            "iv_mdn",
            Arc::new(IntervalMonthDayNanoArray::from(vec![
                Some(IntervalMonthDayNano::new(1, 2, 3_000_000_001)),
                None,
            ])),
        ),
        (
            "list",
            Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
                Some(vec![Some(1), None, Some(3)]),
                None,
            ])),
        ),
        (
            "large_list",
            Arc::new(LargeListArray::from_iter_primitive::<Int32Type, _, _>(
                vec![Some(vec![Some(4)]), None],
            )),
        ),
        (
            "fixed_list",
            Arc::new(FixedSizeListArray::from_iter_primitive::<Int32Type, _, _>(
                vec![Some(vec![Some(5), Some(6)]), None],
                2,
            )),
        ),
        ("nested", Arc::new(nested)),
        ("map_str", Arc::new(map_str_int)),
        ("map_int", Arc::new(map_int_str)),
        ("dict", Arc::new(dictionary)),
        (
            "flag",
            Arc::new(BooleanArray::from(vec![Some(false), None])),
        ),
        ("text", Arc::new(StringArray::from(vec![Some(""), None]))),
    ];
    let schema = Schema::new(
        columns
            .iter()
            .map(|(name, array)| Field::new(*name, array.data_type().clone(), true))
            .collect::<Vec<_>>(),
    );
    RecordBatch::try_new(
        Arc::new(schema),
        columns.into_iter().map(|(_, a)| a).collect(),
    )
    .expect("exotic batch")
}

#[tokio::test]
async fn json_payload_of_every_supported_arrow_type() {
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription) = admin
        .topic_with_subscription("json-arrow", "exotic", false)
        .await;
    let ctx = SessionContext::new_with_state(gcp_sql::sql::new_state_builder().build());
    let batch = exotic_batch();
    let schema = batch.schema();
    let source = MemTable::try_new(schema.clone(), vec![vec![batch]]).expect("memtable");
    ctx.register_table("exotic_source", Arc::new(source))
        .expect("register source");
    register_pubsub_table(
        &ctx,
        "exotic",
        schema,
        &[("emulator_host", &admin.host), ("topic", &topic)],
    );
    let done = insert(&ctx, "INSERT INTO exotic SELECT * FROM exotic_source").await;
    assert_eq!(done.count(), 2);

    let payloads = payloads_by_id(&admin, &subscription, 2).await;
    let expected = json!({
        "id": 1,
        "nothing": null,
        "half": 1.5,
        // JSON has no infinities.
        "inf": null,
        "neg_inf": null,
        "i8": -128,
        "u16": 65535,
        "i64": i64::MIN,
        "dec32": "12.345",
        "dec64": "-0.05",
        "dec128_neg_scale": "12300",
        "dec256": "-1234567890123456789.0123",
        "large_text": "a\"b\\c\u{1}é",
        "view_text": "view",
        "large_bin": "AP8=",
        "view_bin": "aGk=",
        "fixed_bin": "YWJj",
        "day": "1969-12-31",
        "day64": "2024-05-01",
        "t_s": "12:34:56",
        "t_ms": "12:34:56.789",
        "t_us": "12:34:56.789012",
        "t_ns": "12:34:56.789012345",
        "ts_s": "2024-05-01T12:00:00Z",
        "ts_ms_plus2": "2024-05-01T14:00:00.123+02:00",
        // An offset of zero is written Z.
        "ts_us_utc": "2024-05-01T12:00:00.000001Z",
        // New York is on daylight time (UTC-4) in May.
        "ts_ns_new_york": "2024-05-01T08:00:00.000000000-04:00",
        "dur_s": "PT90S",
        "dur_ms": "PT1.500S",
        "dur_us": "-PT0.000001S",
        "dur_ns": "PT3.000000001S",
        "iv_ym": "P14M",
        "iv_dt": "P2DT-1.500S",
        "iv_mdn": "P1M2DT3.000000001S",
        "list": [1, null, 3],
        "large_list": [4],
        "fixed_list": [5, 6],
        "nested": {"a": 5, "tags": [9]},
        "map_str": {"k1": 1, "k2": null},
        "map_int": [[1, "one"], [2, "two"]],
        "dict": "red",
        "flag": false,
        "text": "",
    });
    assert_fields(&payloads[&1], &expected);
    let mut nulls: serde_json::Map<String, Value> = expected
        .as_object()
        .expect("object")
        .keys()
        .map(|k| (k.clone(), Value::Null))
        .collect();
    nulls.insert("id".into(), json!(2));
    assert_fields(&payloads[&2], &Value::Object(nulls));
}

// --- 5. attributes and ordering keys -------------------------------------------------------------

#[tokio::test]
async fn attributes_come_from_a_map_column_and_from_attribute_columns() {
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription) = admin.topic_with_subscription("attrs", "attrs", false).await;
    let ctx = gcp_sql::sql::new_context();
    // Rows 1..=30: every fifth has a null map, every third a null region; the map's entry
    // 'maybe' is null on even rows (a null entry is skipped).
    let source = "SELECT value AS id, concat('note ', CAST(value AS VARCHAR)) AS note, \
                    CASE WHEN value % 3 = 0 THEN NULL ELSE 'eu-west' END AS region, \
                    CAST(value * 10 AS INT) AS level, \
                    CASE WHEN value % 5 = 0 THEN NULL \
                         ELSE map(['origin', 'seq', 'maybe'], \
                                  ['generator', CAST(value AS VARCHAR), \
                                   CASE WHEN value % 2 = 0 THEN NULL ELSE 'odd' END]) END AS attributes \
                  FROM generate_series(1, 30)";
    // The table takes the query's own schema through the Rust API (a map column declared in
    // SQL is the next test); the INSERT is SQL as everywhere else.
    let schema = ctx
        .sql(source)
        .await
        .expect("plan the source")
        .schema()
        .as_arrow()
        .clone();
    register_pubsub_table(
        &ctx,
        "attributed",
        Arc::new(schema),
        &[
            ("emulator_host", &admin.host),
            ("topic", &topic),
            ("attribute_columns", "region, level"),
        ],
    );
    let done = insert(&ctx, &format!("INSERT INTO attributed {source}")).await;
    assert_eq!(done.count(), 30);

    let messages = admin.pull_all(&subscription, 30).await;
    assert_eq!(messages.len(), 30);
    for (message, payload) in messages.iter().zip(json_payloads(&messages)) {
        let id = payload["id"].as_i64().expect("id");
        // Attribute columns and the map column leave the payload.
        assert_eq!(payload, json!({"id": id, "note": format!("note {id}")}));
        let mut expected: HashMap<String, String> = HashMap::new();
        if id % 5 != 0 {
            expected.insert("origin".into(), "generator".into());
            expected.insert("seq".into(), id.to_string());
            if id % 2 != 0 {
                expected.insert("maybe".into(), "odd".into());
            }
        }
        if id % 3 != 0 {
            expected.insert("region".into(), "eu-west".into());
        }
        // A number becomes its JSON text.
        expected.insert("level".into(), (id * 10).to_string());
        assert_eq!(message.attributes, expected, "row {id}");
    }
}

#[tokio::test]
async fn a_map_column_declared_in_either_sql_form_fills_the_attributes() {
    let admin = PubSubAdmin::connect().await;
    let ctx = gcp_sql::sql::new_context();
    let (with_topic, with_subscription) =
        admin.topic_with_subscription("mapsql", "with", false).await;
    let (ext_topic, ext_subscription) = admin.topic_with_subscription("mapsql", "ext", false).await;
    exec(
        &ctx,
        &create_table(
            "with_form",
            "id BIGINT, attrs MAP(VARCHAR, VARCHAR)",
            &admin.host,
            &[("topic", &with_topic), ("attributes_column", "attrs")],
        ),
    )
    .await;
    exec(
        &ctx,
        &format!(
            "CREATE EXTERNAL TABLE external_form (id BIGINT, attrs MAP(VARCHAR, VARCHAR)) \
             STORED AS PUBSUB LOCATION '{ext_topic}' \
             OPTIONS ('emulator_host' '{}', 'attributes_column' 'attrs')",
            admin.host
        ),
    )
    .await;
    // The three map constructors DataFusion evaluates, and a null map (no attributes).
    let fill = [
        (
            "with_form",
            "map(['origin', 'seq'], ['map', CAST(value AS VARCHAR)])",
            "map",
        ),
        (
            "external_form",
            "make_map('origin', 'make_map', 'seq', CAST(value AS VARCHAR))",
            "make_map",
        ),
        (
            "with_form",
            "MAP {'origin': 'literal', 'seq': CAST(value AS VARCHAR)}",
            "literal",
        ),
    ];
    for (i, (table, map, _)) in fill.iter().enumerate() {
        let first = i as i64 * 10 + 1;
        let done = insert(
            &ctx,
            &format!(
                "INSERT INTO {table} SELECT value, CASE WHEN value % 4 = 0 THEN NULL ELSE {map} END \
                 FROM generate_series({first}, {})",
                first + 7
            ),
        )
        .await;
        assert_eq!(done.count(), 8, "{table} {map}");
    }
    let mut messages = admin.pull_all(&with_subscription, 16).await;
    messages.extend(admin.pull_all(&ext_subscription, 8).await);
    assert_eq!(messages.len(), 24);
    for (message, payload) in messages.iter().zip(json_payloads(&messages)) {
        let id = payload["id"].as_i64().expect("id");
        // The map column leaves the payload.
        assert_eq!(payload, json!({"id": id}));
        let origin = fill[(id / 10) as usize].2;
        let expected: HashMap<String, String> = if id % 4 == 0 {
            HashMap::new()
        } else {
            [("origin", origin.to_string()), ("seq", id.to_string())]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect()
        };
        assert_eq!(message.attributes, expected, "row {id}");
    }
}

#[tokio::test]
async fn a_map_column_of_other_than_strings_is_refused_naming_it() {
    let ctx = gcp_sql::sql::new_context();
    let error = gcp_sql::sql::run(
        &ctx,
        "CREATE TABLE bad (id BIGINT, attrs MAP(VARCHAR, INT)) WITH (connector = 'pubsub', \
         topic = 'projects/p/topics/clicks', attributes_column = 'attrs', emulator_host = 'localhost:1')",
    )
    .await
    .expect_err("a map of integers");
    let error = error.to_string();
    assert!(error.contains("column 'attrs'"), "{error}");
    assert!(error.contains("MAP(VARCHAR, VARCHAR)"), "{error}");
}

#[tokio::test]
async fn ordering_keys_keep_the_order_within_each_key() {
    const ROWS: i64 = 400;
    const KEYS: i64 = 4;
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription) = admin
        .topic_with_subscription("ordered", "ordered", true)
        .await;
    let ctx = gcp_sql::sql::new_context();
    // Small batches, so that each key's messages span many publish requests.
    exec(
        &ctx,
        &create_table(
            "ordered",
            "id BIGINT, ordering_key VARCHAR",
            &admin.host,
            &[
                ("topic", &topic),
                ("enable_message_ordering", "true"),
                ("batch_element_count_threshold", "7"),
            ],
        ),
    )
    .await;
    let done = insert(
        &ctx,
        &format!(
            "INSERT INTO ordered SELECT value AS id, concat('key-', CAST(value % {KEYS} AS VARCHAR)) \
             FROM generate_series(1, {ROWS})"
        ),
    )
    .await;
    assert_eq!(done.count(), ROWS as u64);

    let messages = admin.pull_all(&subscription, ROWS as usize).await;
    for payload in json_payloads(&messages) {
        // The ordering key column leaves the payload.
        assert_eq!(payload.as_object().map(|o| o.len()), Some(1), "{payload}");
    }
    let order: Vec<i64> = (1..=ROWS).collect();
    support::assert_each_key_once_in_order(&messages, &order, KEYS);
}

async fn insert_keyed_rows_without_ordering(
    policy: Option<&str>,
) -> (support::Insert, PubSubAdmin, String) {
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription) = admin
        .topic_with_subscription("unordered", "keyed", false)
        .await;
    let ctx = gcp_sql::sql::new_context();
    let mut options = vec![("topic", topic.as_str())];
    if let Some(policy) = policy {
        options.push(("failure_policy", policy));
    }
    exec(
        &ctx,
        &create_table(
            "keyed",
            "id BIGINT, ordering_key VARCHAR",
            &admin.host,
            &options,
        ),
    )
    .await;
    // Rows 1..=20: every fourth carries a key; the others a null or an empty key (no key).
    let done = insert(
        &ctx,
        "INSERT INTO keyed SELECT value, \
           CASE WHEN value % 4 = 0 THEN 'k' WHEN value % 2 = 0 THEN '' ELSE NULL END \
         FROM generate_series(1, 20)",
    )
    .await;
    (done, admin, subscription)
}

#[tokio::test]
async fn a_row_with_an_ordering_key_while_ordering_is_disabled_fails_the_statement() {
    let (done, _, _) = insert_keyed_rows_without_ordering(None).await;
    let error = done.error();
    // Row 3 (value 4) is the first with a key.
    assert!(error.contains("row 3"), "{error}");
    assert!(error.contains("enable_message_ordering"), "{error}");
}

#[tokio::test]
async fn a_row_with_an_ordering_key_while_ordering_is_disabled_is_dropped_and_counted() {
    let (done, admin, subscription) = insert_keyed_rows_without_ordering(Some("drop")).await;
    assert_eq!(done.count(), 15);
    assert_eq!(done.metric(names::RECORDS_SKIPPED), 5);
    assert_eq!(done.metric(names::RECORDS_ACKED), 15);
    let messages = admin.pull_all(&subscription, 15).await;
    assert!(messages.iter().all(|m| m.ordering_key.is_empty()));
    let expected: Vec<i64> = (1..=20).filter(|v| v % 4 != 0).collect();
    assert_eq!(sorted(ids(&messages, "id")), expected);
}

// --- 6. serializer rejections --------------------------------------------------------------------

/// 100 rows whose `big` attribute is 1024 bytes (the limit, accepted) except every tenth
/// (value % 10 = 3), which is 1025 bytes.
async fn insert_oversized_attributes(
    policy: Option<&str>,
) -> (support::Insert, PubSubAdmin, String) {
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription) = admin
        .topic_with_subscription("oversize", "oversize", false)
        .await;
    let ctx = gcp_sql::sql::new_context();
    let mut options = vec![("topic", topic.as_str()), ("attribute_columns", "big")];
    if let Some(policy) = policy {
        options.push(("failure_policy", policy));
    }
    exec(
        &ctx,
        &create_table("oversize", "id BIGINT, big VARCHAR", &admin.host, &options),
    )
    .await;
    let done = insert(
        &ctx,
        "INSERT INTO oversize SELECT value, \
           CASE WHEN value % 10 = 3 THEN repeat('x', 1025) ELSE repeat('y', 1024) END \
         FROM generate_series(1, 100)",
    )
    .await;
    (done, admin, subscription)
}

#[tokio::test]
async fn oversized_attribute_rows_are_skipped_under_the_drop_policy() {
    let (done, admin, subscription) = insert_oversized_attributes(Some("drop")).await;
    assert_eq!(done.count(), 90);
    assert_eq!(done.metric(names::RECORDS_SKIPPED), 10);
    assert_eq!(done.metric(names::RECORDS_ACKED), 90);
    // Serializer rejections never reach the service.
    assert_eq!(done.metric(names::RECORDS_SENT), 90);
    let messages = admin.pull_all(&subscription, 90).await;
    let expected: Vec<i64> = (1..=100).filter(|v| v % 10 != 3).collect();
    assert_eq!(sorted(ids(&messages, "id")), expected);
    for message in &messages {
        assert_eq!(message.attributes.get("big").map(String::len), Some(1024));
    }
}

#[tokio::test]
async fn oversized_attribute_fails_the_statement_naming_the_row_and_the_limit() {
    let (done, _, _) = insert_oversized_attributes(None).await;
    let error = done.error();
    // Value 3 is row 2 of the statement's input, counted from 0.
    assert!(error.contains("row 2"), "{error}");
    assert!(error.contains("'big'"), "{error}");
    assert!(error.contains("1025"), "{error}");
    assert!(error.contains("1024"), "{error}");
    assert_eq!(done.metric(names::RECORDS_SKIPPED), 0);
    // The two rows before the bad one were accepted: each is acknowledged or reported as not
    // delivered, none is lost silently.
    let acked = done.metric(names::RECORDS_ACKED);
    assert!(
        acked <= 2,
        "only rows before the bad one may be sent: {acked}"
    );
    if acked < 2 {
        let undelivered = format!("{} admitted row(s) were not delivered", 2 - acked);
        assert!(error.contains(&undelivered), "{error}");
    }
}

// --- one writer per partition ------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_writers_keep_each_ordering_keys_order_from_order_by() {
    const ROWS: i64 = 100_000;
    const KEYS: i64 = 16;
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription) = admin
        .topic_with_subscription("partitioned", "partitioned", true)
        .await;
    let ctx = gcp_sql::sql::new_context();
    exec(&ctx, "SET datafusion.execution.target_partitions = 8").await;
    exec(
        &ctx,
        &create_table(
            "partitioned",
            "id BIGINT, ordering_key VARCHAR",
            &admin.host,
            &[
                ("topic", &topic),
                ("enable_message_ordering", "true"),
                ("batch_element_count_threshold", "100"),
            ],
        ),
    )
    .await;
    // Descending, so that the order comes from the ORDER BY and not from the generator.
    let sql = format!(
        "INSERT INTO partitioned SELECT value AS id, \
           concat('key-', CAST(value % {KEYS} AS VARCHAR)) AS ordering_key \
         FROM generate_series(1, {ROWS}) ORDER BY id DESC"
    );
    let plan = crate::support::explain(&ctx, &sql).await;
    assert!(
        plan.contains("SinkWriterExec: connector=pubsub table=partitioned writers=8 routing=hash(ordering_key)"),
        "{plan}"
    );
    let done = insert(&ctx, &sql).await;
    assert_eq!(done.count(), ROWS as u64);
    assert_eq!(done.metric("writers"), 8);

    let messages = admin.pull_all(&subscription, ROWS as usize).await;
    let order: Vec<i64> = (1..=ROWS).rev().collect();
    support::assert_each_key_once_in_order(&messages, &order, KEYS);
}

/// Rows of the ORDER BY tests: `seq` (published as `id`, ordering key `key-{seq % 16}`) and
/// `t`, a permutation of `seq` that the INSERT does not write, so the order comes from the
/// ORDER BY and from nothing the published columns show.
const SCRAMBLED: &str = "(SELECT value AS seq, (value * 7919) % 100003 AS t \
                         FROM generate_series(1, 100000))";

/// `t` of row `seq` in [`SCRAMBLED`].
fn scrambled(seq: i64) -> i64 {
    (seq * 7919) % 100_003
}

/// Publishes 100,000 rows of [`SCRAMBLED`] at 8 partitions with `order_by` (over `seq` and
/// `t`), reads them back through an ordered subscription, and checks each key against
/// `expected` (the ids in that order).
async fn publish_scrambled_in_order(name: &str, order_by: &str, expected: Vec<i64>) {
    const KEYS: i64 = 16;
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription) = admin.topic_with_subscription(name, name, true).await;
    let ctx = gcp_sql::sql::new_context();
    exec(&ctx, "SET datafusion.execution.target_partitions = 8").await;
    exec(
        &ctx,
        &create_table(
            name,
            "id BIGINT, ordering_key VARCHAR",
            &admin.host,
            &[
                ("topic", &topic),
                ("enable_message_ordering", "true"),
                ("batch_element_count_threshold", "100"),
            ],
        ),
    )
    .await;
    let sql = format!(
        "INSERT INTO {name} SELECT seq AS id, \
           concat('key-', CAST(seq % {KEYS} AS VARCHAR)) AS ordering_key \
         FROM {SCRAMBLED} ORDER BY {order_by}"
    );
    let plan = crate::support::explain(&ctx, &sql).await;
    assert!(
        plan.contains(&format!(
            "SinkWriterExec: connector=pubsub table={name} writers=8 routing=hash(ordering_key) \
             order=[__order_0("
        )),
        "{plan}"
    );
    // Right below the writers: a sort of each partition, or a hash repartition that keeps the
    // order (a round-robin spread may only come before the sort).
    let below = plan
        .lines()
        .skip_while(|l| !l.contains("SinkWriterExec"))
        .nth(1)
        .unwrap_or_default();
    assert!(
        below.contains("SortExec")
            || (below.contains("RepartitionExec: partitioning=Hash([ordering_key@1], 8)")
                && below.contains("maintains_sort_order=true")),
        "{plan}"
    );
    let done = insert(&ctx, &sql).await;
    assert_eq!(done.count(), expected.len() as u64);
    let messages = admin.pull_all(&subscription, expected.len()).await;
    // The columns that carried the order were not published.
    for m in &messages {
        assert!(
            !String::from_utf8_lossy(&m.data).contains("__order"),
            "a hidden column in a payload"
        );
    }
    support::assert_each_key_once_in_order(&messages, &expected, KEYS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_writers_keep_the_order_of_an_order_by_on_a_column_not_inserted() {
    let mut expected: Vec<i64> = (1..=100_000).collect();
    expected.sort_by_key(|&seq| scrambled(seq));
    publish_scrambled_in_order("notinserted", "t", expected).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_writers_keep_the_order_of_an_order_by_on_expressions_desc_and_several_keys() {
    let mut expected: Vec<i64> = (1..=100_000).collect();
    expected.sort_by_key(|&seq| (std::cmp::Reverse(scrambled(seq) % 1000), scrambled(seq)));
    publish_scrambled_in_order("exprdesc", "t % 1000 DESC, t", expected).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_writer_reports_the_rows_every_writer_delivered() {
    const ROWS: i64 = 20_000;
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription) = admin
        .topic_with_subscription("onefails", "onefails", true)
        .await;
    let ctx = gcp_sql::sql::new_context();
    exec(&ctx, "SET datafusion.execution.target_partitions = 4").await;
    exec(
        &ctx,
        &create_table(
            "onefails",
            "id BIGINT, ordering_key VARCHAR, data VARCHAR",
            &admin.host,
            &[
                ("topic", &topic),
                ("data_column", "data"),
                ("attribute_columns", "id"),
                ("enable_message_ordering", "true"),
            ],
        ),
    )
    .await;
    // One row of key-3 is larger than a Publish request may be: its writer fails the
    // statement (fail policy) while the others are writing.
    let done = insert(
        &ctx,
        &format!(
            "INSERT INTO onefails SELECT value, concat('key-', CAST(value % 8 AS VARCHAR)), \
               CASE WHEN value = {half} THEN repeat('x', 11000000) ELSE 'ok' END \
             FROM generate_series(1, {ROWS})",
            half = ROWS / 2 + 3 - (ROWS / 2) % 8
        ),
    )
    .await;
    let error = done.error().to_string();
    assert!(error.contains("row(s) were acknowledged"), "{error}");
    let acknowledged: usize = error
        .split(" row(s) were acknowledged")
        .next()
        .and_then(|head| head.rsplit(['(', ' ']).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no acknowledged count in: {error}"));
    // What the error reports as acknowledged is what landed, over every writer.
    let messages = admin.pull_all(&subscription, acknowledged).await;
    assert_eq!(messages.len(), acknowledged, "{error}");
    assert_eq!(done.metric(names::RECORDS_ACKED), acknowledged, "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_byte_cap_is_the_statements_and_a_message_above_a_writers_share_goes_alone() {
    // 160,000 bytes for the statement at 4 writers: 40,000 each. Every message (60,000 bytes)
    // is above a writer's share and below the statement's cap: each goes alone.
    const ROWS: usize = 40;
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription) = admin
        .topic_with_subscription("ps-share", "share", false)
        .await;
    let ctx = gcp_sql::sql::new_context();
    exec(&ctx, "SET datafusion.execution.target_partitions = 4").await;
    exec(&ctx, "SET datafusion.execution.batch_size = 2").await;
    exec(
        &ctx,
        &create_table(
            "shared",
            "data VARCHAR",
            &admin.host,
            &[("topic", &topic), ("max_in_flight_bytes", "160000")],
        ),
    )
    .await;
    let done = insert(
        &ctx,
        &format!("INSERT INTO shared SELECT repeat('x', 60000) FROM generate_series(1, {ROWS})"),
    )
    .await;
    assert_eq!(done.count(), ROWS as u64);
    let peaks = done.metric_per_writer(names::IN_FLIGHT_BYTES_HIGH_WATER);
    assert_eq!(peaks.len(), 4, "{peaks:?}");
    // One message at a time per writer: its serialized size, a few bytes above its data.
    assert!(
        peaks.iter().all(|p| (60_000..61_000).contains(p)),
        "per-writer in-flight peaks {peaks:?}"
    );
    let records = done.metric_per_writer(names::IN_FLIGHT_RECORDS_HIGH_WATER);
    assert!(records.iter().all(|r| *r == 1), "{records:?}");
    assert_eq!(admin.pull_all(&subscription, ROWS).await.len(), ROWS);
}
