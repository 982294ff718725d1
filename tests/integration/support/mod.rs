//! Helpers shared by the Pub/Sub sink tests: running one `INSERT` and reading the sink's
//! metrics, registering a sink table whose schema SQL cannot declare, and the emulator side
//! (topics, subscriptions, pulls).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use arrow::array::AsArray;
use arrow::datatypes::{SchemaRef, UInt64Type};
use datafusion::physical_plan::metrics::MetricsSet;
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::SessionContext;
use gcloud_sdk::google::pubsub::v1::publisher_client::PublisherClient;
use gcloud_sdk::google::pubsub::v1::subscriber_client::SubscriberClient;
use gcloud_sdk::google::pubsub::v1::{
    AcknowledgeRequest, GetTopicRequest, PubsubMessage, PullRequest, Subscription, Topic,
};
use gcp_sql::core::metrics::names;
use gcp_sql::emulators::EmulatorKind;
use gcp_sql::options::RawOptions;
use gcp_sql::sql::SinkTable;
use tonic::transport::Channel;

pub mod bigtable;
pub mod proxy;
pub mod python;

/// A name no other test of this process uses: `<prefix>-<pid>-<n>`. Pub/Sub ids are 3 to 255
/// characters and start with a letter (the `Topic.name` comment of googleapis'
/// `google/pubsub/v1/pubsub.proto`; the emulator checks the same rule), so `prefix` starts
/// with one.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Fails the calling test, with the one message that names the missing program and the
/// command that installs it, unless every emulator of `kinds` is installed. For tests that run
/// the `gcp-sql` tool with `--emulators`: the tool goes on without an emulator it cannot start,
/// so without this such a test would fail later on an assertion about what the tool did. The
/// first failing test of the binary gives the whole lookup; the others a one-line reminder.
/// Every emulator the registry lists, in its order.
pub fn all_emulators() -> Vec<EmulatorKind> {
    gcp_sql::connectors::registry::emulators().collect()
}

pub fn require_emulators(kinds: &[EmulatorKind]) {
    for &kind in kinds {
        if let Err(error) = kind.locate() {
            panic!(
                "{}",
                gcp_sql::emulators::start_failure(kind, &error.to_string())
            );
        }
    }
}

/// Runs SQL statements that are expected to succeed (DDL, mostly).
pub async fn exec(ctx: &SessionContext, sql: &str) {
    if let Err(e) = gcp_sql::sql::run(ctx, sql).await {
        panic!("statement failed: {e}\n{sql}");
    }
}

/// What one `INSERT` statement did: its result (the returned row count, or the error text)
/// and the metrics of its sink.
#[derive(Debug)]
pub struct Insert {
    /// The count the statement returned, or its error rendered as text.
    pub result: Result<u64, String>,
    /// The sink's `DataSink::metrics()`, read after the statement ended (`Ok` or not).
    pub metrics: MetricsSet,
}

impl Insert {
    /// The registered metric `name` (see [`names`]); a counter never touched reads 0.
    pub fn metric(&self, name: &str) -> usize {
        self.metrics
            .sum_by_name(name)
            .map(|v| v.as_usize())
            .unwrap_or(0)
    }

    /// The registered metric `name` of each writer (partition) that reported it, in partition
    /// order.
    pub fn metric_per_writer(&self, name: &str) -> Vec<usize> {
        let mut values: Vec<(usize, usize)> = self
            .metrics
            .iter()
            .filter(|m| m.value().name() == name)
            .filter_map(|m| Some((m.partition()?, m.value().as_usize())))
            .collect();
        values.sort_unstable();
        values.into_iter().map(|(_, v)| v).collect()
    }

    /// The `send_errors_by_code` counter of the status `code` (`"UNAVAILABLE"`).
    pub fn errors_with_code(&self, code: &str) -> usize {
        self.metrics
            .iter()
            .filter(|m| m.value().name() == names::SEND_ERRORS_BY_CODE)
            .filter(|m| {
                m.labels()
                    .iter()
                    .any(|l| l.name() == names::CODE_LABEL && l.value() == code)
            })
            .map(|m| m.value().as_usize())
            .sum()
    }

    /// The returned row count; panics with the error when the statement failed.
    pub fn count(&self) -> u64 {
        match &self.result {
            Ok(n) => *n,
            Err(e) => panic!("the INSERT failed: {e}"),
        }
    }

    /// The error text; panics when the statement succeeded.
    pub fn error(&self) -> &str {
        match &self.result {
            Ok(n) => panic!("the INSERT succeeded with count {n}, but an error was expected"),
            Err(e) => e,
        }
    }
}

/// The text of `EXPLAIN` of `sql`.
pub async fn explain(ctx: &SessionContext, sql: &str) -> String {
    let batches = ctx
        .sql(&format!("EXPLAIN {sql}"))
        .await
        .expect("explain")
        .collect()
        .await
        .expect("explain rows");
    arrow::util::pretty::pretty_format_batches(&batches)
        .expect("format")
        .to_string()
}

/// Plans and runs one `INSERT` (either SQL surface), keeping the physical plan so that the
/// sink's metrics can be read afterwards, whether the statement succeeded or failed.
pub async fn insert(ctx: &SessionContext, sql: &str) -> Insert {
    let df = match gcp_sql::sql::statement_to_dataframe(ctx, sql).await {
        Ok(df) => df,
        Err(e) => panic!("cannot plan the INSERT: {e}\n{sql}"),
    };
    let plan = df
        .create_physical_plan()
        .await
        .unwrap_or_else(|e| panic!("cannot build the physical plan: {e}\n{sql}"));
    let outcome = collect(plan.clone(), ctx.task_ctx()).await;
    let metrics = sink_metrics(&plan)
        .unwrap_or_else(|| panic!("the plan has no node with the sink's metrics\n{sql}"));
    let result = outcome.map_err(|e| e.to_string()).map(|batches| {
        let batch = batches.first().expect("an INSERT returns one row");
        batch.column(0).as_primitive::<UInt64Type>().value(0)
    });
    Insert { result, metrics }
}

/// The metrics of the plan node that carries the sink's inventory (the `SinkWriterExec`).
fn sink_metrics(plan: &Arc<dyn ExecutionPlan>) -> Option<MetricsSet> {
    if let Some(m) = plan.metrics()
        && m.sum_by_name(names::RECORDS_ACKED).is_some()
    {
        return Some(m);
    }
    plan.children().into_iter().find_map(sink_metrics)
}

/// Registers an in-memory object store at `url` (`memory://NAME`) holding one object, for the
/// options that read an object-store URL when a statement starts (`schema_location`).
pub async fn register_memory_object(ctx: &SessionContext, url: &str, path: &str, bytes: &[u8]) {
    let store = Arc::new(datafusion::object_store::memory::InMemory::new());
    datafusion::object_store::ObjectStoreExt::put(
        store.as_ref(),
        &datafusion::object_store::path::Path::from(path),
        bytes.to_vec().into(),
    )
    .await
    .expect("put the object");
    ctx.runtime_env()
        .register_object_store(&url::Url::parse(url).expect("a store URL"), store);
}

/// Registers a Pub/Sub sink table built through the Rust API, for a schema SQL cannot declare
/// (a `MAP` column, `Float16`, durations, ...). Options are the same `(name, value)` pairs the
/// SQL forms take.
pub fn register_pubsub_table(
    ctx: &SessionContext,
    name: &str,
    schema: SchemaRef,
    options: &[(&str, &str)],
) {
    let raw = RawOptions::from_pairs(options.iter().map(|(k, v)| (k.to_string(), v.to_string())))
        .expect("option pairs");
    let sink =
        gcp_sql::connectors::build_sink(gcp_sql::connectors::pubsub::KIND, schema, None, &raw)
            .unwrap_or_else(|e| panic!("cannot build the sink of '{name}': {e}"));
    ctx.register_table(name, Arc::new(SinkTable::new(name, sink)))
        .expect("register the sink table");
}

/// How long a pull loop waits for messages the statement reported as delivered; reached only
/// when something is broken.
pub const DELIVERY_BOUND: Duration = Duration::from_secs(90);

/// The emulator's admin side, through the generated `gcloud-sdk` clients.
#[derive(Clone)]
pub struct PubSubAdmin {
    /// The emulator address, for `emulator_host`.
    pub host: String,
    publisher: PublisherClient<Channel>,
    subscriber: SubscriberClient<Channel>,
}

impl PubSubAdmin {
    /// Connects to the emulator shared by this test binary (started on first use).
    pub async fn connect() -> Self {
        let emulator = gcp_sql::emulators::shared(gcp_sql::emulators::EmulatorKind::PubSub).await;
        let host = emulator.host().to_string();
        let channel = gcp_sql::emulators::plaintext_channel(&host)
            .await
            .expect("channel to the Pub/Sub emulator");
        PubSubAdmin {
            host,
            publisher: PublisherClient::new(channel.clone()),
            subscriber: SubscriberClient::new(channel),
        }
    }

    /// Creates the topic `name` (a full name).
    pub async fn create_topic(&self, name: &str) {
        self.publisher
            .clone()
            .create_topic(Topic {
                name: name.to_string(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|s| panic!("CreateTopic {name}: {s}"));
    }

    /// Whether the topic exists (`GetTopic` answers rather than `NOT_FOUND`).
    pub async fn topic_exists(&self, name: &str) -> bool {
        match self
            .publisher
            .clone()
            .get_topic(GetTopicRequest {
                topic: name.to_string(),
            })
            .await
        {
            Ok(_) => true,
            Err(s) if s.code() == tonic::Code::NotFound => false,
            Err(s) => panic!("GetTopic {name}: {s}"),
        }
    }

    /// Creates a subscription to `topic`; it only sees messages published after this returns.
    pub async fn create_subscription(&self, name: &str, topic: &str, ordered: bool) {
        self.subscriber
            .clone()
            .create_subscription(Subscription {
                name: name.to_string(),
                topic: topic.to_string(),
                // Long enough that nothing is redelivered while a test reads.
                ack_deadline_seconds: 600,
                enable_message_ordering: ordered,
                ..Default::default()
            })
            .await
            .unwrap_or_else(|s| panic!("CreateSubscription {name}: {s}"));
    }

    /// A topic with a fresh subscription; returns `(topic, subscription)` full names.
    pub async fn topic_with_subscription(
        &self,
        project: &str,
        prefix: &str,
        ordered: bool,
    ) -> (String, String) {
        let id = unique(prefix);
        let topic = format!("projects/{project}/topics/{id}");
        let subscription = format!("projects/{project}/subscriptions/{id}-sub");
        self.create_topic(&topic).await;
        self.create_subscription(&subscription, &topic, ordered)
            .await;
        (topic, subscription)
    }

    /// Pulls (and acknowledges) until `expected` distinct messages have arrived, then pulls
    /// once more to catch any extra. Messages come back in delivery order; a redelivery of a
    /// message already seen (same `message_id`) is left out. Panics past [`DELIVERY_BOUND`]
    /// with what arrived so far.
    pub async fn pull_all(&self, subscription: &str, expected: usize) -> Vec<PubsubMessage> {
        let mut subscriber = self.subscriber.clone();
        let mut seen: HashSet<String> = HashSet::new();
        let mut out = Vec::with_capacity(expected);
        let deadline = tokio::time::Instant::now() + DELIVERY_BOUND;
        let mut settle_pulls = 0;
        loop {
            #[allow(deprecated)] // return_immediately: the emulator honours it; polling is ours.
            let request = PullRequest {
                subscription: subscription.to_string(),
                max_messages: 1000,
                return_immediately: true,
            };
            let pulled = subscriber
                .pull(request)
                .await
                .unwrap_or_else(|s| panic!("Pull {subscription}: {s}"))
                .into_inner();
            let ack_ids: Vec<String> = pulled
                .received_messages
                .iter()
                .map(|m| m.ack_id.clone())
                .collect();
            let empty = ack_ids.is_empty();
            for received in pulled.received_messages {
                let message = received.message.expect("a pulled message has a body");
                if seen.insert(message.message_id.clone()) {
                    out.push(message);
                }
            }
            if !empty {
                subscriber
                    .acknowledge(AcknowledgeRequest {
                        subscription: subscription.to_string(),
                        ack_ids,
                    })
                    .await
                    .unwrap_or_else(|s| panic!("Acknowledge {subscription}: {s}"));
            }
            if out.len() >= expected {
                // A few empty pulls in a row after the last expected message: nothing more is
                // on its way (a duplicate publish would have been delivered by now).
                if empty {
                    settle_pulls += 1;
                    if settle_pulls >= 3 {
                        return out;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                } else {
                    settle_pulls = 0;
                }
                continue;
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "only {} of {expected} messages arrived on {subscription} within {DELIVERY_BOUND:?}",
                    out.len()
                );
            }
            if empty {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// The messages' data parsed as JSON objects.
pub fn json_payloads(messages: &[PubsubMessage]) -> Vec<serde_json::Value> {
    messages
        .iter()
        .map(|m| {
            serde_json::from_slice(&m.data).unwrap_or_else(|e| {
                panic!(
                    "message data is not JSON ({e}): {}",
                    String::from_utf8_lossy(&m.data)
                )
            })
        })
        .collect()
}

/// Asserts that the messages are `order` (the ids in the order the input had them), each once,
/// and that each ordering key `key-K` of `keys` received its ids (those `v` with
/// `v % keys == K`) in that order. The ids are the JSON payloads' `id` fields.
pub fn assert_each_key_once_in_order(messages: &[PubsubMessage], order: &[i64], keys: i64) {
    let mut per_key: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (message, payload) in messages.iter().zip(json_payloads(messages)) {
        per_key
            .entry(message.ordering_key.clone())
            .or_default()
            .push(payload["id"].as_i64().expect("id"));
    }
    assert_eq!(messages.len(), order.len(), "messages read back");
    assert_eq!(per_key.len(), keys as usize, "ordering keys");
    for (key, delivered) in per_key {
        let k: i64 = key.trim_start_matches("key-").parse().expect("key number");
        let expected: Vec<i64> = order.iter().copied().filter(|v| v % keys == k).collect();
        assert_eq!(delivered.len(), expected.len(), "messages of {key}");
        assert!(delivered == expected, "{key} delivered out of order");
    }
}

/// The integer field `field` of every JSON payload.
pub fn ids(messages: &[PubsubMessage], field: &str) -> Vec<i64> {
    json_payloads(messages)
        .iter()
        .map(|v| {
            v.get(field)
                .and_then(serde_json::Value::as_i64)
                .unwrap_or_else(|| panic!("payload {v} has no integer '{field}'"))
        })
        .collect()
}

/// Counts how often each value occurs.
pub fn multiplicities<T: std::hash::Hash + Eq + Clone>(values: &[T]) -> HashMap<T, usize> {
    let mut out = HashMap::new();
    for v in values {
        *out.entry(v.clone()).or_insert(0) += 1;
    }
    out
}

/// The `gcp-sql` binary this test build made.
#[cfg(feature = "cli")]
pub const TOOL: &str = env!("CARGO_BIN_EXE_gcp-sql");

/// A command for the tool, run from the repository root with a private `HOME` (the shell's
/// history goes there), no emulator variable, `NO_COLOR` or `RUST_LOG` inherited from the
/// caller, and no input.
#[cfg(feature = "cli")]
pub fn tool(home: &std::path::Path) -> std::process::Command {
    let mut command = std::process::Command::new(TOOL);
    // The tool's home is a fresh folder: keep the cache of this process (where a missing Cloud
    // Tasks emulator was installed once) rather than install it again under every home.
    if let Some(cache) = gcp_sql::emulators::cache_dir(|var| std::env::var_os(var)) {
        command.env(gcp_sql::emulators::CACHE_DIR_VAR, cache);
    }
    command
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("HOME", home)
        .env_remove("PUBSUB_EMULATOR_HOST")
        .env_remove("BIGTABLE_EMULATOR_HOST")
        .env_remove("CLOUD_TASKS_EMULATOR_HOST")
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null());
    command
}

/// Runs `command` to its end.
#[cfg(feature = "cli")]
pub fn output(command: &mut std::process::Command) -> std::process::Output {
    command.output().expect("the gcp-sql binary runs")
}

/// Output bytes as text.
#[cfg(feature = "cli")]
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
