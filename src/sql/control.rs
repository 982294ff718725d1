//! [`StatementControl`]: how a program stops the sink statements of a session and hears
//! their flush points.
//!
//! It travels as a DataFusion session-config extension, so that every writer of every `INSERT`
//! into a sink table run in that session finds it, whatever engine runs the plan.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use datafusion::prelude::SessionConfig;

use crate::core::run::{FlushObserver, FlushPoint};
use crate::core::{StopKind, StopSignal};

/// The stop request and flush-point observer of a session's sink statements.
///
/// A graceful stop ([`StatementControl::stop`] with [`StopKind::Drain`]) makes every running
/// sink statement stop reading input and deliver what it admitted within its
/// `shutdown_timeout`; [`StopKind::Abort`] stops it at once. The statement then ends with its
/// counts (`Ok` when everything admitted was delivered). The request stays raised for the
/// statements that start later, until [`StatementControl::rearm`].
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use gcp_sql::core::StopKind;
/// use gcp_sql::sql::StatementControl;
///
/// let points = Arc::new(Mutex::new(Vec::new()));
/// let seen = points.clone();
/// let control = StatementControl::new()
///     .with_observer(move |p| seen.lock().unwrap().push((p.writer, p.sequence)));
/// let ctx = gcp_sql::sql::new_context_with_control(&control);
/// // ... run an INSERT on `ctx` in a task; later, from elsewhere:
/// control.stop(StopKind::Drain, "stop requested by the operator");
/// assert_eq!(control.stopped(), Some(StopKind::Drain));
/// # drop(ctx);
/// ```
#[derive(Clone, Default)]
pub struct StatementControl {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    stop: Mutex<StopSignal>,
    observer: Option<FlushObserver>,
    /// Sink writers running now.
    writers: AtomicUsize,
}

impl std::fmt::Debug for StatementControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatementControl")
            .field("stopped", &self.stopped())
            .field("observer", &self.inner.observer.is_some())
            .finish()
    }
}

impl StatementControl {
    /// A control with no observer and no stop request.
    pub fn new() -> Self {
        Self::default()
    }

    /// Calls `observer` at every flush point of every writer (from the writer's task: keep it
    /// short).
    pub fn with_observer(self, observer: impl Fn(&FlushPoint) + Send + Sync + 'static) -> Self {
        let stop = self.signal();
        StatementControl {
            inner: Arc::new(Inner {
                stop: Mutex::new(stop),
                observer: Some(Arc::new(observer)),
                writers: AtomicUsize::new(0),
            }),
        }
    }

    /// Asks the running sink statements (and those started later, until [`rearm`]) to stop:
    /// see [`StopKind`]. A second call may only make the request harder.
    ///
    /// [`rearm`]: StatementControl::rearm
    pub fn stop(&self, kind: StopKind, reason: impl Into<String>) {
        self.signal().stop(kind, reason);
    }

    /// The stop request in force, if any.
    pub fn stopped(&self) -> Option<StopKind> {
        self.signal().kind()
    }

    /// Why the statements were stopped, if they were.
    pub fn reason(&self) -> Option<String> {
        self.signal().reason()
    }

    /// Clears the stop request for the statements that start from now on (the running ones
    /// keep the request they had).
    pub fn rearm(&self) {
        *self.inner.stop.lock().unwrap_or_else(|p| p.into_inner()) = StopSignal::new();
    }

    /// The signal the statements starting now watch.
    pub fn signal(&self) -> StopSignal {
        self.inner
            .stop
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The flush-point observer, if any.
    pub fn observer(&self) -> Option<FlushObserver> {
        self.inner.observer.clone()
    }

    /// How many sink writers of this session are running now: a stop request reaches them;
    /// with none, nothing would hear it.
    pub fn running_writers(&self) -> usize {
        self.inner.writers.load(Ordering::Acquire)
    }

    /// Counts a writer as running until the guard is dropped.
    pub(crate) fn writer_running(&self) -> WriterRunning {
        self.inner.writers.fetch_add(1, Ordering::AcqRel);
        WriterRunning(self.clone())
    }

    /// `config` with this control installed as an extension.
    pub fn install(&self, config: SessionConfig) -> SessionConfig {
        config.with_extension(Arc::new(self.clone()))
    }
}

/// A sink writer counted as running by its [`StatementControl`] (see
/// [`StatementControl::running_writers`]).
pub(crate) struct WriterRunning(StatementControl);

impl Drop for WriterRunning {
    fn drop(&mut self) {
        self.0.inner.writers.fetch_sub(1, Ordering::AcqRel);
    }
}
