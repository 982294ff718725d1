//! The progress watchdog: bounds a stall, not a slow service.
//!
//! Whenever the writer waits for completions (admission, flush, the drain before an eviction,
//! a key's repair, an isolation pass), it waits through [`Progress::wait_until`]. The wait fails
//! with [`Error::ProgressTimeout`] when no record resolves within the budget. The budget
//! restarts at every completion: the deadline is `max(wait start, last completion) + budget`,
//! so a service that keeps answering, however slowly, never spends it.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::{Error, Result};

/// The completion clock shared by the writer and its send tasks.
#[derive(Debug)]
pub(crate) struct Progress {
    budget: Option<Duration>,
    option: &'static str,
    last_completion: Mutex<Option<Instant>>,
    changed: Notify,
}

impl Progress {
    /// A watchdog with `budget` (`None`: waits never time out), named by `option` in errors.
    pub(crate) fn new(budget: Option<Duration>, option: &'static str) -> Self {
        Progress {
            budget,
            option,
            last_completion: Mutex::new(None),
            changed: Notify::new(),
        }
    }

    /// A record resolved: restarts the budget and wakes the waiter.
    pub(crate) fn completed(&self) {
        *self
            .last_completion
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        self.changed.notify_waiters();
    }

    /// Something the waiter may be waiting for changed without a completion (a client lease
    /// ended, the writer failed): wakes the waiter without restarting the budget.
    pub(crate) fn poke(&self) {
        self.changed.notify_waiters();
    }

    fn last(&self) -> Option<Instant> {
        *self
            .last_completion
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until `ready` returns `true`, re-checking it at every completion or poke, with no
    /// budget and no error: the caller bounds the wait (a settle bounds it by the shutdown
    /// budget).
    pub(crate) async fn wait_quietly(&self, mut ready: impl FnMut() -> bool) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            // Registered before the check, so a change between the check and the await wakes us.
            notified.as_mut().enable();
            if ready() {
                return;
            }
            notified.await;
        }
    }

    /// Waits until `ready` returns `Ok(true)` (or an error, returned as is), re-checking it at
    /// every completion or poke. Fails with [`Error::ProgressTimeout`] naming `waiting_for`
    /// when no completion arrives within the budget.
    pub(crate) async fn wait_until(
        &self,
        waiting_for: &'static str,
        mut ready: impl FnMut() -> Result<bool>,
    ) -> Result<()> {
        let start = Instant::now();
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            // Registered before the check, so a change between the check and the await wakes us.
            notified.as_mut().enable();
            if ready()? {
                return Ok(());
            }
            let Some(budget) = self.budget else {
                notified.await;
                continue;
            };
            let from = self.last().map_or(start, |last| last.max(start));
            let Some(deadline) = from.checked_add(budget) else {
                // A budget past what the clock can express: no deadline.
                notified.await;
                continue;
            };
            if Instant::now() >= deadline {
                return Err(Error::ProgressTimeout {
                    option: self.option,
                    budget,
                    waiting_for,
                });
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn slow_but_answering_service_never_trips() {
        let progress = Arc::new(Progress::new(
            Some(Duration::from_secs(10)),
            "progress_timeout",
        ));
        let done = Arc::new(AtomicBool::new(false));
        let (p, d) = (progress.clone(), done.clone());
        // Ten completions, 9 s apart: 90 s in total, far past the 10 s budget.
        tokio::spawn(async move {
            for _ in 0..10 {
                tokio::time::sleep(Duration::from_secs(9)).await;
                p.completed();
            }
            d.store(true, Ordering::SeqCst);
            p.poke();
        });
        let start = Instant::now();
        progress
            .wait_until("flushing", || Ok(done.load(Ordering::SeqCst)))
            .await
            .expect("never trips");
        assert_eq!(start.elapsed(), Duration::from_secs(90));
    }

    #[tokio::test(start_paused = true)]
    async fn stall_trips_once_naming_the_option() {
        let progress = Progress::new(Some(Duration::from_secs(10)), "publish_progress_timeout");
        let start = Instant::now();
        let err = progress
            .wait_until("admission", || Ok(false))
            .await
            .unwrap_err();
        assert_eq!(start.elapsed(), Duration::from_secs(10));
        match err {
            Error::ProgressTimeout {
                option,
                waiting_for,
                budget,
            } => {
                assert_eq!(option, "publish_progress_timeout");
                assert_eq!(waiting_for, "admission");
                assert_eq!(budget, Duration::from_secs(10));
            }
            other => panic!("unexpected {other}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn budget_restarts_at_the_last_completion() {
        let progress = Arc::new(Progress::new(Some(Duration::from_secs(10)), "p"));
        let p = progress.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(7)).await;
            p.completed();
        });
        let start = Instant::now();
        let err = progress
            .wait_until("flushing", || Ok(false))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::ProgressTimeout { .. }));
        // 7 s to the completion, then a full budget.
        assert_eq!(start.elapsed(), Duration::from_secs(17));
    }

    #[tokio::test(start_paused = true)]
    async fn no_budget_never_times_out() {
        let progress = Arc::new(Progress::new(None, "p"));
        let flag = Arc::new(AtomicBool::new(false));
        let (p, f) = (progress.clone(), flag.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(100_000)).await;
            f.store(true, Ordering::SeqCst);
            p.poke();
        });
        progress
            .wait_until("x", || Ok(flag.load(Ordering::SeqCst)))
            .await
            .expect("no budget");
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_from_the_condition_ends_the_wait() {
        let progress = Progress::new(Some(Duration::from_secs(1)), "p");
        let err = progress
            .wait_until("x", || Err(Error::Failed("boom".into())))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Failed(_)));
    }
}
