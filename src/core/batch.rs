//! Per-destination batching: thresholds and sequence keys.
//!
//! [`DestBatches`] is the pure state of one destination's open batches; the writer drives it
//! and owns the timers. A batch goes out on whichever threshold arrives first: `max_records`,
//! `max_bytes` (a record that would push an open batch past it closes that batch first), or
//! `max_delay` after its first record (the writer arms a timer task per opened batch, so the
//! batch goes out even while nothing calls the writer; a stale timer finds a newer generation
//! and does nothing).
//!
//! Records without a sequence key share one open batch. Records with a key queue per key, in
//! admission order, and at most one batch of a key is in flight: the next batch of that key
//! leaves only when the previous one is fully resolved (acknowledged, or repaired by retries,
//! recovery or isolation), and then leaves at once, since its records have already waited.
//!
//! Unkeyed records may carry a serial key ([`Envelope::serial_key`]): at most one record of a
//! serial key is in the open batch or in flight at a time. A later record of that key waits,
//! in admission order, until the earlier one is resolved ([`DestBatches::serial_done`]), then
//! joins the open batch, which then leaves at once (ADR 0031).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::admission::Permit;
use super::{BatchThresholds, Envelope};

/// The most records a new unkeyed batch reserves room for up front.
const MAX_RESERVED_ITEMS: usize = 1024;

/// One admitted record on its way: the envelope and its gate permit.
#[derive(Debug)]
pub(crate) struct Item<R> {
    /// The record.
    pub(crate) envelope: Envelope<R>,
    /// Its share of the admission gate; dropping it resolves the record.
    pub(crate) permit: Permit,
    /// Whether it was already counted in `records_sent`.
    pub(crate) counted: bool,
}

impl<R> Item<R> {
    /// A record not yet sent.
    pub(crate) fn new(envelope: Envelope<R>, permit: Permit) -> Self {
        Item {
            envelope,
            permit,
            counted: false,
        }
    }
}

/// A batch ready to send.
#[derive(Debug)]
pub(crate) struct Batch<R> {
    /// Its records, in admission order.
    pub(crate) items: Vec<Item<R>>,
    /// The sequence key all of them share, if any.
    pub(crate) key: Option<Arc<str>>,
    /// The serial keys of its records (each at most once), to hand back to
    /// [`DestBatches::serial_done`] when the batch is resolved.
    pub(crate) serial: Vec<Arc<[u8]>>,
}

/// Which open batch a timer belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TimerTag {
    /// The sequence key (`None`: the unkeyed batch).
    pub(crate) key: Option<Arc<str>>,
    /// The generation of the open batch when the timer was armed.
    pub(crate) generation: u64,
}

#[derive(Debug)]
struct Open<R> {
    items: Vec<Item<R>>,
    bytes: u64,
    generation: u64,
}

#[derive(Debug)]
struct KeyQueue<R> {
    pending: VecDeque<Item<R>>,
    /// Sum of `pending`'s bytes, kept as records come and go (summing the queue at every push
    /// cost time proportional to its length per record).
    pending_bytes: u64,
    generation: u64,
    in_flight: bool,
}

/// What a push produced.
#[derive(Debug)]
pub(crate) struct Pushed<R> {
    /// Batches that reached a threshold and must be sent now.
    pub(crate) ready: Vec<Batch<R>>,
    /// A timer to arm for a batch this push opened.
    pub(crate) timer: Option<TimerTag>,
}

/// The open batches of one destination.
#[derive(Debug)]
pub(crate) struct DestBatches<R> {
    thresholds: BatchThresholds,
    free: Open<R>,
    keys: HashMap<Arc<str>, KeyQueue<R>>,
    /// Serial keys with a record in the open batch or in flight, each with the later records
    /// of that key waiting for it, in admission order.
    serial: HashMap<Arc<[u8]>, VecDeque<Item<R>>>,
    next_generation: u64,
}

impl<R> DestBatches<R> {
    /// Empty batches under `thresholds`.
    pub(crate) fn new(thresholds: BatchThresholds) -> Self {
        let thresholds = BatchThresholds {
            max_records: thresholds.max_records.max(1),
            ..thresholds
        };
        DestBatches {
            thresholds,
            free: Open {
                items: Vec::new(),
                bytes: 0,
                generation: 0,
            },
            keys: HashMap::new(),
            serial: HashMap::new(),
            next_generation: 1,
        }
    }

    fn generation(&mut self) -> u64 {
        self.next_generation += 1;
        self.next_generation
    }

    /// Whether nothing is open, queued or in flight under a key.
    pub(crate) fn is_empty(&self) -> bool {
        self.free.items.is_empty() && self.keys.is_empty() && self.serial.is_empty()
    }

    /// Adds a record. Returns the batches that must go now and the timer to arm, if any.
    pub(crate) fn push(&mut self, item: Item<R>) -> Pushed<R> {
        let mut ready = Vec::new();
        let t = self.thresholds;
        match item.envelope.sequence_key.clone() {
            None => {
                if let Some(key) = &item.envelope.serial_key {
                    if let Some(waiting) = self.serial.get_mut(key) {
                        // An earlier record of the key is open or in flight: wait for it.
                        waiting.push_back(item);
                        return Pushed { ready, timer: None };
                    }
                    self.serial.insert(key.clone(), VecDeque::new());
                }
                let timer = self.push_free(item, &mut ready);
                Pushed { ready, timer }
            }
            Some(key) => {
                let generation = self.next_generation + 1;
                let q = self.keys.entry(key.clone()).or_insert_with(|| KeyQueue {
                    pending: VecDeque::new(),
                    pending_bytes: 0,
                    generation: 0,
                    in_flight: false,
                });
                let opened = q.pending.is_empty();
                q.pending_bytes = q.pending_bytes.saturating_add(item.envelope.bytes);
                q.pending.push_back(item);
                if q.in_flight {
                    return Pushed { ready, timer: None };
                }
                let bytes = q.pending_bytes;
                if q.pending.len() >= t.max_records || bytes >= t.max_bytes {
                    ready.extend(self.take_key(&key));
                    return Pushed { ready, timer: None };
                }
                if opened {
                    q.generation = generation;
                    self.next_generation = generation;
                    return Pushed {
                        ready,
                        timer: Some(TimerTag {
                            key: Some(key),
                            generation,
                        }),
                    };
                }
                Pushed { ready, timer: None }
            }
        }
    }

    /// Adds an unkeyed record to the open batch; a batch that reaches a threshold goes to
    /// `ready`. Returns the timer to arm when the record opened the batch.
    fn push_free(&mut self, item: Item<R>, ready: &mut Vec<Batch<R>>) -> Option<TimerTag> {
        let t = self.thresholds;
        if !self.free.items.is_empty()
            && self.free.bytes.saturating_add(item.envelope.bytes) > t.max_bytes
        {
            ready.extend(self.take_free());
        }
        let opened = self.free.items.is_empty();
        if opened {
            self.free.generation = self.generation();
            // Room for a full batch at once (growing by doubling would move each
            // record about once more); bounded, since thresholds can be huge, and by
            // how many records of this size the byte threshold lets in: a record sent
            // alone must not hold room for a thousand (a batch waiting for a send slot
            // keeps its allocation, and the byte cap does not count it).
            let by_bytes = t.max_bytes / item.envelope.bytes.max(1) + 1;
            self.free.items.reserve_exact(
                t.max_records
                    .min(MAX_RESERVED_ITEMS)
                    .min(usize::try_from(by_bytes).unwrap_or(usize::MAX)),
            );
        }
        self.free.bytes = self.free.bytes.saturating_add(item.envelope.bytes);
        self.free.items.push(item);
        if self.free.items.len() >= t.max_records || self.free.bytes >= t.max_bytes {
            ready.extend(self.take_free());
            return None;
        }
        opened.then_some(TimerTag {
            key: None,
            generation: self.free.generation,
        })
    }

    fn take_free(&mut self) -> Option<Batch<R>> {
        if self.free.items.is_empty() {
            return None;
        }
        self.free.bytes = 0;
        let items = std::mem::take(&mut self.free.items);
        // A serial key is at most once in the open batch, so each appears once here.
        let serial = if self.serial.is_empty() {
            Vec::new()
        } else {
            items
                .iter()
                .filter_map(|item| item.envelope.serial_key.clone())
                .collect()
        };
        Some(Batch {
            items,
            key: None,
            serial,
        })
    }

    /// The records of serial keys `keys` (a resolved batch's [`Batch::serial`]) are resolved:
    /// the next waiting record of each key joins the open batch, which is returned to go now
    /// (its records have waited), with any batch that reached a threshold on the way.
    pub(crate) fn serial_done(&mut self, keys: &[Arc<[u8]>]) -> Vec<Batch<R>> {
        let mut ready = Vec::new();
        let mut released = false;
        for key in keys {
            let Some(waiting) = self.serial.get_mut(key) else {
                continue;
            };
            match waiting.pop_front() {
                // The key stays taken: its next record is now the open or in-flight one.
                Some(item) => {
                    self.push_free(item, &mut ready);
                    released = true;
                }
                None => {
                    self.serial.remove(key);
                }
            }
        }
        if released {
            ready.extend(self.take_free());
        }
        ready
    }

    /// Takes the next batch of `key` (if it has records and none in flight) and marks it in
    /// flight.
    fn take_key(&mut self, key: &Arc<str>) -> Option<Batch<R>> {
        let t = self.thresholds;
        let q = self.keys.get_mut(key)?;
        if q.in_flight || q.pending.is_empty() {
            return None;
        }
        let mut items = Vec::with_capacity(q.pending.len().min(t.max_records));
        let mut bytes = 0u64;
        while let Some(next) = q.pending.front() {
            let b = next.envelope.bytes;
            if !items.is_empty()
                && (items.len() >= t.max_records || bytes.saturating_add(b) > t.max_bytes)
            {
                break;
            }
            bytes = bytes.saturating_add(b);
            if let Some(item) = q.pending.pop_front() {
                items.push(item);
            }
        }
        q.pending_bytes = q.pending_bytes.saturating_sub(bytes);
        q.in_flight = true;
        Some(Batch {
            items,
            key: Some(key.clone()),
            serial: Vec::new(),
        })
    }

    /// The delay of the batch tagged `tag` elapsed: returns it if it is still open.
    pub(crate) fn on_timer(&mut self, tag: &TimerTag) -> Option<Batch<R>> {
        match &tag.key {
            None => (self.free.generation == tag.generation)
                .then(|| self.take_free())
                .flatten(),
            Some(key) => {
                let q = self.keys.get(key)?;
                if q.generation != tag.generation {
                    return None;
                }
                self.take_key(key)
            }
        }
    }

    /// Everything that may go now (a flush, a drain, a blocked admission): the unkeyed batch
    /// and the next batch of every key with none in flight.
    pub(crate) fn take_ready(&mut self) -> Vec<Batch<R>> {
        let mut out: Vec<Batch<R>> = self.take_free().into_iter().collect();
        let keys: Vec<Arc<str>> = self
            .keys
            .iter()
            .filter(|(_, q)| !q.in_flight)
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            out.extend(self.take_key(&key));
        }
        out
    }

    /// The in-flight batch of `key` is fully resolved: returns the key's next batch, if any.
    pub(crate) fn key_done(&mut self, key: &Arc<str>) -> Option<Batch<R>> {
        let q = self.keys.get_mut(key)?;
        q.in_flight = false;
        if q.pending.is_empty() {
            self.keys.remove(key);
            return None;
        }
        self.take_key(key)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;

    use super::*;
    use crate::core::admission::Gate;
    use crate::core::metrics::SinkMetrics;
    use crate::core::progress::Progress;

    fn gate() -> Arc<Gate> {
        let set = ExecutionPlanMetricsSet::new();
        Gate::new(
            10_000,
            u64::MAX,
            Arc::new(Progress::new(None, "p")),
            SinkMetrics::new(&set),
        )
    }

    fn item(g: &Arc<Gate>, n: u32, bytes: u64, key: Option<&str>) -> Item<u32> {
        let envelope = Envelope {
            record: n,
            bytes,
            destination: "d".into(),
            sequence_key: key.map(Arc::from),
            serial_key: None,
            handle: None,
        };
        Item::new(envelope, g.try_admit(bytes).expect("room"))
    }

    fn serial(g: &Arc<Gate>, n: u32, key: &str) -> Item<u32> {
        let mut item = item(g, n, 10, None);
        item.envelope.serial_key = Some(Arc::from(key.as_bytes()));
        item
    }

    #[test]
    fn a_record_of_a_serial_key_waits_until_the_previous_one_of_its_key_resolved() {
        let g = gate();
        let mut b = DestBatches::new(thresholds(3, 1_000_000));
        // a1, b1 and c1 share a batch; a2 and a3 wait for a1, b2 for b1.
        let mut sent = Vec::new();
        for (n, key) in [(1, "a"), (2, "b"), (3, "a"), (4, "b"), (5, "a"), (6, "c")] {
            sent.extend(b.push(serial(&g, n, key)).ready);
        }
        assert_eq!(
            sent.iter().map(records).collect::<Vec<_>>(),
            vec![vec![1, 2, 6]]
        );
        let first = sent.remove(0);
        assert_eq!(first.serial.len(), 3);
        assert!(!b.is_empty(), "two keys still have records waiting");
        // Resolving the first batch releases the next record of each key, sent at once.
        let next = b.serial_done(&first.serial);
        assert_eq!(
            next.iter().map(records).collect::<Vec<_>>(),
            vec![vec![3, 4]]
        );
        // Nothing of key a goes before 3 resolved, however long 5 waits.
        assert!(b.take_ready().is_empty());
        let last = b.serial_done(&next[0].serial);
        assert_eq!(last.iter().map(records).collect::<Vec<_>>(), vec![vec![5]]);
        assert!(b.serial_done(&last[0].serial).is_empty());
        assert!(
            b.is_empty(),
            "every key is released once its last record resolved"
        );
        // Records without a serial key are not held back by them.
        let mut b = DestBatches::new(thresholds(2, 1_000_000));
        assert!(b.push(serial(&g, 7, "a")).ready.is_empty());
        assert!(b.push(serial(&g, 8, "a")).ready.is_empty());
        let ready = b.push(item(&g, 9, 10, None)).ready;
        assert_eq!(
            ready.iter().map(records).collect::<Vec<_>>(),
            vec![vec![7, 9]]
        );
    }

    fn records(b: &Batch<u32>) -> Vec<u32> {
        b.items.iter().map(|i| i.envelope.record).collect()
    }

    fn thresholds(records: usize, bytes: u64) -> BatchThresholds {
        BatchThresholds {
            max_records: records,
            max_bytes: bytes,
            max_delay: Duration::from_millis(10),
        }
    }

    #[test]
    fn a_record_sent_alone_reserves_room_for_itself_only() {
        let g = gate();
        // 2,000-byte records against a 1,000-byte threshold: each goes alone, and its batch
        // holds room for one record, not for the thousand the count threshold allows.
        let mut b = DestBatches::new(thresholds(1000, 1000));
        let ready = b.push(item(&g, 1, 2000, None)).ready;
        assert_eq!(ready.iter().map(records).collect::<Vec<_>>(), vec![vec![1]]);
        assert_eq!(ready[0].items.capacity(), 1);
        // 200-byte records: room for the six the byte threshold can take.
        let mut b = DestBatches::new(thresholds(1000, 1000));
        assert!(b.push(item(&g, 2, 200, None)).ready.is_empty());
        let full = (3..=6)
            .flat_map(|n| b.push(item(&g, n, 200, None)).ready)
            .collect::<Vec<_>>();
        assert_eq!(
            full.iter().map(records).collect::<Vec<_>>(),
            vec![vec![2, 3, 4, 5, 6]]
        );
        assert!(
            full[0].items.capacity() <= 8,
            "{}",
            full[0].items.capacity()
        );
        // Large thresholds still reserve a full batch up front.
        let mut b = DestBatches::new(thresholds(1000, 5_000_000));
        assert!(b.push(item(&g, 7, 200, None)).ready.is_empty());
        assert!(b.free.items.capacity() >= 1000);
    }

    #[test]
    fn keyed_byte_threshold_counts_only_records_still_waiting() {
        let g = gate();
        let mut b = DestBatches::new(thresholds(100, 100));
        // 60 + 40 bytes: the second record reaches the threshold and both go.
        assert!(b.push(item(&g, 1, 60, Some("k"))).ready.is_empty());
        let first = b.push(item(&g, 2, 40, Some("k"))).ready;
        assert_eq!(
            first.iter().map(records).collect::<Vec<_>>(),
            vec![vec![1, 2]]
        );
        // While it is in flight, 40 + 40 + 40 bytes queue up.
        for n in 3..=5 {
            assert!(b.push(item(&g, n, 40, Some("k"))).ready.is_empty());
        }
        // The next batch takes what fits in 100 bytes; the last 40 bytes go after it.
        let second = b.key_done(&Arc::from("k")).expect("next batch");
        assert_eq!(records(&second), vec![3, 4]);
        assert!(
            b.key_done(&Arc::from("k"))
                .is_some_and(|b| records(&b) == vec![5])
        );
        assert!(b.key_done(&Arc::from("k")).is_none());
        // Then 40 + 59 bytes stay below the threshold...
        assert!(b.push(item(&g, 6, 40, Some("k"))).ready.is_empty());
        assert!(b.push(item(&g, 7, 59, Some("k"))).ready.is_empty());
        // ...and one more byte reaches it.
        let third = b.push(item(&g, 8, 1, Some("k"))).ready;
        assert_eq!(
            third.iter().map(records).collect::<Vec<_>>(),
            vec![vec![6, 7, 8]]
        );
    }

    #[test]
    fn sends_on_record_count_threshold() {
        let g = gate();
        let mut b = DestBatches::new(thresholds(3, 1000));
        let first = b.push(item(&g, 1, 1, None));
        assert!(first.ready.is_empty());
        assert!(
            first.timer.is_some(),
            "the first record arms the delay timer"
        );
        assert!(b.push(item(&g, 2, 1, None)).timer.is_none());
        let third = b.push(item(&g, 3, 1, None));
        assert_eq!(third.ready.len(), 1);
        assert_eq!(records(&third.ready[0]), vec![1, 2, 3]);
        assert!(b.is_empty());
    }

    #[test]
    fn a_record_that_would_overflow_the_byte_threshold_closes_the_batch_first() {
        let g = gate();
        let mut b = DestBatches::new(thresholds(100, 100));
        b.push(item(&g, 1, 60, None));
        let p = b.push(item(&g, 2, 60, None));
        assert_eq!(p.ready.len(), 1);
        assert_eq!(records(&p.ready[0]), vec![1]);
        assert!(p.timer.is_some(), "record 2 opens a new batch");
        // An oversize record goes alone.
        let p = b.push(item(&g, 3, 500, None));
        assert_eq!(
            p.ready.iter().map(records).collect::<Vec<_>>(),
            vec![vec![2], vec![3]]
        );
    }

    #[test]
    fn stale_timer_does_nothing() {
        let g = gate();
        let mut b = DestBatches::new(thresholds(2, 1000));
        let tag = b.push(item(&g, 1, 1, None)).timer.expect("timer");
        assert_eq!(b.push(item(&g, 2, 1, None)).ready.len(), 1);
        let tag2 = b.push(item(&g, 3, 1, None)).timer.expect("timer");
        assert!(
            b.on_timer(&tag).is_none(),
            "the batch of the first timer already left"
        );
        assert_eq!(b.on_timer(&tag2).map(|b| records(&b)), Some(vec![3]));
    }

    #[test]
    fn one_batch_per_key_in_flight_and_later_records_wait() {
        let g = gate();
        let mut b = DestBatches::new(thresholds(2, 1000));
        let key = Arc::<str>::from("k");
        b.push(item(&g, 1, 1, Some("k")));
        let first = b.push(item(&g, 2, 1, Some("k"))).ready;
        assert_eq!(
            first.iter().map(records).collect::<Vec<_>>(),
            vec![vec![1, 2]]
        );
        // While the key's batch is in flight, its later records wait, even past the threshold.
        for n in 3..=6 {
            let p = b.push(item(&g, n, 1, Some("k")));
            assert!(p.ready.is_empty() && p.timer.is_none());
        }
        assert!(b.take_ready().is_empty());
        // Unkeyed records are not held back by the key.
        b.push(item(&g, 100, 1, None));
        assert_eq!(
            b.take_ready().iter().map(records).collect::<Vec<_>>(),
            vec![vec![100]]
        );
        let next = b.key_done(&key).expect("next batch of the key");
        assert_eq!(records(&next), vec![3, 4]);
        assert_eq!(records(&b.key_done(&key).expect("then")), vec![5, 6]);
        assert!(b.key_done(&key).is_none());
        assert!(b.is_empty());
    }

    #[test]
    fn key_timer_sends_a_partial_batch() {
        let g = gate();
        let mut b = DestBatches::new(thresholds(10, 1000));
        let tag = b.push(item(&g, 1, 1, Some("k"))).timer.expect("timer");
        assert_eq!(b.on_timer(&tag).map(|b| records(&b)), Some(vec![1]));
        assert!(b.on_timer(&tag).is_none());
    }
}
