//! A Pub/Sub → Bigtable pipeline run by the `gcp-sql` binary and killed with SIGKILL several
//! times (once while Bigtable is unreachable), then run to its end: every message is in
//! Bigtable (read back with the Bigtable client), and after the last, graceful, end nothing is
//! left unacknowledged on the subscription. The same pipeline is also killed ten times against
//! the in-memory subscription of the null StreamingPull server, whose leases lapse in 2 s and
//! come back at once, so that run takes seconds rather than minutes.

use std::collections::BTreeSet;
use std::process::{Child, Stdio};
use std::time::Duration;

use gcloud_sdk::google::pubsub::v1::publisher_client::PublisherClient;
use gcloud_sdk::google::pubsub::v1::subscriber_client::SubscriberClient;
use gcloud_sdk::google::pubsub::v1::{
    PublishRequest, PubsubMessage, PullRequest, Subscription, Topic,
};

use crate::support::bigtable::Bigtable;
use crate::support::proxy::Proxy;
use crate::support::{PubSubAdmin, text, tool, unique};

/// Messages published before the first run.
const MESSAGES: i64 = 20_000;

/// The subscription's and the streams' ack deadline: a killed reader's messages come back to
/// the next run this soon.
const ACK_DEADLINE_SECS: i32 = 10;

/// The pipeline's SQL; `stop_after_idle` only for the last run.
fn pipeline_sql(
    subscription: &str,
    pubsub: &str,
    table: &str,
    bigtable: &str,
    last: bool,
) -> String {
    let idle = if last {
        // Well past the ack deadline: what the killed runs held comes back before it ends (the
        // emulator hands expired leases out again lazily, 15 s was measured too short).
        ", stop_after_idle = '45s'"
    } else {
        ""
    };
    format!(
        "CREATE TABLE events_in (id BIGINT, body VARCHAR) WITH (connector = 'pubsub', \
           subscription = '{subscription}', emulator_host = '{pubsub}', format = 'json', \
           parallel_pull_count = 2, max_outstanding_messages = 500, ack_deadline = '10s'{idle});
         CREATE TABLE events_bt (id VARCHAR, body VARCHAR) WITH (connector = 'bigtable', \
           table = '{table}', emulator_host = '{bigtable}', row_key = 'id', column_family = 'c');
         INSERT INTO events_bt SELECT lpad(CAST(id AS VARCHAR), 6, '0'), upper(body) FROM events_in;\n"
    )
}

/// The tool on `file`; `quiet` leaves out the summaries. A quiet run is one the test kills and
/// never waits for: its stderr goes to `killed-N.log` in `home` ([`killed_logs`]), not to a
/// pipe nobody reads, where a run that logs more than the pipe holds would block.
pub(crate) fn spawn(home: &std::path::Path, file: &std::path::Path, quiet: bool) -> Child {
    static KILLED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let mut command = tool(home);
    // The kill tests' children log what this names (a RUST_LOG filter), to trace a failure.
    if let Some(filter) = std::env::var_os("KILL_TESTS_RUST_LOG") {
        command.env("RUST_LOG", filter);
    }
    command.arg("-f").arg(file);
    if quiet {
        let n = KILLED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = std::fs::File::create(home.join(format!("killed-{n}.log"))).unwrap();
        command.arg("-q").stdout(Stdio::null()).stderr(log);
    } else {
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    command.spawn().expect("the gcp-sql binary runs")
}

/// The stderr of every killed run under `home`, by file name.
pub(crate) fn killed_logs(home: &std::path::Path) -> Vec<(String, String)> {
    let mut logs: Vec<(String, String)> = std::fs::read_dir(home)
        .unwrap()
        .filter_map(|e| {
            let path = e.ok()?.path();
            let name = path.file_name()?.to_string_lossy().to_string();
            name.starts_with("killed-")
                .then(|| (name, std::fs::read_to_string(&path).unwrap_or_default()))
        })
        .collect();
    logs.sort();
    logs
}

/// Every row of the pipeline's table, read in 20 key ranges of 1,000 (`000000`-`000999`, ...).
async fn read_all(bt: &Bigtable, table: &str) -> crate::support::bigtable::Rows {
    let mut rows = crate::support::bigtable::Rows::new();
    for k in 0..MESSAGES / 1000 {
        let (start, end) = (format!("{k:03}"), format!("{:03}", k + 1));
        rows.extend(bt.read_range(table, start.as_bytes(), end.as_bytes()).await);
    }
    rows
}

/// SIGKILL (`Child::kill` on Unix), then reap.
pub(crate) fn kill(mut child: Child) {
    child.kill().expect("SIGKILL");
    let status = child.wait().expect("reaped");
    assert!(!status.success(), "killed, not ended: {status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_killed_with_sigkill_several_times_loses_nothing() {
    let admin = PubSubAdmin::connect().await;
    let channel = gcp_sql::emulators::plaintext_channel(&admin.host)
        .await
        .unwrap();
    let id = unique("kill");
    let topic = format!("projects/kill-tests/topics/{id}");
    let subscription = format!("projects/kill-tests/subscriptions/{id}-sub");
    PublisherClient::new(channel.clone())
        .create_topic(Topic {
            name: topic.clone(),
            ..Default::default()
        })
        .await
        .expect("CreateTopic");
    let mut subscriber = SubscriberClient::new(channel.clone());
    subscriber
        .create_subscription(Subscription {
            name: subscription.clone(),
            topic: topic.clone(),
            ack_deadline_seconds: ACK_DEADLINE_SECS,
            ..Default::default()
        })
        .await
        .expect("CreateSubscription");
    let mut publisher = PublisherClient::new(channel);
    let messages: Vec<PubsubMessage> = (0..MESSAGES)
        .map(|i| PubsubMessage {
            data: serde_json::json!({ "id": i, "body": format!("event {i}") })
                .to_string()
                .into(),
            ..Default::default()
        })
        .collect();
    for chunk in messages.chunks(1000) {
        publisher
            .publish(PublishRequest {
                topic: topic.clone(),
                messages: chunk.to_vec(),
            })
            .await
            .expect("Publish");
    }
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("kill");
    bt.create_table(&table, &["c"]).await;
    // Bigtable behind a proxy that can stop forwarding: the sink cannot reach it then.
    let proxy = Proxy::start(&bt.host).await;

    let home = tempfile::tempdir().unwrap();
    let running = home.path().join("running.sql");
    let last = home.path().join("last.sql");
    std::fs::write(
        &running,
        pipeline_sql(&subscription, &admin.host, &table, &proxy.host(), false),
    )
    .unwrap();
    std::fs::write(
        &last,
        pipeline_sql(&subscription, &admin.host, &table, &proxy.host(), true),
    )
    .unwrap();

    let mut landed_after_kill = Vec::new();
    let mut landed = 0;
    for (run, more, unreachable) in [(1, 1000, false), (2, 3000, true), (3, 2000, false)] {
        let child = spawn(home.path(), &running, true);
        // The kill comes mid-stream: once `more` rows landed in this run, however long the
        // binary takes to start (bounded: a run that makes no progress is killed anyway).
        let target = (landed + more).min(MESSAGES as usize - 1000);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while read_all(&bt, &table).await.len() < target && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        if unreachable {
            // Bigtable goes silent with rows in flight; the kill comes while they wait.
            proxy.stall_for(Duration::from_secs(4));
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        kill(child);
        landed = read_all(&bt, &table).await.len();
        eprintln!("run {run}: killed with {landed} row(s) in Bigtable");
        landed_after_kill.push(landed);
        if unreachable {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
    }
    assert!(
        landed_after_kill
            .iter()
            .all(|&n| n > 0 && n < MESSAGES as usize),
        "every kill came mid-stream: {landed_after_kill:?}"
    );

    // Then the pipeline runs to its end: each run reads until the subscription stays empty and
    // stops gracefully. The emulator hands out the killed runs' expired leases lazily (later
    // still on a busy machine: a block of 100 messages a killed stream held has come back only
    // after a whole run had idled 45 s), so the job is run again, as an operator would, until
    // every row is there; at most six runs.
    // It ends when a run found the subscription empty with every row landed; a run that finds
    // nothing while rows are missing does not end it, since an unacknowledged message is not
    // lost and comes back. A lost one never does, and the checks below fail. Every run's
    // graceful end acknowledges all it read: its summary says so.
    for run in 1..=6 {
        let child = spawn(home.path(), &last, false);
        let output = tokio::task::spawn_blocking(move || child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        let stderr = text(&output.stderr);
        assert!(output.status.success(), "{stderr}");
        let source = stderr
            .lines()
            .find(|l| l.starts_with("Source: "))
            .unwrap_or("Source: 0 message(s) read, 0 acknowledged, 0 nacked");
        let counts: Vec<u64> = source
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse().ok())
            .collect();
        let landed = read_all(&bt, &table).await.len();
        eprintln!("final run {run}: {source}; {landed} row(s) in Bigtable");
        assert_eq!(
            counts[0], counts[1],
            "a graceful end acknowledges everything it read: {source}"
        );
        assert_eq!(counts[2], 0, "nothing read was handed back: {source}");
        if counts[0] == 0 && landed == MESSAGES as usize {
            break;
        }
    }

    let rows = read_all(&bt, &table).await;
    let keys: BTreeSet<String> = rows
        .keys()
        .map(|k| String::from_utf8(k.clone()).unwrap())
        .collect();
    let expected: BTreeSet<String> = (0..MESSAGES).map(|i| format!("{i:06}")).collect();
    let missing: Vec<&String> = expected.difference(&keys).take(10).collect();
    assert!(
        missing.is_empty(),
        "rows missing from Bigtable, e.g. {missing:?}"
    );
    assert_eq!(keys.len(), MESSAGES as usize, "no other row");
    for (key, cells) in &rows {
        let i: i64 = String::from_utf8_lossy(key).parse().unwrap();
        assert!(
            cells
                .iter()
                .any(|c| c.qualifier == b"body" && c.value == format!("EVENT {i}").into_bytes()),
            "row {i}'s body"
        );
    }

    // Nothing left: after the ack deadline, an independent pull gets nothing.
    tokio::time::sleep(Duration::from_secs(ACK_DEADLINE_SECS as u64 + 2)).await;
    #[allow(deprecated)] // return_immediately: the emulator honours it.
    let left = subscriber
        .pull(PullRequest {
            subscription: subscription.clone(),
            max_messages: 1000,
            return_immediately: true,
        })
        .await
        .expect("Pull")
        .into_inner()
        .received_messages;
    assert!(
        left.is_empty(),
        "{} message(s) left unacknowledged after the graceful end",
        left.len()
    );
}

/// Messages in the null StreamingPull server's backlog for the in-memory kill test: four times
/// what the ten killed runs are made to acknowledge ([`IN_MEMORY_KILL_STEP`]), so that a run
/// which acknowledges far past its mark before the kill reaches it (a loaded machine, one whole
/// sink flush) still leaves the backlog unfinished.
const IN_MEMORY_MESSAGES: u64 = 20_000;
/// Run `k` of the killed ones is killed once the server counted `k` times this many
/// acknowledgements in all, and at least one of its own.
const IN_MEMORY_KILL_STEP: u64 = 500;
/// Data bytes of each of them: `{"id":N,"body":"xx…"}`.
const IN_MEMORY_MESSAGE_SIZE: usize = 64;
/// The longest lease the in-memory server grants, whatever the source asks (10 s at least):
/// a killed run's messages come back this soon.
const IN_MEMORY_LEASE: Duration = Duration::from_secs(2);
/// SIGKILLs before the last run.
const IN_MEMORY_KILLS: usize = 10;

/// The pipeline of the in-memory kill test: the null StreamingPull server at `server` into
/// Bigtable; `stop_after_idle` (well past the server's lease) only for the last run.
fn in_memory_sql(
    subscription: &str,
    server: &str,
    table: &str,
    bigtable: &str,
    last: bool,
) -> String {
    let idle = if last { ", stop_after_idle = '5s'" } else { "" };
    format!(
        "CREATE TABLE events_in (id BIGINT, body VARCHAR) WITH (connector = 'pubsub', \
           subscription = '{subscription}', emulator_host = '{server}', format = 'json', \
           parallel_pull_count = 2, max_outstanding_messages = 100, ack_deadline = '10s'{idle});
         CREATE TABLE events_bt (id VARCHAR, body VARCHAR) WITH (connector = 'bigtable', \
           table = '{table}', emulator_host = '{bigtable}', row_key = 'id', column_family = 'c');
         INSERT INTO events_bt SELECT lpad(CAST(id AS VARCHAR), 6, '0'), upper(body) FROM events_in;\n"
    )
}

/// The subscription's counts on the in-memory server.
pub(crate) fn in_memory_stats(
    server: &gcp_sql::bench::null_server::NullServer,
    subscription: &str,
) -> gcp_sql::connectors::pubsub::null_subscribe::subscription::SubscriptionStats {
    let details = server
        .details()
        .expect("the subscription server keeps details");
    let hub = details
        .as_any()
        .downcast_ref::<gcp_sql::connectors::pubsub::null_subscribe::Hub>()
        .expect("the subscription server's details are its hub");
    hub.stats()
        .into_iter()
        .find(|(name, _)| name == subscription)
        .map(|(_, stats)| stats)
        .unwrap_or_default()
}

/// The same pipeline against the null StreamingPull server (`gcp-sql serve-null --service
/// pubsub-subscribe`, here in-process), whose leases lapse after 2 s and whose lapsed
/// messages come back at once (the emulator hands a killed reader's messages out again only in
/// blocks, 15-60 s later): killed ten times, then run to its end, every message is in Bigtable
/// and acknowledged on the server; what was delivered more than once is counted and printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_killed_ten_times_against_the_in_memory_subscription_loses_nothing() {
    use gcp_sql::bench::null_server::{FeedOptions, NullServer, NullServerOptions, NullService};

    let server = NullServer::start(
        "127.0.0.1:0".parse().unwrap(),
        NullServerOptions::new(
            NullService::PubSubSubscribe,
            FeedOptions {
                messages: IN_MEMORY_MESSAGES,
                message_size: IN_MEMORY_MESSAGE_SIZE,
                ordering_keys: 0,
                max_ack_deadline: Some(IN_MEMORY_LEASE),
                payload: None,
                publish_time_step: None,
                lose_lease_every: None,
            },
        ),
    )
    .await
    .unwrap();
    let subscription = format!("projects/kill-tests/subscriptions/{}", unique("mem-kill"));
    let bt = Bigtable::connect().await;
    let table = Bigtable::table_name("mem-kill");
    bt.create_table(&table, &["c"]).await;

    let home = tempfile::tempdir().unwrap();
    let running = home.path().join("running.sql");
    let last = home.path().join("last.sql");
    let host = server.addr().to_string();
    std::fs::write(
        &running,
        in_memory_sql(&subscription, &host, &table, &bt.host, false),
    )
    .unwrap();
    std::fs::write(
        &last,
        in_memory_sql(&subscription, &host, &table, &bt.host, true),
    )
    .unwrap();

    // Each run is killed at a mark of the server's acknowledgements counted from the start, not
    // from where the run began (or after 30 s without reaching it): a run that overshoots its
    // mark, as acknowledgements come in steps of a sink flush and the kill lands a poll later,
    // does not push the next runs' marks along. The ten kills end near 5,000 of the 20,000
    // (5,050-5,500 measured) unless runs overshoot by more than a step, run after run.
    let mut acked_after_kill = Vec::new();
    for run in 1..=IN_MEMORY_KILLS {
        let before = in_memory_stats(&server, &subscription).acked;
        let mark = (before + 1).max(run as u64 * IN_MEMORY_KILL_STEP);
        let child = spawn(home.path(), &running, true);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while in_memory_stats(&server, &subscription).acked < mark
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        kill(child);
        let stats = in_memory_stats(&server, &subscription);
        eprintln!(
            "run {run}: killed with {} acknowledged, {} leased",
            stats.acked, stats.outstanding
        );
        acked_after_kill.push(stats.acked);
    }
    assert!(
        std::iter::once(0)
            .chain(acked_after_kill.iter().copied())
            .collect::<Vec<_>>()
            .windows(2)
            .all(|w| w[0] < w[1] && w[1] < IN_MEMORY_MESSAGES),
        "every run made progress and was killed mid-stream: {acked_after_kill:?}"
    );

    // The last run: the killed runs' leases lapse within 2 s and come back; it ends after 5 s
    // without a message. Run again (at most twice more) if something is still unacknowledged.
    for run in 1..=3 {
        let child = spawn(home.path(), &last, false);
        let output = tokio::task::spawn_blocking(move || child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        let stderr = text(&output.stderr);
        assert!(output.status.success(), "{stderr}");
        let source = stderr
            .lines()
            .find(|l| l.starts_with("Source: "))
            .unwrap_or("Source: 0 message(s) read, 0 acknowledged, 0 nacked")
            .to_string();
        let counts: Vec<u64> = source
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse().ok())
            .collect();
        eprintln!("final run {run}: {source}");
        assert_eq!(
            counts[0], counts[1],
            "a graceful end acknowledges all it read: {source}"
        );
        if in_memory_stats(&server, &subscription).acked == IN_MEMORY_MESSAGES {
            break;
        }
    }

    let stats = in_memory_stats(&server, &subscription);
    eprintln!(
        "in-memory subscription after {IN_MEMORY_KILLS} kills: {} messages, {} deliveries, \
         {} duplicates (deliveries of a message delivered before), {} leases lapsed, \
         {} nacked, {} stale acknowledgements, most deliveries of one message {}",
        stats.messages,
        stats.delivered,
        stats.redelivered,
        stats.expired,
        stats.nacked,
        stats.stale,
        stats.max_attempts
    );
    assert_eq!(
        stats.acked, IN_MEMORY_MESSAGES,
        "every message acknowledged: {stats:?}"
    );
    assert_eq!(stats.outstanding, 0, "nothing left leased: {stats:?}");
    assert_eq!(stats.delivered, IN_MEMORY_MESSAGES + stats.redelivered);

    let rows = bt.read_range(&table, b"000000", b"999999").await;
    let keys: BTreeSet<String> = rows
        .keys()
        .map(|k| String::from_utf8(k.clone()).unwrap())
        .collect();
    let expected: BTreeSet<String> = (0..IN_MEMORY_MESSAGES).map(|i| format!("{i:06}")).collect();
    let missing: Vec<&String> = expected.difference(&keys).take(10).collect();
    assert!(
        missing.is_empty(),
        "rows missing from Bigtable, e.g. {missing:?}"
    );
    assert_eq!(keys.len(), IN_MEMORY_MESSAGES as usize, "no other row");
    for (key, cells) in &rows {
        let i: u64 = String::from_utf8_lossy(key).parse().unwrap();
        // `{"id":` + digits + `,"body":"` + body + `"}` is the message's size.
        let body_len = IN_MEMORY_MESSAGE_SIZE - 17 - i.to_string().len();
        assert!(
            cells
                .iter()
                .any(|c| c.qualifier == b"body" && c.value == vec![b'X'; body_len]),
            "row {i}'s body"
        );
    }
}
