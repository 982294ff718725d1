//! Lookup joins with a Bigtable table (issue 34, ADR 0078): a join on the table's row key is
//! planned as `LookupJoinExec`, which reads each input batch's distinct keys with one
//! `ReadRows`; INNER drops unmatched rows, LEFT fills them with NULLs; between a subscription
//! and a Bigtable sink every message is acknowledged only after its joined row landed; a join
//! that cannot be a lookup is refused in a pipeline with what to write instead.
//!
//! Run: `cargo test --test integration bigtable_lookup::`.

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, UInt64Type};
use datafusion::prelude::{SessionConfig, SessionContext};
use gcloud_sdk::google::pubsub::v1::PubsubMessage;

use crate::pubsub_source::{Fixture, sql_context};
use crate::support::bigtable::Bigtable;
use crate::support::exec;

fn context() -> SessionContext {
    let ctx = SessionContext::new_with_state(
        gcp_sql::sql::new_state_builder()
            .with_config(SessionConfig::new().with_target_partitions(2))
            .build(),
    );
    gcp_sql::sql::register(&ctx);
    ctx
}

/// A profile table `profiles` of users `u0`..`u{n-1}`, each with a name and a tier, written by
/// the sink; returns the Bigtable table's name.
async fn profiles(ctx: &SessionContext, bt: &Bigtable, n: usize) -> String {
    profiles_with(ctx, bt, n, &[]).await
}

async fn profiles_with(
    ctx: &SessionContext,
    bt: &Bigtable,
    n: usize,
    options: &[(&str, &str)],
) -> String {
    let mut options = options.to_vec();
    options.extend([("row_key", "k"), ("column_family", "p")]);
    let table = Bigtable::table_name("lookup");
    bt.create_table(&table, &["p"]).await;
    exec(
        ctx,
        &bt.create_sql(
            "profiles",
            "k VARCHAR NOT NULL, name VARCHAR, tier BIGINT",
            &table,
            &options,
        ),
    )
    .await;
    exec(
        ctx,
        &format!(
            "INSERT INTO profiles SELECT 'u' || CAST(v AS VARCHAR), 'name-' || CAST(v AS VARCHAR), \
             v % 3 FROM generate_series(0, {}) AS t(v)",
            n - 1
        ),
    )
    .await;
    table
}

async fn rows(ctx: &SessionContext, sql: &str) -> Vec<RecordBatch> {
    ctx.sql(sql)
        .await
        .unwrap_or_else(|e| panic!("cannot plan {sql}: {e}"))
        .collect()
        .await
        .unwrap_or_else(|e| panic!("cannot run {sql}: {e}"))
}

fn strings(batches: &[RecordBatch]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for b in batches {
        let cols: Vec<_> = b
            .columns()
            .iter()
            .map(|c| arrow::compute::cast(c, &DataType::Utf8).unwrap())
            .collect();
        for r in 0..b.num_rows() {
            out.push(
                cols.iter()
                    .map(|c| {
                        let c = c.as_string::<i32>();
                        if c.is_null(r) {
                            "NULL".to_string()
                        } else {
                            c.value(r).to_string()
                        }
                    })
                    .collect(),
            );
        }
    }
    out.sort();
    out
}

const CLICKS: &str = "CREATE TABLE clicks AS VALUES (1, 'u1'), (2, 'u7'), (3, 'nobody'), \
                      (4, 'u1'), (5, CAST(NULL AS VARCHAR))";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inner_and_left_lookups_of_a_bounded_input_join_by_the_row_key() {
    let bt = Bigtable::connect().await;
    let ctx = context();
    profiles(&ctx, &bt, 10).await;
    exec(&ctx, CLICKS).await;

    let inner = "SELECT c.column1, p.name, p.tier FROM clicks c JOIN profiles p ON p.k = c.column2";
    let plan = crate::support::explain(&ctx, inner).await;
    assert!(plan.contains("LookupJoinExec: type=Inner"), "{plan}");
    assert!(!plan.contains("HashJoinExec"), "{plan}");
    assert_eq!(
        strings(&rows(&ctx, inner).await),
        [
            ["1", "name-1", "1"],
            ["2", "name-7", "1"],
            ["4", "name-1", "1"]
        ]
    );

    // The Bigtable table written on the left of the join: the same lookup.
    let swapped = "SELECT c.column1, p.name FROM profiles p JOIN clicks c ON c.column2 = p.k";
    assert_eq!(
        strings(&rows(&ctx, swapped).await),
        [["1", "name-1"], ["2", "name-7"], ["4", "name-1"]]
    );

    let left =
        "SELECT c.column1, p.k, p.name FROM clicks c LEFT JOIN profiles p ON p.k = c.column2";
    let plan = crate::support::explain(&ctx, left).await;
    assert!(plan.contains("LookupJoinExec: type=Left"), "{plan}");
    assert_eq!(
        strings(&rows(&ctx, left).await),
        [
            ["1", "u1", "name-1"],
            ["2", "u7", "name-7"],
            ["3", "NULL", "NULL"],
            ["4", "u1", "name-1"],
            ["5", "NULL", "NULL"]
        ]
    );

    // Not on the row key: DataFusion's own join, still right.
    let by_name = "SELECT c.column1 FROM clicks c JOIN profiles p ON p.name = c.column2";
    let plan = crate::support::explain(&ctx, by_name).await;
    assert!(!plan.contains("LookupJoinExec"), "{plan}");
    assert!(rows(&ctx, by_name).await.iter().all(|b| b.num_rows() == 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_analyze_reports_one_read_rows_call_per_input_batch() {
    let bt = Bigtable::connect().await;
    let ctx = small_batches();
    profiles(&ctx, &bt, 50).await;
    // 40 input rows in 10 batches of 4, each batch with 2 distinct keys.
    let sql = "SELECT count(*) FROM (SELECT 'u' || CAST(v / 2 AS VARCHAR) AS user_id \
               FROM generate_series(0, 39) AS t(v)) c JOIN profiles p ON p.k = c.user_id";
    let b = rows(&ctx, sql).await;
    assert_eq!(
        b[0].column(0)
            .as_primitive::<arrow::datatypes::Int64Type>()
            .value(0),
        40
    );
    let text = arrow::util::pretty::pretty_format_batches(
        &rows(&ctx, &format!("EXPLAIN ANALYZE {sql}")).await,
    )
    .unwrap()
    .to_string();
    let line = lookup_line(&text);
    assert!(line.contains("cache=off"), "{line}");
    assert!(line.contains("input_batches=10"), "{line}");
    assert!(line.contains("read_rows_calls=10"), "{line}");
    assert!(line.contains("keys_read=20"), "{line}");
    assert!(line.contains("rows_found=20"), "{line}");
}

fn small_batches() -> SessionContext {
    let ctx = SessionContext::new_with_state(
        gcp_sql::sql::new_state_builder()
            .with_config(
                SessionConfig::new()
                    .with_target_partitions(1)
                    .with_batch_size(4),
            )
            .build(),
    );
    gcp_sql::sql::register(&ctx);
    ctx
}

fn lookup_line(text: &str) -> String {
    text.lines()
        .find(|l| l.contains("LookupJoinExec"))
        .unwrap_or_else(|| panic!("{text}"))
        .to_string()
}

/// With `lookup_cache_rows`, the keys of the first batch are read once and every later batch
/// (the same four users) is answered from memory: one `ReadRows` in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_lookup_reads_a_key_once_and_zero_times_for_batches_it_has_cached() {
    let bt = Bigtable::connect().await;
    let ctx = small_batches();
    profiles_with(
        &ctx,
        &bt,
        10,
        &[("lookup_cache_rows", "100"), ("lookup_cache_ttl", "10m")],
    )
    .await;
    let sql = "SELECT c.v, p.name FROM (SELECT v, 'u' || CAST(v % 4 AS VARCHAR) AS user_id \
               FROM generate_series(0, 39) AS t(v)) c JOIN profiles p ON p.k = c.user_id";
    let got = strings(&rows(&ctx, sql).await);
    assert_eq!(got.len(), 40);
    for row in &got {
        let v: i64 = row[0].parse().unwrap();
        assert_eq!(row[1], format!("name-{}", v % 4));
    }
    let text = arrow::util::pretty::pretty_format_batches(
        &rows(&ctx, &format!("EXPLAIN ANALYZE {sql}")).await,
    )
    .unwrap()
    .to_string();
    let line = lookup_line(&text);
    assert!(line.contains("cache=100 rows"), "{line}");
    assert!(line.contains("input_batches=10"), "{line}");
    assert!(line.contains("read_rows_calls=1,"), "{line}");
    assert!(line.contains("keys_read=4"), "{line}");
    assert!(line.contains("cache_hits=36"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_lookup_cache_options_are_refused_naming_the_option() {
    let bt = Bigtable::connect().await;
    let ctx = context();
    for (options, named) in [
        (&[("lookup_cache_rows", "-1")][..], "lookup_cache_rows"),
        (
            &[("lookup_cache_rows", "10"), ("lookup_cache_ttl", "0s")][..],
            "lookup_cache_ttl",
        ),
    ] {
        let mut all = options.to_vec();
        all.push(("row_key", "k"));
        let table = Bigtable::table_name("bad");
        let sql = bt.create_sql("bad", "k VARCHAR, v VARCHAR", &table, &all);
        let err = gcp_sql::sql::run(&ctx, &sql)
            .await
            .expect_err(&sql)
            .to_string();
        assert!(err.contains(named), "{err}");
    }
}

/// `n` JSON messages `{"id": i, "user": "u{i % 7}"}`, every fifth for a user with no profile.
fn clicks(n: i64) -> Vec<PubsubMessage> {
    (0..n)
        .map(|i| {
            let user = if i % 5 == 4 {
                format!("ghost{i}")
            } else {
                format!("u{}", i % 7)
            };
            PubsubMessage {
                data: serde_json::json!({ "id": i, "user": user })
                    .to_string()
                    .into(),
                ..Default::default()
            }
        })
        .collect()
}

/// Subscription → lookup (INNER) → Bigtable sink: every matched message's row lands with its
/// profile's values, and every message (the unmatched ones too) is acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_enriched_by_a_lookup_lands_every_row_and_acknowledges_every_message() {
    let f = Fixture::new("lookup").await;
    let bt = Bigtable::connect().await;
    let ctx = sql_context(50);
    profiles(&ctx, &bt, 7).await;
    let out = Bigtable::table_name("lookup-out");
    bt.create_table(&out, &["c"]).await;
    let n = 600;
    f.publish(clicks(n)).await;
    let statements = format!(
        "{};
         {};
         INSERT INTO enriched SELECT CAST(c.id AS VARCHAR), p.name, p.tier
           FROM clicks_in c JOIN profiles p ON p.k = c.user",
        f.source_sql(
            "clicks_in",
            "id BIGINT, user VARCHAR",
            &[("format", "json"), ("parallel_pull_count", "2")]
        ),
        bt.create_sql(
            "enriched",
            "id VARCHAR, name VARCHAR, tier BIGINT",
            &out,
            &[("row_key", "id"), ("column_family", "c")]
        ),
    );
    let result = gcp_sql::sql::run(&ctx, &statements).await.expect("INSERT");
    let expected: Vec<i64> = (0..n).filter(|i| i % 5 != 4).collect();
    assert_eq!(
        result[0].column(0).as_primitive::<UInt64Type>().value(0),
        expected.len() as u64
    );
    let landed = bt.read(&out).await;
    assert_eq!(landed.len(), expected.len(), "rows in Bigtable");
    for i in expected {
        let cells = &landed[i.to_string().as_bytes()];
        let name = cells.iter().find(|c| c.qualifier == b"name").expect("name");
        assert_eq!(
            name.value,
            format!("name-{}", i % 7).into_bytes(),
            "row {i}"
        );
        assert!(cells.iter().any(|c| c.qualifier == b"tier"), "row {i}");
    }
    assert!(
        f.left_over_after_deadline().await.is_empty(),
        "every message, matched or not, was acknowledged"
    );
}

/// A join between a subscription and a Bigtable table that is not on its row key, or a FULL
/// join, is refused before anything is read, naming why and what to write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_that_cannot_be_a_lookup_is_refused_in_a_pipeline() {
    let f = Fixture::new("lookup-no").await;
    let bt = Bigtable::connect().await;
    let ctx = sql_context(50);
    profiles(&ctx, &bt, 3).await;
    let out = Bigtable::table_name("lookup-no-out");
    exec(
        &ctx,
        &f.source_sql(
            "clicks_in",
            "id BIGINT, user VARCHAR",
            &[("format", "json")],
        ),
    )
    .await;
    exec(
        &ctx,
        &bt.create_sql(
            "enriched",
            "id VARCHAR, name VARCHAR",
            &out,
            &[("row_key", "id")],
        ),
    )
    .await;
    for (join, why) in [
        (
            "JOIN profiles p ON p.name = c.user",
            "not on the Bigtable table's row key",
        ),
        (
            "FULL JOIN profiles p ON p.k = c.user",
            "a lookup join is INNER or LEFT",
        ),
    ] {
        let sql = format!(
            "INSERT INTO enriched SELECT CAST(c.id AS VARCHAR), p.name FROM clicks_in c {join}"
        );
        let err = gcp_sql::sql::run(&ctx, &sql)
            .await
            .expect_err("refused")
            .to_string();
        assert!(err.contains(why), "{err}");
        assert!(err.contains("ON the table's row key column"), "{err}");
    }
}
