//! The sink tables and factories as datafusion-python receives them through DataFusion's FFI.

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
use datafusion::physical_plan::empty::EmptyExec;
use datafusion_ffi::proto::logical_extension_codec::FFI_LogicalExtensionCodec;
use datafusion_ffi::table_provider::FFI_TableProvider;
use datafusion_ffi::table_provider_factory::FFI_TableProviderFactory;
use gcp_sql::connectors::ConnectorKind;
use gcp_sql::sql::{SinkTable, SinkTableFactory};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::exec::SealedInsertExec;
use crate::failures;

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

/// The `STORED AS` factory of one connector, handing out [`HostedSinkTable`]s.
#[derive(Debug)]
pub struct HostedSinkFactory {
    inner: SinkTableFactory,
}

#[async_trait]
impl TableProviderFactory for HostedSinkFactory {
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
        let table = provider.downcast_ref::<SinkTable>().ok_or_else(|| {
            DataFusionError::Internal("the sink factory made a table that is not a sink".into())
        })?;
        Ok(Arc::new(HostedSinkTable::new(table.clone())))
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
#[pyclass(frozen, name = "SinkFactory", module = "gcp_sql._native")]
pub struct PySinkFactory {
    kind: ConnectorKind,
}

impl PySinkFactory {
    /// The factory of `kind`.
    pub fn new(kind: ConnectorKind) -> Self {
        Self { kind }
    }
}

#[pymethods]
impl PySinkFactory {
    /// The factory as DataFusion's FFI carries it.
    fn __datafusion_table_provider_factory__<'py>(
        &self,
        py: Python<'py>,
        codec: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let codec = host_codec(codec)?;
        let factory = Arc::new(HostedSinkFactory {
            inner: SinkTableFactory::new(self.kind),
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
