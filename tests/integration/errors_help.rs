//! Errors that help, against the real emulators:
//!
//! - a sink whose `emulator_host` is a loopback port where nothing listens fails at its first
//!   attempt, saying that the connection was refused at that address and which setting named
//!   it, instead of retrying `UNAVAILABLE` for its whole budget (each of the three sinks);
//! - `pubsub_subscribe` and `pubsub_pull` against the Pub/Sub emulator: a backlog larger than
//!   one `Pull` page is read to the end, every message once, and acknowledged as it goes.
//!
//! The SQL-level errors (a missing `connector`, a misspelt column, `format = 'raw'` with
//! several columns) are in `tests/slt/errors.slt`.

use std::sync::Arc;

use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use datafusion::prelude::SessionContext;
use gcp_sql::connectors::pubsub::inspect::{
    PULL_PAGE_MESSAGES, PubSubPullFunction, PubSubSubscribeFunction,
};
use gcp_sql::core::metrics::names;

use crate::support::{PubSubAdmin, exec, insert, unique};

/// A loopback address where nothing listens: a port bound and released again.
fn closed_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    let address = listener.local_addr().expect("its address").to_string();
    drop(listener);
    address
}

/// Declares `t` with `with` (which names `emulator_host = '{address}'`), inserts `rows` and
/// checks that the statement failed at once, saying nothing answers at `address`.
async fn assert_fails_fast_naming_the_address(create: &str, insert_sql: &str, address: &str) {
    let ctx = gcp_sql::sql::new_context();
    exec(&ctx, create).await;
    let done = insert(&ctx, insert_sql).await;
    let error = done.error();
    assert!(
        error.contains(&format!(
            "connection refused at {address} (emulator_host): nothing answers at that address"
        )),
        "{error}"
    );
    assert!(error.contains("after 1 attempt(s)"), "{error}");
    assert!(error.contains("UNAVAILABLE"), "{error}");
    assert_eq!(done.metric(names::RETRIES), 0, "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pubsub_sink_fails_fast_when_nothing_listens_at_its_emulator_host() {
    let address = closed_address();
    assert_fails_fast_naming_the_address(
        &format!(
            "CREATE TABLE t (data VARCHAR) WITH (connector = 'pubsub', \
             topic = 'projects/errors/topics/nowhere', emulator_host = '{address}')"
        ),
        "INSERT INTO t VALUES ('a'), ('b'), ('c')",
        &address,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cloud_tasks_sink_fails_fast_when_nothing_listens_at_its_emulator_host() {
    let address = closed_address();
    assert_fails_fast_naming_the_address(
        &format!(
            "CREATE TABLE t (body VARCHAR) WITH (connector = 'cloud_tasks', \
             queue = 'projects/errors/locations/us-central1/queues/nowhere', \
             url = 'https://w.example.com/', emulator_host = '{address}')"
        ),
        "INSERT INTO t VALUES ('a'), ('b')",
        &address,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bigtable_sink_fails_fast_when_nothing_listens_at_its_emulator_host() {
    let address = closed_address();
    assert_fails_fast_naming_the_address(
        &format!(
            "CREATE TABLE t (id VARCHAR, v BIGINT) WITH (connector = 'bigtable', \
             table = 'projects/errors/instances/main/tables/nowhere', row_key = 'id', \
             auto_create_table = true, emulator_host = '{address}')"
        ),
        "INSERT INTO t VALUES ('a', 1), ('b', 2)",
        &address,
    )
    .await;
}

/// A context with the sinks and the inspection functions pointed at the shared emulator.
fn inspection_context(host: &str) -> SessionContext {
    let ctx = gcp_sql::sql::new_context();
    ctx.register_udtf(
        "pubsub_subscribe",
        Arc::new(PubSubSubscribeFunction::with_emulator_host(host)),
    );
    ctx.register_udtf(
        "pubsub_pull",
        Arc::new(PubSubPullFunction::with_emulator_host(host)),
    );
    ctx
}

/// The single `BIGINT` of a one-row answer, by column.
async fn counts(ctx: &SessionContext, sql: &str) -> Vec<i64> {
    let batches = gcp_sql::sql::run(ctx, sql)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{sql}"));
    let batch = batches.first().expect("one batch");
    assert_eq!(batch.num_rows(), 1, "{sql}");
    batch
        .columns()
        .iter()
        .map(|c| c.as_primitive::<Int64Type>().value(0))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubsub_pull_reads_a_backlog_larger_than_one_page_to_the_end() {
    let admin = PubSubAdmin::connect().await;
    let ctx = inspection_context(&admin.host);
    let id = unique("backlog");
    let topic = format!("projects/errors/topics/{id}");
    let subscription = format!("projects/errors/subscriptions/{id}-look");

    // The subscription (and its topic) first: it sees what is published after it exists.
    let batches = gcp_sql::sql::run(
        &ctx,
        &format!("SELECT created FROM pubsub_subscribe('{topic}', '{subscription}')"),
    )
    .await
    .unwrap();
    assert!(batches[0].column(0).as_boolean().value(0), "created");
    let again = gcp_sql::sql::run(
        &ctx,
        &format!("SELECT created FROM pubsub_subscribe('{topic}', '{subscription}')"),
    )
    .await
    .unwrap();
    assert!(!again[0].column(0).as_boolean().value(0), "already there");

    // Three pages and a half of 2 KB messages.
    let rows = PULL_PAGE_MESSAGES * 3 + PULL_PAGE_MESSAGES / 2;
    exec(
        &ctx,
        &format!(
            "CREATE TABLE t (data VARCHAR) WITH (connector = 'pubsub', topic = '{topic}', \
             emulator_host = '{}')",
            admin.host
        ),
    )
    .await;
    let done = insert(
        &ctx,
        &format!(
            "INSERT INTO t SELECT concat(CAST(value AS VARCHAR), '-', repeat('x', 2000)) AS data \
             FROM generate_series(1, {rows})"
        ),
    )
    .await;
    assert_eq!(done.count(), rows as u64);

    let pulled = counts(
        &ctx,
        &format!(
            "SELECT count(*) AS n, count(DISTINCT message_id) AS ids, \
             count(DISTINCT split_part(data, '-', 1)) AS payloads \
             FROM pubsub_pull('{subscription}', {rows})"
        ),
    )
    .await;
    assert_eq!(pulled, vec![rows as i64; 3], "rows, message ids, payloads");

    // Every page was acknowledged: nothing is left to pull.
    let left = gcp_sql::sql::run(
        &ctx,
        &format!("SELECT message_id FROM pubsub_pull('{subscription}', 10)"),
    )
    .await
    .unwrap();
    let left: usize = left.iter().map(|b| b.num_rows()).sum();
    assert_eq!(left, 0, "messages left after the pull");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubsub_pull_checks_its_subscription_before_calling_the_emulator() {
    let admin = PubSubAdmin::connect().await;
    let ctx = inspection_context(&admin.host);
    let err = gcp_sql::sql::run(
        &ctx,
        "SELECT * FROM pubsub_pull('projects/errors/subscription/look')",
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("'pubsub_pull subscription'")
            && err.contains("expected 'projects/PROJECT/subscriptions/SUBSCRIPTION'"),
        "{err}"
    );
    assert!(!err.contains("Invalid [subscriptions] name"), "{err}");
    let err = gcp_sql::sql::run(
        &ctx,
        "SELECT * FROM pubsub_subscribe('projects/errors/topics/clicks', 'projects/errors/subscriptions/s!')",
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("subscription id has 3 to 255"), "{err}");
}
