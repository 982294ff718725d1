//! One in-memory subscription of the null StreamingPull server: a fixed backlog of canned
//! messages and the lease bookkeeping of the real service (docs/service_facts.md, "The null
//! StreamingPull server"): ack deadlines, redelivery once a lease lapses or at once on a nack,
//! per-stream flow control, ordering keys, delivery attempts.
//!
//! Time is `tokio::time::Instant`, so the tests run it under paused time. Nothing here runs on
//! its own: lapsed leases are returned whenever the subscription is touched ([`Subscription::expire`]
//! is called first by every operation), and a waiting stream sleeps until
//! [`Subscription::next_deadline`].

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::bench::null_method::FeedOptions;

/// Longest ack deadline the service takes, in seconds (`ModifyAckDeadline`,
/// `stream_ack_deadline_seconds`).
pub const MAX_ACK_DEADLINE_SECONDS: i32 = 600;
/// Shortest `stream_ack_deadline_seconds` the service takes.
pub const MIN_STREAM_ACK_DEADLINE_SECONDS: i32 = 10;
/// How long a lease that [`FeedOptions::lose_lease_every`] loses lasts.
pub const LOST_LEASE: Duration = Duration::from_millis(50);

/// Where one message stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting to be delivered (never delivered, nacked, or its lease lapsed).
    Ready,
    /// Delivered on `stream` and not settled; it comes back at `deadline`.
    Leased { stream: u64, deadline: Instant },
    /// Acknowledged: never delivered again.
    Acked,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    state: State,
    /// Deliveries so far (the current delivery's `delivery_attempt`).
    attempts: u32,
}

/// The flow control and ack deadline of one open stream.
#[derive(Debug, Clone, Copy)]
struct Flow {
    /// `max_outstanding_messages` (0: no bound).
    max_messages: u64,
    /// `max_outstanding_bytes` (0: no bound).
    max_bytes: u64,
    /// Messages delivered on the stream and not yet settled or lapsed.
    messages: u64,
    /// Their data bytes.
    bytes: u64,
    /// The lease a delivery on this stream gets.
    deadline: Duration,
}

impl Flow {
    /// Whether one more message of `size` bytes fits. A stream holding nothing always takes
    /// one, so a message larger than the byte bound is still delivered.
    fn has_room(&self, size: u64) -> bool {
        (self.max_messages == 0 || self.messages < self.max_messages)
            && (self.max_bytes == 0 || self.messages == 0 || self.bytes + size <= self.max_bytes)
    }
}

/// The deliverable messages, in publish order; with ordering keys, a key's next message only
/// while no message of that key is leased.
#[derive(Debug)]
struct Ready {
    /// Number of keys; 0: unordered (one queue, nothing held back).
    keys: u32,
    /// Unordered: every ready message.
    all: BTreeSet<u64>,
    /// Ordered: each key's ready messages.
    per_key: Vec<BTreeSet<u64>>,
    /// Ordered: whether a message of the key is leased.
    busy: Vec<bool>,
    /// Ordered: the keys that can deliver, by the id of their next message.
    free: BTreeSet<(u64, u32)>,
}

impl Ready {
    fn new(messages: u64, keys: u32) -> Ready {
        let mut ready = Ready {
            keys,
            all: BTreeSet::new(),
            per_key: (0..keys).map(|_| BTreeSet::new()).collect(),
            busy: vec![false; keys as usize],
            free: BTreeSet::new(),
        };
        for id in 0..messages {
            ready.push(id);
        }
        ready
    }

    fn key(&self, id: u64) -> usize {
        (id % u64::from(self.keys)) as usize
    }

    /// Takes the key's head out of `free`, runs `change`, then puts the (new) head back if the
    /// key can deliver.
    fn with_key(&mut self, k: usize, change: impl FnOnce(&mut Ready)) {
        if let Some(&head) = self.per_key[k].first() {
            self.free.remove(&(head, k as u32));
        }
        change(self);
        if !self.busy[k]
            && let Some(&head) = self.per_key[k].first()
        {
            self.free.insert((head, k as u32));
        }
    }

    fn push(&mut self, id: u64) {
        if self.keys == 0 {
            self.all.insert(id);
        } else {
            let k = self.key(id);
            self.with_key(k, |r| {
                r.per_key[k].insert(id);
            });
        }
    }

    /// Takes `id` out without delivering it (a late acknowledgement).
    fn remove(&mut self, id: u64) {
        if self.keys == 0 {
            self.all.remove(&id);
        } else {
            let k = self.key(id);
            self.with_key(k, |r| {
                r.per_key[k].remove(&id);
            });
        }
    }

    /// The next deliverable message; with keys, its key is leased from now on.
    fn pop(&mut self) -> Option<u64> {
        if self.keys == 0 {
            return self.all.pop_first();
        }
        let (id, k) = self.free.pop_first()?;
        let k = k as usize;
        self.per_key[k].remove(&id);
        self.busy[k] = true;
        Some(id)
    }

    /// The leased message of `id`'s key was settled or lapsed: the key delivers again.
    fn release(&mut self, id: u64) {
        if self.keys > 0 {
            let k = self.key(id);
            self.with_key(k, |r| r.busy[k] = false);
        }
    }
}

/// What a subscription has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubscriptionStats {
    /// Messages in the backlog.
    pub messages: u64,
    /// Deliveries, redeliveries included.
    pub delivered: u64,
    /// Deliveries of a message delivered before (`delivery_attempt` above 1).
    pub redelivered: u64,
    /// Messages acknowledged (each once).
    pub acked: u64,
    /// Leases ended by a nack (`ModifyAckDeadline` with 0 seconds).
    pub nacked: u64,
    /// Leases that lapsed (their deadline passed unacknowledged).
    pub expired: u64,
    /// Acknowledgements, nacks or extensions of an earlier delivery than the message's current
    /// one, or of a message already acknowledged: ignored.
    pub stale: u64,
    /// Messages leased now.
    pub outstanding: u64,
    /// The most deliveries of one message.
    pub max_attempts: u32,
}

/// One delivery: the message's number and its delivery attempt (both in its ack id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// The message's number in the backlog, from 0.
    pub id: u64,
    /// Its delivery attempt, from 1.
    pub attempt: u32,
}

impl Delivery {
    /// The ack id of this delivery: `ID-ATTEMPT`.
    pub fn ack_id(&self) -> String {
        format!("{}-{}", self.id, self.attempt)
    }

    /// Reads an ack id written by [`Delivery::ack_id`].
    pub fn parse(ack_id: &str) -> Option<Delivery> {
        let (id, attempt) = ack_id.split_once('-')?;
        Some(Delivery {
            id: id.parse().ok()?,
            attempt: attempt.parse().ok()?,
        })
    }
}

struct Inner {
    slots: Vec<Slot>,
    ready: Ready,
    /// Lease deadlines, earliest first; an entry whose message was settled or extended since is
    /// skipped when it comes up.
    deadlines: BinaryHeap<Reverse<(Instant, u64, u32)>>,
    streams: HashMap<u64, Flow>,
    next_stream: u64,
    stats: SubscriptionStats,
}

/// One subscription: its backlog and its leases.
pub struct Subscription {
    feed: FeedOptions,
    inner: Mutex<Inner>,
    /// Woken whenever messages may have become deliverable or a stream got room.
    changed: tokio::sync::Notify,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("feed", &self.feed)
            .field("stats", &self.stats())
            .finish()
    }
}

/// A bad ack id or deadline in a request: the service's `INVALID_ARGUMENT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid(pub String);

impl Subscription {
    /// A subscription whose backlog is `feed.messages` messages, all ready.
    pub fn new(feed: FeedOptions) -> Subscription {
        let (messages, ordering_keys) = (feed.messages, feed.ordering_keys);
        Subscription {
            feed,
            inner: Mutex::new(Inner {
                slots: vec![
                    Slot {
                        state: State::Ready,
                        attempts: 0,
                    };
                    usize::try_from(messages).unwrap_or(usize::MAX)
                ],
                ready: Ready::new(messages, ordering_keys),
                deadlines: BinaryHeap::new(),
                streams: HashMap::new(),
                next_stream: 1,
                stats: SubscriptionStats {
                    messages,
                    ..Default::default()
                },
            }),
            changed: tokio::sync::Notify::new(),
        }
    }

    /// What the subscription serves.
    pub fn feed(&self) -> &FeedOptions {
        &self.feed
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The counts so far (lapsed leases returned first).
    pub fn stats(&self) -> SubscriptionStats {
        let mut inner = self.lock();
        self.expire_locked(&mut inner, Instant::now());
        inner.stats
    }

    /// Whether message `id`'s first lease is lost ([`FeedOptions::lose_lease_every`]).
    fn loses_first_lease(&self, id: u64) -> bool {
        self.feed
            .lose_lease_every
            .is_some_and(|n| n > 0 && id.is_multiple_of(n))
    }

    /// The lease a request for `seconds` gets: at most the server's `max_ack_deadline`.
    fn lease(&self, seconds: i32) -> Duration {
        let asked = Duration::from_secs(u64::from(seconds.unsigned_abs()));
        match self.feed.max_ack_deadline {
            Some(cap) => asked.min(cap),
            None => asked,
        }
    }

    /// Checks a `stream_ack_deadline_seconds` as the service does (10 to 600).
    pub fn check_stream_deadline(seconds: i32) -> Result<(), Invalid> {
        if (MIN_STREAM_ACK_DEADLINE_SECONDS..=MAX_ACK_DEADLINE_SECONDS).contains(&seconds) {
            Ok(())
        } else {
            Err(Invalid(format!(
                "stream_ack_deadline_seconds must be between {MIN_STREAM_ACK_DEADLINE_SECONDS} and {MAX_ACK_DEADLINE_SECONDS}, got {seconds}"
            )))
        }
    }

    /// Opens a stream with its flow control (0 or less: no bound) and ack deadline; returns its
    /// id.
    pub fn open_stream(&self, max_messages: i64, max_bytes: i64, deadline_seconds: i32) -> u64 {
        let mut inner = self.lock();
        let id = inner.next_stream;
        inner.next_stream += 1;
        let flow = Flow {
            max_messages: u64::try_from(max_messages).unwrap_or(0),
            max_bytes: u64::try_from(max_bytes).unwrap_or(0),
            messages: 0,
            bytes: 0,
            deadline: self.lease(deadline_seconds),
        };
        inner.streams.insert(id, flow);
        id
    }

    /// A later request of the stream changed its ack deadline.
    pub fn set_stream_deadline(&self, stream: u64, deadline_seconds: i32) {
        let lease = self.lease(deadline_seconds);
        if let Some(flow) = self.lock().streams.get_mut(&stream) {
            flow.deadline = lease;
        }
    }

    /// How many streams are open now: a stream is open until its client ends or resets it
    /// (or the connection closes).
    pub fn open_streams(&self) -> usize {
        self.lock().streams.len()
    }

    /// The stream closed (or its client went away): it gets nothing more. What it holds stays
    /// leased until each lease lapses, as at the service.
    pub fn close_stream(&self, stream: u64) {
        self.lock().streams.remove(&stream);
    }

    /// Ends the lease of the message in `slot` (settled, nacked or lapsed): its stream gets the
    /// room back and its key delivers again.
    fn end_lease(inner: &mut Inner, id: u64, stream: u64, size: u64) {
        if let Some(flow) = inner.streams.get_mut(&stream) {
            flow.messages = flow.messages.saturating_sub(1);
            flow.bytes = flow.bytes.saturating_sub(size);
        }
        inner.ready.release(id);
        inner.stats.outstanding = inner.stats.outstanding.saturating_sub(1);
    }

    /// Returns every lease that lapsed by `now` to the ready messages; whether any did.
    fn expire_locked(&self, inner: &mut Inner, now: Instant) -> bool {
        let size = self.feed.message_size as u64;
        let mut any = false;
        while let Some(&Reverse((deadline, id, attempt))) = inner.deadlines.peek() {
            if deadline > now {
                break;
            }
            inner.deadlines.pop();
            let slot = inner.slots[id as usize];
            match slot.state {
                State::Leased {
                    stream,
                    deadline: current,
                } if current == deadline && slot.attempts == attempt => {
                    Self::end_lease(inner, id, stream, size);
                    inner.slots[id as usize].state = State::Ready;
                    inner.ready.push(id);
                    inner.stats.expired += 1;
                    any = true;
                }
                _ => {}
            }
        }
        any
    }

    /// Returns the lapsed leases; wakes the streams if any came back.
    pub fn expire(&self) {
        let any = {
            let mut inner = self.lock();
            self.expire_locked(&mut inner, Instant::now())
        };
        if any {
            self.changed.notify_waiters();
        }
    }

    /// When the earliest lease may lapse.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.lock().deadlines.peek().map(|Reverse((d, _, _))| *d)
    }

    /// Leases up to `max` messages to `stream`, as far as its flow control allows.
    pub fn take(&self, stream: u64, max: usize) -> Vec<Delivery> {
        let now = Instant::now();
        let size = self.feed.message_size as u64;
        let mut inner = self.lock();
        self.expire_locked(&mut inner, now);
        let Some(mut flow) = inner.streams.get(&stream).copied() else {
            return Vec::new();
        };
        let mut taken = Vec::new();
        while taken.len() < max && flow.has_room(size) {
            let Some(id) = inner.ready.pop() else { break };
            let slot = &mut inner.slots[id as usize];
            // A lost first lease: delivered again soon, whatever the reader extends it to.
            let lost = slot.attempts == 0 && self.loses_first_lease(id);
            let deadline = now + if lost { LOST_LEASE } else { flow.deadline };
            slot.attempts += 1;
            slot.state = State::Leased { stream, deadline };
            let attempt = slot.attempts;
            inner.deadlines.push(Reverse((deadline, id, attempt)));
            flow.messages += 1;
            flow.bytes += size;
            let stats = &mut inner.stats;
            stats.delivered += 1;
            stats.outstanding += 1;
            if attempt > 1 {
                stats.redelivered += 1;
            }
            stats.max_attempts = stats.max_attempts.max(attempt);
            taken.push(Delivery { id, attempt });
        }
        inner.streams.insert(stream, flow);
        taken
    }

    /// Reads `ack_ids`, refusing the request if one is not an ack id of this subscription.
    fn parse_all(&self, ack_ids: &[String]) -> Result<Vec<Delivery>, Invalid> {
        let bad = ack_ids
            .iter()
            .filter(|a| Delivery::parse(a).is_none_or(|d| d.id >= self.feed.messages))
            .count();
        if bad > 0 {
            return Err(Invalid(format!(
                "{bad} of the {} ack id(s) in the request are not ack ids of this subscription",
                ack_ids.len()
            )));
        }
        Ok(ack_ids.iter().filter_map(|a| Delivery::parse(a)).collect())
    }

    /// Acknowledges the deliveries `ack_ids` name; returns how many messages this
    /// acknowledged (an ack id of an earlier delivery, or of a message already acknowledged,
    /// is counted as stale and ignored).
    pub fn acknowledge(&self, ack_ids: &[String]) -> Result<u64, Invalid> {
        let deliveries = self.parse_all(ack_ids)?;
        let size = self.feed.message_size as u64;
        let acked = {
            let mut inner = self.lock();
            self.expire_locked(&mut inner, Instant::now());
            let mut acked = 0;
            for d in deliveries {
                let slot = inner.slots[d.id as usize];
                if slot.attempts != d.attempt {
                    inner.stats.stale += 1;
                    continue;
                }
                match slot.state {
                    State::Acked => {
                        inner.stats.stale += 1;
                        continue;
                    }
                    State::Leased { stream, .. } => Self::end_lease(&mut inner, d.id, stream, size),
                    // Lapsed but not delivered again yet: the acknowledgement still takes.
                    State::Ready => inner.ready.remove(d.id),
                }
                inner.slots[d.id as usize].state = State::Acked;
                inner.stats.acked += 1;
                acked += 1;
            }
            acked
        };
        // Room on a stream, and a key's next message may be deliverable.
        self.changed.notify_waiters();
        Ok(acked)
    }

    /// `ModifyAckDeadline`: 0 seconds nacks (the message is ready again at once), 1 to 600
    /// sets the lease to end that long from now (at most the server's `max_ack_deadline`).
    pub fn modify_deadline(&self, ack_ids: &[String], seconds: i32) -> Result<(), Invalid> {
        if !(0..=MAX_ACK_DEADLINE_SECONDS).contains(&seconds) {
            return Err(Invalid(format!(
                "ack_deadline_seconds must be between 0 and {MAX_ACK_DEADLINE_SECONDS}, got {seconds}"
            )));
        }
        let deliveries = self.parse_all(ack_ids)?;
        let size = self.feed.message_size as u64;
        let now = Instant::now();
        let lease = self.lease(seconds);
        let mut inner = self.lock();
        self.expire_locked(&mut inner, now);
        let mut nacked = false;
        for d in deliveries {
            let slot = inner.slots[d.id as usize];
            let State::Leased { stream, .. } = slot.state else {
                inner.stats.stale += 1;
                continue;
            };
            if slot.attempts != d.attempt {
                inner.stats.stale += 1;
                continue;
            }
            if seconds > 0 && d.attempt == 1 && self.loses_first_lease(d.id) {
                // The fault of `lose_lease_every`: the extension does not take.
                continue;
            }
            if seconds == 0 {
                Self::end_lease(&mut inner, d.id, stream, size);
                inner.slots[d.id as usize].state = State::Ready;
                inner.ready.push(d.id);
                inner.stats.nacked += 1;
                nacked = true;
            } else {
                let deadline = now + lease;
                inner.slots[d.id as usize].state = State::Leased { stream, deadline };
                inner.deadlines.push(Reverse((deadline, d.id, d.attempt)));
            }
        }
        drop(inner);
        if nacked {
            self.changed.notify_waiters();
        }
        Ok(())
    }

    /// Waits until `stream` may have something to take: a change (acknowledgement, nack) or
    /// the next lease deadline. Returns at once if `take` would deliver now.
    pub async fn wait_for_work(&self, stream: u64) {
        let notified = self.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let deadline = {
            let mut inner = self.lock();
            if self.expire_locked(&mut inner, Instant::now()) {
                drop(inner);
                self.changed.notify_waiters();
                return;
            }
            let Some(flow) = inner.streams.get(&stream) else {
                return;
            };
            let has_ready = if inner.ready.keys == 0 {
                !inner.ready.all.is_empty()
            } else {
                !inner.ready.free.is_empty()
            };
            if has_ready && flow.has_room(self.feed.message_size as u64) {
                return;
            }
            inner.deadlines.peek().map(|Reverse((d, _, _))| *d)
        };
        match deadline {
            Some(at) => {
                tokio::select! {
                    _ = notified => {}
                    _ = tokio::time::sleep_until(at) => {}
                }
            }
            None => notified.await,
        }
    }

    /// Whether every message was acknowledged.
    pub fn drained(&self) -> bool {
        let stats = self.lock().stats;
        stats.acked == stats.messages
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(messages: u64, keys: u32) -> FeedOptions {
        FeedOptions {
            messages,
            message_size: 100,
            ordering_keys: keys,
            max_ack_deadline: None,
            payload: None,
            publish_time_step: None,
            lose_lease_every: None,
        }
    }

    fn ids(d: &[Delivery]) -> Vec<u64> {
        d.iter().map(|d| d.id).collect()
    }

    fn acks(d: &[Delivery]) -> Vec<String> {
        d.iter().map(Delivery::ack_id).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn flow_control_bounds_what_a_stream_holds() {
        let sub = Subscription::new(feed(10, 0));
        let s = sub.open_stream(3, 0, 10);
        let first = sub.take(s, 100);
        assert_eq!(ids(&first), [0, 1, 2]);
        assert!(sub.take(s, 100).is_empty(), "the stream is full");
        sub.acknowledge(&acks(&first[..1])).unwrap();
        assert_eq!(ids(&sub.take(s, 100)), [3]);
        // Bytes: 250 bytes hold two messages of 100.
        let b = sub.open_stream(0, 250, 10);
        assert_eq!(ids(&sub.take(b, 100)), [4, 5]);
        // A byte bound below one message still gets one.
        let tiny = sub.open_stream(0, 1, 10);
        assert_eq!(ids(&sub.take(tiny, 100)), [6]);
        assert_eq!(sub.stats().outstanding, 6);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_first_lease_delivers_the_message_again_whatever_the_reader_extends() {
        let sub = Subscription::new(FeedOptions {
            lose_lease_every: Some(3),
            ..feed(7, 0)
        });
        let s = sub.open_stream(0, 0, 10);
        let first = sub.take(s, 100);
        assert_eq!(first.len(), 7);
        sub.modify_deadline(&acks(&first), 60).unwrap();
        tokio::time::advance(LOST_LEASE).await;
        // Messages 0, 3 and 6 lost their first lease; the second one is kept as asked.
        let again = sub.take(s, 100);
        assert_eq!(ids(&again), [0, 3, 6]);
        assert!(again.iter().all(|d| d.attempt == 2));
        sub.modify_deadline(&acks(&again), 60).unwrap();
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(sub.take(s, 100).is_empty(), "a second lease is not lost");
        // The first copy's acknowledgement is stale now; the second's takes.
        assert_eq!(sub.acknowledge(&acks(&first)).unwrap(), 4);
        assert_eq!(sub.acknowledge(&acks(&again)).unwrap(), 3);
        assert_eq!(sub.stats().redelivered, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lapsed_lease_is_delivered_again_with_its_attempt_counted() {
        let sub = Subscription::new(feed(2, 0));
        let s = sub.open_stream(0, 0, 10);
        let first = sub.take(s, 100);
        assert_eq!(first.iter().map(|d| d.attempt).collect::<Vec<_>>(), [1, 1]);
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert!(sub.take(s, 100).is_empty(), "not before the deadline");
        // An extension moves the first message's deadline on.
        sub.modify_deadline(&acks(&first[..1]), 20).unwrap();
        tokio::time::advance(Duration::from_millis(1)).await;
        let again = sub.take(s, 100);
        assert_eq!(again, [Delivery { id: 1, attempt: 2 }]);
        let stats = sub.stats();
        assert_eq!(
            (stats.expired, stats.redelivered, stats.max_attempts),
            (1, 1, 2)
        );
        // The first delivery's ack id of message 1 no longer counts; the second's does.
        assert_eq!(sub.acknowledge(&acks(&first[1..])).unwrap(), 0);
        assert_eq!(sub.acknowledge(&acks(&again)).unwrap(), 1);
        assert_eq!(sub.stats().stale, 1);
        tokio::time::advance(Duration::from_secs(20)).await;
        assert_eq!(sub.take(s, 100), [Delivery { id: 0, attempt: 2 }]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_streams_leases_come_back_when_they_lapse() {
        let sub = Subscription::new(feed(3, 0));
        let killed = sub.open_stream(0, 0, 10);
        assert_eq!(sub.take(killed, 100).len(), 3);
        sub.close_stream(killed);
        let next = sub.open_stream(0, 0, 10);
        assert!(sub.take(next, 100).is_empty());
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(ids(&sub.take(next, 100)), [0, 1, 2]);
        assert!(
            sub.take(killed, 100).is_empty(),
            "a closed stream gets nothing"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_nack_delivers_again_at_once_and_an_ack_never() {
        let sub = Subscription::new(feed(3, 0));
        let s = sub.open_stream(0, 0, 60);
        let first = sub.take(s, 100);
        sub.acknowledge(&acks(&first[..1])).unwrap();
        sub.modify_deadline(&acks(&first[1..2]), 0).unwrap();
        assert_eq!(sub.take(s, 100), [Delivery { id: 1, attempt: 2 }]);
        tokio::time::advance(Duration::from_secs(600)).await;
        // Message 0 was acknowledged: only 1 and 2 lapse and come back.
        assert_eq!(ids(&sub.take(s, 100)), [1, 2]);
        let stats = sub.stats();
        assert_eq!((stats.acked, stats.nacked, stats.expired), (1, 1, 2));
        // Acknowledging twice counts once.
        assert_eq!(sub.acknowledge(&acks(&first[..1])).unwrap(), 0);
        assert!(!sub.drained());
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_ack_of_a_lapsed_lease_still_takes_before_redelivery() {
        let sub = Subscription::new(feed(1, 0));
        let s = sub.open_stream(0, 0, 10);
        let first = sub.take(s, 100);
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(sub.acknowledge(&acks(&first)).unwrap(), 1);
        assert!(sub.take(s, 100).is_empty());
        assert!(sub.drained());
    }

    #[tokio::test(start_paused = true)]
    async fn a_keys_next_message_waits_for_the_earlier_one() {
        // Two keys: 0, 2, 4 are key 0; 1, 3, 5 key 1.
        let sub = Subscription::new(feed(6, 2));
        let s = sub.open_stream(0, 0, 10);
        let first = sub.take(s, 100);
        assert_eq!(ids(&first), [0, 1]);
        assert!(sub.take(s, 100).is_empty(), "each key has one message out");
        sub.acknowledge(&acks(&first[1..])).unwrap();
        assert_eq!(ids(&sub.take(s, 100)), [3]);
        // A nacked message is delivered again before its key's later ones.
        sub.modify_deadline(&acks(&first[..1]), 0).unwrap();
        assert_eq!(sub.take(s, 100), [Delivery { id: 0, attempt: 2 }]);
        // A lapsed one too.
        tokio::time::advance(Duration::from_secs(10)).await;
        let again = sub.take(s, 100);
        assert_eq!(
            again,
            [
                Delivery { id: 0, attempt: 3 },
                Delivery { id: 3, attempt: 2 }
            ]
        );
        sub.acknowledge(&acks(&again)).unwrap();
        assert_eq!(ids(&sub.take(s, 100)), [2, 5]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_server_cap_shortens_every_lease() {
        let sub = Subscription::new(FeedOptions {
            max_ack_deadline: Some(Duration::from_secs(1)),
            ..feed(1, 0)
        });
        let s = sub.open_stream(0, 0, 600);
        let first = sub.take(s, 100);
        sub.modify_deadline(&acks(&first), 600).unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(sub.take(s, 100), [Delivery { id: 0, attempt: 2 }]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_stream_wakes_for_an_ack_and_for_a_deadline() {
        let sub = std::sync::Arc::new(Subscription::new(feed(2, 0)));
        let s = sub.open_stream(1, 0, 10);
        let first = sub.take(s, 100);
        let waiter = tokio::spawn({
            let sub = sub.clone();
            async move { sub.wait_for_work(s).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        sub.acknowledge(&acks(&first)).unwrap();
        waiter.await.unwrap();
        let second = sub.take(s, 100);
        assert_eq!(ids(&second), [1]);
        let started = Instant::now();
        sub.wait_for_work(s).await;
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }

    #[test]
    fn bad_ack_ids_and_deadlines_are_refused_naming_the_field() {
        let sub = Subscription::new(feed(2, 0));
        let err = sub.acknowledge(&["0-1".into(), "zz".into(), "7-1".into()]);
        assert_eq!(
            err.unwrap_err().0,
            "2 of the 3 ack id(s) in the request are not ack ids of this subscription"
        );
        let err = sub.modify_deadline(&["0-1".into()], 601).unwrap_err();
        assert!(err.0.contains("ack_deadline_seconds"), "{}", err.0);
        assert!(Subscription::check_stream_deadline(9).is_err());
        assert!(Subscription::check_stream_deadline(10).is_ok());
    }
}
