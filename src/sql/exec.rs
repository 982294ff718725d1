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
//! The writers of one statement are coordinated by the core ([`crate::core::statement`]): they
//! share a stop request; when one fails, the others read and send nothing new and settle what
//! they sent, and the failed writer's error counts the rows acknowledged and not delivered over
//! every writer, as a single writer's error does.

use std::fmt;
use std::sync::Arc;

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
    Boundedness, ReplaceChildrenOptions, check_not_null_constraints, execute_input_stream,
};
use datafusion::physical_plan::expressions::Column;
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use futures::StreamExt;

use super::control::StatementControl;
use super::lineage::Feed;
use super::spec::SinkSpec;
use crate::connectors::{Routing, SinkConnector};
use crate::core::SinkMetrics;
use crate::core::delivery::wait_settled;
use crate::core::run::WriterContext;
use crate::core::statement::{Running, Statement, WriterTask};
use crate::core::telemetry::StatementLabels;
use crate::plan::node::{name_and_properties, no_expressions, with_new_children_by_replace};

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
    /// Whether the input carries delivery handles, and what follows from it
    /// ([`super::lineage::Feed`]).
    feed: Feed,
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
        // With delivery handles: one writer per input partition, fed through nodes that pass
        // each batch on; a plan that cannot be connected so is refused here, before anything
        // is read.
        let (feed, input) = Feed::of(input, &table)?;
        let ordering = feed.ordering(ordering);
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
        let writers = feed.writers(sink.parallelism(), partitions);
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
            feed,
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

    /// Writes the input partitions of writer `ctx.writer` and returns the rows acknowledged,
    /// or the statement's error (see [`Running::finish`]).
    async fn run_writer(
        sink: Arc<dyn SinkConnector>,
        input: SendableRecordBatchStream,
        metrics: SinkMetrics,
        running: Running,
        ctx: WriterContext,
    ) -> DFResult<u64> {
        let result = sink.write_all(input, metrics, &ctx).await;
        // The input is gone: every delivery handle is settled or dropped, so the input's
        // last acknowledgements (and nacks) are decided; the statement ends once they are sent.
        wait_settled(ctx.delivery.as_ref(), ctx.writer, ctx.writers).await;
        Ok(running.finish(&ctx, result).await?)
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
    name_and_properties!("SinkWriterExec");

    fn required_input_distribution(&self) -> Vec<Distribution> {
        if !self.feed.may_repartition() {
            // Each writer reads one input partition as it is (see `lineage`); a key is kept
            // in order within a writer by the core's per-key routing.
            vec![Distribution::UnspecifiedDistribution]
        } else if self.sink.parallelism() == Some(1) {
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
        if !self.feed.may_repartition() || self.sink.parallelism() == Some(1) {
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

    with_new_children_by_replace!();

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
            stop: self.statement.stop().clone(),
            observer: control.as_ref().and_then(|c| c.observer()),
            statement: self.statement.id().clone(),
            table: Some(self.table.as_str().into()),
            runtime: Some(context.runtime_env()),
            delivery: self.feed.input(&self.input, partition),
        };
        let user_stop = control.as_ref().map(|c| c.signal());
        let counted = control.map(|c| c.writer_running());
        // The exporter reads the metrics the writer keeps, and its input's counts, from here
        // until the writer ends (and the statement's last readings for a while after).
        let registered = crate::core::telemetry::global().writer_started(
            StatementLabels {
                statement: self.statement.id().clone(),
                table: self.table.clone(),
                connector: self.sink.kind().name(),
                destination: self
                    .spec
                    .as_ref()
                    .map(|s| s.destination())
                    .unwrap_or_default(),
            },
            partition,
            metrics.clone(),
            ctx.delivery.clone(),
        );
        let running = self.statement.start();
        let stop = ctx.stop.clone();
        let writer = Self::run_writer(self.sink.clone(), input, metrics, running, ctx);
        let out = count_schema();
        let task = WriterTask {
            table: self.table.clone(),
            destination: self.spec.as_ref().map(|s| s.destination()),
            task: context.task_id(),
            partition,
            writers: self.writers,
        };
        let stream = futures::stream::once(async move {
            let _counted = counted;
            let _registered = registered;
            count_batch(&out, task.run(stop, user_stop, writer).await?)
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
    name_and_properties!("SinkCountExec");

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

    with_new_children_by_replace!();

    no_expressions!();

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
    use crate::connectors::ConnectorKind;
    use crate::core::{Envelope, FlowConfig, FlowWriter, write_stream};
    use crate::testing::{FakeReply, FakeTransport};

    /// Rows of input partition `p` are `p * 1000 .. p * 1000 + 1000`.
    const ROWS_PER_PARTITION: u32 = 1000;

    /// How the fake sink encodes a batch: one envelope per row, in row order.
    pub(super) type Encode = fn(&RecordBatch, &mut Vec<crate::Result<Envelope<u32>>>);

    /// A sink over the fake transport: each row is sent as the record `encode` makes of it.
    #[derive(Debug)]
    pub(super) struct FakeSink {
        pub(super) schema: SchemaRef,
        pub(super) fake: Arc<FakeTransport<u32>>,
        pub(super) config: FlowConfig,
        pub(super) routing: Routing,
        pub(super) parallelism: Option<usize>,
        pub(super) flush: crate::core::run::FlushSettings,
        pub(super) encode: Encode,
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
            let no_row = |_: &RecordBatch, _: usize| crate::core::DeadPayload::default();
            let encode = self.encode;
            write_stream(writer, input, ctx, self.flush, no_row, |batch, _, out| {
                encode(batch, out);
                Ok(())
            })
            .await
        }
    }

    /// Each row as its own value (the first column, `UInt32`), to destination `d`.
    fn each_value_to_d(batch: &RecordBatch, out: &mut Vec<crate::Result<Envelope<u32>>>) {
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
                handle: None,
            }));
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
            encode: each_value_to_d,
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

    use datafusion::arrow::array::{StringArray, UInt32Array};
    use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
    use datafusion::physical_plan::collect;
    use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
    use datafusion::prelude::{SessionConfig, SessionContext};

    use super::tests::FakeSink;
    use super::*;
    use crate::core::metrics::names;
    use crate::core::run::{FlushPoint, FlushSettings};
    use crate::core::{Envelope, FlowConfig, StopKind};
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

    /// Each row as its id (the first column) to the destination its second column names.
    fn each_id_to_its_destination(
        batch: &RecordBatch,
        out: &mut Vec<crate::Result<Envelope<u32>>>,
    ) {
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
                handle: None,
            }));
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
        let sink = Arc::new(FakeSink {
            schema,
            fake: fake.clone(),
            config: FlowConfig {
                max_in_flight_records: 1_000,
                max_active_destinations: 100,
                destination_idle_timeout: idle,
                shutdown_timeout: Duration::from_secs(3),
                ..crate::core::test_flow_config()
            },
            routing: Routing::any(),
            parallelism: None,
            flush,
            encode: each_id_to_its_destination,
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
