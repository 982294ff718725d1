//! `DELETE` and `UPDATE` on a Bigtable table (issue 34, ADR 0077): against the real emulator,
//! rows written by the sink are deleted and updated by row-key predicates, and read back with
//! the test support's own `ReadRows` reader (independent of the crate's scan).
//!
//! Run: `cargo test --test integration bigtable_dml::`.

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{DataType, UInt64Type};
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::support::bigtable::{Bigtable, Rows};
use crate::support::{exec, explain, insert};

/// The crate's context with `partitions` target partitions.
fn context(partitions: usize) -> SessionContext {
    SessionContext::new_with_state(
        gcp_sql::sql::new_state_builder()
            .with_config(SessionConfig::new().with_target_partitions(partitions))
            .build(),
    )
}

async fn run(ctx: &SessionContext, sql: &str) -> datafusion::error::Result<Vec<RecordBatch>> {
    ctx.sql(sql).await?.collect().await
}

/// The DML count of `sql` (one `count` UInt64 row).
async fn dml(ctx: &SessionContext, sql: &str) -> u64 {
    let b = run(ctx, sql)
        .await
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", &sql[..sql.len().min(120)]));
    assert_eq!(b.len(), 1, "{sql}");
    assert_eq!(b[0].schema().field(0).name(), "count");
    b[0].column(0).as_primitive::<UInt64Type>().value(0)
}

async fn refused(ctx: &SessionContext, sql: &str) -> String {
    match run(ctx, sql).await {
        Ok(_) => panic!("{sql} was accepted"),
        Err(e) => e.to_string(),
    }
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

fn key(v: usize) -> String {
    format!("user-{v:05}")
}

/// A table `users` of `n` rows `user-00000`.. with `visits = v * 10` and a name on even rows,
/// written by the sink.
async fn users(ctx: &SessionContext, bt: &Bigtable, n: usize) -> String {
    let table = Bigtable::table_name("dml");
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
            "INSERT INTO users SELECT 'user-' || lpad(CAST(v AS VARCHAR), 5, '0'), v * 10, \
             CASE WHEN v % 2 = 0 THEN 'even' END FROM generate_series(0, {}) AS t(v)",
            n - 1
        ),
    )
    .await;
    assert_eq!(written.count(), n as u64);
    table
}

fn keys_of(rows: &Rows) -> Vec<String> {
    rows.keys()
        .map(|k| String::from_utf8(k.clone()).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_removes_exactly_the_keys_and_the_range_and_counts_them() {
    let bt = Bigtable::connect().await;
    let ctx = context(2);
    let table = users(&ctx, &bt, 12_000).await;
    let before = bt.read_range(&table, b"user-", b"user.").await;
    assert_eq!(before.len(), 12_000);

    // 1,000 point deletes in one IN list: the even keys below 2,000, plus a key that is absent.
    let list: Vec<String> = (0..2_000)
        .step_by(2)
        .map(|v| format!("'{}'", key(v)))
        .chain(["'nobody'".to_string()])
        .collect();
    let deleted = dml(
        &ctx,
        &format!("DELETE FROM users WHERE k IN ({})", list.join(", ")),
    )
    .await;
    assert_eq!(deleted, 1_000);

    // A 10,000-key range.
    let range = "DELETE FROM users WHERE k >= 'user-02000' AND k < 'user-12000'";
    let plan = explain(&ctx, range).await;
    assert!(plan.contains("BigtableDmlExec: DELETE"), "{plan}");
    assert!(
        plan.contains("keys=[['user-02000'..'user-12000')]") && plan.contains("row keys only"),
        "{plan}"
    );
    assert_eq!(dml(&ctx, range).await, 10_000);

    // Exactly the odd keys below 2,000 are left, with every cell as it was.
    let after = bt.read_range(&table, b"user-", b"user.").await;
    let expected: Vec<String> = (1..2_000).step_by(2).map(key).collect();
    assert_eq!(keys_of(&after), expected);
    for (k, cells) in &after {
        assert_eq!(Some(cells), before.get(k), "{}", String::from_utf8_lossy(k));
    }
    // Re-running a DELETE finds nothing more to delete.
    assert_eq!(dml(&ctx, range).await, 0);
    // A prefix and a point, through the scan's other key forms.
    assert_eq!(
        dml(&ctx, "DELETE FROM users WHERE k LIKE 'user-0001%'").await,
        5
    );
    assert_eq!(
        dml(&ctx, "DELETE FROM users WHERE k = 'user-01999'").await,
        1
    );
    let left = run(&ctx, "SELECT count(*) FROM users").await.unwrap();
    assert_eq!(strings(&left, 0), ["994"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_by_a_key_predicate_the_ranges_cannot_express_filters_the_keys_read() {
    let bt = Bigtable::connect().await;
    let ctx = context(1);
    let table = users(&ctx, &bt, 100).await;
    // `LIKE 'user-000_0'` reads the prefix 'user-000' and keeps only the matching keys.
    assert_eq!(
        dml(&ctx, "DELETE FROM users WHERE k LIKE 'user-000_0'").await,
        10
    );
    let after = bt.read(&table).await;
    assert_eq!(after.len(), 90);
    assert!(!after.contains_key(b"user-00010".as_slice()));
    assert!(after.contains_key(b"user-00011".as_slice()));
    // Every row, said deliberately.
    assert_eq!(dml(&ctx, "DELETE FROM users WHERE k >= ''").await, 90);
    assert!(bt.read(&table).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_sets_only_the_assigned_cells_of_the_matched_rows() {
    let bt = Bigtable::connect().await;
    let ctx = context(2);
    let table = users(&ctx, &bt, 100).await;
    let before = bt.read(&table).await;

    let n = dml(
        &ctx,
        "UPDATE users SET visits = visits + 1 WHERE k BETWEEN 'user-00010' AND 'user-00019'",
    )
    .await;
    assert_eq!(n, 10);
    let after = bt.read(&table).await;
    assert_eq!(after.len(), 100);
    for (k, cells) in &after {
        let name = String::from_utf8(k.clone()).unwrap();
        let v: usize = name["user-".len()..].parse().unwrap();
        let old = &before[k];
        let of = |cells: &[crate::support::bigtable::Cell], q: &str| -> Vec<_> {
            cells
                .iter()
                .filter(|c| c.qualifier == q.as_bytes())
                .cloned()
                .collect()
        };
        // The name cells are untouched everywhere.
        assert_eq!(of(cells, "name"), of(old, "name"), "{name}");
        if (10..20).contains(&v) {
            // A new visits version, holding the old value plus one.
            let latest = of(cells, "visits")
                .into_iter()
                .max_by_key(|c| c.timestamp)
                .unwrap();
            assert_eq!(latest.value, ((v * 10 + 1) as i64).to_be_bytes(), "{name}");
        } else {
            assert_eq!(cells, old, "{name}");
        }
    }
    let b = run(
        &ctx,
        "SELECT k, visits, name FROM users WHERE k IN ('user-00010', 'user-00011', 'user-00020') ORDER BY k",
    )
    .await
    .unwrap();
    assert_eq!(strings(&b, 1), ["101", "111", "200"]);
    assert_eq!(strings(&b, 2), ["even", "NULL", "even"]);

    // SET to NULL deletes the cell; two columns at once.
    assert_eq!(
        dml(
            &ctx,
            "UPDATE users SET name = NULL, visits = 7 WHERE k = 'user-00020'"
        )
        .await,
        1
    );
    let b = run(
        &ctx,
        "SELECT visits, name FROM users WHERE k = 'user-00020'",
    )
    .await
    .unwrap();
    assert_eq!(strings(&b, 0), ["7"]);
    assert_eq!(strings(&b, 1), ["NULL"]);
    // No row matched: nothing written.
    assert_eq!(
        dml(&ctx, "UPDATE users SET visits = 0 WHERE k = 'nobody'").await,
        0
    );
    assert!(!bt.read(&table).await.contains_key(b"nobody".as_slice()));
    let plan = explain(&ctx, "UPDATE users SET visits = 0 WHERE k = 'user-00001'").await;
    assert!(
        plan.contains("BigtableDmlExec: UPDATE") && plan.contains("set-cell of [visits]"),
        "{plan}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_deletes_and_updates_are_refused_naming_the_column() {
    let bt = Bigtable::connect().await;
    let ctx = context(1);
    let table = users(&ctx, &bt, 10).await;

    let e = refused(&ctx, "DELETE FROM users WHERE visits = 10").await;
    assert!(
        e.contains("column 'visits'") && e.contains("row key (k)"),
        "{e}"
    );
    let e = refused(
        &ctx,
        "DELETE FROM users WHERE k = 'user-00001' AND name = 'even'",
    )
    .await;
    assert!(e.contains("column 'name'"), "{e}");
    let e = refused(&ctx, "DELETE FROM users").await;
    assert!(
        e.contains("DELETE without WHERE") && e.contains("WHERE k >= ''"),
        "{e}"
    );
    let e = refused(&ctx, "UPDATE users SET k = 'x' WHERE k = 'user-00001'").await;
    assert!(e.contains("cannot set 'k'") && e.contains("row key"), "{e}");
    let e = refused(&ctx, "UPDATE users SET nosuch = 1 WHERE k = 'user-00001'").await;
    assert!(e.contains("nosuch"), "{e}");
    let e = refused(&ctx, "UPDATE users SET visits = 1 WHERE name = 'even'").await;
    assert!(e.contains("column 'name'"), "{e}");
    let e = refused(&ctx, "UPDATE users SET visits = 1").await;
    assert!(e.contains("UPDATE without WHERE"), "{e}");
    // Nothing was changed by any of them.
    let rows = bt.read(&table).await;
    assert_eq!(rows.len(), 10);
    assert!(
        rows.values()
            .all(|cells| cells.len() == 1 || cells.len() == 2)
    );
}
