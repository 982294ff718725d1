//! Lookup joins: a join of any input with a Bigtable table on the table's row key, read as one
//! `ReadRows` of the distinct keys of each input batch (see `docs/bigtable.md`, "Lookup joins",
//! and ADR 0078).
//!
//! [`rewrite`] recognizes a DataFusion hash join whose one side is a [`BigtableScanExec`] (under
//! column-only projections, repartitions and merges) joined on its single row-key column, INNER
//! or with the other side preserved (LEFT), and replaces it by a [`LookupJoinExec`] with the
//! same output schema. The node has one child, the input; for each input batch it reads the
//! batch's keys not in its cache with one `ReadRows` (the scan's own reader, row decoding and
//! key set), joins, and emits one batch before it polls its input again, so it passes delivery
//! handles on as a filter does: each output batch's handle is the input batch's, mapped to the
//! rows kept ([`SubsetSlot`]).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datafusion::arrow::array::{ArrayRef, AsArray, RecordBatch, RecordBatchOptions, UInt32Array};
use datafusion::arrow::compute::{cast, concat_batches, take};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::JoinSide;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::JoinType;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::execution_plan::ReplaceChildrenOptions;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::StreamExt;

use super::scan::BigtableScanExec;
use super::scan::exec::Source;
use super::scan::keys::{KeyRange, KeySet, PartKind};
use crate::connectors::lookup::LookupPlanner;
use crate::core::delivery::subset::{SubsetHandle, SubsetSlot};
use crate::core::delivery::{DeliveryHandle, DeliveryInput, UpstreamOf};
use crate::plan::node::{name_and_properties, with_new_children_by_replace};

/// The lookup cache's settings: at most `rows` keys, each kept for `ttl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheSettings {
    /// Most keys kept (found or known absent).
    pub rows: usize,
    /// How long a key's row is trusted.
    pub ttl: Duration,
}

/// What makes a join a lookup, or why it is not one.
#[derive(Debug, Clone)]
struct Plan {
    /// The scan whose table is read.
    scan: Arc<BigtableScanExec>,
    /// The scan's key set (a lookup reads only keys inside it).
    keys: KeySet,
    /// Per column of the join's table side, the scan column it is.
    columns: Vec<usize>,
    /// The scan column holding the row key.
    key_column: usize,
    /// How key values become row-key bytes.
    kind: PartKind,
    /// The input's join key, evaluated on an input batch.
    input_key: Arc<dyn PhysicalExpr>,
    /// Whether the table side is the join's left side (its columns come first).
    table_first: bool,
    /// Keep input rows without a match (LEFT), or drop them (INNER).
    keep_unmatched: bool,
    /// The join's schema before its projection.
    join_schema: SchemaRef,
    /// The join's projection.
    projection: Option<Arc<[usize]>>,
}

/// The scan under `plan` and, per column of `plan`, the scan column it is: `None` when
/// `plan` is not a scan under column-only projections, repartitions and merges.
fn scan_under(plan: &Arc<dyn ExecutionPlan>) -> Option<(Arc<BigtableScanExec>, Vec<usize>)> {
    if let Some(scan) = plan.downcast_ref::<BigtableScanExec>() {
        let n = scan.schema().fields().len();
        let scan = Arc::new(
            BigtableScanExec::new(
                scan.spec().clone(),
                union_of(scan.partitions()),
                scan.partitions().to_vec(),
            )
            .with_lookup_cache(scan.lookup_cache()),
        );
        return Some((scan, (0..n).collect()));
    }
    if let Some(p) = plan.downcast_ref::<ProjectionExec>() {
        let (scan, below) = scan_under(p.input())?;
        let columns = p
            .expr()
            .iter()
            .map(|e| {
                let c = e.expr.downcast_ref::<Column>()?;
                below.get(c.index()).copied()
            })
            .collect::<Option<Vec<_>>>()?;
        return Some((scan, columns));
    }
    let passes = plan.is::<RepartitionExec>()
        || plan.is::<CoalescePartitionsExec>()
        || plan.is::<CooperativeExec>();
    match plan.children().as_slice() {
        [child] if passes => scan_under(child),
        _ => None,
    }
}

fn union_of(parts: &[KeySet]) -> KeySet {
    KeySet::from_ranges(parts.iter().flat_map(|p| p.ranges().iter().cloned()))
}

/// Why a join with a Bigtable table is not a lookup, and what to write instead; `Ok(None)`
/// when `plan` is not a join with a Bigtable table at all.
fn plan_of(plan: &Arc<dyn ExecutionPlan>) -> Result<Option<Plan>, String> {
    let Some(join) = plan.downcast_ref::<HashJoinExec>() else {
        return Ok(None);
    };
    let (side, (scan, columns)) = match (scan_under(join.left()), scan_under(join.right())) {
        (Some(_), Some(_)) => {
            return Err(
                "both sides read Bigtable tables; a lookup join reads one table by the keys of \
                 the other input"
                    .into(),
            );
        }
        (Some(s), None) => (JoinSide::Left, s),
        (None, Some(s)) => (JoinSide::Right, s),
        (None, None) => return Ok(None),
    };
    let table_first = side == JoinSide::Left;
    let keep_unmatched = match (join.join_type(), table_first) {
        (JoinType::Inner, _) => false,
        (JoinType::Left, false) | (JoinType::Right, true) => true,
        (other, _) => {
            return Err(format!(
                "a {other} join keeps rows of the Bigtable table that no input row asks for; \
                 a lookup join is INNER or LEFT with the Bigtable table on the right"
            ));
        }
    };
    if join.filter().is_some() {
        return Err(
            "the join has a condition besides row key equality; join on the row key only and \
             put the rest in WHERE"
                .into(),
        );
    }
    if join.fetch().is_some() {
        return Err("a LIMIT was pushed into the join".into());
    }
    let spec = scan.spec();
    if spec.limit.is_some() {
        return Err("the Bigtable side has a LIMIT".into());
    }
    let on_row_key = "join on the table's row key: `ON t.<row_key column> = <input expression>`";
    let [(l, r)] = join.on() else {
        return Err(format!(
            "the join is on {} column pairs; {on_row_key}",
            join.on().len()
        ));
    };
    let (table_expr, input_key) = if table_first { (l, r) } else { (r, l) };
    let key_column = table_expr
        .downcast_ref::<Column>()
        .and_then(|c| columns.get(c.index()).copied())
        .filter(|&c| spec.key_parts == 1 && matches!(spec.sources.get(c), Some(Source::KeyPart(0))))
        .ok_or_else(|| {
            if spec.key_parts > 1 {
                format!(
                    "the table's row key is built from {} columns and a lookup reads a whole \
                     key; declare the key as one column to look rows up by it",
                    spec.key_parts
                )
            } else {
                format!("the join is not on the Bigtable table's row key; {on_row_key}")
            }
        })?;
    let key_type = spec.schema.field(key_column).data_type();
    let kind = PartKind::of(key_type).ok_or("the row key has no key type")?;
    if input_key
        .data_type(&input_schema(join, table_first))
        .ok()
        .as_ref()
        != Some(key_type)
    {
        return Err(format!(
            "the input's join key is not of the row key's type {key_type}; cast it in the ON \
             clause"
        ));
    }
    Ok(Some(Plan {
        keys: union_of(scan.partitions()),
        scan,
        columns,
        key_column,
        kind,
        input_key: input_key.clone(),
        table_first,
        keep_unmatched,
        join_schema: join.join_schema().clone(),
        projection: join.projection.clone(),
    }))
}

fn input_schema(join: &HashJoinExec, table_first: bool) -> SchemaRef {
    if table_first {
        join.right().schema()
    } else {
        join.left().schema()
    }
}

fn input_of(join: &HashJoinExec, table_first: bool) -> Arc<dyn ExecutionPlan> {
    if table_first {
        join.right().clone()
    } else {
        join.left().clone()
    }
}

/// `plan` as a lookup join when it is a join with a Bigtable table that can be one;
/// `Ok(None)` when it is not a join with a Bigtable table; an error saying why not and what to
/// write instead when it is one that cannot be a lookup. The node finds the delivery handles
/// of its input's batches through `upstream_of`.
pub fn rewrite(
    plan: &Arc<dyn ExecutionPlan>,
    upstream_of: UpstreamOf,
) -> Result<Option<Arc<dyn ExecutionPlan>>, String> {
    let Some(p) = plan_of(plan)? else {
        return Ok(None);
    };
    let join = plan
        .downcast_ref::<HashJoinExec>()
        .expect("plan_of checked the join");
    let input = input_of(join, p.table_first);
    let cache = p.scan.lookup_cache();
    Ok(Some(Arc::new(LookupJoinExec::new(
        Arc::new(p),
        input,
        plan.schema(),
        cache,
        upstream_of,
    ))))
}

/// The Bigtable connector's lookup joins, as the registry lists them.
pub static PLANNER: LookupPlanner = LookupPlanner {
    rewrite,
    pass_through: |plan, partition| {
        let node = plan.downcast_ref::<LookupJoinExec>()?;
        Some((node.input.clone(), node.slot(partition)?))
    },
    is_node: |plan| plan.is::<LookupJoinExec>(),
};

/// Keys cached with the time they were read and their use order.
#[derive(Debug, Default)]
struct Cache {
    entries: HashMap<Vec<u8>, (Option<RecordBatch>, Instant, u64)>,
    order: BTreeMap<u64, Vec<u8>>,
    tick: u64,
}

impl Cache {
    fn get(&mut self, key: &[u8], ttl: Duration) -> Option<Option<RecordBatch>> {
        let (row, at, used) = self.entries.get_mut(key)?;
        if at.elapsed() > ttl {
            let used = *used;
            self.entries.remove(key);
            self.order.remove(&used);
            return None;
        }
        self.tick += 1;
        self.order.remove(used);
        *used = self.tick;
        self.order.insert(self.tick, key.to_vec());
        Some(row.clone())
    }

    fn put(&mut self, key: Vec<u8>, row: Option<RecordBatch>, cap: usize) {
        self.tick += 1;
        if let Some((_, _, used)) = self
            .entries
            .insert(key.clone(), (row, Instant::now(), self.tick))
        {
            self.order.remove(&used);
        }
        self.order.insert(self.tick, key);
        while self.entries.len() > cap {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            self.entries.remove(&oldest);
        }
    }
}

/// A lookup join: for each input batch, one `ReadRows` of the batch's keys not cached, joined
/// and emitted before the input is polled again.
pub struct LookupJoinExec {
    plan: Arc<Plan>,
    input: Arc<dyn ExecutionPlan>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    cache_settings: Option<CacheSettings>,
    cache: Arc<Mutex<Cache>>,
    /// Per partition, the handle of the batch emitted last.
    slots: Arc<[Arc<SubsetSlot>]>,
    /// Where a partition finds the delivery handle of the input batch it joins.
    upstream_of: UpstreamOf,
    metrics: ExecutionPlanMetricsSet,
}

impl fmt::Debug for LookupJoinExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LookupJoinExec")
            .field("table", &self.plan.scan.spec().table)
            .finish_non_exhaustive()
    }
}

impl LookupJoinExec {
    fn new(
        plan: Arc<Plan>,
        input: Arc<dyn ExecutionPlan>,
        schema: SchemaRef,
        cache_settings: Option<CacheSettings>,
        upstream_of: UpstreamOf,
    ) -> Self {
        let props = input.properties();
        let partitions = props.partitioning.partition_count();
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(partitions),
            props.emission_type,
            props.boundedness,
        );
        LookupJoinExec {
            plan,
            input,
            schema,
            properties: Arc::new(properties),
            cache_settings: cache_settings.filter(|c| c.rows > 0),
            cache: Arc::default(),
            slots: (0..partitions)
                .map(|_| Arc::new(SubsetSlot::default()))
                .collect(),
            upstream_of,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    /// This join with an in-memory cache of the rows read (`None` or zero rows: no cache).
    pub fn with_cache(&self, cache: Option<CacheSettings>) -> Self {
        LookupJoinExec::new(
            self.plan.clone(),
            self.input.clone(),
            self.schema.clone(),
            cache,
            self.upstream_of,
        )
    }

    /// The input whose rows look rows up.
    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }

    /// Where partition `partition` publishes the handle of the batch it emitted last.
    pub fn slot(&self, partition: usize) -> Option<Arc<SubsetSlot>> {
        self.slots.get(partition).cloned()
    }

    /// The Bigtable table read (`projects/P/instances/I/tables/T`).
    pub fn table(&self) -> &str {
        &self.plan.scan.spec().table
    }
}

impl DisplayAs for LookupJoinExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let spec = self.plan.scan.spec();
        write!(
            f,
            "LookupJoinExec: type={}, table={}, key={} = {}, filter={}",
            if self.plan.keep_unmatched {
                "Left"
            } else {
                "Inner"
            },
            spec.table,
            spec.schema.field(self.plan.key_column).name(),
            self.plan.input_key,
            spec.filter_text
        )?;
        if !self.plan.keys.is_all() {
            write!(f, ", keys={}", self.plan.keys)?;
        }
        match self.cache_settings {
            Some(c) => write!(f, ", cache={} rows for {:?}", c.rows, c.ttl),
            None => write!(f, ", cache=off"),
        }
    }
}

impl ExecutionPlan for LookupJoinExec {
    name_and_properties!("LookupJoinExec");

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(
            &Arc<dyn PhysicalExpr>,
        ) -> DFResult<datafusion::common::tree_node::TreeNodeRecursion>,
    ) -> DFResult<datafusion::common::tree_node::TreeNodeRecursion> {
        f(&self.plan.input_key)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let [input] = <[_; 1]>::try_from(children).map_err(|c| {
            DataFusionError::Internal(format!("LookupJoinExec has one child, given {}", c.len()))
        })?;
        Ok(Arc::new(LookupJoinExec::new(
            self.plan.clone(),
            input,
            self.schema.clone(),
            self.cache_settings,
            self.upstream_of,
        )))
    }

    with_new_children_by_replace!();

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        let upstream = (self.upstream_of)(&self.input, partition);
        let slot = self.slots.get(partition).cloned();
        let input = self.input.execute(partition, context.clone())?;
        let counter =
            |name: &'static str| MetricBuilder::new(&self.metrics).counter(name, partition);
        let state = State {
            plan: self.plan.clone(),
            schema: self.schema.clone(),
            input,
            upstream,
            slot,
            context,
            cache_settings: self.cache_settings,
            cache: self.cache.clone(),
            metrics: Metrics {
                read_rows_calls: counter("read_rows_calls"),
                input_batches: counter("input_batches"),
                keys_read: counter("keys_read"),
                rows_found: counter("rows_found"),
                cache_hits: counter("cache_hits"),
            },
        };
        let stream = futures::stream::unfold(state, |mut state| async move {
            match state.next().await {
                Ok(Some(batch)) => Some((Ok(batch), state)),
                Ok(None) => None,
                Err(e) => Some((Err(e), state)),
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            stream,
        )))
    }
}

struct Metrics {
    read_rows_calls: Count,
    input_batches: Count,
    keys_read: Count,
    rows_found: Count,
    cache_hits: Count,
}

struct State {
    plan: Arc<Plan>,
    schema: SchemaRef,
    input: SendableRecordBatchStream,
    upstream: Option<Arc<dyn DeliveryInput>>,
    slot: Option<Arc<SubsetSlot>>,
    context: Arc<TaskContext>,
    cache_settings: Option<CacheSettings>,
    cache: Arc<Mutex<Cache>>,
    metrics: Metrics,
}

/// Row-key bytes of each value of `array` (a key column), `None` for a NULL.
fn key_bytes(array: &ArrayRef, kind: PartKind) -> DFResult<Vec<Option<Vec<u8>>>> {
    Ok(match kind {
        PartKind::Text | PartKind::Integer => {
            let text = cast(array, &DataType::Utf8)?;
            text.as_string::<i32>()
                .iter()
                .map(|v| v.map(|s| s.as_bytes().to_vec()))
                .collect()
        }
        PartKind::Bytes => {
            let bytes = cast(array, &DataType::Binary)?;
            bytes
                .as_binary::<i32>()
                .iter()
                .map(|v| v.map(<[u8]>::to_vec))
                .collect()
        }
    })
}

impl State {
    /// The next output batch: the next input batch with a row kept, joined.
    async fn next(&mut self) -> DFResult<Option<RecordBatch>> {
        loop {
            // The consumer retained what it keeps of the last batch before it polled again.
            if let Some(slot) = &self.slot {
                slot.put(None);
            }
            let Some(batch) = self.input.next().await.transpose()? else {
                return Ok(None);
            };
            let handle = self.upstream.as_ref().and_then(|u| u.current());
            self.metrics.input_batches.add(1);
            let (out, rows) = self.join(&batch).await?;
            if out.num_rows() == 0 {
                continue;
            }
            if let (Some(slot), Some(handle)) = (&self.slot, handle) {
                slot.put(Some(match rows {
                    None => handle,
                    Some(rows) => {
                        Arc::new(SubsetHandle::new(handle, rows)) as Arc<dyn DeliveryHandle>
                    }
                }));
            }
            return Ok(Some(out));
        }
    }

    /// Reads the rows of `keys` (distinct, inside the scan's key set) with one `ReadRows`.
    async fn read(&mut self, keys: &[Vec<u8>]) -> DFResult<HashMap<Vec<u8>, RecordBatch>> {
        let set = KeySet::from_ranges(keys.iter().cloned().map(KeyRange::point));
        let scan = BigtableScanExec::new(self.plan.scan.spec().clone(), set.clone(), vec![set]);
        self.metrics.read_rows_calls.add(1);
        self.metrics.keys_read.add(keys.len());
        let mut stream = scan.execute(0, self.context.clone())?;
        let mut found = HashMap::new();
        while let Some(batch) = stream.next().await.transpose()? {
            let keys = key_bytes(batch.column(self.plan.key_column), self.plan.kind)?;
            for (i, key) in keys.into_iter().enumerate() {
                if let Some(key) = key {
                    found.insert(key, batch.slice(i, 1));
                }
            }
        }
        self.metrics.rows_found.add(found.len());
        Ok(found)
    }

    /// `batch` joined; with the rows of `batch` kept when not all of them are.
    async fn join(&mut self, batch: &RecordBatch) -> DFResult<(RecordBatch, Option<Vec<u32>>)> {
        let plan = self.plan.clone();
        let key_values = plan
            .input_key
            .evaluate(batch)?
            .into_array(batch.num_rows())?;
        let keys = key_bytes(&key_values, plan.kind)?;
        // The distinct keys, each with its row when known.
        let mut rows: HashMap<Vec<u8>, Option<RecordBatch>> = HashMap::new();
        let mut missing = Vec::new();
        for key in keys.iter().flatten() {
            if rows.contains_key(key) {
                continue;
            }
            if !plan.keys.ranges().iter().any(|r| r.contains(key)) {
                rows.insert(key.clone(), None);
                continue;
            }
            let cached = match self.cache_settings {
                Some(c) => self
                    .cache
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(key, c.ttl),
                None => None,
            };
            match cached {
                Some(row) => {
                    self.metrics.cache_hits.add(1);
                    rows.insert(key.clone(), row);
                }
                None => {
                    rows.insert(key.clone(), None);
                    missing.push(key.clone());
                }
            }
        }
        if !missing.is_empty() {
            let mut found = self.read(&missing).await?;
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            for key in missing {
                let row = found.remove(&key);
                if let Some(c) = self.cache_settings {
                    cache.put(key.clone(), row.clone(), c.rows);
                }
                rows.insert(key, row);
            }
        }
        // The table rows of this batch, one per distinct key found.
        let scan_schema = plan.scan.spec().schema.clone();
        let mut index: HashMap<&[u8], u32> = HashMap::new();
        let mut found = Vec::new();
        for (key, row) in &rows {
            if let Some(row) = row {
                index.insert(key, found.len() as u32);
                found.push(row.clone());
            }
        }
        let table_rows = concat_batches(&scan_schema, &found)?;
        let mut kept = Vec::with_capacity(batch.num_rows());
        let mut matched: Vec<Option<u32>> = Vec::with_capacity(batch.num_rows());
        for (i, key) in keys.iter().enumerate() {
            let m = key.as_deref().and_then(|k| index.get(k).copied());
            if m.is_some() || plan.keep_unmatched {
                kept.push(i as u32);
                matched.push(m);
            }
        }
        let all = kept.len() == batch.num_rows();
        let input_cols: Vec<ArrayRef> = if all {
            batch.columns().to_vec()
        } else {
            let idx = UInt32Array::from(kept.clone());
            batch
                .columns()
                .iter()
                .map(|c| take(c.as_ref(), &idx, None))
                .collect::<Result<_, _>>()?
        };
        let idx = UInt32Array::from(matched);
        let table_cols: Vec<ArrayRef> = plan
            .columns
            .iter()
            .map(|&c| take(table_rows.column(c).as_ref(), &idx, None))
            .collect::<Result<_, _>>()?;
        let columns = if plan.table_first {
            table_cols.into_iter().chain(input_cols).collect()
        } else {
            input_cols.into_iter().chain(table_cols).collect()
        };
        let rows_out = RecordBatchOptions::new().with_row_count(Some(kept.len()));
        let joined =
            RecordBatch::try_new_with_options(plan.join_schema.clone(), columns, &rows_out)?;
        let out = match &plan.projection {
            Some(p) => joined.project(p)?,
            None => joined,
        };
        let out = RecordBatch::try_new_with_options(
            self.schema.clone(),
            out.columns().to_vec(),
            &rows_out,
        )?;
        Ok((out, (!all).then_some(kept)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{Field, Schema};

    #[test]
    fn the_cache_evicts_the_least_recently_used_and_expires() {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let row = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![1]))]).unwrap();
        let mut cache = Cache::default();
        let ttl = Duration::from_secs(60);
        cache.put(b"a".to_vec(), Some(row.clone()), 2);
        cache.put(b"b".to_vec(), None, 2);
        assert!(cache.get(b"a", ttl).is_some());
        cache.put(b"c".to_vec(), None, 2);
        // "b" was used least recently.
        assert!(cache.get(b"b", ttl).is_none());
        assert_eq!(cache.get(b"a", ttl).map(|r| r.is_some()), Some(true));
        assert_eq!(cache.get(b"c", ttl).map(|r| r.is_some()), Some(false));
        assert!(cache.get(b"a", Duration::ZERO).is_none());
        assert_eq!(cache.entries.len(), cache.order.len());
    }

    #[test]
    fn integer_and_text_keys_become_their_text() {
        let ints: ArrayRef = Arc::new(Int64Array::from(vec![Some(17), None]));
        assert_eq!(
            key_bytes(&ints, PartKind::Integer).unwrap(),
            vec![Some(b"17".to_vec()), None]
        );
        let text: ArrayRef = Arc::new(StringArray::from(vec!["user-1"]));
        assert_eq!(
            key_bytes(&text, PartKind::Text).unwrap(),
            vec![Some(b"user-1".to_vec())]
        );
    }
}
