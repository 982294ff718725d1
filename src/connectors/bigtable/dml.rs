//! `DELETE` and `UPDATE` on a declared Bigtable table (ADR 0077).
//!
//! [`BigtableTable`] is the reading side a Bigtable sink hands the SQL layer: `SELECT` is the
//! scan of [`super::scan`], and DataFusion's `delete_from` / `update` hooks are planned here as
//! a scan of the matching rows feeding the table's own sink:
//!
//! - `DELETE FROM t WHERE <row-key predicate>` reads the keys only (the scan's row marker: the
//!   first cell of each row, value stripped) and writes one `DeleteFromRow` entry per key, the
//!   sink's `op_column` delete.
//! - `UPDATE t SET c = e, ... WHERE <row-key predicate>` reads the key and the columns the
//!   expressions use, computes the new values and writes them as set-cell mutations of the
//!   assigned columns only (a `NULL` deletes the cell); other cells are untouched.
//!
//! Both write through [`Sink::write_all`](crate::connectors::sink::Sink): the same `MutateRows`
//! batches, in-flight caps, retries and failure policy as an `INSERT`, and return the rows
//! written as DataFusion's DML count. The row key written back is the key as read, byte for
//! byte, so a key that does not decode canonically is still the one deleted or updated.
//!
//! The `WHERE` clause may name only row-key columns (a predicate on another column is refused,
//! naming it) and must be present (a statement without one is refused: a whole-table change is
//! written deliberately, as `WHERE k >= ''` for a text key; DataFusion drops `k IS NOT NULL` on a
//! NOT NULL key before the hook sees it). A key predicate the scan cannot turn into
//! exact row ranges is applied to the keys read.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, RecordBatch, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema};
use datafusion::datasource::TableType;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use futures::StreamExt;

use super::client::ClientSettings;
use super::options::{BigtableSinkOptions, NullHandling, WriteMode};
use super::scan::exec::{ScanSpec, Source};
use super::scan::{BigtableScanExec, BigtableScanTable};
use super::writer::BigtableSink;
use crate::connectors::SinkConnector;
use crate::core::SinkMetrics;
use crate::core::run::{WriterContext, new_statement_id};
use crate::error::{Error, Result};
use crate::plan::node::{name_and_properties, with_new_children_by_replace};

/// The column carrying each row's key, as read, from the scan to the writing sink.
pub const ROW_KEY_COLUMN: &str = "__gcp_sql_row_key";
/// The operation column of a `DELETE`'s sink (every row: `delete`).
const OP_COLUMN: &str = "__gcp_sql_op";
/// A cell column of a `DELETE`'s sink, always null: the mapping wants one cell column, and a
/// delete row writes none.
const NO_CELL_COLUMN: &str = "__gcp_sql_no_cell";

/// A declared Bigtable table as the SQL layer sees it: read by [`BigtableScanTable`], deleted
/// from and updated through the table's sink.
#[derive(Debug, Clone)]
pub struct BigtableTable {
    scan: BigtableScanTable,
    schema: SchemaRef,
    options: BigtableSinkOptions,
}

/// What a [`BigtableDmlExec`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DmlKind {
    /// `DELETE`: a `DeleteFromRow` per key read.
    Delete,
    /// `UPDATE`: set-cell of the assigned columns per row read.
    Update,
}

impl DmlKind {
    fn statement(self) -> &'static str {
        match self {
            DmlKind::Delete => "DELETE",
            DmlKind::Update => "UPDATE",
        }
    }
}

impl BigtableTable {
    /// The table declared with `options` and `schema` (already checked by the sink's mapping);
    /// contacts no service.
    pub fn new(options: BigtableSinkOptions, schema: SchemaRef, settings: ClientSettings) -> Self {
        BigtableTable {
            scan: BigtableScanTable::new(options.clone(), schema.clone(), settings),
            schema,
            options,
        }
    }

    fn table_name(&self) -> &str {
        self.options.table.as_deref().unwrap_or("(table per row)")
    }

    fn key_columns(&self) -> &[String] {
        &self.options.mapping.row_key
    }

    /// The `WHERE` conjuncts without table qualifiers, checked: present, and naming only
    /// row-key columns.
    fn key_filters(&self, kind: DmlKind, filters: Vec<Expr>) -> Result<Vec<Expr>> {
        let keys = self.key_columns();
        if filters.is_empty() {
            // (DataFusion drops a condition it can prove always true, such as `k IS NOT NULL`
            // on a NOT NULL key, before it reaches here.)
            let every = match self.schema.field_with_name(&keys[0]).map(|f| f.data_type()) {
                Ok(DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) => {
                    format!("write 'WHERE {} >= '''", keys[0])
                }
                _ => format!("write a condition on {} that holds for every row", keys[0]),
            };
            return Err(Error::Unsupported(format!(
                "{} without WHERE on Bigtable table '{}' would change every row; write a row-key \
                 predicate (on {}), or, to change every row deliberately, {every}",
                kind.statement(),
                self.table_name(),
                keys.join(", "),
            )));
        }
        let mut out = Vec::with_capacity(filters.len());
        for filter in filters {
            let filter = filter
                .transform(|e| {
                    Ok(match e {
                        Expr::Column(c) if c.relation.is_some() => {
                            Transformed::yes(Expr::Column(Column::new_unqualified(c.name)))
                        }
                        e => Transformed::no(e),
                    })
                })?
                .data;
            let mut names: Vec<String> = filter
                .column_refs()
                .into_iter()
                .map(|c| c.name.clone())
                .collect();
            names.sort();
            if let Some(other) = names.iter().find(|n| !keys.contains(n)) {
                return Err(Error::Unsupported(format!(
                    "{} on Bigtable table '{}' can only select rows by their row key ({}); \
                     the WHERE clause uses column '{other}', which is not part of it: write the \
                     condition on the row key (or SELECT the keys first and {} by key)",
                    kind.statement(),
                    self.table_name(),
                    keys.join(", "),
                    kind.statement()
                )));
            }
            out.push(filter);
        }
        Ok(out)
    }

    /// The rows of `filters`: a scan of the columns `projection` (table indices) plus the row
    /// key as read ([`ROW_KEY_COLUMN`], last), under a filter of whatever the key ranges do
    /// not settle exactly.
    async fn read(
        &self,
        state: &dyn Session,
        projection: Vec<usize>,
        filters: &[Expr],
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let plan = self
            .scan
            .scan(state, Some(&projection), filters, None)
            .await?;
        let scan = plan.downcast_ref::<BigtableScanExec>().ok_or_else(|| {
            DataFusionError::Internal("a Bigtable scan plans its own node".into())
        })?;
        let spec = scan.spec();
        let mut fields: Vec<Field> = spec
            .schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields.push(Field::new(ROW_KEY_COLUMN, DataType::LargeBinary, false));
        let mut sources = spec.sources.clone();
        sources.push(Source::RowKey);
        let with_key = Arc::new(ScanSpec {
            table: spec.table.clone(),
            app_profile_id: spec.app_profile_id.clone(),
            settings: spec.settings.clone(),
            schema: Arc::new(Schema::new(fields)),
            sources,
            cells: spec.cells.clone(),
            key_parts: spec.key_parts,
            delimiter: spec.delimiter.clone(),
            filter: spec.filter.clone(),
            filter_text: spec.filter_text.clone(),
            limit: None,
            connection: tokio::sync::OnceCell::new(),
        });
        let mut input: Arc<dyn ExecutionPlan> = Arc::new(BigtableScanExec::new(
            with_key.clone(),
            scan.keys().clone(),
            scan.partitions().to_vec(),
        ));
        // What the row ranges do not select exactly is filtered here, on the keys read.
        let refs: Vec<&Expr> = filters.iter().collect();
        let residual: Vec<Expr> = self
            .scan
            .supports_filters_pushdown(&refs)?
            .into_iter()
            .zip(filters)
            .filter(|(p, _)| *p != TableProviderFilterPushDown::Exact)
            .map(|(_, f)| f.clone())
            .collect();
        if let Some(predicate) = conjunction(residual) {
            let df_schema = DFSchema::try_from(with_key.schema.clone())?;
            let predicate = state.create_physical_expr(predicate, &df_schema)?;
            input = Arc::new(FilterExec::try_new(predicate, input)?);
        }
        Ok(input)
    }

    /// The table's sink, narrowed to write `fields` (the row key as read, first) as `kind`
    /// does: every other option (connection, flow control, failure policy) as declared.
    fn sink(&self, kind: DmlKind, fields: Vec<Field>) -> Result<Arc<dyn SinkConnector>> {
        let mut options = self.options.clone();
        let m = &mut options.mapping;
        m.row_key = vec![ROW_KEY_COLUMN.to_string()];
        m.table_column = None;
        m.instance_column = None;
        m.write_mode = WriteMode::Upsert;
        options.auto_create_table = false;
        match kind {
            DmlKind::Delete => {
                m.op_column = Some(OP_COLUMN.to_string());
                m.timestamp_column = None;
            }
            DmlKind::Update => {
                m.op_column = None;
                // SET c = NULL leaves the column NULL: its cell is deleted.
                m.null_handling = NullHandling::Delete;
            }
        }
        let schema = Arc::new(Schema::new(fields));
        Ok(Arc::new(BigtableSink::from_options(schema, options)?))
    }

    fn index_of(&self, name: &str) -> usize {
        self.schema.index_of(name).expect("a column of the table")
    }
}

#[async_trait]
impl TableProvider for BigtableTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DFResult<Vec<TableProviderFilterPushDown>> {
        self.scan.supports_filters_pushdown(filters)
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        self.scan.scan(state, projection, filters, limit).await
    }

    /// `DELETE FROM t WHERE <row-key predicate>`: the keys read, each a `DeleteFromRow`.
    async fn delete_from(
        &self,
        state: &dyn Session,
        filters: Vec<Expr>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let filters = self.key_filters(DmlKind::Delete, filters)?;
        let keys: Vec<usize> = self
            .key_columns()
            .iter()
            .map(|k| self.index_of(k))
            .collect();
        let input = self.read(state, keys, &filters).await?;
        let sink = self.sink(
            DmlKind::Delete,
            vec![
                Field::new(ROW_KEY_COLUMN, DataType::LargeBinary, false),
                Field::new(OP_COLUMN, DataType::Utf8, false),
                Field::new(NO_CELL_COLUMN, DataType::Utf8, true),
            ],
        )?;
        Ok(Arc::new(BigtableDmlExec::new(
            DmlKind::Delete,
            self.table_name().to_string(),
            input,
            sink,
            Vec::new(),
            Vec::new(),
        )))
    }

    /// `UPDATE t SET c = e, ... WHERE <row-key predicate>`: the rows read, their assigned
    /// columns written as set-cell mutations.
    async fn update(
        &self,
        state: &dyn Session,
        assignments: Vec<(String, Expr)>,
        filters: Vec<Expr>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let m = &self.options.mapping;
        let available = || {
            self.schema
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        for (column, _) in &assignments {
            if self.schema.field_with_name(column).is_err() {
                return Err(Error::Unsupported(format!(
                    "UPDATE of Bigtable table '{}': there is no column '{column}' (columns: {})",
                    self.table_name(),
                    available()
                ))
                .into());
            }
            if m.row_key.contains(column) {
                return Err(Error::Unsupported(format!(
                    "UPDATE of Bigtable table '{}' cannot set '{column}': it is part of the row \
                     key ({}), and a row's key does not change; INSERT the row under its new key \
                     and DELETE the old one",
                    self.table_name(),
                    m.row_key.join(", ")
                ))
                .into());
            }
        }
        if assignments.is_empty() {
            return Err(Error::Unsupported(format!(
                "UPDATE of Bigtable table '{}' sets no column",
                self.table_name()
            ))
            .into());
        }
        let filters = self.key_filters(DmlKind::Update, filters)?;
        // Read the key, every column an expression uses and the timestamp column (an updated
        // cell keeps its row's version unless the timestamp is assigned).
        let mut needed: Vec<usize> = m.row_key.iter().map(|k| self.index_of(k)).collect();
        for (_, expr) in &assignments {
            for c in expr.column_refs() {
                if let Ok(i) = self.schema.index_of(&c.name) {
                    needed.push(i);
                }
            }
        }
        let timestamp = m.timestamp_column.clone();
        if let Some(t) = &timestamp {
            needed.push(self.index_of(t));
        }
        needed.sort_unstable();
        needed.dedup();
        let input = self.read(state, needed, &filters).await?;
        let input_schema = DFSchema::try_from(input.schema())?;
        let mut fields = vec![Field::new(ROW_KEY_COLUMN, DataType::LargeBinary, false)];
        let mut values: Vec<Arc<dyn PhysicalExpr>> = Vec::new();
        for (column, expr) in &assignments {
            fields.push(
                self.schema
                    .field_with_name(column)?
                    .clone()
                    .with_nullable(true),
            );
            values.push(state.create_physical_expr(expr.clone(), &input_schema)?);
        }
        if let Some(t) = &timestamp
            && !assignments.iter().any(|(c, _)| c == t)
        {
            fields.push(self.schema.field_with_name(t)?.clone().with_nullable(true));
            values.push(state.create_physical_expr(
                Expr::Column(Column::new_unqualified(t.clone())),
                &input_schema,
            )?);
        }
        let sink = self.sink(DmlKind::Update, fields)?;
        Ok(Arc::new(BigtableDmlExec::new(
            DmlKind::Update,
            self.table_name().to_string(),
            input,
            sink,
            values,
            assignments.into_iter().map(|(c, _)| c).collect(),
        )))
    }
}

/// Writes the rows its input reads through a narrowed sink of the table: a `DeleteFromRow` per
/// row (`DELETE`) or the assigned cells (`UPDATE`); its one output row is DataFusion's DML
/// count, the rows the service acknowledged.
pub struct BigtableDmlExec {
    kind: DmlKind,
    table: String,
    input: Arc<dyn ExecutionPlan>,
    sink: Arc<dyn SinkConnector>,
    /// `UPDATE`: the new value of each written column after the key, over the input's rows.
    values: Vec<Arc<dyn PhysicalExpr>>,
    /// `UPDATE`: the assigned columns (for EXPLAIN).
    assigned: Vec<String>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl fmt::Debug for BigtableDmlExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BigtableDmlExec")
            .field("kind", &self.kind)
            .field("table", &self.table)
            .field("assigned", &self.assigned)
            .finish_non_exhaustive()
    }
}

fn count_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        "count",
        DataType::UInt64,
        false,
    )]))
}

impl BigtableDmlExec {
    fn new(
        kind: DmlKind,
        table: String,
        input: Arc<dyn ExecutionPlan>,
        sink: Arc<dyn SinkConnector>,
        values: Vec<Arc<dyn PhysicalExpr>>,
        assigned: Vec<String>,
    ) -> Self {
        let properties = PlanProperties::new(
            EquivalenceProperties::new(count_schema()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        BigtableDmlExec {
            kind,
            table,
            input,
            sink,
            values,
            assigned,
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    /// What the statement does.
    pub fn kind(&self) -> DmlKind {
        self.kind
    }

    /// One input batch as the narrowed sink's rows.
    fn to_sink_rows(
        kind: DmlKind,
        schema: &SchemaRef,
        values: &[Arc<dyn PhysicalExpr>],
        batch: &RecordBatch,
    ) -> DFResult<RecordBatch> {
        let key = batch.column(batch.num_columns() - 1).clone();
        let mut columns: Vec<ArrayRef> = vec![key];
        match kind {
            DmlKind::Delete => {
                columns.push(Arc::new(StringArray::from_iter_values(
                    std::iter::repeat_n("delete", batch.num_rows()),
                )));
                columns.push(datafusion::arrow::array::new_null_array(
                    &DataType::Utf8,
                    batch.num_rows(),
                ));
            }
            DmlKind::Update => {
                for (expr, field) in values.iter().zip(schema.fields().iter().skip(1)) {
                    let value = expr.evaluate(batch)?.into_array(batch.num_rows())?;
                    columns.push(if value.data_type() == field.data_type() {
                        value
                    } else {
                        cast(&value, field.data_type())?
                    });
                }
            }
        }
        Ok(RecordBatch::try_new(schema.clone(), columns)?)
    }
}

impl DisplayAs for BigtableDmlExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            DmlKind::Delete => write!(
                f,
                "BigtableDmlExec: DELETE from table={}, one DeleteFromRow per row key read",
                self.table
            ),
            DmlKind::Update => write!(
                f,
                "BigtableDmlExec: UPDATE table={}, set-cell of [{}] per row read",
                self.table,
                self.assigned.join(", ")
            ),
        }
    }
}

impl ExecutionPlan for BigtableDmlExec {
    name_and_properties!("BigtableDmlExec");

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(
            &Arc<dyn PhysicalExpr>,
        ) -> DFResult<datafusion::common::tree_node::TreeNodeRecursion>,
    ) -> DFResult<datafusion::common::tree_node::TreeNodeRecursion> {
        use datafusion::common::tree_node::TreeNodeRecursion;
        for v in &self.values {
            if f(v)? == TreeNodeRecursion::Stop {
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
        _options: datafusion::physical_plan::execution_plan::ReplaceChildrenOptions,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal(
                "BigtableDmlExec has one child".into(),
            ));
        }
        Ok(Arc::new(BigtableDmlExec::new(
            self.kind,
            self.table.clone(),
            children.swap_remove(0),
            self.sink.clone(),
            self.values.clone(),
            self.assigned.clone(),
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
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "BigtableDmlExec has one partition, asked for {partition}"
            )));
        }
        // Every input partition is read, interleaved: one writer, so the statement's caps
        // apply whole.
        let partitions = self.input.output_partitioning().partition_count();
        let streams = (0..partitions)
            .map(|p| self.input.execute(p, context.clone()))
            .collect::<DFResult<Vec<_>>>()?;
        let input = futures::stream::select_all(streams);
        let sink = self.sink.clone();
        let schema = sink.schema().clone();
        let values = self.values.clone();
        let kind = self.kind;
        let rows_schema = schema.clone();
        let rows = input.map(move |batch| Self::to_sink_rows(kind, &rows_schema, &values, &batch?));
        let rows: SendableRecordBatchStream = Box::pin(RecordBatchStreamAdapter::new(schema, rows));
        let metrics = SinkMetrics::new(&self.metrics);
        let ctx = WriterContext {
            statement: new_statement_id().into(),
            table: Some(self.table.as_str().into()),
            runtime: Some(context.runtime_env()),
            ..WriterContext::single()
        };
        let out = count_schema();
        let stream = futures::stream::once(async move {
            let count = sink.write_all(rows, metrics, &ctx).await?;
            Ok(RecordBatch::try_new(
                out,
                vec![Arc::new(datafusion::arrow::array::UInt64Array::from(vec![
                    count,
                ]))],
            )?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            count_schema(),
            stream,
        )))
    }
}
