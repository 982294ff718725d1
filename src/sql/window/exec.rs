//! The windowed aggregate's plan node ([`WindowAggregateExec`]) and its run: it reads every
//! partition of its input (one source's streams), holds each row's delivery handle until the
//! windows the row falls in were emitted, delivered and recorded in the progress marker, and
//! emits each window's rows once the watermark passes its end plus the allowed lateness
//! (ADR 0068).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, RecordBatch, StructArray, TimestampNanosecondArray,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{
    DataType, Fields, SchemaRef, TimeUnit, TimestampNanosecondType,
};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{
    Boundedness, EmissionType, ReplaceChildrenOptions,
};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use futures::future::BoxFuture;
use futures::stream::{SelectAll, Stream, StreamExt};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::progress::{CoveredBytes, Listed, Marker};
use super::seen::{self, Seen, SeenMessages};
use super::state::{Aggregation, Emitted, OpenWindows, WindowShape};
use crate::connectors::dead_letter::{self, DeadLetterContext};
use crate::connectors::descriptor::WindowedSource;
use crate::core::FailurePolicy;
use crate::core::dead_letter::{DeadClass, DeadLetterSink, DeadPayload, DeadRow};
use crate::core::delivery::{Delivery, DeliveryCounts, DeliveryHandle, DeliveryInput, EventClock};
use crate::error::{Error, Result};
use crate::plan::node::{name_and_properties, with_new_children_by_replace};

/// Messages each input stream may hold until windows close, beyond its flow control: what
/// the node asks the source to let it hold ([`DeliveryInput::expect_held`]).
pub const HELD_PER_STREAM: u64 = 1_000_000;

/// How the window appears among the aggregate's group columns.
#[derive(Debug, Clone, PartialEq)]
pub enum WindowValue {
    /// The window's start, of this type (`date_bin`).
    Start(DataType),
    /// A struct of the window's `start` and `end`, of these fields (`tumble`, `hop`).
    Bounds(Fields),
}

/// The window of a windowed aggregate: the event-time expression, the windows' shape, and
/// where and how the window is a group column of the output.
#[derive(Debug, Clone)]
pub struct WindowColumn {
    /// The event time, over the node's input.
    pub time: Arc<dyn PhysicalExpr>,
    /// The input column the event time is (for messages).
    pub time_column: String,
    /// Tumbling or hopping, width, slide, origin.
    pub shape: WindowShape,
    /// How the window is written into its group column.
    pub value: WindowValue,
    /// Its position among the group columns.
    pub position: usize,
    /// How the query wrote it, for `EXPLAIN` (`tumble(60s)`, `date_bin(60s, pt)`).
    pub written: String,
}

/// What one node counted: windows and rows emitted, rows late, rows covered by the marker.
#[derive(Debug, Default)]
pub struct WindowCounters {
    /// Windows emitted.
    pub windows: AtomicU64,
    /// Rows emitted (one per key and window).
    pub rows: AtomicU64,
    /// Rows that arrived for windows already emitted (late).
    pub late: AtomicU64,
    /// Rows of windows the progress marker already covers, acknowledged without being counted
    /// (redelivered after a restart).
    pub covered: AtomicU64,
    /// Rows of messages delivered again while this run counted them (a lapsed lease, a lost
    /// acknowledgement): held with their first copy, or acknowledged as covered once it was
    /// released, and not counted again.
    pub copies: AtomicU64,
}

/// An emission round: the windows closed at one close point, and how many of its output
/// batches are not yet settled.
#[derive(Debug, Default)]
struct Round {
    pending: usize,
    failed: bool,
}

/// Rows held under one handle: the handle and the rows' indices in its batch.
type Held = Vec<(Arc<dyn DeliveryHandle>, Vec<u32>)>;

#[derive(Debug, Default)]
struct RunState {
    /// Held rows by release.
    held: BTreeMap<i64, Held>,
    /// Emission rounds by close point, oldest first, until delivered.
    rounds: BTreeMap<i64, Round>,
    /// Every window ending at or before this was delivered.
    delivered: Option<i64>,
    /// What the marker says.
    recorded: Option<i64>,
    /// The node's stream ended.
    finished: bool,
    /// It ended because its input ended (a graceful stop), not with an error.
    graceful: bool,
    /// The greatest watermark the node computed, for the marker.
    watermark: Option<i64>,
    /// The watermark the marker says.
    recorded_watermark: Option<i64>,
    /// The marker could not be written: the stream fails with it.
    error: Option<String>,
    /// Rows found late whose messages may come back, by message id, for the marker: a
    /// message named there is late in a later run too (ADR 0068).
    late: BTreeMap<String, LateRow>,
    /// Bumped whenever `late` gains an id.
    late_version: u64,
    /// The `late_version` the marker has recorded.
    late_recorded: u64,
    /// The messages counted and held (and for a while after their release), so that a copy
    /// delivered again within the run is not counted twice.
    seen: SeenMessages,
    /// The frontiers whose covered sets this run stored beside the marker, and since when
    /// (oldest first): listed in every marker written until `keep_covered` has passed (the
    /// acknowledgements of a live run go out well within it).
    covered_sets: VecDeque<(Instant, i64)>,
    /// How long a covered set this run stored is kept (the source's recovery hold, as `seen`
    /// keeps released messages).
    keep_covered: Duration,
    /// The covered sets earlier runs left, kept (and listed, with the wall-clock time) until
    /// the instant given: a killed run's messages come back as the subscription's backlog
    /// allows, which can take far longer than the hold.
    inherited_sets: Vec<i64>,
    inherited_until: Option<(Instant, i64)>,
}

impl RunState {
    /// The covered sets older than `keep_covered` leave the list (their objects are deleted
    /// once a marker without them was written); returns them.
    fn expire_covered(&mut self, now: Instant) -> Vec<i64> {
        let mut expired = Vec::new();
        if self.inherited_until.is_some_and(|(until, _)| now >= until) {
            expired.append(&mut self.inherited_sets);
            self.inherited_until = None;
        }
        while let Some((at, f)) = self.covered_sets.front().copied() {
            if now.saturating_duration_since(at) < self.keep_covered {
                break;
            }
            self.covered_sets.pop_front();
            expired.push(f);
        }
        expired
    }

    /// The covered sets the marker lists now.
    fn covered_list(&self) -> Vec<Listed> {
        let until_ms = self.inherited_until.map(|(_, ms)| ms);
        self.inherited_sets
            .iter()
            .map(|f| (*f, until_ms))
            .chain(self.covered_sets.iter().map(|(_, f)| (*f, None)))
            .collect()
    }
}

/// Late rows written to the dead-letter object not yet completed: their batch's handle, their
/// indices in it, and their message ids.
type LettersPending = (Arc<dyn DeliveryHandle>, Vec<u32>, Vec<String>);

/// A row found late, as the marker keeps it.
#[derive(Debug, Clone, Copy)]
struct LateRow {
    /// The end of the last window it belongs to (ns).
    release: i64,
    /// Its dead letter is stored (or it was dropped): once its windows are recorded as
    /// delivered, a redelivery of it is covered, and the marker forgets it.
    settled: bool,
    /// Named by the previous run's marker and not seen again yet: forgotten when the hold
    /// after that run ends (its message would have come back by then).
    inherited: bool,
}

impl RunState {
    /// What the marker says of late rows now.
    fn late_for_marker(&self) -> Vec<(String, i64)> {
        self.late
            .iter()
            .map(|(id, row)| (id.clone(), row.release))
            .collect()
    }
}

/// What the node's stream, its output tickets and its delivery input share.
#[derive(Debug)]
struct Run {
    state: Mutex<RunState>,
    changed: Notify,
    /// The delivery input of each input partition.
    inputs: Vec<Arc<dyn DeliveryInput>>,
    /// The ticket of the batch emitted last.
    current: Mutex<Option<Arc<WindowTicket>>>,
    keeper: Mutex<Option<JoinHandle<()>>>,
    counters: WindowCounters,
    source: String,
    /// The writer made a flush point: complete the late rows' dead-letter object.
    flush: AtomicBool,
    /// The input partitions' event-time clocks, gated while the marker is kept (see
    /// [`EventClock`]).
    clocks: Vec<Arc<EventClock>>,
}

impl Run {
    fn lock(&self) -> std::sync::MutexGuard<'_, RunState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The marker now says `watermark`: what the clocks held for it may be acknowledged.
    fn watermark_recorded(&self, watermark: Option<i64>) {
        let Some(w) = watermark else {
            return;
        };
        {
            let mut s = self.lock();
            s.recorded_watermark = Some(s.recorded_watermark.map_or(w, |r| r.max(w)));
        }
        for clock in &self.clocks {
            clock.recorded(w);
        }
    }

    /// The marker (or a covered set) could not be written: the node's stream fails with
    /// `e`, and the clocks let go of what they hold.
    fn keeper_failed(&self, marker: &Marker, e: &Error) {
        tracing::error!(marker = %marker.url(), "{e}");
        self.lock().error = Some(e.to_string());
        self.ungate();
        self.changed.notify_waiters();
    }

    /// The marker is no longer kept: the clocks let go of what they hold.
    fn ungate(&self) {
        for clock in &self.clocks {
            clock.ungate();
        }
    }

    /// A batch of round `close` was settled (`ok`) or dropped unsettled.
    fn batch_done(&self, close: i64, ok: bool) {
        {
            let mut s = self.lock();
            if let Some(round) = s.rounds.get_mut(&close) {
                round.pending = round.pending.saturating_sub(1);
                round.failed |= !ok;
            }
            advance_delivered(&mut s);
        }
        self.changed.notify_waiters();
    }

    fn open_round(&self, close: i64, batches: usize) {
        {
            let mut s = self.lock();
            s.rounds.insert(
                close,
                Round {
                    pending: batches,
                    failed: false,
                },
            );
            advance_delivered(&mut s);
        }
        self.changed.notify_waiters();
    }
}

/// Moves the delivered frontier past every leading round whose batches were all settled.
fn advance_delivered(s: &mut RunState) {
    while let Some(entry) = s.rounds.first_entry() {
        let round = entry.get();
        if round.pending > 0 || round.failed {
            return;
        }
        let close = *entry.key();
        entry.remove();
        s.delivered = Some(s.delivered.map_or(close, |d| d.max(close)));
    }
}

/// The delivery handle of one output batch: settled by the sink's writer; once sealed and
/// every retained row was settled positively, its round may be recorded.
#[derive(Debug)]
struct WindowTicket {
    close: i64,
    retained: AtomicU64,
    settled: AtomicU64,
    sealed: AtomicBool,
    failed: AtomicBool,
    resolved: AtomicBool,
    run: Weak<Run>,
}

impl WindowTicket {
    fn new(close: i64, run: &Arc<Run>) -> Self {
        WindowTicket {
            close,
            retained: AtomicU64::new(0),
            settled: AtomicU64::new(0),
            sealed: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            resolved: AtomicBool::new(false),
            run: Arc::downgrade(run),
        }
    }

    fn seal(&self) {
        self.sealed.store(true, Ordering::SeqCst);
        self.try_resolve();
    }

    fn try_resolve(&self) {
        if self.sealed.load(Ordering::SeqCst)
            && !self.failed.load(Ordering::SeqCst)
            && self.settled.load(Ordering::SeqCst) == self.retained.load(Ordering::SeqCst)
            && !self.resolved.swap(true, Ordering::SeqCst)
            && let Some(run) = self.run.upgrade()
        {
            run.batch_done(self.close, true);
        }
    }
}

impl DeliveryHandle for WindowTicket {
    fn retain(&self, rows: u64) -> Result<()> {
        if self.sealed.load(Ordering::SeqCst) {
            self.failed.store(true, Ordering::SeqCst);
            return Err(Error::Unsupported(format!(
                "a consumer retained {rows} row(s) of a window's output after it was sealed"
            )));
        }
        self.retained.fetch_add(rows, Ordering::SeqCst);
        Ok(())
    }

    fn settle(&self, rows: u64, how: Delivery) {
        if !how.is_positive() {
            self.failed.store(true, Ordering::SeqCst);
            return;
        }
        self.settled.fetch_add(rows, Ordering::SeqCst);
        self.try_resolve();
    }
}

impl Drop for WindowTicket {
    fn drop(&mut self) {
        if !self.resolved.swap(true, Ordering::SeqCst)
            && let Some(run) = self.run.upgrade()
        {
            run.batch_done(self.close, false);
        }
    }
}

/// The node's delivery input, as the sink's writer sees it.
#[derive(Debug)]
struct WindowInput {
    run: Arc<Run>,
}

impl DeliveryInput for WindowInput {
    fn current(&self) -> Option<Arc<dyn DeliveryHandle>> {
        let current = self.run.current.lock().unwrap_or_else(|e| e.into_inner());
        current.clone().map(|t| t as Arc<dyn DeliveryHandle>)
    }

    fn stop_reading(&self) {
        for input in &self.run.inputs {
            input.stop_reading();
        }
    }

    fn counts(&self) -> DeliveryCounts {
        self.run
            .inputs
            .first()
            .map(|i| i.counts())
            .unwrap_or_default()
    }

    fn settled(&self) -> BoxFuture<'static, ()> {
        let run = self.run.clone();
        Box::pin(async move {
            let keeper = run.keeper.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(keeper) = keeper {
                let _ = keeper.await;
            }
            // What is still held belongs to windows that were not emitted (a stop): dropping
            // the handles hands those messages back.
            let held = {
                let mut s = run.lock();
                s.seen.clear();
                std::mem::take(&mut s.held)
            };
            let messages: usize = held.values().flatten().map(|(_, rows)| rows.len()).sum();
            if messages > 0 {
                tracing::info!(
                    source = %run.source,
                    rows = messages,
                    "the statement stopped with windows open: their rows' messages go back to the subscription, and the next run computes those windows"
                );
            }
            drop(held);
            for input in &run.inputs {
                input.settled().await;
            }
        })
    }

    fn describe(&self) -> String {
        format!("windows over {}", self.run.source)
    }

    fn identity(&self) -> crate::core::delivery::InputIdentity {
        match self.run.inputs.first() {
            Some(input) => input.identity(),
            None => crate::core::delivery::InputIdentity {
                connector: "",
                table: String::new(),
                resource: self.describe(),
            },
        }
    }

    fn held(&self) -> crate::core::delivery::Held {
        // Every partition of the source reports the whole scan.
        self.run
            .inputs
            .first()
            .map(|input| input.held())
            .unwrap_or_default()
    }

    fn flush_point(&self) {
        // The late rows' dead letters are completed when the node is next polled; the
        // source completes its own.
        self.run.flush.store(true, Ordering::SeqCst);
        for input in &self.run.inputs {
            input.flush_point();
        }
    }
}

/// What a windowed aggregate computes, from what, and where its progress goes.
#[derive(Debug, Clone)]
pub struct WindowQuery {
    /// The window.
    pub window: WindowColumn,
    /// The keys and aggregates.
    pub aggregation: Aggregation,
    /// The source read.
    pub source: WindowedSource,
    /// The progress marker's name.
    pub pipeline: String,
    /// The table the INSERT writes, for messages.
    pub table: String,
    /// The output (the aggregate's schema).
    pub schema: SchemaRef,
}

/// A windowed aggregate between a source and a sink (ADR 0068). Built by the planner from
/// DataFusion's aggregate (see `super::plan`); one output partition.
#[derive(Debug)]
pub struct WindowAggregateExec {
    input: Arc<dyn ExecutionPlan>,
    query: WindowQuery,
    properties: Arc<PlanProperties>,
    run: Arc<Run>,
}

impl WindowAggregateExec {
    /// The node over `input` (already connected: every partition carries delivery handles,
    /// found in `inputs`), emitting `schema` (the aggregate's output).
    pub fn try_new(
        input: Arc<dyn ExecutionPlan>,
        inputs: Vec<Arc<dyn DeliveryInput>>,
        query: WindowQuery,
    ) -> DFResult<Self> {
        let schema = query.schema.clone();
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Unbounded {
                requires_infinite_memory: false,
            },
        );
        let clocks = inputs.iter().filter_map(|i| i.clock()).collect();
        let run = Arc::new(Run {
            state: Mutex::new(RunState {
                seen: SeenMessages::new(query.source.recovery_hold),
                keep_covered: query.source.recovery_hold,
                ..RunState::default()
            }),
            changed: Notify::new(),
            clocks,
            inputs,
            current: Mutex::new(None),
            keeper: Mutex::new(None),
            counters: WindowCounters::default(),
            source: query.source.describe.clone(),
            flush: AtomicBool::new(false),
        });
        Ok(WindowAggregateExec {
            input,
            query,
            properties: Arc::new(properties),
            run,
        })
    }

    /// The node's delivery input: where the sink's writer finds the handle of each output
    /// batch.
    pub fn delivery_input(&self) -> Arc<dyn DeliveryInput> {
        Arc::new(WindowInput {
            run: self.run.clone(),
        })
    }

    /// The name of the pipeline's progress marker.
    pub fn pipeline(&self) -> &str {
        &self.query.pipeline
    }

    /// What the node counted so far: windows, rows, late rows, covered rows.
    pub fn counters(&self) -> &WindowCounters {
        &self.run.counters
    }
}

impl DisplayAs for WindowAggregateExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = &self.query.source.event_time;
        let keys: Vec<String> = self
            .query
            .aggregation
            .keys
            .iter()
            .map(|k| k.to_string())
            .collect();
        let aggregates: Vec<&str> = self
            .query
            .aggregation
            .aggregates
            .iter()
            .map(|a| a.name())
            .collect();
        write!(
            f,
            "WindowAggregateExec: window={}, event_time={}, allowed_lateness={:?}, idle_timeout={:?}, keys=[{}], aggr=[{}], watermark=min over {} stream(s) of {}, progress={}/{}.json",
            self.query.window.written,
            self.query.window.time_column,
            e.allowed_lateness,
            e.idle_timeout,
            keys.join(", "),
            aggregates.join(", "),
            self.input.output_partitioning().partition_count(),
            self.query.source.describe,
            e.progress.as_ref().map_or(String::new(), |p| p
                .folder
                .as_str()
                .trim_end_matches('/')
                .to_string()),
            self.query.pipeline,
        )
    }
}

impl ExecutionPlan for WindowAggregateExec {
    name_and_properties!("WindowAggregateExec");

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DFResult<TreeNodeRecursion>,
    ) -> DFResult<TreeNodeRecursion> {
        let mut exprs = vec![&self.query.window.time];
        exprs.extend(self.query.aggregation.keys.iter());
        for e in exprs {
            if f(e)? == TreeNodeRecursion::Stop {
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let [input] = <[_; 1]>::try_from(children).map_err(|c| {
            DataFusionError::Internal(format!(
                "WindowAggregateExec has one child, given {}",
                c.len()
            ))
        })?;
        if Arc::ptr_eq(&input, &self.input) {
            return Ok(self);
        }
        // An optimizer rule rewrote the input: connect it again (what it added that would mix
        // or gather batches is taken out, or refused) and find its partitions' handles anew.
        let input = crate::sql::lineage::connect(input, &self.query.table)?;
        let partitions = input.output_partitioning().partition_count();
        let inputs = (0..partitions)
            .map(|p| {
                crate::sql::lineage::delivery_input(&input, p).ok_or_else(|| {
                    DataFusionError::Plan(format!(
                        "the windows of INSERT INTO '{}' lost the delivery handles of input \
                         partition {p}",
                        self.query.table
                    ))
                })
            })
            .collect::<DFResult<Vec<_>>>()?;
        Ok(Arc::new(WindowAggregateExec::try_new(
            input,
            inputs,
            self.query.clone(),
        )?))
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        // Every input partition is read as it is (one per stream of the source).
        vec![false]
    }

    with_new_children_by_replace!();

    fn metrics(&self) -> Option<MetricsSet> {
        let c = &self.run.counters;
        let set = ExecutionPlanMetricsSet::new();
        for (name, value) in [
            ("windows_emitted", &c.windows),
            ("window_rows_emitted", &c.rows),
            ("rows_late", &c.late),
            ("rows_covered_by_progress", &c.covered),
            ("rows_redelivered_not_recounted", &c.copies),
        ] {
            MetricBuilder::new(&set)
                .global_counter(name)
                .add(usize::try_from(value.load(Ordering::Relaxed)).unwrap_or(usize::MAX));
        }
        Some(set.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "WindowAggregateExec has one partition, asked for {partition}"
            )));
        }
        let Some(progress) = self.query.source.event_time.progress.clone() else {
            return Err(DataFusionError::Plan(format!(
                "the windows over {} need 'progress_path'",
                self.query.source.describe
            )));
        };
        let marker = Marker::open(
            &progress,
            &self.query.pipeline,
            Some(&context.runtime_env()),
        )?;
        let partitions = self.input.output_partitioning().partition_count();
        for input in &self.run.inputs {
            input.expect_held(HELD_PER_STREAM);
        }
        let mut streams: SelectAll<Tagged> = SelectAll::new();
        for p in 0..partitions {
            let stream = self.input.execute(p, context.clone())?;
            streams.push(Box::pin(stream.map(move |b| (p, b))));
        }
        let mut driver = Driver {
            window: self.query.window.clone(),
            open: OpenWindows::new(self.query.window.shape, self.query.aggregation.clone()),
            source: self.query.source.clone(),
            schema: self.query.schema.clone(),
            run: self.run.clone(),
            marker: None,
            streams,
            marks: vec![Mark::default(); partitions],
            clocks: self.run.inputs.iter().map(|i| i.clock()).collect(),
            started_at: Instant::now(),
            closed: i64::MIN,
            covered_through: None,
            covered_by_frontier: false,
            pending: VecDeque::new(),
            last: None,
            inputs_done: false,
            dead_letter: None,
            dead_lettered: Vec::new(),
            covered_copies: Vec::new(),
            statement: format!(
                "windows-{}-{}",
                self.query.pipeline,
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_millis()
            ),
            runtime: context.runtime_env(),
            tick: tokio::time::interval(tick_every(self.query.source.event_time.idle_timeout)),
            keys: self.query.aggregation.keys.len(),
            hold_until: None,
            previous_late: Default::default(),
            floor: None,
            marker_url: marker.url().to_string(),
        };
        driver.marker = Some(marker);
        let stream = futures::stream::unfold(driver, |mut d| async move {
            d.next().await.map(|item| (item, d))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.query.schema.clone(),
            stream,
        )))
    }
}

/// How often the marker is written when only the watermark moved.
const WATERMARK_WRITES_EVERY: Duration = Duration::from_secs(1);

fn tick_every(idle: Duration) -> Duration {
    (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(1))
}

type Tagged = Pin<Box<dyn Stream<Item = (usize, DFResult<RecordBatch>)> + Send>>;

/// What one input partition delivered: its greatest event time, and when it last delivered.
#[derive(Debug, Clone, Copy, Default)]
struct Mark {
    max: Option<i64>,
    seen: Option<Instant>,
}

/// The node's running stream.
struct Driver {
    window: WindowColumn,
    open: OpenWindows,
    source: WindowedSource,
    schema: SchemaRef,
    run: Arc<Run>,
    marker: Option<Marker>,
    streams: SelectAll<Tagged>,
    /// What each partition delivered to this node (used where its input has no clock).
    marks: Vec<Mark>,
    /// Each input partition's event-time clock, where the input keeps one: it sees the rows a
    /// filter before this node drops.
    clocks: Vec<Option<Arc<EventClock>>>,
    started_at: Instant,
    /// The greatest close point emitted (every window ending at or before it was emitted).
    closed: i64,
    /// What the marker said when the run started: rows of windows at or before it were
    /// counted by an earlier run.
    covered_through: Option<i64>,
    /// The marker predates covered sets: every row at or before `covered_through` is taken
    /// as covered (a late row among them cannot be told apart).
    covered_by_frontier: bool,
    pending: VecDeque<(RecordBatch, Arc<WindowTicket>)>,
    last: Option<Arc<WindowTicket>>,
    inputs_done: bool,
    dead_letter: Option<Arc<dyn DeadLetterSink>>,
    /// Late rows written to a dead-letter path: settled once its object is completed.
    dead_lettered: Vec<LettersPending>,
    /// Copies of released messages, settled (acknowledged) once their batches are sealed.
    covered_copies: Held,
    statement: String,
    runtime: Arc<datafusion::execution::runtime_env::RuntimeEnv>,
    tick: tokio::time::Interval,
    /// Group columns besides the window.
    keys: usize,
    /// After an unclean stop: no window is emitted before this.
    hold_until: Option<Instant>,
    /// The message ids the previous run's marker names as late (ADR 0068).
    previous_late: std::collections::HashSet<String>,
    /// The watermark the marker recorded: the watermark starts there.
    floor: Option<i64>,
    /// The marker's URL, for errors.
    marker_url: String,
}

enum Wake {
    Input(Option<(usize, DFResult<RecordBatch>)>),
    Tick,
}

impl Driver {
    async fn next(&mut self) -> Option<DFResult<RecordBatch>> {
        if let Some(t) = self.last.take() {
            t.seal();
        }
        if self.run.flush.swap(false, Ordering::SeqCst)
            && !self.dead_lettered.is_empty()
            && let Err(e) = self.complete_dead_letters(false).await
        {
            self.finish();
            return Some(Err(e.into()));
        }
        if let Some(marker) = self.marker.take()
            && let Err(e) = self.start(marker).await
        {
            self.inputs_done = true;
            self.finish();
            return Some(Err(e.into()));
        }
        loop {
            let error = self.run.lock().error.take();
            if let Some(error) = error {
                self.finish();
                return Some(Err(DataFusionError::External(Box::new(Error::Progress {
                    marker: self.marker_url.clone(),
                    message: error,
                }))));
            }
            if let Some((batch, ticket)) = self.pending.pop_front() {
                *self.run.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(ticket.clone());
                self.last = Some(ticket);
                return Some(Ok(batch));
            }
            if self.inputs_done {
                let completed = self.complete_dead_letters(true).await;
                self.run.lock().graceful = completed.is_ok();
                self.finish();
                return completed.err().map(|e| Err(e.into()));
            }
            let wake = tokio::select! {
                item = self.streams.next() => Wake::Input(item),
                _ = self.tick.tick() => Wake::Tick,
            };
            let step = match wake {
                Wake::Input(None) => {
                    self.inputs_done = true;
                    Ok(())
                }
                Wake::Input(Some((_, Err(e)))) => {
                    self.finish();
                    return Some(Err(e));
                }
                Wake::Input(Some((p, Ok(batch)))) => {
                    // The streams were polled again: the batches of earlier copies are sealed.
                    self.settle_covered_copies();
                    self.take(p, batch).await
                }
                Wake::Tick => Ok(()),
            };
            if let Err(e) = step.and_then(|()| self.advance()) {
                self.finish();
                return Some(Err(e.into()));
            }
        }
    }

    /// Reads the marker and starts the task that keeps it.
    async fn start(&mut self, marker: Marker) -> Result<()> {
        let progress = marker.start().await?;
        self.floor = progress.watermark_ns;
        {
            let mut s = self.run.lock();
            s.watermark = progress.watermark_ns;
            s.recorded_watermark = progress.watermark_ns;
            // The rows the previous run found late: late here too when they come back.
            for (id, release) in &progress.late {
                s.late.insert(
                    id.clone(),
                    LateRow {
                        release: *release,
                        settled: false,
                        inherited: true,
                    },
                );
            }
        }
        self.previous_late = progress.late.iter().map(|(id, _)| id.clone()).collect();
        // The messages the previous runs let go of lately: a copy of one is covered, any
        // other row of a recorded window is late.
        let listed = progress.covered.clone().unwrap_or_default();
        self.covered_by_frontier = progress.covered.is_none();
        let mut sets = Vec::with_capacity(listed.len());
        for (f, _) in &listed {
            sets.push(marker.read_covered(*f).await?);
        }
        let inherited: Vec<Listed> = if listed.is_empty() {
            Vec::new()
        } else {
            // Kept until the latest time a listed set gives, a set this run is the first to
            // inherit for `max_lease_duration` from now, and at least for the hold.
            let now_ms = chrono::Utc::now().timestamp_millis();
            let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
            let keep = self
                .source
                .max_lease_duration
                .max(self.source.recovery_hold);
            let until_ms = listed
                .iter()
                .map(|(_, until)| until.unwrap_or(now_ms.saturating_add(ms(keep))))
                .max()
                .unwrap_or(now_ms)
                .max(now_ms.saturating_add(ms(self.source.recovery_hold)));
            let until = Instant::now()
                + Duration::from_millis(u64::try_from(until_ms - now_ms).unwrap_or(0));
            let mut s = self.run.lock();
            for set in sets {
                s.seen.inherit(until, set);
            }
            s.inherited_sets = listed.iter().map(|(f, _)| *f).collect();
            s.inherited_until = Some((until, until_ms));
            s.covered_list()
        };
        let open_before = match (progress.watermark_ns, progress.frontier_ns) {
            (Some(w), Some(f)) => w > f,
            (Some(_), None) => true,
            _ => false,
        };
        if !progress.clean || open_before {
            // The previous run was killed, or stopped with windows open: the messages it held
            // come back (once their leases lapse, or once handed back), maybe after newer
            // ones; no window closes before they can be back.
            let hold = self.source.recovery_hold;
            let until = Instant::now() + hold;
            self.hold_until = Some(until);
            // An input that stops when idle keeps reading until the hold is over: stopping
            // during it would hand every held message back with nothing emitted, and the next
            // run would hold again.
            for input in &self.run.inputs {
                input.read_until(until.into_std());
            }
            tracing::warn!(
                source = %self.source.describe,
                marker = %marker.url(),
                clean = progress.clean,
                "the previous run did not end gracefully or left windows open: no window is emitted for {hold:?}, so the messages it held come back first"
            );
        }
        marker
            .claim(
                progress.frontier_ns,
                progress.watermark_ns,
                &progress.late,
                &inherited,
            )
            .await?;
        // A second run of the pipeline that started at the same moment has written its own
        // marker by now: the run whose marker is not there gives way, before it reads.
        tokio::time::sleep(super::progress::CONFIRM_AFTER).await;
        marker.confirm().await?;
        let swept = marker.sweep_covered(&inherited).await?;
        if swept > 0 {
            tracing::info!(marker = %marker.url(), swept, "covered sets the marker does not list were deleted");
        }
        if let Some(f) = progress.frontier_ns {
            self.closed = f;
            self.covered_through = Some(f);
            let mut s = self.run.lock();
            s.delivered = Some(f);
            s.recorded = Some(f);
        }
        tracing::info!(
            source = %self.source.describe,
            marker = %marker.url(),
            frontier_ns = ?progress.frontier_ns,
            "windows start from their progress marker"
        );
        // From here on, a batch that moves a clock past the recorded watermark is
        // acknowledged only once the marker caught up with it.
        for clock in &self.run.clocks {
            clock.gate(progress.watermark_ns);
        }
        // Reading starts now: a stream is idle only once it read nothing for idle_timeout
        // from here (the marker's read and confirmation took a while).
        self.started_at = Instant::now();
        let keeper = tokio::spawn(keep(self.run.clone(), marker));
        *self.run.keeper.lock().unwrap_or_else(|e| e.into_inner()) = Some(keeper);
        Ok(())
    }

    /// The stream ends: nothing more is emitted, and the marker's keeper may end once every
    /// emitted batch was settled or dropped.
    fn finish(&mut self) {
        self.settle_covered_copies();
        self.pending.clear();
        self.run
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        self.run.lock().finished = true;
        self.run.changed.notify_waiters();
    }

    /// Copies of released messages go: their messages are acknowledged now (or, if a batch
    /// is not sealed yet, with the rest of it).
    fn settle_covered_copies(&mut self) {
        for (handle, rows) in self.covered_copies.drain(..) {
            handle.settle_rows(&rows, Delivery::Dropped);
        }
    }

    /// Takes one input batch of partition `p`: late rows follow the failure policy, the others
    /// join their windows and are held (retained on the batch's handle) until recorded.
    async fn take(&mut self, p: usize, batch: RecordBatch) -> Result<()> {
        let rows = batch.num_rows();
        if rows == 0 {
            return Ok(());
        }
        let handle = self.run.inputs.get(p).and_then(|i| i.current());
        let times = event_times(&self.window, &batch)?;
        let mark = &mut self.marks[p];
        mark.seen = Some(Instant::now());
        let batch_max = times.iter().flatten().max().copied();
        if let Some(m) = batch_max {
            mark.max = Some(mark.max.map_or(m, |old| old.max(m)));
        }
        let shape = self.window.shape;
        let mut on_time: Vec<u32> = Vec::with_capacity(rows);
        let mut on_time_times: Vec<i64> = Vec::with_capacity(rows);
        let mut releases: BTreeMap<i64, Vec<u32>> = BTreeMap::new();
        let mut late: Vec<(usize, &'static str, Option<i64>)> = Vec::new();
        let mut covered = 0u64;
        // The rows' message ids (when the input names them): a copy of a message this run
        // counted is not counted again, and a message the previous run found late is late.
        let keys = handle
            .as_ref()
            .and_then(|h| h.row_keys(&(0..rows as u32).collect::<Vec<_>>()));
        let now = Instant::now();
        // Copies of held messages, by release: held with their originals, not counted.
        let mut copies: BTreeMap<i64, Vec<u32>> = BTreeMap::new();
        // Copies of messages already released: acknowledged, not counted.
        let mut covered_rows: Vec<u32> = Vec::new();
        // Copies of late rows whose letters are not stored yet: settled with them.
        let mut letter_copies: Vec<u32> = Vec::new();
        // Rows an earlier run's covered set names: acknowledged, not counted.
        let mut marker_covered: Vec<u32> = Vec::new();
        let copied = {
            let mut s = self.run.lock();
            for (i, t) in times.iter().enumerate() {
                let Some(t) = *t else {
                    late.push((i, "its event time is NULL", None));
                    continue;
                };
                let release = shape.release(t);
                let key = keys.as_ref().map(|k| &k[i]);
                // A copy of a message this run found late: its letter is written once.
                if let Some(row) = key.and_then(|k| s.late.get(k)).filter(|r| !r.inherited) {
                    if row.settled {
                        covered_rows.push(i as u32);
                    } else {
                        letter_copies.push(i as u32);
                    }
                    continue;
                }
                if key.is_some_and(|k| self.previous_late.contains(k)) {
                    late.push((
                    i,
                    "late: an earlier run found it late (its progress marker names the message)",
                    Some(release),
                ));
                    continue;
                }
                let print = key.map(|k| seen::fingerprint(k));
                match print.map(|p| s.seen.check(release, p, now)) {
                    Some(Seen::Held) => {
                        copies.entry(release).or_default().push(i as u32);
                        continue;
                    }
                    Some(Seen::Released) => {
                        covered_rows.push(i as u32);
                        continue;
                    }
                    Some(Seen::Covered) => {
                        // Counted (or dead-lettered) by an earlier run that recorded its
                        // windows: acknowledged as soon as the batch is sealed, row by row,
                        // not when the batch's other rows are (a late row of the same batch
                        // can wait for its letter's flush point, a held one for its window).
                        covered += 1;
                        marker_covered.push(i as u32);
                        continue;
                    }
                    Some(Seen::New) | None => {}
                }
                if release <= self.closed {
                    // A copy of a message an earlier run let go of was found above (its
                    // covered set); without a message id, or under a marker without covered
                    // sets, the frontier alone says it.
                    if self.covered_through.is_some_and(|c| release <= c)
                        && (self.covered_by_frontier || print.is_none())
                    {
                        covered += 1;
                    } else {
                        late.push((i, "late: its windows were already emitted", Some(release)));
                    }
                    continue;
                }
                if let (Some(p), Some(_)) = (print, &handle) {
                    s.seen.hold(release, p);
                }
                on_time.push(i as u32);
                on_time_times.push(t);
                releases.entry(release).or_default().push(i as u32);
            }
            // A copy is held under the same lock that found its original held, so the keeper
            // cannot release that window between the two.
            let copied: u64 = copies.values().map(|r| r.len() as u64).sum();
            if let Some(handle) = &handle
                && copied > 0
            {
                handle.retain(copied)?;
                for (release, rows) in copies {
                    s.held
                        .entry(release)
                        .or_default()
                        .push((handle.clone(), rows));
                }
            }
            copied
        };
        let letter_copied = letter_copies.len() as u64;
        if let Some(handle) = &handle
            && letter_copied > 0
        {
            handle.retain(letter_copied)?;
            self.dead_lettered
                .push((handle.clone(), letter_copies, Vec::new()));
        }
        let copies_covered = covered_rows.len() as u64;
        if let Some(handle) = &handle
            && !covered_rows.is_empty()
        {
            // Acknowledged as soon as the input seals the batch, not with the batch's held
            // rows: a copy waiting minutes would lapse and come back again and again.
            handle.retain(copies_covered)?;
            self.covered_copies.push((handle.clone(), covered_rows));
        }
        if let Some(handle) = &handle
            && !marker_covered.is_empty()
        {
            handle.retain(marker_covered.len() as u64)?;
            self.covered_copies.push((handle.clone(), marker_covered));
        }
        if copied + copies_covered + letter_copied > 0 {
            self.run
                .counters
                .copies
                .fetch_add(copied + copies_covered + letter_copied, Ordering::Relaxed);
            tracing::debug!(
                source = %self.source.describe,
                held = copied,
                covered = copies_covered,
                with_their_letters = letter_copied,
                "message(s) delivered again while this run counted them: not counted again"
            );
        }
        self.open
            .add(&batch, &on_time, &on_time_times, self.closed)?;
        self.run
            .counters
            .covered
            .fetch_add(covered, Ordering::Relaxed);
        if let Some(handle) = &handle {
            let held = on_time.len() as u64;
            if held > 0 {
                handle.retain(held)?;
                let mut s = self.run.lock();
                for (release, rows) in releases {
                    s.held
                        .entry(release)
                        .or_default()
                        .push((handle.clone(), rows));
                }
                drop(s);
            }
            if held + copied > 0 {
                handle.hold();
            }
        }
        if !late.is_empty() {
            self.late(&batch, &late, handle.as_ref()).await?;
        }
        if let Some(handle) = &handle {
            // Held for minutes from here: the message ids are not asked for again.
            handle.forget_row_keys();
        }
        Ok(())
    }

    /// Late rows (and rows without an event time) follow the source's failure policy. Under
    /// `drop` and `dead_letter`, the late rows' message ids are recorded in the marker first
    /// ([`Self::record_late`]), so that a later run finds them late too.
    async fn late(
        &mut self,
        batch: &RecordBatch,
        rows: &[(usize, &'static str, Option<i64>)],
        handle: Option<&Arc<dyn DeliveryHandle>>,
    ) -> Result<()> {
        let n = rows.len() as u64;
        self.run.counters.late.fetch_add(n, Ordering::Relaxed);
        if matches!(self.source.failure_policy, FailurePolicy::Fail) {
            let (row, why, _) = rows[0];
            return Err(Error::Unsupported(format!(
                "{}: row {row} of a batch is {why} (column '{}'; allowed_lateness {:?}; \
                 failure_policy = 'fail': set failure_policy = 'drop' or 'dead_letter' to let \
                 late rows pass; its message is not acknowledged)",
                self.source.describe,
                self.window.time_column,
                self.source.event_time.allowed_lateness
            )));
        }
        let keys = self.record_late(rows, handle).await?;
        match self.source.failure_policy {
            FailurePolicy::Fail => Ok(()),
            FailurePolicy::Drop => {
                tracing::warn!(
                    source = %self.source.describe,
                    rows = n,
                    column = %self.window.time_column,
                    "late row(s) dropped (failure_policy = 'drop'): their windows were already emitted"
                );
                // Not retained: the batch's handle counts them as handled, as a filter would.
                self.late_settled(&keys);
                Ok(())
            }
            FailurePolicy::DeadLetter => {
                if let Some(h) = handle {
                    h.retain(n)?;
                }
                let sink = self.dead_letter_sink().await?;
                for &(row, why, _) in rows {
                    sink.write(DeadRow {
                        destination: self.source.describe.clone(),
                        class: DeadClass::Late,
                        code: None,
                        message: format!(
                            "{why} (event time column '{}', allowed_lateness {:?})",
                            self.window.time_column, self.source.event_time.allowed_lateness
                        ),
                        attempts: 0,
                        data: DeadPayload {
                            payload: None,
                            row: Some(row_json(batch, row)?),
                        },
                    })
                    .await?;
                }
                if let Some(h) = handle {
                    let indices: Vec<u32> = rows.iter().map(|&(r, _, _)| r as u32).collect();
                    if matches!(
                        self.source.dead_letter,
                        Some(dead_letter::DeadLetterTarget::Path { .. })
                    ) {
                        // Stored once the object is completed, at the end of the run.
                        self.dead_lettered.push((h.clone(), indices, keys));
                    } else {
                        h.settle_rows(&indices, Delivery::DeadLettered);
                        self.late_settled(&keys);
                    }
                }
                Ok(())
            }
        }
    }

    /// Records the message ids of the late `rows` (those with an event time) in the marker
    /// and waits until it is written, before anything of them is stored or acknowledged: a
    /// run killed after that finds them late again, even when it recomputes their windows
    /// (without it, the next run could count a late row in a recomputed window, or
    /// acknowledge it as covered with no letter stored). Returns the ids recorded (none when
    /// the input names no message ids).
    async fn record_late(
        &mut self,
        rows: &[(usize, &'static str, Option<i64>)],
        handle: Option<&Arc<dyn DeliveryHandle>>,
    ) -> Result<Vec<String>> {
        let timed: Vec<(u32, i64)> = rows
            .iter()
            .filter_map(|&(r, _, release)| release.map(|t| (r as u32, t)))
            .collect();
        if timed.is_empty() {
            return Ok(Vec::new());
        }
        let Some(keys) =
            handle.and_then(|h| h.row_keys(&timed.iter().map(|&(r, _)| r).collect::<Vec<_>>()))
        else {
            tracing::warn!(
                source = %self.source.describe,
                rows = timed.len(),
                "late row(s) not recorded in the progress marker: the input names no message ids"
            );
            return Ok(Vec::new());
        };
        tracing::info!(
            source = %self.source.describe,
            rows = keys.len(),
            "late row(s) recorded in the progress marker before their letters and acknowledgements"
        );
        let version = {
            let mut s = self.run.lock();
            for (key, &(_, release)) in keys.iter().zip(&timed) {
                s.late.insert(
                    key.clone(),
                    LateRow {
                        release,
                        settled: false,
                        inherited: false,
                    },
                );
            }
            s.late_version += 1;
            s.late_version
        };
        self.run.changed.notify_waiters();
        loop {
            let notified = self.run.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let s = self.run.lock();
                if s.late_recorded >= version {
                    break;
                }
                if let Some(e) = &s.error {
                    return Err(Error::Progress {
                        marker: self.marker_url.clone(),
                        message: e.clone(),
                    });
                }
                if s.finished {
                    break;
                }
            }
            notified.await;
        }
        Ok(keys)
    }

    /// The late rows of `keys` are settled (their letters stored, or dropped): the marker
    /// forgets them once their windows are recorded as delivered.
    fn late_settled(&self, keys: &[String]) {
        if keys.is_empty() {
            return;
        }
        let mut s = self.run.lock();
        for key in keys {
            if let Some(row) = s.late.get_mut(key) {
                row.settled = true;
            }
        }
    }

    /// Completes the dead-letter object (at a flush point, going on with a new one; at the
    /// end, for good), then settles the late rows written to it.
    async fn complete_dead_letters(&mut self, last: bool) -> Result<()> {
        if last {
            if let Some(sink) = self.dead_letter.take() {
                sink.finish().await?;
            }
        } else if let Some(sink) = &self.dead_letter {
            sink.roll().await?;
        }
        let mut stored = Vec::new();
        for (handle, rows, keys) in self.dead_lettered.drain(..) {
            handle.settle_rows(&rows, Delivery::DeadLettered);
            stored.extend(keys);
        }
        self.late_settled(&stored);
        Ok(())
    }

    async fn dead_letter_sink(&mut self) -> Result<Arc<dyn DeadLetterSink>> {
        if let Some(s) = &self.dead_letter {
            return Ok(s.clone());
        }
        let Some(target) = &self.source.dead_letter else {
            return Err(Error::Unsupported(
                "internal: dead_letter policy without a target".into(),
            ));
        };
        let sink = dead_letter::open(
            target,
            DeadLetterContext {
                connector: self.source.connector,
                table: self.source.table.clone(),
                statement: self.statement.clone(),
                writer: 0,
                runtime: Some(self.runtime.clone()),
            },
        )
        .await?;
        self.dead_letter = Some(sink.clone());
        Ok(sink)
    }

    /// The statement's watermark: the least greatest event time of the partitions that are
    /// not idle; `None` while a partition that is not idle has delivered nothing. When every
    /// partition is idle, the greatest of them (none holds the others back), as Flink's
    /// watermark valve does.
    fn watermark(&self) -> Option<i64> {
        let idle = self.source.event_time.idle_timeout;
        let now = Instant::now();
        let mut least: Option<i64> = None;
        let mut any_active = false;
        let marks: Vec<Mark> = self
            .marks
            .iter()
            .zip(&self.clocks)
            .map(|(mark, clock)| match clock {
                Some(c) => Mark {
                    max: c.max(),
                    seen: c.last(),
                },
                None => *mark,
            })
            .collect();
        for mark in &marks {
            let since = mark.seen.unwrap_or(self.started_at);
            if now.duration_since(since) >= idle {
                continue;
            }
            any_active = true;
            let max = mark.max?;
            least = Some(least.map_or(max, |l| l.min(max)));
        }
        if any_active {
            least
        } else {
            marks.iter().filter_map(|m| m.max).max()
        }
    }

    /// Emits every window the watermark closed.
    fn advance(&mut self) -> Result<()> {
        if self.hold_until.is_some_and(|until| Instant::now() < until) {
            return Ok(());
        }
        if self.hold_until.take().is_some() {
            // What the previous run found late came back during the hold, if at all: the
            // marker keeps only what this run found late (again).
            let mut s = self.run.lock();
            let before = s.late.len();
            s.late.retain(|_, row| !row.inherited);
            if s.late.len() != before {
                s.late_version += 1;
            }
        }
        let watermark = match (self.watermark(), self.floor) {
            (Some(w), Some(f)) => w.max(f),
            (Some(w), None) => w,
            (None, Some(f)) => f,
            (None, None) => return Ok(()),
        };
        let raised = {
            let mut s = self.run.lock();
            let raised = s.watermark.is_none_or(|old| watermark > old);
            s.watermark = Some(s.watermark.map_or(watermark, |old| old.max(watermark)));
            raised
        };
        if raised {
            // The keeper may record it, releasing what the clocks hold for it.
            self.run.changed.notify_waiters();
        }
        let lateness =
            i64::try_from(self.source.event_time.allowed_lateness.as_nanos()).unwrap_or(i64::MAX);
        let close = watermark.saturating_sub(lateness);
        if close <= self.closed {
            return Ok(());
        }
        let emitted = self.open.close_through(close)?;
        let mut batches = Vec::with_capacity(emitted.len());
        for window in emitted {
            batches.push(self.output(window)?);
        }
        self.closed = close;
        self.run.open_round(close, batches.len());
        for batch in batches {
            self.run.counters.windows.fetch_add(1, Ordering::Relaxed);
            self.run
                .counters
                .rows
                .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
            let ticket = Arc::new(WindowTicket::new(close, &self.run));
            self.pending.push_back((batch, ticket));
        }
        Ok(())
    }

    /// One window's rows in the aggregate's output layout.
    fn output(&self, window: Emitted) -> Result<RecordBatch> {
        let rows = window
            .values
            .first()
            .map(|v| v.len())
            .or_else(|| window.keys.first().map(|k| k.len()))
            .unwrap_or(0);
        let value = window_value(&self.window.value, window.start, window.end, rows)?;
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        let mut keys = window.keys.into_iter();
        let groups = self.keys + 1;
        for i in 0..groups {
            if i == self.window.position {
                columns.push(value.clone());
            } else if let Some(k) = keys.next() {
                columns.push(k);
            }
        }
        columns.extend(window.values);
        let columns = columns
            .into_iter()
            .zip(self.schema.fields())
            .map(|(c, f)| {
                if c.data_type() == f.data_type() {
                    Ok(c)
                } else {
                    cast(&c, f.data_type())
                }
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(DataFusionError::from)?;
        Ok(RecordBatch::try_new(self.schema.clone(), columns).map_err(DataFusionError::from)?)
    }
}

/// The event time of every row of `batch` (ns since the epoch; `None` for a null).
fn event_times(window: &WindowColumn, batch: &RecordBatch) -> Result<Vec<Option<i64>>> {
    let values = window.time.evaluate(batch)?.into_array(batch.num_rows())?;
    let tz = match values.data_type() {
        DataType::Timestamp(_, tz) => tz.clone(),
        other => {
            return Err(Error::Unsupported(format!(
                "the event time column '{}' is {other}, not a TIMESTAMP",
                window.time_column
            )));
        }
    };
    let ns = cast(&values, &DataType::Timestamp(TimeUnit::Nanosecond, tz))
        .map_err(DataFusionError::from)?;
    let ns = ns.as_primitive::<TimestampNanosecondType>();
    Ok(ns.iter().collect())
}

/// The window's group value, repeated `rows` times.
fn window_value(value: &WindowValue, start: i64, end: i64, rows: usize) -> Result<ArrayRef> {
    let repeat = |v: i64| Arc::new(TimestampNanosecondArray::from(vec![v; rows])) as ArrayRef;
    Ok(match value {
        WindowValue::Start(ty) => cast(&repeat(start), ty).map_err(DataFusionError::from)?,
        WindowValue::Bounds(fields) => {
            let mut columns = Vec::with_capacity(2);
            for (field, v) in fields.iter().zip([start, end]) {
                columns.push(cast(&repeat(v), field.data_type()).map_err(DataFusionError::from)?);
            }
            Arc::new(
                StructArray::try_new(fields.clone(), columns, None)
                    .map_err(DataFusionError::from)?,
            )
        }
    })
}

/// Row `row` of `batch` as a JSON object, for a dead letter.
fn row_json(batch: &RecordBatch, row: usize) -> Result<serde_json::Map<String, serde_json::Value>> {
    let mut out = serde_json::Map::new();
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        let mut encoder = crate::encode::json::ColumnEncoder::new(field.name(), column.as_ref())?;
        let mut text = Vec::new();
        encoder.write_json(row, &mut text);
        let value = serde_json::from_slice(&text).unwrap_or(serde_json::Value::Null);
        out.insert(field.name().clone(), value);
    }
    Ok(out)
}

/// Keeps the progress marker: records each delivered frontier that has held rows to release,
/// then settles those rows (their messages may then be acknowledged). Ends once the node's
/// stream ended and every emitted batch was settled or dropped.
/// Stores the covered set of `frontier`: the messages held under releases at or before it,
/// and the late rows whose letters are stored that its record lets the marker forget. Listed
/// from the next marker on. A frontier that lets go of nothing stores no set. Returns the late
/// rows the set names, which are the ones the record may forget (a row settled meanwhile is
/// forgotten with a later frontier, whose set names it); `None` when no sets are kept.
async fn store_covered(
    run: &Run,
    marker: &Marker,
    frontier: i64,
) -> Result<Option<BTreeSet<String>>> {
    let (set, late) = {
        let s = run.lock();
        if s.keep_covered.is_zero() {
            return Ok(None);
        }
        let settled: Vec<(&String, i64)> = s
            .late
            .iter()
            .filter(|(_, row)| row.settled && row.release <= frontier)
            .map(|(id, row)| (id, row.release))
            .collect();
        let (releases, messages) = s.seen.held_through_count(frontier);
        let mut set =
            CoveredBytes::with_capacity(releases + settled.len(), messages + settled.len());
        s.seen.store_through(frontier, &mut set);
        for (id, release) in &settled {
            set.push(*release, std::iter::once(seen::fingerprint(id)));
        }
        let late: BTreeSet<String> = settled.into_iter().map(|(id, _)| id.clone()).collect();
        (set, late)
    };
    if set.messages() == 0 {
        return Ok(Some(late));
    }
    marker.write_covered(frontier, set).await?;
    let mut s = run.lock();
    if s.covered_sets.back().is_none_or(|(_, f)| *f != frontier) {
        s.covered_sets.push_back((Instant::now(), frontier));
    }
    Ok(Some(late))
}

async fn keep(run: Arc<Run>, marker: Marker) {
    let mut last_write: Option<Instant> = None;
    loop {
        let notified = run.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let (target, watermark_only, done, late_due) = {
            let s = run.lock();
            // Late rows wait for the marker to name them: written at once.
            let late_due = s.late_version > s.late_recorded;
            let target = s.delivered.filter(|d| {
                s.recorded.is_none_or(|r| *d > r) && s.held.range(..=*d).next().is_some()
            });
            // A watermark the clocks hold batches for, not yet recorded.
            let watermark_only = s.watermark.filter(|w| {
                s.recorded_watermark.is_none_or(|r| *w > r)
                    && run
                        .clocks
                        .iter()
                        .any(|c| c.gated_until().is_some_and(|g| g <= *w))
            });
            let done = s.finished && s.rounds.values().all(|r| r.pending == 0);
            (target, watermark_only, done, late_due)
        };
        // The marker is written at least this often while the run goes, so another run of
        // the pipeline sees it is alive.
        let refresh =
            !done && last_write.is_none_or(|at| at.elapsed() >= super::progress::REFRESH_EVERY);
        if target.is_none()
            && !done
            && !refresh
            && !late_due
            && watermark_only.is_some()
            && let Some(wait) = last_write
                .map(|at| (at + WATERMARK_WRITES_EVERY).saturating_duration_since(Instant::now()))
                .filter(|wait| !wait.is_zero())
        {
            // A watermark alone is recorded at most this often (an object store allows about
            // one write a second to an object); a frontier is recorded at once.
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = notified.as_mut() => {}
            }
            continue;
        }
        if target.is_some() || late_due || (!done && (watermark_only.is_some() || refresh)) {
            let frontier = target.or(run.lock().recorded);
            // The messages this frontier lets go of are stored first, so that the next run
            // after a kill acknowledges exactly them as covered (ADR 0068).
            let mut stored_late = None;
            if let Some(f) = target {
                match store_covered(&run, &marker, f).await {
                    Ok(late) => stored_late = late,
                    Err(e) => return run.keeper_failed(&marker, &e),
                }
            }
            let expired = run.lock().expire_covered(Instant::now());
            let mut attempt = 0;
            let written = loop {
                attempt += 1;
                let (watermark, late, late_version, covered) = {
                    let s = run.lock();
                    (
                        s.watermark,
                        s.late_for_marker(),
                        s.late_version,
                        s.covered_list(),
                    )
                };
                match marker.record(frontier, watermark, &late, &covered).await {
                    Ok(()) => {
                        {
                            let mut s = run.lock();
                            s.late_recorded = s.late_recorded.max(late_version);
                        }
                        // Late rows waiting for the marker may go on.
                        run.changed.notify_waiters();
                        break Ok(watermark);
                    }
                    Err(e) if attempt < 5 => {
                        tracing::warn!(marker = %marker.url(), attempt, "the progress marker was not written, trying again: {e}");
                        tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                    }
                    Err(e) => break Err(e),
                }
            };
            last_write = Some(Instant::now());
            let watermark = match written {
                Ok(watermark) => watermark,
                Err(e) => return run.keeper_failed(&marker, &e),
            };
            run.watermark_recorded(watermark);
            if let Err(e) = marker.delete_covered(&expired).await {
                // Left behind, a set is swept by the next run's start.
                tracing::warn!(marker = %marker.url(), "{e}");
            }
            let Some(frontier) = target else {
                continue;
            };
            let released = {
                let mut s = run.lock();
                s.recorded = Some(frontier);
                // A settled late row whose windows are recorded comes back covered: forgotten
                // (a copy within the run is recognised for a while, as a counted row's is),
                // once the covered set of this frontier names it.
                let forget = |id: &String, row: &LateRow| {
                    row.settled
                        && row.release <= frontier
                        && stored_late.as_ref().is_none_or(|ids| ids.contains(id))
                };
                let forgotten: Vec<(i64, u128)> = s
                    .late
                    .iter()
                    .filter(|(id, row)| forget(id, row))
                    .map(|(id, row)| (row.release, seen::fingerprint(id)))
                    .collect();
                s.late.retain(|id, row| !forget(id, row));
                s.seen.release_through(frontier, Instant::now(), forgotten);
                let later = s.held.split_off(&(frontier.saturating_add(1)));
                std::mem::replace(&mut s.held, later)
            };
            for (handle, rows) in released.into_values().flatten() {
                handle.settle_rows(&rows, Delivery::Dropped);
            }
            continue;
        }
        if done {
            let (graceful, recorded, watermark, covered) = {
                let mut s = run.lock();
                let expired = s.expire_covered(Instant::now());
                (
                    s.graceful,
                    s.recorded,
                    s.watermark,
                    (s.covered_list(), expired),
                )
            };
            if graceful {
                let (covered, expired) = covered;
                match marker.close(recorded, watermark, &covered).await {
                    Ok(()) => {
                        run.watermark_recorded(watermark);
                        if let Err(e) = marker.delete_covered(&expired).await {
                            tracing::warn!(marker = %marker.url(), "{e}");
                        }
                    }
                    Err(e) => {
                        tracing::warn!(marker = %marker.url(), "the progress marker could not say the run ended gracefully (the next run waits for redeliveries): {e}");
                    }
                }
            }
            // What the clocks still hold (past the last watermark recorded) is handed back.
            run.ungate();
            return;
        }
        let refresh_at = last_write.unwrap_or_else(Instant::now) + super::progress::REFRESH_EVERY;
        tokio::select! {
            _ = notified => {}
            _ = tokio::time::sleep_until(refresh_at) => {}
        }
    }
}
