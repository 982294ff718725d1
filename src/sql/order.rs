//! Keeping an `INSERT`'s `ORDER BY` when it sorts by something the INSERT does not write.
//!
//! DataFusion hands [`TableProvider::insert_into`](datafusion::catalog::TableProvider) the
//! physical plan of the `SELECT` before its physical optimizer runs. In
//! `INSERT INTO t SELECT payload, k FROM src ORDER BY id`, that plan is a projection of
//! `(payload, k)` over a sort by `id`: the projection drops `id`, so its output reports no
//! ordering, the sink node could not require one in its input's columns, and the optimizer
//! then removed the sort as unused and spread the rows round-robin. The same happened for an
//! `ORDER BY` on an expression of dropped columns, and for the part of a several-key `ORDER BY`
//! after the first key that is not written.
//!
//! [`carry_ordering`] finds the sort below the projections (and the limits and other
//! order-keeping nodes between), and adds each of its sort expressions to every projection
//! above it as an extra column at the end, named `__order_N(expression)`. The input then
//! reports the sort's whole ordering in those columns, the writers require it (with the key
//! distribution), the optimizer keeps the sort (or re-sorts each partition after a hash
//! repartition), and the writers drop the extra columns before a row is encoded. See
//! `docs/adr/0035-order-by-travels-in-hidden-columns.md`.

use std::sync::Arc;

use datafusion::common::DataFusionError;
use datafusion::error::Result as DFResult;
use datafusion::physical_expr::{LexOrdering, PhysicalExpr, PhysicalSortExpr};
use datafusion::physical_expr_common::physical_expr::fmt_sql;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::expressions::Column;
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

/// The prefix of an extra column that carries a sort expression to the writers.
pub const HIDDEN_PREFIX: &str = "__order_";

/// The input of an `INSERT` as its writers read it.
#[derive(Debug)]
pub struct Carried {
    /// The input, with the hidden columns (if any) after the table's.
    pub input: Arc<dyn ExecutionPlan>,
    /// The ordering the writers keep, in the columns of `input`; `None`: the input is not
    /// ordered.
    pub ordering: Option<LexOrdering>,
}

/// The `INSERT`'s input (whose columns are the table's `visible` ones), with the ordering of
/// the sort below its projections carried to its output in hidden columns when the
/// projections dropped part of it. An input whose own output ordering is the whole sort's, or
/// that has no sort, is returned as it is, with that ordering.
pub fn carry_ordering(input: Arc<dyn ExecutionPlan>, visible: usize) -> DFResult<Carried> {
    let own = input.output_ordering().cloned();
    // The nodes from the top down to the first one that is not a projection or an
    // order-keeping node with its input's columns: that one is the sort (or an ordered source).
    let mut path = Vec::new();
    let mut node = input.clone();
    while let Some(child) = through(&node) {
        path.push(node.clone());
        node = child;
    }
    let Some(sorted) = node.output_ordering().cloned() else {
        return Ok(Carried {
            input,
            ordering: own,
        });
    };
    if path.is_empty() || own.as_ref().is_some_and(|o| o.len() >= sorted.len()) {
        // Nothing between the sort and the writers dropped a sort expression.
        return Ok(Carried {
            input,
            ordering: own,
        });
    }
    let names: Vec<String> = sorted
        .iter()
        .enumerate()
        .map(|(i, s)| format!("{HIDDEN_PREFIX}{i}({})", fmt_sql(s.expr.as_ref())))
        .collect();
    // The sort expressions as they read in the current node's output: first the sort's own,
    // then the hidden columns of the projection last rebuilt.
    let mut carried: Vec<Arc<dyn PhysicalExpr>> = sorted.iter().map(|s| s.expr.clone()).collect();
    let mut plan = node;
    let mut projected = false;
    for above in path.into_iter().rev() {
        if let Some(projection) = above.downcast_ref::<ProjectionExec>() {
            (plan, carried) = add_hidden(projection.expr().to_vec(), plan, &carried, &names)?;
            projected = true;
        } else {
            let options = ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute);
            plan = above
                .clone()
                .replace_children(vec![plan], options)
                .map_err(|e| {
                    DataFusionError::Plan(format!(
                        "the INSERT's ORDER BY cannot be kept through {}: {e}",
                        above.name()
                    ))
                })?;
        }
    }
    if !projected {
        // Order-keeping nodes only (a limit over the sort): one projection adds the columns.
        let schema = plan.schema();
        let exprs: Vec<ProjectionExpr> = schema
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| ProjectionExpr::new(Arc::new(Column::new(f.name(), i)), f.name()))
            .collect();
        (plan, carried) = add_hidden(exprs, plan, &carried, &names)?;
    }
    if plan.schema().fields().len() != visible + names.len() {
        return Err(DataFusionError::Internal(format!(
            "carrying the INSERT's ORDER BY gave {} columns, expected the table's {visible} and \
             {} hidden",
            plan.schema().fields().len(),
            names.len()
        )));
    }
    let ordering = LexOrdering::new(
        carried
            .into_iter()
            .zip(sorted.iter())
            .map(|(expr, s)| PhysicalSortExpr::new(expr, s.options)),
    );
    Ok(Carried {
        input: plan,
        ordering,
    })
}

/// A plan, and expressions over its output columns.
type PlanWithExprs = (Arc<dyn ExecutionPlan>, Vec<Arc<dyn PhysicalExpr>>);

/// A projection of `exprs` over `plan`, followed by the `carried` sort expressions (in
/// `plan`'s columns) as the hidden columns `names`; with the carried expressions as columns of
/// the projection's output.
fn add_hidden(
    mut exprs: Vec<ProjectionExpr>,
    plan: Arc<dyn ExecutionPlan>,
    carried: &[Arc<dyn PhysicalExpr>],
    names: &[String],
) -> DFResult<PlanWithExprs> {
    let width = exprs.len();
    for (expr, name) in carried.iter().zip(names) {
        exprs.push(ProjectionExpr::new(expr.clone(), name.clone()));
    }
    let plan: Arc<dyn ExecutionPlan> = Arc::new(ProjectionExec::try_new(exprs, plan)?);
    let carried = names
        .iter()
        .enumerate()
        .map(|(i, name)| Arc::new(Column::new(name, width + i)) as Arc<dyn PhysicalExpr>)
        .collect();
    Ok((plan, carried))
}

/// The input of `node` when rows pass it in order and a column added at the end of that input
/// can be added at the end of its output: a projection, or a node with one input whose columns
/// are its input's (a limit, a batch coalescer, a filter without projection).
fn through(node: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
    let children = node.children();
    let [child] = children.as_slice() else {
        return None;
    };
    if node.downcast_ref::<ProjectionExec>().is_some() {
        return Some((*child).clone());
    }
    let keeps_order = node.maintains_input_order().first().copied() == Some(true);
    let same_columns = node.schema().fields() == child.schema().fields();
    let one_partition_like_its_input = node.output_partitioning().partition_count()
        == child.output_partitioning().partition_count();
    (keeps_order && same_columns && one_partition_like_its_input).then(|| (*child).clone())
}
