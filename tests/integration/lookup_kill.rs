//! A lookup join between a subscription and a Bigtable sink, killed with SIGKILL (issue 34,
//! ADR 0078): every message of the null server's in-memory subscription (ADR 0075, whose lapsed
//! leases come back at once, as the service's do) is joined with its profile row and lands in
//! Bigtable with that profile's values, and every message is acknowledged on the server, after
//! runs of the `gcp-sql` binary killed in the middle of their reading. The output is read back
//! with the test's own Bigtable client, not through the tool.

use std::path::Path;
use std::time::Duration;

use gcp_sql::bench::null_server::{
    FeedOptions, NullServer, NullServerOptions, NullService, Payload,
};

use crate::a_pubsub_source_kill::{in_memory_stats, kill, spawn};
use crate::support::bigtable::Bigtable;
use crate::support::{text, unique};

/// How long the server leases a message at most: a killed run's messages come back this soon.
const LEASE: Duration = Duration::from_secs(2);

/// The user message `n` clicks on: one of `profiles` users, and every 50th message a user with
/// no profile (`nobody-…`), which the INNER join drops.
fn user(n: u64, profiles: u64) -> String {
    if n % 50 == 49 {
        format!("nobody-{n}")
    } else {
        format!("u{}", (n * 7919) % profiles)
    }
}

/// The pipeline of the binary: the subscription on `server`, the profiles and the output on the
/// Bigtable emulator at `bigtable`.
fn pipeline(
    subscription: &str,
    server: &str,
    profiles: &str,
    out: &str,
    bigtable: &str,
    last: bool,
) -> String {
    let idle = if last { ", stop_after_idle = '6s'" } else { "" };
    format!(
        "CREATE TABLE clicks (id BIGINT, user VARCHAR)
           WITH (connector = 'pubsub', subscription = '{subscription}', emulator_host = '{server}',
                 format = 'json', parallel_pull_count = 2, max_outstanding_messages = 2000,
                 ack_deadline = '10s'{idle});
         CREATE TABLE profiles (k VARCHAR NOT NULL, name VARCHAR, tier BIGINT)
           WITH (connector = 'bigtable', table = '{profiles}', emulator_host = '{bigtable}',
                 row_key = 'k', column_family = 'p');
         CREATE TABLE enriched (id VARCHAR, user VARCHAR, name VARCHAR, tier BIGINT)
           WITH (connector = 'bigtable', table = '{out}', emulator_host = '{bigtable}',
                 row_key = 'id', column_family = 'c');
         INSERT INTO enriched
         SELECT lpad(CAST(c.id AS VARCHAR), 7, '0'), c.user, p.name, p.tier
         FROM clicks c JOIN profiles p ON p.k = c.user;\n"
    )
}

/// `messages` clicks joined with `profiles` profile rows; the binary killed `kills` times,
/// each time once a share of the backlog was acknowledged (or after 20 s without), then run to
/// its end.
async fn lookups_survive_kills(messages: u64, profiles: u64, kills: usize) {
    let server = NullServer::start(
        "127.0.0.1:0".parse().unwrap(),
        NullServerOptions::new(
            NullService::PubSubSubscribe,
            FeedOptions {
                messages,
                message_size: 40,
                max_ack_deadline: Some(LEASE),
                payload: Some(Payload::new(move |n| {
                    format!("{{\"id\":{n},\"user\":\"{}\"}}", user(n, profiles)).into_bytes()
                })),
                ..FeedOptions::default()
            },
        ),
    )
    .await
    .unwrap();
    let bt = Bigtable::connect().await;
    let profile_table = Bigtable::table_name("lookup-kill-p");
    let out = Bigtable::table_name("lookup-kill-out");
    bt.create_table(&profile_table, &["p"]).await;
    bt.create_table(&out, &["c"]).await;
    // The profiles, written by the tool's own sink in-process.
    let ctx = datafusion::prelude::SessionContext::new_with_state(
        gcp_sql::sql::new_state_builder().build(),
    );
    gcp_sql::sql::register(&ctx);
    gcp_sql::sql::run(
        &ctx,
        &format!(
            "{};
             INSERT INTO profiles SELECT 'u' || CAST(v AS VARCHAR), 'name-' || CAST(v AS VARCHAR),
               v % 5 FROM generate_series(0, {}) AS t(v)",
            bt.create_sql(
                "profiles",
                "k VARCHAR NOT NULL, name VARCHAR, tier BIGINT",
                &profile_table,
                &[("row_key", "k"), ("column_family", "p")]
            ),
            profiles - 1
        ),
    )
    .await
    .expect("the profiles are written");

    let home = tempfile::tempdir().unwrap();
    let subscription = format!("projects/kill-tests/subscriptions/{}", unique("lookup"));
    let host = server.addr().to_string();
    let running = home.path().join("running.sql");
    let last = home.path().join("last.sql");
    for (path, is_last) in [(&running, false), (&last, true)] {
        let sql = pipeline(
            &subscription,
            &host,
            &profile_table,
            &out,
            &bt.host,
            is_last,
        );
        std::fs::write(path, sql).unwrap();
    }

    let share = messages / (kills as u64 + 2);
    for k in 0..kills {
        let child = spawn(home.path(), &running, true);
        let before = in_memory_stats(&server, &subscription).acked;
        let until = tokio::time::Instant::now() + Duration::from_secs(20);
        while in_memory_stats(&server, &subscription).acked < before + share
            && tokio::time::Instant::now() < until
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        kill(child);
        let stats = in_memory_stats(&server, &subscription);
        eprintln!(
            "kill {}: {} acknowledged, {} leased",
            k + 1,
            stats.acked,
            stats.outstanding
        );
    }
    run_to_end(home.path(), &last).await;

    let stats = in_memory_stats(&server, &subscription);
    assert_eq!(
        stats.acked, messages,
        "every message acknowledged on the server ({stats:?})"
    );
    let landed = bt.read(&out).await;
    let mut expected = 0;
    for n in 0..messages {
        let u = user(n, profiles);
        let key = format!("{n:07}");
        let row = landed.get(key.as_bytes());
        if u.starts_with("nobody") {
            assert!(row.is_none(), "message {n} has no profile and no row");
            continue;
        }
        expected += 1;
        let cells = row.unwrap_or_else(|| panic!("message {n}'s row landed"));
        let cell = |q: &str| {
            cells
                .iter()
                .find(|c| c.qualifier == q.as_bytes())
                .map(|c| c.value.clone())
                .unwrap_or_else(|| panic!("cell {q} of message {n}"))
        };
        let p: i64 = u[1..].parse().unwrap();
        assert_eq!(cell("user"), u.as_bytes(), "message {n}");
        assert_eq!(cell("name"), format!("name-{p}").as_bytes(), "message {n}");
        // A BIGINT cell is its 8 big-endian bytes (docs/bigtable.md).
        assert_eq!(cell("tier"), (p % 5).to_be_bytes(), "message {n}");
    }
    assert_eq!(landed.len(), expected, "no other row landed");
    eprintln!(
        "{messages} messages, {expected} joined rows landed; {} deliveries, {} redelivered",
        stats.delivered, stats.redelivered
    );
}

/// The tool run on `file` until its source is idle; its summary printed.
async fn run_to_end(home: &Path, file: &Path) {
    let child = spawn(home, file, false);
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    eprintln!(
        "final run: {}",
        stderr
            .lines()
            .filter(|l| l.starts_with("Source: ") || l.contains("LookupJoin"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
}

/// The CI size: 10,000 messages against 1,000 profiles, two kills.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_pipeline_killed_twice_lands_every_joined_row_and_acknowledges_every_message() {
    lookups_survive_kills(10_000, 1_000, 2).await;
}

/// The size: 100,000 messages against 10,000 profiles, two kills.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "100,000 messages take a few minutes on the emulator; the result is in docs/benchmarks.md"]
async fn a_lookup_pipeline_of_100k_messages_killed_twice_lands_every_joined_row() {
    lookups_survive_kills(100_000, 10_000, 2).await;
}
