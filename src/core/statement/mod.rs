//! The writers of one statement, coordinated: they share a stop request, add up their counts,
//! and the one that fails reports the statement's error with the counts over all of them.
//!
//! The engine runs one writer per partition of the sink's plan node (in this process, or as
//! the sink tasks of a cluster job); this module is what they share, by stage:
//!
//! - this file: the [`Statement`] and its tally, a [`Running`] writer, and how a writer's
//!   result becomes the statement's (a failure stops the others and waits for them);
//! - [`forward`]: a session's stop requests passed on to one statement;
//! - [`task`]: one writer as the engine runs it ([`WriterTask`]): in this process, or as a
//!   cluster's task that settles when the cluster cancels it or its job ends;
//! - [`log`]: the log lines of a writer task.
//!
//! Nothing here names a connector or a plan node: a writer is a future that returns the rows
//! it had acknowledged, or an [`Error::Incomplete`] with its counts.

mod forward;
mod log;
mod task;

use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::run::{WriterContext, new_statement_id};
use super::stop::{StopKind, StopSignal};
use crate::error::{Error, Result};

pub use forward::Forward;
pub use task::{JobEndWatch, WriterTask, install_job_end_watch};

/// The writers of one statement, as they start and end: the failed one waits for the others to
/// settle before it reports the counts over all of them.
#[derive(Debug)]
pub struct Statement {
    /// Names the statement's dead-letter objects.
    id: Arc<str>,
    stop: StopSignal,
    tally: Mutex<Tally>,
    ended: Notify,
}

impl Default for Statement {
    fn default() -> Self {
        Statement {
            id: new_statement_id().into(),
            stop: StopSignal::default(),
            tally: Mutex::default(),
            ended: Notify::default(),
        }
    }
}

#[derive(Debug, Default)]
struct Tally {
    /// Writers started and not yet ended.
    running: usize,
    acknowledged: u64,
    not_delivered: u64,
    dead_lettered: u64,
}

impl Statement {
    /// The statement's id (see [`new_statement_id`]), shared by its writers.
    pub fn id(&self) -> &Arc<str> {
        &self.id
    }

    /// The stop request its writers share.
    pub fn stop(&self) -> &StopSignal {
        &self.stop
    }

    fn tally(&self) -> std::sync::MutexGuard<'_, Tally> {
        self.tally.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A writer starts: the returned guard ends it (with no rows) if it is dropped before it
    /// reported its counts.
    pub fn start(self: &Arc<Self>) -> Running {
        self.tally().running += 1;
        Running {
            statement: Some(self.clone()),
        }
    }

    /// Waits until every writer that started has ended.
    async fn all_ended(&self) {
        loop {
            let notified = self.ended.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.tally().running == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// One running writer of a [`Statement`].
#[derive(Debug)]
pub struct Running {
    statement: Option<Arc<Statement>>,
}

impl Running {
    /// The writer ended with these counts.
    fn end(mut self, acknowledged: u64, not_delivered: u64, dead_lettered: u64) -> Arc<Statement> {
        let statement = self.statement.take().expect("a writer ends once");
        {
            let mut tally = statement.tally();
            tally.running -= 1;
            tally.acknowledged += acknowledged;
            tally.not_delivered += not_delivered;
            tally.dead_lettered += dead_lettered;
        }
        statement.ended.notify_waiters();
        statement
    }

    /// The writer `ctx.writer` ended with `result` (what it wrote); returns the rows it
    /// acknowledged, or the statement's error.
    ///
    /// The statement's error (a writer failed, or a stop left rows undelivered) is returned by
    /// the writer it concerns once every writer has ended, with the counts over all of them;
    /// a failure first asks the other writers to settle. The other writers return what they
    /// acknowledged.
    pub async fn finish(self, ctx: &WriterContext, result: Result<u64>) -> Result<u64> {
        let statement = self
            .statement
            .clone()
            .expect("a running writer has its statement");
        let (source, acknowledged, not_delivered, dead_lettered) = match result {
            Ok(acknowledged) => {
                self.end(acknowledged, 0, 0);
                return Ok(acknowledged);
            }
            Err(Error::Incomplete {
                source,
                acknowledged,
                not_delivered,
                dead_lettered,
            }) => (source, acknowledged, not_delivered, dead_lettered),
            Err(other) => (Box::new(other), 0, 0, 0),
        };
        let (writer, writers) = (ctx.writer, ctx.writers);
        if matches!(*source, Error::Stopped { .. }) {
            if statement.stop.kind() == Some(StopKind::Settle) || not_delivered == 0 {
                // Stopped by another writer's failure (which reports these counts with its
                // own), or stopped on request with everything admitted delivered.
                self.end(acknowledged, not_delivered, dead_lettered);
                return Ok(acknowledged);
            }
        } else {
            if writers > 1 {
                // Debug: the statement's error, returned to the caller, names the failure.
                tracing::debug!(
                    writer = writer + 1,
                    writers,
                    "a writer of the statement failed; stopping the others"
                );
            }
            statement.stop.stop(
                StopKind::Settle,
                format!("writer {} of {writers} failed", writer + 1),
            );
        }
        let statement = self.end(acknowledged, not_delivered, dead_lettered);
        statement.all_ended().await;
        let (acknowledged, not_delivered, dead_lettered) = {
            let tally = statement.tally();
            (tally.acknowledged, tally.not_delivered, tally.dead_lettered)
        };
        Err(Error::Incomplete {
            source,
            acknowledged,
            not_delivered,
            dead_lettered,
        })
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(statement) = self.statement.take() {
            statement.tally().running -= 1;
            statement.ended.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn incomplete(source: Error, acknowledged: u64, not_delivered: u64) -> Error {
        Error::Incomplete {
            source: Box::new(source),
            acknowledged,
            not_delivered,
            dead_lettered: 1,
        }
    }

    fn writer(writer: usize, statement: &Statement) -> WriterContext {
        WriterContext {
            writer,
            writers: 2,
            stop: statement.stop().clone(),
            ..WriterContext::default()
        }
    }

    #[tokio::test]
    async fn a_failed_writer_stops_the_others_waits_for_them_and_counts_them_all() {
        let statement = Arc::new(Statement::default());
        let (failing, other) = (statement.start(), statement.start());
        let failed = tokio::spawn({
            let ctx = writer(0, &statement);
            async move {
                let failure = incomplete(Error::Unsupported("refused".into()), 5, 3);
                failing.finish(&ctx, Err(failure)).await
            }
        });
        // The failure asks the other writer to settle, and waits for it.
        assert_eq!(
            statement.stop().reaches(StopKind::Settle).await,
            StopKind::Settle
        );
        assert_eq!(
            statement.stop().reason().as_deref(),
            Some("writer 1 of 2 failed")
        );
        tokio::task::yield_now().await;
        assert!(
            !failed.is_finished(),
            "the failed writer waits for the others"
        );
        let stopped = incomplete(
            Error::Stopped {
                reason: "settle".into(),
            },
            7,
            2,
        );
        let settled = other.finish(&writer(1, &statement), Err(stopped)).await;
        assert_eq!(settled.expect("a settled writer reports its rows"), 7);
        match failed.await.expect("joined") {
            Err(Error::Incomplete {
                source,
                acknowledged,
                not_delivered,
                dead_lettered,
            }) => {
                assert!(matches!(*source, Error::Unsupported(_)), "{source:?}");
                assert_eq!((acknowledged, not_delivered, dead_lettered), (12, 5, 2));
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_writer_dropped_before_it_ended_counts_as_ended_with_no_rows() {
        let statement = Arc::new(Statement::default());
        let (failing, dropped) = (statement.start(), statement.start());
        drop(dropped);
        let failure = incomplete(Error::Unsupported("refused".into()), 4, 1);
        let error = failing
            .finish(&writer(0, &statement), Err(failure))
            .await
            .expect_err("the failure is the statement's");
        assert!(
            matches!(
                error,
                Error::Incomplete {
                    acknowledged: 4,
                    not_delivered: 1,
                    ..
                }
            ),
            "{error:?}"
        );
    }
}
