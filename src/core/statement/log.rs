//! The log lines of a [`WriterTask`]: one as a cluster's sink task starts, one as each writer
//! ends (done, failed, or cancelled by the cluster). Each names the table, the partition, the
//! writer count, the destination and the task; never a row value.

use datafusion::error::Result as DFResult;

use super::WriterTask;

/// One event of `$level` about the writer task `$log`, with its identifying fields and the
/// given further fields and message.
macro_rules! task_event {
    ($level:ident, $log:expr, $($rest:tt)+) => {
        tracing::$level!(
            table = %$log.table,
            partition = $log.partition,
            writers = $log.writers,
            destination = $log.destination.as_deref().unwrap_or("(declared in Rust)"),
            task = $log.task.as_deref().unwrap_or("-"),
            $($rest)+
        )
    };
}

impl WriterTask {
    /// On a cluster: one info line per writer of a sink task as it starts.
    pub(super) fn started(&self) {
        task_event!(info, self, "sink task started");
    }

    /// On a cluster: the line of a writer whose task was cancelled and that settled, with the
    /// rows it had acknowledged (and, when what was on the wire did not all land, the error
    /// that counts them).
    pub(super) fn log_cancelled(&self, result: &DFResult<u64>) {
        match result {
            Ok(rows) => task_event!(
                warn,
                self,
                rows,
                "sink task cancelled: it sent nothing new and what was on the wire landed"
            ),
            Err(error) => task_event!(
                warn,
                self,
                %error,
                "sink task cancelled: it sent nothing new and not everything on the wire landed"
            ),
        }
    }

    /// One info line per writer that ended (on a cluster: per writer of each sink task an
    /// executor ran); for one that failed, a warning on a cluster and a debug line in this
    /// process (whose statement error says it).
    pub(super) fn log(&self, result: &DFResult<u64>) {
        match result {
            Ok(rows) => task_event!(info, self, rows, "sink task done"),
            // On a cluster the executor's log is where a failed task is seen; in this
            // process the statement's own error says it, so the line stays below warn.
            Err(error) if self.task.is_some() => {
                task_event!(warn, self, %error, "sink task failed")
            }
            Err(error) => task_event!(debug, self, %error, "sink task failed"),
        }
    }
}
