//! The open windows of a windowed aggregate: which windows a row falls in, and one set of
//! DataFusion group accumulators per open window, keyed by the window's start. Pure state:
//! nothing here knows of sources, handles or markers. Its size grows with keys × open
//! windows, never with rows.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, BooleanArray, RecordBatch, UInt32Array};
use datafusion::arrow::compute::{cast, take};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::cast::as_boolean_array;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::logical_expr::{EmitTo, GroupsAccumulator};
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_expr::{GroupsAccumulatorAdapter, PhysicalExpr};
use datafusion::physical_plan::aggregates::group_values::{GroupValues, new_group_values};
use datafusion::physical_plan::aggregates::order::GroupOrdering;

/// The windows a time falls in: tumbling (`slide == width`) or hopping (`width` a whole
/// multiple of `slide`), aligned on `origin`. Every value is in nanoseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WindowShape {
    /// How long a window is.
    pub width: i64,
    /// How far apart two windows start (`width` for tumbling windows).
    pub slide: i64,
    /// A time at which some window starts.
    pub origin: i64,
}

impl WindowShape {
    /// Tumbling windows of `width`, aligned on `origin`.
    pub fn tumbling(width: i64, origin: i64) -> Self {
        WindowShape {
            width,
            slide: width,
            origin,
        }
    }

    /// Whether windows overlap (a hop).
    pub fn is_hopping(&self) -> bool {
        self.slide != self.width
    }

    /// The start of the last window `t` falls in.
    pub fn last_start(&self, t: i64) -> i64 {
        self.origin + (t - self.origin).div_euclid(self.slide) * self.slide
    }

    /// The end of the last window `t` falls in: once that window was delivered, nothing more
    /// waits for a row at `t` (its release, ADR 0068).
    pub fn release(&self, t: i64) -> i64 {
        self.last_start(t).saturating_add(self.width)
    }

    /// The starts of the windows `t` falls in whose end is after `closed` (the others were
    /// emitted), latest first.
    pub fn open_starts(&self, t: i64, closed: i64) -> impl Iterator<Item = i64> + '_ {
        let last = self.last_start(t);
        let per_row = self.width / self.slide;
        (0..per_row)
            .map(move |k| last - k * self.slide)
            .take_while(move |start| start.saturating_add(self.width) > closed)
    }
}

/// What the aggregate computes per window: the group keys (besides the window) and the
/// aggregate functions, as DataFusion planned them over the node's input.
#[derive(Debug, Clone)]
pub struct Aggregation {
    /// The group expressions other than the window, over the input.
    pub keys: Vec<Arc<dyn PhysicalExpr>>,
    /// Their schema (the group values' layout).
    pub key_schema: SchemaRef,
    /// The aggregate functions.
    pub aggregates: Vec<Arc<AggregateFunctionExpr>>,
    /// Each aggregate's `FILTER (WHERE ...)`, if any.
    pub filters: Vec<Option<Arc<dyn PhysicalExpr>>>,
}

/// One batch evaluated once for every window it touches: the key columns, each aggregate's
/// arguments and filter.
pub struct Evaluated {
    keys: Vec<ArrayRef>,
    args: Vec<Vec<ArrayRef>>,
    filters: Vec<Option<ArrayRef>>,
}

impl Aggregation {
    /// Evaluates the keys, arguments and filters over `batch`.
    pub fn evaluate(&self, batch: &RecordBatch) -> DFResult<Evaluated> {
        let rows = batch.num_rows();
        let column = |e: &Arc<dyn PhysicalExpr>| e.evaluate(batch)?.into_array(rows);
        let keys = self.keys.iter().map(column).collect::<DFResult<Vec<_>>>()?;
        let mut args = Vec::with_capacity(self.aggregates.len());
        for aggregate in &self.aggregates {
            let exprs = aggregate.expressions();
            args.push(exprs.iter().map(column).collect::<DFResult<Vec<_>>>()?);
        }
        let filters = self
            .filters
            .iter()
            .map(|f| f.as_ref().map(column).transpose())
            .collect::<DFResult<Vec<_>>>()?;
        Ok(Evaluated {
            keys,
            args,
            filters,
        })
    }

    fn accumulators(&self) -> DFResult<Vec<Box<dyn GroupsAccumulator>>> {
        self.aggregates
            .iter()
            .map(|aggregate| {
                if aggregate.groups_accumulator_supported() {
                    aggregate.create_groups_accumulator()
                } else {
                    let aggregate = aggregate.clone();
                    Ok(Box::new(GroupsAccumulatorAdapter::new(move || {
                        aggregate.create_accumulator()
                    })) as Box<dyn GroupsAccumulator>)
                }
            })
            .collect()
    }
}

/// One open window's groups and accumulators.
struct Open {
    /// `None` without keys: every row is group 0.
    groups: Option<Box<dyn GroupValues>>,
    accumulators: Vec<Box<dyn GroupsAccumulator>>,
    group_count: usize,
}

/// A window emitted: its bounds, its key columns and its aggregate values (one row per
/// group).
#[derive(Debug)]
pub struct Emitted {
    /// The window's start (ns).
    pub start: i64,
    /// The window's end (ns).
    pub end: i64,
    /// The key columns, in the order of [`Aggregation::keys`].
    pub keys: Vec<ArrayRef>,
    /// The aggregate values, in the order of [`Aggregation::aggregates`].
    pub values: Vec<ArrayRef>,
}

/// The open windows.
pub struct OpenWindows {
    shape: WindowShape,
    aggregation: Aggregation,
    open: BTreeMap<i64, Open>,
}

impl OpenWindows {
    /// No window open yet.
    pub fn new(shape: WindowShape, aggregation: Aggregation) -> Self {
        OpenWindows {
            shape,
            aggregation,
            open: BTreeMap::new(),
        }
    }

    /// The windows' shape.
    pub fn shape(&self) -> &WindowShape {
        &self.shape
    }

    /// How many windows are open.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// Whether no window is open.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Adds the rows of `batch` at `rows` (indices) with event times `times` to every window
    /// they fall in that ends after `closed`.
    pub fn add(
        &mut self,
        batch: &RecordBatch,
        rows: &[u32],
        times: &[i64],
        closed: i64,
    ) -> DFResult<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let evaluated = self.aggregation.evaluate(batch)?;
        let mut by_window: HashMap<i64, Vec<u32>> = HashMap::new();
        for (&row, &t) in rows.iter().zip(times) {
            for start in self.shape.open_starts(t, closed) {
                by_window.entry(start).or_default().push(row);
            }
        }
        for (start, indices) in by_window {
            let open = match self.open.entry(start) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(v) => v.insert(Open {
                    groups: if self.aggregation.keys.is_empty() {
                        None
                    } else {
                        Some(new_group_values(
                            self.aggregation.key_schema.clone(),
                            &GroupOrdering::None,
                        )?)
                    },
                    accumulators: self.aggregation.accumulators()?,
                    group_count: 0,
                }),
            };
            update(open, &evaluated, &UInt32Array::from(indices))?;
        }
        Ok(())
    }

    /// Takes every open window that ends at or before `close`, in order of their end.
    pub fn close_through(&mut self, close: i64) -> DFResult<Vec<Emitted>> {
        let width = self.shape.width;
        let due: Vec<i64> = self
            .open
            .keys()
            .copied()
            .take_while(|start| start.saturating_add(width) <= close)
            .collect();
        let mut out = Vec::with_capacity(due.len());
        for start in due {
            let Some(mut open) = self.open.remove(&start) else {
                continue;
            };
            let keys = match &mut open.groups {
                Some(groups) => groups.emit(EmitTo::All)?,
                None => Vec::new(),
            };
            let values = open
                .accumulators
                .iter_mut()
                .map(|a| a.evaluate(EmitTo::All))
                .collect::<DFResult<Vec<_>>>()?;
            out.push(Emitted {
                start,
                end: start.saturating_add(width),
                keys,
                values,
            });
        }
        Ok(out)
    }
}

fn update(open: &mut Open, evaluated: &Evaluated, indices: &UInt32Array) -> DFResult<()> {
    let pick = |a: &ArrayRef| take(a.as_ref(), indices, None).map_err(DataFusionError::from);
    let mut group_ids = Vec::with_capacity(indices.len());
    match &mut open.groups {
        Some(groups) => {
            let keys = evaluated
                .keys
                .iter()
                .map(pick)
                .collect::<DFResult<Vec<_>>>()?;
            groups.intern(&keys, &mut group_ids)?;
            open.group_count = groups.len();
        }
        None => {
            group_ids.resize(indices.len(), 0);
            open.group_count = 1;
        }
    }
    for (i, accumulator) in open.accumulators.iter_mut().enumerate() {
        let args = evaluated.args[i]
            .iter()
            .map(pick)
            .collect::<DFResult<Vec<_>>>()?;
        let filter = match &evaluated.filters[i] {
            Some(f) => {
                let f = pick(f)?;
                let f = cast(&f, &datafusion::arrow::datatypes::DataType::Boolean)?;
                Some(as_boolean_array(&f)?.clone())
            }
            None => None,
        };
        accumulator.update_batch(
            &args,
            &group_ids,
            filter.as_ref().map(|f: &BooleanArray| f as &BooleanArray),
            open.group_count,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Array, Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::functions_aggregate::count::count_udaf;
    use datafusion::functions_aggregate::sum::sum_udaf;
    use datafusion::physical_expr::aggregate::AggregateExprBuilder;
    use datafusion::physical_expr::expressions::{col, lit};

    use super::*;

    const MIN: i64 = 60_000_000_000;

    #[test]
    fn a_row_falls_in_one_tumbling_window_and_width_over_slide_hopping_ones() {
        let tumble = WindowShape::tumbling(MIN, 0);
        assert_eq!(tumble.last_start(MIN + 5), MIN);
        assert_eq!(tumble.release(MIN + 5), 2 * MIN);
        assert_eq!(
            tumble.open_starts(MIN + 5, i64::MIN).collect::<Vec<_>>(),
            [MIN]
        );
        assert_eq!(tumble.last_start(-5), -MIN, "before the origin too");
        let hop = WindowShape {
            width: 5 * MIN,
            slide: MIN,
            origin: 0,
        };
        let starts: Vec<i64> = hop.open_starts(7 * MIN + 1, i64::MIN).collect();
        assert_eq!(starts, [7 * MIN, 6 * MIN, 5 * MIN, 4 * MIN, 3 * MIN]);
        assert_eq!(hop.release(7 * MIN + 1), 12 * MIN);
        let open: Vec<i64> = hop.open_starts(7 * MIN + 1, 9 * MIN).collect();
        assert_eq!(
            open,
            [7 * MIN, 6 * MIN, 5 * MIN],
            "windows ending by 9 min were emitted"
        );
    }

    fn aggregation(schema: &SchemaRef) -> Aggregation {
        let count = AggregateExprBuilder::new(count_udaf(), vec![lit(1i64)])
            .schema(schema.clone())
            .alias("n")
            .build()
            .unwrap();
        let sum = AggregateExprBuilder::new(sum_udaf(), vec![col("v", schema).unwrap()])
            .schema(schema.clone())
            .alias("total")
            .build()
            .unwrap();
        Aggregation {
            keys: vec![col("k", schema).unwrap()],
            key_schema: Arc::new(Schema::new(vec![Field::new("k", DataType::Utf8, true)])),
            aggregates: vec![Arc::new(count), Arc::new(sum)],
            filters: vec![None, None],
        }
    }

    #[test]
    fn windows_close_in_order_with_a_row_per_key() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("v", DataType::Int64, true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from(vec!["a", "b", "a", "a"])),
                Arc::new(Int64Array::from(vec![1, 2, 3, 4])),
            ],
        )
        .unwrap();
        let mut open = OpenWindows::new(WindowShape::tumbling(MIN, 0), aggregation(&schema));
        let times = [10, 20, MIN + 1, MIN + 2];
        open.add(&batch, &[0, 1, 2, 3], &times, i64::MIN).unwrap();
        assert_eq!(open.len(), 2);
        assert!(
            open.close_through(MIN - 1).unwrap().is_empty(),
            "not yet ended"
        );
        let first = open.close_through(MIN).unwrap();
        assert_eq!(first.len(), 1);
        let w = &first[0];
        assert_eq!((w.start, w.end), (0, MIN));
        let keys = w.keys[0].as_any().downcast_ref::<StringArray>().unwrap();
        let n = w.values[0].as_any().downcast_ref::<Int64Array>().unwrap();
        let total = w.values[1].as_any().downcast_ref::<Int64Array>().unwrap();
        let rows: Vec<(String, i64, i64)> = (0..keys.len())
            .map(|i| (keys.value(i).to_string(), n.value(i), total.value(i)))
            .collect();
        assert_eq!(rows, [("a".into(), 1, 1), ("b".into(), 1, 2)]);
        let second = open.close_through(10 * MIN).unwrap();
        let n = second[0].values[0]
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        assert_eq!(n.value(0), 2, "rows 2 and 3, key a");
        assert!(open.is_empty());
    }

    #[test]
    fn a_hopping_row_adds_only_to_windows_not_yet_emitted() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("v", DataType::Int64, true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from(vec!["a"])),
                Arc::new(Int64Array::from(vec![5])),
            ],
        )
        .unwrap();
        let hop = WindowShape {
            width: 3 * MIN,
            slide: MIN,
            origin: 0,
        };
        let mut open = OpenWindows::new(hop, aggregation(&schema));
        // Windows [0,3), [1,4), [2,5) minutes hold 2.5 min; the first one was emitted.
        open.add(&batch, &[0], &[2 * MIN + MIN / 2], 3 * MIN)
            .unwrap();
        assert_eq!(open.len(), 2);
        let all = open.close_through(i64::MAX).unwrap();
        let ends: Vec<i64> = all.iter().map(|w| w.end).collect();
        assert_eq!(ends, [4 * MIN, 5 * MIN]);
    }
}
