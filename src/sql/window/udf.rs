//! Arroyo's window functions, `tumble(width)` and `hop(slide, width)`, as DataFusion scalar
//! functions, and the analyzer rule that gives them the source's event time.
//!
//! In a query they are group keys: `GROUP BY user_id, tumble(INTERVAL '1 minute')`. Each is a
//! struct of the window's `start` and `end` (`TIMESTAMP` in UTC, nanoseconds). Written with the
//! width alone, the event time is implied: [`EventTimeArgument`] (an analyzer rule) adds the
//! event-time column of the source the aggregate reads (`event_time_field`, else
//! `publish_time_column`), keeping the column's name. The windowed plan node computes the
//! windows itself (a hop puts a row in several); evaluated as a plain function, `tumble(width,
//! time)` gives the window a time falls in, and `hop` refuses (a row has several).

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, StructArray, TimestampNanosecondArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Fields, TimeUnit, TimestampNanosecondType};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DataFusionError, Result as DFResult, ScalarValue};
use datafusion::datasource::source_as_provider;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    Aggregate, ColumnarValue, Expr, LogicalPlan, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
    Signature, Volatility,
};
use datafusion::optimizer::AnalyzerRule;

use super::plan::{HOP, TUMBLE};
use crate::connectors::registry;

/// The type of a window value: `STRUCT(start TIMESTAMP, end TIMESTAMP)`, UTC, nanoseconds.
pub fn window_type() -> DataType {
    let ts = DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into()));
    DataType::Struct(Fields::from(vec![
        Field::new("start", ts.clone(), false),
        Field::new("end", ts, false),
    ]))
}

/// `tumble` or `hop`.
#[derive(Debug, PartialEq, Eq, Hash)]
struct WindowFunction {
    name: &'static str,
    /// Interval arguments before the (implied) time.
    intervals: usize,
    signature: Signature,
}

impl WindowFunction {
    fn new(name: &'static str, intervals: usize) -> Self {
        WindowFunction {
            name,
            intervals,
            signature: Signature::variadic_any(Volatility::Immutable),
        }
    }
}

/// The `tumble(width [, time])` function.
pub fn tumble() -> ScalarUDF {
    ScalarUDF::new_from_impl(WindowFunction::new(TUMBLE, 1))
}

/// The `hop(slide, width [, time])` function.
pub fn hop() -> ScalarUDF {
    ScalarUDF::new_from_impl(WindowFunction::new(HOP, 2))
}

impl ScalarUDFImpl for WindowFunction {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> DFResult<DataType> {
        let n = self.intervals;
        let usage = || {
            DataFusionError::Plan(format!(
                "{}({}) takes {} INTERVAL(s) and, optionally, a TIMESTAMP (the event time, \
                 implied in a query over one source)",
                self.name,
                if n == 1 { "width" } else { "slide, width" },
                n
            ))
        };
        if arg_types.len() != n && arg_types.len() != n + 1 {
            return Err(usage());
        }
        for ty in &arg_types[..n] {
            if !matches!(ty, DataType::Interval(_)) {
                return Err(usage());
            }
        }
        if let Some(ty) = arg_types.get(n)
            && !matches!(ty, DataType::Timestamp(..))
        {
            return Err(usage());
        }
        Ok(window_type())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DFResult<ColumnarValue> {
        if self.name == HOP {
            return Err(DataFusionError::Execution(
                "hop() puts a row in several windows, so it is planned only as the window of a \
                 GROUP BY over a source (an INSERT from a subscription); use date_bin or tumble \
                 for one window per row"
                    .into(),
            ));
        }
        let [width, time] = args.args.as_slice() else {
            return Err(DataFusionError::Execution(
                "tumble(width) needs the event time: it is implied only in a GROUP BY over one \
                 source; elsewhere write tumble(width, time)"
                    .into(),
            ));
        };
        let ColumnarValue::Scalar(ScalarValue::IntervalMonthDayNano(Some(w))) = width else {
            return Err(DataFusionError::Execution(
                "tumble's width must be a constant INTERVAL".into(),
            ));
        };
        let width = i64::from(w.days) * 86_400_000_000_000 + w.nanoseconds;
        if w.months != 0 || width <= 0 {
            return Err(DataFusionError::Execution(
                "tumble's width must be a positive INTERVAL of days or less".into(),
            ));
        }
        let times = time.to_array(args.number_rows)?;
        let tz = match times.data_type() {
            DataType::Timestamp(_, tz) => tz.clone(),
            _ => None,
        };
        let ns = cast(&times, &DataType::Timestamp(TimeUnit::Nanosecond, tz))?;
        let ns = ns.as_primitive::<TimestampNanosecondType>();
        let starts: TimestampNanosecondArray = ns
            .iter()
            .map(|t| t.map(|t| t.div_euclid(width) * width))
            .collect::<TimestampNanosecondArray>()
            .with_timezone("UTC");
        let ends: TimestampNanosecondArray = starts
            .iter()
            .map(|s| s.map(|s| s + width))
            .collect::<TimestampNanosecondArray>()
            .with_timezone("UTC");
        let DataType::Struct(fields) = window_type() else {
            unreachable!("window_type is a struct")
        };
        let nulls = starts.nulls().cloned();
        let columns: Vec<ArrayRef> = vec![Arc::new(starts), Arc::new(ends)];
        Ok(ColumnarValue::Array(Arc::new(StructArray::try_new(
            fields, columns, nulls,
        )?)))
    }
}

/// The analyzer rule that adds the source's event time to `tumble(width)` and
/// `hop(slide, width)` group keys (see the module docs).
#[derive(Debug, Default)]
pub struct EventTimeArgument;

impl AnalyzerRule for EventTimeArgument {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> DFResult<LogicalPlan> {
        plan.transform_up(|node| {
            let LogicalPlan::Aggregate(aggregate) = &node else {
                return Ok(Transformed::no(node));
            };
            let Some(time) = event_time_of(&aggregate.input)? else {
                return Ok(Transformed::no(node));
            };
            let mut changed = false;
            let mut group = Vec::with_capacity(aggregate.group_expr.len());
            for expr in &aggregate.group_expr {
                match with_time(expr, &time)? {
                    Some(new) => {
                        changed = true;
                        group.push(new);
                    }
                    None => group.push(expr.clone()),
                }
            }
            if !changed {
                return Ok(Transformed::no(node));
            }
            let rebuilt =
                Aggregate::try_new(aggregate.input.clone(), group, aggregate.aggr_expr.clone())?;
            Ok(Transformed::yes(LogicalPlan::Aggregate(rebuilt)))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "gcp_sql_window_event_time"
    }
}

/// `expr` with the event time added, if it is a window call written without it; named as it
/// was written.
fn with_time(expr: &Expr, time: &Column) -> DFResult<Option<Expr>> {
    let (inner, alias) = match expr {
        Expr::Alias(a) => (a.expr.as_ref(), Some(a.name.clone())),
        other => (other, None),
    };
    let Expr::ScalarFunction(call) = inner else {
        return Ok(None);
    };
    let intervals = match call.func.name() {
        TUMBLE => 1,
        HOP => 2,
        _ => return Ok(None),
    };
    if call.args.len() != intervals {
        return Ok(None);
    }
    let name = match alias {
        Some(name) => name,
        None => inner.schema_name().to_string(),
    };
    let mut args = call.args.clone();
    args.push(Expr::Column(time.clone()));
    let call = Expr::ScalarFunction(ScalarFunction::new_udf(call.func.clone(), args));
    Ok(Some(call.alias(name)))
}

/// The event-time column of the one source table `plan` reads through projections, filters
/// and aliases, as a column of `plan`'s schema; `None` otherwise.
fn event_time_of(plan: &LogicalPlan) -> DFResult<Option<Column>> {
    let Some(name) = source_event_time(plan)? else {
        return Ok(None);
    };
    match plan.schema().qualified_field_with_unqualified_name(&name) {
        Ok((qualifier, field)) => Ok(Some(Column::new(qualifier.cloned(), field.name()))),
        Err(_) => Ok(None),
    }
}

fn source_event_time(plan: &LogicalPlan) -> DFResult<Option<String>> {
    match plan {
        LogicalPlan::TableScan(scan) => {
            let Ok(provider) = source_as_provider(&scan.source) else {
                return Ok(None);
            };
            Ok(registry::kinds()
                .filter_map(|kind| kind.descriptor().source)
                .find_map(|source| (source.table_event_time)(provider.as_ref()))
                .and_then(|e| e.column))
        }
        LogicalPlan::Projection(_) | LogicalPlan::Filter(_) | LogicalPlan::SubqueryAlias(_) => {
            match plan.inputs().as_slice() {
                [input] => source_event_time(input),
                _ => Ok(None),
            }
        }
        _ => Ok(None),
    }
}
