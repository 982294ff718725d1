//! The physical plan of an `INSERT INTO` a sink table: one writer per partition, and one node
//! that adds their counts up.
//!
//! ```text
//! SinkCountExec              one partition: the statement's `count` row
//!   CoalescePartitionsExec   (added by DataFusion: the count needs one partition)
//!     SinkWriterExec         one writer per partition, each with its own flow-control core
//!       RepartitionExec      (added by DataFusion when the sink routes by key:
//!                             hash of the key columns, order-preserving)
//!         ...input...
//! ```
//!
//! [`SinkWriterExec`] states what it needs from its input and lets DataFusion's optimizer
//! provide it: rows with equal key columns in one partition (a Pub/Sub ordering key, a Bigtable
//! row key), and, when the input is ordered (an `ORDER BY`), that order kept within each
//! partition. Each of its output partitions runs one writer and yields one row, the rows that
//! writer's service acknowledged; [`SinkCountExec`] sums them.
//!
//! The writers of one statement share a [`StopSignal`]: when one fails, the others read and
//! send nothing new and settle what they sent, and the failed writer's error counts the rows
//! acknowledged and not delivered over every writer, as a single writer's error does.

use std::fmt;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{Array, RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{
    Distribution, EquivalenceProperties, LexOrdering, LexRequirement, OrderingRequirements,
    Partitioning, PhysicalExpr,
};
use datafusion::physical_plan::execution_plan::{
    Boundedness, ChildrenPropertiesMode, ReplaceChildrenOptions, check_not_null_constraints,
    execute_input_stream,
};
use datafusion::physical_plan::expressions::Column;
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use futures::StreamExt;
use tokio::sync::Notify;

use super::control::StatementControl;
use super::spec::SinkSpec;
use crate::connectors::{Routing, SinkConnector};
use crate::core::run::WriterContext;
use crate::core::{SinkMetrics, StopKind, StopSignal};
use crate::error::Error;

/// Name of the gauge that holds how many writers the statement ran.
pub const WRITERS_METRIC: &str = "writers";

/// The schema of what an `INSERT` returns: one `count` column, as DataFusion's own sinks.
fn count_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        "count",
        DataType::UInt64,
        false,
    )]))
}

fn count_batch(schema: &SchemaRef, count: u64) -> DFResult<RecordBatch> {
    Ok(RecordBatch::try_new(
        schema.clone(),
        vec![Arc::new(UInt64Array::from(vec![count]))],
    )?)
}

/// The writers of one statement, as they start and end: the failed one waits for the others to
/// settle before it reports the counts over all of them.
#[derive(Debug)]
struct Statement {
    /// Names the statement's dead-letter objects.
    id: Arc<str>,
    stop: StopSignal,
    tally: Mutex<Tally>,
    ended: Notify,
}

impl Default for Statement {
    fn default() -> Self {
        Statement {
            id: crate::core::run::new_statement_id().into(),
            stop: StopSignal::default(),
            tally: Mutex::default(),
            ended: Notify::default(),
        }
    }
}

#[derive(Debug, Default)]
struct Tally {
    /// Writers started and not yet ended.
    running: usize,
    acknowledged: u64,
    not_delivered: u64,
    dead_lettered: u64,
}

impl Statement {
    fn tally(&self) -> std::sync::MutexGuard<'_, Tally> {
        self.tally.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A writer starts: the returned guard ends it (with no rows) if it is dropped before it
    /// reported its counts.
    fn start(self: &Arc<Self>) -> Running {
        self.tally().running += 1;
        Running {
            statement: Some(self.clone()),
        }
    }

    /// Waits until every writer that started has ended.
    async fn all_ended(&self) {
        loop {
            let notified = self.ended.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.tally().running == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// One running writer of a [`Statement`].
struct Running {
    statement: Option<Arc<Statement>>,
}

impl Running {
    /// The writer ended with these counts.
    fn end(mut self, acknowledged: u64, not_delivered: u64, dead_lettered: u64) -> Arc<Statement> {
        let statement = self.statement.take().expect("a writer ends once");
        {
            let mut tally = statement.tally();
            tally.running -= 1;
            tally.acknowledged += acknowledged;
            tally.not_delivered += not_delivered;
            tally.dead_lettered += dead_lettered;
        }
        statement.ended.notify_waiters();
        statement
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(statement) = self.statement.take() {
            statement.tally().running -= 1;
            statement.ended.notify_waiters();
        }
    }
}

/// Runs a sink's writers, one per output partition, over the partitions of its input.
///
/// It asks its input for the distribution the sink's [`Routing`] needs (rows with equal key
/// columns in one partition) and, when the sink keeps order and the input is ordered, for that
/// ordering within each partition. With `sink_parallelism` below the input's partition count,
/// writer `w` reads input partitions `w`, `w + writers`, ... in turn (a key stays on one
/// writer, in order).
#[derive(Debug)]
pub struct SinkWriterExec {
    table: String,
    sink: Arc<dyn SinkConnector>,
    input: Arc<dyn ExecutionPlan>,
    routing: Routing,
    key_exprs: Vec<Arc<dyn PhysicalExpr>>,
    ordering: Option<LexOrdering>,
    /// Columns after the table's that carry the ordering to the writers (see
    /// [`super::order`]); dropped before a row is encoded.
    hidden: usize,
    writers: usize,
    metrics: ExecutionPlanMetricsSet,
    statement: Arc<Statement>,
    properties: Arc<PlanProperties>,
    spec: Option<Arc<SinkSpec>>,
}

impl SinkWriterExec {
    /// The writers of `sink` (reported as table `table`) over `input`, whose schema is the
    /// table's. The input's ordering, when it has one and the sink keeps order, becomes the
    /// ordering every writer requires.
    pub fn try_new(
        table: String,
        sink: Arc<dyn SinkConnector>,
        input: Arc<dyn ExecutionPlan>,
    ) -> DFResult<Self> {
        let routing = sink.routing();
        let ordering = if routing.keep_order {
            input.properties().output_ordering().cloned()
        } else {
            None
        };
        Self::with_ordering(table, sink, input, routing, ordering)
    }

    /// The writers of `sink` over `input` with the ordering they require given (`None`: none),
    /// as a plan codec rebuilds a node whose input is another process's (a shuffle that
    /// does not report the ordering it keeps).
    pub fn try_new_with_ordering(
        table: String,
        sink: Arc<dyn SinkConnector>,
        input: Arc<dyn ExecutionPlan>,
        ordering: Option<LexOrdering>,
    ) -> DFResult<Self> {
        let routing = sink.routing();
        Self::with_ordering(table, sink, input, routing, ordering)
    }

    /// Keeps what rebuilds the sink in another process (see [`SinkSpec`]); a plan without it
    /// cannot be sent to a cluster.
    pub fn with_spec(mut self, spec: Option<Arc<SinkSpec>>) -> Self {
        self.spec = spec;
        self
    }

    /// What rebuilds the sink in another process, if the table was declared in SQL.
    pub fn spec(&self) -> Option<&Arc<SinkSpec>> {
        self.spec.as_ref()
    }

    /// The ordering every writer requires of its input partitions, if any.
    pub fn ordering(&self) -> Option<&LexOrdering> {
        self.ordering.as_ref()
    }

    fn with_ordering(
        table: String,
        sink: Arc<dyn SinkConnector>,
        input: Arc<dyn ExecutionPlan>,
        routing: Routing,
        ordering: Option<LexOrdering>,
    ) -> DFResult<Self> {
        let schema = input.schema();
        let key_exprs = routing
            .key_columns
            .iter()
            .map(|name| {
                let index = schema.index_of(name).map_err(|_| {
                    DataFusionError::Plan(format!(
                        "the {} sink routes rows by column '{name}', which the INSERT's input \
                         of table '{table}' does not have",
                        sink.kind().name()
                    ))
                })?;
                Ok(Arc::new(Column::new(name, index)) as Arc<dyn PhysicalExpr>)
            })
            .collect::<DFResult<Vec<_>>>()?;
        let visible = sink.schema().fields().len();
        if schema.fields().len() < visible {
            return Err(DataFusionError::Plan(format!(
                "the INSERT's input of table '{table}' has {} column(s), the table {visible}",
                schema.fields().len()
            )));
        }
        let hidden = schema.fields().len() - visible;
        let partitions = input.output_partitioning().partition_count().max(1);
        let writers = sink
            .parallelism()
            .map_or(partitions, |p| p.clamp(1, partitions));
        let boundedness = match input.boundedness() {
            Boundedness::Bounded => Boundedness::Bounded,
            Boundedness::Unbounded { .. } => Boundedness::Unbounded {
                requires_infinite_memory: false,
            },
        };
        let properties = PlanProperties::new(
            EquivalenceProperties::new(count_schema()),
            Partitioning::UnknownPartitioning(writers),
            // As DataFusion's own sinks: an unbounded input is not a pipeline breaker here,
            // since the writers run as rows come.
            input.pipeline_behavior(),
            boundedness,
        );
        Ok(SinkWriterExec {
            table,
            sink,
            input,
            routing,
            key_exprs,
            ordering,
            hidden,
            writers,
            metrics: ExecutionPlanMetricsSet::new(),
            statement: Arc::default(),
            properties: Arc::new(properties),
            spec: None,
        })
    }

    /// The table written to.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The sink the writers write to.
    pub fn sink(&self) -> &Arc<dyn SinkConnector> {
        &self.sink
    }

    /// How many writers run (the output partition count).
    pub fn writers(&self) -> usize {
        self.writers
    }

    /// How rows are spread over the writers.
    pub fn routing(&self) -> &Routing {
        &self.routing
    }

    /// The input: the rows to write.
    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }

    /// How many columns after the table's the input carries (the `ORDER BY` expressions the
    /// INSERT does not write, see [`super::order`]).
    pub fn hidden_columns(&self) -> usize {
        self.hidden
    }

    /// Input partition `partition` as the sink reads it: the table's columns only (the hidden
    /// ordering columns dropped), and no null in a column the table declares `NOT NULL`.
    fn input_stream(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        let schema = self.sink.schema().clone();
        if self.hidden == 0 {
            return execute_input_stream(self.input.clone(), schema, partition, context);
        }
        let visible: Vec<usize> = (0..schema.fields().len()).collect();
        let risky: Vec<usize> = schema
            .fields()
            .iter()
            .zip(self.input.schema().fields().iter())
            .enumerate()
            .filter_map(|(i, (table, input))| {
                (!table.is_nullable() && input.is_nullable()).then_some(i)
            })
            .collect();
        let stream = self.input.execute(partition, context)?;
        let out = schema.clone();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            schema,
            stream.map(move |batch| {
                let batch = batch?.project(&visible)?;
                let batch = check_not_null_constraints(batch, &risky)?;
                Ok(RecordBatch::try_new(out.clone(), batch.columns().to_vec())?)
            }),
        )))
    }

    /// Writes the input partitions of writer `ctx.writer` and returns the rows acknowledged.
    ///
    /// The statement's error (a writer failed, or a stop left rows undelivered) is returned by
    /// the writer it concerns once every writer has ended, with the counts over all of them;
    /// the other writers return what they acknowledged.
    async fn run_writer(
        sink: Arc<dyn SinkConnector>,
        input: SendableRecordBatchStream,
        metrics: SinkMetrics,
        running: Running,
        ctx: WriterContext,
    ) -> DFResult<u64> {
        let statement = running
            .statement
            .clone()
            .expect("a running writer has its statement");
        let result = sink.write_all(input, metrics, &ctx).await;
        let (source, acknowledged, not_delivered, dead_lettered) = match result {
            Ok(acknowledged) => {
                running.end(acknowledged, 0, 0);
                return Ok(acknowledged);
            }
            Err(Error::Incomplete {
                source,
                acknowledged,
                not_delivered,
                dead_lettered,
            }) => (source, acknowledged, not_delivered, dead_lettered),
            Err(other) => (Box::new(other), 0, 0, 0),
        };
        let (writer, writers) = (ctx.writer, ctx.writers);
        if matches!(*source, Error::Stopped { .. }) {
            if statement.stop.kind() == Some(StopKind::Settle) || not_delivered == 0 {
                // Stopped by another writer's failure (which reports these counts with its
                // own), or stopped on request with everything admitted delivered.
                running.end(acknowledged, not_delivered, dead_lettered);
                return Ok(acknowledged);
            }
        } else {
            if writers > 1 {
                // Debug: the statement's error, returned to the caller, names the failure.
                tracing::debug!(
                    writer = writer + 1,
                    writers,
                    "a writer of the statement failed; stopping the others"
                );
            }
            statement.stop.stop(
                StopKind::Settle,
                format!("writer {} of {writers} failed", writer + 1),
            );
        }
        let statement = running.end(acknowledged, not_delivered, dead_lettered);
        statement.all_ended().await;
        let (acknowledged, not_delivered, dead_lettered) = {
            let tally = statement.tally();
            (tally.acknowledged, tally.not_delivered, tally.dead_lettered)
        };
        Err(Error::Incomplete {
            source,
            acknowledged,
            not_delivered,
            dead_lettered,
        }
        .into())
    }
}

/// Passes a session's stop requests on to one statement's signal, until it is dropped.
struct Forward(Option<tokio::task::JoinHandle<()>>);

impl Forward {
    fn start(from: StopSignal, to: StopSignal) -> Self {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Forward(None);
        };
        Forward(Some(runtime.spawn(async move {
            let mut level = StopKind::Drain;
            loop {
                let kind = from.reaches(level).await;
                to.stop(
                    kind,
                    from.reason().unwrap_or_else(|| "stop requested".into()),
                );
                if kind == StopKind::Abort {
                    return;
                }
                level = StopKind::Abort;
            }
        })))
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

impl DisplayAs for SinkWriterExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SinkWriterExec: connector={} table={} writers={}",
            self.sink.kind().name(),
            self.table,
            self.writers
        )?;
        if self.routing.key_columns.is_empty() {
            write!(f, " routing=any")?;
        } else {
            write!(f, " routing=hash({})", self.routing.key_columns.join(", "))?;
        }
        if let Some(ordering) = &self.ordering {
            write!(f, " order=[{ordering}]")?;
        }
        if self.hidden > 0 {
            write!(f, " hidden_order_columns={}", self.hidden)?;
        }
        if matches!(t, DisplayFormatType::Verbose) {
            write!(
                f,
                " input_partitions={}",
                self.input.output_partitioning().partition_count()
            )?;
        }
        Ok(())
    }
}

impl ExecutionPlan for SinkWriterExec {
    fn name(&self) -> &'static str {
        "SinkWriterExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        if self.sink.parallelism() == Some(1) {
            // One writer, fed as DataFusion's own sinks are: the input merged, in its order.
            vec![Distribution::SinglePartition]
        } else if self.key_exprs.is_empty() {
            vec![Distribution::UnspecifiedDistribution]
        } else {
            vec![Distribution::KeyPartitioned(self.key_exprs.clone())]
        }
    }

    fn required_input_ordering(&self) -> Vec<Option<OrderingRequirements>> {
        vec![
            self.ordering
                .clone()
                .map(|o| OrderingRequirements::new(LexRequirement::from(o))),
        ]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        if self.sink.parallelism() == Some(1) {
            return vec![false];
        }
        // More partitions are more writers: every core encodes and sends. With a key, this is
        // also what makes DataFusion hash-partition an input that has one partition (an
        // `ORDER BY` merged into one) instead of keeping it whole.
        vec![true]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let input = only_child("SinkWriterExec", children)?;
        Ok(Arc::new(
            Self::with_ordering(
                self.table.clone(),
                self.sink.clone(),
                input,
                self.routing.clone(),
                self.ordering.clone(),
            )?
            .with_spec(self.spec.clone()),
        ))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
        )
    }

    fn reset_state(self: Arc<Self>) -> DFResult<Arc<dyn ExecutionPlan>> {
        // A fresh statement (and metrics) for a plan that runs again.
        Ok(Arc::new(
            Self::with_ordering(
                self.table.clone(),
                self.sink.clone(),
                self.input.clone(),
                self.routing.clone(),
                self.ordering.clone(),
            )?
            .with_spec(self.spec.clone()),
        ))
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DFResult<TreeNodeRecursion>,
    ) -> DFResult<TreeNodeRecursion> {
        let mut recursion = TreeNodeRecursion::Continue;
        for expr in &self.key_exprs {
            recursion = f(expr)?;
            if matches!(recursion, TreeNodeRecursion::Stop) {
                break;
            }
        }
        Ok(recursion)
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        if partition >= self.writers {
            return Err(DataFusionError::Internal(format!(
                "SinkWriterExec has {} writers, asked for partition {partition}",
                self.writers
            )));
        }
        let input_partitions = self.input.output_partitioning().partition_count();
        let schema = self.sink.schema().clone();
        let streams = (partition..input_partitions)
            .step_by(self.writers)
            .map(|p| self.input_stream(p, context.clone()))
            .collect::<DFResult<Vec<_>>>()?;
        let input: SendableRecordBatchStream = if streams.len() == 1 {
            streams.into_iter().next().expect("one stream")
        } else {
            Box::pin(RecordBatchStreamAdapter::new(
                schema,
                futures::stream::select_all(streams),
            ))
        };
        if partition == 0 {
            MetricBuilder::new(&self.metrics)
                .global_gauge(WRITERS_METRIC)
                .set(self.writers);
        }
        let metrics = SinkMetrics::for_partition(&self.metrics, partition);
        let control = context.session_config().get_extension::<StatementControl>();
        let ctx = WriterContext {
            writer: partition,
            writers: self.writers,
            stop: self.statement.stop.clone(),
            observer: control.as_ref().and_then(|c| c.observer()),
            statement: self.statement.id.clone(),
            table: Some(self.table.as_str().into()),
            runtime: Some(context.runtime_env()),
        };
        let user_stop = control.as_ref().map(|c| c.signal());
        let counted = control.map(|c| c.writer_running());
        let running = self.statement.start();
        let sink = self.sink.clone();
        let out = count_schema();
        let task = TaskLog {
            table: self.table.clone(),
            destination: self.spec.as_ref().map(|s| s.destination()),
            task: context.task_id(),
            partition,
            writers: self.writers,
        };
        let stream = futures::stream::once(async move {
            // The session's stop requests reach this writer for as long as it runs.
            let _forward = user_stop.map(|from| Forward::start(from, ctx.stop.clone()));
            let _counted = counted;
            let distributed = task.task.is_some();
            if !distributed {
                let result = Self::run_writer(sink, input, metrics, running, ctx).await;
                task.log(&result);
                return count_batch(&out, task.for_the_engine(result)?);
            }
            // A cluster's executor cancels a task (its job was cancelled, or another task of
            // the job failed) by dropping it. The writer therefore runs as a task of its own,
            // and a drop of this stream asks it to settle: read and send nothing more, wait for
            // the sends on the wire within `shutdown_timeout`, and log its counts, instead of
            // dropping the rows it has on the wire unaccounted for. Not a drain: a drain also
            // takes the rows its input holds ready, and a shuffle reader holds its whole
            // partition ready, so a drained writer went on sending for a minute after a cancel.
            task.started();
            let cancel = CancelOnDrop::new(ctx.stop.clone());
            let cancelled = cancel.cancelled.clone();
            // Ballista's cancel may not drop this stream (the task's work can run on a task of
            // its own), so the writer also watches its job and settles when the job ended.
            let job_watch = task
                .task
                .as_deref()
                .and_then(job_of_task)
                .zip(JOB_END_WATCH.get().cloned())
                .map(|(job, watch)| {
                    let (stop, cancelled) = (ctx.stop.clone(), cancelled.clone());
                    tokio::spawn(async move {
                        watch(job).await;
                        cancelled.store(true, std::sync::atomic::Ordering::SeqCst);
                        stop.stop(
                            StopKind::Settle,
                            "the job ended on the cluster (it was cancelled, or another task \
                             failed)",
                        );
                    })
                });
            let log = task.clone();
            let writer = tokio::spawn(async move {
                let result = Self::run_writer(sink, input, metrics, running, ctx).await;
                if let Some(watch) = job_watch {
                    watch.abort();
                }
                if cancelled.load(std::sync::atomic::Ordering::SeqCst) {
                    log.log_cancelled(&result);
                } else {
                    log.log(&result);
                }
                result
            });
            let joined = writer.await;
            cancel.disarm();
            let result = joined.map_err(|e| {
                DataFusionError::Execution(format!(
                    "the writer of partition {partition} of table '{}' ended abnormally: {e}",
                    task.table
                ))
            })?;
            count_batch(&out, task.for_the_engine(result)?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            count_schema(),
            stream,
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

impl TaskLog {
    /// The writer's result as the engine that runs it shows it. A distributed engine's task
    /// (one that has a task id: Ballista's) reports a failure with the error's debug form, so
    /// there the sink's error is handed over as its message; in this process it stays the
    /// sink's own error, which the SQL layer and the tool recognise.
    fn for_the_engine(&self, result: DFResult<u64>) -> DFResult<u64> {
        match result {
            Err(error) if self.task.is_some() => Err(DataFusionError::Execution(match error {
                DataFusionError::External(inner) => inner.to_string(),
                other => other.to_string(),
            })),
            other => other,
        }
    }
}

/// Waits until the cluster job of the given id has ended (cancelled, failed or done).
pub type JobEndWatch = Arc<dyn Fn(String) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

static JOB_END_WATCH: std::sync::OnceLock<JobEndWatch> = std::sync::OnceLock::new();

/// Installs, once per process, how a sink task of a cluster job learns that its job ended
/// while it runs: an executor of this crate asks its scheduler (Ballista's own cancel does not
/// reach a running sink writer). A sink writer whose job ended drains.
pub fn install_job_end_watch(watch: JobEndWatch) {
    let _ = JOB_END_WATCH.set(watch);
}

/// The job id in a Ballista task id (`TID <job>/<stage>.<attempt>/<partition>...`).
fn job_of_task(task: &str) -> Option<String> {
    task.strip_prefix("TID ")?
        .split('/')
        .next()
        .filter(|job| !job.is_empty())
        .map(str::to_string)
}

/// Settles a writer's statement when the engine drops the writer's stream before it
/// ended (a cluster's task cancelled by its scheduler).
struct CancelOnDrop {
    stop: Option<StopSignal>,
    cancelled: Arc<std::sync::atomic::AtomicBool>,
}

impl CancelOnDrop {
    fn new(stop: StopSignal) -> Self {
        CancelOnDrop {
            stop: Some(stop),
            cancelled: Arc::default(),
        }
    }

    /// The writer ended: a drop no longer means a cancel.
    fn disarm(mut self) {
        self.stop = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            self.cancelled
                .store(true, std::sync::atomic::Ordering::SeqCst);
            stop.stop(
                StopKind::Settle,
                "the task was cancelled by the cluster (its job was cancelled, or another task \
                 of the job failed)",
            );
        }
    }
}

/// What the log line of one sink task (one writer: a partition of the sink node) says.
#[derive(Clone)]
struct TaskLog {
    table: String,
    destination: Option<String>,
    task: Option<String>,
    partition: usize,
    writers: usize,
}

impl TaskLog {
    /// On a cluster: one info line per writer of a sink task as it starts.
    fn started(&self) {
        tracing::info!(
            table = %self.table,
            partition = self.partition,
            writers = self.writers,
            destination = self.destination.as_deref().unwrap_or("(declared in Rust)"),
            task = self.task.as_deref().unwrap_or("-"),
            "sink task started"
        );
    }

    /// On a cluster: the line of a writer whose task was cancelled and that settled, with the
    /// rows it had acknowledged (and, when what was on the wire did not all land, the error
    /// that counts them).
    fn log_cancelled(&self, result: &DFResult<u64>) {
        let destination = self.destination.as_deref().unwrap_or("(declared in Rust)");
        let task = self.task.as_deref().unwrap_or("-");
        match result {
            Ok(rows) => tracing::warn!(
                table = %self.table,
                partition = self.partition,
                writers = self.writers,
                rows,
                destination,
                task,
                "sink task cancelled: it sent nothing new and what was on the wire landed"
            ),
            Err(error) => tracing::warn!(
                table = %self.table,
                partition = self.partition,
                writers = self.writers,
                destination,
                task,
                %error,
                "sink task cancelled: it sent nothing new and not everything on the wire landed"
            ),
        }
    }

    /// One info line per writer that ended (on a cluster: per writer of each sink task an
    /// executor ran); for one that failed, a warning on a cluster and a debug line in this
    /// process (whose statement error says it). Names no row value.
    fn log(&self, result: &DFResult<u64>) {
        let destination = self.destination.as_deref().unwrap_or("(declared in Rust)");
        let task = self.task.as_deref().unwrap_or("-");
        match result {
            Ok(rows) => tracing::info!(
                table = %self.table,
                partition = self.partition,
                writers = self.writers,
                rows,
                destination,
                task,
                "sink task done"
            ),
            // On a cluster the executor's log is where a failed task is seen; in this
            // process the statement's own error says it, so the line stays below warn.
            Err(error) if self.task.is_some() => tracing::warn!(
                table = %self.table,
                partition = self.partition,
                writers = self.writers,
                destination,
                task,
                %error,
                "sink task failed"
            ),
            Err(error) => tracing::debug!(
                table = %self.table,
                partition = self.partition,
                writers = self.writers,
                destination,
                %error,
                "sink task failed"
            ),
        }
    }
}

/// The one input of a node with one, or an internal error naming `node`.
fn only_child(
    node: &str,
    mut children: Vec<Arc<dyn ExecutionPlan>>,
) -> DFResult<Arc<dyn ExecutionPlan>> {
    match (children.pop(), children.is_empty()) {
        (Some(input), true) => Ok(input),
        (popped, _) => Err(DataFusionError::Internal(format!(
            "{node} has one input, got {}",
            children.len() + usize::from(popped.is_some())
        ))),
    }
}

/// Adds up the per-writer counts of a [`SinkWriterExec`] into the statement's one `count` row.
#[derive(Debug)]
pub struct SinkCountExec {
    input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

impl SinkCountExec {
    /// Sums the `count` column of `input` (a [`SinkWriterExec`], coalesced).
    pub fn new(input: Arc<dyn ExecutionPlan>) -> Self {
        let properties = PlanProperties::new(
            EquivalenceProperties::new(count_schema()),
            Partitioning::UnknownPartitioning(1),
            input.pipeline_behavior(),
            input.boundedness(),
        );
        SinkCountExec {
            input,
            properties: Arc::new(properties),
        }
    }
}

impl DisplayAs for SinkCountExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SinkCountExec: sum of the writers' counts")
    }
}

impl ExecutionPlan for SinkCountExec {
    fn name(&self) -> &'static str {
        "SinkCountExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        vec![Distribution::SinglePartition]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let input = only_child("SinkCountExec", children)?;
        Ok(Arc::new(Self::new(input)))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
        )
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DFResult<TreeNodeRecursion>,
    ) -> DFResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "SinkCountExec has one partition, asked for {partition}"
            )));
        }
        let mut input = self.input.execute(0, context)?;
        let out = count_schema();
        let stream = futures::stream::once(async move {
            let mut total = 0u64;
            while let Some(batch) = input.next().await {
                let batch = batch?;
                let counts = batch
                    .column(0)
                    .as_any()
                    .downcast_ref::<UInt64Array>()
                    .ok_or_else(|| {
                        DataFusionError::Internal("a sink writer's count is not UInt64".into())
                    })?;
                total += counts.iter().flatten().sum::<u64>();
                debug_assert_eq!(counts.null_count(), 0);
            }
            count_batch(&out, total)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            count_schema(),
            stream,
        )))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use async_trait::async_trait;
    use datafusion::arrow::array::UInt32Array;
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
    use datafusion::physical_plan::collect;
    use datafusion::prelude::SessionContext;

    use super::*;
    use crate::connectors::{ConnectorKind, write_stream};
    use crate::core::{Envelope, FlowConfig, FlowWriter};
    use crate::testing::{FakeReply, FakeTransport};

    /// Rows of input partition `p` are `p * 1000 .. p * 1000 + 1000`.
    const ROWS_PER_PARTITION: u32 = 1000;

    /// A sink over the fake transport: each row is sent as its own value.
    #[derive(Debug)]
    struct FakeSink {
        schema: SchemaRef,
        fake: Arc<FakeTransport<u32>>,
        config: FlowConfig,
        routing: Routing,
        parallelism: Option<usize>,
        flush: crate::core::run::FlushSettings,
    }

    #[async_trait]
    impl SinkConnector for FakeSink {
        fn kind(&self) -> ConnectorKind {
            crate::connectors::pubsub::KIND
        }

        fn schema(&self) -> &SchemaRef {
            &self.schema
        }

        fn routing(&self) -> Routing {
            self.routing.clone()
        }

        fn parallelism(&self) -> Option<usize> {
            self.parallelism
        }

        async fn write_all(
            &self,
            input: SendableRecordBatchStream,
            metrics: SinkMetrics,
            ctx: &WriterContext,
        ) -> crate::Result<u64> {
            let writer = FlowWriter::new(self.fake.clone(), self.config.clone(), metrics);
            write_stream(writer, input, ctx, self.flush, |batch, _first, out| {
                let values = batch
                    .column(0)
                    .as_any()
                    .downcast_ref::<UInt32Array>()
                    .expect("u32 column");
                for v in values.values() {
                    out.push(Ok(Envelope {
                        record: *v,
                        bytes: 10,
                        destination: Arc::from("d"),
                        sequence_key: None,
                        serial_key: None,
                    }));
                }
                Ok(())
            })
            .await
        }
    }

    fn fake_sink(fake: Arc<FakeTransport<u32>>, parallelism: Option<usize>) -> Arc<FakeSink> {
        Arc::new(FakeSink {
            schema: Arc::new(Schema::new(vec![Field::new("n", DataType::UInt32, false)])),
            fake,
            config: FlowConfig {
                // Every row of a partition is admitted at once: nothing waits for room.
                max_in_flight_records: 10 * ROWS_PER_PARTITION as usize,
                shutdown_timeout: Duration::from_secs(3),
                ..crate::core::test_flow_config()
            },
            routing: Routing::any(),
            parallelism,
            flush: Default::default(),
        })
    }

    /// `partitions` input partitions of one batch each, under the sink's two nodes as
    /// DataFusion plans them.
    fn plan(sink: Arc<FakeSink>, partitions: u32) -> Arc<dyn ExecutionPlan> {
        let schema = sink.schema.clone();
        let batches: Vec<Vec<RecordBatch>> = (0..partitions)
            .map(|p| {
                let first = p * ROWS_PER_PARTITION;
                vec![
                    RecordBatch::try_new(
                        schema.clone(),
                        vec![Arc::new(UInt32Array::from_iter_values(
                            first..first + ROWS_PER_PARTITION,
                        ))],
                    )
                    .expect("batch"),
                ]
            })
            .collect();
        let input = MemorySourceConfig::try_new_exec(&batches, schema, None).expect("input");
        let writers = SinkWriterExec::try_new("t".into(), sink, input).expect("writers");
        Arc::new(SinkCountExec::new(Arc::new(CoalescePartitionsExec::new(
            Arc::new(writers),
        ))))
    }

    fn is_from_partition(record: u32, partition: u32) -> bool {
        record / ROWS_PER_PARTITION == partition
    }

    #[tokio::test]
    async fn the_count_is_the_sum_over_one_writer_per_partition() {
        let fake = Arc::new(FakeTransport::<u32>::new());
        let plan = plan(fake_sink(fake.clone(), None), 4);
        let batches = collect(plan.clone(), SessionContext::new().task_ctx())
            .await
            .expect("insert");
        let count = batches[0]
            .column(0)
            .as_any()
            .downcast_ref::<UInt64Array>()
            .expect("count")
            .value(0);
        assert_eq!(count, 4 * u64::from(ROWS_PER_PARTITION));
        // What the fake service received, independently of the counts.
        let mut delivered: Vec<u32> = fake.calls().into_iter().flat_map(|c| c.records).collect();
        delivered.sort_unstable();
        assert_eq!(delivered, (0..4 * ROWS_PER_PARTITION).collect::<Vec<_>>());
        let writers = &plan.children()[0].children()[0];
        assert_eq!(writers.output_partitioning().partition_count(), 4);
        let metrics = writers.metrics().expect("metrics");
        assert_eq!(
            metrics.sum_by_name(WRITERS_METRIC).map(|v| v.as_usize()),
            Some(4)
        );
        assert_eq!(
            metrics
                .sum_by_name(crate::core::metrics::names::RECORDS_ACKED)
                .map(|v| v.as_usize()),
            Some(4000)
        );
        // As EXPLAIN ANALYZE shows them: summed over the writers, bytes as sizes, the
        // summed RPC latency named as a sum.
        let shown = datafusion::physical_plan::display::DisplayableExecutionPlan::with_metrics(
            writers.as_ref(),
        )
        .one_line()
        .to_string();
        assert!(shown.contains("records_acked=4.00 K"), "{shown}");
        assert!(shown.contains("bytes_sent=39.1 KB"), "{shown}");
        assert!(shown.contains("rpc_latency_sum="), "{shown}");
        assert!(shown.contains("writers=4"), "{shown}");
    }

    #[tokio::test]
    async fn a_parallelism_below_the_partition_count_shares_partitions_between_writers() {
        let fake = Arc::new(FakeTransport::<u32>::new());
        let plan = plan(fake_sink(fake.clone(), Some(3)), 8);
        let writers = plan.children()[0].children()[0].clone();
        assert_eq!(writers.output_partitioning().partition_count(), 3);
        collect(plan, SessionContext::new().task_ctx())
            .await
            .expect("insert");
        let mut delivered: Vec<u32> = fake.calls().into_iter().flat_map(|c| c.records).collect();
        delivered.sort_unstable();
        assert_eq!(delivered, (0..8 * ROWS_PER_PARTITION).collect::<Vec<_>>());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_writer_stops_the_others_and_counts_every_writer() {
        let fake = Arc::new(FakeTransport::<u32>::new());
        // The third writer's sends are refused for good at once; the others' are acknowledged
        // a second later, so they are still on the wire when the third fails.
        fake.respond_with(|call| {
            if call.records.iter().any(|r| is_from_partition(*r, 2)) {
                FakeReply::code(tonic::Code::PermissionDenied)
            } else {
                FakeReply::Delay(Duration::from_secs(1), Box::new(FakeReply::Ok))
            }
        });
        let error = collect(
            plan(fake_sink(fake.clone(), None), 4),
            SessionContext::new().task_ctx(),
        )
        .await
        .expect_err("the third writer fails");
        let acked_by_service: u64 = fake
            .calls()
            .iter()
            .filter(|c| !c.records.iter().any(|r| is_from_partition(*r, 2)))
            .map(|c| c.records.len() as u64)
            .sum();
        let text = error.to_string();
        assert!(
            text.contains("PERMISSION_DENIED") || text.contains("PermissionDenied"),
            "{text}"
        );
        // The others settled the sends they had on the wire (acknowledged during the settle)
        // and sent nothing after the failure, so part of their rows never went out; every row
        // was admitted (one batch per partition, room for all), so what was not acknowledged
        // is reported as not delivered, over all four writers.
        assert!(
            acked_by_service > 0,
            "the other writers' sends on the wire settle"
        );
        assert!(acked_by_service < 3 * u64::from(ROWS_PER_PARTITION));
        let not_delivered = 4 * u64::from(ROWS_PER_PARTITION) - acked_by_service;
        assert!(
            text.contains(&format!(
                "{acked_by_service} row(s) were acknowledged before the failure; {not_delivered} admitted row(s) were not delivered"
            )),
            "{text}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn writers_stopped_by_a_failure_send_nothing_new() {
        let fake = Arc::new(FakeTransport::<u32>::new());
        // Writer 0 fails at once; the others' first sends stall until the settle gives up on
        // them: nothing they had not sent yet may go out after the failure.
        fake.respond_with(|call| {
            if call.records.iter().any(|r| is_from_partition(*r, 0)) {
                FakeReply::code(tonic::Code::PermissionDenied)
            } else {
                FakeReply::Stall
            }
        });
        let sink = fake_sink(fake.clone(), None);
        let error = collect(plan(sink, 4), SessionContext::new().task_ctx())
            .await
            .expect_err("writer 1 fails");
        let calls_at_failure = fake.calls().len();
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(
            fake.calls().len(),
            calls_at_failure,
            "a send after the failure"
        );
        let text = error.to_string();
        assert!(text.contains("0 row(s) were acknowledged"), "{text}");
        assert!(
            text.contains(&format!(
                "{} admitted row(s) were not delivered",
                4 * ROWS_PER_PARTITION
            )),
            "{text}"
        );
    }
}

#[cfg(test)]
mod plan_tests {
    use crate::sql::{new_context, run};

    /// The `EXPLAIN` text of `insert` after declaring `create`, at 4 target partitions.
    async fn explain(create: &str, insert: &str) -> String {
        let ctx = new_context();
        run(&ctx, "SET datafusion.execution.target_partitions = 4")
            .await
            .expect("set");
        run(&ctx, create).await.expect("create");
        let batches = run(&ctx, &format!("EXPLAIN {insert}"))
            .await
            .expect("explain");
        datafusion::arrow::util::pretty::pretty_format_batches(&batches)
            .expect("format")
            .to_string()
    }

    const ROWS: &str = "FROM generate_series(1, 100000)";

    #[tokio::test]
    async fn an_ordered_pubsub_sink_hash_partitions_by_ordering_key_over_four_writers() {
        let plan = explain(
            "CREATE TABLE t (id BIGINT, ordering_key VARCHAR) WITH (connector = 'pubsub', \
             emulator_host = 'localhost:8085', topic = 'projects/p/topics/events', \
             enable_message_ordering = 'true')",
            &format!(
                "INSERT INTO t SELECT value, CAST(value % 7 AS VARCHAR) {ROWS} ORDER BY value"
            ),
        )
        .await;
        assert!(
            plan.contains("SinkWriterExec: connector=pubsub table=t writers=4 routing=hash(ordering_key) order=[id@0 ASC NULLS LAST]"),
            "{plan}"
        );
        assert!(
            plan.contains("RepartitionExec: partitioning=Hash([ordering_key@1], 4)")
                && plan.contains("maintains_sort_order=true"),
            "{plan}"
        );
        assert!(plan.contains("SinkCountExec"), "{plan}");
    }

    const ORDERED_TOPIC: &str = "CREATE TABLE t (payload VARCHAR, ordering_key VARCHAR) WITH \
        (connector = 'pubsub', emulator_host = 'localhost:8085', \
        topic = 'projects/p/topics/events', enable_message_ordering = 'true')";

    /// Right below the writers, a sort of each partition or an order-keeping hash
    /// repartition by the ordering key (no round-robin spread).
    fn assert_sorted_and_hashed(plan: &str) {
        let below = plan
            .lines()
            .skip_while(|l| !l.contains("SinkWriterExec"))
            .nth(1)
            .unwrap_or_default();
        assert!(
            below.contains("SortExec")
                || (below.contains("RepartitionExec: partitioning=Hash([ordering_key@1], 4)")
                    && below.contains("maintains_sort_order=true")),
            "{plan}"
        );
        assert!(
            plan.contains("RepartitionExec: partitioning=Hash([ordering_key@1], 4)"),
            "{plan}"
        );
    }

    #[tokio::test]
    async fn an_order_by_on_a_column_the_insert_does_not_write_is_kept_in_a_hidden_column() {
        let plan = explain(
            ORDERED_TOPIC,
            &format!(
                "INSERT INTO t SELECT CAST(value AS VARCHAR) AS payload, \
                 'k' || CAST(value % 16 AS VARCHAR) AS ordering_key {ROWS} ORDER BY value"
            ),
        )
        .await;
        assert!(
            plan.contains(
                "SinkWriterExec: connector=pubsub table=t writers=4 routing=hash(ordering_key) \
                 order=[__order_0(value)@2 ASC NULLS LAST] hidden_order_columns=1"
            ),
            "{plan}"
        );
        assert_sorted_and_hashed(&plan);
    }

    #[tokio::test]
    async fn an_order_by_on_expressions_and_desc_over_several_keys_is_kept() {
        let plan = explain(
            ORDERED_TOPIC,
            &format!(
                "INSERT INTO t SELECT CAST(value AS VARCHAR) AS payload, \
                 'k' || CAST(value % 16 AS VARCHAR) AS ordering_key \
                 {ROWS} ORDER BY ordering_key, value % 7 DESC, value"
            ),
        )
        .await;
        // The first key is written; the rest are not: all three reach the writers.
        assert!(
            plan.contains(
                "order=[__order_0(ordering_key)@2 ASC NULLS LAST, \
                 __order_1(value % 7)@3 DESC, __order_2(value)@4 ASC NULLS LAST] \
                 hidden_order_columns=3"
            ),
            "{plan}"
        );
        assert_sorted_and_hashed(&plan);
    }

    #[tokio::test]
    async fn an_order_by_under_a_limit_is_kept() {
        let plan = explain(
            ORDERED_TOPIC,
            &format!(
                "INSERT INTO t SELECT CAST(value AS VARCHAR) AS payload, \
                 'k' || CAST(value % 16 AS VARCHAR) AS ordering_key {ROWS} \
                 ORDER BY value DESC LIMIT 5000"
            ),
        )
        .await;
        assert!(
            plan.contains("order=[__order_0(value)@2 DESC] hidden_order_columns=1"),
            "{plan}"
        );
        assert!(plan.contains("SortExec: TopK(fetch=5000)"), "{plan}");
    }

    #[tokio::test]
    async fn a_sink_that_keeps_no_order_gets_no_hidden_column() {
        let plan = explain(
            "CREATE TABLE t (body VARCHAR) WITH (connector = 'cloud_tasks', \
             emulator_host = 'localhost:8123', queue = 'projects/p/locations/l/queues/q', \
             url = 'https://worker.example.com/run')",
            &format!(
                "INSERT INTO t SELECT CAST(value AS VARCHAR) AS body {ROWS} ORDER BY value DESC"
            ),
        )
        .await;
        assert!(!plan.contains("hidden_order_columns"), "{plan}");
        assert!(!plan.contains("__order_"), "{plan}");
    }

    #[tokio::test]
    async fn a_bigtable_sink_hash_partitions_by_row_key_over_four_writers() {
        let plan = explain(
            "CREATE TABLE t (id VARCHAR, v BIGINT) WITH (connector = 'bigtable', \
             emulator_host = 'localhost:8086', table = 'projects/p/instances/i/tables/t', \
             row_key = 'id')",
            &format!("INSERT INTO t SELECT CAST(value % 100 AS VARCHAR), value {ROWS}"),
        )
        .await;
        assert!(
            plan.contains("SinkWriterExec: connector=bigtable table=t writers=4 routing=hash(id)"),
            "{plan}"
        );
        assert!(
            plan.contains("RepartitionExec: partitioning=Hash([id@0], 4)"),
            "{plan}"
        );
    }

    #[tokio::test]
    async fn a_cloud_tasks_sink_takes_any_partitioning_over_four_writers() {
        let plan = explain(
            "CREATE TABLE t (body VARCHAR) WITH (connector = 'cloud_tasks', \
             emulator_host = 'localhost:8123', queue = 'projects/p/locations/l/queues/q', \
             url = 'https://worker.example.com/run')",
            &format!("INSERT INTO t SELECT CAST(value AS VARCHAR) {ROWS}"),
        )
        .await;
        assert!(
            plan.contains("SinkWriterExec: connector=cloud_tasks table=t writers=4 routing=any"),
            "{plan}"
        );
        assert!(!plan.contains("Hash("), "{plan}");
    }

    #[tokio::test]
    async fn sink_parallelism_sets_the_writer_count_and_one_merges_the_input() {
        let create = |n: u32| {
            format!(
                "CREATE TABLE t (id VARCHAR, v BIGINT) WITH (connector = 'bigtable', \
                 emulator_host = 'localhost:8086', table = 'projects/p/instances/i/tables/t', \
                 row_key = 'id', sink_parallelism = '{n}')"
            )
        };
        let insert = format!("INSERT INTO t SELECT CAST(value % 100 AS VARCHAR), value {ROWS}");
        let two = explain(&create(2), &insert).await;
        assert!(two.contains("writers=2"), "{two}");
        let one = explain(&create(1), &insert).await;
        assert!(one.contains("writers=1"), "{one}");
        assert!(!one.contains("Hash("), "{one}");
        // Above the partition count: one writer per partition.
        let many = explain(&create(64), &insert).await;
        assert!(many.contains("writers=4"), "{many}");
    }
}

#[cfg(test)]
mod streaming_tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use async_trait::async_trait;
    use datafusion::arrow::array::{StringArray, UInt32Array};
    use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
    use datafusion::physical_plan::collect;
    use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
    use datafusion::prelude::{SessionConfig, SessionContext};

    use super::*;
    use crate::connectors::{ConnectorKind, write_stream};
    use crate::core::metrics::names;
    use crate::core::run::{FlushPoint, FlushSettings};
    use crate::core::{Envelope, FlowConfig, FlowWriter};
    use crate::testing::{FakeReply, FakeTransport};

    /// Rows per batch of the trickling source.
    const BATCH: u32 = 10;
    /// One batch this often.
    const EVERY: Duration = Duration::from_millis(100);

    /// An endless source: a batch of `BATCH` rows every `EVERY`, numbered from 0; row `n`
    /// goes to destination `d{n % 50}`, or to `d0` only from row `narrow_from` on. Counts the
    /// rows it produced.
    #[derive(Debug)]
    struct Trickle {
        schema: SchemaRef,
        produced: Arc<AtomicU32>,
        narrow_from: u32,
    }

    impl PartitionStream for Trickle {
        fn schema(&self) -> &SchemaRef {
            &self.schema
        }

        fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
            let schema = self.schema.clone();
            let produced = self.produced.clone();
            let narrow_from = self.narrow_from;
            let stream = futures::stream::unfold(0u32, move |next| {
                let schema = schema.clone();
                let produced = produced.clone();
                async move {
                    tokio::time::sleep(EVERY).await;
                    let rows = next..next + BATCH;
                    let batch = RecordBatch::try_new(
                        schema,
                        vec![
                            Arc::new(UInt32Array::from_iter_values(rows.clone())),
                            Arc::new(StringArray::from_iter_values(rows.map(|n| {
                                format!("d{}", if n < narrow_from { n % 50 } else { 0 })
                            }))),
                        ],
                    )
                    .map_err(DataFusionError::from);
                    produced.fetch_add(BATCH, Ordering::SeqCst);
                    Some((batch, next + BATCH))
                }
            });
            Box::pin(RecordBatchStreamAdapter::new(self.schema.clone(), stream))
        }
    }

    /// Sends each row to the destination its second column names.
    #[derive(Debug)]
    struct RoutedSink {
        schema: SchemaRef,
        fake: Arc<FakeTransport<u32>>,
        config: FlowConfig,
        flush: FlushSettings,
    }

    #[async_trait]
    impl SinkConnector for RoutedSink {
        fn kind(&self) -> ConnectorKind {
            crate::connectors::pubsub::KIND
        }

        fn schema(&self) -> &SchemaRef {
            &self.schema
        }

        fn routing(&self) -> Routing {
            Routing::any()
        }

        fn parallelism(&self) -> Option<usize> {
            None
        }

        async fn write_all(
            &self,
            input: SendableRecordBatchStream,
            metrics: SinkMetrics,
            ctx: &WriterContext,
        ) -> crate::Result<u64> {
            let writer = FlowWriter::new(self.fake.clone(), self.config.clone(), metrics);
            write_stream(writer, input, ctx, self.flush, |batch, _first, out| {
                let ids = batch
                    .column(0)
                    .as_any()
                    .downcast_ref::<UInt32Array>()
                    .expect("ids");
                let dests = batch
                    .column(1)
                    .as_any()
                    .downcast_ref::<StringArray>()
                    .expect("destinations");
                for (id, dest) in ids.values().iter().zip(dests.iter()) {
                    out.push(Ok(Envelope {
                        record: *id,
                        bytes: 10,
                        destination: Arc::from(dest.expect("destination")),
                        sequence_key: None,
                        serial_key: None,
                    }));
                }
                Ok(())
            })
            .await
        }
    }

    struct Run {
        plan: Arc<dyn ExecutionPlan>,
        produced: Arc<AtomicU32>,
        fake: Arc<FakeTransport<u32>>,
    }

    fn streaming_plan(flush: FlushSettings, idle: Duration, narrow_from: u32) -> Run {
        let schema = Arc::new(Schema::new(vec![
            Field::new("n", DataType::UInt32, false),
            Field::new("dest", DataType::Utf8, false),
        ]));
        let produced = Arc::new(AtomicU32::new(0));
        let source = Arc::new(Trickle {
            schema: schema.clone(),
            produced: produced.clone(),
            narrow_from,
        });
        let input = Arc::new(
            StreamingTableExec::try_new(schema.clone(), vec![source], None, [], true, None)
                .expect("source"),
        );
        let fake = Arc::new(FakeTransport::<u32>::new());
        let sink = Arc::new(RoutedSink {
            schema,
            fake: fake.clone(),
            config: FlowConfig {
                max_in_flight_records: 1_000,
                max_active_destinations: 100,
                destination_idle_timeout: idle,
                shutdown_timeout: Duration::from_secs(3),
                ..crate::core::test_flow_config()
            },
            flush,
        });
        let writers = SinkWriterExec::try_new("t".into(), sink, input).expect("writers");
        let plan = Arc::new(SinkCountExec::new(Arc::new(CoalescePartitionsExec::new(
            Arc::new(writers),
        ))));
        Run {
            plan,
            produced,
            fake,
        }
    }

    fn context(control: &StatementControl) -> Arc<TaskContext> {
        SessionContext::new_with_config(control.install(SessionConfig::new())).task_ctx()
    }

    fn count_of(batches: &[RecordBatch]) -> u64 {
        batches[0]
            .column(0)
            .as_any()
            .downcast_ref::<UInt64Array>()
            .expect("count")
            .value(0)
    }

    #[tokio::test(start_paused = true)]
    async fn flush_points_arrive_at_the_interval_and_a_drain_delivers_every_row_read() {
        let points: Arc<Mutex<Vec<FlushPoint>>> = Arc::default();
        let seen = points.clone();
        let control = StatementControl::new().with_observer(move |p| {
            seen.lock().unwrap().push(p.clone());
        });
        let run = streaming_plan(
            FlushSettings {
                interval: Some(Duration::from_secs(1)),
                rows: None,
            },
            Duration::from_secs(300),
            u32::MAX,
        );
        let task = tokio::spawn(collect(run.plan.clone(), context(&control)));
        tokio::time::sleep(Duration::from_millis(5_050)).await;
        // Rows are delivered while the input is still open.
        assert!(!run.fake.calls().is_empty());
        assert!(!task.is_finished());
        control.stop(StopKind::Drain, "stop requested (test)");
        let batches = task.await.expect("joined").expect("a drained stop is Ok");
        let produced = run.produced.load(Ordering::SeqCst);
        assert_eq!(count_of(&batches), u64::from(produced));
        // Every row read before the stop was delivered exactly once.
        let mut delivered: Vec<u32> = run
            .fake
            .calls()
            .into_iter()
            .flat_map(|c| c.records)
            .collect();
        delivered.sort_unstable();
        assert_eq!(delivered, (0..produced).collect::<Vec<_>>());
        // A flush point each second of the five, numbered in order, nothing in flight at each.
        let points = points.lock().unwrap();
        let sequences: Vec<u64> = points.iter().map(|p| p.sequence).collect();
        assert_eq!(sequences, [1, 2, 3, 4, 5]);
        for (i, p) in points.iter().enumerate() {
            assert_eq!(p.elapsed.as_secs(), i as u64 + 1, "{p:?}");
            assert_eq!(p.counts.in_flight, 0);
            assert_eq!(p.counts.acknowledged, p.rows_read, "{p:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_stop_aborts_a_drain_that_cannot_finish_and_names_what_is_unresolved() {
        let control = StatementControl::new();
        let run = streaming_plan(FlushSettings::default(), Duration::from_secs(300), u32::MAX);
        // Nothing is ever acknowledged: the drain cannot finish.
        run.fake.respond_with(|_| FakeReply::Stall);
        let task = tokio::spawn(collect(run.plan.clone(), context(&control)));
        tokio::time::sleep(Duration::from_secs(1)).await;
        control.stop(StopKind::Drain, "stop requested (test)");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!task.is_finished(), "the drain waits for the stalled sends");
        control.stop(StopKind::Abort, "second stop");
        let error = tokio::time::timeout(Duration::from_millis(10), task)
            .await
            .expect("an abort waits for nothing")
            .expect("joined")
            .expect_err("rows are unresolved");
        let produced = run.produced.load(Ordering::SeqCst);
        let text = error.to_string();
        assert!(text.contains("stop requested (test)"), "{text}");
        assert!(
            text.contains(&format!(
                "0 row(s) were acknowledged before the failure; {produced} admitted row(s) were not delivered"
            )),
            "{text}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn flush_points_release_idle_destinations_while_the_statement_runs() {
        let control = StatementControl::new();
        let run = streaming_plan(
            FlushSettings {
                interval: None,
                rows: Some(100),
            },
            // Destinations idle for longer than this are released at the next flush point.
            Duration::from_millis(500),
            // Fifty destinations for the first second, then only one.
            100,
        );
        let writers = run.plan.children()[0].children()[0].clone();
        let task = tokio::spawn(collect(run.plan.clone(), context(&control)));
        tokio::time::sleep(Duration::from_secs(4)).await;
        let released = writers
            .metrics()
            .and_then(|m| m.sum_by_name(names::DESTINATIONS_RELEASED))
            .map_or(0, |v| v.as_usize());
        let points = writers
            .metrics()
            .and_then(|m| m.sum_by_name(names::FLUSH_POINTS))
            .map_or(0, |v| v.as_usize());
        assert!(!task.is_finished(), "the statement keeps running");
        assert!(points >= 3, "{points} flush points");
        control.stop(StopKind::Drain, "done");
        task.await.expect("joined").expect("drained");
        // The 49 destinations that went quiet were released while the statement ran.
        assert_eq!(released, 49, "destinations released at the flush points");
    }
}
