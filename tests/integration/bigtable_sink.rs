//! End-to-end tests of the Bigtable sink.
//!
//! The first part runs against the real Bigtable emulator (`cbtemulator`, started once per test
//! binary by `gcp_sql::emulators::shared`): tables are created with the generated admin client,
//! rows are written with `INSERT INTO ... SELECT`, and read back with `ReadRows`, cell by cell
//! (family, qualifier, value bytes, timestamp). Each test uses its own tables, so tests run in
//! parallel. A missing emulator fails every test with the install step.
//!
//! The second part runs against a scripted fake `google.bigtable.v2.Bigtable/MutateRows`
//! (`gcp_sql::testing::FakeServer`), for what the emulator cannot produce: per-entry transient
//! failures, a refused entry inside a batch, a service that refuses everything, a stall.
//! Durations are small; nothing asserts wall-clock time.
//!
//! Run: `cargo test --test integration bigtable_sink::`.

use std::sync::Arc;
use std::time::Duration;

use crate::support::bigtable::{Bigtable, Cell, cell};
use crate::support::{Insert, exec, insert};
use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef};
use datafusion::prelude::SessionContext;
use gcloud_sdk::google::bigtable::v2::{
    MutateRowsRequest, MutateRowsResponse, mutate_rows_response,
};
use gcp_sql::connectors::SinkConnector;
use gcp_sql::connectors::bigtable::writer::BigtableSink;
use gcp_sql::core::RetrySettings;
use gcp_sql::core::metrics::names;
use gcp_sql::options::RawOptions;
use gcp_sql::sql::SinkTable;
use gcp_sql::testing::{FakeServer, Reply, Script};
use tonic::Code;

const PROJECT: &str = "sinktest";

fn be(v: i64) -> Vec<u8> {
    v.to_be_bytes().to_vec()
}

/// Registers a sink built through the Rust API (for schemas SQL cannot declare, or budgets).
fn register(ctx: &SessionContext, name: &str, sink: BigtableSink) {
    let sink: Arc<dyn SinkConnector> = Arc::new(sink);
    ctx.register_table(name, Arc::new(SinkTable::new(name, sink)))
        .expect("register the sink table");
}

fn sink(schema: SchemaRef, options: &[(&str, &str)]) -> BigtableSink {
    let raw = RawOptions::from_pairs(options.iter().map(|(k, v)| (k.to_string(), v.to_string())))
        .expect("option pairs");
    BigtableSink::try_new(schema, None, &raw)
        .unwrap_or_else(|e| panic!("cannot build the sink: {e}"))
}

// --- against the emulator ----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insert_select_writes_every_cell_with_its_family_qualifier_value_and_version() {
    const ROWS: i64 = 3_000;
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("bulk");
    bt.create_table(&table, &["cf"]).await;
    let ctx = gcp_sql::sql::new_context();
    exec(
        &ctx,
        &bt.create_sql(
            "bulk",
            "id BIGINT, name VARCHAR, score DOUBLE, flag BOOLEAN, n INT, ts TIMESTAMP",
            &table,
            &[
                ("row_key", "id"),
                ("timestamp_column", "ts"),
                ("batch_element_count_threshold", "500"),
            ],
        ),
    )
    .await;
    let done = insert(
        &ctx,
        &format!(
            "INSERT INTO bulk SELECT value, concat('name-', CAST(value AS VARCHAR)), \
               CAST(value AS DOUBLE) / 4, value % 2 = 0, CAST(value * -3 AS INT), \
               CAST(to_timestamp_micros(1700000000000000 + value * 1000 + 7) AS TIMESTAMP) \
             FROM generate_series(1, {ROWS})"
        ),
    )
    .await;
    assert_eq!(done.count(), ROWS as u64);
    assert_eq!(done.metric(names::RECORDS_ACKED), ROWS as usize);
    assert_eq!(done.metric(names::SEND_ERRORS), 0);
    // 500 entries per request at most.
    assert!(done.metric(names::SEND_RPCS) >= (ROWS / 500) as usize);

    let rows = bt.read(&table).await;
    assert_eq!(rows.len(), ROWS as usize);
    for id in 1..=ROWS {
        // The sub-millisecond 7 µs are truncated away.
        let ts = 1_700_000_000_000_000 + id * 1000;
        let mut expected = vec![
            cell("cf", "name", ts, format!("name-{id}")),
            cell("cf", "score", ts, (id as f64 / 4.0).to_be_bytes().to_vec()),
            cell("cf", "flag", ts, vec![u8::from(id % 2 == 0)]),
            cell("cf", "n", ts, be(id * -3)),
        ];
        expected.sort();
        assert_eq!(rows[id.to_string().as_bytes()], expected, "row {id}");
    }
}

#[tokio::test]
async fn composite_key_and_struct_column_family_land_as_declared() {
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("struct");
    bt.create_table(&table, &["d", "stats"]).await;
    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("user", DataType::Utf8, true),
        Field::new("day", DataType::Int64, true),
        Field::new("note", DataType::Utf8, true),
        Field::new(
            "stats",
            DataType::Struct(Fields::from(vec![
                Field::new("clicks", DataType::Int64, true),
                Field::new("label", DataType::Utf8, true),
            ])),
            true,
        ),
        Field::new("at", DataType::Int64, true),
    ]));
    let ctx = gcp_sql::sql::new_context();
    register(
        &ctx,
        "events",
        sink(
            schema,
            &[
                ("emulator_host", &bt.host),
                ("table", &table),
                ("row_key", "user, day"),
                ("row_key_delimiter", "#"),
                ("column_family", "d"),
                ("timestamp_column", "at"),
            ],
        ),
    );
    let done = insert(
        &ctx,
        "INSERT INTO events SELECT concat('u', CAST(value AS VARCHAR)), value * 10, 'hi', \
           named_struct('clicks', value * 2, 'label', CASE WHEN value = 2 THEN NULL ELSE 'l' END), \
           5000 + value \
         FROM generate_series(1, 3)",
    )
    .await;
    assert_eq!(done.count(), 3);
    let rows = bt.read(&table).await;
    let keys: Vec<&[u8]> = rows.keys().map(|k| k.as_slice()).collect();
    assert_eq!(keys, vec![&b"u1#10"[..], b"u2#20", b"u3#30"]);
    let mut expected = vec![
        cell("d", "note", 5000, "hi"),
        cell("stats", "clicks", 5000, be(4)),
    ];
    expected.sort();
    // Row 2: the null label under 'ignore' writes no cell; 5002 µs is truncated to 5000.
    assert_eq!(rows[&b"u2#20"[..]], expected);
    assert!(rows[&b"u1#10"[..]].contains(&cell("stats", "label", 5000, "l")));
}

#[tokio::test]
async fn null_handling_ignore_keeps_old_cells_and_delete_removes_them() {
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("nulls");
    bt.create_table(&table, &["cf"]).await;
    let ctx = gcp_sql::sql::new_context();
    for (name, handling) in [
        ("prefill", "ignore"),
        ("ignoring", "ignore"),
        ("deleting", "delete"),
    ] {
        exec(
            &ctx,
            &bt.create_sql(
                name,
                "id VARCHAR, a VARCHAR, b VARCHAR",
                &table,
                &[("row_key", "id"), ("null_handling", handling)],
            ),
        )
        .await;
    }
    insert(
        &ctx,
        "INSERT INTO prefill VALUES ('r1', 'a0', 'b0'), ('r2', 'a0', 'b0')",
    )
    .await
    .count();
    let ignored = insert(&ctx, "INSERT INTO ignoring VALUES ('r1', 'a1', NULL)").await;
    assert_eq!(ignored.count(), 1);
    let deleted = insert(&ctx, "INSERT INTO deleting VALUES ('r2', 'a1', NULL)").await;
    assert_eq!(deleted.count(), 1);
    let rows = bt.read(&table).await;
    let qualifiers = |key: &[u8]| -> Vec<(String, Vec<u8>)> {
        rows[key]
            .iter()
            .map(|c| {
                (
                    String::from_utf8(c.qualifier.clone()).unwrap(),
                    c.value.clone(),
                )
            })
            .collect()
    };
    // r1: 'b' kept its old version; 'a' has two versions.
    let r1 = qualifiers(b"r1");
    assert!(r1.contains(&("b".into(), b"b0".to_vec())), "{r1:?}");
    assert_eq!(r1.iter().filter(|(q, _)| q == "a").count(), 2);
    // r2: 'b' was deleted.
    let r2 = qualifiers(b"r2");
    assert!(r2.iter().all(|(q, _)| q != "b"), "{r2:?}");
    assert_eq!(r2.iter().filter(|(q, _)| q == "a").count(), 2);

    // All null under 'ignore': a serializer rejection, the statement fails naming the row.
    let refused = insert(&ctx, "INSERT INTO ignoring VALUES ('r3', NULL, NULL)").await;
    assert!(
        refused.error().contains("writes no cell"),
        "{}",
        refused.error()
    );
}

#[tokio::test]
async fn table_column_routes_each_row_to_its_table() {
    let bt = Bigtable::connect().await;
    let (t1, t2) = (
        Bigtable::table_name("route-a"),
        Bigtable::table_name("route-b"),
    );
    bt.create_table(&t1, &["cf"]).await;
    bt.create_table(&t2, &["cf"]).await;
    let short1 = t1.rsplit('/').next().unwrap().to_string();
    let ctx = gcp_sql::sql::new_context();
    exec(
        &ctx,
        &format!(
            "CREATE TABLE routed (id BIGINT, dest VARCHAR, v BIGINT) WITH (connector = 'bigtable', \
             emulator_host = '{}', project = '{PROJECT}', instance = 'main', table_column = 'dest', \
             row_key = 'id', per_destination_metrics = 'true')",
            bt.host
        ),
    )
    .await;
    let done = insert(
        &ctx,
        &format!(
            "INSERT INTO routed SELECT value AS id, CASE WHEN value % 2 = 0 THEN '{short1}' ELSE '{t2}' END AS dest, value AS v \
             FROM generate_series(1, 100)"
        ),
    )
    .await;
    assert_eq!(done.count(), 100);
    assert_eq!(done.metric(names::RECORDS_SENT_BY_DESTINATION), 100);
    let even = bt.read(&t1).await;
    let odd = bt.read(&t2).await;
    assert_eq!(even.len(), 50);
    assert_eq!(odd.len(), 50);
    assert!(
        even.keys()
            .all(|k| std::str::from_utf8(k).unwrap().parse::<i64>().unwrap() % 2 == 0)
    );
    // The routing column is not a cell.
    assert!(
        odd.values()
            .all(|cells| cells.len() == 1 && cells[0].qualifier == b"v")
    );
}

#[tokio::test]
async fn a_missing_table_is_created_with_the_mapping_families_when_asked() {
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("created");
    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("v", DataType::Int64, true),
        Field::new(
            "meta",
            DataType::Struct(Fields::from(vec![Field::new("k", DataType::Utf8, true)])),
            true,
        ),
    ]));
    let ctx = gcp_sql::sql::new_context();
    register(
        &ctx,
        "auto",
        sink(
            schema,
            &[
                ("emulator_host", &bt.host),
                ("table", &table),
                ("row_key", "id"),
                ("auto_create_table", "true"),
                ("recovery_initial_backoff", "5ms"),
                ("recovery_max_backoff", "20ms"),
            ],
        ),
    );
    let done = insert(
        &ctx,
        "INSERT INTO auto SELECT CAST(value AS VARCHAR) AS id, value AS v, named_struct('k', 'x') FROM generate_series(1, 20)",
    )
    .await;
    assert_eq!(done.count(), 20);
    assert_eq!(done.metric(names::RESOURCES_CREATED), 1);
    assert_eq!(
        done.errors_with_code("NOT_FOUND"),
        done.metric(names::SEND_ERRORS)
    );
    let rows = bt.read(&table).await;
    assert_eq!(rows.len(), 20);
    let families: Vec<&str> = rows[&b"7"[..]].iter().map(|c| c.family.as_str()).collect();
    assert_eq!(families, vec!["cf", "meta"]);
}

#[tokio::test]
async fn a_family_missing_from_an_existing_table_is_added_when_asked() {
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("family");
    bt.create_table(&table, &["cf"]).await;
    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("v", DataType::Int64, true),
        Field::new(
            "extra",
            DataType::Struct(Fields::from(vec![Field::new("k", DataType::Utf8, true)])),
            true,
        ),
    ]));
    let ctx = gcp_sql::sql::new_context();
    register(
        &ctx,
        "fam",
        sink(
            schema,
            &[
                ("emulator_host", &bt.host),
                ("table", &table),
                ("row_key", "id"),
                ("auto_create_table", "true"),
                ("recovery_initial_backoff", "5ms"),
                ("recovery_max_backoff", "20ms"),
            ],
        ),
    );
    let done = insert(
        &ctx,
        "INSERT INTO fam SELECT CAST(value AS VARCHAR) AS id, value AS v, named_struct('k', 'x') FROM generate_series(1, 5)",
    )
    .await;
    assert_eq!(done.count(), 5);
    // The emulator reports the unknown family per entry (INTERNAL); the family was added.
    assert_eq!(done.metric(names::RESOURCES_CREATED), 1);
    let rows = bt.read(&table).await;
    assert!(rows[&b"3"[..]].contains(&cell_any_ts(&rows[&b"3"[..]], "extra", "k", "x")));
}

/// The cell of `family:qualifier` with `value`, at whatever version it was written.
fn cell_any_ts(cells: &[Cell], family: &str, qualifier: &str, value: &str) -> Cell {
    let ts = cells
        .iter()
        .find(|c| c.family == family)
        .map_or(-1, |c| c.timestamp);
    cell(family, qualifier, ts, value)
}

#[tokio::test]
async fn replaying_an_insert_with_a_timestamp_column_rewrites_the_same_versions() {
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("replay");
    bt.create_table(&table, &["cf"]).await;
    let ctx = gcp_sql::sql::new_context();
    exec(
        &ctx,
        &bt.create_sql(
            "replayed",
            "id BIGINT, v VARCHAR, ts BIGINT",
            &table,
            &[("row_key", "id"), ("timestamp_column", "ts")],
        ),
    )
    .await;
    let statement = "INSERT INTO replayed SELECT value, concat('v', CAST(value AS VARCHAR)), 1000000 + value * 1000 \
                     FROM generate_series(1, 200)";
    assert_eq!(insert(&ctx, statement).await.count(), 200);
    let first = bt.read(&table).await;
    assert_eq!(insert(&ctx, statement).await.count(), 200);
    let second = bt.read(&table).await;
    assert_eq!(first, second, "same cells and the same number of versions");
    assert!(second.values().all(|cells| cells.len() == 1));
}

#[tokio::test]
async fn a_missing_table_without_auto_create_fails_naming_not_found_and_the_table() {
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("absent");
    let ctx = gcp_sql::sql::new_context();
    exec(
        &ctx,
        &bt.create_sql(
            "absent",
            "id BIGINT, v BIGINT",
            &table,
            &[("row_key", "id")],
        ),
    )
    .await;
    let done = insert(&ctx, "INSERT INTO absent VALUES (1, 2)").await;
    let error = done.error();
    assert!(error.contains("NOT_FOUND"), "{error}");
    assert!(error.contains(&table), "{error}");
    assert_eq!(done.metric(names::RESOURCES_CREATED), 0);
}

// --- against the fake server --------------------------------------------------------------------

const MUTATE_ROWS: &str = "/google.bigtable.v2.Bigtable/MutateRows";
pub(crate) const FAKE_TABLE: &str = "projects/fake/instances/i/tables/t";

type MutateScript = Script<MutateRowsRequest, Vec<MutateRowsResponse>>;

pub(crate) struct FakeBigtable {
    server: FakeServer,
    script: MutateScript,
}

impl FakeBigtable {
    /// A fake whose calls, once the queued replies are used, are answered entry by entry by
    /// `verdict(row_key)` (`Code::Ok` applies the entry).
    pub(crate) async fn start(verdict: impl Fn(&[u8]) -> Code + Send + Sync + 'static) -> Self {
        let script: MutateScript = Script::new();
        script.fallback(move |request| Reply::Ok(vec![respond(request, &verdict)]));
        let server = FakeServer::builder()
            .server_streaming(MUTATE_ROWS, script.clone())
            .start()
            .await
            .expect("start the fake Bigtable");
        FakeBigtable { server, script }
    }

    pub(crate) fn host(&self) -> String {
        self.server.addr().to_string()
    }

    /// Row keys of every request, in order.
    pub(crate) fn requests(&self) -> Vec<Vec<String>> {
        self.script
            .requests()
            .iter()
            .map(|r| {
                r.entries
                    .iter()
                    .map(|e| String::from_utf8(e.row_key.clone()).unwrap())
                    .collect()
            })
            .collect()
    }
}

fn respond(request: &MutateRowsRequest, verdict: &dyn Fn(&[u8]) -> Code) -> MutateRowsResponse {
    MutateRowsResponse {
        entries: request
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let code = verdict(&e.row_key);
                mutate_rows_response::Entry {
                    index: i as i64,
                    status: Some(gcloud_sdk::google::rpc::Status {
                        code: code as i32,
                        message: if code == Code::Ok {
                            String::new()
                        } else {
                            format!("scripted {code:?}")
                        },
                        details: vec![],
                    }),
                }
            })
            .collect(),
        rate_limit_info: None,
    }
}

/// Declares `t (id VARCHAR, v BIGINT)` on the fake and inserts `k1..=k{rows}`.
pub(crate) async fn insert_on_fake(
    fake: &FakeBigtable,
    rows: u32,
    options: &[(&str, &str)],
    progress: Option<Duration>,
) -> Insert {
    insert_on_fake_with(fake, rows, options, progress, None).await
}

/// [`insert_on_fake`] with the `MutateRows` retry timing replaced (`retry`), for a budget a
/// test can spend.
async fn insert_on_fake_with(
    fake: &FakeBigtable,
    rows: u32,
    options: &[(&str, &str)],
    progress: Option<Duration>,
    retry: Option<RetrySettings>,
) -> Insert {
    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("v", DataType::Int64, true),
    ]));
    let host = fake.host();
    let mut all = vec![
        ("emulator_host", host.as_str()),
        ("table", FAKE_TABLE),
        ("row_key", "id"),
        // The scripts count the requests of one writer.
        ("sink_parallelism", "1"),
    ];
    all.extend_from_slice(options);
    let mut s = sink(schema, &all);
    if let Some(p) = progress {
        // A stalled send is waited for up to the shutdown budget after the statement fails.
        s = s.with_progress_timeout(p).with_shutdown_timeout(p);
    }
    if let Some(retry) = retry {
        s = s.with_retry(retry);
    }
    let ctx = gcp_sql::sql::new_context();
    register(&ctx, "t", s);
    insert(
        &ctx,
        &format!("INSERT INTO t SELECT concat('k', CAST(value AS VARCHAR)), value FROM generate_series(1, {rows})"),
    )
    .await
}

#[tokio::test]
async fn only_the_entries_that_failed_transiently_are_sent_again() {
    let fake = FakeBigtable::start(|_| Code::Ok).await;
    // The first call: k2 and k4 UNAVAILABLE, k3 DEADLINE_EXCEEDED, the rest applied.
    fake.script.push(Reply::Ok(vec![
        MutateRowsResponse {
            entries: (0..3)
                .map(|i| mutate_rows_response::Entry {
                    index: i,
                    status: Some(gcloud_sdk::google::rpc::Status {
                        code: [Code::Ok, Code::Unavailable, Code::DeadlineExceeded][i as usize]
                            as i32,
                        ..Default::default()
                    }),
                })
                .collect(),
            rate_limit_info: None,
        },
        // Statuses may arrive over several messages.
        MutateRowsResponse {
            entries: (3..5)
                .map(|i| mutate_rows_response::Entry {
                    index: i,
                    status: Some(gcloud_sdk::google::rpc::Status {
                        code: [Code::Unavailable, Code::Ok][i as usize - 3] as i32,
                        ..Default::default()
                    }),
                })
                .collect(),
            rate_limit_info: None,
        },
    ]));
    let done = insert_on_fake(&fake, 5, &[], None).await;
    assert_eq!(done.count(), 5);
    assert_eq!(
        fake.requests(),
        vec![vec!["k1", "k2", "k3", "k4", "k5"], vec!["k2", "k3", "k4"],]
    );
    assert_eq!(done.metric(names::RECORDS_SENT), 5);
    assert_eq!(done.metric(names::SEND_ERRORS), 3);
    assert_eq!(done.errors_with_code("UNAVAILABLE"), 2);
    assert_eq!(done.errors_with_code("DEADLINE_EXCEEDED"), 1);
    assert_eq!(done.metric(names::RETRIES), 1);
}

/// A `MutateRowsResponse` giving every entry of `request` the same `code`.
fn all_entries(request_entries: usize, code: Code) -> MutateRowsResponse {
    MutateRowsResponse {
        entries: (0..request_entries)
            .map(|i| mutate_rows_response::Entry {
                index: i as i64,
                status: Some(gcloud_sdk::google::rpc::Status {
                    code: code as i32,
                    message: format!("scripted {code:?}"),
                    details: vec![],
                }),
            })
            .collect(),
        rate_limit_info: None,
    }
}

#[tokio::test]
async fn a_resource_exhausted_burst_within_the_retry_budget_is_retried_and_lands() {
    let fake = FakeBigtable::start(|_| Code::Ok).await;
    // A throttled cluster: the whole call refused twice, then every entry refused once, then
    // (the fallback) every entry applied.
    fake.script
        .push(Reply::code(Code::ResourceExhausted))
        .push(Reply::code(Code::ResourceExhausted))
        .push(Reply::Ok(vec![all_entries(6, Code::ResourceExhausted)]));
    let done = insert_on_fake(&fake, 6, &[], None).await;
    assert_eq!(done.result, Ok(6), "{:?}", done.result);
    let every = vec!["k1", "k2", "k3", "k4", "k5", "k6"];
    assert_eq!(fake.requests(), vec![every.clone(); 4]);
    // What the fake applied: every row once, in the last request.
    assert_eq!(done.metric(names::RECORDS_ACKED), 6);
    assert_eq!(done.metric(names::RECORDS_SENT), 6);
    assert_eq!(done.errors_with_code("RESOURCE_EXHAUSTED"), 18);
    assert_eq!(done.metric(names::RETRIES), 3);
}

#[tokio::test]
async fn resource_exhausted_beyond_the_retry_budget_fails_naming_the_status_and_budget() {
    let fake = FakeBigtable::start(|_| Code::ResourceExhausted).await;
    let retry = RetrySettings {
        total_timeout: Duration::ZERO,
        max_attempts: 4,
        initial_retry_delay: Duration::from_millis(5),
        retry_delay_multiplier: 2.0,
        max_retry_delay: Duration::from_millis(20),
        initial_rpc_timeout: Duration::from_secs(30),
        rpc_timeout_multiplier: 1.0,
        max_rpc_timeout: Duration::from_secs(30),
        jitter: false,
    };
    let done = insert_on_fake_with(&fake, 3, &[], None, Some(retry)).await;
    let error = done.error();
    assert!(error.contains("RESOURCE_EXHAUSTED"), "{error}");
    assert!(error.contains("after 4 attempt(s)"), "{error}");
    assert!(error.contains("MutateRows retry budget"), "{error}");
    assert!(error.contains(FAKE_TABLE), "{error}");
    assert_eq!(fake.requests().len(), 4, "the budget's attempts, no more");
    assert_eq!(done.metric(names::RECORDS_ACKED), 0);
}

#[tokio::test]
async fn rate_limit_info_in_a_response_slows_the_writer_down() {
    let fake = FakeBigtable::start(|_| Code::Ok).await;
    // The first answer asks for (practically) no load for a minute: the writer drops to the
    // core's floor of one entry per second for the rest of the statement.
    let mut first = all_entries(1, Code::Ok);
    first.rate_limit_info = Some(gcloud_sdk::google::bigtable::v2::RateLimitInfo {
        period: Some(prost_types::Duration {
            seconds: 60,
            nanos: 0,
        }),
        factor: 1e-9,
    });
    fake.script.push(Reply::Ok(vec![first]));
    let start = std::time::Instant::now();
    // One entry in flight and per request, so every later entry is admitted after the hint.
    let done = insert_on_fake(
        &fake,
        6,
        &[
            ("max_in_flight_entries", "1"),
            ("batch_element_count_threshold", "1"),
        ],
        None,
    )
    .await;
    let elapsed = start.elapsed();
    assert_eq!(done.result, Ok(6), "{:?}", done.result);
    assert_eq!(fake.requests().len(), 6);
    // A lower bound only: k2 was waiting for the in-flight slot when the hint came, k3 goes
    // with the token the bucket holds, k4..k6 one second apart (without the hint, the six
    // entries take milliseconds).
    assert!(
        elapsed >= Duration::from_millis(2_500),
        "6 entries in {elapsed:?}: the RateLimitInfo was not applied"
    );
}

#[tokio::test]
async fn a_refused_entry_is_isolated_and_dropped_under_the_drop_policy() {
    let fake = FakeBigtable::start(|key| {
        if key == b"k5" {
            Code::InvalidArgument
        } else {
            Code::Ok
        }
    })
    .await;
    let done = insert_on_fake(&fake, 10, &[("failure_policy", "drop")], None).await;
    assert_eq!(done.count(), 9);
    assert_eq!(done.metric(names::RECORDS_REJECTED), 1);
    assert_eq!(done.metric(names::RECORDS_DROPPED), 1);
    // The batch, then k5 alone to confirm the refusal.
    assert_eq!(fake.requests().last().unwrap(), &vec!["k5".to_string()]);
    assert_eq!(fake.requests().len(), 2);
}

#[tokio::test]
async fn a_refused_entry_fails_the_statement_naming_its_row_under_the_fail_policy() {
    let fake = FakeBigtable::start(|key| {
        if key == b"k5" {
            Code::InvalidArgument
        } else {
            Code::Ok
        }
    })
    .await;
    let done = insert_on_fake(&fake, 10, &[], None).await;
    let error = done.error();
    assert!(error.contains("INVALID_ARGUMENT"), "{error}");
    // The row key is a row's value: the error names the row (k5 is row 4, counted from 0)
    // and the key's size, not the key.
    assert!(error.contains("row 4 (row key of 2 bytes)"), "{error}");
    assert!(!error.contains("k5"), "{error}");
    assert!(error.contains(FAKE_TABLE), "{error}");
    // The good entries of the batch were applied all the same.
    assert_eq!(done.metric(names::RECORDS_ACKED), 9);
}

#[tokio::test]
async fn consecutive_refusals_trip_the_breaker_naming_its_option() {
    let fake = FakeBigtable::start(|_| Code::InvalidArgument).await;
    let done = insert_on_fake(
        &fake,
        20,
        &[
            ("failure_policy", "drop"),
            ("max_consecutive_rejections", "3"),
        ],
        None,
    )
    .await;
    let error = done.error();
    assert!(error.contains("max_consecutive_rejections"), "{error}");
    assert_eq!(done.metric(names::RECORDS_ACKED), 0);
    assert!(done.metric(names::RECORDS_DROPPED) >= 2);
}

#[tokio::test]
async fn the_emulators_internal_entry_status_is_a_confirmed_rejection() {
    let fake = FakeBigtable::start(|key| {
        if key == b"k2" {
            Code::Internal
        } else {
            Code::Ok
        }
    })
    .await;
    let done = insert_on_fake(&fake, 4, &[("failure_policy", "drop")], None).await;
    assert_eq!(done.count(), 3);
    assert_eq!(done.metric(names::RECORDS_DROPPED), 1);
}

#[tokio::test]
async fn a_stalled_service_trips_the_progress_budget() {
    let fake = FakeBigtable::start(|_| Code::Ok).await;
    fake.script.push(Reply::Stall);
    let done = insert_on_fake(&fake, 3, &[], Some(Duration::from_millis(300))).await;
    let error = done.error();
    assert!(error.contains("progress budget"), "{error}");
    assert!(error.contains("300ms"), "{error}");
}

// --- one writer per partition ------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_row_of_a_key_wins_when_the_order_by_column_is_not_written() {
    const KEYS: i64 = 500;
    const VERSIONS: i64 = 6;
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("lastwinshidden");
    bt.create_table(&table, &["cf"]).await;
    let ctx = gcp_sql::sql::new_context();
    exec(&ctx, "SET datafusion.execution.target_partitions = 8").await;
    exec(
        &ctx,
        &bt.create_sql(
            "lastwinshidden",
            "id VARCHAR, n BIGINT",
            &table,
            &[("row_key", "id"), ("batch_element_count_threshold", "7")],
        ),
    )
    .await;
    // Every key is written VERSIONS times. The ORDER BY is on a column the INSERT does not
    // write, descending in `n`: the last row of key kK is its smallest `n`, which is K.
    let sql = format!(
        "INSERT INTO lastwinshidden SELECT concat('k', CAST(v % {KEYS} AS VARCHAR)) AS id, v AS n \
         FROM (SELECT value AS v, 1000000 - value AS seq \
               FROM generate_series(0, {KEYS} * {VERSIONS} - 1)) ORDER BY seq"
    );
    let plan = crate::support::explain(&ctx, &sql).await;
    assert!(
        plan.contains(
            "SinkWriterExec: connector=bigtable table=lastwinshidden writers=8 routing=hash(id) \
             order=[__order_0(seq)@2 ASC NULLS LAST] hidden_order_columns=1"
        ),
        "{plan}"
    );
    let done = insert(&ctx, &sql).await;
    assert_eq!(done.count(), (KEYS * VERSIONS) as u64);

    let rows = bt.read(&table).await;
    assert_eq!(rows.len(), KEYS as usize);
    for (key, cells) in rows {
        let name = String::from_utf8_lossy(&key).into_owned();
        let k: i64 = name.trim_start_matches('k').parse().expect("key number");
        let newest = cells
            .iter()
            .filter(|c| c.qualifier == b"n")
            .max_by_key(|c| c.timestamp)
            .unwrap_or_else(|| panic!("no n cell in {name}"));
        assert_eq!(newest.value, be(k), "row {name} kept an earlier row");
        assert!(
            cells.iter().all(|c| !c.qualifier.starts_with(b"__order")),
            "row {name} has a hidden column's cell"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_row_of_a_key_in_order_by_wins_at_eight_partitions() {
    const KEYS: i64 = 500;
    const VERSIONS: i64 = 6;
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("lastwins");
    bt.create_table(&table, &["cf"]).await;
    let ctx = gcp_sql::sql::new_context();
    exec(&ctx, "SET datafusion.execution.target_partitions = 8").await;
    exec(
        &ctx,
        &bt.create_sql(
            "lastwins",
            "id VARCHAR, version BIGINT",
            &table,
            &[("row_key", "id"), ("batch_element_count_threshold", "7")],
        ),
    )
    .await;
    // Every key is written VERSIONS times; the ORDER BY puts its highest version last.
    let sql = format!(
        "INSERT INTO lastwins SELECT concat('k', CAST(value % {KEYS} AS VARCHAR)) AS id, \
           value / {KEYS} AS version \
         FROM generate_series(0, {KEYS} * {VERSIONS} - 1) ORDER BY version"
    );
    let plan = crate::support::explain(&ctx, &sql).await;
    assert!(
        plan.contains(
            "SinkWriterExec: connector=bigtable table=lastwins writers=8 routing=hash(id)"
        ),
        "{plan}"
    );
    let done = insert(&ctx, &sql).await;
    assert_eq!(done.count(), (KEYS * VERSIONS) as u64);

    let rows = bt.read(&table).await;
    assert_eq!(rows.len(), KEYS as usize);
    for (key, cells) in rows {
        // The newest cell of `version` holds the last row's value.
        let newest = cells
            .iter()
            .filter(|c| c.qualifier == b"version")
            .max_by_key(|c| c.timestamp)
            .unwrap_or_else(|| panic!("no version cell in {key:?}"));
        assert_eq!(
            newest.value,
            be(VERSIONS - 1),
            "row {} kept an earlier row",
            String::from_utf8_lossy(&key)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_row_of_a_key_wins_with_one_explicit_timestamp_at_eight_partitions() {
    // Every row of a key carries the same `timestamp_column` value, so all of them write the
    // same cell version and the one applied last stays: only one row of a key in flight at a
    // time (ADR 0031) makes that the last row in input order.
    const KEYS: i64 = 200;
    const ROWS: i64 = 10;
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("sametime");
    bt.create_table(&table, &["cf"]).await;
    let ctx = gcp_sql::sql::new_context();
    exec(&ctx, "SET datafusion.execution.target_partitions = 8").await;
    exec(
        &ctx,
        &bt.create_sql(
            "sametime",
            "id VARCHAR, version BIGINT, ts BIGINT",
            &table,
            &[
                ("row_key", "id"),
                ("timestamp_column", "ts"),
                ("batch_element_count_threshold", "7"),
            ],
        ),
    )
    .await;
    let sql = format!(
        "INSERT INTO sametime SELECT concat('k', CAST(value % {KEYS} AS VARCHAR)) AS id, \
           value / {KEYS} AS version, CAST(1700000000000000 AS BIGINT) AS ts \
         FROM generate_series(0, {KEYS} * {ROWS} - 1) ORDER BY version"
    );
    let plan = crate::support::explain(&ctx, &sql).await;
    assert!(
        plan.contains("SinkWriterExec: connector=bigtable table=sametime writers=8"),
        "{plan}"
    );
    let done = insert(&ctx, &sql).await;
    assert_eq!(done.count(), (KEYS * ROWS) as u64);

    let rows = bt.read(&table).await;
    assert_eq!(rows.len(), KEYS as usize);
    let mut earlier = Vec::new();
    for (key, cells) in rows {
        let version: Vec<&Cell> = cells.iter().filter(|c| c.qualifier == b"version").collect();
        assert_eq!(version.len(), 1, "one version of the cell: {version:?}");
        assert_eq!(version[0].timestamp, 1_700_000_000_000_000);
        if version[0].value != be(ROWS - 1) {
            earlier.push(String::from_utf8_lossy(&key).into_owned());
        }
    }
    assert!(
        earlier.is_empty(),
        "{} of {KEYS} keys kept an earlier row than their last: {earlier:?}",
        earlier.len()
    );
}
