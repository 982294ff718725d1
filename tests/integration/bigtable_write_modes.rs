//! The Bigtable sink's changelog (`op_column`) and write modes (`write_mode`) against the real
//! emulator (`cbtemulator`), read back independently with `ReadRows` (the test support's
//! reader), cell by cell: what each mode leaves in the table, what a replay (a redelivery of the
//! same rows) does, and bad inputs. A scripted fake `ReadModifyWriteRow` shows what the emulator
//! cannot: an increment whose call fails transiently is not retried.
//!
//! Run: `cargo test --test integration bigtable_write_modes::`.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::support::bigtable::{Bigtable, Cell, Rows, cell};
use crate::support::{exec, insert};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use gcloud_sdk::google::bigtable::v2::{ReadModifyWriteRowRequest, ReadModifyWriteRowResponse};
use gcp_sql::connectors::SinkConnector;
use gcp_sql::connectors::bigtable::writer::BigtableSink;
use gcp_sql::core::metrics::names;
use gcp_sql::options::RawOptions;
use gcp_sql::sql::SinkTable;
use gcp_sql::testing::{FakeServer, Reply, Script};
use tonic::Code;

fn be(v: i64) -> Vec<u8> {
    v.to_be_bytes().to_vec()
}

/// The `(qualifier, value)` pairs of one row, every version, sorted.
fn cells_of(rows: &Rows, key: &str) -> Vec<(String, Vec<u8>)> {
    rows.get(key.as_bytes())
        .map(|cells| {
            cells
                .iter()
                .map(|c| {
                    (
                        String::from_utf8(c.qualifier.clone()).unwrap(),
                        c.value.clone(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The newest version of each cell of one row: `(qualifier, value)`, sorted.
fn latest(rows: &Rows, key: &str) -> Vec<(String, Vec<u8>)> {
    let mut newest: BTreeMap<String, (i64, Vec<u8>)> = BTreeMap::new();
    for c in rows.get(key.as_bytes()).into_iter().flatten() {
        let qualifier = String::from_utf8(c.qualifier.clone()).unwrap();
        let entry = newest.entry(qualifier).or_insert((i64::MIN, Vec::new()));
        if c.timestamp >= entry.0 {
            *entry = (c.timestamp, c.value.clone());
        }
    }
    newest.into_iter().map(|(q, (_, v))| (q, v)).collect()
}

fn q(qualifier: &str, value: impl Into<Vec<u8>>) -> (String, Vec<u8>) {
    (qualifier.to_string(), value.into())
}

#[tokio::test]
async fn replace_row_leaves_exactly_the_new_cells_where_upsert_keeps_the_old_ones() {
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("replace");
    bt.create_table(&table, &["cf"]).await;
    let ctx = gcp_sql::sql::new_context();
    for (name, mode) in [("up", "upsert"), ("rep", "replace_row")] {
        exec(
            &ctx,
            &bt.create_sql(
                name,
                "id VARCHAR, a VARCHAR, b VARCHAR, ts BIGINT",
                &table,
                &[
                    ("row_key", "id"),
                    ("write_mode", mode),
                    ("timestamp_column", "ts"),
                ],
            ),
        )
        .await;
    }
    insert(
        &ctx,
        "INSERT INTO up VALUES ('r1', 'a0', 'b0', 1000), ('r2', 'a0', 'b0', 1000)",
    )
    .await
    .count();
    assert_eq!(
        insert(&ctx, "INSERT INTO up VALUES ('r1', 'a1', NULL, 2000)")
            .await
            .count(),
        1
    );
    let replaced = insert(&ctx, "INSERT INTO rep VALUES ('r2', 'a1', NULL, 2000)").await;
    assert_eq!(replaced.count(), 1);
    let rows = bt.read(&table).await;
    // Upsert: both versions of `a`, and `b` kept.
    assert_eq!(
        cells_of(&rows, "r1"),
        vec![q("a", "a0"), q("a", "a1"), q("b", "b0")]
    );
    // Replace: exactly the new row, one version.
    assert_eq!(rows[b"r2".as_slice()], vec![cell("cf", "a", 2000, "a1")]);

    // A replay of the replacement ends the same.
    insert(&ctx, "INSERT INTO rep VALUES ('r2', 'a1', NULL, 2000)")
        .await
        .count();
    assert_eq!(
        bt.read(&table).await[b"r2".as_slice()],
        vec![cell("cf", "a", 2000, "a1")]
    );
}

#[tokio::test]
async fn op_column_deletes_rows_with_insert_update_and_debezium_codes() {
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("oplog");
    bt.create_table(&table, &["cf"]).await;
    let ctx = gcp_sql::sql::new_context();
    exec(
        &ctx,
        &bt.create_sql(
            "cl",
            "op VARCHAR, id VARCHAR, v VARCHAR, n BIGINT",
            &table,
            &[("row_key", "id"), ("op_column", "op")],
        ),
    )
    .await;
    // Cells of a row that is later deleted, and of one that stays.
    insert(
        &ctx,
        "INSERT INTO cl VALUES ('insert', 'gone', 'x', 1), ('c', 'kept', 'y', 2), \
           ('c', 'back', 'z', 3)",
    )
    .await
    .count();
    // Deletes carry only their keys; an update, a Debezium snapshot read, a re-insert after
    // a delete within one statement (one partition keeps the input order).
    let done = insert(
        &ctx,
        "INSERT INTO cl VALUES ('DELETE', 'gone', NULL, NULL), ('u', 'kept', 'y2', NULL), \
           ('r', 'snap', 's', 9), ('d', 'back', NULL, NULL), ('upsert', 'back', 'z2', 4), \
           ('d', 'never', NULL, NULL)",
    )
    .await;
    assert_eq!(done.count(), 6);
    let rows = bt.read(&table).await;
    assert!(!rows.contains_key(b"gone".as_slice()), "{rows:?}");
    assert!(!rows.contains_key(b"never".as_slice()));
    // Upsert keeps `n` of the insert; the op column is no cell.
    assert_eq!(
        cells_of(&rows, "kept"),
        vec![q("n", be(2)), q("v", "y"), q("v", "y2")]
    );
    assert_eq!(cells_of(&rows, "snap"), vec![q("n", be(9)), q("v", "s")]);
    // Deleted, then written again: only the cells written after the delete.
    assert_eq!(cells_of(&rows, "back"), vec![q("n", be(4)), q("v", "z2")]);
}

#[tokio::test]
async fn an_unknown_op_is_a_rejected_row_naming_the_column_and_row_never_the_value() {
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("badop");
    bt.create_table(&table, &["cf"]).await;
    let ctx = gcp_sql::sql::new_context();
    for (name, policy) in [("dropping", "drop"), ("failing", "fail")] {
        exec(
            &ctx,
            &bt.create_sql(
                name,
                "op VARCHAR, id VARCHAR, v VARCHAR",
                &table,
                &[
                    ("row_key", "id"),
                    ("op_column", "op"),
                    ("failure_policy", policy),
                ],
            ),
        )
        .await;
    }
    let dropped = insert(
        &ctx,
        "INSERT INTO dropping VALUES ('c', 'a', '1'), ('truncate', 'b', '2'), (NULL, 'c', '3'), \
           ('u', 'd', '4')",
    )
    .await;
    assert_eq!(dropped.count(), 2);
    assert_eq!(dropped.metric(names::RECORDS_SKIPPED), 2);
    let rows = bt.read(&table).await;
    assert_eq!(
        rows.keys().cloned().collect::<Vec<_>>(),
        vec![b"a".to_vec(), b"d".to_vec()]
    );

    let failed = insert(
        &ctx,
        "INSERT INTO failing VALUES ('c', 'e', '1'), ('merge-secret', 'f', '2')",
    )
    .await;
    let error = failed.error();
    assert!(error.contains("op_column 'op'"), "{error}");
    assert!(error.contains("row 1"), "{error}");
    assert!(!error.contains("merge-secret"), "{error}");
}

#[tokio::test]
async fn insert_if_absent_writes_only_rows_that_do_not_exist() {
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("absent");
    bt.create_table(&table, &["cf"]).await;
    let ctx = gcp_sql::sql::new_context();
    exec(
        &ctx,
        &bt.create_sql(
            "seed",
            "id VARCHAR, v VARCHAR",
            &table,
            &[("row_key", "id")],
        ),
    )
    .await;
    exec(
        &ctx,
        &bt.create_sql(
            "first",
            "id VARCHAR, v VARCHAR, w VARCHAR",
            &table,
            &[("row_key", "id"), ("write_mode", "insert_if_absent")],
        ),
    )
    .await;
    insert(&ctx, "INSERT INTO seed VALUES ('old', 'v0')")
        .await
        .count();
    let statement = "INSERT INTO first VALUES ('old', 'v1', 'w1'), ('new', 'v1', 'w1'), \
                     ('twice', 'first', 'w'), ('twice', 'second', 'w')";
    let done = insert(&ctx, statement).await;
    assert_eq!(done.count(), 4);
    // One CheckAndMutateRow per row, none failed.
    assert_eq!(done.metric(names::RECORDS_ACKED), 4);
    assert_eq!(done.metric(names::SEND_ERRORS), 0);
    let expected = |rows: &Rows| {
        assert_eq!(
            cells_of(rows, "old"),
            vec![q("v", "v0")],
            "an existing row is left"
        );
        assert_eq!(cells_of(rows, "new"), vec![q("v", "v1"), q("w", "w1")]);
        // Rows of a key are applied in input order: the first one wins.
        assert_eq!(cells_of(rows, "twice"), vec![q("v", "first"), q("w", "w")]);
    };
    expected(&bt.read(&table).await);
    // A replay changes nothing.
    insert(&ctx, statement).await.count();
    let rows = bt.read(&table).await;
    expected(&rows);
    assert_eq!(rows.len(), 3);
}

#[tokio::test]
async fn increment_adds_to_64_bit_counters_and_a_replay_adds_again() {
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("counters");
    bt.create_table(&table, &["cf"]).await;
    let ctx = gcp_sql::sql::new_context();
    exec(
        &ctx,
        &bt.create_sql(
            "counts",
            "id VARCHAR, clicks BIGINT, views INT",
            &table,
            &[
                ("row_key", "id"),
                ("write_mode", "increment"),
                ("failure_policy", "drop"),
            ],
        ),
    )
    .await;
    exec(
        &ctx,
        &bt.create_sql(
            "text",
            "id VARCHAR, clicks VARCHAR",
            &table,
            &[("row_key", "id")],
        ),
    )
    .await;
    let statement = "INSERT INTO counts SELECT concat('k', CAST(value % 3 AS VARCHAR)), value, \
                     CASE WHEN value = 4 THEN NULL ELSE CAST(-1 AS INT) END \
                     FROM generate_series(1, 300)";
    let done = insert(&ctx, statement).await;
    assert_eq!(done.count(), 300);
    assert_eq!(done.metric(names::SEND_ERRORS), 0);
    let sums = |k: i64| -> (i64, i64) {
        let rows = (1..=300).filter(|v| v % 3 == k);
        (
            rows.clone().sum(),
            -(rows.filter(|&v| v != 4).count() as i64),
        )
    };
    let check = |rows: &Rows, times: i64| {
        for k in 0..3 {
            let (clicks, views) = sums(k);
            // Each increment writes a new version (at the service's clock, never below the one
            // it read); the newest is the counter.
            assert_eq!(
                latest(rows, &format!("k{k}")),
                vec![
                    q("clicks", be(clicks * times)),
                    q("views", be(views * times))
                ],
                "k{k}"
            );
        }
    };
    check(&bt.read(&table).await, 1);
    // Not idempotent: a redelivery counts every row again.
    insert(&ctx, statement).await.count();
    check(&bt.read(&table).await, 2);

    // A counter cell that is not 8 bytes: the service refuses that row alone.
    insert(&ctx, "INSERT INTO text VALUES ('word', 'abc')")
        .await
        .count();
    let refused = insert(
        &ctx,
        "INSERT INTO counts VALUES ('word', 1, 1), ('k0', 1, 0)",
    )
    .await;
    assert_eq!(refused.count(), 1);
    assert_eq!(refused.metric(names::RECORDS_DROPPED), 1);
    let rows = bt.read(&table).await;
    assert_eq!(cells_of(&rows, "word"), vec![q("clicks", "abc")]);
    assert_eq!(
        latest(&rows, "k0"),
        vec![
            q("clicks", be(sums(0).0 * 2 + 1)),
            q("views", be(sums(0).1 * 2))
        ]
    );
}

#[tokio::test]
async fn increment_a_string_column_is_refused_at_declaration_naming_column_and_option() {
    let bt = Bigtable::connect().await;
    let ctx = gcp_sql::sql::new_context();
    let sql = bt.create_sql(
        "bad",
        "id VARCHAR, clicks VARCHAR",
        &Bigtable::table_name("never"),
        &[("row_key", "id"), ("write_mode", "increment")],
    );
    let error = gcp_sql::sql::run(&ctx, &sql).await.unwrap_err().to_string();
    assert!(
        error.contains("clicks") && error.contains("write_mode") && error.contains("increment"),
        "{error}"
    );
    let sql = bt.create_sql(
        "bad2",
        "op VARCHAR, id VARCHAR, v VARCHAR",
        &Bigtable::table_name("never"),
        &[
            ("row_key", "id"),
            ("op_column", "op"),
            ("write_mode", "insert_if_absent"),
        ],
    );
    let error = gcp_sql::sql::run(&ctx, &sql).await.unwrap_err().to_string();
    assert!(
        error.contains("op_column") && error.contains("insert_if_absent"),
        "{error}"
    );
}

/// Events `0..events` over `keys` keys in order, in runs of [`RUN`] events of one key: event
/// `v` is of key `k{(v / RUN) % keys}`; the first event of a key inserts it, then about two in
/// ten delete it, one in ten is a Debezium snapshot read, the rest update it. `n` is null for every seventh event; `ts` is the event's
/// version.
fn changelog_sql(table: &str, events: i64, keys: i64) -> String {
    format!(
        "INSERT INTO {table} SELECT \
           CASE WHEN value % {RUN} = 0 AND value < {keys} * {RUN} THEN 'c' \
                WHEN (value * 31) % 10 < 2 THEN 'd' \
                WHEN (value * 31) % 10 = 2 THEN 'r' ELSE 'u' END, \
           concat('k', CAST((value / {RUN}) % {keys} AS VARCHAR)), \
           concat('n', CAST(value AS VARCHAR)), \
           CASE WHEN value % 7 = 0 THEN NULL ELSE value END, \
           1700000000000000 + value * 1000 \
         FROM generate_series(0, {}) ORDER BY value",
        events - 1
    )
}

/// Events of one key in a row: a key's updates come in bursts, so that rows of a key share
/// batches and follow each other closely (the case `write_mode`'s ordering is for).
const RUN: i64 = 4;

/// The table the changelog of [`changelog_sql`] leaves under `replace_row`: per key, exactly
/// the cells of its last event, or no row when that event deletes it.
fn changelog_state(events: i64, keys: i64) -> Rows {
    let mut state: BTreeMap<Vec<u8>, Option<Vec<Cell>>> = BTreeMap::new();
    for v in 0..events {
        let key = format!("k{}", (v / RUN) % keys).into_bytes();
        let first = v % RUN == 0 && v < keys * RUN;
        let delete = !first && (v * 31) % 10 < 2;
        let ts = 1_700_000_000_000_000 + v * 1000;
        let row = (!delete).then(|| {
            let mut cells = vec![cell("cf", "name", ts, format!("n{v}"))];
            if v % 7 != 0 {
                cells.push(cell("cf", "n", ts, be(v)));
            }
            cells.sort();
            cells
        });
        state.insert(key, row);
    }
    state
        .into_iter()
        .filter_map(|(k, row)| row.map(|cells| (k, cells)))
        .collect()
}

async fn changelog_replayed_twice(events: i64, keys: i64) {
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("changelog");
    bt.create_table(&table, &["cf"]).await;
    let ctx = gcp_sql::sql::new_context();
    exec(
        &ctx,
        &bt.create_sql(
            "cl",
            "op VARCHAR, id VARCHAR, name VARCHAR, n BIGINT, ts BIGINT",
            &table,
            &[
                ("row_key", "id"),
                ("op_column", "op"),
                ("write_mode", "replace_row"),
                ("timestamp_column", "ts"),
                // Small batches, many in flight: a key's run spreads over concurrent requests.
                ("batch_element_count_threshold", "10"),
                ("max_in_flight_entries", "5000"),
            ],
        ),
    )
    .await;
    let expected = changelog_state(events, keys);
    // Some keys end deleted, and some rows end without `n`: the state is not trivial.
    assert!(expected.len() < keys as usize && expected.len() > keys as usize / 2);
    assert!(expected.values().any(|cells| cells.len() == 1));
    let sql = changelog_sql("cl", events, keys);
    for delivery in 1..=2 {
        let done = insert(&ctx, &sql).await;
        assert_eq!(done.count(), events as u64, "delivery {delivery}");
        assert_eq!(done.metric(names::SEND_ERRORS), 0);
        let rows = bt.read(&table).await;
        // Cell for cell: keys, families, qualifiers, versions and values, one version each.
        assert_eq!(rows.len(), expected.len(), "delivery {delivery}");
        for (key, cells) in &expected {
            assert_eq!(
                rows.get(key),
                Some(cells),
                "delivery {delivery}, key {}",
                String::from_utf8_lossy(key)
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changelog_replayed_twice_ends_in_its_final_state_cell_for_cell() {
    changelog_replayed_twice(50_000, 5_000).await;
}

// --- against a scripted fake -------------------------------------------------------------------

const READ_MODIFY_WRITE_ROW: &str = "/google.bigtable.v2.Bigtable/ReadModifyWriteRow";

#[tokio::test]
async fn an_increment_that_fails_transiently_is_not_retried_and_fails_the_statement() {
    let script: Script<ReadModifyWriteRowRequest, ReadModifyWriteRowResponse> = Script::new();
    script.fallback(|request: &ReadModifyWriteRowRequest| {
        if request.row_key == b"k2" {
            Reply::code(Code::Unavailable)
        } else {
            Reply::Ok(ReadModifyWriteRowResponse::default())
        }
    });
    let server = FakeServer::builder()
        .unary(READ_MODIFY_WRITE_ROW, script.clone())
        .start()
        .await
        .expect("start the fake Bigtable");
    let host = server.addr().to_string();
    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("v", DataType::Int64, true),
    ]));
    let raw = RawOptions::from_pairs(
        [
            ("emulator_host", host.as_str()),
            ("table", "projects/p/instances/i/tables/t"),
            ("row_key", "id"),
            ("write_mode", "increment"),
            ("sink_parallelism", "1"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
    )
    .unwrap();
    let sink: Arc<dyn SinkConnector> = Arc::new(BigtableSink::try_new(schema, None, &raw).unwrap());
    let ctx = gcp_sql::sql::new_context();
    ctx.register_table("t", Arc::new(SinkTable::new("t", sink)))
        .unwrap();
    let done = insert(
        &ctx,
        "INSERT INTO t SELECT concat('k', CAST(value AS VARCHAR)), value \
         FROM generate_series(1, 3)",
    )
    .await;
    let error = done.error();
    assert!(error.contains("ReadModifyWriteRow"), "{error}");
    assert!(error.contains("UNAVAILABLE"), "{error}");
    assert!(error.contains("not retried"), "{error}");
    // Each row's increment was sent once: k2's was not sent again.
    let mut keys: Vec<Vec<u8>> = script.requests().into_iter().map(|r| r.row_key).collect();
    keys.sort();
    assert_eq!(keys, vec![b"k1".to_vec(), b"k2".to_vec(), b"k3".to_vec()]);
    // The rules carry the row's value.
    assert!(script.requests().iter().all(|r| r.rules.len() == 1));
}

/// Under `failure_policy = 'dead_letter'`: a row whose op names no operation and an increment
/// the service refuses (a counter cell that is not 8 bytes) are dead letters, each with why,
/// and the other rows land.
#[tokio::test]
async fn a_bad_op_and_a_refused_increment_go_to_the_dead_letters() {
    use crate::dead_letter::dead_letter_lines;
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("dlqmodes");
    bt.create_table(&table, &["cf"]).await;
    let dir = tempfile::tempdir().unwrap();
    let path = format!("file://{}", dir.path().display());
    let ctx = gcp_sql::sql::new_context();
    exec(
        &ctx,
        &bt.create_sql(
            "cl",
            "op VARCHAR, id VARCHAR, n BIGINT",
            &table,
            &[
                ("row_key", "id"),
                ("op_column", "op"),
                ("failure_policy", "dead_letter"),
                ("dead_letter_path", &path),
            ],
        ),
    )
    .await;
    exec(
        &ctx,
        &bt.create_sql(
            "counts",
            "id VARCHAR, n BIGINT",
            &table,
            &[
                ("row_key", "id"),
                ("write_mode", "increment"),
                ("failure_policy", "dead_letter"),
                ("dead_letter_path", &path),
            ],
        ),
    )
    .await;
    let done = insert(
        &ctx,
        "INSERT INTO cl VALUES ('c', 'a', 1), ('nope', 'b', 2), ('u', 'c', 3)",
    )
    .await;
    assert_eq!(done.count(), 2);
    assert_eq!(done.metric(names::RECORDS_DEAD_LETTERED), 1);
    exec(
        &ctx,
        &bt.create_sql(
            "seed",
            "id VARCHAR, n VARCHAR",
            &table,
            &[("row_key", "id")],
        ),
    )
    .await;
    insert(&ctx, "INSERT INTO seed VALUES ('text', 'abc')")
        .await
        .count();
    let done = insert(&ctx, "INSERT INTO counts VALUES ('a', 5), ('text', 1)").await;
    assert_eq!(done.count(), 1);
    assert_eq!(done.metric(names::RECORDS_DEAD_LETTERED), 1);
    let rows = bt.read(&table).await;
    assert_eq!(latest(&rows, "a"), vec![q("n", be(6))]);
    assert_eq!(cells_of(&rows, "text"), vec![q("n", "abc")]);

    let (_, lines) = dead_letter_lines(dir.path());
    assert_eq!(lines.len(), 2, "{lines:?}");
    let encoding = lines
        .iter()
        .find(|l| l["error_class"] == "encoding")
        .expect("the bad op's dead letter");
    let message = encoding["error_message"].as_str().unwrap();
    assert!(message.contains("op_column 'op'"), "{message}");
    assert!(!message.contains("nope"), "{message}");
    assert_eq!(encoding["row"]["id"], "b");
    let refused = lines
        .iter()
        .find(|l| l["error_class"] != "encoding")
        .expect("the refused increment's dead letter");
    let message = refused["error_message"].as_str().unwrap();
    assert!(message.contains("non-64-bit"), "{message}");
    // The record as sent: the row key and its increment.
    let increment = &refused["row"]["mutations"][0]["increment"];
    assert_eq!(increment["qualifier"], "n", "{refused:?}");
    assert_eq!(increment["amount"], 1, "{refused:?}");
}

/// `add_to_cell` on a table `auto_create_table` makes (its families then sum 64-bit integers):
/// every add of a version merges into one cell, with `timestamp_column` one cell per version
/// (a bucket); a replay adds again; on an ordinary family the service refuses the row.
#[tokio::test]
async fn add_to_cell_sums_into_aggregate_families_the_sink_creates() {
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("aggregates");
    let plain = Bigtable::table_name("plainfamily");
    bt.create_table(&plain, &["cf"]).await;
    let ctx = gcp_sql::sql::new_context();
    exec(
        &ctx,
        &bt.create_sql(
            "totals",
            "id VARCHAR, clicks BIGINT",
            &table,
            &[
                ("row_key", "id"),
                ("write_mode", "add_to_cell"),
                ("auto_create_table", "true"),
            ],
        ),
    )
    .await;
    exec(
        &ctx,
        &bt.create_sql(
            "hourly",
            "id VARCHAR, views INT, hour BIGINT",
            &table,
            &[
                ("row_key", "id"),
                ("column_family", "h"),
                ("write_mode", "add_to_cell"),
                ("timestamp_column", "hour"),
                ("auto_create_table", "true"),
            ],
        ),
    )
    .await;
    let statement = "INSERT INTO totals SELECT concat('k', CAST(value % 2 AS VARCHAR)), value \
                     FROM generate_series(1, 100)";
    let done = insert(&ctx, statement).await;
    assert_eq!(done.count(), 100);
    assert_eq!(done.metric(names::RESOURCES_CREATED), 1);
    let sum = |k: i64| (1..=100).filter(|v| v % 2 == k).sum::<i64>();
    let rows = bt.read(&table).await;
    for k in 0..2 {
        // One cell, at version 0, holding the sum.
        assert_eq!(
            rows[format!("k{k}").as_bytes()],
            vec![cell("cf", "clicks", 0, be(sum(k)))]
        );
    }
    insert(&ctx, statement).await.count();
    assert_eq!(
        bt.read(&table).await[b"k1".as_slice()],
        vec![cell("cf", "clicks", 0, be(2 * sum(1)))],
        "a replay adds again"
    );
    // The family `h` is added to the existing table as an aggregate too.
    let done = insert(
        &ctx,
        "INSERT INTO hourly VALUES ('p', 1, 3600000000), ('p', 2, 3600000000), \
           ('p', 5, 7200000000)",
    )
    .await;
    assert_eq!(done.count(), 3);
    let p: Vec<Cell> = bt.read(&table).await[b"p".as_slice()].clone();
    assert_eq!(
        p,
        vec![
            cell("h", "views", 3_600_000_000, be(3)),
            cell("h", "views", 7_200_000_000, be(5)),
        ]
    );

    // An ordinary family cannot take an add: the row is refused, the others land elsewhere.
    exec(
        &ctx,
        &bt.create_sql(
            "onplain",
            "id VARCHAR, clicks BIGINT",
            &plain,
            &[
                ("row_key", "id"),
                ("write_mode", "add_to_cell"),
                ("failure_policy", "drop"),
            ],
        ),
    )
    .await;
    let refused = insert(&ctx, "INSERT INTO onplain VALUES ('x', 1)").await;
    assert_eq!(refused.count(), 0);
    assert_eq!(refused.metric(names::RECORDS_DROPPED), 1);
    assert!(bt.read(&plain).await.is_empty());
}
