//! Replicas: two `gcp-sql` processes run the same Pub/Sub → Bigtable pipeline file on one
//! subscription and share its messages (the emulator balances them across the two streaming
//! pulls). Without a kill, every message lands once and both replicas read some; with one
//! replica killed by SIGKILL mid-run, the other (run again, as an operator would, until the
//! killed one's leases came back) lands every message, and the duplicates — rows written
//! twice, seen as a second cell version — are counted and bounded by what the killed replica
//! could hold (`max_outstanding_messages` × `parallel_pull_count`).
//!
//! Every row is read back with the test support's Bigtable client, independent of the sink.

use std::collections::BTreeSet;
use std::process::Child;
use std::time::Duration;

use gcloud_sdk::google::pubsub::v1::publisher_client::PublisherClient;
use gcloud_sdk::google::pubsub::v1::subscriber_client::SubscriberClient;
use gcloud_sdk::google::pubsub::v1::{PublishRequest, PubsubMessage, Subscription, Topic};

use crate::a_pubsub_source_kill::spawn;
use crate::support::bigtable::{Bigtable, Rows};
use crate::support::{PubSubAdmin, text, unique};

/// The subscription's and the streams' ack deadline (the shortest Pub/Sub allows): a killed
/// replica's messages go to the other one this soon, or some time later on the emulator
/// (docs/service_facts.md).
const ACK_DEADLINE_SECS: i32 = 10;

/// One subscription with `messages` messages `{"id": i, "body": "event i"}` published (after
/// `publish_after`, counted from the call, so that readers started meanwhile are connected),
/// and an empty Bigtable table with family `c`.
struct Setup {
    pubsub: String,
    subscription: String,
    topic: String,
    publisher: PublisherClient<tonic::transport::Channel>,
    bt: Bigtable,
    table: String,
}

impl Setup {
    async fn new(prefix: &str) -> Setup {
        let admin = PubSubAdmin::connect().await;
        let channel = gcp_sql::emulators::plaintext_channel(&admin.host)
            .await
            .unwrap();
        let id = unique(prefix);
        let topic = format!("projects/replica-tests/topics/{id}");
        let subscription = format!("projects/replica-tests/subscriptions/{id}-sub");
        let mut publisher = PublisherClient::new(channel.clone());
        publisher
            .create_topic(Topic {
                name: topic.clone(),
                ..Default::default()
            })
            .await
            .expect("CreateTopic");
        SubscriberClient::new(channel)
            .create_subscription(Subscription {
                name: subscription.clone(),
                topic: topic.clone(),
                ack_deadline_seconds: ACK_DEADLINE_SECS,
                ..Default::default()
            })
            .await
            .expect("CreateSubscription");
        let bt = Bigtable::connect().await;
        let table = Bigtable::table_name(prefix);
        bt.create_table(&table, &["c"]).await;
        Setup {
            pubsub: admin.host,
            subscription,
            topic,
            publisher,
            bt,
            table,
        }
    }

    async fn publish(&mut self, messages: i64) {
        let all: Vec<PubsubMessage> = (0..messages)
            .map(|i| PubsubMessage {
                data: serde_json::json!({ "id": i, "body": format!("event {i}") })
                    .to_string()
                    .into(),
                ..Default::default()
            })
            .collect();
        for chunk in all.chunks(1000) {
            self.publisher
                .publish(PublishRequest {
                    topic: self.topic.clone(),
                    messages: chunk.to_vec(),
                })
                .await
                .expect("Publish");
        }
    }

    /// The pipeline file every replica runs. A flush point every half second, so that a
    /// replica's stderr tells how far it had got when it is killed.
    fn pipeline(&self, idle: &str, pulls: u32, outstanding: u32) -> String {
        format!(
            "CREATE TABLE events_in (id BIGINT, body VARCHAR) WITH (connector = 'pubsub', \
               subscription = '{}', emulator_host = '{}', format = 'json', \
               parallel_pull_count = {pulls}, max_outstanding_messages = {outstanding}, \
               ack_deadline = '{ACK_DEADLINE_SECS}s', stop_after_idle = '{idle}');
             CREATE TABLE events_bt (id VARCHAR, body VARCHAR) WITH (connector = 'bigtable', \
               table = '{}', emulator_host = '{}', row_key = 'id', column_family = 'c', \
               flush_interval = '500ms');
             INSERT INTO events_bt SELECT lpad(CAST(id AS VARCHAR), 6, '0'), upper(body) FROM events_in;\n",
            self.subscription, self.pubsub, self.table, self.bt.host
        )
    }

    /// Every row of the table, read in key ranges of 1,000 (`000000`-`000999`, ...).
    async fn read_all(&self, messages: i64) -> Rows {
        let mut rows = Rows::new();
        for k in 0..(messages + 999) / 1000 {
            let (start, end) = (format!("{k:03}"), format!("{:03}", k + 1));
            rows.extend(
                self.bt
                    .read_range(&self.table, start.as_bytes(), end.as_bytes())
                    .await,
            );
        }
        rows
    }
}

/// The source's counts (read, acknowledged, nacked) of a replica's output: its summary's
/// `Source:` line if it has one (a graceful end), else the last flush-point line's
/// `; source: ...` (a killed replica), else `None` (it printed neither).
fn source_counts(stderr: &str) -> Option<[u64; 3]> {
    let numbers = |s: &str| -> [u64; 3] {
        let n: Vec<u64> = s
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse().ok())
            .take(3)
            .collect();
        [n[0], n[1], n[2]]
    };
    if let Some(line) = stderr.lines().find(|l| l.starts_with("Source: ")) {
        return Some(numbers(line));
    }
    stderr
        .lines()
        .filter_map(|l| l.split_once("; source: ").map(|(_, s)| s))
        .next_back()
        .map(numbers)
}

/// Waits for a replica that ends by itself; its stderr, after checking it ended well and its
/// graceful end acknowledged everything it read.
async fn finish(child: Child, name: &str) -> (String, [u64; 3]) {
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{name}: {stderr}");
    let counts = source_counts(&stderr).unwrap_or([0; 3]);
    assert_eq!(
        counts[0], counts[1],
        "{name}: a graceful end acknowledges everything it read: {counts:?}"
    );
    assert_eq!(counts[2], 0, "{name}: nothing read was handed back");
    (stderr, counts)
}

/// Every id `0..messages` has its row with its body, and there is no other row. Returns the
/// number of rows written more than once and the number of extra writes (a row written twice
/// at two clock versions has two `body` cells).
fn check_every_message(rows: &Rows, messages: i64) -> (usize, usize) {
    let keys: BTreeSet<String> = rows
        .keys()
        .map(|k| String::from_utf8(k.clone()).unwrap())
        .collect();
    let expected: BTreeSet<String> = (0..messages).map(|i| format!("{i:06}")).collect();
    let missing: Vec<&String> = expected.difference(&keys).take(10).collect();
    assert!(
        missing.is_empty(),
        "rows missing from Bigtable, e.g. {missing:?}"
    );
    assert_eq!(keys.len(), messages as usize, "no other row");
    let (mut twice, mut extra) = (0, 0);
    for (key, cells) in rows {
        let i: i64 = String::from_utf8_lossy(key).parse().unwrap();
        let bodies: Vec<_> = cells.iter().filter(|c| c.qualifier == b"body").collect();
        assert!(!bodies.is_empty(), "row {i} has a body");
        assert!(
            bodies
                .iter()
                .all(|c| c.family == "c" && c.value == format!("EVENT {i}").into_bytes()),
            "row {i}'s body, in every version"
        );
        if bodies.len() > 1 {
            twice += 1;
            extra += bodies.len() - 1;
        }
    }
    (twice, extra)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_subscription_and_land_every_message_once() {
    const MESSAGES: i64 = 2_000;
    let mut setup = Setup::new("replicas").await;
    let home = tempfile::tempdir().unwrap();
    let file = home.path().join("pipeline.sql");
    // A small flow-control window, so that neither stream can take the whole backlog at once.
    std::fs::write(&file, setup.pipeline("4s", 1, 100)).unwrap();
    let a = spawn(home.path(), &file, false);
    let b = spawn(home.path(), &file, false);
    // Published once both replicas had time to open their streams (their idle clocks run from
    // then: 4 s is well past this wait).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    setup.publish(MESSAGES).await;
    let ((a_err, a), (b_err, b)) = tokio::join!(finish(a, "replica a"), finish(b, "replica b"));
    let flush_lines = |s: &str| s.lines().filter(|l| l.starts_with("flush point")).count();
    eprintln!(
        "replicas: {} and {} flush point line(s)",
        flush_lines(&a_err),
        flush_lines(&b_err)
    );
    let rows = setup.read_all(MESSAGES).await;
    let (twice, extra) = check_every_message(&rows, MESSAGES);
    eprintln!(
        "replicas: a read {} and acknowledged {}, b read {} and acknowledged {}; \
         {twice} row(s) written twice ({extra} extra write(s))",
        a[0], a[1], b[0], b[1]
    );
    assert!(
        a[0] > 0 && b[0] > 0,
        "Pub/Sub balanced the messages across both replicas: a {a:?}, b {b:?}"
    );
    // No replica failed, so nothing was delivered twice: each message read once in all.
    assert_eq!(a[0] + b[0], MESSAGES as u64, "a {a:?}, b {b:?}");
    assert_eq!((twice, extra), (0, 0), "no row written twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "about 80 s, mostly the survivor's 45 s stop_after_idle that waits for the emulator \
            to redeliver the killed replica's messages; run with --ignored (docs/benchmarks.md, \
            Replicas)"]
async fn two_replicas_one_killed_with_sigkill_land_every_message_with_bounded_duplicates() {
    const MESSAGES: i64 = 10_000;
    const PULLS: u32 = 2;
    const OUTSTANDING: u32 = 250;
    let mut setup = Setup::new("replicas-kill").await;
    setup.publish(MESSAGES).await;
    let home = tempfile::tempdir().unwrap();
    let file = home.path().join("pipeline.sql");
    // Well past the ack deadline: what the killed replica held comes back before the survivor
    // ends (mostly: the emulator hands expired leases out lazily, so the survivor's pipeline
    // is run again below, as in `pubsub_source_kill.rs`).
    std::fs::write(&file, setup.pipeline("45s", PULLS, OUTSTANDING)).unwrap();
    let mut killed = spawn(home.path(), &file, false);
    let survivor = spawn(home.path(), &file, false);

    // The killed replica's stderr, read as it comes: its flush-point lines say how far it got.
    let said = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let said = said.clone();
        let stderr = killed.stderr.take().expect("piped stderr");
        std::thread::spawn(move || {
            for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)) {
                let Ok(line) = line else { break };
                let mut said = said.lock().unwrap();
                said.push_str(&line);
                said.push('\n');
            }
        })
    };
    // The kill comes mid-run, right after a flush point at which the killed replica had read
    // a twentieth of the messages (bounded: a run that makes no progress is killed anyway, and
    // the checks below then fail).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let read = source_counts(&said.lock().unwrap()).map_or(0, |c| c[0]);
        if read >= MESSAGES as u64 / 20 || tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    killed.kill().expect("SIGKILL");
    let status = killed.wait().expect("reaped");
    assert!(!status.success(), "killed, not ended");
    reader.join().unwrap();
    let landed_at_kill = setup.read_all(MESSAGES).await.len();
    let killed_stderr = said.lock().unwrap().clone();
    // Its last flush point's counts, the last it said before the kill (it may have read more
    // since, up to its flow-control bound).
    let held = source_counts(&killed_stderr);
    eprintln!(
        "replicas-kill: killed with {landed_at_kill} row(s) in Bigtable; the killed replica \
         printed {} flush point line(s), the last with {held:?} (read, acknowledged, nacked)",
        killed_stderr
            .lines()
            .filter(|l| l.starts_with("flush point"))
            .count(),
    );
    let held = held.expect("the killed replica printed a flush point before the kill");
    assert!(
        landed_at_kill < MESSAGES as usize,
        "the kill came mid-run: {landed_at_kill} row(s) already landed"
    );

    let (_, first) = finish(survivor, "survivor").await;
    let mut survivor_read = first[0];
    eprintln!("replicas-kill: survivor run 1: {first:?}");
    // Expired leases the emulator had not yet handed out come back to a later run; at most
    // four more.
    for run in 2..=5 {
        let landed = setup.read_all(MESSAGES).await.len();
        if landed == MESSAGES as usize {
            break;
        }
        let (_, counts) = finish(spawn(home.path(), &file, false), "survivor").await;
        eprintln!("replicas-kill: survivor run {run} ({landed} row(s) before): {counts:?}");
        survivor_read += counts[0];
    }

    let rows = setup.read_all(MESSAGES).await;
    let (twice, extra) = check_every_message(&rows, MESSAGES);
    let bound = u64::from(PULLS * OUTSTANDING);
    // Every message was acknowledged once, by one replica, so the deliveries beyond one per
    // message are the duplicates: the killed replica's reads (as far as its last flush point
    // says: it may have read more since) plus the survivor's, minus the messages. They are the
    // messages the killed replica held, read again by the survivor.
    let delivered_twice = (held[0] + survivor_read).saturating_sub(MESSAGES as u64);
    let held_at_last_point = held[0].saturating_sub(held[1]);
    eprintln!(
        "replicas-kill: {MESSAGES} message(s) landed; the killed replica read {} and \
         acknowledged {} by its last flush point (held {held_at_last_point}); the survivor read \
         {survivor_read}; {delivered_twice} message(s) delivered twice; {twice} row(s) written \
         twice ({extra} extra write(s)); bound {bound} (max_outstanding_messages × \
         parallel_pull_count)",
        held[0], held[1]
    );
    assert!(
        extra as u64 <= bound,
        "{extra} duplicate write(s), more than the killed replica could hold ({bound})"
    );
    assert!(
        delivered_twice <= bound,
        "{delivered_twice} message(s) delivered twice, more than the killed replica could hold \
         ({bound})"
    );
}
