//! The consecutive-rejection breaker.
//!
//! Under a dropping failure policy the writer keeps going through records the service refuses;
//! each is confirmed alone first, so a stream where *every* record is refused degrades into
//! unbatched sends under a green statement. The breaker fails the statement once
//! `max_consecutive_rejections` confirmed rejections arrive with no acknowledged record between
//! them. Any acknowledged record, on any destination, resets the count; rows the encoder
//! rejects never count (they say nothing about the service's view of the stream).

use std::sync::Mutex;

use crate::error::{Error, Result};

/// Counts confirmed rejections in a row across a writer's destinations.
#[derive(Debug)]
pub(crate) struct Breaker {
    limit: Option<u64>,
    option: &'static str,
    consecutive: Mutex<u64>,
}

impl Breaker {
    /// A breaker that trips at `limit` consecutive rejections (`None`: never), naming `option`.
    pub(crate) fn new(limit: Option<u64>, option: &'static str) -> Self {
        Breaker {
            limit,
            option,
            consecutive: Mutex::new(0),
        }
    }

    /// A record was acknowledged: the run of rejections is over.
    pub(crate) fn on_success(&self) {
        *self.consecutive.lock().unwrap_or_else(|p| p.into_inner()) = 0;
    }

    /// A rejection was confirmed alone. Errs with [`Error::RejectionBreaker`] when this one
    /// reaches the limit.
    pub(crate) fn on_confirmed_rejection(&self) -> Result<()> {
        let mut c = self.consecutive.lock().unwrap_or_else(|p| p.into_inner());
        *c = c.saturating_add(1);
        match self.limit {
            Some(limit) if *c >= limit => Err(Error::RejectionBreaker {
                option: self.option,
                count: *c,
            }),
            _ => Ok(()),
        }
    }

    /// Confirmed rejections since the last success.
    #[cfg(test)]
    pub(crate) fn consecutive(&self) -> u64 {
        *self.consecutive.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trips_after_n_consecutive_rejections_naming_the_option() {
        let b = Breaker::new(Some(3), "max_consecutive_rejections");
        assert!(b.on_confirmed_rejection().is_ok());
        assert!(b.on_confirmed_rejection().is_ok());
        match b.on_confirmed_rejection() {
            Err(Error::RejectionBreaker { option, count }) => {
                assert_eq!(option, "max_consecutive_rejections");
                assert_eq!(count, 3);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn any_success_resets_the_count() {
        let b = Breaker::new(Some(3), "m");
        for _ in 0..10 {
            assert!(b.on_confirmed_rejection().is_ok());
            assert!(b.on_confirmed_rejection().is_ok());
            b.on_success();
        }
        assert_eq!(b.consecutive(), 0);
    }

    #[test]
    fn unbounded_never_trips() {
        let b = Breaker::new(None, "m");
        for _ in 0..100_000 {
            assert!(b.on_confirmed_rejection().is_ok());
        }
        assert_eq!(b.consecutive(), 100_000);
    }
}
