//! The handle of one emitted batch ([`Ticket`]), generic over the ids its input names what it
//! read by, and the queue its verdicts travel on to the input's settler ([`Verdicts`]).
//!
//! A ticket names the ids of everything its batch was made from (including what did not decode
//! and was dropped or dead-lettered under the failure policy). Its ids are acknowledged when,
//! and only when:
//!
//! 1. the ticket is **sealed**: the input seals batch *k* when its partition stream is polled
//!    for the next item (or ends). In a synchronous, non-buffering chain between the input and
//!    the consumer (projection, filter without coalescing, union), a poll of the input for
//!    batch *k+1* happens only after batch *k* went through the chain: every row of batch *k*
//!    has then reached the consumer or been filtered out; and
//! 2. every row a consumer **retained** from the batch ([`Ticket::retain`], which must happen
//!    before the consumer polls its input again) has been **settled** positively
//!    ([`Ticket::settle`] with [`Delivery::Delivered`], [`Delivery::DeadLettered`] or
//!    [`Delivery::Dropped`]).
//!
//! Anything else acknowledges nothing: a row retained and never settled, a row settled as
//! [`Delivery::Failed`] or marked by [`Ticket::fail`], a ticket whose last clone is dropped
//! before both conditions held. Such a ticket's ids are nacked (handed back: another reader
//! gets them) when its last clone is dropped, unless the input was aborted, in which case
//! nothing more is sent and the service redelivers them once their lease lapses. Positive
//! settlement is explicit: dropping a clone never acknowledges.
//!
//! With no consumer retaining (a plain `SELECT`), sealing alone acknowledges: rows handed to
//! the client count as delivered.
//!
//! A consumer finds the ticket of the batch it just received in the [`TicketSlot`] of the
//! partition that feeds it ([`TicketSlot::current`]).

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::mpsc;

use super::{Delivery, DeliveryHandle, DeliveryId};
use crate::error::{Error, Result};

/// A request to a partition's settler: acknowledge or nack these ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict<I> {
    /// Acknowledge them: every row made from them ended positively.
    Ack(Vec<I>),
    /// Hand them back (Pub/Sub: a deadline of 0): the service delivers them again.
    Nack(Vec<I>),
    /// A downstream node holds them until a window closes: the input's flow control stops
    /// counting them as in flight (their leases are still extended).
    Hold(Vec<I>),
}

/// Where tickets send their verdicts: the settler of one input partition, and whether the
/// input was aborted (then dropped tickets nack nothing).
#[derive(Debug)]
pub struct Verdicts<I> {
    // Unbounded: every verdict names ids that are outstanding, which the flow control of the
    // input bounds, so the queue cannot grow past that.
    tx: mpsc::UnboundedSender<Verdict<I>>,
    aborted: Arc<AtomicBool>,
}

impl<I> Clone for Verdicts<I> {
    fn clone(&self) -> Self {
        Verdicts {
            tx: self.tx.clone(),
            aborted: self.aborted.clone(),
        }
    }
}

impl<I: DeliveryId> Verdicts<I> {
    /// A queue and the receiver its settler reads.
    pub fn new(aborted: Arc<AtomicBool>) -> (Self, mpsc::UnboundedReceiver<Verdict<I>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Verdicts { tx, aborted }, rx)
    }

    /// Whether the input was aborted.
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    /// Asks for `ids` to be acknowledged.
    pub fn ack(&self, ids: Vec<I>) {
        if !ids.is_empty() {
            // A closed settler means the input is gone: nothing can be sent any more, and the
            // service redelivers the messages when their lease lapses.
            let _ = self.tx.send(Verdict::Ack(ids));
        }
    }

    /// Says `ids` are held by a node that waits for a window to close.
    pub fn hold(&self, ids: Vec<I>) {
        if !ids.is_empty() {
            let _ = self.tx.send(Verdict::Hold(ids));
        }
    }

    /// Asks for `ids` to be nacked, unless the input was aborted.
    pub fn nack(&self, ids: Vec<I>) {
        if !ids.is_empty() && !self.is_aborted() {
            let _ = self.tx.send(Verdict::Nack(ids));
        }
    }
}

/// The delivery handle of one emitted batch. Shared (`Arc`) between the input, its
/// [`TicketSlot`] and the consumers that retain rows of the batch.
#[derive(Debug)]
pub struct Ticket<I: DeliveryId> {
    /// The ids not yet acknowledged or nacked: the first `rows` name the rows' messages in
    /// row order (one message per row), the rest what did not become a row.
    ids: Mutex<Vec<Option<I>>>,
    messages: usize,
    rows: usize,
    retained: AtomicU64,
    settled: AtomicU64,
    sealed: AtomicBool,
    failed: AtomicBool,
    resolved: AtomicBool,
    held: AtomicBool,
    queue: Verdicts<I>,
    /// The stable name of each row's message ([`DeliveryHandle::row_keys`]), when the input
    /// gave them.
    row_keys: Mutex<Option<Vec<String>>>,
}

impl<I: DeliveryId> Ticket<I> {
    /// The ticket of a batch of `rows` rows made from the things `ids` names: the first
    /// `rows` ids name the rows' messages, in row order (row *i* was made from message *i*),
    /// the others what was read but became no row.
    pub fn new(ids: Vec<I>, rows: usize, queue: Verdicts<I>) -> Self {
        Ticket {
            messages: ids.len(),
            ids: Mutex::new(ids.into_iter().map(Some).collect()),
            rows,
            retained: AtomicU64::new(0),
            settled: AtomicU64::new(0),
            sealed: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            resolved: AtomicBool::new(false),
            held: AtomicBool::new(false),
            queue,
            row_keys: Mutex::new(None),
        }
    }

    /// The same ticket, naming row *i*'s message `keys[i]` in every delivery of it (for
    /// [`DeliveryHandle::row_keys`]); `keys` has one entry per row (otherwise they are not
    /// kept, and the ticket names no keys).
    pub fn with_row_keys(self, keys: Vec<String>) -> Self {
        if keys.len() == self.rows {
            *self.row_keys.lock().unwrap_or_else(|e| e.into_inner()) = Some(keys);
        }
        self
    }

    /// Messages the batch was made from.
    pub fn messages(&self) -> usize {
        self.messages
    }

    /// Rows of the batch.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Rows retained so far.
    pub fn retained(&self) -> u64 {
        self.retained.load(Ordering::SeqCst)
    }

    /// Rows settled positively so far.
    pub fn settled(&self) -> u64 {
        self.settled.load(Ordering::SeqCst)
    }

    /// Whether the input sealed the batch.
    pub fn is_sealed(&self) -> bool {
        self.sealed.load(Ordering::SeqCst)
    }

    /// Whether a row was marked failed (the batch is then never acknowledged).
    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// Whether the verdict was sent (an acknowledgement, or a nack when dropped unresolved).
    pub fn is_resolved(&self) -> bool {
        self.resolved.load(Ordering::SeqCst)
    }

    /// A consumer keeps `n` rows of the batch, each to be settled later. Must be called before
    /// the consumer polls its input again (before the input seals the batch); a retain after
    /// the seal is refused and marks the batch failed, since the rows may already have been
    /// counted as delivered.
    pub fn retain(&self, n: u64) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        if self.is_sealed() {
            self.fail();
            return Err(Error::Unsupported(format!(
                "a consumer retained {n} row(s) of a source batch after the source sealed it: \
                 rows must be retained before the input is polled again (the batch's {} \
                 message(s) will not be acknowledged)",
                self.messages
            )));
        }
        self.retained.fetch_add(n, Ordering::SeqCst);
        Ok(())
    }

    /// `n` retained rows ended as `how`. A positive outcome counts toward the acknowledgement;
    /// [`Delivery::Failed`] marks the batch failed. Settling more rows than were retained marks
    /// the batch failed too (the consumer's accounting is broken).
    pub fn settle(&self, n: u64, how: Delivery) {
        if !how.is_positive() {
            self.fail();
            return;
        }
        let settled = self.settled.fetch_add(n, Ordering::SeqCst) + n;
        if settled > self.retained() {
            tracing::error!(
                settled,
                retained = self.retained(),
                "a consumer settled more rows of a source batch than it retained; the batch is not acknowledged"
            );
            self.fail();
            return;
        }
        self.try_resolve();
    }

    /// The consumer holds the batch's rows until a window closes: the input stops counting
    /// its messages against its flow control (they stay leased). Sent at most once per ticket.
    pub fn hold(&self) {
        if !self.held.swap(true, Ordering::SeqCst) && !self.is_resolved() {
            let ids = self
                .ids
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .flatten()
                .cloned()
                .collect();
            self.queue.hold(ids);
        }
    }

    /// Marks the batch failed: what it was made from is never acknowledged.
    pub fn fail(&self) {
        self.failed.store(true, Ordering::SeqCst);
    }

    /// The input moved past the batch: every row of it reached its consumers or was filtered
    /// out.
    pub fn seal(&self) {
        self.sealed.store(true, Ordering::SeqCst);
        self.try_resolve();
    }

    fn take_ids(&self) -> Vec<I> {
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *ids).into_iter().flatten().collect()
    }

    /// Retained rows `rows` (indices into the batch) ended positively, and their messages may
    /// be acknowledged now rather than with the rest of the batch: a node that holds a
    /// batch's rows until different windows close releases each row's message as its window
    /// is recorded. Counts as [`settle`](Self::settle) of as many rows. Ignored for a row
    /// index out of range; must follow the seal.
    pub fn settle_rows(&self, rows: &[u32], how: Delivery) {
        if !how.is_positive() || !self.is_sealed() {
            self.settle(rows.len() as u64, how);
            return;
        }
        let released: Vec<I> = {
            let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
            rows.iter()
                .filter(|&&r| (r as usize) < self.rows)
                .filter_map(|&r| ids.get_mut(r as usize).and_then(Option::take))
                .collect()
        };
        if !self.is_failed() {
            self.queue.ack(released);
        }
        self.settle(rows.len() as u64, how);
    }

    fn try_resolve(&self) {
        if self.is_sealed()
            && !self.is_failed()
            && self.settled() == self.retained()
            && !self.resolved.swap(true, Ordering::SeqCst)
        {
            self.queue.ack(self.take_ids());
        }
    }
}

impl<I: DeliveryId> Drop for Ticket<I> {
    fn drop(&mut self) {
        if !self.resolved.swap(true, Ordering::SeqCst) {
            self.queue.nack(self.take_ids());
        }
    }
}

/// A writer retains and settles rows of a ticket through the core's handle.
impl<I: DeliveryId> DeliveryHandle for Ticket<I> {
    fn retain(&self, rows: u64) -> Result<()> {
        Ticket::retain(self, rows)
    }

    fn settle(&self, rows: u64, how: Delivery) {
        Ticket::settle(self, rows, how);
    }

    fn hold(&self) {
        Ticket::hold(self);
    }

    fn settle_rows(&self, rows: &[u32], how: Delivery) {
        Ticket::settle_rows(self, rows, how);
    }

    fn row_keys(&self, rows: &[u32]) -> Option<Vec<String>> {
        let keys = self.row_keys.lock().unwrap_or_else(|e| e.into_inner());
        let keys = keys.as_ref()?;
        rows.iter()
            .map(|&r| keys.get(r as usize).cloned())
            .collect()
    }

    fn forget_row_keys(&self) {
        *self.row_keys.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// The handoff slot of one input partition: the ticket of the batch it emitted last.
#[derive(Debug)]
pub struct TicketSlot<I: DeliveryId> {
    current: Mutex<Option<Arc<Ticket<I>>>>,
}

impl<I: DeliveryId> Default for TicketSlot<I> {
    fn default() -> Self {
        TicketSlot {
            current: Mutex::new(None),
        }
    }
}

impl<I: DeliveryId> TicketSlot<I> {
    /// The ticket of the batch the partition emitted last, if it still holds one.
    pub fn current(&self) -> Option<Arc<Ticket<I>>> {
        self.lock().clone()
    }

    /// Puts the ticket of the batch about to be emitted.
    pub fn put(&self, ticket: Arc<Ticket<I>>) {
        *self.lock() = Some(ticket);
    }

    /// Empties the slot (the partition ended).
    pub fn clear(&self) {
        self.lock().take();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Arc<Ticket<I>>>> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket(
        ids: &[&str],
    ) -> (
        Arc<Ticket<String>>,
        mpsc::UnboundedReceiver<Verdict<String>>,
        Arc<AtomicBool>,
    ) {
        let aborted = Arc::new(AtomicBool::new(false));
        let (queue, rx) = Verdicts::new(aborted.clone());
        let ids = ids.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let rows = ids.len();
        (Arc::new(Ticket::new(ids, rows, queue)), rx, aborted)
    }

    /// A ticket for `ids` of which the consumer retained `retained` rows, sealed.
    fn sealed(
        ids: &[&str],
        retained: u64,
    ) -> (
        Arc<Ticket<String>>,
        mpsc::UnboundedReceiver<Verdict<String>>,
    ) {
        let (t, rx, _) = ticket(ids);
        t.retain(retained).unwrap();
        t.seal();
        (t, rx)
    }

    #[test]
    fn rows_released_one_by_one_acknowledge_their_messages_at_once() {
        let (t, mut rx, _) = ticket(&["a", "b", "c"]);
        t.retain(3).unwrap();
        t.seal();
        t.settle_rows(&[1], Delivery::Dropped);
        assert_eq!(rx.try_recv().unwrap(), Verdict::Ack(ids(&["b"])));
        t.settle_rows(&[0, 2], Delivery::Dropped);
        assert_eq!(rx.try_recv().unwrap(), Verdict::Ack(ids(&["a", "c"])));
        assert!(t.is_resolved());
        assert!(rx.try_recv().is_err(), "nothing twice: {:?}", rx.try_recv());
        drop(t);
        assert!(rx.try_recv().is_err(), "a resolved ticket nacks nothing");
    }

    #[test]
    fn a_batch_dropped_with_rows_unreleased_nacks_only_those() {
        let (t, mut rx, _) = ticket(&["a", "b", "c"]);
        t.retain(3).unwrap();
        t.seal();
        t.settle_rows(&[0], Delivery::Dropped);
        assert_eq!(rx.try_recv().unwrap(), Verdict::Ack(ids(&["a"])));
        drop(t);
        assert_eq!(rx.try_recv().unwrap(), Verdict::Nack(ids(&["b", "c"])));
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_batch_nobody_retains_is_acknowledged_when_sealed() {
        let (t, mut rx, _) = ticket(&["a", "b"]);
        assert!(rx.try_recv().is_err(), "nothing before the seal");
        t.seal();
        assert_eq!(rx.try_recv().unwrap(), Verdict::Ack(ids(&["a", "b"])));
        drop(t);
        assert!(rx.try_recv().is_err(), "one verdict only");
    }

    #[test]
    fn a_filtered_out_batch_is_acknowledged_at_the_seal() {
        // The consumer saw no row (the filter removed them all) and so retained none.
        let (_t, mut rx) = sealed(&["a"], 0);
        assert_eq!(rx.try_recv().unwrap(), Verdict::Ack(ids(&["a"])));
    }

    #[test]
    fn retained_rows_are_acknowledged_once_all_are_settled() {
        let (t, mut rx) = sealed(&["a", "b", "c"], 3);
        t.settle(1, Delivery::Delivered);
        t.settle(1, Delivery::DeadLettered);
        assert!(rx.try_recv().is_err(), "one row still unsettled");
        t.settle(1, Delivery::Dropped);
        assert_eq!(rx.try_recv().unwrap(), Verdict::Ack(ids(&["a", "b", "c"])));
    }

    #[test]
    fn settling_before_the_seal_waits_for_the_seal() {
        let (t, mut rx, _) = ticket(&["a"]);
        t.retain(1).unwrap();
        t.settle(1, Delivery::Delivered);
        assert!(
            rx.try_recv().is_err(),
            "not sealed: another consumer may still get rows"
        );
        t.seal();
        assert_eq!(rx.try_recv().unwrap(), Verdict::Ack(ids(&["a"])));
    }

    #[test]
    fn an_unsettled_row_means_no_ack_and_a_nack_when_dropped() {
        let (t, mut rx) = sealed(&["a", "b"], 2);
        t.settle(1, Delivery::Delivered);
        let clone = t.clone();
        drop(t);
        assert!(
            rx.try_recv().is_err(),
            "a clone is still alive; dropping one never acks"
        );
        drop(clone);
        assert_eq!(rx.try_recv().unwrap(), Verdict::Nack(ids(&["a", "b"])));
    }

    #[test]
    fn a_failed_row_means_no_ack() {
        let (t, mut rx, _) = ticket(&["a", "b"]);
        t.retain(2).unwrap();
        t.settle(1, Delivery::Failed);
        t.seal();
        t.settle(1, Delivery::Delivered);
        assert!(rx.try_recv().is_err());
        assert!(t.is_failed());
        drop(t);
        assert_eq!(rx.try_recv().unwrap(), Verdict::Nack(ids(&["a", "b"])));
    }

    #[test]
    fn fail_marks_the_batch_even_when_the_rest_settles() {
        let (t, mut rx, _) = ticket(&["a"]);
        t.retain(1).unwrap();
        t.fail();
        t.seal();
        t.settle(1, Delivery::Delivered);
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn a_ticket_dropped_before_its_seal_is_nacked_not_acked() {
        let (t, mut rx, _) = ticket(&["a"]);
        drop(t);
        assert_eq!(rx.try_recv().unwrap(), Verdict::Nack(ids(&["a"])));
    }

    #[test]
    fn after_an_abort_a_dropped_ticket_sends_nothing() {
        let (t, mut rx, aborted) = ticket(&["a"]);
        aborted.store(true, Ordering::SeqCst);
        drop(t);
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn a_retain_after_the_seal_is_refused_and_fails_the_batch() {
        let (t, mut rx) = sealed(&["a"], 1);
        let err = t.retain(1).unwrap_err().to_string();
        assert!(err.contains("after the source sealed it"), "{err}");
        t.settle(1, Delivery::Delivered);
        assert!(rx.try_recv().is_err(), "a failed batch is not acknowledged");
    }

    #[test]
    fn settling_more_than_retained_fails_the_batch() {
        let (t, mut rx) = sealed(&["a"], 1);
        t.settle(2, Delivery::Delivered);
        assert!(rx.try_recv().is_err());
        assert!(t.is_failed());
    }

    #[test]
    fn the_slot_hands_out_the_last_ticket() {
        let slot = TicketSlot::<String>::default();
        assert!(slot.current().is_none());
        let (t, _rx, _) = ticket(&["a"]);
        slot.put(t.clone());
        assert!(Arc::ptr_eq(&slot.current().unwrap(), &t));
        slot.clear();
        assert!(slot.current().is_none());
    }
}
