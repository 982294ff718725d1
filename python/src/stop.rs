//! Stopping the running INSERTs from Python (`gcp_sql.stop`, and Ctrl-C in `gcp_sql.sql`): one
//! statement control for the process, installed in every INSERT's task context.

use std::sync::OnceLock;

use gcp_sql::core::StopKind;
use gcp_sql::sql::StatementControl;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// The control every INSERT of this process obeys.
pub fn control() -> &'static StatementControl {
    static CONTROL: OnceLock<StatementControl> = OnceLock::new();
    CONTROL.get_or_init(StatementControl::new)
}

/// Asks every running INSERT to stop: `drain` (read no more input, deliver what was admitted)
/// or `abort` (stop at once). INSERTs that start later stop too, until [`rearm`].
#[pyfunction]
pub fn stop(kind: &str) -> PyResult<()> {
    let kind = match kind {
        "drain" => StopKind::Drain,
        "abort" => StopKind::Abort,
        other => {
            return Err(PyValueError::new_err(format!(
                "stop kind '{other}': expected 'drain' or 'abort'"
            )));
        }
    };
    control().stop(kind, "stop requested from Python");
    Ok(())
}

/// Clears the stop request for the INSERTs that start from now on.
#[pyfunction]
pub fn rearm() {
    control().rearm();
}

/// How many sink writers are running now.
#[pyfunction]
pub fn running_writers() -> usize {
    control().running_writers()
}
