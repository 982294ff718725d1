//! One writer of a statement as the engine runs it: in this process, or as a sink task of a
//! cluster job, which the cluster may cancel while it writes.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use datafusion::error::{DataFusionError, Result as DFResult};

use super::Forward;
use crate::core::{StopKind, StopSignal};

/// One writer of a statement (a partition of the sink's plan node), as its log lines and
/// errors name it. Names no row value.
#[derive(Debug, Clone)]
pub struct WriterTask {
    /// The table written to.
    pub table: String,
    /// Where the rows go, as the table's declaration says it (`None`: a sink declared in Rust).
    pub destination: Option<String>,
    /// The engine's task id: set on a cluster (Ballista's `TID <job>/...`), `None` in this
    /// process.
    pub task: Option<String>,
    /// The writer's partition, from 0.
    pub partition: usize,
    /// How many writers the statement runs.
    pub writers: usize,
}

impl WriterTask {
    /// Runs `writer` (the writer's rows acknowledged, or the statement's error) with the
    /// statement's stop request `stop`, which the session's `user_stop` requests reach while
    /// it runs, and logs how it ended.
    ///
    /// A cluster's executor cancels a task (its job was cancelled, or another task of the job
    /// failed) by dropping it, and its job may end while the writer runs. On a cluster the
    /// writer therefore runs as a Tokio task of its own, and a drop of the returned future, or
    /// the end of the job (see [`install_job_end_watch`]), asks it to settle: read and send
    /// nothing more, wait for the sends on the wire within `shutdown_timeout`, and log its
    /// counts, instead of dropping the rows it has on the wire unaccounted for. Not a drain: a
    /// drain also takes the rows its input holds ready, and a shuffle reader holds its whole
    /// partition ready, so a drained writer went on sending for a minute after a cancel.
    pub async fn run<F>(
        self,
        stop: StopSignal,
        user_stop: Option<StopSignal>,
        writer: F,
    ) -> DFResult<u64>
    where
        F: Future<Output = DFResult<u64>> + Send + 'static,
    {
        // The session's stop requests reach this writer for as long as it runs.
        let _forward = user_stop.map(|from| Forward::start(from, stop.clone()));
        if self.task.is_none() {
            let result = writer.await;
            self.log(&result);
            return self.for_the_engine(result);
        }
        self.started();
        let cancel = CancelOnDrop::new(stop.clone());
        let cancelled = cancel.cancelled.clone();
        // Ballista's cancel may not drop this future (the task's work can run on a task of its
        // own), so the writer also watches its job and settles when the job ended.
        let job_watch = self
            .task
            .as_deref()
            .and_then(job_of_task)
            .zip(JOB_END_WATCH.get().cloned())
            .map(|(job, watch)| {
                let (stop, cancelled) = (stop.clone(), cancelled.clone());
                tokio::spawn(async move {
                    watch(job).await;
                    cancelled.store(true, Ordering::SeqCst);
                    stop.stop(
                        StopKind::Settle,
                        "the job ended on the cluster (it was cancelled, or another task \
                         failed)",
                    );
                })
            });
        let log = self.clone();
        let writer = tokio::spawn(async move {
            let result = writer.await;
            if let Some(watch) = job_watch {
                watch.abort();
            }
            if cancelled.load(Ordering::SeqCst) {
                log.log_cancelled(&result);
            } else {
                log.log(&result);
            }
            result
        });
        let joined = writer.await;
        cancel.disarm();
        let result = joined.map_err(|e| {
            DataFusionError::Execution(format!(
                "the writer of partition {} of table '{}' ended abnormally: {e}",
                self.partition, self.table
            ))
        })?;
        self.for_the_engine(result)
    }

    /// The writer's result as the engine that runs it shows it. A distributed engine's task
    /// (one that has a task id: Ballista's) reports a failure with the error's debug form, so
    /// there the sink's error is handed over as its message; in this process it stays the
    /// sink's own error, which the SQL layer and the tool recognise.
    fn for_the_engine(&self, result: DFResult<u64>) -> DFResult<u64> {
        match result {
            Err(error) if self.task.is_some() => Err(DataFusionError::Execution(match error {
                DataFusionError::External(inner) => inner.to_string(),
                other => other.to_string(),
            })),
            other => other,
        }
    }
}

/// Waits until the cluster job of the given id has ended (cancelled, failed or done).
pub type JobEndWatch = Arc<dyn Fn(String) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

static JOB_END_WATCH: std::sync::OnceLock<JobEndWatch> = std::sync::OnceLock::new();

/// Installs, once per process, how a sink task of a cluster job learns that its job ended
/// while it runs: an executor of this crate asks its scheduler (Ballista's own cancel does not
/// reach a running sink writer). A sink writer whose job ended settles.
pub fn install_job_end_watch(watch: JobEndWatch) {
    let _ = JOB_END_WATCH.set(watch);
}

/// The job id in a Ballista task id (`TID <job>/<stage>.<attempt>/<partition>...`).
fn job_of_task(task: &str) -> Option<String> {
    task.strip_prefix("TID ")?
        .split('/')
        .next()
        .filter(|job| !job.is_empty())
        .map(str::to_string)
}

/// Settles a writer's statement when the engine drops the writer's future before it ended (a
/// cluster's task cancelled by its scheduler).
struct CancelOnDrop {
    stop: Option<StopSignal>,
    cancelled: Arc<AtomicBool>,
}

impl CancelOnDrop {
    fn new(stop: StopSignal) -> Self {
        CancelOnDrop {
            stop: Some(stop),
            cancelled: Arc::default(),
        }
    }

    /// The writer ended: a drop no longer means a cancel.
    fn disarm(mut self) {
        self.stop = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            self.cancelled.store(true, Ordering::SeqCst);
            stop.stop(
                StopKind::Settle,
                "the task was cancelled by the cluster (its job was cancelled, or another task \
                 of the job failed)",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_is_read_from_a_ballista_task_id() {
        assert_eq!(
            job_of_task("TID 038HJ1DTB8000/1.0/0.0").as_deref(),
            Some("038HJ1DTB8000")
        );
        assert_eq!(job_of_task("TID /1.0/0"), None);
        assert_eq!(job_of_task("task 7"), None);
    }

    #[tokio::test]
    async fn a_cluster_task_dropped_before_its_writer_ended_settles_the_statement() {
        let stop = StopSignal::default();
        let task = WriterTask {
            table: "t".into(),
            destination: None,
            task: Some("TID job/1.0/0".into()),
            partition: 0,
            writers: 1,
        };
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let watched = stop.clone();
        let writer = async move {
            // The writer runs until its statement is settled, then reports its rows.
            watched.reaches(StopKind::Settle).await;
            let _ = release.send(());
            Ok(3)
        };
        let run = tokio::spawn(task.run(stop.clone(), None, writer));
        tokio::task::yield_now().await;
        assert_eq!(stop.kind(), None);
        run.abort();
        let _ = run.await;
        assert_eq!(stop.kind(), Some(StopKind::Settle));
        assert!(
            stop.reason()
                .unwrap_or_default()
                .contains("cancelled by the cluster"),
            "{:?}",
            stop.reason()
        );
        released
            .await
            .expect("the writer went on to settle on its own task");
    }

    #[tokio::test]
    async fn a_local_failure_stays_the_sinks_own_error_and_a_cluster_one_its_message() {
        let task = |id: Option<&str>| WriterTask {
            table: "t".into(),
            destination: None,
            task: id.map(str::to_string),
            partition: 0,
            writers: 1,
        };
        let failure = || async {
            Err(DataFusionError::External(Box::new(
                crate::Error::Unsupported("refused".into()),
            )))
        };
        let local = task(None)
            .run(StopSignal::default(), None, failure())
            .await
            .expect_err("fails");
        assert!(matches!(local, DataFusionError::External(_)), "{local:?}");
        let remote = task(Some("TID job/1.0/0"))
            .run(StopSignal::default(), None, failure())
            .await
            .expect_err("fails");
        assert!(
            matches!(&remote, DataFusionError::Execution(m) if !m.contains("Unsupported")),
            "{remote:?}"
        );
    }
}
