//! The source's execution plan node: one partition per StreamingPull stream, unbounded,
//! emitting a batch whenever messages are ready.
//!
//! A partition emits at most `datafusion.execution.batch_size` rows a batch, from what has
//! arrived: it never waits to fill a batch. Before it waits for the next batch it seals the
//! previous one ([`Ticket::seal`](crate::core::delivery::ticket::Ticket::seal)); the ticket of the batch it emits is put in its
//! [`SourceSlot`] first.
//!
//! Stopping ([`SourceHandle::stop`], with the statement's [`StopKind`]):
//! - drain (also what `stop_after_idle` does to one partition): the stream stops reading;
//!   the messages already received are emitted, the last batch is sealed at the end of the
//!   stream, and the partition ends;
//! - abort: the partition ends at once; nothing more is acknowledged or nacked (the service
//!   delivers the held messages again once their lease lapses).
//!
//! A partition dropped before its end (the query was cancelled, a `LIMIT` was reached, another
//! operator failed) does not seal its last batch: the messages it holds are nacked.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::compute::{cast, kernels::aggregate::max};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::datatypes::{DataType, TimeUnit, TimestampNanosecondType};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::FutureExt as _;
use futures::future::BoxFuture;
use gcloud_sdk::google::pubsub::v1::ReceivedMessage;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;

use super::acks::{AckClient, settler_config};
use super::decode::{BadMessage, MessageDecoder};
use super::options::{PayloadSource, PubSubSourceOptions};
use super::pull::{Pulled, Puller, Received};
use super::revisions::Revisions;
use super::{AckId, AckQueue, BatchTicket, SourceSlot};
use crate::connectors::dead_letter::{self, DeadLetterContext};
use crate::connectors::pubsub::client::{ClientSettings, PubSubTransport, open_channel};
use crate::core::dead_letter::{DeadClass, DeadLetterSink, DeadPayload, DeadRow};
use crate::core::delivery::lease::Outstanding;
use crate::core::delivery::settler::run_settler;
use crate::core::delivery::{
    DeliveryCounters, DeliveryCounts, DeliveryHandle, DeliveryInput, EventClock, Held,
    InputIdentity,
};
use crate::core::{FailurePolicy, StopKind};
use crate::error::Error;
use crate::plan::node::{name_and_properties, no_expressions};

/// What every partition of one scan shares: the options and the decoder.
#[derive(Debug)]
pub struct SourceConfig {
    /// The table's name, for dead letters and logs (empty when built without SQL).
    pub table: String,
    /// The source options.
    pub options: PubSubSourceOptions,
    /// The decoder, checked against the table schema.
    pub decoder: MessageDecoder,
}

#[derive(Debug)]
struct HandleInner {
    /// `None` while the scan runs.
    stop: watch::Sender<Option<StopKind>>,
    aborted: Arc<AtomicBool>,
    slots: Vec<Arc<SourceSlot>>,
    /// Per partition: a writer fed by it made a flush point (its dead-letter object is due).
    rolls: Vec<Arc<Notify>>,
    counters: Arc<DeliveryCounters>,
    settlers: Mutex<Vec<JoinHandle<()>>>,
    /// Messages a consumer may hold until windows close ([`DeliveryInput::expect_held`]):
    /// the streams ask the service for as many more.
    held_capacity: std::sync::atomic::AtomicU64,
    /// No partition stops for `stop_after_idle` before this ([`DeliveryInput::read_until`]).
    read_until: Arc<Mutex<Option<std::time::Instant>>>,
    /// Each partition's event-time clock (with an event-time column).
    clocks: Vec<Arc<EventClock>>,
    /// What each started partition holds (the backlog age, the held gauges).
    outstanding: Mutex<Vec<Arc<Outstanding<AckId>>>>,
    /// `start_at`: `None` until the first partition applied it (or found it recorded); then
    /// whether that succeeded. Every partition waits for it before it opens its stream.
    replay: tokio::sync::Mutex<Option<bool>>,
}

/// The control side of one source scan: stop it, read its counts, find its partitions'
/// handoff slots, and wait until every acknowledgement it decided was sent.
#[derive(Debug, Clone)]
pub struct SourceHandle {
    inner: Arc<HandleInner>,
}

impl SourceHandle {
    fn new(partitions: usize) -> Self {
        SourceHandle {
            inner: Arc::new(HandleInner {
                stop: watch::Sender::new(None),
                aborted: Arc::new(AtomicBool::new(false)),
                slots: (0..partitions)
                    .map(|_| Arc::new(SourceSlot::default()))
                    .collect(),
                rolls: (0..partitions).map(|_| Arc::new(Notify::new())).collect(),
                counters: Arc::new(DeliveryCounters::default()),
                settlers: Mutex::new(Vec::new()),
                held_capacity: std::sync::atomic::AtomicU64::new(0),
                read_until: Arc::default(),
                clocks: (0..partitions)
                    .map(|_| Arc::new(EventClock::default()))
                    .collect(),
                outstanding: Mutex::new(Vec::new()),
                replay: tokio::sync::Mutex::new(None),
            }),
        }
    }

    /// The handoff slot of every partition, by partition number.
    pub fn slots(&self) -> &[Arc<SourceSlot>] {
        &self.inner.slots
    }

    /// Stops the scan, as the statement's [`StopKind`] asks: [`StopKind::Drain`] and
    /// [`StopKind::Settle`] stop reading and end each partition once what it read is emitted;
    /// [`StopKind::Abort`] ends the partitions at once and acknowledges or nacks nothing more.
    /// A later request may only raise the level (an abort after a drain still aborts).
    pub fn stop(&self, kind: StopKind) {
        if kind == StopKind::Abort {
            self.inner.aborted.store(true, Ordering::SeqCst);
        }
        self.inner.stop.send_if_modified(|current| {
            let upgrade = *current < Some(kind);
            if upgrade {
                *current = Some(kind);
            }
            upgrade
        });
    }

    /// What the scan did so far, with the age of the oldest message it holds unacknowledged.
    pub fn counts(&self) -> DeliveryCounts {
        let held = self
            .inner
            .outstanding
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        DeliveryCounts {
            oldest_unacked: crate::core::delivery::oldest_unacked(held.iter().map(Arc::as_ref)),
            ..self.inner.counters.snapshot()
        }
    }

    /// What the scan's partitions hold now, and how many of its streams are connected.
    pub fn held(&self) -> Held {
        let sets = self
            .inner
            .outstanding
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let counters = &self.inner.counters;
        Held {
            messages: sets.iter().map(|o| o.len() as u64).sum(),
            bytes: sets.iter().map(|o| o.bytes()).sum(),
            oldest: sets.iter().filter_map(|o| o.oldest_age()).max(),
            streams: counters.streams.load(Ordering::Acquire),
            streams_connected: counters.streams_connected.load(Ordering::Acquire),
        }
    }

    /// Waits until the settler of every started partition ended: every acknowledgement and nack
    /// decided so far was sent. A settler ends once its partition stream and every ticket of
    /// its batches are gone, so call this after the query finished and its consumers dropped
    /// their tickets.
    pub async fn settled(&self) {
        loop {
            let next = self
                .inner
                .settlers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop();
            match next {
                Some(task) => {
                    let _ = task.await;
                }
                None => return,
            }
        }
    }
}

/// One partition of a scan as a writer sees it ([`crate::core::delivery`]): the ticket of the
/// batch it emitted last, the scan's stop and counts.
#[derive(Debug)]
struct ScanSlot {
    handle: SourceHandle,
    partition: usize,
    subscription: String,
    table: String,
}

impl DeliveryInput for ScanSlot {
    fn current(&self) -> Option<Arc<dyn DeliveryHandle>> {
        let ticket = self.handle.inner.slots.get(self.partition)?.current()?;
        Some(ticket)
    }

    fn stop_reading(&self) {
        self.handle.stop(StopKind::Drain);
    }

    fn counts(&self) -> DeliveryCounts {
        self.handle.counts()
    }

    fn settled(&self) -> BoxFuture<'static, ()> {
        let handle = self.handle.clone();
        Box::pin(async move { handle.settled().await })
    }

    fn describe(&self) -> String {
        format!("subscription {}", self.subscription)
    }

    fn clock(&self) -> Option<Arc<EventClock>> {
        self.handle.inner.clocks.get(self.partition).cloned()
    }

    fn expect_held(&self, messages: u64) {
        self.handle
            .inner
            .held_capacity
            .fetch_max(messages, Ordering::SeqCst);
    }

    fn read_until(&self, until: std::time::Instant) {
        let mut at = self
            .handle
            .inner
            .read_until
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *at = Some(at.map_or(until, |a| a.max(until)));
    }

    fn flush_point(&self) {
        if let Some(roll) = self.handle.inner.rolls.get(self.partition) {
            // A stored permit: the partition completes its dead-letter object when next polled,
            // or at once if it is waiting for messages.
            roll.notify_one();
        }
    }

    fn identity(&self) -> InputIdentity {
        InputIdentity {
            connector: crate::connectors::pubsub::KIND.name(),
            table: self.table.clone(),
            resource: self.subscription.clone(),
        }
    }

    fn held(&self) -> Held {
        self.handle.held()
    }
}

/// The source node: `parallel_pull_count` partitions, unbounded, incremental.
#[derive(Debug)]
pub struct PubSubSourceExec {
    config: Arc<SourceConfig>,
    projection: Option<Vec<usize>>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    handle: SourceHandle,
}

impl PubSubSourceExec {
    /// A scan of `config`'s subscription emitting the columns `projection` picks (all when
    /// `None`).
    pub fn try_new(config: Arc<SourceConfig>, projection: Option<Vec<usize>>) -> DFResult<Self> {
        let full = config.decoder.schema().clone();
        let schema = match &projection {
            Some(p) => Arc::new(full.project(p)?),
            None => full,
        };
        let partitions = config.options.parallel_pull_count.max(1);
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Incremental,
            Boundedness::Unbounded {
                requires_infinite_memory: false,
            },
        );
        Ok(PubSubSourceExec {
            config,
            projection,
            schema,
            properties: Arc::new(properties),
            handle: SourceHandle::new(partitions),
        })
    }

    /// The scan's control handle.
    pub fn handle(&self) -> &SourceHandle {
        &self.handle
    }

    /// The delivery input of `partition` (see [`crate::core::delivery`]); `None` out of range.
    pub fn origin_slot(&self, partition: usize) -> Option<Arc<dyn DeliveryInput>> {
        (partition < self.handle.inner.slots.len()).then(|| {
            Arc::new(ScanSlot {
                handle: self.handle.clone(),
                partition,
                subscription: self.config.options.subscription.clone(),
                table: self.config.table.clone(),
            }) as Arc<dyn DeliveryInput>
        })
    }

    /// What every partition of the scan shares.
    pub fn config(&self) -> &Arc<SourceConfig> {
        &self.config
    }

    /// The subscription read.
    pub fn subscription(&self) -> &str {
        &self.config.options.subscription
    }
}

impl DisplayAs for PubSubSourceExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PubSubSourceExec: subscription={}, streams={}",
            self.config.options.subscription, self.config.options.parallel_pull_count
        )
    }
}

impl ExecutionPlan for PubSubSourceExec {
    name_and_properties!("PubSubSourceExec");

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    no_expressions!();

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal(
                "PubSubSourceExec has no children".into(),
            ))
        }
    }

    fn metrics(&self) -> Option<MetricsSet> {
        use crate::core::metrics::names;
        let c = self.handle.counts();
        let set = ExecutionPlanMetricsSet::new();
        for (name, value) in [
            (names::SOURCE_MESSAGES_READ, c.messages_read),
            (names::SOURCE_MESSAGES_ACKED, c.messages_acked),
            (names::SOURCE_MESSAGES_NACKED, c.messages_nacked),
            (
                names::SOURCE_MESSAGES_ACK_CONFIRMED,
                c.messages_ack_confirmed,
            ),
            (names::SOURCE_MESSAGES_ACK_REFUSED, c.messages_ack_refused),
        ] {
            MetricBuilder::new(&set)
                .global_counter(name)
                .add(usize::try_from(value).unwrap_or(usize::MAX));
        }
        let oldest_ms = c.oldest_unacked.map_or(0, |age| age.as_millis());
        MetricBuilder::new(&set)
            .global_gauge(names::SOURCE_OLDEST_UNACKED_MS)
            .set(usize::try_from(oldest_ms).unwrap_or(usize::MAX));
        Some(set.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        let Some(slot) = self.handle.inner.slots.get(partition).cloned() else {
            return Err(DataFusionError::Internal(format!(
                "PubSubSourceExec has {} partition(s), asked for {partition}",
                self.handle.inner.slots.len()
            )));
        };
        let start = Start {
            config: self.config.clone(),
            projection: self.projection.clone(),
            handle: self.handle.clone(),
            slot,
            partition,
            batch_size: context.session_config().batch_size().max(1),
            runtime: context.runtime_env(),
        };
        let stream = futures::stream::unfold(Step::Start(Box::new(start)), |step| async move {
            let mut reader = match step {
                Step::Start(start) => match start.open().await {
                    Ok(reader) => Box::new(reader),
                    Err(e) => return Some((Err(e.into()), Step::Done)),
                },
                Step::Run(reader) => reader,
                Step::Done => return None,
            };
            reader.next().await.map(|item| (item, Step::Run(reader)))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            stream,
        )))
    }
}

enum Step {
    Start(Box<Start>),
    Run(Box<PartitionReader>),
    Done,
}

struct Start {
    config: Arc<SourceConfig>,
    projection: Option<Vec<usize>>,
    handle: SourceHandle,
    slot: Arc<SourceSlot>,
    partition: usize,
    batch_size: usize,
    runtime: Arc<datafusion::execution::runtime_env::RuntimeEnv>,
}

impl Start {
    /// The decoder of this scan: the table's, or, when the schema is only known now, the
    /// table's bound to it: an object-store `schema_location`, read here, or (no `format`
    /// option) the Pub/Sub schema of the subscription's topic, looked up here (ADR 0053); with
    /// it, for a topic's schema, the readers of its other revisions (ADR 0062).
    async fn decoder(&self) -> crate::Result<(Arc<MessageDecoder>, Option<TopicRevisions>)> {
        let opts = &self.config.options;
        let table = &self.config.decoder;
        let schema = match &opts.schema {
            PayloadSource::Location(at) => Some(at.read(Some(&self.runtime)).await?),
            PayloadSource::Topic => {
                let transport = PubSubTransport::connect(&ClientSettings {
                    endpoint: opts.connection.endpoint.clone(),
                    emulator_host: opts.connection.emulator.as_ref().map(|e| e.host.clone()),
                    credentials_file: opts.connection.credentials_file.clone(),
                    auto_create_topic: false,
                })
                .await?;
                let Some(topic) = transport.subscription_schema(&opts.subscription).await? else {
                    return Ok((Arc::new(table.clone()), None));
                };
                let decoder = Arc::new(table.with_schema(&topic.schema)?);
                let revisions = TopicRevisions {
                    revisions: Revisions::new(topic.name.clone(), topic.revision_id),
                    encoding: topic.schema.encoding,
                    transport,
                    name: topic.name,
                    user: format!("subscription '{}'", opts.subscription),
                };
                return Ok((decoder, Some(revisions)));
            }
            PayloadSource::Format | PayloadSource::Schema(_) => None,
        };
        if let Some(schema) = schema {
            return Ok((Arc::new(table.with_schema(&schema)?), None));
        }
        Ok((Arc::new(table.clone()), None))
    }

    async fn open(self) -> crate::Result<PartitionReader> {
        let opts = &self.config.options;
        let (channel, _, reach) = open_channel(
            opts.connection.emulator.as_ref().map(|e| e.host.clone()),
            opts.connection.endpoint.as_deref(),
            opts.connection.credentials_file.as_deref(),
        )
        .await?;
        let inner = &self.handle.inner;
        if let Some(replay) = &opts.start_at {
            // Once per scan, before any partition opens its stream (ADR 0072).
            let mut done = inner.replay.lock().await;
            match *done {
                Some(true) => {}
                Some(false) => {
                    return Err(Error::Unsupported(format!(
                        "subscription '{}': the seek of start_at failed in another partition",
                        opts.subscription
                    )));
                }
                None => {
                    let applied = super::replay::apply(
                        replay,
                        &opts.subscription,
                        &channel,
                        &reach,
                        &self.runtime,
                    )
                    .await;
                    *done = Some(applied.is_ok());
                    applied?;
                }
            }
        }
        let (decoder, revisions) = self.decoder().await?;
        let outstanding = Arc::new(Outstanding::new(
            opts.max_outstanding_messages,
            opts.max_outstanding_bytes,
        ));
        inner
            .outstanding
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(outstanding.clone());
        let (queue, acks) = AckQueue::new(inner.aborted.clone());
        let exactly_once = super::acks::ExactlyOnce::default();
        let settler = tokio::spawn(run_settler(
            Arc::new(
                AckClient::new(
                    channel.clone(),
                    opts.subscription.clone(),
                    opts.stream_ack_deadline,
                )
                .with_exactly_once(exactly_once.clone()),
            ),
            settler_config(
                opts.max_lease_duration,
                opts.stream_ack_deadline,
                opts.max_outstanding_messages,
            ),
            acks,
            outstanding.clone(),
            inner.counters.clone(),
        ));
        inner
            .settlers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(settler);
        let (pull_tx, pull_rx) = mpsc::unbounded_channel();
        let (idle_tx, idle_rx) = watch::channel(false);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let puller = Puller {
            channel,
            reach,
            subscription: opts.subscription.clone(),
            client_id: format!(
                "gcp-sql-{}-{nanos:x}-{}",
                std::process::id(),
                self.partition
            ),
            max_outstanding_messages: opts.max_outstanding_messages,
            max_outstanding_bytes: opts.max_outstanding_bytes,
            held_capacity: inner.held_capacity.load(Ordering::SeqCst),
            ack_deadline: opts.stream_ack_deadline,
            returns: queue.clone(),
            exactly_once,
        };
        tokio::spawn(puller.run(
            pull_tx,
            outstanding,
            inner.counters.clone(),
            inner.stop.subscribe(),
            idle_rx,
        ));
        let statement = format!(
            "source-{}-{}",
            opts.subscription.rsplit('/').next().unwrap_or_default(),
            nanos / 1_000_000
        );
        Ok(PartitionReader {
            stop: inner.stop.subscribe(),
            decoder,
            revisions,
            config: self.config,
            projection: self.projection,
            counters: inner.counters.clone(),
            slot: self.slot,
            partition: self.partition,
            batch_size: self.batch_size,
            runtime: self.runtime,
            queue,
            pulled: pull_rx,
            pending: VecDeque::new(),
            failure: None,
            idle: idle_tx,
            idle_sent: false,
            last: None,
            dead_letter: None,
            held_for_dead_letter: Vec::new(),
            held_since: None,
            read_until: inner.read_until.clone(),
            roll: inner.rolls[self.partition].clone(),
            statement,
            finished: false,
            clocks: inner.clocks.clone(),
        })
    }
}

/// The revisions of a topic's schema one partition has met, and how to fetch more.
struct TopicRevisions {
    revisions: Revisions,
    transport: PubSubTransport,
    /// The topic's encoding when the scan started (a message's stamped encoding wins).
    encoding: crate::encode::schema::SchemaEncoding,
    /// The schema's name, `projects/P/schemas/S`.
    name: String,
    /// What the schema is read for, in errors: `subscription '...'`.
    user: String,
}

/// One running partition.
struct PartitionReader {
    config: Arc<SourceConfig>,
    /// No stop for `stop_after_idle` before this (a consumer's recovery hold).
    read_until: Arc<Mutex<Option<std::time::Instant>>>,
    /// The decoder of this scan (the table's, or bound to a schema read when it started).
    decoder: Arc<MessageDecoder>,
    /// For a topic's schema: the readers of the other revisions its messages were published
    /// with.
    revisions: Option<TopicRevisions>,
    projection: Option<Vec<usize>>,
    counters: Arc<DeliveryCounters>,
    slot: Arc<SourceSlot>,
    partition: usize,
    batch_size: usize,
    runtime: Arc<datafusion::execution::runtime_env::RuntimeEnv>,
    queue: AckQueue,
    pulled: mpsc::UnboundedReceiver<Pulled>,
    pending: VecDeque<Received>,
    failure: Option<Error>,
    stop: watch::Receiver<Option<StopKind>>,
    idle: watch::Sender<bool>,
    idle_sent: bool,
    last: Option<Arc<BatchTicket>>,
    dead_letter: Option<Arc<dyn DeadLetterSink>>,
    /// Ack ids of messages dead-lettered to an object (a path): stored only once the object is
    /// completed (at a writer's flush point, on [`roll_bound`], or at the end of the
    /// partition), so acknowledged then (ADR 0071).
    held_for_dead_letter: Vec<AckId>,
    /// When the oldest of `held_for_dead_letter` was held.
    held_since: Option<tokio::time::Instant>,
    /// Signalled at each flush point of a writer this partition feeds.
    roll: Arc<Notify>,
    statement: String,
    finished: bool,
    /// Every partition's event-time clock (this one's is at `partition`).
    clocks: Vec<Arc<EventClock>>,
}

enum Wait {
    Pulled(Option<Pulled>),
    Idle,
    Abort,
    Roll,
}

/// How long a partition holds the messages it dead-lettered to an object when no flush point
/// completes the object first: half of `max_lease_duration`, so that they are acknowledged
/// before their lease lapses even in a statement without flush points (a plain `SELECT`).
pub fn roll_bound(max_lease: Duration) -> Duration {
    max_lease / 2
}

/// Waits until `at`, or forever when `None`.
async fn sleep_until_or_never(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl PartitionReader {
    async fn next(&mut self) -> Option<DFResult<RecordBatch>> {
        if let Some(t) = self.last.take() {
            t.seal();
        }
        loop {
            if self.finished {
                return None;
            }
            let flushed = self.roll.notified().now_or_never().is_some();
            let due = self
                .roll_at()
                .is_some_and(|at| at <= tokio::time::Instant::now());
            if (flushed || due)
                && let Err(e) = self.roll_dead_letters().await
            {
                return Some(Err(self.fail(e)));
            }
            if self.pending.is_empty() {
                if let Some(e) = self.failure.take() {
                    return Some(Err(self.fail(e)));
                }
                let idle_after = self
                    .config
                    .options
                    .stop_after_idle
                    .filter(|_| !self.idle_sent);
                let holding = !self.held_for_dead_letter.is_empty();
                let roll_at = self.roll_at();
                // Idle once nothing came for `stop_after_idle`, counted from the end of a
                // consumer's recovery hold if that is later (the consumer emits what the hold
                // kept back then, and the stream stays for it).
                let idle_at = idle_after.map(|idle| {
                    let at = std::time::Instant::now() + idle;
                    let at = match *self.read_until.lock().unwrap_or_else(|e| e.into_inner()) {
                        Some(until) => at.max(until + idle),
                        None => at,
                    };
                    tokio::time::Instant::from_std(at)
                });
                let wait = tokio::select! {
                    p = self.pulled.recv() => Wait::Pulled(p),
                    _ = sleep_until_or_never(idle_at) => Wait::Idle,
                    _ = abort_signal(&mut self.stop) => Wait::Abort,
                    _ = self.roll.notified(), if holding => Wait::Roll,
                    _ = sleep_until_or_never(roll_at) => Wait::Roll,
                };
                match wait {
                    Wait::Roll => {
                        if let Err(e) = self.roll_dead_letters().await {
                            return Some(Err(self.fail(e)));
                        }
                        continue;
                    }
                    Wait::Abort => {
                        self.finished = true;
                        self.slot.clear();
                        return None;
                    }
                    Wait::Idle => {
                        tracing::info!(
                            subscription = %self.config.options.subscription,
                            partition = self.partition,
                            "no message for stop_after_idle ({:?}): the stream stops reading",
                            idle_after.unwrap_or_default()
                        );
                        self.idle_sent = true;
                        let _ = self.idle.send(true);
                        continue;
                    }
                    Wait::Pulled(None) => return self.finish().await,
                    Wait::Pulled(Some(Pulled::Failed(e))) => {
                        return Some(Err(self.fail(e)));
                    }
                    Wait::Pulled(Some(Pulled::Messages(m))) => self.pending.extend(m),
                }
            }
            // Take what else has arrived, without waiting.
            while self.pending.len() < self.batch_size && self.failure.is_none() {
                match self.pulled.try_recv() {
                    Ok(Pulled::Messages(m)) => self.pending.extend(m),
                    Ok(Pulled::Failed(e)) => self.failure = Some(e),
                    Err(_) => break,
                }
            }
            let take = self.pending.len().min(self.batch_size);
            let (ids, messages): (Vec<AckId>, Vec<ReceivedMessage>) = self
                .pending
                .drain(..take)
                .map(|m| (m.id, m.message))
                .unzip();
            match self.make_batch(ids, messages).await {
                Ok(Some(batch)) => return Some(Ok(batch)),
                Ok(None) => continue,
                Err(e) => return Some(Err(self.fail(e))),
            }
        }
    }

    /// Ends the partition with `e`: what it holds is nacked (the ticket drops do that).
    fn fail(&mut self, e: Error) -> DataFusionError {
        self.finished = true;
        self.slot.clear();
        self.release_unemitted();
        e.into()
    }

    fn release_unemitted(&mut self) {
        let mut ids: Vec<AckId> = self.pending.drain(..).map(|m| m.id).collect();
        while let Ok(p) = self.pulled.try_recv() {
            if let Pulled::Messages(m) = p {
                ids.extend(m.into_iter().map(|m| m.id));
            }
        }
        ids.append(&mut self.held_for_dead_letter);
        self.queue.nack(ids);
    }

    async fn finish(&mut self) -> Option<DFResult<RecordBatch>> {
        self.finished = true;
        self.slot.clear();
        if let Some(sink) = self.dead_letter.take() {
            if let Err(e) = sink.finish().await {
                self.release_unemitted();
                return Some(Err(e.into()));
            }
            self.queue
                .ack(std::mem::take(&mut self.held_for_dead_letter));
        }
        None
    }

    /// When the messages held for the dead-letter object are due to be stored without a flush
    /// point ([`roll_bound`]); `None` when none are held.
    fn roll_at(&self) -> Option<tokio::time::Instant> {
        self.held_since
            .map(|since| since + roll_bound(self.config.options.max_lease_duration))
    }

    /// Completes the dead-letter object written so far and acknowledges the messages it holds;
    /// when completing it fails, they are nacked (the caller fails the partition). Nothing to
    /// do when no message is held.
    async fn roll_dead_letters(&mut self) -> crate::Result<()> {
        if self.held_for_dead_letter.is_empty() {
            return Ok(());
        }
        let Some(sink) = self.dead_letter.clone() else {
            return Ok(());
        };
        let held = std::mem::take(&mut self.held_for_dead_letter);
        self.held_since = None;
        match sink.roll().await {
            Ok(()) => {
                self.queue.ack(held);
                Ok(())
            }
            Err(e) => {
                self.queue.nack(held);
                Err(e)
            }
        }
    }

    async fn dead_letter_sink(&mut self) -> crate::Result<Arc<dyn DeadLetterSink>> {
        if let Some(s) = &self.dead_letter {
            return Ok(s.clone());
        }
        let Some(target) = &self.config.options.dead_letter else {
            return Err(Error::Unsupported(
                "internal: dead_letter policy without a target".into(),
            ));
        };
        let sink = dead_letter::open(
            target,
            DeadLetterContext {
                connector: super::super::KIND,
                table: self.config.table.clone(),
                statement: self.statement.clone(),
                writer: self.partition,
                runtime: Some(self.runtime.clone()),
            },
        )
        .await?;
        self.dead_letter = Some(sink.clone());
        Ok(sink)
    }

    /// Decodes `messages` into the next batch and its ticket. `Ok(None)` when no row is left
    /// (every message dropped or dead-lettered: their ticket is settled at once).
    async fn make_batch(
        &mut self,
        ids: Vec<AckId>,
        messages: Vec<ReceivedMessage>,
    ) -> crate::Result<Option<RecordBatch>> {
        let decoded = match &mut self.revisions {
            Some(topic) => {
                let TopicRevisions {
                    revisions,
                    transport,
                    encoding,
                    name,
                    user,
                } = topic;
                let (transport, name, user, encoding) = (&*transport, &*name, &*user, *encoding);
                let prepared = revisions
                    .prepare(&messages, &self.decoder, |revision| async move {
                        let read = transport.schema_revision(name, &revision, encoding, user);
                        Ok(read.await?.0)
                    })
                    .await;
                prepared.and_then(|()| self.decoder.decode_with(&messages, |m| revisions.reader(m)))
            }
            None => self.decoder.decode(&messages),
        };
        let decoded = match decoded {
            Ok(d) => d,
            Err(e) => {
                self.queue.nack(ids);
                return Err(e);
            }
        };
        // The rows' messages first, in row order, then the ones that became no row (the ticket's
        // layout: a node may release a row's message on its own).
        let mut ack_ids: Vec<AckId> = Vec::with_capacity(messages.len());
        // The rows' message ids, for a consumer that must recognise a message an earlier run
        // saw (windows: a row found late, ADR 0068).
        let mut row_keys: Vec<String> = Vec::with_capacity(messages.len());
        let mut handled_ids: Vec<AckId> = Vec::new();
        let mut bad = decoded.bad.iter().peekable();
        let policy = self.config.options.failure_policy;
        let mut outcome: crate::Result<()> = Ok(());
        // A row's message is not read again once decoded, so its id moves into the ticket.
        let mut messages = messages;
        for (i, (m, id)) in messages.iter_mut().zip(&ids).enumerate() {
            let this_bad = bad.next_if(|b| b.index == i);
            let Some(b) = this_bad else {
                ack_ids.push(id.clone());
                row_keys.push(
                    m.message
                        .as_mut()
                        .map(|m| std::mem::take(&mut m.message_id))
                        .unwrap_or_default(),
                );
                continue;
            };
            if outcome.is_err() {
                continue;
            }
            match policy {
                FailurePolicy::Fail => {
                    outcome = Err(Error::Unsupported(format!(
                        "subscription '{}': {} (failure_policy = 'fail'; set failure_policy = 'drop' \
                         or 'dead_letter' to let such messages pass; the message is not acknowledged)",
                        self.config.options.subscription,
                        b.describe()
                    )));
                }
                FailurePolicy::Drop => {
                    tracing::warn!(
                        subscription = %self.config.options.subscription,
                        message_id = %b.message_id,
                        "dropped (failure_policy = 'drop'): {}",
                        b.describe()
                    );
                    DeliveryCounters::add(&self.counters.dropped, 1);
                    handled_ids.push(id.clone());
                }
                FailurePolicy::DeadLetter => match self.write_dead_letter(m, b).await {
                    Ok(stored) => {
                        DeliveryCounters::add(&self.counters.dead_lettered, 1);
                        if !stored {
                            self.held_since
                                .get_or_insert_with(tokio::time::Instant::now);
                            self.held_for_dead_letter.push(id.clone());
                        } else {
                            handled_ids.push(id.clone());
                        }
                    }
                    Err(e) => outcome = Err(e),
                },
            }
        }
        if let Err(e) = outcome {
            self.queue.nack(ids);
            return Err(e);
        }
        ack_ids.append(&mut handled_ids);
        let rows = decoded.batch.num_rows();
        let ticket =
            Arc::new(BatchTicket::new(ack_ids, rows, self.queue.clone()).with_row_keys(row_keys));
        if let Some(clock) = self.handle_clock() {
            let handle: Arc<dyn DeliveryHandle> = ticket.clone();
            clock.observe_batch(self.batch_max_event_time(&decoded.batch)?, &handle)?;
        }
        if rows == 0 {
            ticket.seal();
            return Ok(None);
        }
        let batch = match &self.projection {
            Some(p) => decoded.batch.project(p)?,
            None => decoded.batch,
        };
        self.slot.put(ticket.clone());
        self.last = Some(ticket);
        DeliveryCounters::add(&self.counters.emitted, rows as u64);
        Ok(Some(batch))
    }

    fn handle_clock(&self) -> Option<&Arc<EventClock>> {
        self.config.options.event_time.column.as_ref()?;
        self.clocks.get(self.partition)
    }

    /// The greatest event time of a decoded batch (ns since the epoch).
    fn batch_max_event_time(&self, batch: &RecordBatch) -> crate::Result<Option<i64>> {
        let Some(column) = &self.config.options.event_time.column else {
            return Ok(None);
        };
        let Ok(index) = batch.schema().index_of(column) else {
            return Ok(None);
        };
        let values = batch.column(index);
        let tz = match values.data_type() {
            DataType::Timestamp(_, tz) => tz.clone(),
            _ => return Ok(None),
        };
        let ns = cast(values, &DataType::Timestamp(TimeUnit::Nanosecond, tz))
            .map_err(DataFusionError::from)?;
        Ok(max(ns.as_primitive::<TimestampNanosecondType>()))
    }

    /// Writes the dead letter of `m`; `Ok(true)` when it is stored already, `Ok(false)` when
    /// it is stored only once its object is completed.
    async fn write_dead_letter(
        &mut self,
        m: &ReceivedMessage,
        b: &BadMessage,
    ) -> crate::Result<bool> {
        let sink = self.dead_letter_sink().await?;
        let mut row = serde_json::Map::new();
        let mut payload = None;
        if let Some(msg) = &m.message {
            payload = Some(msg.data.clone());
            row.insert("message_id".into(), msg.message_id.clone().into());
            if !msg.ordering_key.is_empty() {
                row.insert("ordering_key".into(), msg.ordering_key.clone().into());
            }
            if let Some(t) = msg
                .publish_time
                .as_ref()
                .and_then(|t| chrono::DateTime::from_timestamp(t.seconds, t.nanos.max(0) as u32))
            {
                // RFC 3339 in UTC with microseconds, as the dead letters' own times are written.
                row.insert(
                    "publish_time".into(),
                    t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string().into(),
                );
            }
            let attributes: serde_json::Map<String, serde_json::Value> = msg
                .attributes
                .iter()
                .map(|(k, v)| (k.clone(), v.clone().into()))
                .collect();
            row.insert("attributes".into(), attributes.into());
        }
        sink.write(DeadRow {
            destination: self.config.options.subscription.clone(),
            class: DeadClass::Encoding,
            code: None,
            message: b.describe(),
            attempts: 0,
            data: DeadPayload {
                payload,
                row: Some(row),
            },
        })
        .await?;
        Ok(sink.stored_on_write())
    }
}

impl Drop for PartitionReader {
    fn drop(&mut self) {
        if !self.finished {
            // Dropped before its end: nothing more is sealed; what it holds goes back.
            self.slot.clear();
            self.release_unemitted();
        }
    }
}

async fn abort_signal(stop: &mut watch::Receiver<Option<StopKind>>) {
    loop {
        if *stop.borrow_and_update() == Some(StopKind::Abort) {
            return;
        }
        if stop.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
