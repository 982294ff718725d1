//! What every plan node of the crate (`SinkWriterExec`, `SinkCountExec`, `BatchFilterExec`, the
//! Pub/Sub source's scan node) writes alike in its `ExecutionPlan` impl, written once: macros
//! that stand inside `impl ExecutionPlan for ... { }`.

/// `name` (the node's type name, as given) and `properties` (the node's `properties` field, the
/// `Arc<PlanProperties>` computed when it was built).
macro_rules! name_and_properties {
    ($name:literal) => {
        fn name(&self) -> &'static str {
            $name
        }

        fn properties(&self) -> &::std::sync::Arc<::datafusion::physical_plan::PlanProperties> {
            &self.properties
        }
    };
}

/// `with_new_children`, which DataFusion 55 still requires while deprecating it, as its
/// documentation asks: `replace_children`, recomputing the node's properties.
macro_rules! with_new_children_by_replace {
    () => {
        fn with_new_children(
            self: ::std::sync::Arc<Self>,
            children: Vec<::std::sync::Arc<dyn ::datafusion::physical_plan::ExecutionPlan>>,
        ) -> ::datafusion::error::Result<
            ::std::sync::Arc<dyn ::datafusion::physical_plan::ExecutionPlan>,
        > {
            self.replace_children(
                children,
                ::datafusion::physical_plan::execution_plan::ReplaceChildrenOptions::new(
                    ::datafusion::physical_plan::execution_plan::ChildrenPropertiesMode::Recompute,
                ),
            )
        }
    };
}

/// `apply_expressions` of a node that owns no expression: nothing to visit.
macro_rules! no_expressions {
    () => {
        fn apply_expressions(
            &self,
            _f: &mut dyn FnMut(
                &::std::sync::Arc<dyn ::datafusion::physical_expr::PhysicalExpr>,
            ) -> ::datafusion::error::Result<
                ::datafusion::common::tree_node::TreeNodeRecursion,
            >,
        ) -> ::datafusion::error::Result<::datafusion::common::tree_node::TreeNodeRecursion> {
            Ok(::datafusion::common::tree_node::TreeNodeRecursion::Continue)
        }
    };
}

pub(crate) use {name_and_properties, no_expressions, with_new_children_by_replace};
