//! What the SQL layer knows of a connector's lookup joins (ADR 0078): a way to turn a join with
//! one of its tables into a lookup node, and, for such a node, its input and where it
//! publishes the delivery handle of the batch it emitted last. The registry lists the
//! connectors that have one ([`crate::connectors::registry::LOOKUPS`]).

use std::sync::Arc;

use datafusion::physical_plan::ExecutionPlan;

use crate::core::delivery::UpstreamOf;
use crate::core::delivery::subset::SubsetSlot;

/// What [`LookupPlanner::rewrite`] answers: `Ok(Some(node))`, `Ok(None)` or `Err(why)`.
pub type Rewritten = Result<Option<Arc<dyn ExecutionPlan>>, String>;

/// A lookup node's input and the slot of one of its output partitions
/// ([`LookupPlanner::pass_through`]).
pub type PassThrough = (Arc<dyn ExecutionPlan>, Arc<SubsetSlot>);

/// The lookup joins of one connector.
#[derive(Debug)]
pub struct LookupPlanner {
    /// `Ok(Some(node))`: the join as a lookup node with the same output; `Ok(None)`: not a
    /// join with one of this connector's tables; `Err(why)`: one that cannot be a lookup, why
    /// (and what to write instead). The node finds its input's delivery handles through the
    /// given [`UpstreamOf`].
    pub rewrite: fn(&Arc<dyn ExecutionPlan>, UpstreamOf) -> Rewritten,
    /// For a lookup node of this connector: its input, and the slot of output partition
    /// `partition`; `None` for any other node.
    pub pass_through: fn(&dyn ExecutionPlan, usize) -> Option<PassThrough>,
    /// Whether `plan` is a lookup node of this connector.
    pub is_node: fn(&dyn ExecutionPlan) -> bool,
}
