//! `gcp_sql.serve_metrics(address)`: the crate's metrics and health endpoint
//! (`gcp_sql::ops::MetricsServer`: `/metrics`, `/healthz`, `/readyz`) on this package's
//! runtime. Every INSERT of the process is served, whichever session ran it.

use std::sync::Mutex;

use gcp_sql::ops::MetricsServer;
use pyo3::prelude::*;

/// A running endpoint; it stops with [`PyMetricsServer::stop`], or when the object goes.
#[pyclass(frozen, name = "MetricsServer", module = "gcp_sql._native")]
pub struct PyMetricsServer {
    server: Mutex<Option<MetricsServer>>,
    address: String,
}

#[pymethods]
impl PyMetricsServer {
    /// `HOST:PORT` it listens on (the port picked, for port 0).
    #[getter]
    fn address(&self) -> String {
        self.address.clone()
    }

    /// Stops it (a no-op the second time).
    fn stop(&self, py: Python<'_>) {
        let server = self.server.lock().unwrap_or_else(|p| p.into_inner()).take();
        py.detach(move || {
            if let Some(server) = server {
                crate::runtime::runtime().block_on(server.stop());
            }
        });
    }
}

impl Drop for PyMetricsServer {
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

/// Serves `/metrics`, `/healthz` and `/readyz` at `address` (`HOST:PORT`; port 0 picks a free
/// one). A bad or busy address raises `GcpSqlError` naming `address`.
#[pyfunction]
pub fn serve_metrics(py: Python<'_>, address: &str) -> PyResult<PyMetricsServer> {
    let started = py.detach(|| crate::runtime::runtime().block_on(MetricsServer::start(address)));
    match started {
        Ok(server) => Ok(PyMetricsServer {
            address: server.local_addr().to_string(),
            server: Mutex::new(Some(server)),
        }),
        Err(gcp_sql::Error::InvalidOption { value, rule, .. }) => Err(crate::to_py(
            py,
            &gcp_sql::Error::invalid("address", value, rule),
        )),
        Err(e) => Err(crate::to_py(py, &e)),
    }
}
