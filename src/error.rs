//! The crate's one error type.
//!
//! Every failure a user can see names what it is about: the option, the column, the limit or
//! the gRPC status. The error is boxed into a [`DataFusionError`] only at the DataFusion boundary
//! (see [`From<Error> for DataFusionError`](#impl-From<Error>-for-DataFusionError)).

use std::time::Duration;

use datafusion::error::DataFusionError;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while declaring or writing to a sink.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An option name no connector knows.
    #[error("unknown option '{option}' for connector '{connector}'{}", suggestion_text(.suggestion))]
    UnknownOption {
        /// The connector the table declares.
        connector: String,
        /// The option as written.
        option: String,
        /// The nearest valid option name, when one is close enough.
        suggestion: Option<String>,
    },
    /// The same option given twice (including `k` and `format.k`).
    #[error("option '{option}' is given more than once")]
    DuplicateOption {
        /// The option name.
        option: String,
    },
    /// An option the connector needs is missing.
    #[error("missing option '{option}': {rule}")]
    MissingOption {
        /// The option name.
        option: String,
        /// Why it is needed.
        rule: String,
    },
    /// An option value that breaks its rule (type, bound or cross-option rule).
    #[error("invalid value '{value}' for option '{option}': {rule}")]
    InvalidOption {
        /// The option name.
        option: String,
        /// The value as given.
        value: String,
        /// The rule it breaks.
        rule: String,
    },
    /// An option value names an environment variable (`${NAME}`) that is not set. Names the
    /// variable and the option, never a value.
    #[error(
        "environment variable '{variable}' named in option '{option}' is not set (set it before the statement runs, or write $${{ for a literal '${{')"
    )]
    UnsetVariable {
        /// The variable's name.
        variable: String,
        /// The option whose value names it.
        option: String,
    },
    /// The table schema cannot be mapped by the connector.
    #[error("column '{column}': {rule}")]
    Schema {
        /// The column (or the option naming it).
        column: String,
        /// The rule it breaks.
        rule: String,
    },
    /// A statement the sink does not support (overwrite, replace, reading a sink).
    #[error("{0}")]
    Unsupported(String),
    /// A row the connector cannot turn into a record (a serializer rejection).
    #[error("row {row}: {reason}")]
    Encode {
        /// Index of the row within its statement input, counted from 0.
        row: u64,
        /// What is wrong with it, naming the column or limit.
        reason: String,
    },
    /// An RPC that failed in a way the writer does not recover from.
    #[error("{operation} to '{destination}' failed with {} after {attempts} attempt(s): {message}{}", code_text(.code), not_found_hint(.code, .destination))]
    Rpc {
        /// The RPC (`Publish`, `CreateTask`, `MutateRows`, ...).
        operation: &'static str,
        /// The destination resource name.
        destination: String,
        /// The gRPC status code.
        code: tonic::Code,
        /// The status message.
        message: String,
        /// How many attempts were made.
        attempts: u32,
    },
    /// A record the service refused, confirmed by sending it alone, under the `fail` policy.
    #[error("record rejected by '{destination}' with {} (confirmed when sent alone): {message}", code_text(.code))]
    Rejected {
        /// The destination resource name.
        destination: String,
        /// The gRPC status code.
        code: tonic::Code,
        /// The status message.
        message: String,
    },
    /// Too many consecutive confirmed rejections under a dropping failure policy.
    #[error(
        "{count} consecutive records were rejected with no success between them (limit set by '{option}')"
    )]
    RejectionBreaker {
        /// The option that sets the bound.
        option: &'static str,
        /// The number of consecutive rejections.
        count: u64,
    },
    /// No completion arrived within the progress budget while the writer waited.
    #[error("no send completed within {budget:?} while {waiting_for} (limit set by '{option}')")]
    ProgressTimeout {
        /// The option that sets the budget.
        option: &'static str,
        /// The budget.
        budget: Duration,
        /// What the writer was waiting for.
        waiting_for: &'static str,
    },
    /// A client release did not finish within its shutdown budget.
    #[error(
        "releasing {clients} client(s) did not finish within {budget:?} (limit set by '{option}')"
    )]
    ShutdownTimeout {
        /// The option that sets the budget.
        option: &'static str,
        /// The budget.
        budget: Duration,
        /// How many clients the release covered.
        clients: usize,
    },
    /// A missing destination that recovery did not bring back within its budget.
    #[error(
        "'{destination}' is still missing after {attempts} attempt(s) (budget set by '{option}'): {message}{}",
        not_found_destination_hint(.destination)
    )]
    RecoveryExhausted {
        /// The destination resource name.
        destination: String,
        /// The option that sets the attempt budget.
        option: &'static str,
        /// Attempts made.
        attempts: u32,
        /// The last status message.
        message: String,
    },
    /// Transient failures outlasted the retry budget.
    #[error("{source} (retry budget set by '{option}')")]
    RetryExhausted {
        /// The last failure.
        source: Box<Error>,
        /// The option(s) that set the budget.
        option: &'static str,
    },
    /// A failed statement, whatever the cause (a failed RPC, an input stream error, a rejected
    /// row under the `fail` policy, a progress timeout, a release that overran its budget):
    /// the failure with how many of the statement's rows landed and how many did not.
    ///
    /// `acknowledged` rows were delivered (a re-run sends them again: delivery is at least
    /// once). `not_delivered` counts the rows the writer admitted that were neither
    /// acknowledged, nor dropped under the `drop` policy, nor refused by the service under the
    /// `fail` policy (that row is the failure itself, and would be refused again): rows never
    /// sent, rows whose send failed, and rows still in an RPC when the statement ended (which
    /// may have landed unacknowledged). Rows the statement had not yet read from its input are
    /// in neither count.
    ///
    /// `dead_lettered` rows went to the dead-letter destination under the `dead_letter`
    /// policy (and are stored there); they are in neither of the other counts. Under that
    /// policy a row whose dead-letter write failed is in `not_delivered`, even one the encoder
    /// rejected (never admitted).
    #[error(
        "{source} ({acknowledged} row(s) were acknowledged before the failure; {}{not_delivered} admitted row(s) were not delivered{})",
        dead_letter_text(*.dead_lettered),
        rerun_hint(*.not_delivered, source)
    )]
    Incomplete {
        /// The failure.
        source: Box<Error>,
        /// Rows the service acknowledged before the statement ended.
        acknowledged: u64,
        /// Admitted rows neither acknowledged, dropped, dead-lettered, nor refused by the
        /// service.
        not_delivered: u64,
        /// Rows stored in the dead-letter destination before the statement ended.
        dead_lettered: u64,
    },
    /// A row could not be written to the dead-letter destination (or the destination could
    /// not be completed): the statement fails, since the row would otherwise be gone.
    #[error("cannot write to the dead-letter destination {target}: {message}")]
    DeadLetter {
        /// The destination, as its option names it (`dead_letter_topic 'projects/p/topics/t'`).
        target: String,
        /// What went wrong (a status, an object store error).
        message: String,
    },
    /// The progress marker of a windowed pipeline (ADR 0068) could not be read, created or
    /// written: the statement fails, since its windows would otherwise be unaccounted for.
    #[error("progress marker {marker}: {message}")]
    Progress {
        /// The marker's URL.
        marker: String,
        /// What went wrong.
        message: String,
    },
    /// Connecting or authenticating failed.
    #[error("cannot connect to {endpoint}: {message}")]
    Connect {
        /// The endpoint or emulator address.
        endpoint: String,
        /// What went wrong.
        message: String,
    },
    /// The statement's writers were asked to stop before the end of their input (another
    /// writer of the same statement failed): this writer sent nothing new from then on.
    #[error("stopped before the end of the input: {reason}")]
    Stopped {
        /// Why: which writer failed.
        reason: String,
    },
    /// The writer already failed; later calls report the first failure's summary.
    #[error("the writer failed earlier: {0}")]
    Failed(String),
    /// An error from DataFusion or Arrow.
    #[error(transparent)]
    DataFusion(#[from] DataFusionError),
    /// An I/O error (files, processes).
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A status code as gRPC and Google's documentation spell it (`NOT_FOUND`), so that a message
/// can be looked up; tonic's `Debug` form (`NotFound`) appears nowhere in Google's docs.
fn code_text(code: &tonic::Code) -> &'static str {
    code_name(*code)
}

/// The canonical upper-case name of a status code (`UNAVAILABLE`), as gRPC spells it.
///
/// It lives here, beside the errors that print it, so that this module (which every other one
/// uses) calls into no other module of the crate.
pub(crate) fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Whether a status code is transient for the Google APIs this crate calls: the codes the
/// official Pub/Sub client libraries retry for Publish in their default publisher retry
/// configuration: ABORTED, CANCELLED, DEADLINE_EXCEEDED, INTERNAL, RESOURCE_EXHAUSTED, UNKNOWN
/// and UNAVAILABLE.
pub fn is_transient_code(code: tonic::Code) -> bool {
    use tonic::Code::*;
    matches!(
        code,
        Aborted
            | Cancelled
            | DeadlineExceeded
            | Internal
            | ResourceExhausted
            | Unknown
            | Unavailable
    )
}

fn dead_letter_text(dead_lettered: u64) -> String {
    if dead_lettered > 0 {
        format!("{dead_lettered} row(s) were dead-lettered; ")
    } else {
        String::new()
    }
}

/// What the user can do about undelivered rows: re-run when a re-run can help (the failure was
/// transient: an outage, throttling, a timeout); otherwise the cause must be fixed first, and a
/// re-run as is would fail the same way.
fn rerun_hint(not_delivered: u64, source: &Error) -> &'static str {
    match (not_delivered, source.is_retryable()) {
        (0, _) => "",
        (_, true) => ": re-run the statement to send them again",
        (_, false) => ": fix the cause above, then re-run the statement to send them",
    }
}

/// For a `NOT_FOUND` about `destination`: what creates it, named by the option that does
/// (the sinks create a missing topic or table only when asked; never a queue).
fn not_found_hint(code: &tonic::Code, destination: &str) -> &'static str {
    if *code != tonic::Code::NotFound {
        return "";
    }
    not_found_destination_hint(destination)
}

fn not_found_destination_hint(destination: &str) -> &'static str {
    if destination.contains("/topics/") {
        " (the topic does not exist: create it, or set auto_create_topic = true to have the sink create it)"
    } else if destination.contains("/tables/") {
        " (the table does not exist: create it, or set auto_create_table = true to have the sink create it and its column families)"
    } else if destination.contains("/queues/") {
        " (the queue does not exist and the sink never creates one: create it first, with gcloud tasks queues create, or cloud_tasks_create_queue on the emulator)"
    } else {
        ""
    }
}

fn suggestion_text(s: &Option<String>) -> String {
    match s {
        Some(s) => format!(" (did you mean '{s}'?)"),
        None => String::new(),
    }
}

impl Error {
    /// Whether the same operation may succeed if tried again later (outages, throttling),
    /// as opposed to a mistake in the statement, the options or the data.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Rpc { code, .. } => is_transient_code(*code),
            Error::RetryExhausted { source, .. } | Error::Incomplete { source, .. } => {
                source.is_retryable()
            }
            Error::ProgressTimeout { .. }
            | Error::ShutdownTimeout { .. }
            | Error::Connect { .. } => true,
            _ => false,
        }
    }

    /// An [`Error::Rpc`] from the status an RPC answered after `attempts` attempts.
    pub fn rpc(
        operation: &'static str,
        destination: &str,
        status: &tonic::Status,
        attempts: u32,
    ) -> Self {
        Error::Rpc {
            operation,
            destination: destination.to_string(),
            code: status.code(),
            message: status.message().to_string(),
            attempts,
        }
    }

    /// Shorthand for an [`Error::InvalidOption`].
    pub fn invalid(
        option: impl Into<String>,
        value: impl Into<String>,
        rule: impl Into<String>,
    ) -> Self {
        Error::InvalidOption {
            option: option.into(),
            value: value.into(),
            rule: rule.into(),
        }
    }

    /// Shorthand for an [`Error::Schema`].
    pub fn schema(column: impl Into<String>, rule: impl Into<String>) -> Self {
        Error::Schema {
            column: column.into(),
            rule: rule.into(),
        }
    }
}

impl From<Error> for DataFusionError {
    fn from(e: Error) -> Self {
        match e {
            Error::DataFusion(e) => e,
            other => DataFusionError::External(Box::new(other)),
        }
    }
}

impl From<datafusion::arrow::error::ArrowError> for Error {
    fn from(e: datafusion::arrow::error::ArrowError) -> Self {
        Error::DataFusion(DataFusionError::ArrowError(Box::new(e), None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn incomplete(source: Error) -> String {
        Error::Incomplete {
            source: Box::new(source),
            acknowledged: 0,
            not_delivered: 10,
            dead_lettered: 0,
        }
        .to_string()
    }

    /// The message of one call of `operation` on `destination` that failed with `code`.
    fn one_failed_call(
        operation: &'static str,
        destination: &str,
        code: tonic::Code,
        message: &str,
    ) -> String {
        Error::Rpc {
            operation,
            destination: destination.into(),
            code,
            message: message.into(),
            attempts: 1,
        }
        .to_string()
    }

    #[test]
    fn a_missing_destination_names_the_option_that_creates_it_and_advises_no_plain_rerun() {
        let topic = incomplete(Error::RecoveryExhausted {
            destination: "projects/demo/topics/clicks".into(),
            option: "not_found_recovery_max_attempts",
            attempts: 3,
            message: "Topic not found".into(),
        });
        assert!(topic.contains("auto_create_topic = true"), "{topic}");
        assert!(
            !topic.contains("re-run the statement to send them again"),
            "{topic}"
        );
        assert!(
            topic.contains("fix the cause above, then re-run"),
            "{topic}"
        );

        // Per call: the operation, its destination, the code and message, and a hint the error
        // must carry (true) or must not (false): another code says nothing about creating anything.
        use tonic::Code::{NotFound, PermissionDenied};
        let cases = [
            (
                "MutateRows",
                "projects/p/instances/i/tables/t",
                NotFound,
                "table not found",
                "auto_create_table = true",
                true,
            ),
            (
                "CreateTask",
                "projects/p/locations/l/queues/q",
                NotFound,
                "queue not found",
                "never creates one",
                true,
            ),
            (
                "Publish",
                "projects/p/topics/t",
                PermissionDenied,
                "no",
                "auto_create",
                false,
            ),
        ];
        for (operation, destination, code, message, hint, carried) in cases {
            let text = one_failed_call(operation, destination, code, message);
            assert_eq!(text.contains(hint), carried, "{text}");
        }
    }

    #[test]
    fn a_transient_failure_still_advises_a_rerun() {
        let text = incomplete(Error::Rpc {
            operation: "Publish",
            destination: "projects/p/topics/t".into(),
            code: tonic::Code::Unavailable,
            message: "down".into(),
            attempts: 5,
        });
        assert!(
            text.contains("re-run the statement to send them again"),
            "{text}"
        );
    }
}
