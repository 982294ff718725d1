//! The plan between a source that acknowledges after delivery (a subscription) and a sink's
//! writers: which plans keep the promise "a message is acknowledged only after every row made
//! from it was delivered", and how they are connected (ADR 0043).
//!
//! The proof rests on three things:
//!
//! 1. **Every node between the source and a writer hands each input batch on before it asks
//!    its input for the next one, and never holds rows back.** Projections (casts, `CASE`,
//!    scalar functions) and unions do; a filter does once DataFusion's own (which gathers small
//!    batches into larger ones) is replaced by [`BatchFilterExec`]; a join with a Bigtable
//!    table on its row key does once it is a lookup join (one `ReadRows` per input batch,
//!    `registry::LOOKUPS`, ADR 0078). Round-robin repartitions and
//!    merges of partitions, which the optimizer adds, are taken out. Anything else
//!    (aggregates, joins, sorts, windows, limits, hash repartitions) is refused at planning.
//! 2. **One writer per source partition**, reading that partition only: the batch a writer
//!    receives is the one its source partition emitted last, so the writer finds its delivery
//!    handle in that partition's [`DeliveryInput`] ([`delivery_input`]).
//! 3. **The writer retains the batch's rows before it polls again, and settles each once
//!    delivered, dead-lettered or dropped** ([`crate::core::delivery`]); the source seals a
//!    batch when it is polled for the next one, and acknowledges it once sealed and fully
//!    settled.
//!
//! A subtree that reads no source is left as it is (a bounded table in a `UNION ALL`).
//!
//! The writers' node ([`super::exec::SinkWriterExec`]) asks one question of its input, through
//! [`Feed`]: does it carry delivery handles? Every consequence (the input connected, one writer
//! per input partition, no ordering imposed, where each writer finds its handles) follows from
//! the answer here, not at each use.

use std::fmt;
use std::sync::Arc;
use std::task::Poll;

use datafusion::arrow::array::{Array, RecordBatch};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::cast::as_boolean_array;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use futures::StreamExt;

use crate::connectors::SourceDescriptor;
use crate::connectors::registry;
use crate::core::delivery::subset::{SubsetHandle, SubsetInput, SubsetSlot};
use crate::core::delivery::{DeliveryHandle, DeliveryInput};
use crate::error::{Error, Result};
use crate::plan::node::{name_and_properties, with_new_children_by_replace};
use crate::sql::window::WindowAggregateExec;
use crate::sql::window::plan::plan_window;

/// The source descriptor whose scan `plan` is, if it is one.
fn source_of(plan: &dyn ExecutionPlan) -> Option<&'static SourceDescriptor> {
    registry::kinds()
        .filter_map(|kind| kind.descriptor().source)
        .find(|source| (source.is_node)(plan))
}

/// Whether `plan` reads a source anywhere.
pub fn reads_source(plan: &Arc<dyn ExecutionPlan>) -> bool {
    source_of(plan.as_ref()).is_some() || plan.children().into_iter().any(reads_source)
}

/// A description of the first source `plan` reads, for messages.
pub(crate) fn first_source(plan: &Arc<dyn ExecutionPlan>) -> Option<String> {
    match source_of(plan.as_ref()) {
        Some(source) => (source.origin_slot)(plan.as_ref(), 0).map(|input| input.describe()),
        None => plan.children().into_iter().find_map(first_source),
    }
}

/// The input of a sink's writers that reads a source, connected as the module describes:
/// round-robin repartitions and merges taken out, filters made per batch. A node
/// that cannot keep the promise is refused with an error that names it, why, and what works.
/// Connecting a plan that is already connected returns the same plan.
pub fn connect(plan: Arc<dyn ExecutionPlan>, table: &str) -> Result<Arc<dyn ExecutionPlan>> {
    if !reads_source(&plan) {
        return Ok(plan);
    }
    if source_of(plan.as_ref()).is_some() || plan.is::<WindowAggregateExec>() {
        return Ok(plan);
    }
    if let Some(window) = plan_window(&plan, table, &|input| connect(input, table))? {
        return Ok(window);
    }
    let any = plan.as_ref();
    if let Some(repartition) = any.downcast_ref::<RepartitionExec>()
        && matches!(repartition.partitioning(), Partitioning::RoundRobinBatch(_))
        && !repartition.preserve_order()
    {
        return connect(repartition.input().clone(), table);
    }
    if let Some(merge) = any.downcast_ref::<CoalescePartitionsExec>()
        && merge.fetch().is_none()
    {
        // A merge of partitions (the optimizer adds one where it wants fewer): each writer
        // reads one source partition instead.
        return connect(merge.input().clone(), table);
    }
    if let Some(filter) = any.downcast_ref::<FilterExec>() {
        let input = connect(filter.input().clone(), table)?;
        return Ok(Arc::new(BatchFilterExec::try_new(
            filter.predicate().clone(),
            filter.projection().clone(),
            input,
        )?));
    }
    if let Some(lookup) = registry::lookup_join(&plan, delivery_input)
        .map_err(|why| lookup_refusal(&plan, table, &why))?
    {
        return connect(lookup, table);
    }
    let passes_on = any.is::<ProjectionExec>()
        || registry::LOOKUPS.iter().any(|l| (l.is_node)(any))
        || any.is::<UnionExec>()
        || any.is::<CooperativeExec>()
        || any.is::<BatchFilterExec>();
    if !passes_on {
        return Err(refusal(&plan, table));
    }
    let children = plan
        .children()
        .into_iter()
        .map(|child| connect(child.clone(), table))
        .collect::<Result<Vec<_>>>()?;
    Ok(plan.replace_children(
        children,
        ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
    )?)
}

fn lookup_refusal(node: &Arc<dyn ExecutionPlan>, table: &str, why: &str) -> Error {
    let source = first_source(node).unwrap_or_else(|| "a source".into());
    Error::Unsupported(format!(
        "INSERT INTO '{table}' reads {source} through a join with a Bigtable table that cannot \
         be a lookup join: {why}. Between a source and a sink a join must be a lookup: INNER or \
         LEFT JOIN of the input with a Bigtable table ON the table's row key column (see \
         docs/bigtable.md, \"Lookup joins\"); otherwise land the rows in a table first and run a \
         bounded query over it"
    ))
}

fn refusal(node: &Arc<dyn ExecutionPlan>, table: &str) -> Error {
    let name = node.name();
    let why = match name {
        n if n.contains("Aggregate") => {
            "an aggregate's output rows cannot be traced back to the messages they came from"
        }
        n if n.contains("Join") => "a join's output rows cannot be traced back to one message",
        n if n.contains("Sort") || n.contains("Window") => {
            "it holds rows back until it has seen more input, which a source never finishes"
        }
        n if n.contains("Limit") => "a limit stops reading part-way through a batch of messages",
        n if n.contains("Repartition") => {
            "a hash repartition mixes the rows of several source partitions"
        }
        _ => "the rows it emits cannot be traced back to the messages they came from",
    };
    let source = first_source(node).unwrap_or_else(|| "a source".into());
    Error::Unsupported(format!(
        "INSERT INTO '{table}' reads {source} through {name}, which this project cannot connect \
         to a sink: a message is acknowledged only after every row made from it was delivered, \
         and {why}. Between a source and a sink, use projections (casts, CASE, scalar \
         functions), filters and UNION ALL of sources; to aggregate, join or sort, land the \
         rows in a table first and run a bounded query over it"
    ))
}

/// The delivery input of output partition `partition` of a connected plan (see [`connect`]):
/// that of the source partition that feeds it; `None` when it reads no source.
pub fn delivery_input(
    plan: &Arc<dyn ExecutionPlan>,
    partition: usize,
) -> Option<Arc<dyn DeliveryInput>> {
    if let Some(source) = source_of(plan.as_ref()) {
        return (source.origin_slot)(plan.as_ref(), partition);
    }
    if let Some(window) = plan.downcast_ref::<WindowAggregateExec>() {
        return (partition == 0).then(|| window.delivery_input());
    }
    if let Some(filter) = plan.downcast_ref::<BatchFilterExec>() {
        let inner = delivery_input(filter.input(), partition)?;
        let slot = filter.slots.get(partition)?.clone();
        return Some(Arc::new(SubsetInput::new(inner, slot)));
    }
    if let Some((input, slot)) = registry::LOOKUPS
        .iter()
        .find_map(|l| (l.pass_through)(plan.as_ref(), partition))
    {
        let inner = delivery_input(&input, partition)?;
        return Some(Arc::new(SubsetInput::new(inner, slot)));
    }
    if plan.is::<UnionExec>() {
        // A union's partitions are its children's, one after the other.
        let mut first = 0;
        for child in plan.children() {
            let n = child.output_partitioning().partition_count();
            if partition < first + n {
                return delivery_input(child, partition - first);
            }
            first += n;
        }
        return None;
    }
    match plan.children().as_slice() {
        // Every other node of a connected plan passes its input's partitions through.
        [child] => delivery_input(child, partition),
        _ => None,
    }
}

/// How a sink's writers read their input: plainly, or carrying delivery handles (the input
/// reads a source that acknowledges only what was delivered).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feed {
    /// No delivery handles: the writers are planned as the sink wants them.
    Plain,
    /// Every batch carries a delivery handle: the input is [`connect`]ed, each writer reads one
    /// input partition as it is (no ordering imposed, no repartition asked for) and finds the
    /// handles of its batches in that partition's [`DeliveryInput`].
    Handles,
}

impl Feed {
    /// The feed of `input`, and the input to plan the writers over (connected when it carries
    /// handles; refused, naming the node, when it cannot be). `table` names the table written.
    pub fn of(
        input: Arc<dyn ExecutionPlan>,
        table: &str,
    ) -> Result<(Feed, Arc<dyn ExecutionPlan>)> {
        if reads_source(&input) {
            Ok((Feed::Handles, connect(input, table)?))
        } else {
            Ok((Feed::Plain, input))
        }
    }

    /// The ordering the writers may require: none with handles (a source's order is its
    /// arrival order, and a sort would hold rows back).
    pub fn ordering<O>(self, ordering: Option<O>) -> Option<O> {
        match self {
            Feed::Plain => ordering,
            Feed::Handles => None,
        }
    }

    /// How many writers run over `partitions` input partitions when the sink asks for
    /// `parallelism`: with handles, one per input partition whatever the sink asks.
    pub fn writers(self, parallelism: Option<usize>, partitions: usize) -> usize {
        match (self, parallelism) {
            (Feed::Plain, Some(p)) => p.clamp(1, partitions),
            _ => partitions,
        }
    }

    /// Whether the writers' node may ask for its input to be repartitioned or merged: never
    /// with handles (each writer reads its source partition as it is).
    pub fn may_repartition(self) -> bool {
        self == Feed::Plain
    }

    /// Where writer `partition` finds the delivery handles of its batches (`None` for a plain
    /// feed).
    pub fn input(
        self,
        plan: &Arc<dyn ExecutionPlan>,
        partition: usize,
    ) -> Option<Arc<dyn DeliveryInput>> {
        match self {
            Feed::Plain => None,
            Feed::Handles => delivery_input(plan, partition),
        }
    }
}

/// A filter that hands on what each input batch keeps before it asks for the next batch (an
/// empty result is skipped), where DataFusion's `FilterExec` gathers the kept rows of several
/// batches into one. Used between a source and a sink, where a batch's rows must reach the
/// writer before the source is asked for more ([`connect`]).
#[derive(Debug)]
pub struct BatchFilterExec {
    predicate: Arc<dyn PhysicalExpr>,
    projection: Option<Arc<[usize]>>,
    input: Arc<dyn ExecutionPlan>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    /// Per partition, the handle of the batch emitted last: the input's, mapped to the rows
    /// kept (see [`crate::core::delivery::subset`]).
    slots: Arc<[Arc<SubsetSlot>]>,
}

impl BatchFilterExec {
    /// The columns the filter keeps, if it projects.
    pub fn projection(&self) -> Option<&[usize]> {
        self.projection.as_deref()
    }

    /// The filter's input.
    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }

    fn try_new(
        predicate: Arc<dyn PhysicalExpr>,
        projection: Option<Arc<[usize]>>,
        input: Arc<dyn ExecutionPlan>,
    ) -> DFResult<Self> {
        let schema = match &projection {
            Some(p) => Arc::new(input.schema().project(p)?),
            None => input.schema(),
        };
        let input_props = input.properties();
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(input_props.partitioning.partition_count()),
            input_props.emission_type,
            input_props.boundedness,
        );
        let slots = (0..input_props.partitioning.partition_count())
            .map(|_| Arc::new(SubsetSlot::default()))
            .collect();
        Ok(BatchFilterExec {
            predicate,
            projection,
            input,
            schema,
            properties: Arc::new(properties),
            slots,
        })
    }
}

impl DisplayAs for BatchFilterExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BatchFilterExec: {}", self.predicate)?;
        if let Some(p) = &self.projection {
            write!(f, ", projection={p:?}")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for BatchFilterExec {
    name_and_properties!("BatchFilterExec");

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DFResult<TreeNodeRecursion>,
    ) -> DFResult<TreeNodeRecursion> {
        f(&self.predicate)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let [input] = <[_; 1]>::try_from(children).map_err(|c| {
            DataFusionError::Internal(format!("BatchFilterExec has one child, given {}", c.len()))
        })?;
        Ok(Arc::new(BatchFilterExec::try_new(
            self.predicate.clone(),
            self.projection.clone(),
            input,
        )?))
    }

    with_new_children_by_replace!();

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        let upstream = delivery_input(&self.input, partition);
        let slot = self.slots.get(partition).cloned();
        let mut input = self.input.execute(partition, context)?;
        let predicate = self.predicate.clone();
        let projection = self.projection.clone();
        let stream = futures::stream::poll_fn(move |cx| {
            loop {
                // A consumer retains what it keeps of a batch before it polls again: the
                // handle is not kept past that, so nothing holds the input's batch after it.
                if let Some(slot) = &slot {
                    slot.put(None);
                }
                let batch = match futures::ready!(input.poll_next_unpin(cx)) {
                    None => return Poll::Ready(None),
                    Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                    Some(Ok(batch)) => batch,
                };
                let (kept, rows) = match keep(&predicate, projection.as_deref(), &batch) {
                    Ok(k) => k,
                    Err(e) => return Poll::Ready(Some(Err(e))),
                };
                if kept.num_rows() == 0 {
                    continue;
                }
                if let (Some(upstream), Some(slot)) = (&upstream, &slot) {
                    let handle = upstream
                        .current()
                        .map(|h| Arc::new(SubsetHandle::new(h, rows)) as Arc<dyn DeliveryHandle>);
                    slot.put(handle);
                }
                return Poll::Ready(Some(Ok(kept)));
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            stream,
        )))
    }
}

/// The rows of `batch` the predicate keeps (projected), and their indices in `batch`.
fn keep(
    predicate: &Arc<dyn PhysicalExpr>,
    projection: Option<&[usize]>,
    batch: &RecordBatch,
) -> DFResult<(RecordBatch, Vec<u32>)> {
    let mask = predicate.evaluate(batch)?.into_array(batch.num_rows())?;
    let mask = as_boolean_array(&mask)?;
    let kept = filter_record_batch(batch, mask)?;
    // A NULL counts as false, as the filter counts it.
    let rows = (0..mask.len())
        .filter(|&i| mask.is_valid(i) && mask.value(i))
        .map(|i| i as u32)
        .collect();
    let kept = match projection {
        Some(p) => kept.project(p)?,
        None => kept,
    };
    Ok((kept, rows))
}
