//! [`StopSignal`]: asks the writers of one statement to stop reading input.
//!
//! A statement may run several writers at once (one per input partition). When one of them
//! fails, the others must send nothing new and settle what they already sent, so that the
//! statement's error can count every row over all writers. The failing writer raises the
//! signal; every writer of the statement watches it between batches and while it waits for
//! input.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

#[derive(Debug, Default)]
struct Inner {
    stopped: AtomicBool,
    /// Why, as the first caller of `stop` said it.
    reason: Mutex<Option<String>>,
    changed: Notify,
}

/// A flag shared by the writers of one statement: once raised, it stays raised. Cheap to clone;
/// clones share the flag.
///
/// ```
/// use gcp_sql::core::StopSignal;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let signal = StopSignal::new();
/// let watcher = signal.clone();
/// assert!(!watcher.is_stopped());
/// signal.stop();
/// watcher.stopped().await; // returns at once: the flag is raised
/// assert!(watcher.is_stopped());
/// assert_eq!(watcher.reason().as_deref(), Some("writer 2 of 2 failed"));
/// # });
/// ```
#[derive(Debug, Clone, Default)]
pub struct StopSignal {
    inner: Arc<Inner>,
}

impl StopSignal {
    /// A signal not raised yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Raises the signal and wakes every writer waiting on it. `reason` (the first one given is
    /// kept) says why, for the stopped writers' errors: "writer 3 of 4 failed".
    pub fn stop(&self, reason: impl Into<String>) {
        {
            let mut kept = self.inner.reason.lock().unwrap_or_else(|p| p.into_inner());
            if kept.is_none() {
                *kept = Some(reason.into());
            }
        }
        self.inner.stopped.store(true, Ordering::Release);
        self.inner.changed.notify_waiters();
    }

    /// Why the signal was raised (the first reason given), `None` while it is not.
    pub fn reason(&self) -> Option<String> {
        self.inner
            .reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether the signal was raised.
    pub fn is_stopped(&self) -> bool {
        self.inner.stopped.load(Ordering::Acquire)
    }

    /// Returns once the signal is raised (at once if it already is).
    pub async fn stopped(&self) {
        loop {
            let notified = self.inner.changed.notified();
            tokio::pin!(notified);
            // Registered before the check, so a `stop` between the check and the await wakes us.
            notified.as_mut().enable();
            if self.is_stopped() {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_waiter_wakes_when_another_task_raises_the_signal() {
        let signal = StopSignal::new();
        let waiter = tokio::spawn({
            let signal = signal.clone();
            async move { signal.stopped().await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiter.is_finished());
        signal.stop("first");
        signal.stop("second");
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("woken")
            .expect("joined");
        assert!(signal.is_stopped());
        assert_eq!(signal.reason().as_deref(), Some("first"));
    }
}
