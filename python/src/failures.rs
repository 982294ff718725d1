//! What crosses the FFI boundary of an error is its text only. The sink's own errors are
//! recorded here with their counts before they cross, so that the Python side can raise a
//! `GcpSqlError` carrying them (see `gcp_sql.error_from` in `gcp_sql/__init__.py`).

use std::collections::VecDeque;
use std::sync::Mutex;

use datafusion::error::DataFusionError;

/// How many recent failures are kept (a lookup matches the newest first).
const KEPT: usize = 64;

/// A sink error as the Python side reports it.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The error's message, as the sink words it.
    pub message: String,
    /// For a failed INSERT: rows acknowledged, admitted but not delivered, dead-lettered.
    pub counts: Option<(u64, u64, u64)>,
}

static FAILURES: Mutex<VecDeque<Failure>> = Mutex::new(VecDeque::new());

/// The sink's own error inside `e`, if there is one (through DataFusion's wrappers).
pub fn own_error(e: &DataFusionError) -> Option<&gcp_sql::Error> {
    match e {
        DataFusionError::External(inner) => inner.downcast_ref::<gcp_sql::Error>(),
        DataFusionError::Context(_, inner) => own_error(inner),
        DataFusionError::Shared(inner) => own_error(inner),
        _ => None,
    }
}

/// The failure `e` describes, counts included when it is a failed statement.
pub fn failure_of(e: &gcp_sql::Error) -> Failure {
    let counts = match e {
        gcp_sql::Error::Incomplete {
            acknowledged,
            not_delivered,
            dead_lettered,
            ..
        } => Some((*acknowledged, *not_delivered, *dead_lettered)),
        _ => None,
    };
    Failure {
        message: e.to_string(),
        counts,
    }
}

/// Records the sink error inside `e`, if any, and returns the error to hand across the FFI:
/// the sink's own message (not DataFusion's "External error: ..." wrapping of it).
pub fn record(e: DataFusionError) -> DataFusionError {
    let Some(own) = own_error(&e) else {
        return e;
    };
    let failure = failure_of(own);
    let message = failure.message.clone();
    let mut kept = FAILURES.lock().unwrap_or_else(|p| p.into_inner());
    if kept.len() == KEPT {
        kept.pop_front();
    }
    kept.push_back(failure);
    DataFusionError::Execution(message)
}

/// The newest recorded failure whose message `text` contains (the text of an exception the
/// host raised for it, with its own prefixes).
pub fn find(text: &str) -> Option<Failure> {
    let kept = FAILURES.lock().unwrap_or_else(|p| p.into_inner());
    kept.iter()
        .rev()
        .find(|f| text.contains(&f.message))
        .cloned()
}
