//! The tables and factories as datafusion-python receives them through DataFusion's FFI: sink
//! tables whose INSERT is planned when it runs, and source tables (a subscription) as the
//! crate makes them.

use std::ptr::NonNull;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider, TableProviderFactory};
use datafusion::datasource::TableType;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{CreateExternalTable, Expr};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::ExecutionPlanProperties;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion_ffi::proto::logical_extension_codec::FFI_LogicalExtensionCodec;
use datafusion_ffi::table_provider::FFI_TableProvider;
use datafusion_ffi::table_provider_factory::FFI_TableProviderFactory;
use gcp_sql::connectors::ConnectorKind;
use gcp_sql::sql::{ConnectorTableFactory, SinkTable};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::exec::SealedInsertExec;
use crate::failures;
use crate::pipeline::NativeSession;

/// A sink table whose INSERT is planned as one [`SealedInsertExec`] (see [`crate::exec`]).
#[derive(Debug, Clone)]
pub struct HostedSinkTable {
    table: SinkTable,
}

impl HostedSinkTable {
    /// Wraps `table` for a host session.
    pub fn new(table: SinkTable) -> Self {
        Self { table }
    }
}

#[async_trait]
impl TableProvider for HostedSinkTable {
    fn schema(&self) -> SchemaRef {
        self.table.schema()
    }

    fn table_type(&self) -> TableType {
        self.table.table_type()
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        self.table
            .scan(state, projection, filters, limit)
            .await
            .map_err(failures::record)
    }

    async fn insert_into(
        &self,
        state: &dyn Session,
        input: Arc<dyn ExecutionPlan>,
        insert_op: InsertOp,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        if gcp_sql::sql::lineage::reads_source(&input) {
            return Err(DataFusionError::Plan(source_through_the_host(
                self.table.name(),
                input.output_partitioning().partition_count(),
            )));
        }
        // Plans the INSERT once over a stand-in of the input, so that what the table refuses
        // (OVERWRITE, REPLACE, a column count) fails here, at planning, as in Rust.
        let stand_in = Arc::new(EmptyExec::new(input.schema()));
        let planned = self
            .table
            .insert_into(state, stand_in, insert_op)
            .await
            .map_err(failures::record)?;
        // The input's ORDER BY, read now: the host's optimizer may drop it before it runs.
        let ordering = crate::exec::input_ordering(&input);
        Ok(Arc::new(
            SealedInsertExec::new(self.table.clone(), input, planned.schema())
                .with_ordering(ordering),
        ))
    }
}

/// Why an INSERT that reads a source is refused when the host plans it, and what to do.
fn source_through_the_host(table: &str, partitions: usize) -> String {
    format!(
        "gcp_sql (the Python package): INSERT INTO '{table}' reads a source (a Pub/Sub \
         subscription, {partitions} partition(s)) through datafusion-python's planner, which \
         cannot keep the source's promise across DataFusion's FFI (a message is acknowledged \
         only after every row made from it landed, and the host's filters and repartitions \
         between the source and the sink are opaque to gcp_sql); run the statement with \
         gcp_sql.sql(ctx, \"INSERT ...\"), which plans and runs it on gcp_sql's side, with \
         the source and the sink declared by CREATE statements (STORED AS or WITH (connector = \
         ...)) in a context set up by gcp_sql.register(ctx)"
    )
}

/// The `STORED AS` factory of one connector for a host: [`HostedSinkTable`]s for sinks, the
/// source's own table for a source; each declared in the context's [`NativeSession`] too,
/// when it has one.
#[derive(Debug)]
pub struct HostedFactory {
    inner: ConnectorTableFactory,
    session: Option<Arc<NativeSession>>,
}

#[async_trait]
impl TableProviderFactory for HostedFactory {
    async fn create(
        &self,
        state: &dyn Session,
        cmd: &CreateExternalTable,
    ) -> DFResult<Arc<dyn TableProvider>> {
        let provider = self
            .inner
            .create(state, cmd)
            .await
            .map_err(failures::record)?;
        if let Some(session) = &self.session {
            session.mirror(&cmd.name, provider.clone());
        }
        if let Some(table) = provider.downcast_ref::<SinkTable>() {
            return Ok(Arc::new(HostedSinkTable::new(table.clone())));
        }
        // A source's scan runs on this side as it is (the FFI hands the host its batches);
        // only an INSERT from it needs this side's planning (crate::pipeline).
        Ok(provider)
    }
}

/// The host's logical codec, from the argument datafusion-python passes to a capsule getter
/// (a session exposing `__datafusion_logical_extension_codec__`, or the codec's capsule).
fn host_codec(session: Bound<'_, PyAny>) -> PyResult<FFI_LogicalExtensionCodec> {
    const GETTER: &str = "__datafusion_logical_extension_codec__";
    let capsule = if session.hasattr(GETTER)? {
        session.getattr(GETTER)?.call0()?
    } else {
        session
    };
    let capsule = capsule.cast::<PyCapsule>()?;
    let data: NonNull<FFI_LogicalExtensionCodec> = capsule
        .pointer_checked(Some(c"datafusion_logical_extension_codec"))?
        .cast();
    // SAFETY: the capsule's name says it holds an FFI_LogicalExtensionCodec, which the host
    // keeps alive while the capsule lives; it is cloned before the capsule can go.
    let codec = unsafe { data.as_ref() };
    Ok(codec.clone())
}

/// A sink table for `SessionContext.register_table`: it has `__datafusion_table_provider__`.
#[pyclass(frozen, name = "SinkTable", module = "gcp_sql._native")]
pub struct PySinkTable {
    table: HostedSinkTable,
    connector: &'static str,
}

impl PySinkTable {
    /// Wraps a declared sink table.
    pub fn new(table: SinkTable) -> Self {
        let connector = table.sink().kind().name();
        Self {
            table: HostedSinkTable::new(table),
            connector,
        }
    }
}

#[pymethods]
impl PySinkTable {
    /// The table as DataFusion's FFI carries it.
    fn __datafusion_table_provider__<'py>(
        &self,
        py: Python<'py>,
        session: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let codec = host_codec(session)?;
        let provider = FFI_TableProvider::new_with_ffi_codec(
            Arc::new(self.table.clone()),
            false,
            Some(crate::runtime::handle()),
            codec,
        );
        PyCapsule::new_with_value(py, provider, c"datafusion_table_provider")
    }

    /// The connector the table writes to (`pubsub`, `cloud_tasks`, `bigtable`).
    #[getter]
    fn connector(&self) -> &'static str {
        self.connector
    }

    fn __repr__(&self) -> String {
        format!("<gcp_sql sink table: {}>", self.connector)
    }
}

/// The `STORED AS` factory of one connector, for `SessionContext.register_table_factory`.
#[pyclass(frozen, name = "ConnectorFactory", module = "gcp_sql._native")]
pub struct PyConnectorFactory {
    kind: ConnectorKind,
    session: Option<Arc<NativeSession>>,
}

impl PyConnectorFactory {
    /// The factory of `kind`, declaring its tables in `session` too when there is one.
    pub fn new(kind: ConnectorKind, session: Option<Arc<NativeSession>>) -> Self {
        Self { kind, session }
    }
}

#[pymethods]
impl PyConnectorFactory {
    /// The factory as DataFusion's FFI carries it.
    fn __datafusion_table_provider_factory__<'py>(
        &self,
        py: Python<'py>,
        codec: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let codec = host_codec(codec)?;
        let factory = Arc::new(HostedFactory {
            inner: ConnectorTableFactory::new(self.kind),
            session: self.session.clone(),
        }) as Arc<dyn TableProviderFactory + Send>;
        let factory = FFI_TableProviderFactory::new_with_ffi_codec(
            factory,
            Some(crate::runtime::handle()),
            codec,
        );
        PyCapsule::new_with_value(py, factory, c"datafusion_table_provider_factory")
    }

    /// The `STORED AS` word (`PUBSUB`, `CLOUD_TASKS`, `BIGTABLE`).
    #[getter]
    fn stored_as(&self) -> &'static str {
        self.kind.stored_as()
    }

    fn __repr__(&self) -> String {
        format!("<gcp_sql STORED AS {} factory>", self.kind.stored_as())
    }
}
