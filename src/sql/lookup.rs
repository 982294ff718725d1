//! Where joins with a connector's table become lookup joins
//! ([`crate::connectors::registry::LOOKUPS`], ADR 0078): between a source and a sink, [`super::lineage`]
//! connects a join only as a lookup; in any other query [`LookupJoinRule`] rewrites the joins
//! that can be one after DataFusion's own physical optimizer rules ran (and leaves the others
//! as hash joins).

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::config::ConfigOptions;
use datafusion::error::Result as DFResult;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;

use crate::connectors::registry::lookup_join as rewrite;

/// Rewrites every join with a Bigtable table on its row key into a lookup join.
#[derive(Debug, Default)]
pub struct LookupJoinRule;

impl PhysicalOptimizerRule for LookupJoinRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            Ok(match rewrite(&node, super::lineage::delivery_input) {
                Ok(Some(lookup)) => Transformed::yes(lookup),
                // Not a lookup: a bounded query joins as DataFusion plans it.
                Ok(None) | Err(_) => Transformed::no(node),
            })
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "lookup_join"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
