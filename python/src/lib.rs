//! `gcp_sql._native`: the Rust half of the Python package `gcp_sql` (python/gcp_sql is the
//! other). It hands the sinks of the `gcp-sql` crate to a datafusion-python session through
//! DataFusion's FFI: the `STORED AS` factories, typed sink tables, the `WITH` form's rewrite,
//! errors with their counts, the INSERTs from a subscription (run on this side, `pipeline`),
//! the emulator launcher, the metrics and health endpoint, and (for python/bench) the null
//! servers.
//! docs/python.md says how to use it.

mod emulators;
mod exec;
mod failures;
mod metrics;
mod null_servers;
mod pipeline;
mod provider;
mod runtime;
mod statements;
mod stop;

use std::ptr::NonNull;
use std::sync::Arc;

use datafusion::arrow::datatypes::Schema;
use datafusion::arrow::ffi::FFI_ArrowSchema;
use gcp_sql::connectors::registry;
use gcp_sql::options::{ConnectionOptions, RawOptions};
use gcp_sql::sql::{SinkDeclaration, SinkSpec, SinkTable};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use provider::{PyConnectorFactory, PySinkTable};

pyo3::create_exception!(
    gcp_sql,
    GcpSqlError,
    PyException,
    "An error of the gcp_sql sinks: a bad option or column, or a failed INSERT (then \
     `acknowledged`, `not_delivered` and `dead_lettered` count its rows; otherwise they are None)."
);

/// The Python exception for a failure (message, and counts when it is a failed INSERT).
fn raise(py: Python<'_>, failure: &failures::Failure) -> PyErr {
    let err = GcpSqlError::new_err(failure.message.clone());
    let (acknowledged, not_delivered, dead_lettered) = match failure.counts {
        Some((a, n, d)) => (Some(a), Some(n), Some(d)),
        None => (None, None, None),
    };
    let value = err.value(py);
    // Setting attributes on a fresh exception instance cannot fail.
    let _ = value.setattr("acknowledged", acknowledged);
    let _ = value.setattr("not_delivered", not_delivered);
    let _ = value.setattr("dead_lettered", dead_lettered);
    err
}

/// A crate error as a `GcpSqlError`.
pub(crate) fn to_py(py: Python<'_>, e: &gcp_sql::Error) -> PyErr {
    raise(py, &failures::failure_of(e))
}

/// An Arrow schema from any object with `__arrow_c_schema__` (a `pyarrow.Schema`).
fn arrow_schema(schema: &Bound<'_, PyAny>) -> PyResult<Schema> {
    let capsule = schema.call_method0("__arrow_c_schema__").map_err(|_| {
        pyo3::exceptions::PyTypeError::new_err(
            "schema must be a pyarrow.Schema (an object with __arrow_c_schema__)",
        )
    })?;
    let capsule = capsule.cast::<PyCapsule>()?;
    let data: NonNull<FFI_ArrowSchema> = capsule.pointer_checked(Some(c"arrow_schema"))?.cast();
    // SAFETY: the capsule's name says it holds an FFI_ArrowSchema, alive while the capsule is;
    // it is only read (converted) here.
    let ffi = unsafe { data.as_ref() };
    Schema::try_from(ffi).map_err(|e| {
        pyo3::exceptions::PyValueError::new_err(format!("cannot read the Arrow schema: {e}"))
    })
}

/// A sink table of `connector` over `schema` with `options` (name, value text), checked as a
/// `CREATE TABLE ... WITH (connector = ..., ...)` declaration is: the same parser and errors.
#[pyfunction]
fn sink_table(
    py: Python<'_>,
    connector: &str,
    schema: &Bound<'_, PyAny>,
    options: Vec<(String, String)>,
) -> PyResult<PySinkTable> {
    let schema = Arc::new(arrow_schema(schema)?);
    let declared = (|| {
        let kind = registry::kind_named(connector)?;
        let raw = RawOptions::from_pairs(options)?;
        let name = format!("{} sink", kind.name());
        let (sink, spec) = SinkSpec::declare(
            name.clone(),
            kind,
            schema,
            None,
            &raw,
            &ConnectionOptions::process_env,
        )?;
        Ok::<_, gcp_sql::Error>(
            SinkTable::new(name, sink)
                .with_declaration(SinkDeclaration::new(kind, None, &raw))
                .with_spec(spec),
        )
    })();
    declared.map(PySinkTable::new).map_err(|e| to_py(py, &e))
}

/// The `STORED AS` factories, one per connector, in the registry's order, with no session of
/// their own (an INSERT from a source they declare cannot run: `Session.factories` has one).
#[pyfunction]
fn factories() -> Vec<PyConnectorFactory> {
    registry::kinds()
        .map(|kind| PyConnectorFactory::new(kind, None))
        .collect()
}

/// The recorded sink failure whose message the text of `exception` (an exception the host
/// raised) contains, as a `GcpSqlError`; `None` when it is not one.
#[pyfunction]
fn error_from(py: Python<'_>, exception: &Bound<'_, PyAny>) -> PyResult<Option<PyErr>> {
    let text = exception.str()?.to_string();
    Ok(failures::find(&text).map(|f| raise(py, &f)))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("GcpSqlError", m.py().get_type::<GcpSqlError>())?;
    m.add_class::<PySinkTable>()?;
    m.add_class::<PyConnectorFactory>()?;
    m.add_class::<pipeline::PySession>()?;
    m.add_class::<emulators::PyEmulators>()?;
    m.add_class::<null_servers::PyNullServer>()?;
    m.add_class::<metrics::PyMetricsServer>()?;
    m.add_function(wrap_pyfunction!(sink_table, m)?)?;
    m.add_function(wrap_pyfunction!(factories, m)?)?;
    m.add_function(wrap_pyfunction!(error_from, m)?)?;
    m.add_function(wrap_pyfunction!(statements::native_statements, m)?)?;
    m.add_function(wrap_pyfunction!(emulators::start_emulators, m)?)?;
    m.add_function(wrap_pyfunction!(stop::stop, m)?)?;
    m.add_function(wrap_pyfunction!(stop::rearm, m)?)?;
    m.add_function(wrap_pyfunction!(stop::running_writers, m)?)?;
    m.add_function(wrap_pyfunction!(null_servers::start_null_server, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::serve_metrics, m)?)?;
    Ok(())
}
