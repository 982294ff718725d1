//! Two table functions to look at what a Pub/Sub sink published, from SQL:
//!
//! * `pubsub_subscribe(topic, subscription)` creates a subscription (and its topic) when it does
//!   not exist yet, and returns one row saying whether it created the subscription. A subscription receives what is
//!   published after it exists, so call it before the `INSERT`.
//! * `pubsub_pull(subscription [, max_messages])` pulls up to `max_messages` (default 100)
//!   messages, acknowledges them, and returns one row per message.
//!
//! Both talk to the emulator named by `PUBSUB_EMULATOR_HOST` only (`gcp-sql --emulators` sets
//! it), and refuse otherwise: they exist for quickstarts, demos and checks, not for reading
//! from production subscriptions. For the same reason [`crate::sql::register`] does not
//! install them: [`crate::sql::register_inspection`] does (the `gcp-sql` tool calls it).
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
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::ScalarValue;
use datafusion::datasource::TableType;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::Result as DFResult;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use gcloud_sdk::google::pubsub::v1::publisher_client::PublisherClient;
use gcloud_sdk::google::pubsub::v1::subscriber_client::SubscriberClient;
use gcloud_sdk::google::pubsub::v1::{AcknowledgeRequest, PullRequest, Subscription, Topic};
use tonic::Code;
use tonic::transport::Channel;

use super::client::DEFAULT_ENDPOINT;
use crate::connectors::ConnectorKind;
use crate::error::{Error, Result};

/// Most messages one `pubsub_pull` call returns.
pub const MAX_PULL_MESSAGES: i64 = 10_000;
/// How long the first pull waits for messages.
const FIRST_PULL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long each later pull waits before `pubsub_pull` returns what it has.
const NEXT_PULL_TIMEOUT: Duration = Duration::from_millis(500);

/// The `pubsub_pull` table function.
#[derive(Debug, Default)]
pub struct PubSubPullFunction;

/// The `pubsub_subscribe` table function.
#[derive(Debug, Default)]
pub struct PubSubSubscribeFunction;

impl TableFunctionImpl for PubSubPullFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DFResult<Arc<dyn TableProvider>> {
        let exprs = args.exprs();
        let subscription = string_arg("pubsub_pull", exprs, 0, "subscription")?;
        let max = match exprs.get(1) {
            None => 100,
            Some(Expr::Literal(ScalarValue::Int64(Some(n)), _))
                if (1..=MAX_PULL_MESSAGES).contains(n) =>
            {
                *n
            }
            Some(other) => {
                return Err(Error::invalid(
                    "pubsub_pull max_messages",
                    other.to_string(),
                    format!("an integer from 1 to {MAX_PULL_MESSAGES}"),
                )
                .into());
            }
        };
        Ok(Arc::new(LazyTable {
            action: Action::Pull {
                subscription,
                max: max as usize,
            },
        }))
    }
}

impl TableFunctionImpl for PubSubSubscribeFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DFResult<Arc<dyn TableProvider>> {
        let exprs = args.exprs();
        let topic = string_arg("pubsub_subscribe", exprs, 0, "topic")?;
        let subscription = string_arg("pubsub_subscribe", exprs, 1, "subscription")?;
        Ok(Arc::new(LazyTable {
            action: Action::Subscribe {
                topic,
                subscription,
            },
        }))
    }
}

fn string_arg(function: &str, exprs: &[Expr], index: usize, name: &str) -> DFResult<String> {
    match exprs.get(index) {
        Some(Expr::Literal(ScalarValue::Utf8(Some(s)) | ScalarValue::Utf8View(Some(s)), _)) => {
            Ok(s.clone())
        }
        other => Err(Error::invalid(
            format!("{function} {name}"),
            other.map(|e| e.to_string()).unwrap_or_default(),
            "expected a string literal with the full resource name",
        )
        .into()),
    }
}

#[derive(Debug, Clone)]
enum Action {
    Pull { subscription: String, max: usize },
    Subscribe { topic: String, subscription: String },
}

/// A table whose rows are produced when it is scanned (the RPC runs at execution time).
#[derive(Debug)]
struct LazyTable {
    action: Action,
}

fn pull_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("message_id", DataType::Utf8, false),
        Field::new(
            "publish_time",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
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
impl TableProvider for LazyTable {
    fn schema(&self) -> SchemaRef {
        match self.action {
            Action::Pull { .. } => pull_schema(),
            Action::Subscribe { .. } => subscribe_schema(),
        }
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let batch = match &self.action {
            Action::Pull { subscription, max } => pull(subscription, *max).await?,
            Action::Subscribe {
                topic,
                subscription,
            } => subscribe(topic, subscription).await?,
        };
        let schema = batch.schema();
        Ok(MemorySourceConfig::try_new_exec(
            &[vec![batch]],
            schema,
            projection.cloned(),
        )?)
    }
}

async fn subscriber() -> Result<SubscriberClient<Channel>> {
    Ok(SubscriberClient::new(emulator_channel()?))
}

fn emulator_channel() -> Result<Channel> {
    let var = ConnectorKind::PubSub.emulator_env_var();
    match std::env::var(var).ok().filter(|h| !h.trim().is_empty()) {
        Some(host) => Ok(crate::emulators::plaintext_endpoint(&host)?.connect_lazy()),
        None => Err(Error::Connect {
            endpoint: DEFAULT_ENDPOINT.to_string(),
            message: format!(
                "pubsub_pull and pubsub_subscribe talk to an emulator only: set {var}"
            ),
        }),
    }
}

fn rpc_error(operation: &'static str, destination: &str, status: tonic::Status) -> Error {
    Error::rpc(operation, destination, &status, 1)
}

async fn subscribe(topic: &str, subscription: &str) -> Result<RecordBatch> {
    let mut client = subscriber().await?;
    let request = Subscription {
        name: subscription.to_string(),
        topic: topic.to_string(),
        enable_message_ordering: true,
        ..Default::default()
    };
    let created = match client.create_subscription(request.clone()).await {
        Ok(_) => true,
        Err(status) if status.code() == Code::AlreadyExists => false,
        Err(status) if status.code() == Code::NotFound => {
            // The sink may create the topic only at its first publish; make it now so the
            // subscription exists before that publish.
            let mut publisher = PublisherClient::new(emulator_channel()?);
            match publisher
                .create_topic(Topic {
                    name: topic.to_string(),
                    ..Default::default()
                })
                .await
            {
                Ok(_) => {}
                Err(status) if status.code() == Code::AlreadyExists => {}
                Err(status) => return Err(rpc_error("CreateTopic", topic, status)),
            }
            client
                .create_subscription(request)
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

async fn pull(subscription: &str, max: usize) -> Result<RecordBatch> {
    let mut client = subscriber().await?;
    let mut rows: Vec<PulledRow> = Vec::new();
    while rows.len() < max {
        let mut request = tonic::Request::new(PullRequest {
            subscription: subscription.to_string(),
            max_messages: i32::try_from(max - rows.len()).unwrap_or(i32::MAX),
            ..Default::default()
        });
        request.set_timeout(if rows.is_empty() {
            FIRST_PULL_TIMEOUT
        } else {
            NEXT_PULL_TIMEOUT
        });
        let response = match client.pull(request).await {
            Ok(r) => r.into_inner(),
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
            let publish_time = m
                .publish_time
                .map(|t| t.seconds * 1_000_000 + i64::from(t.nanos) / 1_000);
            let mut attributes: Vec<_> = m.attributes.into_iter().collect();
            attributes.sort();
            let attributes = serde_json::to_string(
                &attributes
                    .into_iter()
                    .map(|(k, v)| (k, serde_json::Value::String(v)))
                    .collect::<serde_json::Map<_, _>>(),
            )
            .unwrap_or_default();
            let key = (!m.ordering_key.is_empty()).then_some(m.ordering_key);
            rows.push((
                m.message_id,
                publish_time,
                key,
                attributes,
                String::from_utf8_lossy(&m.data).into_owned(),
            ));
        }
        client
            .acknowledge(AcknowledgeRequest {
                subscription: subscription.to_string(),
                ack_ids,
            })
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
