//! An `INSERT` that reads a source (a Pub/Sub subscription), run on this side of the FFI
//! (docs/adr/0067).
//!
//! A message is acknowledged only after every row made from it landed; the crate keeps that
//! promise by planning the nodes between the source and the writers itself
//! (`gcp_sql::sql::lineage`: filters that hand each batch on, no repartition, one writer per
//! source partition). Across DataFusion's FFI those nodes would be the host's, opaque here, and
//! its optimizer would gather and spread batches: the promise could not be kept. So each
//! context `gcp_sql.register` sets up gets a [`NativeSession`]: a DataFusion session of this
//! side, into which the package's table factories put every table they declare for the host
//! too (the same source, the same sink). `gcp_sql.sql` asks it whether a statement is an
//! `INSERT` (or an `EXPLAIN` of one) that reads one of its sources; such a statement is
//! planned and run here, as the `gcp-sql` tool runs it, and its report kept for
//! `gcp_sql.last_report`.

use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{Array, UInt64Array};
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::catalog::TableProvider;
use datafusion::common::TableReference;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::source_as_provider;
use datafusion::error::DataFusionError;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::{DFParser, Statement};
use datafusion::sql::sqlparser::ast::Statement as SqlStatement;
use gcp_sql::connectors::registry;
use gcp_sql::core::metrics::names;
use pyo3::prelude::*;

use crate::provider::PyConnectorFactory;

/// The metrics a pipeline's report sums over its plan: the sink's, then the source's.
const REPORTED: [&str; 9] = [
    names::RECORDS_SENT,
    names::RECORDS_ACKED,
    names::RECORDS_DROPPED,
    names::RECORDS_SKIPPED,
    names::RECORDS_DEAD_LETTERED,
    names::RETRIES,
    names::SOURCE_MESSAGES_READ,
    names::SOURCE_MESSAGES_ACKED,
    names::SOURCE_MESSAGES_NACKED,
];

/// This side's session of one host context: the tables the package declared for it, and the
/// report of the last pipeline it ran.
pub struct NativeSession {
    ctx: SessionContext,
    report: Mutex<Option<Vec<(&'static str, u64)>>>,
}

impl std::fmt::Debug for NativeSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NativeSession")
            .field("session", &self.ctx.session_id())
            .finish_non_exhaustive()
    }
}

impl NativeSession {
    fn new() -> Self {
        Self {
            ctx: gcp_sql::sql::new_context_with_control(crate::stop::control()),
            report: Mutex::new(None),
        }
    }

    /// Declares `table` under `name` here too (replacing a table of that name: the host
    /// called the factory, so its own table of that name is being replaced as well).
    pub fn mirror(&self, name: &TableReference, table: Arc<dyn TableProvider>) {
        // Neither call can fail for the default in-memory catalog this session has.
        let _ = self.ctx.deregister_table(name.clone());
        let _ = self.ctx.register_table(name.clone(), table);
    }

    /// The tables `statement` names (its target first) when it is an `INSERT`, or an
    /// `EXPLAIN` of one, that reads a source declared here; `None` for any other statement,
    /// and for one naming a table this session does not have (the host's own tables).
    async fn pipeline_tables(&self, statement: &str) -> Option<Vec<String>> {
        let mut parsed = DFParser::parse_sql(statement).ok()?;
        let stmt = parsed.pop_front().filter(|_| parsed.is_empty())?;
        let insert = match &stmt {
            Statement::Statement(s) => matches!(**s, SqlStatement::Insert(_)),
            Statement::Explain(e) => matches!(
                &*e.statement,
                Statement::Statement(s) if matches!(**s, SqlStatement::Insert(_))
            ),
            _ => false,
        };
        if !insert {
            return None;
        }
        let plan = self.ctx.state().statement_to_plan(stmt).await.ok()?;
        let mut tables = Vec::new();
        let mut reads_source = false;
        let _ = plan.apply_with_subqueries(|node| {
            match node {
                LogicalPlan::Dml(dml) => tables.push(dml.table_name.to_string()),
                LogicalPlan::TableScan(scan) => {
                    tables.push(scan.table_name.to_string());
                    if let Ok(provider) = source_as_provider(&scan.source) {
                        reads_source |= is_source_table(provider.as_ref());
                    }
                }
                _ => {}
            }
            Ok(TreeNodeRecursion::Continue)
        });
        reads_source.then_some(tables)
    }

    /// Plans and runs `statement` here to its end; keeps its report.
    async fn run(&self, statement: &str) -> Result<Ran, DataFusionError> {
        let df = gcp_sql::sql::statement_to_dataframe(&self.ctx, statement)
            .await
            .map_err(to_datafusion)?;
        let task = Arc::new(df.task_ctx());
        let plan = df.create_physical_plan().await?;
        let collected = datafusion::physical_plan::collect(plan.clone(), task).await;
        let report = report_of(&plan);
        if !report.is_empty() {
            *self.report.lock().unwrap_or_else(|p| p.into_inner()) = Some(report);
        }
        let batches = collected?;
        let schema = plan.schema();
        let mut columns = Vec::with_capacity(schema.fields().len());
        for (i, field) in schema.fields().iter().enumerate() {
            let column = if field.data_type() == &DataType::UInt64 {
                let values = batches.iter().flat_map(|b| {
                    let array = b.column(i).as_any().downcast_ref::<UInt64Array>();
                    array.into_iter().flat_map(|a| a.iter().flatten())
                });
                Column::Counts(values.collect())
            } else {
                let mut texts = Vec::new();
                for batch in &batches {
                    let array = batch.column(i);
                    let format = ArrayFormatter::try_new(array.as_ref(), &FormatOptions::new())?;
                    texts.extend((0..array.len()).map(|row| format.value(row).to_string()));
                }
                Column::Texts(texts)
            };
            columns.push((field.name().clone(), column));
        }
        Ok(Ran { columns })
    }
}

/// A crate error as DataFusion's, the way a plan's own errors reach [`crate::failures`].
fn to_datafusion(e: gcp_sql::Error) -> DataFusionError {
    match e {
        gcp_sql::Error::DataFusion(inner) => inner,
        other => DataFusionError::External(Box::new(other)),
    }
}

/// Whether `table` is one of a connector's source tables.
fn is_source_table(table: &dyn TableProvider) -> bool {
    registry::kinds()
        .filter_map(|kind| kind.descriptor().source)
        .any(|source| (source.is_table)(table))
}

/// The reported metrics summed over every node of `plan` (those no node has are left out).
fn report_of(plan: &Arc<dyn ExecutionPlan>) -> Vec<(&'static str, u64)> {
    let mut sets = Vec::new();
    let mut pending = vec![plan];
    while let Some(node) = pending.pop() {
        sets.extend(node.metrics());
        pending.extend(node.children());
    }
    REPORTED
        .iter()
        .filter_map(|&name| {
            let values: Vec<u64> = sets
                .iter()
                .filter_map(|set| set.sum_by_name(name))
                .map(|v| v.as_usize() as u64)
                .collect();
            (!values.is_empty()).then(|| (name, values.iter().sum()))
        })
        .collect()
}

/// One column of a statement's result: `count`s, or any other type as text (`EXPLAIN`).
enum Column {
    Counts(Vec<u64>),
    Texts(Vec<String>),
}

/// A statement's result, by column.
struct Ran {
    columns: Vec<(String, Column)>,
}

/// This side's session of one host context (see the module docs); `gcp_sql.register` makes one
/// per context.
#[pyclass(frozen, name = "Session", module = "gcp_sql._native")]
pub struct PySession {
    inner: Arc<NativeSession>,
}

#[pymethods]
impl PySession {
    #[new]
    fn new() -> Self {
        Self {
            inner: Arc::new(NativeSession::new()),
        }
    }

    /// The `STORED AS` factories for the host, one per connector, in the registry's order:
    /// each declares its tables here too.
    fn factories(&self) -> Vec<PyConnectorFactory> {
        registry::kinds()
            .map(|kind| PyConnectorFactory::new(kind, Some(self.inner.clone())))
            .collect()
    }

    /// The tables `statement` names when it is an INSERT (or an EXPLAIN of one) that reads a
    /// source declared in this session; `None` otherwise.
    fn pipeline_tables(&self, py: Python<'_>, statement: &str) -> Option<Vec<String>> {
        let session = self.inner.clone();
        py.detach(|| crate::runtime::runtime().block_on(session.pipeline_tables(statement)))
    }

    /// Runs `statement` in this session to its end and returns its result as `(name, values,
    /// is_count)` per column; a failure raises `GcpSqlError` (with the counts of a failed
    /// INSERT). Ctrl-C and `gcp_sql.stop` reach it as they reach any INSERT of the package.
    fn run(&self, py: Python<'_>, statement: &str) -> PyResult<Vec<(String, Py<PyAny>, bool)>> {
        let session = self.inner.clone();
        let ran = py
            .detach(|| crate::runtime::runtime().block_on(session.run(statement)))
            .map_err(|e| match crate::failures::own_error(&e) {
                Some(own) => crate::to_py(py, own),
                None => crate::to_py(py, &gcp_sql::Error::DataFusion(e)),
            })?;
        ran.columns
            .into_iter()
            .map(|(name, column)| {
                Ok(match column {
                    Column::Counts(v) => (name, v.into_pyobject(py)?.into_any().unbind(), true),
                    Column::Texts(v) => (name, v.into_pyobject(py)?.into_any().unbind(), false),
                })
            })
            .collect()
    }

    /// The report of the last INSERT this session ran: each reported metric and its sum over
    /// the plan (`records_acked`, `source_messages_read`, ...); `None` before the first.
    fn last_report(&self) -> Option<Vec<(&'static str, u64)>> {
        self.inner
            .report
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
