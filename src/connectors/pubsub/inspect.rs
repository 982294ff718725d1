//! Two table functions to look at what a Pub/Sub sink published, from SQL:
//!
//! | call | arguments | returns |
//! |---|---|---|
//! | `pubsub_subscribe(topic, subscription)` | `topic`: a full topic name, `projects/P/topics/T`; `subscription`: a full subscription name, `projects/P/subscriptions/S` | one row, `subscription` and `created` (whether it created the subscription) |
//! | `pubsub_pull(subscription [, max_messages])` | `subscription`: `projects/P/subscriptions/S`; `max_messages`: an integer from 1 to [`MAX_PULL_MESSAGES`], default [`DEFAULT_PULL_MESSAGES`] | one row per message: `message_id`, `publish_time`, `ordering_key`, `attributes` (a JSON object), `data` (as UTF-8 text) |
//!
//! `pubsub_subscribe` creates the subscription (and its topic) when it does not exist yet. A
//! subscription receives what is published after it exists, so call it before the `INSERT`.
//! `pubsub_pull` pulls and acknowledges up to `max_messages` messages: it pulls in pages of at
//! most [`PULL_PAGE_MESSAGES`] (the emulator answers 100 at most), each `Pull` under its own
//! deadline and each page acknowledged before the next is pulled, until it has `max_messages`
//! or the subscription has nothing more to give, so a backlog larger than one `Pull` response
//! is read to the end. The first pull waits up to 5 s for a message; the later ones return at
//! once when the backlog is empty.
//!
//! The arguments are checked before any call: a name must be a full resource name whose ids
//! follow the Pub/Sub resource-name rules (3 to 255 characters, starting with a letter, of
//! letters, digits and `-_.~+%`, not starting with `goog`; see
//! [`names`](super::names)).
//!
//! Both talk to the emulator named by `PUBSUB_EMULATOR_HOST` only (`gcp-sql --emulators` sets
//! it; a Rust program may name the emulator itself, [`PubSubPullFunction::with_emulator_host`]),
//! and refuse otherwise: they exist for quickstarts, demos and checks, not for reading from
//! production subscriptions. For the same reason [`crate::sql::register`] does not install
//! them: [`crate::sql::register_inspection`] does (the `gcp-sql` tool calls it).
//!
//! ```sql
//! SELECT * FROM pubsub_subscribe('projects/demo/topics/clicks', 'projects/demo/subscriptions/look');
//! INSERT INTO clicks SELECT * FROM 'sql/data/clicks.csv';
//! SELECT data, attributes FROM pubsub_pull('projects/demo/subscriptions/look', 10);
//! ```

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::array::{
    ArrayRef, BooleanArray, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::error::Result as DFResult;
use gcloud_sdk::google::pubsub::v1::publisher_client::PublisherClient;
use gcloud_sdk::google::pubsub::v1::subscriber_client::SubscriberClient;
use gcloud_sdk::google::pubsub::v1::{AcknowledgeRequest, PullRequest, Subscription, Topic};
use tonic::Code;

use super::names::{pubsub_subscription, pubsub_topic};
use super::snapshots::{SnapshotCall, SnapshotFunction};
use crate::error::Result;
use crate::google::{GrpcChannel, Reachability, with_deadline};
use crate::plan::inspect::{
    Inspection, InspectionFunctions, LazyTable, check_arity, count_arg, emulator_channel, name_arg,
    rpc_error, sorted_json_object, timestamp_micros, utc_micros,
};

/// Most messages one `pubsub_pull` call returns.
pub const MAX_PULL_MESSAGES: i64 = 10_000;
/// Messages `pubsub_pull` returns when `max_messages` is not given.
pub const DEFAULT_PULL_MESSAGES: i64 = 100;
/// Most messages one `Pull` asks for: a larger `max_messages` is read in several pulls, each
/// acknowledged before the next, so no single response has to carry the whole backlog within
/// one deadline.
pub const PULL_PAGE_MESSAGES: usize = 1_000;
/// How long the first pull waits for messages.
const FIRST_PULL_TIMEOUT: Duration = Duration::from_secs(5);
/// Deadline of each later pull. Those ask to return at once (`return_immediately`), so they
/// wait for nothing: the deadline only bounds a slow answer (a full page on a busy machine).
const PAGE_PULL_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest response a pull decodes: 20 MiB, the inbound message size the Java Pub/Sub
/// subscriber allows (tonic's default of 4 MiB would refuse a full page of large messages).
const MAX_PULL_RESPONSE_BYTES: usize = 20 * 1024 * 1024;
/// Deadline of each `Acknowledge` and `CreateSubscription`/`CreateTopic` call.
const ADMIN_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The Pub/Sub connector's inspection functions: `pubsub_subscribe`, `pubsub_pull` and the
/// snapshot functions ([`super::snapshots`]), talking to the emulator `PUBSUB_EMULATOR_HOST`
/// names.
pub fn inspection_functions() -> InspectionFunctions {
    let mut functions: InspectionFunctions = vec![
        (
            "pubsub_subscribe",
            Arc::new(PubSubSubscribeFunction::default()),
        ),
        ("pubsub_pull", Arc::new(PubSubPullFunction::default())),
    ];
    // The snapshots a replay starts from (`start_at = 'snapshot:...'`).
    for call in [
        SnapshotCall::Create,
        SnapshotCall::List,
        SnapshotCall::Delete,
    ] {
        functions.push((call.function(), Arc::new(SnapshotFunction::new(call))));
    }
    functions
}

/// The `pubsub_pull` table function.
#[derive(Debug, Default)]
pub struct PubSubPullFunction {
    emulator_host: Option<String>,
}

/// The `pubsub_subscribe` table function.
#[derive(Debug, Default)]
pub struct PubSubSubscribeFunction {
    emulator_host: Option<String>,
}

impl PubSubPullFunction {
    /// A `pubsub_pull` that talks to the emulator at `host` (`host:port`) rather than the one
    /// `PUBSUB_EMULATOR_HOST` names.
    pub fn with_emulator_host(host: impl Into<String>) -> Self {
        PubSubPullFunction {
            emulator_host: Some(host.into()),
        }
    }
}

impl PubSubSubscribeFunction {
    /// A `pubsub_subscribe` that talks to the emulator at `host` (`host:port`) rather than the
    /// one `PUBSUB_EMULATOR_HOST` names.
    pub fn with_emulator_host(host: impl Into<String>) -> Self {
        PubSubSubscribeFunction {
            emulator_host: Some(host.into()),
        }
    }
}

impl TableFunctionImpl for PubSubPullFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DFResult<Arc<dyn TableProvider>> {
        let exprs = args.exprs();
        let function = "pubsub_pull";
        check_arity(function, exprs, 2, "(subscription [, max_messages])")?;
        let subscription = name_arg(function, exprs, 0, "subscription", pubsub_subscription)?;
        let max = count_arg(
            function,
            exprs,
            1,
            "max_messages",
            DEFAULT_PULL_MESSAGES,
            MAX_PULL_MESSAGES,
        )?;
        Ok(LazyTable::provider(
            pull_schema(),
            Pull {
                subscription,
                max,
                emulator_host: self.emulator_host.clone(),
            },
        ))
    }
}

impl TableFunctionImpl for PubSubSubscribeFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DFResult<Arc<dyn TableProvider>> {
        let exprs = args.exprs();
        let function = "pubsub_subscribe";
        check_arity(function, exprs, 2, "(topic, subscription)")?;
        let topic = name_arg(function, exprs, 0, "topic", full_topic)?;
        let subscription = name_arg(function, exprs, 1, "subscription", pubsub_subscription)?;
        Ok(LazyTable::provider(
            subscribe_schema(),
            Subscribe {
                topic,
                subscription,
                emulator_host: self.emulator_host.clone(),
            },
        ))
    }
}

/// A full topic name (there is no `project` option to resolve a short id in).
fn full_topic(value: &str) -> std::result::Result<String, String> {
    if !value.contains('/') {
        return Err("expected 'projects/PROJECT/topics/TOPIC'".into());
    }
    pubsub_topic(value, None)
}

/// A `pubsub_pull` call. `emulator_host`: the emulator to talk to; `None`: the one
/// `PUBSUB_EMULATOR_HOST` names.
#[derive(Debug)]
struct Pull {
    subscription: String,
    max: usize,
    emulator_host: Option<String>,
}

/// A `pubsub_subscribe` call.
#[derive(Debug)]
struct Subscribe {
    topic: String,
    subscription: String,
    emulator_host: Option<String>,
}

fn pull_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("message_id", DataType::Utf8, false),
        Field::new("publish_time", utc_micros(), true),
        Field::new("ordering_key", DataType::Utf8, true),
        Field::new("attributes", DataType::Utf8, false),
        Field::new("data", DataType::Utf8, false),
    ]))
}

fn subscribe_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("subscription", DataType::Utf8, false),
        Field::new("created", DataType::Boolean, false),
    ]))
}

#[async_trait]
impl Inspection for Pull {
    async fn run(&self) -> Result<RecordBatch> {
        let (channel, reach) =
            emulator_channel("pubsub_pull", super::SERVICE, self.emulator_host.as_deref())?;
        pull(channel, &reach, &self.subscription, self.max).await
    }
}

#[async_trait]
impl Inspection for Subscribe {
    async fn run(&self) -> Result<RecordBatch> {
        let (channel, reach) = emulator_channel(
            "pubsub_subscribe",
            super::SERVICE,
            self.emulator_host.as_deref(),
        )?;
        subscribe(channel, &reach, &self.topic, &self.subscription).await
    }
}

fn timed<M>(message: M, timeout: Duration) -> tonic::Request<M> {
    with_deadline(tonic::Request::new(message), Some(timeout), false)
}

async fn subscribe(
    channel: GrpcChannel,
    reach: &Reachability,
    topic: &str,
    subscription: &str,
) -> Result<RecordBatch> {
    let mut client = SubscriberClient::new(channel.clone());
    let request = Subscription {
        name: subscription.to_string(),
        topic: topic.to_string(),
        enable_message_ordering: true,
        ..Default::default()
    };
    let first = client
        .create_subscription(timed(request.clone(), ADMIN_CALL_TIMEOUT))
        .await;
    let created = match reach.observe(first) {
        Ok(_) => true,
        Err(status) if status.code() == Code::AlreadyExists => false,
        Err(status) if status.code() == Code::NotFound => {
            // The sink may create the topic only at its first publish; make it now so the
            // subscription exists before that publish.
            let mut publisher = PublisherClient::new(channel);
            let topic_request = Topic {
                name: topic.to_string(),
                ..Default::default()
            };
            match publisher
                .create_topic(timed(topic_request, ADMIN_CALL_TIMEOUT))
                .await
            {
                Ok(_) => {}
                Err(status) if status.code() == Code::AlreadyExists => {}
                Err(status) => return Err(rpc_error("CreateTopic", topic, status)),
            }
            client
                .create_subscription(timed(request, ADMIN_CALL_TIMEOUT))
                .await
                .map_err(|status| rpc_error("CreateSubscription", subscription, status))?;
            true
        }
        Err(status) => return Err(rpc_error("CreateSubscription", subscription, status)),
    };
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(vec![subscription.to_string()])),
        Arc::new(BooleanArray::from(vec![created])),
    ];
    Ok(RecordBatch::try_new(subscribe_schema(), columns)?)
}

/// One pulled message: id, publish time (µs), ordering key, attributes (JSON), data.
type PulledRow = (String, Option<i64>, Option<String>, String, String);

async fn pull(
    channel: GrpcChannel,
    reach: &Reachability,
    subscription: &str,
    max: usize,
) -> Result<RecordBatch> {
    let mut client =
        SubscriberClient::new(channel).max_decoding_message_size(MAX_PULL_RESPONSE_BYTES);
    let mut rows: Vec<PulledRow> = Vec::new();
    while rows.len() < max {
        let page = (max - rows.len()).min(PULL_PAGE_MESSAGES);
        let first = rows.is_empty();
        // The first pull waits for messages to arrive; the later ones take what the backlog
        // holds and return at once when it is empty (the emulator honours the flag; the
        // service, which these functions never call, deprecates it).
        #[allow(deprecated)]
        let request = PullRequest {
            subscription: subscription.to_string(),
            max_messages: i32::try_from(page).unwrap_or(i32::MAX),
            return_immediately: !first,
        };
        let timeout = if first {
            FIRST_PULL_TIMEOUT
        } else {
            PAGE_PULL_TIMEOUT
        };
        let response = match reach.observe(client.pull(timed(request, timeout)).await) {
            Ok(r) => r.into_inner(),
            // Nothing arrived within the wait, or a later page is slow to come: what was pulled
            // (and acknowledged) so far is the answer, rather than an error that would hide it.
            Err(status) if status.code() == Code::DeadlineExceeded => break,
            Err(status) => return Err(rpc_error("Pull", subscription, status)),
        };
        if response.received_messages.is_empty() {
            break;
        }
        let mut ack_ids = Vec::with_capacity(response.received_messages.len());
        for received in response.received_messages {
            ack_ids.push(received.ack_id);
            let Some(m) = received.message else { continue };
            let publish_time = m.publish_time.map(|t| timestamp_micros(t.seconds, t.nanos));
            let attributes = sorted_json_object(&m.attributes);
            let key = (!m.ordering_key.is_empty()).then_some(m.ordering_key);
            rows.push((
                m.message_id,
                publish_time,
                key,
                attributes,
                String::from_utf8_lossy(&m.data).into_owned(),
            ));
        }
        let ack = AcknowledgeRequest {
            subscription: subscription.to_string(),
            ack_ids,
        };
        client
            .acknowledge(timed(ack, ADMIN_CALL_TIMEOUT))
            .await
            .map_err(|status| rpc_error("Acknowledge", subscription, status))?;
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.0.as_str()),
        )),
        Arc::new(
            TimestampMicrosecondArray::from_iter(rows.iter().map(|r| r.1)).with_timezone("UTC"),
        ),
        Arc::new(StringArray::from_iter(rows.iter().map(|r| r.2.as_deref()))),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.3.as_str()),
        )),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.4.as_str()),
        )),
    ];
    Ok(RecordBatch::try_new(pull_schema(), columns)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::inspect::test_support::assert_nothing_answers;
    use crate::sql::{new_context, register_inspection, run};

    /// The error of planning `sql` with the inspection functions installed, pointed at a port
    /// where nothing listens: the arguments are checked before any call, so none is made.
    async fn refused(sql: &str) -> String {
        let ctx = new_context();
        ctx.register_udtf(
            "pubsub_pull",
            Arc::new(PubSubPullFunction::with_emulator_host("127.0.0.1:1")),
        );
        ctx.register_udtf(
            "pubsub_subscribe",
            Arc::new(PubSubSubscribeFunction::with_emulator_host("127.0.0.1:1")),
        );
        run(&ctx, sql).await.unwrap_err().to_string()
    }

    #[tokio::test]
    async fn subscription_names_are_checked_before_any_call() {
        let short = refused("SELECT * FROM pubsub_pull('look')").await;
        assert!(
            short.contains("'pubsub_pull subscription'")
                && short.contains("expected 'projects/PROJECT/subscriptions/SUBSCRIPTION'"),
            "{short}"
        );
        let id = refused("SELECT * FROM pubsub_pull('projects/demo/subscriptions/ab', 5)").await;
        assert!(id.contains("subscription id has 3 to 255"), "{id}");
        let goog = refused(
            "SELECT * FROM pubsub_subscribe('projects/demo/topics/clicks', 'projects/demo/subscriptions/goog-x')",
        )
        .await;
        assert!(
            goog.contains("'pubsub_subscribe subscription'") && goog.contains("'goog'"),
            "{goog}"
        );
        let topic =
            refused("SELECT * FROM pubsub_subscribe('clicks', 'projects/demo/subscriptions/look')")
                .await;
        assert!(
            topic.contains("'pubsub_subscribe topic'")
                && topic.contains("expected 'projects/PROJECT/topics/TOPIC'"),
            "{topic}"
        );
        let topic_id = refused(
            "SELECT * FROM pubsub_subscribe('projects/demo/topics/1x', 'projects/demo/subscriptions/look')",
        )
        .await;
        assert!(topic_id.contains("a topic id has 3 to 255"), "{topic_id}");
    }

    #[tokio::test]
    async fn the_message_count_and_the_argument_count_are_checked() {
        for bad in ["0", "10001", "'ten'"] {
            let err = refused(&format!(
                "SELECT * FROM pubsub_pull('projects/demo/subscriptions/look', {bad})"
            ))
            .await;
            assert!(err.contains("an integer from 1 to 10000"), "{bad}: {err}");
        }
        let many =
            refused("SELECT * FROM pubsub_pull('projects/demo/subscriptions/look', 1, 2)").await;
        assert!(
            many.contains("pubsub_pull(subscription [, max_messages])"),
            "{many}"
        );
    }

    #[tokio::test]
    async fn a_call_to_an_address_where_nothing_listens_says_so() {
        assert_nothing_answers(
            "pubsub_pull",
            |address| Arc::new(PubSubPullFunction::with_emulator_host(address)),
            "SELECT * FROM pubsub_pull('projects/demo/subscriptions/look')",
        )
        .await;
    }

    #[tokio::test]
    async fn register_inspection_still_installs_functions_that_read_the_environment() {
        let ctx = new_context();
        register_inspection(&ctx);
        let err = run(&ctx, "SELECT * FROM pubsub_pull('look')")
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("pubsub_pull subscription"), "{err}");
    }
}
