//! The sink table: write-only, its `INSERT` planned as [`SinkWriterExec`] under
//! [`SinkCountExec`].

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::TableType;
use datafusion::error::Result as DFResult;
use datafusion::logical_expr::Expr;
use datafusion::logical_expr::dml::InsertOp;
use datafusion::physical_plan::ExecutionPlan;

use super::exec::{SinkCountExec, SinkWriterExec};
use super::order::carry_ordering;
use crate::connectors::SinkConnector;
use crate::error::Error;

use super::factory::SinkDeclaration;
use super::spec::SinkSpec;

/// A write-only table backed by a connector.
#[derive(Debug, Clone)]
pub struct SinkTable {
    name: String,
    sink: Arc<dyn SinkConnector>,
    declaration: Option<Arc<SinkDeclaration>>,
    spec: Option<Arc<SinkSpec>>,
}

impl SinkTable {
    /// Wraps a connector under a table name (used in messages).
    pub fn new(name: impl Into<String>, sink: Arc<dyn SinkConnector>) -> Self {
        Self {
            name: name.into(),
            sink,
            declaration: None,
            spec: None,
        }
    }

    /// Keeps the SQL declaration the table was created from (what `\d NAME` shows).
    pub fn with_declaration(mut self, declaration: SinkDeclaration) -> Self {
        self.declaration = Some(Arc::new(declaration));
        self
    }

    /// Keeps what rebuilds the table's sink in another process (a cluster's scheduler and
    /// executors, see [`SinkSpec`]).
    pub fn with_spec(mut self, spec: SinkSpec) -> Self {
        self.spec = Some(Arc::new(spec));
        self
    }

    /// What rebuilds the table's sink in another process; `None` for a table built from typed
    /// options in Rust (which a cluster cannot carry).
    pub fn spec(&self) -> Option<&Arc<SinkSpec>> {
        self.spec.as_ref()
    }

    /// The SQL declaration the table was created from, with secret values redacted; `None`
    /// for a table built from typed options in Rust.
    pub fn declaration(&self) -> Option<&SinkDeclaration> {
        self.declaration.as_deref()
    }

    /// The connector behind the table.
    pub fn sink(&self) -> &Arc<dyn SinkConnector> {
        &self.sink
    }
}

#[async_trait]
impl TableProvider for SinkTable {
    fn schema(&self) -> SchemaRef {
        self.sink.schema().clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        _projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        Err(Error::Unsupported(format!(
            "table '{}' is a write-only {} sink: it can be the target of INSERT INTO, not read",
            self.name,
            self.sink.kind().name()
        ))
        .into())
    }

    async fn insert_into(
        &self,
        _state: &dyn Session,
        input: Arc<dyn ExecutionPlan>,
        insert_op: InsertOp,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let refused = match insert_op {
            InsertOp::Append => None,
            InsertOp::Overwrite => Some("INSERT OVERWRITE"),
            InsertOp::Replace => Some("REPLACE INTO"),
        };
        if let Some(what) = refused {
            return Err(Error::Unsupported(format!(
                "{what} is not supported on '{}': a {} sink only appends; use INSERT INTO",
                self.name,
                self.sink.kind().name()
            ))
            .into());
        }
        if let Some(kind) = source_in(&input) {
            return Err(Error::Unsupported(format!(
                "INSERT INTO '{}' reads from a {} source: writing a source's rows into a sink is \
                 not supported yet, because its messages would be acknowledged before the sink \
                 delivered their rows (acknowledgement after delivery is issue 22's next step); \
                 read the source with a plain query, or land the data in a file or table first",
                self.name,
                kind.display_name()
            ))
            .into());
        }
        let writers = if self.sink.routing().keep_order {
            // The ORDER BY, whatever it sorts by, reaches the writers (hidden columns carry
            // what the INSERT does not write).
            let carried = carry_ordering(input, self.sink.schema().fields().len())?;
            SinkWriterExec::try_new_with_ordering(
                self.name.clone(),
                self.sink.clone(),
                carried.input,
                carried.ordering,
            )?
        } else {
            SinkWriterExec::try_new(self.name.clone(), self.sink.clone(), input)?
        }
        .with_spec(self.spec.clone());
        Ok(Arc::new(SinkCountExec::new(Arc::new(writers))))
    }
}

/// The connector whose source node `plan` reads from, if any (the first found).
fn source_in(plan: &Arc<dyn ExecutionPlan>) -> Option<crate::connectors::ConnectorKind> {
    crate::connectors::registry::kinds()
        .find(|kind| (kind.descriptor().source_node)(plan.as_ref()))
        .or_else(|| plan.children().into_iter().find_map(source_in))
}
