//! Where a writer's rows came from, when that matters for correctness: a source that
//! acknowledges what it read only once every row made from it has been delivered (a Pub/Sub
//! subscription) hands each batch it emits an origin, and the writer reports on it.
//!
//! The contract, from the writer's side (the source's side is its own, see ADR 0041):
//!
//! - Right after a batch arrives from its input, and before it asks its input for the next
//!   one, the writer takes the batch's origin from the [`OriginSlot`] of its input, and
//!   [`RowOrigin::retain`]s one count for each row it accepted (encoded, or refused by the
//!   encoder under a policy that keeps the row's fate: drop, dead letter).
//! - Each such row is later [`RowOrigin::settle`]d exactly once, and only positively: when the
//!   service acknowledged it, when its dead letter was written, or when the failure policy
//!   dropped it. A row that is not delivered (a failed statement, a stop, an abort) is never
//!   settled, and its origin then acknowledges nothing.
//!
//! Nothing here names a source: the core sees two traits.

use std::fmt::Debug;
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::error::Result;

/// How a retained row ended, among the outcomes that let its origin acknowledge it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// The service acknowledged it.
    Delivered,
    /// Its dead letter was written.
    DeadLettered,
    /// The failure policy dropped it (`failure_policy = 'drop'`).
    Dropped,
}

/// The origin of a batch of rows (for a subscription: the messages the batch was made from).
pub trait RowOrigin: Debug + Send + Sync {
    /// `rows` more rows of this origin were accepted by a writer, each to be settled once.
    /// An error (the origin was already sealed, for instance) fails the writer: the plan
    /// between the source and the writer does not keep the contract.
    fn retain(&self, rows: u64) -> Result<()>;

    /// `rows` retained rows ended as `how`.
    fn settle(&self, rows: u64, how: Settled);
}

/// Where a writer finds the origin of the batch its input produced last, and how it talks to
/// the source behind its input.
pub trait OriginSlot: Debug + Send + Sync {
    /// The origin of the last batch the input produced, if it has one.
    fn current(&self) -> Option<Arc<dyn RowOrigin>>;

    /// The statement was asked to stop gracefully: the source stops reading, emits what it
    /// already read, and then ends the input. The writer keeps reading until then.
    fn stop_reading(&self);

    /// What the source did so far (its whole scan, every partition).
    fn counts(&self) -> OriginCounts;

    /// Resolves once every acknowledgement and nack the source decided was sent. Await it
    /// after the input stream was dropped.
    fn settled(&self) -> BoxFuture<'static, ()>;

    /// The source, for messages (`subscription projects/p/subscriptions/s`).
    fn describe(&self) -> String;
}

/// What a source did, as a writer reports it at flush points and at the end of a statement.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OriginCounts {
    /// Messages (or records) read from the source.
    pub read: u64,
    /// Messages acknowledged: every row made from them was delivered, dead-lettered, dropped
    /// by the failure policy or filtered out.
    pub acknowledged: u64,
    /// Messages handed back for another reader (not delivered here).
    pub nacked: u64,
}

/// Settles every row of `origins` that has an origin, one call per run of rows sharing one.
pub(crate) fn settle_all<'a>(
    origins: impl IntoIterator<Item = Option<&'a Arc<dyn RowOrigin>>>,
    how: Settled,
) {
    let mut run: Option<(&Arc<dyn RowOrigin>, u64)> = None;
    for origin in origins.into_iter().flatten() {
        match &mut run {
            Some((current, n)) if Arc::ptr_eq(current, origin) => *n += 1,
            _ => {
                if let Some((current, n)) = run.take() {
                    current.settle(n, how);
                }
                run = Some((origin, 1));
            }
        }
    }
    if let Some((current, n)) = run {
        current.settle(n, how);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Mutex;

    use super::*;

    /// An origin that records what it was told.
    #[derive(Debug, Default)]
    pub(crate) struct Recorder {
        pub(crate) retained: Mutex<u64>,
        pub(crate) settled: Mutex<Vec<(u64, Settled)>>,
    }

    impl Recorder {
        /// Rows settled as `how`.
        pub(crate) fn count(&self, how: Settled) -> u64 {
            let settled = self.settled.lock().unwrap();
            settled
                .iter()
                .filter(|(_, h)| *h == how)
                .map(|(n, _)| n)
                .sum()
        }
    }

    impl RowOrigin for Recorder {
        fn retain(&self, rows: u64) -> Result<()> {
            *self.retained.lock().unwrap() += rows;
            Ok(())
        }

        fn settle(&self, rows: u64, how: Settled) {
            self.settled.lock().unwrap().push((rows, how));
        }
    }

    #[test]
    fn runs_of_one_origin_are_settled_in_one_call() {
        let a: Arc<dyn RowOrigin> = Arc::new(Recorder::default());
        let b: Arc<dyn RowOrigin> = Arc::new(Recorder::default());
        let rows = [Some(&a), Some(&a), None, Some(&b), Some(&a)];
        settle_all(rows, Settled::Delivered);
        let calls = |o: &Arc<dyn RowOrigin>| format!("{o:?}");
        assert!(
            calls(&a).contains("(2, Delivered), (1, Delivered)"),
            "{}",
            calls(&a)
        );
        assert!(calls(&b).contains("(1, Delivered)"), "{}", calls(&b));
    }
}
