//! The plan of an `INSERT` into a sink from a datafusion-python session.
//!
//! The host's optimizer sees only what DataFusion's FFI carries of a plan node: its properties
//! and children, not the distribution and ordering it requires of its input. The sink's own
//! plan (`SinkCountExec` over `SinkWriterExec`, which needs rows of one key in one partition
//! and the counts in one) therefore cannot be left to the host to complete. [`SealedInsertExec`]
//! is what the host gets instead: one node whose child is the INSERT's input (which the host
//! optimizes as usual) and whose one output partition is the `count` row. When it runs, it
//! builds the sink's plan over a [`ChannelSource`] fed from the input's partitions and completes
//! it with DataFusion's distribution and sorting rule of this side (`EnsureRequirements`) (docs/adr/0048).
//!
//! The input's streams are polled where the host polls this node's output, on the host's
//! threads: a foreign plan's stream may need the host's runtime, which only its threads have.
//! The sink's writers run on this package's runtime ([`crate::runtime`]).
//!
//! An `ORDER BY` of the input: the host's optimizer does not see that the writers need it (the
//! FFI does not carry a node's required ordering), so it drops the sort or spreads its output
//! round-robin. The node keeps the ordering the input had when the host planned the INSERT
//! (before its optimizer ran; [`input_ordering`]) and, for a bounded input, sorts each
//! partition by it again on this side, so that the rules keep it per key up to the writers
//! (docs/adr/0056).

use std::fmt;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::TableProvider;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::{SendableRecordBatchStream, SessionStateBuilder, TaskContext};
use datafusion::logical_expr::dml::InsertOp;
use datafusion::physical_expr::{
    EquivalenceProperties, LexOrdering, Partitioning, PhysicalExpr, PhysicalSortExpr,
};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_optimizer::ensure_requirements::EnsureRequirements;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::expressions::Column;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use futures::{FutureExt, StreamExt};
use gcp_sql::sql::SinkTable;
use tokio::sync::mpsc;

use crate::failures;

/// Input batches buffered per partition between the host's stream and a writer.
const CHANNEL_BATCHES: usize = 2;

/// An `INSERT` into a sink table as the host plans it: see the module docs.
#[derive(Debug)]
pub struct SealedInsertExec {
    table: SinkTable,
    input: Arc<dyn ExecutionPlan>,
    /// The input's ordering as the host planned it (its `ORDER BY`), before the host's
    /// optimizer could drop it: restored on this side when the node runs.
    ordering: Option<LexOrdering>,
    count_schema: SchemaRef,
    properties: Arc<PlanProperties>,
}

impl SealedInsertExec {
    /// The INSERT of `input` into `table`; `count_schema` is the schema of the sink's count
    /// row (the schema of the plan the table makes).
    pub fn new(table: SinkTable, input: Arc<dyn ExecutionPlan>, count_schema: SchemaRef) -> Self {
        let boundedness = match input.boundedness() {
            Boundedness::Bounded => Boundedness::Bounded,
            Boundedness::Unbounded { .. } => Boundedness::Unbounded {
                requires_infinite_memory: false,
            },
        };
        let properties = PlanProperties::new(
            EquivalenceProperties::new(count_schema.clone()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            boundedness,
        );
        Self {
            table,
            input,
            ordering: None,
            count_schema,
            properties: Arc::new(properties),
        }
    }

    /// The same INSERT, whose rows reach the writers in `ordering` (the input's ordering when
    /// the host planned it, [`input_ordering`]); `None`: no ordering is kept.
    pub fn with_ordering(mut self, ordering: Option<LexOrdering>) -> Self {
        self.ordering = ordering;
        self
    }
}

/// The output ordering of `input` (a plan of the host, before its optimizer ran) with each
/// sort expression that is a column of `input` made one of this side's columns; another
/// expression stays the host's (evaluated through the FFI). `None`: `input` is not ordered.
pub fn input_ordering(input: &Arc<dyn ExecutionPlan>) -> Option<LexOrdering> {
    let ordering = input.output_ordering()?;
    let schema = input.schema();
    let local = ordering.iter().map(|sort| {
        let expr = local_column(&sort.expr, &schema).unwrap_or_else(|| sort.expr.clone());
        PhysicalSortExpr::new(expr, sort.options)
    });
    LexOrdering::new(local)
}

/// `expr` as this side's [`Column`] when it is a column of `schema`. Across the FFI an
/// expression is opaque but for its text, and a column's text is `name@index`.
fn local_column(expr: &Arc<dyn PhysicalExpr>, schema: &SchemaRef) -> Option<Arc<dyn PhysicalExpr>> {
    if expr.downcast_ref::<Column>().is_some() {
        return Some(expr.clone());
    }
    if !expr.children().is_empty() {
        return None;
    }
    let text = expr.to_string();
    let (name, index) = text.rsplit_once('@')?;
    let index: usize = index.parse().ok()?;
    let field = schema.fields().get(index)?;
    (field.name() == name).then(|| Arc::new(Column::new(name, index)) as Arc<dyn PhysicalExpr>)
}

impl DisplayAs for SealedInsertExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "GcpSqlInsertExec: connector={} (writers planned when it runs)",
            self.table.sink().kind().name()
        )
    }
}

impl ExecutionPlan for SealedInsertExec {
    fn name(&self) -> &'static str {
        "GcpSqlInsertExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DFResult<TreeNodeRecursion>,
    ) -> DFResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal(format!(
                "GcpSqlInsertExec has one input, got {}",
                children.len()
            )));
        }
        let input = children.remove(0);
        Ok(Arc::new(
            Self::new(self.table.clone(), input, self.count_schema.clone())
                .with_ordering(self.ordering.clone()),
        ))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "GcpSqlInsertExec has one partition, asked for {partition}"
            )));
        }
        // The input's streams, opened here (on the host's thread) and polled by the pumps
        // below, which run where the host polls this node's output.
        let partitions = self.input.output_partitioning().partition_count().max(1);
        let mut pumps = Vec::with_capacity(partitions);
        let mut receivers = Vec::with_capacity(partitions);
        for p in 0..partitions {
            let mut stream = self.input.execute(p, context.clone())?;
            let (tx, rx) = mpsc::channel::<DFResult<RecordBatch>>(CHANNEL_BATCHES);
            receivers.push(Some(rx));
            pumps.push(async move {
                while let Some(batch) = stream.next().await {
                    let stop = batch.is_err();
                    if tx.send(batch).await.is_err() || stop {
                        break; // the writer ended (or was told of the input's error)
                    }
                }
            });
        }
        // The session's stop requests (`gcp_sql.stop`) reach the writers as in Rust: through
        // the statement control in the task's session config.
        let config = crate::stop::control().install(context.session_config().clone());
        let mut own = TaskContext::default()
            .with_session_config(config)
            .with_runtime(context.runtime_env());
        if let Some(task) = context.task_id() {
            own = own.with_task_id(task);
        }
        let context = Arc::new(own);
        let source: Arc<dyn ExecutionPlan> = Arc::new(ChannelSource::new(
            self.input.schema(),
            receivers,
            self.input.boundedness(),
        ));
        // The input's ORDER BY, sorted again per partition (a bounded input only: an unbounded
        // one cannot be sorted); the rules then keep it per key, as in Rust.
        let source = match &self.ordering {
            Some(ordering) if self.input.boundedness() == Boundedness::Bounded => {
                Arc::new(SortExec::new(ordering.clone(), source).with_preserve_partitioning(true))
            }
            _ => source,
        };
        let table = self.table.clone();
        let config = context.session_config().options().clone();
        let writers = crate::runtime::runtime()
            .spawn(run_sink(table, source, config, context))
            .map(|joined| match joined {
                Ok(result) => result,
                Err(e) => Err(DataFusionError::Execution(format!(
                    "the sink's writers ended abnormally: {e}"
                ))),
            });
        let schema = self.count_schema.clone();
        let user_stop = crate::stop::control().signal();
        let out = futures::stream::once(async move {
            let mut pumps = futures::future::join_all(pumps).boxed().fuse();
            let mut writers = writers.fuse();
            // A drain reads no input that is not ready; the pumps keep it ready while the host
            // produces rows, so a stop request also closes the input here.
            let mut stop_request = Box::pin(user_stop.stopped().fuse());
            let total = loop {
                futures::select! {
                    _ = stop_request => {
                        pumps = futures::future::ready(Vec::new()).boxed().fuse();
                    }
                    _ = pumps => {}
                    result = writers => break result,
                }
            };
            // Dropping the pumps here closes the input, also when the writers stopped first.
            let total = total.map_err(failures::record)?;
            Ok(RecordBatch::try_new(
                schema,
                vec![Arc::new(UInt64Array::from(vec![total]))],
            )?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.count_schema.clone(),
            out,
        )))
    }
}

/// The sink's own plan over `source`, completed with this side's distribution and sorting
/// rules, run to its count.
async fn run_sink(
    table: SinkTable,
    source: Arc<dyn ExecutionPlan>,
    config: Arc<ConfigOptions>,
    context: Arc<TaskContext>,
) -> DFResult<u64> {
    // The table plans its INSERT without looking at the session.
    let state = SessionStateBuilder::new().build();
    let plan = table.insert_into(&state, source, InsertOp::Append).await?;
    let plan = EnsureRequirements::new().optimize(plan, &config)?;
    let mut stream = plan.execute(0, context)?;
    let mut total = 0u64;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        if let Some(counts) = batch.column(0).as_any().downcast_ref::<UInt64Array>() {
            total += counts.iter().flatten().sum::<u64>();
        }
    }
    Ok(total)
}

/// The INSERT's input as the sink's plan reads it: one partition per input partition, each
/// read from the channel its pump fills. It claims no ordering and no partitioning, so the
/// rules add what the sink needs above it.
#[derive(Debug)]
pub struct ChannelSource {
    schema: SchemaRef,
    receivers: Mutex<Vec<Option<mpsc::Receiver<DFResult<RecordBatch>>>>>,
    properties: Arc<PlanProperties>,
}

impl ChannelSource {
    fn new(
        schema: SchemaRef,
        receivers: Vec<Option<mpsc::Receiver<DFResult<RecordBatch>>>>,
        boundedness: Boundedness,
    ) -> Self {
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(receivers.len()),
            EmissionType::Incremental,
            boundedness,
        );
        Self {
            schema,
            receivers: Mutex::new(receivers),
            properties: Arc::new(properties),
        }
    }
}

impl DisplayAs for ChannelSource {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GcpSqlChannelSource: the host's input")
    }
}

impl ExecutionPlan for ChannelSource {
    fn name(&self) -> &'static str {
        "GcpSqlChannelSource"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DFResult<TreeNodeRecursion>,
    ) -> DFResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal(
                "GcpSqlChannelSource has no input".into(),
            ))
        }
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        let rx = self
            .receivers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(partition)
            .and_then(Option::take)
            .ok_or_else(|| {
                DataFusionError::Internal(format!(
                    "GcpSqlChannelSource: partition {partition} is not there or was read already"
                ))
            })?;
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|batch| (batch, rx))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            stream,
        )))
    }
}
