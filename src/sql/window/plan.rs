//! Planning a windowed aggregate between a source and a sink: DataFusion's aggregate (its
//! partial and final halves, with the repartition between them) over a source becomes one
//! [`WindowAggregateExec`] when one of its group expressions is a window over the source's
//! event time; any other aggregate over a source is refused with what to write instead.

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::ScalarValue;
use datafusion::physical_expr::expressions::{Column, Literal};
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

use super::exec::{WindowAggregateExec, WindowColumn, WindowQuery, WindowValue};
use super::state::{Aggregation, WindowShape};
use crate::connectors::descriptor::WindowedSource;
use crate::connectors::registry;
use crate::error::{Error, Result};
use crate::sql::lineage::{BatchFilterExec, delivery_input, first_source};

/// The names of this crate's window functions (`tumble(width)`, `hop(slide, width)`).
pub const TUMBLE: &str = "tumble";
/// See [`TUMBLE`].
pub const HOP: &str = "hop";

/// What the window group expression says, before it is checked against the source.
struct Found {
    position: usize,
    time: Arc<dyn PhysicalExpr>,
    shape: WindowShape,
    written: String,
    bounds: bool,
}

/// If `plan` is an aggregate over a source, the windowed node that replaces it (its input
/// connected by `connect`), or a refusal that says what to write instead. `Ok(None)` when
/// `plan` is no aggregate.
pub fn plan_window(
    plan: &Arc<dyn ExecutionPlan>,
    table: &str,
    connect: &dyn Fn(Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>>,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let Some(top) = plan.downcast_ref::<AggregateExec>() else {
        return Ok(None);
    };
    let partial = match top.mode() {
        AggregateMode::Final | AggregateMode::FinalPartitioned => partial_below(top.input())
            .ok_or_else(|| refuse(table, "its partial half was not found"))?,
        _ => top,
    };
    let group_by = partial.group_expr();
    if !group_by.is_single() {
        return Err(refuse(
            table,
            "GROUPING SETS, CUBE and ROLLUP are not windowed; group by one window and keys",
        ));
    }
    let input_schema = partial.input().schema();
    let mut found: Option<Found> = None;
    for (position, (expr, _)) in group_by.expr().iter().enumerate() {
        if let Some(window) = window_of(expr, position)? {
            if found.is_some() {
                return Err(refuse(table, "it groups by two windows; group by one"));
            }
            found = Some(window);
        }
    }
    let Some(found) = found else {
        let source = first_source(partial.input()).unwrap_or_else(|| "a source".into());
        return Err(Error::Unsupported(format!(
            "INSERT INTO '{table}' aggregates {source} without a window: an unbounded GROUP BY \
             never ends, so its rows could never be delivered nor its messages acknowledged. \
             Group by a window over the source's event time as well, for instance \
             GROUP BY key, date_bin(INTERVAL '1 minute', event_time) or \
             GROUP BY key, tumble(INTERVAL '1 minute') (hop(slide, width) for hopping windows); for a \
             total over all that was read, land the rows in a table first and run a bounded \
             query over it"
        )));
    };
    let input = connect(partial.input().clone())?;
    let Some(time) = found.time.downcast_ref::<Column>() else {
        return Err(refuse(
            table,
            &format!(
                "its window {} is over an expression; window over the source's event-time column itself",
                found.written
            ),
        ));
    };
    let Some((source_node, column)) = trace(&input, time.index()) else {
        return Err(refuse(
            table,
            &format!(
                "its window {} is over '{}', which is not a column of one source",
                found.written,
                time.name()
            ),
        ));
    };
    let source = windowed_source(&source_node)
        .ok_or_else(|| refuse(table, "the source it reads cannot feed windows"))?;
    check(&found, &source, &column, table)?;
    let partitions = input.output_partitioning().partition_count();
    let inputs = (0..partitions)
        .map(|p| {
            delivery_input(&input, p)
                .ok_or_else(|| refuse(table, "an input partition carries no delivery handles"))
        })
        .collect::<Result<Vec<_>>>()?;

    let mut keys = Vec::new();
    let mut key_fields = Vec::new();
    for (position, (expr, name)) in group_by.expr().iter().enumerate() {
        if position == found.position {
            continue;
        }
        key_fields.push(Field::new(name, expr.data_type(&input_schema)?, true));
        keys.push(expr.clone());
    }
    let aggregation = Aggregation {
        keys,
        key_schema: Arc::new(Schema::new(key_fields)),
        aggregates: partial.aggr_expr().to_vec(),
        filters: partial.filter_expr().to_vec(),
    };
    let schema = top.schema();
    let window_field = schema.field(found.position);
    let value = match (found.bounds, window_field.data_type()) {
        (true, DataType::Struct(fields)) => WindowValue::Bounds(fields.clone()),
        (false, ty) => WindowValue::Start(ty.clone()),
        (true, other) => {
            return Err(refuse(
                table,
                &format!("internal: the window column is {other}, not a struct of start and end"),
            ));
        }
    };
    let pipeline = pipeline_name(&source, table, &found.written, &aggregation);
    let window = WindowColumn {
        time: found.time.clone(),
        time_column: column,
        shape: found.shape,
        value,
        position: found.position,
        written: found.written,
    };
    let node = WindowAggregateExec::try_new(
        input,
        inputs,
        WindowQuery {
            window,
            aggregation,
            source,
            pipeline,
            table: table.to_string(),
            schema,
        },
    )?;
    Ok(Some(Arc::new(node)))
}

fn refuse(table: &str, why: &str) -> Error {
    Error::Unsupported(format!(
        "INSERT INTO '{table}' windows a source, which this project plans only as one window \
         (date_bin, tumble or hop over the source's event time) plus group keys and \
         aggregates, reading one source: {why}"
    ))
}

/// The partial aggregate under a final one, through the repartition between them.
fn partial_below(plan: &Arc<dyn ExecutionPlan>) -> Option<&AggregateExec> {
    if let Some(agg) = plan.downcast_ref::<AggregateExec>() {
        return (*agg.mode() == AggregateMode::Partial).then_some(agg);
    }
    let passes = plan.is::<RepartitionExec>()
        || plan.is::<CoalescePartitionsExec>()
        || plan.is::<CooperativeExec>();
    if !passes {
        return None;
    }
    match plan.children().as_slice() {
        [child] => partial_below(child),
        _ => None,
    }
}

/// The window a group expression is, if it is one: `date_bin(stride, time[, origin])`,
/// `tumble(width, time)` or `hop(slide, width, time)` (the planner's analyzer adds `time` to
/// the last two).
fn window_of(expr: &Arc<dyn PhysicalExpr>, position: usize) -> Result<Option<Found>> {
    let Some(call) = expr.downcast_ref::<ScalarFunctionExpr>() else {
        return Ok(None);
    };
    let args = call.args();
    let name = call.name();
    let interval = |i: usize, what: &str| -> Result<i64> {
        args.get(i)
            .and_then(|a| a.downcast_ref::<Literal>())
            .and_then(|l| interval_nanos(l.value()))
            .ok_or_else(|| {
                Error::Unsupported(format!(
                    "{name}'s {what} must be a constant INTERVAL of days, hours, minutes, seconds \
                     or less (months and years have no fixed length)"
                ))
            })
    };
    let (shape, time, written, bounds) = match (name, args.len()) {
        ("date_bin", 2 | 3) => {
            let stride = interval(0, "stride")?;
            let origin = match args.get(2) {
                None => 0,
                Some(o) => o
                    .downcast_ref::<Literal>()
                    .and_then(|l| timestamp_nanos(l.value()))
                    .ok_or_else(|| {
                        Error::Unsupported("date_bin's origin must be a constant TIMESTAMP".into())
                    })?,
            };
            let shape = WindowShape::tumbling(stride, origin);
            let written = format!("date_bin({}, {})", show(stride), args[1]);
            (shape, args[1].clone(), written, false)
        }
        (TUMBLE, 2) => {
            let width = interval(0, "width")?;
            (
                WindowShape::tumbling(width, 0),
                args[1].clone(),
                format!("tumble({})", show(width)),
                true,
            )
        }
        (HOP, 3) => {
            let slide = interval(0, "slide")?;
            let width = interval(1, "width")?;
            if slide <= 0 || width % slide != 0 {
                return Err(Error::Unsupported(format!(
                    "hop({}, {}): a hopping window's width must be a whole multiple of its slide \
                     (each row then falls in width / slide windows); for instance \
                     hop(INTERVAL '1 minute', INTERVAL '5 minutes')",
                    show(slide),
                    show(width)
                )));
            }
            (
                WindowShape {
                    width,
                    slide,
                    origin: 0,
                },
                args[2].clone(),
                format!("hop({}, {})", show(slide), show(width)),
                true,
            )
        }
        (TUMBLE | HOP, _) => {
            return Err(Error::Unsupported(format!(
                "{name}() is given the source's event time only where it is a GROUP BY key of an \
                 aggregate over one source: write it in the GROUP BY (GROUP BY user, \
                 {name}(...)) rather than in a subquery's SELECT list, or name the time as its \
                 last argument"
            )));
        }
        _ => return Ok(None),
    };
    if shape.width <= 0 {
        return Err(Error::Unsupported(format!(
            "{written}: a window's width must be positive"
        )));
    }
    Ok(Some(Found {
        position,
        time,
        shape,
        written,
        bounds,
    }))
}

fn interval_nanos(value: &ScalarValue) -> Option<i64> {
    match value {
        ScalarValue::IntervalMonthDayNano(Some(v)) if v.months == 0 => i64::from(v.days)
            .checked_mul(86_400_000_000_000)?
            .checked_add(v.nanoseconds),
        ScalarValue::IntervalDayTime(Some(v)) => i64::from(v.days)
            .checked_mul(86_400_000_000_000)?
            .checked_add(i64::from(v.milliseconds) * 1_000_000),
        _ => None,
    }
}

fn timestamp_nanos(value: &ScalarValue) -> Option<i64> {
    match value {
        ScalarValue::TimestampNanosecond(Some(v), _) => Some(*v),
        ScalarValue::TimestampMicrosecond(Some(v), _) => v.checked_mul(1_000),
        ScalarValue::TimestampMillisecond(Some(v), _) => v.checked_mul(1_000_000),
        ScalarValue::TimestampSecond(Some(v), _) => v.checked_mul(1_000_000_000),
        _ => None,
    }
}

/// A width as `60s`, `1.5s`, `250ms`.
fn show(nanos: i64) -> String {
    format!("{:?}", Duration::from_nanos(nanos.unsigned_abs()))
}

/// The source node and its column that input column `index` of `plan` is, through
/// projections and filters; `None` when it is computed, or comes from no source or several.
fn trace(plan: &Arc<dyn ExecutionPlan>, index: usize) -> Option<(Arc<dyn ExecutionPlan>, String)> {
    if windowed_source(plan).is_some() {
        return Some((plan.clone(), plan.schema().field(index).name().clone()));
    }
    if let Some(projection) = plan.downcast_ref::<ProjectionExec>() {
        let expr = &projection.expr().get(index)?.expr;
        let column = expr.downcast_ref::<Column>()?;
        return trace(projection.input(), column.index());
    }
    if let Some(filter) = plan.downcast_ref::<BatchFilterExec>() {
        let index = filter
            .projection()
            .map_or(Some(index), |p| p.get(index).copied())?;
        return trace(filter.input(), index);
    }
    if let Some(filter) = plan.downcast_ref::<FilterExec>() {
        let index = filter
            .projection()
            .as_ref()
            .map_or(Some(index), |p| p.get(index).copied())?;
        return trace(filter.input(), index);
    }
    let passes = plan.is::<CooperativeExec>() || plan.is::<RepartitionExec>();
    match (passes, plan.children().as_slice()) {
        (true, [child]) => trace(child, index),
        _ => None,
    }
}

fn windowed_source(plan: &Arc<dyn ExecutionPlan>) -> Option<WindowedSource> {
    registry::kinds()
        .filter_map(|kind| kind.descriptor().source)
        .find_map(|source| (source.windows)(plan.as_ref()))
}

/// The checks that need the source: the window is over its event time, fits in a lease, and
/// has a marker to record its progress in.
fn check(found: &Found, source: &WindowedSource, column: &str, table: &str) -> Result<()> {
    let e = &source.event_time;
    match &e.column {
        Some(event_time) if event_time == column => {}
        Some(event_time) => {
            return Err(refuse(
                table,
                &format!(
                    "its window {} is over '{column}', but the event time of {} is '{event_time}' \
                     (event_time_field, else publish_time_column): window over '{event_time}', \
                     or declare event_time_field = '{column}' on table '{}'",
                    found.written, source.describe, source.table
                ),
            ));
        }
        None => {
            return Err(refuse(
                table,
                &format!(
                    "{} has no event time: declare event_time_field = '<a TIMESTAMP column>' or \
                     publish_time_column = '<column>' on table '{}'",
                    source.describe, source.table
                ),
            ));
        }
    }
    let held = Duration::from_nanos(found.shape.width.unsigned_abs()) + e.allowed_lateness;
    if held >= source.max_lease_duration {
        return Err(refuse(
            table,
            &format!(
                "its window {} plus allowed_lateness ({:?}) holds a message for {held:?}, at least \
                 the source's max_lease_duration ({:?}), after which Pub/Sub would deliver it again \
                 while it is held: raise max_lease_duration on table '{}' above {held:?}, or \
                 use a shorter window or lateness",
                found.written, e.allowed_lateness, source.max_lease_duration, source.table
            ),
        ));
    }
    if e.progress.is_none() {
        return Err(refuse(
            table,
            &format!(
                "windows record how far they were delivered in a progress marker, and table '{}' \
                 names no progress_path: add progress_path = 'file:///var/lib/gcp-sql/progress' \
                 (or gs:// / s3://), with progress_start = 'new' on the first run",
                source.table
            ),
        ));
    }
    Ok(())
}

/// The marker's name: what is read, what is written, and a hash of the query's window, keys
/// and aggregates (a changed query starts a new pipeline).
fn pipeline_name(
    source: &WindowedSource,
    table: &str,
    window: &str,
    aggregation: &Aggregation,
) -> String {
    // The same name from every build: each part ends with a zero byte.
    let mut hash = crate::core::StableHash::new();
    let mut eat = |text: &str| {
        hash.write(text.as_bytes());
        hash.write(&[0]);
    };
    eat(window);
    for key in &aggregation.keys {
        eat(&key.to_string());
    }
    for aggregate in &aggregation.aggregates {
        eat(aggregate.name());
    }
    let safe = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    format!(
        "{}--{}--{:08x}",
        safe(&source.key),
        safe(table),
        hash.finish() as u32
    )
}
