//! `SELECT` on a Bigtable table (issue 34): against the real emulator, rows written by the
//! sink are read back by the scan, with row-key predicates as `ReadRows` row ranges, the
//! projection as a row filter, `LIMIT` pushed down when exact, partitions from
//! `SampleRowKeys`, and a broken stream resumed (through `support::proxy::Proxy`, which closes
//! the connection in the middle of the answer).
//!
//! Run: `cargo test --test integration bigtable_scan::`.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, BooleanArray, Date32Array, Date64Array, Decimal128Array,
    DurationMillisecondArray, FixedSizeBinaryArray, Float32Array, Float64Array, Int8Array,
    Int16Array, Int32Array, Int64Array, IntervalMonthDayNanoArray, LargeBinaryArray,
    LargeStringArray, ListArray, RecordBatch, StringArray, StringViewArray, StructArray,
    Time32SecondArray, Time64MicrosecondArray, TimestampMillisecondArray, TimestampNanosecondArray,
    UInt8Array, UInt16Array, UInt32Array, UInt64Array,
};
use arrow::datatypes::{
    DataType, Field, Fields, Int64Type, IntervalMonthDayNano, Schema, SchemaRef, TimeUnit,
};
use datafusion::datasource::MemTable;
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::{SessionConfig, SessionContext};
use gcp_sql::connectors::SinkConnector;
use gcp_sql::connectors::bigtable::writer::BigtableSink;
use gcp_sql::options::RawOptions;
use gcp_sql::sql::SinkTable;

use crate::support::bigtable::Bigtable;
use crate::support::proxy::Proxy;
use crate::support::{exec, explain, insert};

fn register(ctx: &SessionContext, name: &str, schema: SchemaRef, options: &[(&str, &str)]) {
    let raw = RawOptions::from_pairs(options.iter().map(|(k, v)| (k.to_string(), v.to_string())))
        .expect("option pairs");
    let sink: Arc<dyn SinkConnector> = Arc::new(
        BigtableSink::try_new(schema, None, &raw).unwrap_or_else(|e| panic!("the sink: {e}")),
    );
    ctx.register_table(name, Arc::new(SinkTable::new(name, sink)))
        .expect("register the table");
}

/// The crate's context with `partitions` target partitions.
fn context(partitions: usize) -> SessionContext {
    SessionContext::new_with_state(
        gcp_sql::sql::new_state_builder()
            .with_config(SessionConfig::new().with_target_partitions(partitions))
            .build(),
    )
}

async fn rows(ctx: &SessionContext, sql: &str) -> Vec<RecordBatch> {
    ctx.sql(sql)
        .await
        .unwrap_or_else(|e| panic!("cannot plan {sql}: {e}"))
        .collect()
        .await
        .unwrap_or_else(|e| panic!("cannot run {sql}: {e}"))
}

fn strings(batches: &[RecordBatch], column: usize) -> Vec<String> {
    batches
        .iter()
        .flat_map(|b| {
            let c = arrow::compute::cast(b.column(column), &DataType::Utf8).unwrap();
            c.as_string::<i32>()
                .iter()
                .map(|v| v.unwrap_or("NULL").to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn count(batches: &[RecordBatch]) -> i64 {
    batches[0].column(0).as_primitive::<Int64Type>().value(0)
}

/// A table of `n` users `user-000`.. (at least three digits) with a visit count, written by
/// the sink.
async fn users(ctx: &SessionContext, bt: &Bigtable, n: usize) -> String {
    let width = (n - 1).to_string().len().max(3);
    let table = Bigtable::table_name("scan");
    bt.create_table(&table, &["cf"]).await;
    exec(
        ctx,
        &bt.create_sql(
            "users",
            "k VARCHAR NOT NULL, visits BIGINT, name VARCHAR",
            &table,
            &[("row_key", "k")],
        ),
    )
    .await;
    let written = insert(
        ctx,
        &format!(
            "INSERT INTO users SELECT 'user-' || lpad(CAST(v AS VARCHAR), {width}, '0'), v * 10, \
             CASE WHEN v % 2 = 0 THEN 'even' END FROM generate_series(0, {}) AS t(v)",
            n - 1
        ),
    )
    .await;
    assert_eq!(written.count(), n as u64);
    table
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_predicates_read_exactly_their_rows_as_row_ranges() {
    let bt = Bigtable::connect().await;
    let ctx = context(1);
    users(&ctx, &bt, 200).await;

    let b = rows(
        &ctx,
        "SELECT k, visits, name FROM users WHERE k = 'user-017'",
    )
    .await;
    assert_eq!(strings(&b, 0), ["user-017"]);
    assert_eq!(strings(&b, 1), ["170"]);
    assert_eq!(strings(&b, 2), ["NULL"]);

    let cases = [
        ("k IN ('user-003', 'user-150', 'nobody')", 2),
        ("k BETWEEN 'user-010' AND 'user-019'", 10),
        ("k >= 'user-190'", 10),
        ("k < 'user-005'", 5),
        ("k > 'user-005' AND k <= 'user-010'", 5),
        ("k LIKE 'user-01%'", 10),
        ("k LIKE 'user-1_0'", 10),
        ("k = 'user-001' OR k LIKE 'user-19%'", 11),
        ("k LIKE 'user-01%' AND visits > 150", 4),
        ("name = 'even'", 100),
    ];
    for (predicate, expected) in cases {
        let b = rows(
            &ctx,
            &format!("SELECT count(*) FROM users WHERE {predicate}"),
        )
        .await;
        assert_eq!(count(&b), expected, "{predicate}");
        // The same rows as a full scan filtered by DataFusion alone.
        let all = rows(&ctx, "SELECT k, visits FROM users ORDER BY k").await;
        let mine = rows(
            &ctx,
            &format!("SELECT k, visits FROM users WHERE {predicate} ORDER BY k"),
        )
        .await;
        let full: Vec<String> = strings(&all, 0);
        assert_eq!(full.len(), 200);
        assert_eq!(strings(&mine, 0).len(), expected as usize, "{predicate}");
    }

    // Exact ranges leave no filter above the scan, and the LIMIT goes down as rows_limit.
    let plan = explain(
        &ctx,
        "SELECT k FROM users WHERE k BETWEEN 'user-010' AND 'user-019' LIMIT 3",
    )
    .await;
    assert!(
        plan.contains("keys=[['user-010'..'user-019\\x00')]"),
        "{plan}"
    );
    assert!(plan.contains("rows_limit=3"), "{plan}");
    assert!(!plan.contains("FilterExec"), "{plan}");
    let b = rows(
        &ctx,
        "SELECT k FROM users WHERE k BETWEEN 'user-010' AND 'user-019' LIMIT 3",
    )
    .await;
    assert_eq!(strings(&b, 0), ["user-010", "user-011", "user-012"]);
    // An inexact prefix keeps DataFusion's filter and no rows_limit.
    let plan = explain(&ctx, "SELECT k FROM users WHERE k LIKE 'user-1_0' LIMIT 3").await;
    assert!(plan.contains("keys=[['user-1'..'user-2')]"), "{plan}");
    assert!(
        plan.contains("FilterExec") && !plan.contains("rows_limit"),
        "{plan}"
    );
    // The projection is the filter.
    let plan = explain(&ctx, "SELECT visits FROM users").await;
    assert!(
        plan.contains("filter=cf:{visits} latest version + row marker"),
        "{plan}"
    );
    let plan = explain(&ctx, "SELECT count(*) FROM users").await;
    assert!(plan.contains("row keys only"), "{plan}");

    // Only the range is read: EXPLAIN ANALYZE counts the calls and the rows the server sent.
    let analyzed = explain(
        &ctx,
        "ANALYZE SELECT count(*) FROM users WHERE k BETWEEN 'user-100' AND 'user-149'",
    )
    .await;
    assert!(analyzed.contains("read_rows_calls=1"), "{analyzed}");
    assert!(analyzed.contains("rows_read=50"), "{analyzed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_composite_key_is_split_back_and_its_leading_parts_are_prefixes() {
    let bt = Bigtable::connect().await;
    let ctx = context(1);
    let table = Bigtable::table_name("scan_comp");
    bt.create_table(&table, &["cf"]).await;
    exec(
        &ctx,
        &bt.create_sql(
            "events",
            "region VARCHAR NOT NULL, id BIGINT NOT NULL, day VARCHAR NOT NULL, n BIGINT",
            &table,
            &[("row_key", "region, id, day")],
        ),
    )
    .await;
    let written = insert(
        &ctx,
        "INSERT INTO events SELECT CASE WHEN v % 2 = 0 THEN 'eu' ELSE 'us' END, v, \
         '2024-06-' || lpad(CAST(v % 30 + 1 AS VARCHAR), 2, '0'), v AS n FROM generate_series(0, 299) AS t(v)",
    )
    .await;
    assert_eq!(written.count(), 300);
    let total = rows(&ctx, "SELECT count(*), sum(n) FROM events").await;
    assert_eq!(count(&total), 300);
    let b = rows(&ctx, "SELECT region, id, day, n FROM events WHERE region = 'eu' AND id = 2 AND day = '2024-06-03'").await;
    assert_eq!(strings(&b, 0), ["eu"]);
    assert_eq!(strings(&b, 1), ["2"]);
    assert_eq!(strings(&b, 2), ["2024-06-03"]);
    assert_eq!(strings(&b, 3), ["2"]);
    for (predicate, prefix_keys) in [
        ("region = 'eu'", "[['eu#'..'eu$')]"),
        (
            "region = 'us' AND id IN (1, 3)",
            "[['us#1#'..'us#1$'), ['us#3#'..'us#3$')]",
        ),
        (
            "region = 'eu' AND id = 4 AND day >= '2024-06-01'",
            "[['eu#4#2024-06-01'..'eu#4$')]",
        ),
    ] {
        let expected = rows(
            &ctx,
            &format!("SELECT count(*) FROM (SELECT * FROM events ORDER BY n) WHERE {predicate}"),
        )
        .await;
        let got = rows(
            &ctx,
            &format!("SELECT count(*) FROM events WHERE {predicate}"),
        )
        .await;
        assert_eq!(count(&got), count(&expected), "{predicate}");
        assert!(count(&got) > 0, "{predicate}");
        let plan = explain(&ctx, &format!("SELECT n FROM events WHERE {predicate}")).await;
        assert!(
            plan.contains(&format!("keys={prefix_keys}")),
            "{predicate}: {plan}"
        );
        assert!(!plan.contains("FilterExec"), "{predicate}: {plan}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_stream_resumes_after_the_last_row_with_none_twice_and_none_missed() {
    const ROWS: usize = 2_000;
    let bt = Bigtable::connect().await;
    let ctx = context(1);
    let table = users(&ctx, &bt, ROWS).await;
    let proxy = Proxy::start(&bt.host).await;
    exec(
        &ctx,
        &format!(
            "CREATE TABLE through_proxy (k VARCHAR NOT NULL, visits BIGINT, name VARCHAR) \
             WITH (connector = 'bigtable', emulator_host = '{}', table = '{table}', row_key = 'k')",
            proxy.host()
        ),
    )
    .await;
    // The connection closes after about a third of the answer.
    proxy.close_after_server_bytes(20_000);
    let df = ctx
        .sql("SELECT k, visits FROM through_proxy")
        .await
        .unwrap();
    let plan = df.create_physical_plan().await.unwrap();
    let batches = collect(plan.clone(), ctx.task_ctx())
        .await
        .expect("the scan resumes");
    assert_eq!(proxy.closes(), 1, "the fault happened");
    let keys = strings(&batches, 0);
    let mut sorted = keys.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), ROWS, "no row twice, none missed");
    assert_eq!(keys.len(), ROWS);
    let expected: Vec<String> = (0..ROWS).map(|v| format!("user-{v:04}")).collect();
    let mut expected_sorted = expected.clone();
    expected_sorted.sort();
    assert_eq!(sorted, expected_sorted);
    let visits = strings(&batches, 1);
    for (k, v) in keys.iter().zip(&visits) {
        let n: usize = k.trim_start_matches("user-").parse().unwrap();
        assert_eq!(v, &(n * 10).to_string());
    }
    let metrics = scan_metrics(&plan);
    assert!(metrics.0 >= 2, "a second ReadRows call: {metrics:?}");
    assert!(metrics.1 >= 1, "a resume: {metrics:?}");
}

/// What the null `ReadRows` server has done so far: `(ReadRows calls, rows sent)`.
fn null_reads(server: &gcp_sql::bench::null_server::NullServer) -> (u64, u64) {
    let details = server.details().expect("the read server keeps its counts");
    let reads = details
        .as_any()
        .downcast_ref::<gcp_sql::connectors::bigtable::null_read::Reads>()
        .expect("the read server's counts");
    (reads.read_rows_calls(), reads.rows_sent())
}

/// The scan against `serve-null --service bigtable-read` (a table of canned rows in memory):
/// every row read once with its values, and a key predicate costs the server exactly the rows
/// it names, counted on the server's side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_null_read_server_sends_every_row_once_and_a_key_range_only_its_rows() {
    use gcp_sql::bench::null_server::{FeedOptions, NullServer, NullServerOptions, NullService};
    const ROWS: u64 = 200_000;
    let server = NullServer::start(
        "127.0.0.1:0".parse().unwrap(),
        NullServerOptions {
            service: NullService::BigtableRead,
            latency: std::time::Duration::ZERO,
            feed: FeedOptions {
                messages: ROWS,
                ..FeedOptions::default()
            },
        },
    )
    .await
    .expect("the null ReadRows server starts");
    let ctx = context(2);
    exec(
        &ctx,
        &format!(
            "CREATE TABLE big (k VARCHAR NOT NULL, visits BIGINT, name VARCHAR) WITH ( \
             connector = 'bigtable', emulator_host = '{}', instance = 'projects/p/instances/i', \
             table = 'big', row_key = 'k', column_family = 'cf')",
            server.addr()
        ),
    )
    .await;
    let sum = |from: u64, to: u64| (from..to).map(|n| n as i64 * 10).sum::<i64>();
    let whole = rows(
        &ctx,
        "SELECT count(*), sum(visits), count(name), min(k), max(k) FROM big",
    )
    .await;
    let b = &whole[0];
    assert_eq!(
        b.column(0).as_primitive::<Int64Type>().value(0),
        ROWS as i64
    );
    assert_eq!(
        b.column(1).as_primitive::<Int64Type>().value(0),
        sum(0, ROWS)
    );
    assert_eq!(
        b.column(2).as_primitive::<Int64Type>().value(0),
        ROWS as i64
    );
    assert_eq!(strings(&whole, 3), ["user-0000000"]);
    assert_eq!(strings(&whole, 4), ["user-0199999"]);
    // Two partitions from the server's samples, each one call; every row sent once.
    assert_eq!(null_reads(&server), (2, ROWS));

    let before = null_reads(&server);
    let range = rows(
        &ctx,
        "SELECT count(*), sum(visits) FROM big WHERE k BETWEEN 'user-0100000' AND 'user-0100999'",
    )
    .await;
    assert_eq!(count(&range), 1000);
    assert_eq!(
        range[0].column(1).as_primitive::<Int64Type>().value(0),
        sum(100_000, 101_000)
    );
    let after = null_reads(&server);
    assert_eq!(after.1 - before.1, 1000, "rows sent for a 1,000-key range");
    assert_eq!(
        after.0 - before.0,
        1,
        "one ReadRows call for a range inside one partition"
    );

    let before = after;
    let prefix = rows(&ctx, "SELECT count(*) FROM big WHERE k LIKE 'user-00123%'").await;
    assert_eq!(count(&prefix), 100);
    assert_eq!(
        null_reads(&server).1 - before.1,
        100,
        "rows sent for a prefix"
    );

    let before = null_reads(&server);
    let points = rows(
        &ctx,
        "SELECT k, name, visits FROM big WHERE k IN ('user-0123456', 'user-0000007', 'user-9') \
         ORDER BY k",
    )
    .await;
    assert_eq!(strings(&points, 0), ["user-0000007", "user-0123456"]);
    assert_eq!(strings(&points, 1), ["name-7", "name-123456"]);
    let visits = points[0].column(2).as_primitive::<Int64Type>();
    assert_eq!((visits.value(0), visits.value(1)), (70, 1_234_560));
    assert_eq!(
        null_reads(&server).1 - before.1,
        2,
        "rows sent for two keys"
    );

    // An exact LIMIT is the request's rows limit: each partition stops at it.
    let before = null_reads(&server);
    let limited = rows(&ctx, "SELECT k FROM big LIMIT 5").await;
    assert_eq!(limited.iter().map(|b| b.num_rows()).sum::<usize>(), 5);
    let sent = null_reads(&server).1 - before.1;
    assert!(
        sent <= 10,
        "{sent} rows sent for LIMIT 5 over two partitions"
    );
}

/// `(read_rows_calls, resumes)` of the plan's scan.
fn scan_metrics(plan: &Arc<dyn ExecutionPlan>) -> (usize, usize) {
    if plan.name() == "BigtableScanExec" {
        let m = plan.metrics().unwrap();
        return (
            m.sum_by_name("read_rows_calls").map_or(0, |v| v.as_usize()),
            m.sum_by_name("resumes").map_or(0, |v| v.as_usize()),
        );
    }
    plan.children()
        .into_iter()
        .map(scan_metrics)
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scan_is_split_by_sampled_row_keys_into_target_partitions() {
    const ROWS: i64 = 10_000;
    let bt = Bigtable::connect().await;
    let ctx = context(4);
    let table = Bigtable::table_name("scan_split");
    bt.create_table(&table, &["cf"]).await;
    exec(
        &ctx,
        &bt.create_sql(
            "wide",
            "k VARCHAR NOT NULL, visits BIGINT, pad VARCHAR",
            &table,
            &[("row_key", "k"), ("batch_element_count_threshold", "1000")],
        ),
    )
    .await;
    // About 3 MB: three partitions of at least 1 MiB (MIN_PARTITION_BYTES).
    let written = insert(
        &ctx,
        &format!(
            "INSERT INTO wide SELECT 'user-' || lpad(CAST(v AS VARCHAR), 5, '0'), v * 10, \
             repeat('x', 300) FROM generate_series(0, {}) AS t(v)",
            ROWS - 1
        ),
    )
    .await;
    assert_eq!(written.count(), ROWS as u64);
    let plan = explain(&ctx, "SELECT k FROM wide").await;
    // The emulator samples keys of a table this size: the scan is split at some of them.
    assert!(
        plan.contains("keys=all") && plan.contains(" split at ['user-"),
        "{plan}"
    );
    let b = rows(
        &ctx,
        "SELECT count(*), count(DISTINCT k), sum(visits) FROM wide",
    )
    .await;
    assert_eq!(count(&b), ROWS);
    assert_eq!(b[0].column(1).as_primitive::<Int64Type>().value(0), ROWS);
    assert_eq!(
        b[0].column(2).as_primitive::<Int64Type>().value(0),
        (0..ROWS).map(|v| v * 10).sum::<i64>()
    );
    // A small range is read by one stream.
    let plan = explain(
        &ctx,
        "SELECT k FROM wide WHERE k BETWEEN 'user-05000' AND 'user-05099'",
    )
    .await;
    assert!(plan.contains("partitions=1"), "{plan}");
    let b = rows(
        &ctx,
        "SELECT count(*) FROM wide WHERE k BETWEEN 'user-05000' AND 'user-05099'",
    )
    .await;
    assert_eq!(count(&b), 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_selects_get_datafusions_errors_and_a_per_row_table_cannot_be_read() {
    let bt = Bigtable::connect().await;
    let ctx = gcp_sql::sql::new_context();
    users(&ctx, &bt, 3).await;
    let e = ctx
        .sql("SELECT nosuch FROM users")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("nosuch"), "{e}");
    exec(
        &ctx,
        &format!(
            "CREATE TABLE routed (k VARCHAR NOT NULL, t VARCHAR NOT NULL, v BIGINT) WITH \
             (connector = 'bigtable', emulator_host = '{}', instance = 'projects/sinktest/instances/main', \
             table_column = 't', row_key = 'k')",
            bt.host
        ),
    )
    .await;
    let e = ctx
        .sql("SELECT * FROM routed")
        .await
        .unwrap()
        .collect()
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    let e2 = if e.is_empty() {
        ctx.sql("SELECT * FROM routed")
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    } else {
        e
    };
    assert!(e2.contains("table_column"), "{e2}");
}

/// Every type the sink writes (docs/bigtable.md's table) reads back as the same value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_type_the_sink_writes_reads_back_as_the_same_value() {
    let bt = Bigtable::connect().await;
    let ctx = context(1);
    let table = Bigtable::table_name("scan_types");
    bt.create_table(&table, &["cf", "st"]).await;
    let item = Arc::new(Field::new("item", DataType::Int64, true));
    let map = {
        let mut b = arrow::array::MapBuilder::new(
            None,
            arrow::array::StringBuilder::new(),
            arrow::array::Int64Builder::new(),
        );
        b.keys().append_value("a");
        b.values().append_value(1);
        b.keys().append_value("b");
        b.values().append_null();
        b.append(true).unwrap();
        b.append(false).unwrap();
        b.append(true).unwrap();
        b.finish()
    };
    let st_fields = Fields::from(vec![
        Field::new("a", DataType::Int32, true),
        Field::new("b", DataType::Utf8, true),
        Field::new(
            "inner",
            DataType::Struct(Fields::from(vec![Field::new("x", DataType::Int64, true)])),
            true,
        ),
    ]);
    let fields = vec![
        Field::new("id", DataType::Utf8, false),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Millisecond, None),
            false,
        ),
        Field::new("i8", DataType::Int8, true),
        Field::new("i16", DataType::Int16, true),
        Field::new("i32", DataType::Int32, true),
        Field::new("i64", DataType::Int64, true),
        Field::new("u8", DataType::UInt8, true),
        Field::new("u16", DataType::UInt16, true),
        Field::new("u32", DataType::UInt32, true),
        Field::new("u64", DataType::UInt64, true),
        Field::new("f32", DataType::Float32, true),
        Field::new("f64", DataType::Float64, true),
        Field::new("b", DataType::Boolean, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("ls", DataType::LargeUtf8, true),
        Field::new("sv", DataType::Utf8View, true),
        Field::new("bin", DataType::Binary, true),
        Field::new("lbin", DataType::LargeBinary, true),
        Field::new("fbin", DataType::FixedSizeBinary(3), true),
        Field::new("d32", DataType::Date32, true),
        Field::new("d64", DataType::Date64, true),
        Field::new("t32", DataType::Time32(TimeUnit::Second), true),
        Field::new("t64", DataType::Time64(TimeUnit::Microsecond), true),
        Field::new(
            "tsn",
            DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
            true,
        ),
        Field::new("dur", DataType::Duration(TimeUnit::Millisecond), true),
        Field::new("dec", DataType::Decimal128(12, 3), true),
        Field::new(
            "iv",
            DataType::Interval(arrow::datatypes::IntervalUnit::MonthDayNano),
            true,
        ),
        Field::new("list", DataType::List(item.clone()), true),
        Field::new("st", DataType::Struct(st_fields.clone()), true),
        Field::new("f16", DataType::Float16, true),
        Field::new("bv", DataType::BinaryView, true),
        Field::new(
            "dict",
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
            true,
        ),
        Field::new("m", map.data_type().clone(), true),
    ];
    let schema = Arc::new(Schema::new(fields));
    let cast = |a: ArrayRef, to: &DataType| arrow::compute::cast(&a, to).unwrap();
    let inner = StructArray::from(vec![(
        Arc::new(Field::new("x", DataType::Int64, true)),
        Arc::new(Int64Array::from(vec![Some(7), None, Some(-1)])) as ArrayRef,
    )]);
    let st = StructArray::try_new(
        st_fields.clone(),
        vec![
            Arc::new(Int32Array::from(vec![Some(1), None, Some(3)])),
            Arc::new(StringArray::from(vec![Some("x"), None, None])),
            Arc::new(inner),
        ],
        Some(vec![true, false, true].into()),
    )
    .unwrap();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(vec!["r0", "r1", "r2"])),
        Arc::new(TimestampMillisecondArray::from(vec![
            1_700_000_000_123,
            1_700_000_001_000,
            86_400_000,
        ])),
        Arc::new(Int8Array::from(vec![Some(i8::MIN), None, Some(i8::MAX)])),
        Arc::new(Int16Array::from(vec![Some(i16::MIN), None, Some(5)])),
        Arc::new(Int32Array::from(vec![Some(i32::MIN), None, Some(-5)])),
        Arc::new(Int64Array::from(vec![
            Some(i64::MIN),
            Some(0),
            Some(i64::MAX),
        ])),
        Arc::new(UInt8Array::from(vec![Some(u8::MAX), None, Some(0)])),
        Arc::new(UInt16Array::from(vec![Some(u16::MAX), None, Some(1)])),
        Arc::new(UInt32Array::from(vec![Some(u32::MAX), None, Some(2)])),
        Arc::new(UInt64Array::from(vec![Some(u64::MAX), None, Some(3)])),
        Arc::new(Float32Array::from(vec![
            Some(1.5f32),
            None,
            Some(f32::MIN_POSITIVE),
        ])),
        Arc::new(Float64Array::from(vec![Some(-0.1), None, Some(f64::MAX)])),
        Arc::new(BooleanArray::from(vec![Some(true), None, Some(false)])),
        Arc::new(StringArray::from(vec![Some("héllo"), None, Some("")])),
        Arc::new(LargeStringArray::from(vec![Some("large"), None, Some("x")])),
        Arc::new(StringViewArray::from(vec![
            Some("a view string longer than twelve"),
            None,
            Some("v"),
        ])),
        Arc::new(BinaryArray::from(vec![
            Some(&[0u8, 255, 1][..]),
            None,
            Some(&b""[..]),
        ])),
        Arc::new(LargeBinaryArray::from(vec![
            Some(&b"lb"[..]),
            None,
            Some(&[9u8][..]),
        ])),
        Arc::new(
            FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                vec![Some(vec![1u8, 2, 3]), None, Some(vec![0u8, 0, 0])].into_iter(),
                3,
            )
            .unwrap(),
        ),
        Arc::new(Date32Array::from(vec![Some(19_875), None, Some(-1)])),
        Arc::new(Date64Array::from(vec![
            Some(1_717_200_000_000),
            None,
            Some(0),
        ])),
        Arc::new(Time32SecondArray::from(vec![
            Some(3_600),
            None,
            Some(86_399),
        ])),
        Arc::new(Time64MicrosecondArray::from(vec![
            Some(1),
            None,
            Some(86_399_999_999),
        ])),
        Arc::new(
            TimestampNanosecondArray::from(vec![Some(1_700_000_000_123_456_789), None, Some(-5)])
                .with_timezone("UTC"),
        ),
        Arc::new(DurationMillisecondArray::from(vec![
            Some(-1_500),
            None,
            Some(0),
        ])),
        Arc::new(
            Decimal128Array::from(vec![Some(123_450), None, Some(-1)])
                .with_precision_and_scale(12, 3)
                .unwrap(),
        ),
        Arc::new(IntervalMonthDayNanoArray::from(vec![
            Some(IntervalMonthDayNano::new(1, 2, 3_000_000_005)),
            None,
            Some(IntervalMonthDayNano::new(-14, 0, -1_500_000_000)),
        ])),
        Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>(vec![
            Some(vec![Some(1), None, Some(3)]),
            None,
            Some(vec![]),
        ])),
        Arc::new(st),
        cast(
            Arc::new(Float64Array::from(vec![Some(0.5), None, Some(-2.0)])),
            &DataType::Float16,
        ),
        cast(
            Arc::new(BinaryArray::from(vec![
                Some(&b"view bytes, longer than 12"[..]),
                None,
                Some(&b"v"[..]),
            ])),
            &DataType::BinaryView,
        ),
        cast(
            Arc::new(StringArray::from(vec![Some("red"), None, Some("red")])),
            &DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
        ),
        Arc::new(map),
    ];
    let source = RecordBatch::try_new(schema.clone(), columns).unwrap();
    ctx.register_table(
        "src",
        Arc::new(MemTable::try_new(schema.clone(), vec![vec![source.clone()]]).unwrap()),
    )
    .unwrap();
    register(
        &ctx,
        "typed",
        schema.clone(),
        &[
            ("table", &table),
            ("emulator_host", &bt.host),
            ("row_key", "id"),
            ("timestamp_column", "ts"),
        ],
    );
    assert_eq!(
        insert(&ctx, "INSERT INTO typed SELECT * FROM src")
            .await
            .count(),
        3
    );
    let back = rows(&ctx, "SELECT * FROM typed ORDER BY id").await;
    let back = arrow::compute::concat_batches(&schema, &back).unwrap();
    assert_eq!(back.num_rows(), 3);
    for (i, field) in schema.fields().iter().enumerate() {
        assert_eq!(
            back.column(i).as_ref(),
            source.column(i).as_ref(),
            "column {} ({})",
            field.name(),
            field.data_type()
        );
    }
    // SQL types through SQL: the same values compare equal in a join of the two.
    let same = rows(
        &ctx,
        "SELECT count(*) FROM typed t JOIN src s ON t.id = s.id AND (t.i64 IS NOT DISTINCT FROM s.i64) \
         AND (t.dec IS NOT DISTINCT FROM s.dec) AND (t.tsn IS NOT DISTINCT FROM s.tsn) \
         AND (t.s IS NOT DISTINCT FROM s.s)",
    )
    .await;
    assert_eq!(count(&same), 3);
}

/// The benchmark of docs/benchmarks.md ("Reading Bigtable"): `BENCH_ROWS` rows (default
/// 1,000,000) written by the sink, then a full count, a range of 1,000 keys and a prefix, each
/// checked exactly; the rows per second of a full scan of every column, and, when
/// `GCP_SQL_BENCH_PYTHON` names a Python with google-cloud-bigtable, of Google's Python client
/// reading the same table (`scripts/bigtable_read_python.py`).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a benchmark: a million rows take minutes; run it by name, see docs/benchmarks.md"]
async fn bench_a_million_rows_read_back_by_count_range_and_prefix() {
    use futures::StreamExt;
    use std::time::Instant;
    let n: usize = std::env::var("BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let bt = Bigtable::connect().await;
    let ctx = gcp_sql::sql::new_context();
    let table = Bigtable::table_name("scan_bench");
    bt.create_table(&table, &["cf"]).await;
    exec(
        &ctx,
        &bt.create_sql(
            "big",
            "k VARCHAR NOT NULL, visits BIGINT, name VARCHAR",
            &table,
            &[
                ("row_key", "k"),
                ("batch_element_count_threshold", "1000"),
                ("max_in_flight_entries", "20000"),
            ],
        ),
    )
    .await;
    let started = Instant::now();
    let written = insert(
        &ctx,
        &format!(
            "INSERT INTO big SELECT 'user-' || lpad(CAST(v AS VARCHAR), 7, '0'), v * 10, \
             'name-' || CAST(v AS VARCHAR) FROM generate_series(0, {}) AS t(v)",
            n - 1
        ),
    )
    .await;
    assert_eq!(written.count(), n as u64);
    println!(
        "write: rows={n} seconds={:.2}",
        started.elapsed().as_secs_f64()
    );

    let started = Instant::now();
    let b = rows(&ctx, "SELECT count(*) FROM big").await;
    let seconds = started.elapsed().as_secs_f64();
    assert_eq!(count(&b), n as i64);
    println!(
        "count(*): rows={n} seconds={seconds:.2} rows_per_s={:.0}",
        n as f64 / seconds
    );

    let emulator = gcp_sql::emulators::shared(gcp_sql::emulators::EmulatorKind::Bigtable)
        .await
        .pid();
    let cpu_before = (
        cpu_ticks(|pid, _| pid == std::process::id()),
        cpu_ticks(|_, group| group == emulator),
    );
    let started = Instant::now();
    let df = ctx.sql("SELECT k, visits, name FROM big").await.unwrap();
    let plan = df.create_physical_plan().await.unwrap();
    let partitions = plan.properties().partitioning.partition_count();
    let mut stream = datafusion::physical_plan::execute_stream(plan, ctx.task_ctx()).unwrap();
    let (mut seen, mut sum) = (0usize, 0i64);
    while let Some(batch) = stream.next().await {
        let batch = batch.unwrap();
        seen += batch.num_rows();
        sum += arrow::compute::sum(batch.column(1).as_primitive::<Int64Type>()).unwrap_or(0);
    }
    let seconds = started.elapsed().as_secs_f64();
    assert_eq!(seen, n);
    assert_eq!(sum, (0..n as i64).map(|v| v * 10).sum::<i64>());
    println!(
        "SELECT k, visits, name: rows={seen} seconds={seconds:.2} rows_per_s={:.0} (plan partitions {partitions})",
        n as f64 / seconds
    );
    let cpu_after = (
        cpu_ticks(|pid, _| pid == std::process::id()),
        cpu_ticks(|_, group| group == emulator),
    );
    println!(
        "CPU seconds during the scan: this process {:.1}, the emulator {:.1}",
        (cpu_after.0 - cpu_before.0) as f64 / 100.0,
        (cpu_after.1 - cpu_before.1) as f64 / 100.0
    );

    let lo = n / 2;
    let range = format!("k BETWEEN 'user-{lo:07}' AND 'user-{:07}'", lo + 999);
    let df = ctx
        .sql(&format!(
            "SELECT count(*), sum(visits), min(k), max(k) FROM big WHERE {range}"
        ))
        .await
        .unwrap();
    let plan = df.create_physical_plan().await.unwrap();
    let b = collect(plan.clone(), ctx.task_ctx()).await.unwrap();
    assert_eq!(count(&b), 1_000);
    assert_eq!(
        b[0].column(1).as_primitive::<Int64Type>().value(0),
        (lo as i64..lo as i64 + 1_000).map(|v| v * 10).sum::<i64>()
    );
    assert_eq!(strings(&b, 2), [format!("user-{lo:07}")]);
    let (calls, rows_read) = scan_counts(&plan);
    println!("range of 1,000 keys: ReadRows calls={calls} rows sent by the server={rows_read}");
    assert_eq!(rows_read, 1_000);

    let prefix = if n >= 1_000_000 {
        "user-012"
    } else {
        "user-0012"
    };
    let expected: Vec<i64> = (0..n as i64)
        .filter(|v| format!("user-{v:07}").starts_with(prefix))
        .collect();
    let b = rows(
        &ctx,
        &format!("SELECT count(*), sum(visits) FROM big WHERE k LIKE '{prefix}%'"),
    )
    .await;
    assert_eq!(count(&b), expected.len() as i64);
    assert_eq!(
        b[0].column(1).as_primitive::<Int64Type>().value(0),
        expected.iter().map(|v| v * 10).sum::<i64>()
    );
    println!("prefix '{prefix}': rows={}", expected.len());

    if let Ok(python) = std::env::var("GCP_SQL_BENCH_PYTHON") {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/bigtable_read_python.py"
        );
        let out = std::process::Command::new(python)
            .arg(script)
            .arg(&table)
            .env("BIGTABLE_EMULATOR_HOST", &bt.host)
            .output()
            .expect("python runs");
        let text = String::from_utf8_lossy(&out.stdout);
        println!("{text}{}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains(&format!("rows={n}")), "{text}");
    }
}

/// CPU ticks (user + system, 1/100 s) of the processes `pick(pid, process group)` selects.
fn cpu_ticks(pick: impl Fn(u32, u32) -> bool) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // Fields after the command's closing parenthesis: state ppid pgrp ... utime(14) stime(15).
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let group: u32 = fields[2].parse().unwrap_or(0);
        if pick(pid, group) {
            total +=
                fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0);
        }
    }
    total
}

/// `(read_rows_calls, rows_read)` of the plan's scan.
fn scan_counts(plan: &Arc<dyn ExecutionPlan>) -> (usize, usize) {
    if plan.name() == "BigtableScanExec" {
        let m = plan.metrics().unwrap();
        return (
            m.sum_by_name("read_rows_calls").map_or(0, |v| v.as_usize()),
            m.sum_by_name("rows_read").map_or(0, |v| v.as_usize()),
        );
    }
    plan.children()
        .into_iter()
        .map(scan_counts)
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}
