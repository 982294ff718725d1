//! The Pub/Sub subscription source against the Pub/Sub emulator: messages published by an
//! independent client are read through a registered `PubSubSourceTable`, every value is
//! checked, and an independent pull afterwards shows what was acknowledged (nothing comes back
//! after the ack deadline) and what was not (it comes back).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Field, Fields, Int64Type, Schema, SchemaRef, TimeUnit};
use datafusion::prelude::{SessionConfig, SessionContext};
use gcloud_sdk::google::pubsub::v1::publisher_client::PublisherClient;
use gcloud_sdk::google::pubsub::v1::subscriber_client::SubscriberClient;
use gcloud_sdk::google::pubsub::v1::{
    AcknowledgeRequest, PublishRequest, PubsubMessage, PullRequest, Subscription, Topic,
};
use gcp_sql::connectors::pubsub::source::PubSubSourceTable;
use gcp_sql::connectors::pubsub::source::options::{PubSubSourceOptions, SourceColumns};
use gcp_sql::core::FailurePolicy;
use gcp_sql::core::delivery::DeliveryCounts;
use gcp_sql::options::PayloadFormat;
use tonic::transport::Channel;

use crate::support::{PubSubAdmin, unique};

/// The subscription's ack deadline, and the stream's: the service's minimum (10 s), so that an
/// unacknowledged message comes back soon after the source let go of it.
const ACK_DEADLINE: Duration = Duration::from_secs(10);

pub(crate) struct Fixture {
    pub(crate) host: String,
    pub(crate) topic: String,
    pub(crate) subscription: String,
    publisher: PublisherClient<Channel>,
    subscriber: SubscriberClient<Channel>,
}

impl Fixture {
    pub(crate) async fn new(prefix: &str) -> Self {
        let admin = PubSubAdmin::connect().await;
        let channel = gcp_sql::emulators::plaintext_channel(&admin.host)
            .await
            .expect("channel to the Pub/Sub emulator");
        let id = unique(prefix);
        let topic = format!("projects/source-tests/topics/{id}");
        let subscription = format!("projects/source-tests/subscriptions/{id}-sub");
        let mut publisher = PublisherClient::new(channel.clone());
        publisher
            .create_topic(Topic {
                name: topic.clone(),
                ..Default::default()
            })
            .await
            .expect("CreateTopic");
        let mut subscriber = SubscriberClient::new(channel);
        subscriber
            .create_subscription(Subscription {
                name: subscription.clone(),
                topic: topic.clone(),
                ack_deadline_seconds: ACK_DEADLINE.as_secs() as i32,
                ..Default::default()
            })
            .await
            .expect("CreateSubscription");
        Fixture {
            host: admin.host,
            topic,
            subscription,
            publisher,
            subscriber,
        }
    }

    /// A second subscription of the same topic (named after this one with `suffix`), which
    /// gets what is published from now on.
    pub(crate) async fn subscribe_again(&self, suffix: &str) -> Fixture {
        let subscription = format!("{}-{suffix}", self.subscription);
        self.subscriber
            .clone()
            .create_subscription(Subscription {
                name: subscription.clone(),
                topic: self.topic.clone(),
                ack_deadline_seconds: ACK_DEADLINE.as_secs() as i32,
                ..Default::default()
            })
            .await
            .expect("CreateSubscription");
        Fixture {
            host: self.host.clone(),
            topic: self.topic.clone(),
            subscription,
            publisher: self.publisher.clone(),
            subscriber: self.subscriber.clone(),
        }
    }

    pub(crate) async fn publish(&self, messages: Vec<PubsubMessage>) -> Vec<String> {
        let mut ids = Vec::new();
        for chunk in messages.chunks(500) {
            let response = self
                .publisher
                .clone()
                .publish(PublishRequest {
                    topic: self.topic.clone(),
                    messages: chunk.to_vec(),
                })
                .await
                .expect("Publish");
            ids.extend(response.into_inner().message_ids);
        }
        ids
    }

    fn options(&self) -> PubSubSourceOptions {
        let mut o = PubSubSourceOptions::emulator(&self.subscription, &self.host);
        o.stop_after_idle = Some(Duration::from_secs(2));
        o.stream_ack_deadline = ACK_DEADLINE;
        o
    }

    /// What an independent reader gets now (pulled and acknowledged), after waiting out the
    /// ack deadline so that anything left unacknowledged is delivered again.
    pub(crate) async fn left_over_after_deadline(&self) -> Vec<PubsubMessage> {
        tokio::time::sleep(ACK_DEADLINE + Duration::from_secs(2)).await;
        self.pull_now().await
    }

    /// Pulls (and acknowledges) until every one of `wanted` came back, or until a lease that
    /// was never nacked would have lapsed and been delivered again by the lazy emulator
    /// (`ACK_DEADLINE` plus a minute): a nacked message is available at once, but a stream
    /// still open when the nack arrives may be handed it again and drop it, and then it waits
    /// out that lease. An acknowledged message never comes back, so a wanted one that was
    /// acknowledged fails the caller's check. Returns the ids of all it pulled.
    pub(crate) async fn pull_until_back(&self, wanted: &[&String]) -> Vec<String> {
        let until = tokio::time::Instant::now() + ACK_DEADLINE + Duration::from_secs(60);
        let mut back: Vec<String> = Vec::new();
        loop {
            back.extend(self.pull_now().await.into_iter().map(|m| m.message_id));
            if wanted.iter().all(|id| back.contains(id)) || tokio::time::Instant::now() >= until {
                return back;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    pub(crate) async fn pull_now(&self) -> Vec<PubsubMessage> {
        let mut out = Vec::new();
        let mut empty = 0;
        while empty < 3 {
            #[allow(deprecated)] // return_immediately: the emulator honours it.
            let pulled = self
                .subscriber
                .clone()
                .pull(PullRequest {
                    subscription: self.subscription.clone(),
                    max_messages: 1000,
                    return_immediately: true,
                })
                .await
                .expect("Pull")
                .into_inner()
                .received_messages;
            if pulled.is_empty() {
                empty += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            let ack_ids = pulled.iter().map(|m| m.ack_id.clone()).collect();
            self.subscriber
                .clone()
                .acknowledge(AcknowledgeRequest {
                    subscription: self.subscription.clone(),
                    ack_ids,
                })
                .await
                .expect("Acknowledge");
            out.extend(pulled.into_iter().filter_map(|m| m.message));
        }
        out
    }
}

fn attrs_type() -> DataType {
    DataType::Map(
        Arc::new(Field::new(
            "entries",
            DataType::Struct(Fields::from(vec![
                Field::new("key", DataType::Utf8, false),
                Field::new("value", DataType::Utf8, true),
            ])),
            false,
        )),
        false,
    )
}

fn context(batch_size: usize) -> SessionContext {
    SessionContext::new_with_config(SessionConfig::new().with_batch_size(batch_size))
}

/// Runs `sql` over the table registered as `t`, then waits until every acknowledgement the
/// source decided was sent; returns the rows and the counts.
async fn run(
    table: Arc<PubSubSourceTable>,
    batch_size: usize,
    sql: &str,
) -> datafusion::error::Result<(Vec<RecordBatch>, DeliveryCounts)> {
    let ctx = context(batch_size);
    ctx.register_table("t", table.clone())?;
    let result = async { ctx.sql(sql).await?.collect().await }.await;
    drop(ctx);
    let handles = table.handles();
    assert_eq!(handles.len(), 1, "one scan");
    handles[0].settled().await;
    let counts = handles[0].counts();
    result.map(|rows| (rows, counts))
}

fn strings(batches: &[RecordBatch], column: usize) -> Vec<String> {
    batches
        .iter()
        .flat_map(|b| {
            let c = arrow::compute::cast(b.column(column), &DataType::Utf8).unwrap();
            let c = c.as_string::<i32>();
            (0..c.len())
                .map(|i| c.value(i).to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_messages_become_rows_with_their_metadata_and_are_all_acknowledged() {
    let f = Fixture::new("src-json").await;
    const N: usize = 300;
    let messages = (0..N)
        .map(|i| PubsubMessage {
            data: format!(r#"{{"user_id": {i}, "url": "/page/{i}"}}"#).into_bytes(),
            attributes: HashMap::from([
                ("n".to_string(), i.to_string()),
                ("src".to_string(), "test".to_string()),
            ]),
            ..Default::default()
        })
        .collect();
    let ids = f.publish(messages).await;
    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("user_id", DataType::Int64, true),
        Field::new("url", DataType::Utf8View, true),
        Field::new("mid", DataType::Utf8, true),
        Field::new("pt", DataType::Timestamp(TimeUnit::Microsecond, None), true),
        Field::new("attrs", attrs_type(), true),
        Field::new("attempt", DataType::Int32, true),
    ]));
    let mut options = f.options();
    options.columns = SourceColumns {
        message_id: Some("mid".into()),
        publish_time: Some("pt".into()),
        attributes: Some("attrs".into()),
        delivery_attempt: Some("attempt".into()),
        ..Default::default()
    };
    let table = Arc::new(PubSubSourceTable::try_new("t", schema, options).unwrap());
    let before = chrono::Utc::now().timestamp_micros() - 60_000_000;
    // A small batch size: the scan emits many batches, each sealed and acknowledged on its own.
    let (batches, counts) = run(table, 64, "SELECT * FROM t").await.unwrap();
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    assert_eq!(rows, N);
    assert!(batches.iter().all(|b| b.num_rows() <= 64));
    let mut seen = vec![false; N];
    let mids = strings(&batches, 2);
    let urls = strings(&batches, 1);
    let mut r = 0;
    for b in &batches {
        let user = b.column(0).as_primitive::<Int64Type>();
        let pt = b
            .column(3)
            .as_primitive::<arrow::datatypes::TimestampMicrosecondType>();
        let attrs = b.column(4).as_map();
        for i in 0..b.num_rows() {
            let u = user.value(i) as usize;
            assert!(!seen[u], "user {u} twice");
            seen[u] = true;
            assert_eq!(urls[r], format!("/page/{u}"));
            assert_eq!(mids[r], ids[u], "message id of user {u}");
            assert!(pt.value(i) > before, "publish time of user {u}");
            let entries = attrs.value(i);
            let keys = entries.column(0).as_string::<i32>();
            let values = entries.column(1).as_string::<i32>();
            let pairs: Vec<(&str, &str)> = (0..keys.len())
                .map(|k| (keys.value(k), values.value(k)))
                .collect();
            assert_eq!(pairs, vec![("n", u.to_string().as_str()), ("src", "test")]);
            assert!(
                b.column(5).is_null(i),
                "no dead-letter policy: no attempt count"
            );
            r += 1;
        }
    }
    assert_eq!(counts.messages_read, N as u64);
    assert_eq!(counts.rows_emitted, N as u64);
    assert_eq!(counts.messages_acked, N as u64, "{counts:?}");
    assert_eq!(counts.messages_nacked, 0, "{counts:?}");
    let left = f.left_over_after_deadline().await;
    assert!(
        left.is_empty(),
        "{} message(s) were not acknowledged",
        left.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_text_through_a_filter_and_two_streams_acknowledges_the_filtered_rows_too() {
    let f = Fixture::new("src-raw").await;
    const N: usize = 200;
    let messages = (0..N)
        .map(|i| PubsubMessage {
            data: format!("line {i}").into_bytes(),
            ..Default::default()
        })
        .collect();
    f.publish(messages).await;
    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("body", DataType::Utf8, true),
        Field::new("key", DataType::Utf8, true),
    ]));
    let mut options = f.options();
    options.format = PayloadFormat::Raw;
    options.parallel_pull_count = 2;
    options.columns = SourceColumns {
        data: Some("body".into()),
        ordering_key: Some("key".into()),
        ..Default::default()
    };
    let table = Arc::new(PubSubSourceTable::try_new("t", schema, options).unwrap());
    let (batches, counts) = run(
        table,
        32,
        "SELECT upper(body), key FROM t WHERE body NOT LIKE '%5'",
    )
    .await
    .unwrap();
    let mut got = strings(&batches, 0);
    got.sort();
    let mut want: Vec<String> = (0..N)
        .filter(|i| i % 10 != 5)
        .map(|i| format!("LINE {i}"))
        .collect();
    want.sort();
    assert_eq!(got, want);
    assert!(strings(&batches, 1).iter().all(String::is_empty));
    assert_eq!(counts.messages_read, N as u64);
    assert_eq!(
        counts.messages_acked, N as u64,
        "filtered rows count as done: {counts:?}"
    );
    let left = f.left_over_after_deadline().await;
    assert!(
        left.is_empty(),
        "{} message(s) were not acknowledged",
        left.len()
    );
}

fn bad_batch() -> Vec<PubsubMessage> {
    vec![
        PubsubMessage {
            data: br#"{"n": 1}"#.to_vec(),
            ..Default::default()
        },
        PubsubMessage {
            data: br#"{"n": "private-value"}"#.to_vec(),
            ..Default::default()
        },
        PubsubMessage {
            data: br#"{"n": 3}"#.to_vec(),
            ..Default::default()
        },
    ]
}

fn n_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, true)]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_does_not_decode_fails_the_statement_and_is_not_acknowledged() {
    let f = Fixture::new("src-fail").await;
    let ids = f.publish(bad_batch()).await;
    let table = Arc::new(PubSubSourceTable::try_new("t", n_schema(), f.options()).unwrap());
    let ctx = context(100);
    ctx.register_table("t", table.clone()).unwrap();
    let err = async { ctx.sql("SELECT n FROM t").await?.collect().await }
        .await
        .unwrap_err()
        .to_string();
    drop(ctx);
    let handle = table.handles().remove(0);
    handle.settled().await;
    let counts = handle.counts();
    assert!(
        err.contains(&format!("message '{}'", ids[1]))
            && err.contains("column 'n'")
            && err.contains("failure_policy = 'fail'"),
        "{err}"
    );
    assert!(
        !err.contains("private-value"),
        "the error shows the payload: {err}"
    );
    // Nacked, not acknowledged: an independent reader gets the bad message (and whatever was
    // read with it and not acknowledged) again.
    let again = f.pull_until_back(&[&ids[1]]).await;
    assert!(again.contains(&ids[1]), "{again:?} {counts:?}");
    assert_eq!(counts.messages_read, 3, "{counts:?}");
    assert_eq!(
        counts.messages_acked + again.len() as u64,
        3,
        "each message is either acknowledged or back: {counts:?}"
    );
    assert!(counts.messages_nacked >= 1, "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_drop_a_message_that_does_not_decode_is_acknowledged_without_a_row() {
    let f = Fixture::new("src-drop").await;
    f.publish(bad_batch()).await;
    let mut options = f.options();
    options.failure_policy = FailurePolicy::Drop;
    let table = Arc::new(PubSubSourceTable::try_new("t", n_schema(), options).unwrap());
    let (batches, counts) = run(table, 100, "SELECT n FROM t").await.unwrap();
    let mut n: Vec<i64> = batches
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect();
    n.sort();
    assert_eq!(n, vec![1, 3]);
    assert_eq!(counts.messages_dropped, 1);
    assert_eq!(counts.messages_acked, 3, "{counts:?}");
    let left = f.left_over_after_deadline().await;
    assert!(
        left.is_empty(),
        "{} message(s) were not acknowledged",
        left.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_subscription_is_an_error_that_names_it() {
    let admin = PubSubAdmin::connect().await;
    let subscription = format!(
        "projects/source-tests/subscriptions/{}",
        unique("src-missing")
    );
    let options = PubSubSourceOptions::emulator(&subscription, &admin.host);
    let table = Arc::new(PubSubSourceTable::try_new("t", n_schema(), options).unwrap());
    let err = run(table, 100, "SELECT n FROM t")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&subscription) && err.contains("NOT_FOUND"),
        "{err}"
    );
}

#[test]
fn a_schema_the_options_cannot_fill_is_refused_at_construction() {
    let mut options = PubSubSourceOptions::emulator("projects/p/subscriptions/sub", "localhost:1");
    options.columns.publish_time = Some("pt".into());
    let schema = Arc::new(Schema::new(vec![Field::new("pt", DataType::Int64, true)]));
    let err = PubSubSourceTable::try_new("t", schema, options)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("'pt'") && err.contains("Int64") && err.contains("TIMESTAMP"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_dead_letter_a_message_that_does_not_decode_is_stored_then_acknowledged() {
    let f = Fixture::new("src-dead").await;
    let dead_topic = format!("{}-dead", f.topic);
    let dead_subscription = format!("{}-dead", f.subscription);
    f.publisher
        .clone()
        .create_topic(Topic {
            name: dead_topic.clone(),
            ..Default::default()
        })
        .await
        .expect("CreateTopic");
    f.subscriber
        .clone()
        .create_subscription(Subscription {
            name: dead_subscription.clone(),
            topic: dead_topic.clone(),
            ack_deadline_seconds: 600,
            ..Default::default()
        })
        .await
        .expect("CreateSubscription");
    let ids = f.publish(bad_batch()).await;
    let mut options = f.options();
    options.failure_policy = FailurePolicy::DeadLetter;
    options.dead_letter = Some(gcp_sql::connectors::dead_letter::DeadLetterTarget::Topic {
        topic: dead_topic,
        connection: gcp_sql::options::ClientCore {
            emulator_host: Some(f.host.clone()),
            ..Default::default()
        },
        via: &gcp_sql::connectors::pubsub::dead_letter::TOPICS,
    });
    let table = Arc::new(PubSubSourceTable::try_new("t", n_schema(), options).unwrap());
    let (batches, counts) = run(table, 100, "SELECT n FROM t").await.unwrap();
    let mut n: Vec<i64> = batches
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect();
    n.sort();
    assert_eq!(n, vec![1, 3]);
    assert_eq!(counts.messages_dead_lettered, 1, "{counts:?}");
    assert_eq!(counts.messages_acked, 3, "{counts:?}");
    // The dead letter holds the message's data as it was, and says which message it was.
    let dead = PubSubAdmin::connect()
        .await
        .pull_all(&dead_subscription, 1)
        .await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].data, br#"{"n": "private-value"}"#.to_vec());
    let described: String = dead[0]
        .attributes
        .values()
        .cloned()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(described.contains(&ids[1]), "{:?}", dead[0].attributes);
    let left = f.left_over_after_deadline().await;
    assert!(
        left.is_empty(),
        "{} message(s) were not acknowledged",
        left.len()
    );
}

/// A plan whose rows cannot be traced back to messages (an aggregate) is refused while it is
/// planned: nothing is read, nothing acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_by_over_a_subscription_is_refused_before_anything_is_read() {
    let f = Fixture::new("src-insert").await;
    let ids = f.publish(bad_batch()).await;
    let table = Arc::new(PubSubSourceTable::try_new("t", n_schema(), f.options()).unwrap());
    let ctx = context(100);
    gcp_sql::sql::register(&ctx);
    ctx.register_table("t", table.clone()).unwrap();
    let statements = format!(
        "CREATE EXTERNAL TABLE out (n BIGINT) STORED AS PUBSUB LOCATION '{}' \
         OPTIONS ('emulator_host' '{}', 'format' 'json');
         INSERT INTO out SELECT count(*) FROM t GROUP BY n",
        f.topic, f.host
    );
    let err = gcp_sql::sql::run(&ctx, &statements)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("INSERT INTO 'out' aggregates subscription")
            && err.contains("without a window")
            && err.contains("never ends")
            && err.contains("date_bin(INTERVAL '1 minute'"),
        "{err}"
    );
    for handle in table.handles() {
        assert_eq!(
            handle.counts().messages_read,
            0,
            "the source was never executed"
        );
    }
    // Every message is still there for an independent reader.
    let back: Vec<String> = f
        .pull_now()
        .await
        .into_iter()
        .map(|m| m.message_id)
        .collect();
    for id in &ids {
        assert!(back.contains(id), "{id} was taken: {back:?}");
    }
}

/// `n` JSON messages `{"id": i, "url": "/p/i"}`, the url empty for every tenth id.
fn clicks(n: i64) -> Vec<PubsubMessage> {
    (0..n)
        .map(|i| {
            let url = if i % 10 == 0 {
                String::new()
            } else {
                format!("/p/{i}")
            };
            PubsubMessage {
                data: serde_json::json!({ "id": i, "url": url })
                    .to_string()
                    .into(),
                ..Default::default()
            }
        })
        .collect()
}

/// A context with the sinks registered, its batches `batch_size` rows.
pub(crate) fn sql_context(batch_size: usize) -> SessionContext {
    let ctx = context(batch_size);
    gcp_sql::sql::register(&ctx);
    ctx
}

impl Fixture {
    /// The `WITH` form declaring this fixture's subscription as table `name`: a 2 s
    /// `stop_after_idle` and a 10 s `ack_deadline` unless `options` name their own.
    pub(crate) fn source_sql(&self, name: &str, columns: &str, options: &[(&str, &str)]) -> String {
        let mut with = format!(
            "connector = 'pubsub', subscription = '{}', emulator_host = '{}'",
            self.subscription, self.host
        );
        for (k, v) in [("stop_after_idle", "2s"), ("ack_deadline", "10s")] {
            if !options.iter().any(|(name, _)| *name == k) {
                with.push_str(&format!(", {k} = '{v}'"));
            }
        }
        for (k, v) in options {
            with.push_str(&format!(", {k} = '{v}'"));
        }
        format!("CREATE TABLE {name} ({columns}) WITH ({with})")
    }
}

/// Runs `statements` (ending with an INSERT into Bigtable `table`) and checks what landed: the
/// statement's count and the table's rows are exactly `expected` (row key, value of the cell
/// `qualifier`), read back with the Bigtable client.
async fn assert_lands_in_bigtable(
    ctx: &SessionContext,
    statements: &str,
    bt: &crate::support::bigtable::Bigtable,
    table: &str,
    qualifier: &str,
    expected: impl Iterator<Item = (String, String)>,
) {
    let expected: Vec<(String, String)> = expected.collect();
    let out = gcp_sql::sql::run(ctx, statements).await.expect("INSERT");
    let count = out[0]
        .column(0)
        .as_primitive::<arrow::datatypes::UInt64Type>();
    assert_eq!(
        count.value(0),
        expected.len() as u64,
        "rows acknowledged by Bigtable"
    );
    let rows = bt.read(table).await;
    assert_eq!(rows.len(), expected.len(), "rows in Bigtable");
    for (key, value) in &expected {
        let cell = rows[key.as_bytes()]
            .iter()
            .find(|c| c.qualifier == qualifier.as_bytes())
            .unwrap_or_else(|| panic!("{qualifier} cell of row {key}"));
        assert_eq!(cell.value, value.as_bytes(), "row {key}");
    }
}

/// The pipeline users run, in SQL: a subscription read through a filter and scalar functions
/// into Bigtable. Every kept row lands (read back with the Bigtable client), and only then is
/// every message acknowledged: the filtered-out ones too, nothing comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_into_bigtable_lands_every_row_and_acknowledges_every_message() {
    let f = Fixture::new("src-bt").await;
    let bt = crate::support::bigtable::Bigtable::connect().await;
    let table = crate::support::bigtable::Bigtable::table_name("src");
    bt.create_table(&table, &["c"]).await;
    f.publish(clicks(3000)).await;
    let ctx = sql_context(100);
    let statements = format!(
        "{};
         {};
         INSERT INTO clicks_bt SELECT CAST(id AS VARCHAR), upper(url) FROM clicks_in WHERE url <> ''",
        f.source_sql(
            "clicks_in",
            "id BIGINT, url VARCHAR",
            &[("format", "json"), ("parallel_pull_count", "2")]
        ),
        bt.create_sql(
            "clicks_bt",
            "id VARCHAR, url VARCHAR",
            &table,
            &[("row_key", "id"), ("column_family", "c")]
        ),
    );
    let expected = (0..3000)
        .filter(|i| i % 10 != 0)
        .map(|i| (i.to_string(), format!("/P/{i}")));
    assert_lands_in_bigtable(&ctx, &statements, &bt, &table, "url", expected).await;
    assert!(
        f.left_over_after_deadline().await.is_empty(),
        "every message, filtered out or delivered, was acknowledged"
    );
}

/// A message's attribute looked up by name in a pipeline (`attrs['source']` on the source's
/// `attributes_column`, as a new user writes it) lands in the sink. It used to fail once the
/// pipeline started (the map's keys were `Utf8View`, the looked-up name `Utf8`, and DataFusion's
/// map lookup compares them without a cast), delivering nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attribute_looked_up_by_name_in_a_pipeline_lands_in_the_sink() {
    let f = Fixture::new("src-attr").await;
    let bt = crate::support::bigtable::Bigtable::connect().await;
    let table = crate::support::bigtable::Bigtable::table_name("src-attr");
    bt.create_table(&table, &["c"]).await;
    let origin = |i: i64| if i % 3 == 0 { "app" } else { "web" };
    f.publish(
        (0..30)
            .map(|i| PubsubMessage {
                data: serde_json::json!({ "id": i }).to_string().into(),
                attributes: HashMap::from([
                    ("source".to_string(), origin(i).to_string()),
                    ("other".to_string(), "x".to_string()),
                ]),
                ..Default::default()
            })
            .collect(),
    )
    .await;
    let ctx = sql_context(10);
    let statements = format!(
        "{};
         {};
         INSERT INTO attrs_bt SELECT CAST(id AS VARCHAR), attrs['source'] FROM attrs_in",
        f.source_sql(
            "attrs_in",
            "id BIGINT, attrs MAP(VARCHAR, VARCHAR)",
            &[("format", "json"), ("attributes_column", "attrs")]
        ),
        bt.create_sql(
            "attrs_bt",
            "id VARCHAR, origin VARCHAR",
            &table,
            &[("row_key", "id"), ("column_family", "c")]
        ),
    );
    let expected = (0..30).map(|i| (i.to_string(), origin(i).to_string()));
    assert_lands_in_bigtable(&ctx, &statements, &bt, &table, "origin", expected).await;
    assert!(
        f.left_over_after_deadline().await.is_empty(),
        "every message was acknowledged"
    );
}

/// A pipeline of 50 clicks, in batches of 10, into a Bigtable table whose row key is NULL for
/// id 17 (a row the sink refuses), the sink declared with `sink_options`.
struct Refusing {
    f: Fixture,
    bt: crate::support::bigtable::Bigtable,
    table: String,
    ids: Vec<String>,
    ctx: SessionContext,
    statements: String,
}

async fn refusing_pipeline(prefix: &str, sink_options: &[(&str, &str)]) -> Refusing {
    let f = Fixture::new(prefix).await;
    let bt = crate::support::bigtable::Bigtable::connect().await;
    let table = crate::support::bigtable::Bigtable::table_name(prefix);
    bt.create_table(&table, &["c"]).await;
    let ids = f.publish(clicks(50)).await;
    let mut options = vec![("row_key", "id"), ("column_family", "c")];
    options.extend_from_slice(sink_options);
    let statements = format!(
        "{};
         {};
         INSERT INTO out SELECT CASE WHEN id = 17 THEN NULL ELSE CAST(id AS VARCHAR) END, url \
         FROM clicks_in",
        f.source_sql("clicks_in", "id BIGINT, url VARCHAR", &[("format", "json")]),
        bt.create_sql("out", "id VARCHAR, url VARCHAR", &table, &options),
    );
    Refusing {
        f,
        bt,
        table,
        ids,
        ctx: sql_context(10),
        statements,
    }
}

/// Under `failure_policy = 'fail'`, a row the sink refuses (a NULL row key) fails the statement
/// and its message is not acknowledged: it comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_the_sink_refuses_under_fail_leaves_its_message_unacknowledged() {
    let Refusing {
        f,
        ids,
        ctx,
        statements,
        ..
    } = refusing_pipeline("src-fail", &[]).await;
    let err = gcp_sql::sql::run(&ctx, &statements)
        .await
        .expect_err("the refused row fails the statement")
        .to_string();
    assert!(err.contains("row key"), "{err}");
    let source = ctx.table_provider("clicks_in").await.unwrap();
    let source = source
        .downcast_ref::<PubSubSourceTable>()
        .expect("a source table");
    let counts = source.handles()[0].counts();
    assert!(
        counts.messages_acked <= 10,
        "only the batch before the refused row's may be acknowledged: {counts:?}"
    );
    assert_eq!(
        counts.messages_acked + counts.messages_nacked,
        50,
        "what was not acknowledged was nacked: {counts:?}"
    );
    // Not acknowledged: the refused row's message comes back.
    let back = f.pull_until_back(&[&ids[17]]).await;
    assert!(
        back.contains(&ids[17]),
        "the refused row's message was acknowledged: {back:?}"
    );
}

/// Under `failure_policy = 'dead_letter'`, the refused row is dead-lettered, and its message
/// is acknowledged once the dead letter is written: nothing comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_the_sink_dead_letters_is_acknowledged_once_its_dead_letter_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = format!("file://{}", dir.path().display());
    let Refusing {
        f,
        bt,
        table,
        ctx,
        statements,
        ..
    } = refusing_pipeline(
        "src-dl",
        &[
            ("failure_policy", "dead_letter"),
            ("dead_letter_path", &path),
        ],
    )
    .await;
    let out = gcp_sql::sql::run(&ctx, &statements).await.expect("INSERT");
    let count = out[0]
        .column(0)
        .as_primitive::<arrow::datatypes::UInt64Type>();
    assert_eq!(count.value(0), 49);
    let mut letters = String::new();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        letters.push_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap());
    }
    assert_eq!(letters.lines().count(), 1, "one dead letter: {letters}");
    assert_eq!(bt.read(&table).await.len(), 49);
    assert!(
        f.left_over_after_deadline().await.is_empty(),
        "the dead-lettered row's message was acknowledged too"
    );
}

/// An ordered subscription into an ordered topic: each key's messages keep their order end to
/// end (read back from an ordered subscription of the output topic).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_subscription_into_an_ordered_topic_keeps_each_keys_order() {
    let admin = PubSubAdmin::connect().await;
    let id = unique("src-ord");
    let topic = format!("projects/source-tests/topics/{id}");
    let subscription = format!("projects/source-tests/subscriptions/{id}-sub");
    admin.create_topic(&topic).await;
    admin.create_subscription(&subscription, &topic, true).await;
    let (out_topic, out_subscription) = admin
        .topic_with_subscription("source-tests", "src-ord-out", true)
        .await;
    let keys = 5;
    let n = 1000;
    let messages: Vec<PubsubMessage> = (0..n)
        .map(|i| PubsubMessage {
            data: serde_json::json!({ "id": i }).to_string().into(),
            ordering_key: format!("key-{}", i % keys),
            ..Default::default()
        })
        .collect();
    let channel = gcp_sql::emulators::plaintext_channel(&admin.host)
        .await
        .unwrap();
    let mut publisher = PublisherClient::new(channel);
    // One publish per message, in order: the service keeps each key's order from there.
    for chunk in messages.chunks(100) {
        publisher
            .publish(PublishRequest {
                topic: topic.clone(),
                messages: chunk.to_vec(),
            })
            .await
            .expect("Publish");
    }
    let ctx = sql_context(50);
    let statements = format!(
        "CREATE TABLE ordered_in (id BIGINT, k VARCHAR) WITH (connector = 'pubsub', \
           subscription = '{subscription}', emulator_host = '{host}', format = 'json', \
           ordering_key_column = 'k', stop_after_idle = '2s');
         CREATE TABLE ordered_out (ordering_key VARCHAR, id BIGINT) WITH (connector = 'pubsub', \
           topic = '{out_topic}', emulator_host = '{host}', enable_message_ordering = true);
         INSERT INTO ordered_out SELECT k, id FROM ordered_in",
        host = admin.host
    );
    gcp_sql::sql::run(&ctx, &statements).await.expect("INSERT");
    let back = admin.pull_all(&out_subscription, n as usize).await;
    let order: Vec<i64> = (0..n).collect();
    let mut by_id = back.clone();
    by_id.sort_by_key(|m| crate::support::ids(std::slice::from_ref(m), "id")[0]);
    assert_eq!(
        crate::support::ids(&by_id, "id"),
        order,
        "every message once"
    );
    let mut per_key: HashMap<String, Vec<i64>> = HashMap::new();
    for m in &back {
        per_key
            .entry(m.ordering_key.clone())
            .or_default()
            .push(crate::support::ids(std::slice::from_ref(m), "id")[0]);
    }
    assert_eq!(per_key.len(), keys as usize);
    for (key, ids) in per_key {
        assert!(ids.is_sorted(), "{key} out of order: {ids:?}");
    }
}

/// A graceful stop (`StatementControl`) of an INSERT that would read forever: the source stops
/// reading, what it read is delivered and acknowledged, and the statement returns its count.
/// Nothing read is left unacknowledged; what was not read is still on the subscription.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_delivers_and_acknowledges_what_was_read() {
    let f = Fixture::new("src-stop").await;
    let (out_topic, out_subscription) = PubSubAdmin::connect()
        .await
        .topic_with_subscription("source-tests", "src-stop-out", false)
        .await;
    f.publish(clicks(2000)).await;
    let control = gcp_sql::sql::StatementControl::new();
    let ctx = gcp_sql::sql::new_context_with_control(&control);
    let statements = format!(
        "CREATE TABLE clicks_in (id BIGINT, url VARCHAR) WITH (connector = 'pubsub', \
           subscription = '{}', emulator_host = '{host}', format = 'json', ack_deadline = '10s');
         CREATE TABLE out (id BIGINT, url VARCHAR) WITH (connector = 'pubsub', \
           topic = '{out_topic}', emulator_host = '{host}');
         INSERT INTO out SELECT id, url FROM clicks_in",
        f.subscription,
        host = f.host
    );
    let running = tokio::spawn(async move { gcp_sql::sql::run(&ctx, &statements).await });
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!running.is_finished(), "the INSERT reads until stopped");
    control.stop(gcp_sql::core::StopKind::Drain, "test stop");
    let out = running
        .await
        .unwrap()
        .expect("a graceful stop returns the count");
    let delivered = out[0]
        .column(0)
        .as_primitive::<arrow::datatypes::UInt64Type>()
        .value(0) as usize;
    assert_eq!(
        delivered, 2000,
        "everything published was read before the stop"
    );
    let back = PubSubAdmin::connect()
        .await
        .pull_all(&out_subscription, delivered)
        .await;
    assert_eq!(back.len(), delivered);
    assert!(
        f.left_over_after_deadline().await.is_empty(),
        "nothing read was left unacknowledged"
    );
}

/// `UNION ALL` of two subscriptions into one sink: both sources' rows land, every message of
/// both is acknowledged, and the flush points carry the sources' counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_union_of_two_subscriptions_lands_both_and_flush_points_carry_the_counts() {
    let a = Fixture::new("src-ua").await;
    let b = Fixture::new("src-ub").await;
    let bt = crate::support::bigtable::Bigtable::connect().await;
    let table = crate::support::bigtable::Bigtable::table_name("srcu");
    bt.create_table(&table, &["c"]).await;
    a.publish(clicks(500)).await;
    b.publish(clicks(300)).await;
    let points = Arc::new(std::sync::Mutex::new(Vec::new()));
    let control = gcp_sql::sql::StatementControl::new().with_observer({
        let points = points.clone();
        move |p: &gcp_sql::core::run::FlushPoint| points.lock().unwrap().push(p.clone())
    });
    let ctx = gcp_sql::sql::new_context_with_control(&control);
    let statements = format!(
        "{};
         {};
         {};
         INSERT INTO out
         SELECT 'a' || CAST(id AS VARCHAR), url FROM a_in
         UNION ALL
         SELECT 'b' || CAST(id AS VARCHAR), url FROM b_in",
        a.source_sql("a_in", "id BIGINT, url VARCHAR", &[("format", "json")]),
        b.source_sql("b_in", "id BIGINT, url VARCHAR", &[("format", "json")]),
        bt.create_sql(
            "out",
            "id VARCHAR, url VARCHAR",
            &table,
            &[
                ("row_key", "id"),
                ("column_family", "c"),
                ("flush_interval", "500ms")
            ]
        ),
    );
    let out = gcp_sql::sql::run(&ctx, &statements).await.expect("INSERT");
    let count = out[0]
        .column(0)
        .as_primitive::<arrow::datatypes::UInt64Type>();
    assert_eq!(count.value(0), 800);
    let rows = bt.read(&table).await;
    assert_eq!(rows.len(), 800);
    assert!(rows.contains_key(b"a499".as_slice()) && rows.contains_key(b"b299".as_slice()));
    let points = points.lock().unwrap().clone();
    let with_source: Vec<_> = points.iter().filter_map(|p| p.delivery).collect();
    assert!(
        !with_source.is_empty(),
        "flush points of a source's writers carry its counts: {points:?}"
    );
    assert!(
        with_source.iter().any(|s| s.messages_read > 0),
        "{with_source:?}"
    );
    assert!(a.left_over_after_deadline().await.is_empty());
    assert!(b.pull_now().await.is_empty());
}

/// The complete dead-letter objects in `dir` (a local `dead_letter_path`), read as a reader of
/// the folder would: their names, and every line parsed as a JSON object. An object still
/// being written is a staging file whose name does not end in `.ndjson`; it is left out.
fn complete_dead_letters(
    dir: &std::path::Path,
) -> (Vec<String>, Vec<serde_json::Map<String, serde_json::Value>>) {
    let mut names = Vec::new();
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read the dead-letter folder") {
        let path = entry.expect("an entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.ends_with(".ndjson") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read a dead-letter object");
        for line in text.lines() {
            match serde_json::from_str(line).expect("a JSON line") {
                serde_json::Value::Object(object) => lines.push(object),
                other => panic!("not an object: {other}"),
            }
        }
        names.push(name);
    }
    names.sort();
    (names, lines)
}

/// A pipeline that never ends (no `stop_after_idle`), reading a subscription whose undecodable
/// message goes to a `dead_letter_path` folder, with a short `max_lease_duration`. The
/// dead-letter object is completed at the sink's flush points, so while the pipeline still
/// runs, past `max_lease_duration`, the dead letter is readable in the folder and its message
/// was acknowledged: no lease lapsed, nothing was delivered twice. (Before ADR 0071 the object
/// was completed only when the statement ended: the message was held until its lease lapsed,
/// then delivered again and dead-lettered a second time.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_that_never_ends_stores_its_dead_letters_and_acknowledges_them_at_flush_points()
{
    const MAX_LEASE: Duration = Duration::from_secs(10);
    let f = Fixture::new("src-dl-live").await;
    let dir = tempfile::tempdir().unwrap();
    let (out_topic, out_subscription) = PubSubAdmin::connect()
        .await
        .topic_with_subscription("source-tests", "src-dl-live-out", false)
        .await;
    let ids = f.publish(bad_batch()).await;
    let control = gcp_sql::sql::StatementControl::new();
    let ctx = gcp_sql::sql::new_context_with_control(&control);
    let statements = format!(
        "CREATE TABLE numbers_in (n BIGINT) WITH (connector = 'pubsub', \
           subscription = '{}', emulator_host = '{host}', format = 'json', \
           ack_deadline = '10s', max_lease_duration = '{}s', \
           failure_policy = 'dead_letter', dead_letter_path = 'file://{}');
         CREATE TABLE numbers_out (n BIGINT) WITH (connector = 'pubsub', \
           topic = '{out_topic}', emulator_host = '{host}', flush_interval = '1s');
         INSERT INTO numbers_out SELECT n FROM numbers_in",
        f.subscription,
        MAX_LEASE.as_secs(),
        dir.path().display(),
        host = f.host
    );
    let running = {
        let ctx = ctx.clone();
        tokio::spawn(async move { gcp_sql::sql::run(&ctx, &statements).await })
    };
    // Past the longest lease, and one stream ack deadline more: a message still held by then
    // had its lease lapse and was delivered again.
    tokio::time::sleep(MAX_LEASE + ACK_DEADLINE).await;
    assert!(!running.is_finished(), "the INSERT reads until stopped");
    let source = ctx.table_provider("numbers_in").await.unwrap();
    let source = source
        .downcast_ref::<PubSubSourceTable>()
        .expect("a source table");
    let live = source.handles()[0].counts();
    let (names, lines) = complete_dead_letters(dir.path());
    control.stop(gcp_sql::core::StopKind::Drain, "test stop");
    let out = running.await.unwrap().expect("a drained INSERT");
    let delivered = out[0]
        .column(0)
        .as_primitive::<arrow::datatypes::UInt64Type>()
        .value(0);
    // While the pipeline ran: the dead letter was stored in a complete object, and every
    // message, the undecodable one too, was acknowledged once, none of them redelivered.
    assert_eq!(live.leases_expired, 0, "{live:?}");
    assert_eq!(
        live.messages_read, 3,
        "nothing was delivered twice: {live:?}"
    );
    assert_eq!(live.messages_dead_lettered, 1, "{live:?}");
    assert_eq!(live.messages_acked, 3, "{live:?}");
    assert_eq!(lines.len(), 1, "{names:?} {lines:?}");
    assert_eq!(lines[0]["row"]["message_id"], ids[1].as_str(), "{lines:?}");
    assert_eq!(lines[0]["payload"], r#"{"n": "private-value"}"#);
    assert_eq!(lines[0]["error_class"], "encoding");
    // After the stop: the two good rows landed, and nothing more was dead-lettered.
    assert_eq!(delivered, 2);
    let landed = PubSubAdmin::connect()
        .await
        .pull_all(&out_subscription, 2)
        .await;
    assert_eq!(landed.len(), 2);
    let (_, after) = complete_dead_letters(dir.path());
    assert_eq!(after.len(), 1, "{after:?}");
    assert!(
        f.left_over_after_deadline().await.is_empty(),
        "every message was acknowledged"
    );
}

/// The sink side of the same pipeline that never ends: a row the Bigtable sink refuses (a NULL
/// row key) goes to the sink's `dead_letter_path`, and its source message is acknowledged only
/// once that dead letter is stored in a complete object, which the sink's flush points make:
/// while the pipeline still runs, past `max_lease_duration`, every message is acknowledged and
/// the dead letter is readable. (Before ADR 0071 the message was acknowledged as soon as the row
/// was handed to the unfinished upload, with no complete object in the folder.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sinks_dead_letter_is_stored_before_its_message_is_acknowledged_mid_run() {
    const MAX_LEASE: Duration = Duration::from_secs(10);
    let f = Fixture::new("src-sdl-live").await;
    let dir = tempfile::tempdir().unwrap();
    let bt = crate::support::bigtable::Bigtable::connect().await;
    let table = crate::support::bigtable::Bigtable::table_name("src-sdl-live");
    bt.create_table(&table, &["c"]).await;
    f.publish(clicks(50)).await;
    let control = gcp_sql::sql::StatementControl::new();
    let ctx = gcp_sql::sql::new_context_with_control(&control);
    let path = format!("file://{}", dir.path().display());
    let statements = format!(
        "CREATE TABLE clicks_in (id BIGINT, url VARCHAR) WITH (connector = 'pubsub', \
           subscription = '{}', emulator_host = '{}', format = 'json', ack_deadline = '10s', \
           max_lease_duration = '{}s');
         {};
         INSERT INTO out SELECT CASE WHEN id = 17 THEN NULL ELSE CAST(id AS VARCHAR) END, url \
         FROM clicks_in",
        f.subscription,
        f.host,
        MAX_LEASE.as_secs(),
        bt.create_sql(
            "out",
            "id VARCHAR, url VARCHAR",
            &table,
            &[
                ("row_key", "id"),
                ("column_family", "c"),
                ("failure_policy", "dead_letter"),
                ("dead_letter_path", &path),
                ("flush_interval", "1s"),
            ]
        ),
    );
    let running = {
        let ctx = ctx.clone();
        tokio::spawn(async move { gcp_sql::sql::run(&ctx, &statements).await })
    };
    tokio::time::sleep(MAX_LEASE + ACK_DEADLINE).await;
    assert!(!running.is_finished(), "the INSERT reads until stopped");
    let source = ctx.table_provider("clicks_in").await.unwrap();
    let source = source
        .downcast_ref::<PubSubSourceTable>()
        .expect("a source table");
    // The counts first, the folder after: a message acknowledged by then had its dead letter
    // stored before.
    let live = source.handles()[0].counts();
    let (names, lines) = complete_dead_letters(dir.path());
    control.stop(gcp_sql::core::StopKind::Drain, "test stop");
    let out = running.await.unwrap().expect("a drained INSERT");
    assert_eq!(
        out[0]
            .column(0)
            .as_primitive::<arrow::datatypes::UInt64Type>()
            .value(0),
        49
    );
    assert_eq!(live.leases_expired, 0, "{live:?}");
    assert_eq!(
        live.messages_read, 50,
        "nothing was delivered twice: {live:?}"
    );
    assert_eq!(live.messages_acked, 50, "{live:?}");
    assert_eq!(
        lines.len(),
        1,
        "the refused row's dead letter, complete: {names:?}"
    );
    assert_eq!(lines[0]["error_class"], "encoding");
    assert_eq!(lines[0]["row"]["url"], "/p/17", "{lines:?}");
    assert_eq!(bt.read(&table).await.len(), 49);
    assert!(
        f.left_over_after_deadline().await.is_empty(),
        "every message was acknowledged"
    );
}
