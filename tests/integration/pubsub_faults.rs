//! Fault tests of the Pub/Sub sink against a scripted fake Publisher service: the failures the
//! emulator cannot produce (throttling bursts, a message the service refuses inside a batch, a
//! service that refuses everything, a stall) and the publisher cap across many topics.
//!
//! The sink is declared in SQL and pointed at the fake with `emulator_host = '127.0.0.1:<port>'`;
//! the fake answers `/google.pubsub.v1.Publisher/Publish` (and `CreateTopic`) per call from a
//! script, and keeps every request, so a test can tell what was accepted, what was refused and
//! what was sent again. Durations are small to keep the tests fast; nothing asserts wall-clock
//! time.
//!
//! Run: `cargo test --test integration pubsub_faults::`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::support::{Insert, exec, insert, multiplicities};
use gcloud_sdk::google::pubsub::v1::{PublishRequest, PublishResponse, Topic};
use gcp_sql::core::metrics::names;
use gcp_sql::testing::{FakeServer, Reply, Script};
use tonic::Code;

const PUBLISH: &str = "/google.pubsub.v1.Publisher/Publish";
const CREATE_TOPIC: &str = "/google.pubsub.v1.Publisher/CreateTopic";
const TOPIC: &str = "projects/faults/topics/events";

/// A fake Publisher: a verdict per Publish request (`None` accepts it), the requests it
/// accepted, and a CreateTopic script.
struct FakePublisher {
    server: FakeServer,
    publish: Script<PublishRequest, PublishResponse>,
    create_topic: Script<Topic, Topic>,
    accepted: Arc<Mutex<Vec<PublishRequest>>>,
}

impl FakePublisher {
    /// Starts the fake. Queued replies (`publish.push`) answer the first calls; after them
    /// `verdict` decides: `Some(reply)` answers with it, `None` accepts the request with one
    /// message id per message.
    async fn start(
        verdict: impl Fn(&PublishRequest) -> Option<Reply<PublishResponse>> + Send + Sync + 'static,
    ) -> Self {
        let publish: Script<PublishRequest, PublishResponse> = Script::new();
        let accepted: Arc<Mutex<Vec<PublishRequest>>> = Arc::default();
        let next_id = AtomicU64::new(1);
        publish.fallback({
            let accepted = accepted.clone();
            move |request| {
                if let Some(reply) = verdict(request) {
                    return reply;
                }
                accepted.lock().expect("lock").push(request.clone());
                let message_ids = request
                    .messages
                    .iter()
                    .map(|_| format!("fake-{}", next_id.fetch_add(1, Ordering::Relaxed)))
                    .collect();
                Reply::Ok(PublishResponse { message_ids })
            }
        });
        let create_topic: Script<Topic, Topic> = Script::new();
        let server = FakeServer::builder()
            .unary(PUBLISH, publish.clone())
            .unary(CREATE_TOPIC, create_topic.clone())
            .start()
            .await
            .expect("start the fake Publisher");
        FakePublisher {
            server,
            publish,
            create_topic,
            accepted,
        }
    }

    fn host(&self) -> String {
        self.server.addr().to_string()
    }

    /// `(topic, id)` of every accepted message, in the order the fake accepted them.
    fn accepted_ids(&self) -> Vec<(String, i64)> {
        self.accepted
            .lock()
            .expect("lock")
            .iter()
            .flat_map(|r| {
                let topic = r.topic.clone();
                r.messages
                    .iter()
                    .map(move |m| (topic.clone(), message_id(&m.data)))
            })
            .collect()
    }

    /// Ids of every accepted message.
    fn accepted_row_ids(&self) -> Vec<i64> {
        self.accepted_ids().into_iter().map(|(_, id)| id).collect()
    }
}

/// The `id` of a JSON payload `{"id":N,...}`.
fn message_id(data: &[u8]) -> i64 {
    let value: serde_json::Value = serde_json::from_slice(data).expect("JSON payload");
    value["id"].as_i64().expect("integer id")
}

fn contains_id(request: &PublishRequest, id: i64) -> bool {
    request.messages.iter().any(|m| message_id(&m.data) == id)
}

/// Declares `events (id BIGINT)` on the fake with `options`, and inserts ids 1..=rows.
async fn insert_rows(fake: &FakePublisher, rows: u32, options: &[(&str, &str)]) -> Insert {
    let ctx = gcp_sql::sql::new_context();
    let mut with = format!(
        "connector = 'pubsub', emulator_host = '{}', topic = '{TOPIC}'",
        fake.host()
    );
    for (k, v) in options {
        with.push_str(&format!(", {k} = '{v}'"));
    }
    exec(
        &ctx,
        &format!("CREATE TABLE events (id BIGINT) WITH ({with})"),
    )
    .await;
    insert(
        &ctx,
        &format!("INSERT INTO events SELECT value AS id FROM generate_series(1, {rows})"),
    )
    .await
}

fn all_ids(rows: u32) -> Vec<i64> {
    (1..=i64::from(rows)).collect()
}

fn sorted(mut v: Vec<i64>) -> Vec<i64> {
    v.sort_unstable();
    v
}

/// Fast retries: the scripted failures cost milliseconds.
const FAST_RETRY: [(&str, &str); 2] = [("retry_initial_delay", "5ms"), ("retry_max_delay", "20ms")];

// --- 7. retryable bursts ------------------------------------------------------------------------

#[tokio::test]
async fn retryable_bursts_are_retried_until_every_row_is_acknowledged() {
    let fake = FakePublisher::start(|_| None).await;
    for code in [
        Code::Unavailable,
        Code::ResourceExhausted,
        Code::Unavailable,
    ] {
        fake.publish.push(Reply::code(code));
    }
    let mut options = FAST_RETRY.to_vec();
    options.push(("batch_element_count_threshold", "50"));
    let done = insert_rows(&fake, 200, &options).await;

    assert_eq!(done.count(), 200);
    assert_eq!(done.metric(names::RECORDS_ACKED), 200);
    // Each record counts once as sent, however often it was retried.
    assert_eq!(done.metric(names::RECORDS_SENT), 200);
    assert_eq!(done.metric(names::RETRIES), 3);
    // The three failed calls were the first three; each record in them is one send error.
    let requests = fake.publish.requests();
    let failed: Vec<&PublishRequest> = requests.iter().take(3).collect();
    let failed_records: usize = failed.iter().map(|r| r.messages.len()).sum();
    assert_eq!(done.metric(names::SEND_ERRORS), failed_records);
    assert_eq!(
        done.errors_with_code("UNAVAILABLE"),
        failed[0].messages.len() + failed[2].messages.len()
    );
    assert_eq!(
        done.errors_with_code("RESOURCE_EXHAUSTED"),
        failed[1].messages.len()
    );

    // Every row accepted exactly once; sent again only as often as a failure implies.
    assert_eq!(sorted(fake.accepted_row_ids()), all_ids(200));
    let sent: usize = requests.iter().map(|r| r.messages.len()).sum();
    assert_eq!(sent, 200 + failed_records);
    assert_eq!(
        requests.len(),
        fake.accepted.lock().expect("lock").len() + 3
    );
}

#[tokio::test]
async fn a_retryable_failure_past_the_attempt_budget_fails_naming_the_code() {
    let fake = FakePublisher::start(|_| Some(Reply::code(Code::Unavailable))).await;
    let mut options = FAST_RETRY.to_vec();
    options.push(("retry_max_attempts", "3"));
    let done = insert_rows(&fake, 10, &options).await;
    let error = done.error();
    assert!(error.contains("UNAVAILABLE"), "{error}");
    assert!(error.contains("3 attempt(s)"), "{error}");
    assert!(error.contains(TOPIC), "{error}");
    assert_eq!(done.metric(names::RECORDS_ACKED), 0);
}

#[tokio::test]
async fn a_permission_error_fails_at_once_without_retrying() {
    let fake = FakePublisher::start(|_| Some(Reply::code(Code::PermissionDenied))).await;
    let done = insert_rows(&fake, 10, &FAST_RETRY).await;
    let error = done.error();
    assert!(error.contains("PERMISSION_DENIED"), "{error}");
    assert_eq!(done.metric(names::RETRIES), 0);
    assert_eq!(fake.publish.requests().len(), 1);
}

// --- 8. a bad message inside a batch ------------------------------------------------------------

const BAD_ID: i64 = 13;

fn refuse_the_bad_message(request: &PublishRequest) -> Option<Reply<PublishResponse>> {
    contains_id(request, BAD_ID).then(|| {
        Reply::Status(
            Code::InvalidArgument,
            format!("message {BAD_ID} is refused by the fake"),
        )
    })
}

#[tokio::test]
async fn a_rejected_message_is_isolated_and_dropped_under_the_drop_policy() {
    let fake = FakePublisher::start(refuse_the_bad_message).await;
    let done = insert_rows(
        &fake,
        100,
        &[
            ("failure_policy", "drop"),
            ("batch_element_count_threshold", "10"),
        ],
    )
    .await;

    assert_eq!(done.count(), 99);
    assert_eq!(done.metric(names::RECORDS_ACKED), 99);
    assert_eq!(done.metric(names::RECORDS_REJECTED), 1);
    assert_eq!(done.metric(names::RECORDS_DROPPED), 1);
    let expected: Vec<i64> = all_ids(100)
        .into_iter()
        .filter(|id| *id != BAD_ID)
        .collect();
    assert_eq!(sorted(fake.accepted_row_ids()), expected);
    // The isolation pass sent the bad message alone to confirm it.
    let requests = fake.publish.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.messages.len() == 1 && contains_id(r, BAD_ID)),
        "no solo publish of the bad message"
    );
    // Nothing was accepted twice.
    assert!(
        multiplicities(&fake.accepted_row_ids())
            .values()
            .all(|n| *n == 1)
    );
}

#[tokio::test]
async fn a_rejected_message_fails_the_statement_under_the_default_policy() {
    // The bad message's batch is refused after a pause, so every other batch has been answered
    // by then (a publish still in flight when the statement fails is another matter: see
    // `a_rejection_under_the_fail_policy_leaves_no_concurrent_batch_unresolved`).
    let fake = FakePublisher::start(|request| {
        let refusal = refuse_the_bad_message(request)?;
        Some(if request.messages.len() > 1 {
            Reply::Delay(std::time::Duration::from_millis(200), Box::new(refusal))
        } else {
            refusal
        })
    })
    .await;
    let done = insert_rows(&fake, 100, &[("batch_element_count_threshold", "10")]).await;

    let error = done.error();
    assert!(error.contains("rejected"), "{error}");
    assert!(error.contains("INVALID_ARGUMENT"), "{error}");
    assert!(
        error.contains(&format!("message {BAD_ID} is refused")),
        "{error}"
    );
    assert_eq!(done.metric(names::RECORDS_REJECTED), 1);
    assert_eq!(done.metric(names::RECORDS_DROPPED), 0);
    // Nothing else is lost: every other row was acknowledged.
    let accepted = fake.accepted_row_ids();
    assert!(!accepted.contains(&BAD_ID));
    let unacknowledged: Vec<i64> = all_ids(100)
        .into_iter()
        .filter(|id| *id != BAD_ID && !accepted.contains(id))
        .collect();
    assert!(
        unacknowledged.is_empty(),
        "rows neither acknowledged nor reported by the error: {unacknowledged:?}\nerror: {error}"
    );
}

#[tokio::test]
async fn a_rejection_under_the_fail_policy_leaves_no_concurrent_batch_unresolved() {
    // The bad message's batch is refused at once and its isolation pass answers at once; every
    // other batch is answered after a short delay, so it is still in flight when the rejection
    // fails the statement.
    let fake = FakePublisher::start(|request| {
        if contains_id(request, BAD_ID) {
            return refuse_the_bad_message(request);
        }
        (request.messages.len() > 1).then(|| {
            let message_ids = request
                .messages
                .iter()
                .map(|_| "slow".to_string())
                .collect();
            Reply::Delay(
                std::time::Duration::from_millis(500),
                Box::new(Reply::Ok(PublishResponse { message_ids })),
            )
        })
    })
    .await;
    let done = insert_rows(&fake, 100, &[("batch_element_count_threshold", "10")]).await;
    let error = done.error().to_string();
    assert!(error.contains("INVALID_ARGUMENT"), "{error}");
    // Every row but the bad one is acknowledged before the statement returns, or the error says
    // how many were not delivered: the publishes in flight are not cut off.
    let acked = done.metric(names::RECORDS_ACKED);
    let not_delivered = error
        .split(" admitted row(s) were not delivered")
        .next()
        .filter(|_| error.contains("were not delivered"))
        .and_then(|head| head.rsplit(' ').next())
        .map_or(0, |n| {
            n.parse::<usize>()
                .expect("a count before 'admitted row(s)'")
        });
    assert_eq!(
        acked + not_delivered,
        99,
        "rows left unresolved and unreported: {error}"
    );
    // The batches already in flight when the rejection was confirmed were answered, not cut off.
    assert!(acked >= 80, "in-flight publishes were cut off: {error}");
}

// --- 9. the rejection breaker -------------------------------------------------------------------

fn refuse_everything(_: &PublishRequest) -> Option<Reply<PublishResponse>> {
    Some(Reply::Status(
        Code::InvalidArgument,
        "refused by the fake".into(),
    ))
}

#[tokio::test]
async fn the_breaker_fails_the_statement_after_max_consecutive_rejections() {
    let fake = FakePublisher::start(refuse_everything).await;
    let done = insert_rows(
        &fake,
        50,
        &[
            ("failure_policy", "drop"),
            ("max_consecutive_rejections", "5"),
            ("batch_element_count_threshold", "10"),
        ],
    )
    .await;
    let error = done.error();
    assert!(error.contains("max_consecutive_rejections"), "{error}");
    assert!(error.contains("5 consecutive"), "{error}");
    assert_eq!(done.metric(names::RECORDS_ACKED), 0);
    // It trips at the fifth confirmed rejection. Isolation sends already on the wire then
    // finish (a failed statement lets its in-flight sends resolve) and their verdicts are
    // counted too, so at least five are dropped, and none is acknowledged.
    assert!(done.metric(names::RECORDS_DROPPED) >= 5);
}

#[tokio::test]
async fn an_unbounded_breaker_never_trips() {
    let fake = FakePublisher::start(refuse_everything).await;
    let done = insert_rows(
        &fake,
        50,
        &[
            ("failure_policy", "drop"),
            ("max_consecutive_rejections", "-1"),
            ("batch_element_count_threshold", "10"),
        ],
    )
    .await;
    assert_eq!(done.count(), 0);
    assert_eq!(done.metric(names::RECORDS_REJECTED), 50);
    assert_eq!(done.metric(names::RECORDS_DROPPED), 50);
    assert!(fake.accepted_row_ids().is_empty());
}

// --- 10. a stalled server ------------------------------------------------------------------------

#[tokio::test]
async fn a_stalled_publish_trips_the_progress_timeout_naming_the_option() {
    let fake = FakePublisher::start(|_| Some(Reply::Stall)).await;
    let done = insert_rows(
        &fake,
        20,
        &[
            ("publish_progress_timeout", "2s"),
            // No attempt deadline: the call itself never ends, only the watchdog can.
            ("retry_initial_rpc_timeout", "0s"),
            ("retry_max_rpc_timeout", "0s"),
            ("shutdown_timeout", "2s"),
        ],
    )
    .await;
    let error = done.error();
    assert!(error.contains("publish_progress_timeout"), "{error}");
    assert!(error.contains("2s"), "{error}");
    assert_eq!(done.metric(names::RECORDS_ACKED), 0);
    assert!(
        !fake.publish.requests().is_empty(),
        "the publish reached the fake"
    );
}

// --- 11. eviction under max_active_publishers ---------------------------------------------------

#[tokio::test]
async fn one_active_publisher_across_ten_interleaved_topics_keeps_each_topic_complete_and_in_order()
{
    const TOPICS: i64 = 10;
    const ROWS: i64 = 500;
    let fake = FakePublisher::start(|_| None).await;
    let ctx = gcp_sql::sql::new_context();
    exec(
        &ctx,
        &format!(
            "CREATE TABLE spread (id BIGINT, dest VARCHAR) WITH (connector = 'pubsub', \
             emulator_host = '{}', project = 'faults', topic_column = 'dest', \
             max_active_publishers = 1)",
            fake.host()
        ),
    )
    .await;
    let done = insert(
        &ctx,
        &format!(
            "INSERT INTO spread SELECT value AS id, \
             concat('topic-', CAST(value % {TOPICS} AS VARCHAR)) AS dest \
             FROM generate_series(1, {ROWS})"
        ),
    )
    .await;
    assert_eq!(done.count(), ROWS as u64);
    assert_eq!(done.metric(names::RECORDS_ACKED), ROWS as usize);

    let mut per_topic: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (topic, id) in fake.accepted_ids() {
        per_topic.entry(topic).or_default().push(id);
    }
    assert_eq!(per_topic.len(), TOPICS as usize);
    for t in 0..TOPICS {
        let topic = format!("projects/faults/topics/topic-{t}");
        let expected: Vec<i64> = (1..=ROWS).filter(|v| v % TOPICS == t).collect();
        assert_eq!(per_topic.get(&topic), Some(&expected), "{topic}");
    }
}

// --- NOT_FOUND recovery on the fake ---------------------------------------------------------------

#[tokio::test]
async fn auto_create_topic_creates_once_then_publishes_every_row() {
    let created = Arc::new(AtomicBool::new(false));
    let fake = FakePublisher::start({
        let created = created.clone();
        move |_| {
            (!created.load(Ordering::SeqCst))
                .then(|| Reply::Status(Code::NotFound, "Topic not found".into()))
        }
    })
    .await;
    fake.create_topic.fallback({
        let created = created.clone();
        move |topic| {
            if created.swap(true, Ordering::SeqCst) {
                Reply::Status(Code::AlreadyExists, "Topic already exists".into())
            } else {
                Reply::Ok(topic.clone())
            }
        }
    });
    let done = insert_rows(
        &fake,
        60,
        &[
            ("auto_create_topic", "true"),
            ("recovery_initial_backoff", "10ms"),
            ("batch_element_count_threshold", "10"),
        ],
    )
    .await;
    assert_eq!(done.count(), 60);
    assert_eq!(done.metric(names::RESOURCES_CREATED), 1);
    assert_eq!(sorted(fake.accepted_row_ids()), all_ids(60));
    let creates = fake.create_topic.requests();
    assert!(!creates.is_empty());
    assert!(creates.iter().all(|t| t.name == TOPIC));
}

#[tokio::test]
async fn a_topic_still_missing_after_the_recovery_budget_fails_naming_the_option() {
    let fake =
        FakePublisher::start(|_| Some(Reply::Status(Code::NotFound, "Topic not found".into())))
            .await;
    fake.create_topic
        .fallback(|_| Reply::Status(Code::AlreadyExists, "Topic already exists".into()));
    let done = insert_rows(
        &fake,
        5,
        &[
            ("auto_create_topic", "true"),
            ("recovery_initial_backoff", "5ms"),
            ("recovery_max_backoff", "10ms"),
            ("recovery_max_attempts", "3"),
        ],
    )
    .await;
    let error = done.error();
    assert!(error.contains("recovery_max_attempts"), "{error}");
    assert!(error.contains(TOPIC), "{error}");
    assert_eq!(done.metric(names::RESOURCES_CREATED), 0);
}
