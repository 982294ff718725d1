//! `gcp_sql.testing.null_server(...)`: the crate's null servers (`gcp_sql::bench::null_server`)
//! on this package's runtime, so that a benchmark needs the package alone (python/bench). Not
//! part of the main API: `gcp_sql.testing` re-exports it.

use std::sync::Mutex;
use std::time::Duration;

use gcp_sql::bench::null_server::{NullServer, NullServerOptions};
use gcp_sql::connectors::registry;
use pyo3::prelude::*;

/// A running null server; it stops with [`PyNullServer::stop`], or when the object goes.
#[pyclass(frozen, name = "NullServer", module = "gcp_sql._native")]
pub struct PyNullServer {
    server: Mutex<Option<NullServer>>,
    addr: String,
    service: &'static str,
}

#[pymethods]
impl PyNullServer {
    /// `127.0.0.1:PORT`, for a sink's `emulator_host` or a client's `*_EMULATOR_HOST`.
    #[getter]
    fn addr(&self) -> String {
        self.addr.clone()
    }

    /// The service it answers (`pubsub`, `bigtable`, `cloud-tasks`).
    #[getter]
    fn service(&self) -> &'static str {
        self.service
    }

    /// What it received so far: `requests`, `records`, `record_bytes`, `request_bytes`
    /// (all zero once stopped).
    fn totals(&self) -> Vec<(&'static str, u64)> {
        let server = self.server.lock().unwrap_or_else(|p| p.into_inner());
        let t = server.as_ref().map(NullServer::totals).unwrap_or_default();
        vec![
            ("requests", t.requests),
            ("records", t.records),
            ("record_bytes", t.record_bytes),
            ("request_bytes", t.request_bytes),
        ]
    }

    /// Stops it (a no-op the second time).
    fn stop(&self, py: Python<'_>) {
        let server = self.server.lock().unwrap_or_else(|p| p.into_inner()).take();
        py.detach(move || {
            let _guard = crate::runtime::runtime().enter();
            drop(server);
        });
    }
}

impl Drop for PyNullServer {
    fn drop(&mut self) {
        let server = self
            .server
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let _guard = crate::runtime::runtime().enter();
        drop(server);
    }
}

/// Starts a null server for `service` (a name of `gcp-sql serve-null --service`) on a free
/// loopback port, answering each request after `latency_ms` milliseconds.
#[pyfunction]
#[pyo3(signature = (service, latency_ms = 0))]
pub fn start_null_server(py: Python<'_>, service: &str, latency_ms: u64) -> PyResult<PyNullServer> {
    let kind = registry::null_service_named(service).ok_or_else(|| {
        let names: Vec<&str> = registry::null_services().map(|s| s.name()).collect();
        pyo3::exceptions::PyValueError::new_err(format!(
            "unknown null server service '{service}': expected one of {}",
            names.join(", ")
        ))
    })?;
    let options = NullServerOptions {
        latency: Duration::from_millis(latency_ms),
        service: kind,
        feed: Default::default(),
    };
    let loopback = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let server = py
        .detach(|| crate::runtime::runtime().block_on(NullServer::start(loopback, options)))
        .map_err(|e| {
            crate::GcpSqlError::new_err(format!(
                "the {} null server did not start: {e}",
                kind.name()
            ))
        })?;
    Ok(PyNullServer {
        addr: server.addr().to_string(),
        service: kind.name(),
        server: Mutex::new(Some(server)),
    })
}
