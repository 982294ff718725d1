//! One delivery model for every input that must hear how its rows ended: how a row, a message
//! or a batch ended ([`Delivery`]), what an input did ([`DeliveryCounts`]), and the handle a
//! batch carries from where it was read to the writer that delivers its rows
//! ([`DeliveryHandle`], found through a [`DeliveryInput`]).
//!
//! The statement, its writers and the plan nodes between an input and the writers speak only
//! this vocabulary; the generic pieces an input is built from live here too:
//!
//! - [`ticket`]: the handle of one emitted batch ([`ticket::Ticket`]): sealed by the input,
//!   retained and settled by the writers, and resolved into "acknowledge these ids" or "hand
//!   these ids back" for the input's settler. Generic over the input's ids.
//! - [`lease`]: the ids an input partition holds, for flow control and lease extension
//!   ([`lease::Outstanding`]), pure state tested with a paused clock.
//! - [`settler`]: the loop that gathers a partition's verdicts, sends them in calls of a bounded
//!   size, extends the leases of what is held and lets overdue ones lapse, through a small port
//!   the input implements ([`settler::Acknowledger`]); every call is retried through
//!   [`crate::core::retry`].
//! - [`subset`]: the handle of a batch that keeps some rows of its input's batch (a filter's
//!   output), which maps row indices back to the input's rows.
//!
//! One stop vocabulary serves the statement and its inputs alike: [`crate::core::StopKind`].
//!
//! # The writer's contract
//!
//! - Right after a batch arrives from its input, and before it asks its input for the next
//!   one, the writer takes the batch's handle from the [`DeliveryInput`] of its input, and
//!   [`DeliveryHandle::retain`]s one count for each row it accepted (encoded, or refused by the
//!   encoder under a policy that keeps the row's fate: drop, dead letter).
//! - Each such row is later [`DeliveryHandle::settle`]d exactly once, and only positively: when
//!   the destination acknowledged it ([`Delivery::Delivered`]), when its dead letter was written
//!   ([`Delivery::DeadLettered`]), or when the failure policy dropped it ([`Delivery::Dropped`]).
//!   A row that is not delivered (a failed statement, a stop, an abort) is never settled, and
//!   its batch then acknowledges nothing.
//!
//! # Passing handles through a plan node
//!
//! There is one way for a plan node to sit between an input that carries delivery handles and
//! the writers: **hand every input batch on (or drop all of its rows) before polling the input
//! for the next one, and keep the input's partitions**. The input seals batch *k* when it is
//! polled for batch *k+1*; by then every row of batch *k* has reached the writer (which retained
//! it) or was filtered out (which counts as handled). A filter does this today
//! (`BatchFilterExec` in `sql/lineage.rs`, where DataFusion's own filter would gather several
//! batches into one); projections and unions do it by nature.
//!
//! A node that must hold rows across batches (an aggregate, a window, a lookup join waiting for
//! its lookups) follows the same rule by taking the handles with it: it keeps the
//! `Arc<dyn DeliveryHandle>` of every batch it holds rows of, retains those rows on the handle
//! before it polls its input again (as a writer does), and settles them as
//! [`Delivery::Dropped`] once the row they fed is emitted and itself retained downstream, or
//! as [`Delivery::Failed`] when it gives up. The handle of its own output batch is then a new
//! handle that settles the held ones when it is settled. ADR 0064 records this rule.

pub mod lease;
pub mod settler;
pub mod subset;
pub mod ticket;

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::future::BoxFuture;

use crate::error::Result;

/// How a row, a message or a batch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// The destination has it.
    Delivered,
    /// It went to the dead-letter destination, which stored it.
    DeadLettered,
    /// The failure policy dropped it (`failure_policy = 'drop'`), or the query filtered it out.
    Dropped,
    /// It was not delivered: its batch is never acknowledged and its ids are handed back.
    Failed,
}

impl Delivery {
    /// Whether the outcome lets the batch be acknowledged (everything but
    /// [`Delivery::Failed`]).
    pub fn is_positive(self) -> bool {
        !matches!(self, Delivery::Failed)
    }
}

/// The ids an input names the things it read by (Pub/Sub: ack ids).
pub trait DeliveryId: Clone + Eq + Hash + Debug + Send + Sync + 'static {}

impl<T: Clone + Eq + Hash + Debug + Send + Sync + 'static> DeliveryId for T {}

/// The delivery handle of a batch of rows (for a subscription: the messages the batch was made
/// from). See the module docs for the contract.
pub trait DeliveryHandle: Debug + Send + Sync {
    /// `rows` more rows of this batch were accepted by a writer, each to be settled once.
    /// An error (the batch was already sealed, for instance) fails the writer: the plan
    /// between the input and the writer does not keep the contract.
    fn retain(&self, rows: u64) -> Result<()>;

    /// `rows` retained rows ended as `how`.
    fn settle(&self, rows: u64, how: Delivery);

    /// Retained rows `rows` (indices into the batch) ended as `how`: as
    /// [`settle`](Self::settle) of as many rows, and an input that knows which message each
    /// row came from may acknowledge those messages now instead of with the whole batch.
    fn settle_rows(&self, rows: &[u32], how: Delivery) {
        self.settle(rows.len() as u64, how);
    }

    /// The consumer will hold this batch's retained rows until a window closes (minutes, not
    /// the moment a send takes): the input may stop counting what the batch was made from
    /// against its flow control, while it keeps their leases. Nothing by default.
    fn hold(&self) {}

    /// A stable name of the message each of `rows` (indices into the batch) was made from,
    /// the same in every delivery of it (for a subscription: the message id), for a consumer
    /// that must recognise a message it saw in an earlier run. `None` when the input has none.
    fn row_keys(&self, rows: &[u32]) -> Option<Vec<String>> {
        let _ = rows;
        None
    }

    /// The consumer will not ask for [`row_keys`](Self::row_keys) again: a handle it holds
    /// for minutes may free them. Nothing by default.
    fn forget_row_keys(&self) {}
}

/// How a plan node finds the [`DeliveryInput`] of output partition `partition` of its input
/// plan. The SQL layer's lineage answers it (it knows every node that passes handles on); a
/// connector's node that keeps a subset of its input's rows (a lookup join) is given it when
/// it is planned, so it reaches the lineage without naming the SQL layer.
pub type UpstreamOf =
    fn(&Arc<dyn datafusion::physical_plan::ExecutionPlan>, usize) -> Option<Arc<dyn DeliveryInput>>;

/// Where a writer finds the handle of the batch its input produced last, and how it talks to
/// the input behind it.
pub trait DeliveryInput: Debug + Send + Sync {
    /// The handle of the last batch the input produced, if it has one.
    fn current(&self) -> Option<Arc<dyn DeliveryHandle>>;

    /// The statement was asked to stop gracefully: the input stops reading, emits what it
    /// already read, and then ends. The writer keeps reading until then.
    fn stop_reading(&self);

    /// What the input did so far (its whole scan, every partition).
    fn counts(&self) -> DeliveryCounts;

    /// Resolves once every acknowledgement and nack the input decided was sent. Await it
    /// after the input stream was dropped.
    fn settled(&self) -> BoxFuture<'static, ()>;

    /// The input, for messages (`subscription projects/p/subscriptions/s`).
    fn describe(&self) -> String;

    /// Called before the input is first polled by a consumer that holds batches
    /// ([`DeliveryHandle::hold`]) of up to `messages` messages in all: an input whose service
    /// bounds what it sends (Pub/Sub's server-side flow control) raises that bound by as many.
    /// Nothing by default.
    fn expect_held(&self, messages: u64) {
        let _ = messages;
    }

    /// Called by a consumer that will not emit anything before `until` (a windowed node
    /// waiting for a killed run's messages to come back): an input that stops by itself when
    /// idle (`stop_after_idle`) counts its idle time from then at the earliest, since stopping
    /// earlier would hand back what the consumer holds without anything emitted. Nothing by
    /// default.
    fn read_until(&self, until: std::time::Instant) {
        let _ = until;
    }

    /// How far this partition has read in event time, for watermarks: an input that knows
    /// its rows' event time observes every row it emits (before any filter drops one).
    /// `None` when it does not.
    fn clock(&self) -> Option<Arc<EventClock>> {
        None
    }

    /// The writer made a flush point: an input that holds things of its own until something
    /// is completed (a source whose dead letters go to an object) completes it, so that what
    /// it holds is acknowledged within a flush interval. Called from the writer's task: it
    /// only signals the input, which acts when next polled or while it waits for input.
    fn flush_point(&self) {}

    /// What the input is, for the labels of its metrics ([`crate::core::telemetry`]). By
    /// default: no connector or table, and [`DeliveryInput::describe`] as the resource.
    fn identity(&self) -> InputIdentity {
        InputIdentity {
            connector: "",
            table: String::new(),
            resource: self.describe(),
        }
    }

    /// What the input holds now (every partition): read, not yet acknowledged or handed back.
    /// By default nothing.
    fn held(&self) -> Held {
        Held::default()
    }
}

/// How far one input partition has read in event time: the greatest event time of the rows it
/// emitted, and when it last emitted anything (for idleness). A watermark is made from these
/// where the rows are read, as Flink makes it at the source, so a filter between the input
/// and a window cannot hold it back.
///
/// A consumer that records its watermark durably (a window's progress marker) may
/// [`gate`](Self::gate) the clock: from then on, a batch that raises the clock past the
/// recorded watermark keeps its messages unacknowledged until a watermark at least its
/// greatest event time was recorded ([`recorded`](Self::recorded)). Otherwise a batch whose rows
/// a filter dropped would be acknowledged at once, and a kill before the marker caught up
/// would lose the event time that let windows close (the next run could not close them).
#[derive(Debug)]
pub struct EventClock {
    max: std::sync::atomic::AtomicI64,
    last: std::sync::Mutex<Option<tokio::time::Instant>>,
    gate: std::sync::Mutex<Option<Gate>>,
}

/// The batches a gated clock keeps, oldest first, with the recorded watermark.
#[derive(Debug, Default)]
struct Gate {
    recorded: Option<i64>,
    waiting: std::collections::VecDeque<(i64, Arc<dyn DeliveryHandle>)>,
}

impl Default for EventClock {
    fn default() -> Self {
        EventClock {
            max: std::sync::atomic::AtomicI64::new(i64::MIN),
            last: std::sync::Mutex::new(None),
            gate: std::sync::Mutex::new(None),
        }
    }
}

impl EventClock {
    /// The partition emitted rows, the greatest event time among them `max` (`None` when
    /// none had one).
    pub fn observe(&self, max: Option<i64>) {
        if let Some(m) = max {
            self.max.fetch_max(m, Ordering::SeqCst);
        }
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(tokio::time::Instant::now());
    }

    /// The greatest event time emitted so far.
    pub fn max(&self) -> Option<i64> {
        let m = self.max.load(Ordering::SeqCst);
        (m != i64::MIN).then_some(m)
    }

    /// When the partition last emitted rows.
    pub fn last(&self) -> Option<tokio::time::Instant> {
        *self.last.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The partition emits a batch whose handle is `handle` and whose greatest event time is
    /// `max`: observed as [`observe`](Self::observe) does; on a gated clock, a batch that
    /// raises the clock past the recorded watermark is held (one count retained on its
    /// handle, its messages out of flow control) until [`recorded`](Self::recorded) passes it.
    /// Call before the batch is emitted (before the handle can be sealed).
    pub fn observe_batch(&self, max: Option<i64>, handle: &Arc<dyn DeliveryHandle>) -> Result<()> {
        self.observe(max);
        let Some(max) = max else {
            return Ok(());
        };
        let mut gate = self.gate_lock();
        let Some(gate) = gate.as_mut() else {
            return Ok(());
        };
        if gate.recorded.is_some_and(|r| max <= r) {
            return Ok(());
        }
        handle.retain(1)?;
        handle.hold();
        gate.waiting.push_back((max, handle.clone()));
        Ok(())
    }

    /// A consumer records watermarks durably, the last one `recorded`: gate the clock (see
    /// the type's docs).
    pub fn gate(&self, recorded: Option<i64>) {
        let mut gate = self.gate_lock();
        let g = gate.get_or_insert_with(Gate::default);
        g.recorded = g.recorded.max(recorded);
    }

    /// A watermark of `watermark` was recorded durably: the batches it covers are released
    /// (the count they retained settled, so they may be acknowledged).
    pub fn recorded(&self, watermark: i64) {
        let released: Vec<Arc<dyn DeliveryHandle>> = {
            let mut gate = self.gate_lock();
            let Some(g) = gate.as_mut() else {
                return;
            };
            g.recorded = Some(g.recorded.map_or(watermark, |r| r.max(watermark)));
            let (out, keep): (Vec<_>, Vec<_>) =
                g.waiting.drain(..).partition(|(max, _)| *max <= watermark);
            g.waiting = keep.into();
            out.into_iter().map(|(_, h)| h).collect()
        };
        for handle in released {
            handle.settle(1, Delivery::Dropped);
        }
    }

    /// The least greatest event time of a batch the gate holds: a watermark at least this,
    /// once recorded, releases something.
    pub fn gated_until(&self) -> Option<i64> {
        let gate = self.gate_lock();
        gate.as_ref()?.waiting.iter().map(|(max, _)| *max).min()
    }

    /// The consumer no longer records watermarks: the gate lets go of what it holds
    /// unsettled (those batches are handed back, not acknowledged) and holds nothing more.
    pub fn ungate(&self) {
        let gate = self.gate_lock().take();
        drop(gate);
    }

    fn gate_lock(&self) -> std::sync::MutexGuard<'_, Option<Gate>> {
        self.gate.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What an input reads from, for the labels of its metrics: bounded values of its
/// declaration, never a value read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputIdentity {
    /// The connector's name (`pubsub`).
    pub connector: &'static str,
    /// The table the input was declared as (empty when it was built without SQL).
    pub table: String,
    /// What it reads (`projects/p/subscriptions/s`).
    pub resource: String,
}

/// What an input holds at one moment: read, and neither acknowledged nor handed back yet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    /// Messages held.
    pub messages: u64,
    /// Their data bytes.
    pub bytes: u64,
    /// The age of the oldest one: from its publication when the service says when that was,
    /// else from when it was read. `None` when nothing is held.
    pub oldest: Option<std::time::Duration>,
    /// Streams the input runs now (one per partition that reads).
    pub streams: u64,
    /// Those of them connected to the service now.
    pub streams_connected: u64,
}

/// What an input that carries delivery handles did: a snapshot of its [`DeliveryCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeliveryCounts {
    /// Messages (or records) read.
    pub messages_read: u64,
    /// Rows emitted (one per message that decoded).
    pub rows_emitted: u64,
    /// Messages acknowledged: every row made from them was delivered, dead-lettered, dropped
    /// by the failure policy or filtered out, and the acknowledgement was taken.
    pub messages_acked: u64,
    /// Messages handed back for another reader (not delivered here).
    pub messages_nacked: u64,
    /// Messages that did not decode and were dropped (`failure_policy = 'drop'`).
    pub messages_dropped: u64,
    /// Messages that did not decode and were dead-lettered.
    pub messages_dead_lettered: u64,
    /// Messages held past the longest lease (left to be delivered again).
    pub leases_expired: u64,
    /// Streams opened again after a transient failure.
    pub reconnects: u64,
    /// Messages held now by a node that waits for a window to close (a gauge).
    pub messages_held: u64,
    /// How long ago the oldest message the input holds unacknowledged (read, not yet
    /// acknowledged or nacked, its lease not lapsed) was received: the input's backlog age.
    /// `None` when it holds none (or does not say).
    pub oldest_unacked: Option<std::time::Duration>,
    /// Leases extended (one per message per extension).
    pub lease_extensions: u64,
    /// Of [`messages_acked`](Self::messages_acked), those whose acknowledgement the service
    /// confirmed id by id (Pub/Sub's exactly-once delivery). Zero for an input whose service
    /// does not confirm: its acknowledgements are taken, not confirmed.
    pub messages_ack_confirmed: u64,
    /// Acknowledgements (or receipts, on arrival) the service refused for good, id by id (an ack
    /// id no longer valid: its lease had lapsed and the message is delivered again). Not in
    /// `messages_acked`.
    pub messages_ack_refused: u64,
}

/// The live counters of one input (all partitions); [`DeliveryCounters::snapshot`] reads them.
#[derive(Debug, Default)]
pub struct DeliveryCounters {
    /// See [`DeliveryCounts::messages_read`].
    pub read: AtomicU64,
    /// See [`DeliveryCounts::rows_emitted`].
    pub emitted: AtomicU64,
    /// See [`DeliveryCounts::messages_acked`].
    pub acked: AtomicU64,
    /// See [`DeliveryCounts::messages_nacked`].
    pub nacked: AtomicU64,
    /// See [`DeliveryCounts::messages_dropped`].
    pub dropped: AtomicU64,
    /// See [`DeliveryCounts::messages_dead_lettered`].
    pub dead_lettered: AtomicU64,
    /// See [`DeliveryCounts::leases_expired`].
    pub lease_expired: AtomicU64,
    /// See [`DeliveryCounts::reconnects`].
    pub reconnects: AtomicU64,
    /// See [`DeliveryCounts::messages_held`].
    pub held: AtomicU64,
    /// See [`DeliveryCounts::lease_extensions`].
    pub lease_extensions: AtomicU64,
    /// See [`DeliveryCounts::messages_ack_confirmed`].
    pub ack_confirmed: AtomicU64,
    /// See [`DeliveryCounts::messages_ack_refused`].
    pub ack_refused: AtomicU64,
    /// Streams running now (see [`Held::streams`]); raised and lowered through
    /// [`DeliveryCounters::stream_running`].
    pub streams: AtomicU64,
    /// Streams connected now (see [`Held::streams_connected`]); raised and lowered through
    /// [`DeliveryCounters::stream_connected`].
    pub streams_connected: AtomicU64,
}

impl DeliveryCounters {
    /// Adds `n` to `counter` (one of this struct's fields).
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// A snapshot.
    pub fn snapshot(&self) -> DeliveryCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        DeliveryCounts {
            messages_read: get(&self.read),
            rows_emitted: get(&self.emitted),
            messages_acked: get(&self.acked),
            messages_nacked: get(&self.nacked),
            messages_dropped: get(&self.dropped),
            messages_dead_lettered: get(&self.dead_lettered),
            leases_expired: get(&self.lease_expired),
            reconnects: get(&self.reconnects),
            messages_held: get(&self.held),
            oldest_unacked: None,
            lease_extensions: get(&self.lease_extensions),
            messages_ack_confirmed: get(&self.ack_confirmed),
            messages_ack_refused: get(&self.ack_refused),
        }
    }

    /// Counts a stream as running (read by the input, connected or not) until the returned
    /// guard is dropped.
    pub fn stream_running(self: &Arc<Self>) -> StreamGuard {
        self.streams.fetch_add(1, Ordering::AcqRel);
        StreamGuard {
            counters: self.clone(),
            connected: false,
        }
    }

    /// Counts a stream as connected to its service until the returned guard is dropped.
    pub fn stream_connected(self: &Arc<Self>) -> StreamGuard {
        self.streams_connected.fetch_add(1, Ordering::AcqRel);
        StreamGuard {
            counters: self.clone(),
            connected: true,
        }
    }
}

/// A stream counted as running or connected ([`DeliveryCounters::stream_running`],
/// [`DeliveryCounters::stream_connected`]) while it lives.
#[derive(Debug)]
pub struct StreamGuard {
    counters: Arc<DeliveryCounters>,
    connected: bool,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let counter = if self.connected {
            &self.counters.streams_connected
        } else {
            &self.counters.streams
        };
        counter.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The age of the oldest id any of `partitions` holds ([`lease::Outstanding::oldest`]), for
/// [`DeliveryCounts::oldest_unacked`].
pub fn oldest_unacked<'a, I: DeliveryId>(
    partitions: impl IntoIterator<Item = &'a lease::Outstanding<I>>,
) -> Option<std::time::Duration> {
    partitions
        .into_iter()
        .filter_map(lease::Outstanding::oldest)
        .min()
        .map(|oldest| oldest.elapsed())
}

/// Settles every row of `handles` that has a handle, one call per run of rows sharing one.
pub(crate) fn settle_all<'a>(
    handles: impl IntoIterator<Item = Option<&'a Arc<dyn DeliveryHandle>>>,
    how: Delivery,
) {
    let mut run: Option<(&Arc<dyn DeliveryHandle>, u64)> = None;
    for handle in handles.into_iter().flatten() {
        match &mut run {
            Some((current, n)) if Arc::ptr_eq(current, handle) => *n += 1,
            _ => {
                if let Some((current, n)) = run.take() {
                    current.settle(n, how);
                }
                run = Some((handle, 1));
            }
        }
    }
    if let Some((current, n)) = run {
        current.settle(n, how);
    }
}

/// After a writer's input stream was dropped: waits until the input behind it (if it carries
/// delivery handles) sent every acknowledgement and nack it decided, and logs its counts.
pub async fn wait_settled(input: Option<&Arc<dyn DeliveryInput>>, writer: usize, writers: usize) {
    let Some(input) = input else {
        return;
    };
    input.settled().await;
    let counts = input.counts();
    tracing::info!(
        writer = writer + 1,
        writers,
        input = %input.describe(),
        messages_read = counts.messages_read,
        messages_acknowledged = counts.messages_acked,
        messages_nacked = counts.messages_nacked,
        "the writer's input settled"
    );
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A handle that records what it was told.
    #[derive(Debug, Default)]
    pub(crate) struct Recorder {
        pub(crate) retained: Mutex<u64>,
        pub(crate) settled: Mutex<Vec<(u64, Delivery)>>,
    }

    impl Recorder {
        /// Rows settled as `how`.
        pub(crate) fn count(&self, how: Delivery) -> u64 {
            let settled = self.settled.lock().unwrap();
            settled
                .iter()
                .filter(|(_, h)| *h == how)
                .map(|(n, _)| n)
                .sum()
        }
    }

    impl DeliveryHandle for Recorder {
        fn retain(&self, rows: u64) -> Result<()> {
            *self.retained.lock().unwrap() += rows;
            Ok(())
        }

        fn settle(&self, rows: u64, how: Delivery) {
            self.settled.lock().unwrap().push((rows, how));
        }
    }

    #[test]
    fn runs_of_one_handle_are_settled_in_one_call() {
        let a: Arc<dyn DeliveryHandle> = Arc::new(Recorder::default());
        let b: Arc<dyn DeliveryHandle> = Arc::new(Recorder::default());
        let rows = [Some(&a), Some(&a), None, Some(&b), Some(&a)];
        settle_all(rows, Delivery::Delivered);
        let calls = |o: &Arc<dyn DeliveryHandle>| format!("{o:?}");
        assert!(
            calls(&a).contains("(2, Delivered), (1, Delivered)"),
            "{}",
            calls(&a)
        );
        assert!(calls(&b).contains("(1, Delivered)"), "{}", calls(&b));
    }

    #[test]
    fn only_failed_is_negative() {
        for d in [
            Delivery::Delivered,
            Delivery::DeadLettered,
            Delivery::Dropped,
        ] {
            assert!(d.is_positive(), "{d:?}");
        }
        assert!(!Delivery::Failed.is_positive());
    }

    #[tokio::test(start_paused = true)]
    async fn the_backlog_age_is_that_of_the_oldest_id_of_any_partition() {
        let (a, b) = (
            lease::Outstanding::<u32>::new(10, 100),
            lease::Outstanding::<u32>::new(10, 100),
        );
        assert_eq!(oldest_unacked([&a, &b]), None);
        b.add(1, 1);
        tokio::time::advance(std::time::Duration::from_secs(3)).await;
        a.add(2, 1);
        tokio::time::advance(std::time::Duration::from_secs(4)).await;
        assert_eq!(
            oldest_unacked([&a, &b]),
            Some(std::time::Duration::from_secs(7))
        );
        b.remove(&[1]);
        assert_eq!(
            oldest_unacked([&a, &b]),
            Some(std::time::Duration::from_secs(4))
        );
    }

    fn verdicts(
        rx: &mut tokio::sync::mpsc::UnboundedReceiver<ticket::Verdict<&'static str>>,
    ) -> Vec<ticket::Verdict<&'static str>> {
        std::iter::from_fn(|| rx.try_recv().ok()).collect()
    }

    #[test]
    fn a_gated_clock_keeps_a_batch_until_a_watermark_past_it_was_recorded() {
        use ticket::{Ticket, Verdict, Verdicts};
        let (queue, mut rx) = Verdicts::new(Arc::new(std::sync::atomic::AtomicBool::new(false)));
        let clock = EventClock::default();
        clock.gate(Some(5));
        // At or below the recorded watermark: not held.
        let old: Arc<dyn DeliveryHandle> = Arc::new(Ticket::new(vec!["old"], 1, queue.clone()));
        clock.observe_batch(Some(5), &old).unwrap();
        // Past it: held (out of flow control) until the marker records 10.
        let ticket = Arc::new(Ticket::new(vec!["new"], 1, queue.clone()));
        let new: Arc<dyn DeliveryHandle> = ticket.clone();
        clock.observe_batch(Some(10), &new).unwrap();
        assert_eq!(clock.gated_until(), Some(10));
        ticket.seal();
        assert_eq!(verdicts(&mut rx), vec![Verdict::Hold(vec!["new"])]);
        clock.recorded(9);
        assert!(verdicts(&mut rx).is_empty());
        clock.recorded(10);
        assert_eq!(verdicts(&mut rx), vec![Verdict::Ack(vec!["new"])]);
        assert_eq!(clock.gated_until(), None);
        assert_eq!(clock.max(), Some(10));
    }

    #[test]
    fn an_ungated_clock_lets_go_and_the_batch_is_handed_back() {
        use ticket::{Ticket, Verdict, Verdicts};
        let (queue, mut rx) = Verdicts::new(Arc::new(std::sync::atomic::AtomicBool::new(false)));
        let clock = EventClock::default();
        let ticket = Arc::new(Ticket::new(vec!["a"], 1, queue.clone()));
        let handle: Arc<dyn DeliveryHandle> = ticket.clone();
        // Not gated: nothing retained; the seal acknowledges.
        clock.observe_batch(Some(1), &handle).unwrap();
        ticket.seal();
        assert_eq!(verdicts(&mut rx), vec![Verdict::Ack(vec!["a"])]);

        clock.gate(None);
        let ticket = Arc::new(Ticket::new(vec!["b"], 1, queue));
        let handle: Arc<dyn DeliveryHandle> = ticket.clone();
        clock.observe_batch(Some(2), &handle).unwrap();
        ticket.seal();
        clock.ungate();
        drop(handle);
        drop(ticket);
        assert_eq!(
            verdicts(&mut rx),
            vec![Verdict::Hold(vec!["b"]), Verdict::Nack(vec!["b"])]
        );
    }

    #[test]
    fn a_snapshot_reads_every_counter() {
        let c = DeliveryCounters::default();
        DeliveryCounters::add(&c.read, 3);
        DeliveryCounters::add(&c.acked, 2);
        DeliveryCounters::add(&c.reconnects, 1);
        let s = c.snapshot();
        assert_eq!((s.messages_read, s.messages_acked, s.reconnects), (3, 2, 1));
    }
}
