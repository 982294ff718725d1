//! The sink table: its `SELECT` planned by the connector's reader when it has one (else it
//! is write-only), its `INSERT` planned as [`SinkWriterExec`] under
//! [`SinkCountExec`].

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::TableType;
use datafusion::error::Result as DFResult;
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;

use super::exec::{SinkCountExec, SinkWriterExec};
use super::order::carry_ordering;
use crate::connectors::SinkConnector;
use crate::error::Error;

use super::factory::SinkDeclaration;
use super::spec::SinkSpec;

/// A table backed by a connector: written by `INSERT`, and read by `SELECT` when the connector
/// has a reader ([`SinkConnector::reader`]).
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

    /// The table's name (as declared; used in messages).
    pub fn name(&self) -> &str {
        &self.name
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

    fn write_only(&self, statement: &str) -> Error {
        Error::Unsupported(format!(
            "{statement} is not supported on '{}': a {} sink is write-only; it can be the target of INSERT INTO",
            self.name,
            self.sink.kind().name()
        ))
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

    /// A table whose connector reads (Bigtable) says which filters its scan applies.
    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DFResult<Vec<TableProviderFilterPushDown>> {
        match self.sink.reader() {
            Some(reader) => reader.supports_filters_pushdown(filters),
            None => Ok(vec![
                TableProviderFilterPushDown::Unsupported;
                filters.len()
            ]),
        }
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        if let Some(reader) = self.sink.reader() {
            return reader.scan(state, projection, filters, limit).await;
        }
        Err(Error::Unsupported(format!(
            "table '{}' is a write-only {} sink: it can be the target of INSERT INTO, not read",
            self.name,
            self.sink.kind().name()
        ))
        .into())
    }

    /// `DELETE`, planned by the connector's reader when it has one (Bigtable).
    async fn delete_from(
        &self,
        state: &dyn Session,
        filters: Vec<Expr>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        match self.sink.reader() {
            Some(reader) => reader.delete_from(state, filters).await,
            None => Err(self.write_only("DELETE").into()),
        }
    }

    /// `UPDATE`, planned by the connector's reader when it has one (Bigtable).
    async fn update(
        &self,
        state: &dyn Session,
        assignments: Vec<(String, Expr)>,
        filters: Vec<Expr>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        match self.sink.reader() {
            Some(reader) => reader.update(state, assignments, filters).await,
            None => Err(self.write_only("UPDATE").into()),
        }
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
        let writers = if self.sink.routing().keep_order && !super::lineage::reads_source(&input) {
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
