//! A session's stop requests passed on to one statement's writers.

use crate::core::{StopKind, StopSignal};

/// Passes a session's stop requests on to one statement's signal, until it is dropped: a
/// drain, then an abort (a second request), each with the session's reason.
#[derive(Debug)]
pub struct Forward(Option<tokio::task::JoinHandle<()>>);

impl Forward {
    /// Starts passing `from`'s requests on to `to` (outside a Tokio runtime: nothing to do).
    pub fn start(from: StopSignal, to: StopSignal) -> Self {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Forward(None);
        };
        Forward(Some(runtime.spawn(async move {
            let mut level = StopKind::Drain;
            loop {
                let kind = from.reaches(level).await;
                to.stop(
                    kind,
                    from.reason().unwrap_or_else(|| "stop requested".into()),
                );
                if kind == StopKind::Abort {
                    return;
                }
                level = StopKind::Abort;
            }
        })))
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}
