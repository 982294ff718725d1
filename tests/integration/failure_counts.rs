//! Every failed statement says what landed: one test per cause of failure, each checking that
//! the error carries both counts (rows acknowledged, admitted rows not delivered) and that they
//! match what an independent client reads back.
//!
//! | cause | sink | read-back |
//! |---|---|---|
//! | the input stream errs after some batches | Pub/Sub emulator | pull from a subscription |
//! | a malformed CSV line after some batches | Pub/Sub emulator | pull from a subscription |
//! | the encoder rejects a row under `fail` (bad URL) | Cloud Tasks emulator | `ListTasks` |
//! | the encoder rejects a row under `fail` (oversize) | Pub/Sub emulator | pull |
//! | the service refuses one message of a batch under `fail` | fake Publisher | its log |
//! | a fatal status after some successes | fake Publisher | its log |
//! | a stall trips the progress timeout | fake Publisher | its log |
//! | (the same fatal status through the `gcp-sql` binary) | fake Publisher | its log |
//!
//! Open batches are kept from going out on their own with a long `batch_delay_threshold`, so
//! that the rows left in one when the statement fails are counted as not delivered
//! deterministically (and are never sent later).
//!
//! Run: `cargo test --test integration failure_counts::`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{Insert, PubSubAdmin, exec, ids, insert, multiplicities, unique};
use datafusion::arrow::array::{Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::streaming::StreamingTable;
use datafusion::error::DataFusionError;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use gcloud_sdk::google::cloud::tasks::v2::cloud_tasks_client::CloudTasksClient;
use gcloud_sdk::google::cloud::tasks::v2::{
    CreateQueueRequest, ListTasksRequest, PauseQueueRequest, Queue, task,
};
use gcloud_sdk::google::pubsub::v1::{PublishRequest, PublishResponse};
use gcp_sql::core::metrics::names;
use gcp_sql::emulators::{EmulatorKind, plaintext_channel, shared};
use gcp_sql::testing::{FakeServer, Reply, Script};
use tonic::Code;

/// `(acknowledged, not delivered)` as the error of a failed statement prints them; panics when
/// either count is missing.
fn counts(error: &str) -> (u64, u64) {
    let number_before = |marker: &str| -> u64 {
        let head = error
            .split(marker)
            .next()
            .filter(|_| error.contains(marker))
            .unwrap_or_else(|| panic!("no '{marker}' in the error: {error}"));
        let digits = head.rsplit([' ', '(']).next().unwrap_or_default();
        digits
            .parse()
            .unwrap_or_else(|_| panic!("no count before '{marker}' in the error: {error}"))
    };
    (
        number_before(" row(s) were acknowledged before the failure"),
        number_before(" admitted row(s) were not delivered"),
    )
}

/// `WITH (...)` of a Pub/Sub table on `host` and `topic`, plus `options`.
fn pubsub_with(host: &str, topic: &str, options: &[(&str, &str)]) -> String {
    let mut with = format!("connector = 'pubsub', emulator_host = '{host}', topic = '{topic}'");
    for (k, v) in options {
        with.push_str(&format!(", {k} = '{v}'"));
    }
    with
}

// --- the input stream fails -------------------------------------------------------------------

/// A one-partition source that yields batches of ids, then an error.
#[derive(Debug)]
struct FailingSource {
    schema: SchemaRef,
    /// The id ranges of the batches before the error.
    batches: Vec<std::ops::RangeInclusive<i64>>,
}

impl PartitionStream for FailingSource {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let mut items: Vec<datafusion::error::Result<RecordBatch>> = self
            .batches
            .iter()
            .map(|range| {
                let ids = Int64Array::from_iter_values(range.clone());
                Ok(RecordBatch::try_new(
                    self.schema.clone(),
                    vec![Arc::new(ids)],
                )?)
            })
            .collect();
        items.push(Err(DataFusionError::Execution(
            "the source broke after its third batch".into(),
        )));
        Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            futures::stream::iter(items),
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_error_after_some_batches_reports_the_rows_that_landed() {
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription) = admin
        .topic_with_subscription("counts", "source", false)
        .await;
    let ctx = gcp_sql::sql::new_context();
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    let source = FailingSource {
        schema: schema.clone(),
        batches: vec![1..=100, 101..=200, 201..=230],
    };
    ctx.register_table(
        "source",
        Arc::new(StreamingTable::try_new(schema, vec![Arc::new(source)]).expect("a table")),
    )
    .expect("register the source");
    let with = pubsub_with(
        &admin.host,
        &topic,
        &[
            ("batch_element_count_threshold", "50"),
            ("batch_delay_threshold", "1h"),
            // The batches below are those of one writer reading the source in order.
            ("sink_parallelism", "1"),
        ],
    );
    exec(
        &ctx,
        &format!("CREATE TABLE events (id BIGINT) WITH ({with})"),
    )
    .await;
    let done = insert(&ctx, "INSERT INTO events SELECT id FROM source").await;

    let error = done.error();
    assert!(error.contains("the source broke"), "{error}");
    // Rows 1..=200 filled four batches, sent before the error; rows 201..=230 sat in an open
    // batch, which the failure kept from ever going out.
    assert_eq!(counts(error), (200, 30), "{error}");
    assert_eq!(done.metric(names::RECORDS_ACKED), 200);
    assert_eq!(done.metric(names::RECORDS_SENT), 200);
    let landed = ids(&admin.pull_all(&subscription, 200).await, "id");
    let mut landed_sorted = landed.clone();
    landed_sorted.sort_unstable();
    assert_eq!(landed_sorted, (1..=200).collect::<Vec<i64>>());
}

#[cfg(feature = "cli")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_csv_line_after_published_batches_reports_the_rows_that_landed() {
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription) = admin.topic_with_subscription("counts", "csv", false).await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("ids.csv");
    // 250 good lines, a malformed one (line 251), then more good lines.
    let mut text: String = (1..=250).map(|i| format!("{i}\n")).collect();
    text.push_str("not-a-number\n");
    text.extend((252..=300).map(|i| format!("{i}\n")));
    std::fs::write(&path, text).expect("write the CSV");

    let ctx = gcp_sql::sql::new_context();
    exec(&ctx, "SET datafusion.execution.batch_size = 100").await;
    exec(&ctx, "SET datafusion.execution.target_partitions = 1").await;
    exec(
        &ctx,
        &format!(
            "CREATE EXTERNAL TABLE ids (id BIGINT) STORED AS CSV LOCATION '{}' \
             OPTIONS ('format.has_header' 'false')",
            path.display()
        ),
    )
    .await;
    let with = pubsub_with(
        &admin.host,
        &topic,
        &[
            ("batch_element_count_threshold", "30"),
            ("batch_delay_threshold", "1h"),
        ],
    );
    exec(
        &ctx,
        &format!("CREATE TABLE events (id BIGINT) WITH ({with})"),
    )
    .await;
    let done = insert(&ctx, "INSERT INTO events SELECT id FROM ids").await;

    let error = done.error();
    assert!(error.contains("not-a-number"), "{error}");
    // The first two batches of 100 rows were read: 180 of them filled six publish batches,
    // the other 20 sat in an open one when the third batch failed to parse.
    assert_eq!(counts(error), (180, 20), "{error}");
    let landed = ids(&admin.pull_all(&subscription, 180).await, "id");
    let mut landed_sorted = landed.clone();
    landed_sorted.sort_unstable();
    assert_eq!(landed_sorted, (1..=180).collect::<Vec<i64>>());
}

// --- the encoder rejects a row under `fail` ---------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_with_a_bad_url_after_good_rows_reports_the_tasks_created() {
    let host = shared(EmulatorKind::CloudTasks).await.host().to_string();
    let mut tasks = CloudTasksClient::new(
        plaintext_channel(&host)
            .await
            .expect("channel to the Cloud Tasks emulator"),
    );
    let parent = "projects/counts/locations/us-central1".to_string();
    let queue = format!("{parent}/queues/{}", unique("badurl"));
    tasks
        .create_queue(CreateQueueRequest {
            parent,
            queue: Some(Queue {
                name: queue.clone(),
                ..Default::default()
            }),
        })
        .await
        .expect("CreateQueue");
    // Paused, the emulator keeps every task it created in the queue.
    tasks
        .pause_queue(PauseQueueRequest {
            name: queue.clone(),
        })
        .await
        .expect("PauseQueue");

    let ctx = gcp_sql::sql::new_context();
    exec(
        &ctx,
        &format!(
            "CREATE TABLE jobs (target VARCHAR, task VARCHAR) WITH (connector = 'cloud_tasks', \
             emulator_host = '{host}', queue = '{queue}', url_column = 'target', \
             task_name_column = 'task')"
        ),
    )
    .await;
    // Rows 1..=4 are good; row 5 (index 4) has no URL the service would take.
    let done = insert(
        &ctx,
        "INSERT INTO jobs SELECT CASE WHEN value = 5 THEN 'not a url' \
           ELSE 'http://127.0.0.1:9/run' END, concat('t', value) \
         FROM generate_series(1, 10)",
    )
    .await;

    let error = done.error();
    assert!(error.contains("row 4"), "{error}");
    assert!(error.contains("column 'target'"), "{error}");
    // The four tasks created before the bad row are reported, none is left out.
    assert_eq!(counts(error), (4, 0), "{error}");
    let mut listed: Vec<String> = tasks
        .list_tasks(ListTasksRequest {
            parent: queue.clone(),
            response_view: task::View::Basic as i32,
            page_size: 1000,
            page_token: String::new(),
        })
        .await
        .expect("ListTasks")
        .into_inner()
        .tasks
        .into_iter()
        .map(|t| t.name)
        .collect();
    listed.sort();
    let expected: Vec<String> = (1..=4).map(|i| format!("{queue}/tasks/t{i}")).collect();
    assert_eq!(listed, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_message_after_good_rows_reports_the_messages_published() {
    let admin = PubSubAdmin::connect().await;
    let (topic, subscription) = admin
        .topic_with_subscription("counts", "oversize", false)
        .await;
    let ctx = gcp_sql::sql::new_context();
    let with = pubsub_with(
        &admin.host,
        &topic,
        &[
            ("batch_element_count_threshold", "10"),
            ("batch_delay_threshold", "1h"),
        ],
    );
    exec(
        &ctx,
        &format!("CREATE TABLE events (id BIGINT, big VARCHAR) WITH ({with})"),
    )
    .await;
    // Row 50 (index 49) serializes to more than the 10 MB a message may hold.
    let done = insert(
        &ctx,
        "INSERT INTO events SELECT value, \
           CASE WHEN value = 50 THEN repeat('x', 10000001) ELSE 'small' END \
         FROM generate_series(1, 100)",
    )
    .await;

    let error = done.error();
    assert!(error.contains("row 49"), "{error}");
    assert!(error.contains("10000000"), "{error}");
    // Rows 1..=40 filled four batches and were published; rows 41..=49 sat in an open batch.
    assert_eq!(counts(error), (40, 9), "{error}");
    let landed = ids(&admin.pull_all(&subscription, 40).await, "id");
    let mut landed_sorted = landed.clone();
    landed_sorted.sort_unstable();
    assert_eq!(landed_sorted, (1..=40).collect::<Vec<i64>>());
}

// --- a scripted fake Publisher ----------------------------------------------------------------

const PUBLISH: &str = "/google.pubsub.v1.Publisher/Publish";
const FAKE_TOPIC: &str = "projects/counts/topics/events";

/// A fake Publisher: `verdict` sees each request with its 0-based call number and answers it
/// (`None` accepts it); the accepted requests are kept.
struct FakePublisher {
    server: FakeServer,
    accepted: Arc<Mutex<Vec<PublishRequest>>>,
}

impl FakePublisher {
    async fn start(
        verdict: impl Fn(usize, &PublishRequest) -> Option<Reply<PublishResponse>>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        let publish: Script<PublishRequest, PublishResponse> = Script::new();
        let accepted: Arc<Mutex<Vec<PublishRequest>>> = Arc::default();
        let calls = AtomicUsize::new(0);
        publish.fallback({
            let accepted = accepted.clone();
            move |request| {
                if let Some(reply) = verdict(calls.fetch_add(1, Ordering::SeqCst), request) {
                    return reply;
                }
                accepted.lock().expect("lock").push(request.clone());
                let message_ids = request
                    .messages
                    .iter()
                    .enumerate()
                    .map(|(i, _)| format!("fake-{i}"))
                    .collect();
                Reply::Ok(PublishResponse { message_ids })
            }
        });
        let server = FakeServer::builder()
            .unary(PUBLISH, publish)
            .start()
            .await
            .expect("start the fake Publisher");
        FakePublisher { server, accepted }
    }

    fn host(&self) -> String {
        self.server.addr().to_string()
    }

    /// The ids of every message the fake accepted.
    fn accepted_ids(&self) -> Vec<i64> {
        self.accepted
            .lock()
            .expect("lock")
            .iter()
            .flat_map(|r| r.messages.iter().map(|m| message_id(&m.data)))
            .collect()
    }
}

/// The `id` of a JSON payload `{"id":N}`.
fn message_id(data: &[u8]) -> i64 {
    let value: serde_json::Value = serde_json::from_slice(data).expect("JSON payload");
    value["id"].as_i64().expect("integer id")
}

/// Declares `events (id BIGINT)` on the fake (batches of 10) and inserts ids 1..=100: one input
/// batch, so all ten publish batches are sent before any answer comes back.
async fn insert_hundred(fake: &FakePublisher, options: &[(&str, &str)]) -> Insert {
    let ctx = gcp_sql::sql::new_context();
    let mut all = vec![("batch_element_count_threshold", "10")];
    all.extend_from_slice(options);
    let with = pubsub_with(&fake.host(), FAKE_TOPIC, &all);
    exec(
        &ctx,
        &format!("CREATE TABLE events (id BIGINT) WITH ({with})"),
    )
    .await;
    insert(
        &ctx,
        "INSERT INTO events SELECT value AS id FROM generate_series(1, 100)",
    )
    .await
}

/// The fake's accepted ids hold each id once, and as many as the statement acknowledged.
fn assert_landed(fake: &FakePublisher, acknowledged: u64) -> Vec<i64> {
    let accepted = fake.accepted_ids();
    assert!(
        multiplicities(&accepted).values().all(|n| *n == 1),
        "{accepted:?}"
    );
    assert_eq!(accepted.len() as u64, acknowledged, "{accepted:?}");
    accepted
}

const BAD_ID: i64 = 37;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_service_refuses_under_fail_reports_the_rest_as_acknowledged() {
    // A request holding the bad message is refused whole, as the service does, so the sink
    // sends each message of that batch alone to find it.
    let fake = FakePublisher::start(|_, request| {
        request
            .messages
            .iter()
            .any(|m| message_id(&m.data) == BAD_ID)
            .then(|| Reply::Status(Code::InvalidArgument, "the message is refused".into()))
    })
    .await;
    let done = insert_hundred(&fake, &[]).await;

    let error = done.error();
    assert!(error.contains("INVALID_ARGUMENT"), "{error}");
    assert!(error.contains("the message is refused"), "{error}");
    // The refused row is the failure itself (and counted in records_rejected), every other
    // row landed.
    assert_eq!(counts(error), (99, 0), "{error}");
    assert_eq!(done.metric(names::RECORDS_REJECTED), 1);
    let mut accepted = assert_landed(&fake, 99);
    accepted.sort_unstable();
    let expected: Vec<i64> = (1..=100).filter(|id| *id != BAD_ID).collect();
    assert_eq!(accepted, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fatal_status_after_some_successes_reports_both_counts() {
    // The first three publishes are accepted, every later one is PERMISSION_DENIED.
    let fake = FakePublisher::start(|call, _| {
        (call >= 3).then(|| Reply::Status(Code::PermissionDenied, "no publish permission".into()))
    })
    .await;
    let done = insert_hundred(&fake, &[]).await;

    let error = done.error();
    assert!(error.contains("PERMISSION_DENIED"), "{error}");
    assert_eq!(counts(error), (30, 70), "{error}");
    assert_eq!(done.metric(names::RECORDS_ACKED), 30);
    assert_landed(&fake, 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_progress_timeout_reports_the_rows_acknowledged_before_the_stall() {
    // Two publishes are accepted, then the fake answers nothing at all.
    let fake = FakePublisher::start(|call, _| (call >= 2).then_some(Reply::Stall)).await;
    let done = insert_hundred(
        &fake,
        &[
            ("publish_progress_timeout", "1s"),
            ("shutdown_timeout", "500ms"),
            ("retry_initial_rpc_timeout", "0s"),
            ("retry_max_rpc_timeout", "0s"),
        ],
    )
    .await;

    let error = done.error();
    assert!(error.contains("publish_progress_timeout"), "{error}");
    // The eight stalled publishes were cut off unanswered: their rows did not land.
    assert_eq!(counts(error), (20, 80), "{error}");
    assert_landed(&fake, 20);
}

#[cfg(feature = "cli")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_prints_both_counts_of_a_failed_statement_and_exits_non_zero() {
    let fake = FakePublisher::start(|call, _| {
        (call >= 3).then(|| Reply::Status(Code::PermissionDenied, "no publish permission".into()))
    })
    .await;
    let with = pubsub_with(
        &fake.host(),
        FAKE_TOPIC,
        &[("batch_element_count_threshold", "10")],
    );
    let sql = format!(
        "CREATE TABLE events (id BIGINT) WITH ({with}); \
         INSERT INTO events SELECT value AS id FROM generate_series(1, 100);"
    );
    let home = tempfile::tempdir().expect("a temporary home");
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_gcp-sql"));
    command
        .env("HOME", home.path())
        .env_remove("PUBSUB_EMULATOR_HOST")
        .stdin(std::process::Stdio::null())
        .args(["-c", &sql]);
    let output = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::task::spawn_blocking(move || command.output()),
    )
    .await
    .expect("the tool exits")
    .expect("the blocking task")
    .expect("the gcp-sql binary runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let error_line = stderr
        .lines()
        .find(|l| l.starts_with("Error: "))
        .unwrap_or_else(|| panic!("no error line: {stderr}"));
    assert!(error_line.contains("PERMISSION_DENIED"), "{stderr}");
    assert_eq!(counts(error_line), (30, 70), "{stderr}");
    assert_landed(&fake, 30);
}
