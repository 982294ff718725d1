//! The handle of a batch that keeps some rows of its input batch (a filter's output): row *i*
//! of the output is row `rows[i]` of the input, and [`DeliveryHandle::settle_rows`] says so to
//! the input's handle.
//!
//! Retaining and settling counts pass straight through (a row filtered out counts as handled
//! by the input, as before). Only the per-row release needs the map: a consumer that holds
//! rows of one batch until different windows close releases each row's message by its index,
//! and an index into the filter's output is not an index into the source's batch. Without the
//! map the source would acknowledge the message of another row, one whose window may not be
//! recorded yet.

use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;

use super::{
    Delivery, DeliveryCounts, DeliveryHandle, DeliveryInput, EventClock, Held, InputIdentity,
};
use crate::error::Result;

/// A subset of the rows of an input batch, in their order.
#[derive(Debug)]
pub struct SubsetHandle {
    inner: Arc<dyn DeliveryHandle>,
    /// Row *i* of this batch is row `rows[i]` of the input batch.
    rows: Vec<u32>,
}

impl SubsetHandle {
    /// The handle of a batch made of rows `rows` (indices into the batch `inner` covers, in
    /// increasing order) of `inner`'s batch.
    pub fn new(inner: Arc<dyn DeliveryHandle>, rows: Vec<u32>) -> Self {
        SubsetHandle { inner, rows }
    }
}

impl DeliveryHandle for SubsetHandle {
    fn retain(&self, rows: u64) -> Result<()> {
        self.inner.retain(rows)
    }

    fn settle(&self, rows: u64, how: Delivery) {
        self.inner.settle(rows, how)
    }

    fn settle_rows(&self, rows: &[u32], how: Delivery) {
        let mapped: Vec<u32> = rows
            .iter()
            .filter_map(|&r| self.rows.get(r as usize).copied())
            .collect();
        if mapped.len() != rows.len() {
            // An index past the batch: the consumer's accounting is broken. Settle the count
            // only, so the input's own check (more settled than retained) still sees it.
            tracing::error!(
                rows = rows.len(),
                batch = self.rows.len(),
                "a consumer released a row index past the end of a filtered batch"
            );
            self.inner.settle(rows.len() as u64, how);
            return;
        }
        self.inner.settle_rows(&mapped, how)
    }

    fn hold(&self) {
        self.inner.hold()
    }

    fn row_keys(&self, rows: &[u32]) -> Option<Vec<String>> {
        let mapped: Vec<u32> = rows
            .iter()
            .map(|&r| self.rows.get(r as usize).copied())
            .collect::<Option<_>>()?;
        self.inner.row_keys(&mapped)
    }

    fn forget_row_keys(&self) {
        self.inner.forget_row_keys()
    }
}

/// Where a node that keeps a subset of its input's rows publishes the handle of the batch it
/// emitted last; shared by the node's stream (which [`put`](Self::put)s) and the
/// [`SubsetInput`] consumers find.
#[derive(Debug, Default)]
pub struct SubsetSlot {
    current: Mutex<Option<Arc<dyn DeliveryHandle>>>,
}

impl SubsetSlot {
    /// The node emits a batch whose handle is `handle`.
    pub fn put(&self, handle: Option<Arc<dyn DeliveryHandle>>) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = handle;
    }

    fn get(&self) -> Option<Arc<dyn DeliveryHandle>> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// The delivery input of a node that keeps a subset of its input's rows: the handle of its
/// last batch comes from its [`SubsetSlot`]; everything else is the input's.
#[derive(Debug)]
pub struct SubsetInput {
    inner: Arc<dyn DeliveryInput>,
    slot: Arc<SubsetSlot>,
}

impl SubsetInput {
    /// The node's input `inner`, with the handles the node publishes in `slot`.
    pub fn new(inner: Arc<dyn DeliveryInput>, slot: Arc<SubsetSlot>) -> Self {
        SubsetInput { inner, slot }
    }
}

impl DeliveryInput for SubsetInput {
    fn current(&self) -> Option<Arc<dyn DeliveryHandle>> {
        self.slot.get()
    }

    fn stop_reading(&self) {
        self.inner.stop_reading()
    }

    fn counts(&self) -> DeliveryCounts {
        self.inner.counts()
    }

    fn settled(&self) -> BoxFuture<'static, ()> {
        self.inner.settled()
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn expect_held(&self, messages: u64) {
        self.inner.expect_held(messages)
    }

    fn read_until(&self, until: std::time::Instant) {
        self.inner.read_until(until)
    }

    fn clock(&self) -> Option<Arc<EventClock>> {
        self.inner.clock()
    }

    fn flush_point(&self) {
        self.inner.flush_point()
    }

    fn identity(&self) -> InputIdentity {
        self.inner.identity()
    }

    fn held(&self) -> Held {
        self.inner.held()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::delivery::ticket::{Ticket, Verdict, Verdicts};
    use std::sync::atomic::AtomicBool;

    fn acked(
        rx: &mut tokio::sync::mpsc::UnboundedReceiver<Verdict<&'static str>>,
    ) -> Vec<&'static str> {
        let mut out = Vec::new();
        while let Ok(v) = rx.try_recv() {
            if let Verdict::Ack(ids) = v {
                out.extend(ids);
            }
        }
        out
    }

    #[test]
    fn a_row_released_through_a_filter_acknowledges_its_own_message() {
        let (queue, mut rx) = Verdicts::new(Arc::new(AtomicBool::new(false)));
        // Rows: a (dropped by the filter), b, c; the filter keeps b and c.
        let ticket = Arc::new(Ticket::new(vec!["a", "b", "c"], 3, queue));
        let kept = SubsetHandle::new(ticket.clone(), vec![1, 2]);
        kept.retain(2).unwrap();
        ticket.seal();
        // The consumer releases its row 1 (the input's row 2, message c) first.
        kept.settle_rows(&[1], Delivery::Dropped);
        assert_eq!(acked(&mut rx), vec!["c"]);
        kept.settle_rows(&[0], Delivery::Dropped);
        let mut rest = acked(&mut rx);
        rest.sort();
        assert_eq!(rest, vec!["a", "b"]);
    }

    #[test]
    fn row_keys_through_a_filter_name_the_rows_own_messages() {
        let (queue, _rx) = Verdicts::new(Arc::new(AtomicBool::new(false)));
        let ticket = Arc::new(
            Ticket::new(vec!["a", "b", "c"], 3, queue).with_row_keys(vec![
                "m1".into(),
                "m2".into(),
                "m3".into(),
            ]),
        );
        let kept = SubsetHandle::new(ticket.clone(), vec![0, 2]);
        assert_eq!(
            kept.row_keys(&[1, 0]),
            Some(vec!["m3".to_string(), "m1".to_string()])
        );
        // An index past the filtered batch names nothing.
        assert_eq!(kept.row_keys(&[2]), None);
        // Keys of the wrong count are not kept: the ticket names none.
        let (queue, _rx) = Verdicts::new(Arc::new(AtomicBool::new(false)));
        let short = Ticket::new(vec!["a", "b"], 2, queue).with_row_keys(vec!["m1".into()]);
        assert_eq!(DeliveryHandle::row_keys(&short, &[0]), None);
    }

    #[test]
    fn an_index_past_the_filtered_batch_fails_the_input_batch() {
        let (queue, mut rx) = Verdicts::new(Arc::new(AtomicBool::new(false)));
        let ticket = Arc::new(Ticket::new(vec!["a", "b"], 2, queue));
        let kept = SubsetHandle::new(ticket.clone(), vec![1]);
        kept.retain(1).unwrap();
        ticket.seal();
        kept.settle_rows(&[0, 1], Delivery::Dropped);
        assert!(ticket.is_failed());
        assert!(acked(&mut rx).is_empty());
    }
}
