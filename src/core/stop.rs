//! [`StopSignal`]: asks the writers of a statement to stop reading input, and how hard.
//!
//! A statement may run several writers at once (one per input partition), and an unbounded one
//! runs until someone stops it. Three requests, in rising order, reach every writer of the
//! statement through one shared signal:
//!
//! - [`StopKind::Drain`] (a graceful stop, first Ctrl-C): read no more input, send every open
//!   batch and wait, within the shutdown budget, until every admitted row is resolved;
//! - [`StopKind::Settle`] (another writer of the statement failed): read and send nothing new,
//!   wait within the shutdown budget for the sends already on the wire;
//! - [`StopKind::Abort`] (second Ctrl-C): stop at once, without waiting for anything.
//!
//! A later request may only raise the level (a drain can become an abort, never the reverse).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// How hard a [`StopSignal`] asks the writers to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum StopKind {
    /// Read no more input; deliver everything admitted, within the shutdown budget.
    Drain,
    /// Read and send nothing new; wait for the sends on the wire, within the shutdown budget.
    Settle,
    /// Stop now: nothing is waited for.
    Abort,
}

impl StopKind {
    fn level(self) -> u8 {
        match self {
            StopKind::Drain => 1,
            StopKind::Settle => 2,
            StopKind::Abort => 3,
        }
    }

    fn from_level(level: u8) -> Option<Self> {
        match level {
            1 => Some(StopKind::Drain),
            2 => Some(StopKind::Settle),
            3 => Some(StopKind::Abort),
            _ => None,
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    level: AtomicU8,
    /// Why, as the first caller said it.
    reason: Mutex<Option<String>>,
    changed: Notify,
}

/// A stop request shared by the writers of a statement: once raised it stays raised, and it
/// can only be raised further. Cheap to clone; clones share the request.
///
/// ```
/// use gcp_sql::core::{StopKind, StopSignal};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let signal = StopSignal::new();
/// let watcher = signal.clone();
/// assert_eq!(watcher.kind(), None);
/// signal.stop(StopKind::Drain, "stop requested (Ctrl-C)");
/// assert_eq!(watcher.stopped().await, StopKind::Drain); // at once: the signal is raised
/// signal.stop(StopKind::Abort, "second Ctrl-C");
/// assert_eq!(watcher.kind(), Some(StopKind::Abort));
/// assert_eq!(watcher.reason().as_deref(), Some("stop requested (Ctrl-C)"));
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

    /// Raises the signal to `kind` (a lower one than it already has changes nothing) and wakes
    /// every writer waiting on it. `reason` (the first one given is kept) says why, for the
    /// outcome: "writer 3 of 4 failed", "stop requested (SIGTERM)".
    pub fn stop(&self, kind: StopKind, reason: impl Into<String>) {
        {
            let mut kept = self.inner.reason.lock().unwrap_or_else(|p| p.into_inner());
            if kept.is_none() {
                *kept = Some(reason.into());
            }
        }
        self.inner.level.fetch_max(kind.level(), Ordering::AcqRel);
        self.inner.changed.notify_waiters();
    }

    /// How hard the signal asks to stop, `None` while it is not raised.
    pub fn kind(&self) -> Option<StopKind> {
        StopKind::from_level(self.inner.level.load(Ordering::Acquire))
    }

    /// Why the signal was raised (the first reason given), `None` while it is not.
    pub fn reason(&self) -> Option<String> {
        self.inner
            .reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Returns the level once the signal is at least raised (at once if it already is).
    pub async fn stopped(&self) -> StopKind {
        self.reaches(StopKind::Drain).await
    }

    /// Returns once the signal is at `kind` or above, with the level it has then.
    pub async fn reaches(&self, kind: StopKind) -> StopKind {
        loop {
            let notified = self.inner.changed.notified();
            tokio::pin!(notified);
            // Registered before the check, so a `stop` between the check and the await wakes us.
            notified.as_mut().enable();
            if let Some(now) = self.kind()
                && now >= kind
            {
                return now;
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
        signal.stop(StopKind::Settle, "first");
        signal.stop(StopKind::Drain, "second");
        let kind = tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("woken")
            .expect("joined");
        assert_eq!(kind, StopKind::Settle);
        // A lower request does not lower the level; the first reason is kept.
        assert_eq!(signal.kind(), Some(StopKind::Settle));
        assert_eq!(signal.reason().as_deref(), Some("first"));
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_for_an_abort_ignores_a_drain() {
        let signal = StopSignal::new();
        signal.stop(StopKind::Drain, "graceful");
        let abort = tokio::spawn({
            let signal = signal.clone();
            async move { signal.reaches(StopKind::Abort).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!abort.is_finished());
        signal.stop(StopKind::Abort, "again");
        assert_eq!(abort.await.expect("joined"), StopKind::Abort);
    }
}
