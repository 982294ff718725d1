//! `gcp_sql.emulators()`: the local emulators, started as `gcp-sql --emulators` starts them.

use std::sync::Mutex;

use gcp_sql::emulators::{Emulator, start_all};
use pyo3::prelude::*;

/// Running emulators; they stop with [`PyEmulators::stop`], or when the object goes.
#[pyclass(frozen, name = "Emulators", module = "gcp_sql._native")]
pub struct PyEmulators {
    running: Mutex<Vec<Emulator>>,
    env: Vec<(String, String)>,
}

#[pymethods]
impl PyEmulators {
    /// The variables that point a client at them: (`PUBSUB_EMULATOR_HOST`, `host:port`), ...
    #[getter]
    fn env(&self) -> Vec<(String, String)> {
        self.env.clone()
    }

    /// Stops them (a no-op the second time).
    fn stop(&self, py: Python<'_>) {
        let running = std::mem::take(&mut *self.running.lock().unwrap_or_else(|p| p.into_inner()));
        py.detach(move || {
            let _guard = crate::runtime::runtime().enter();
            drop(running);
        });
    }
}

/// Starts every emulator; fails with every start failure (each names its install step) and
/// stops those that started.
#[pyfunction]
pub fn start_emulators(py: Python<'_>) -> PyResult<PyEmulators> {
    let (started, failed) = py.detach(|| {
        crate::runtime::runtime().block_on(start_all(gcp_sql::connectors::registry::emulators()))
    });
    if !failed.is_empty() {
        let reasons: Vec<String> = failed
            .iter()
            .map(|(kind, e)| format!("{}: {e}", kind.name()))
            .collect();
        py.detach(move || {
            let _guard = crate::runtime::runtime().enter();
            drop(started);
        });
        return Err(crate::GcpSqlError::new_err(format!(
            "the emulators did not all start: {}",
            reasons.join("; ")
        )));
    }
    let env = started
        .iter()
        .map(|e| (e.env_var().to_string(), e.host().to_string()))
        .collect();
    Ok(PyEmulators {
        running: Mutex::new(started),
        env,
    })
}
