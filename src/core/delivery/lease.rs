//! What one input partition holds: the ids received and not yet settled (acknowledged or
//! nacked), for flow control and lease extension. Pure state: the settler
//! ([`super::settler`]) asks it what is due at each lease tick, and a paused tokio clock tests
//! it.
//!
//! Flow control is client-side, as in the official Pub/Sub subscribers: the input reads
//! nothing further while the partition holds its bound of ids or of data bytes. An id leaves
//! when its acknowledgement or nack was sent, or when it was held for the longest lease, after
//! which the service delivers it again.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;
use tokio::time::Instant;

use super::DeliveryId;

/// One held message, in 16 bytes: a window may hold hundreds of thousands of them.
#[derive(Debug)]
struct Held {
    /// When the service says it was published: milliseconds since the Unix epoch, or
    /// [`UNKNOWN`] when it does not say.
    published: i64,
    /// When it was received: milliseconds after the set's [`Outstanding::base`], modulo 2^32
    /// (49.7 days). Ages are taken with wrapping arithmetic, which is exact for anything held
    /// less than that: the settler lets a lease go after its `max_lease` (a Pub/Sub source's
    /// `max_lease_duration` is at most 7 days).
    received: u32,
    /// Its data bytes in the low 31 bits (a message is far below 2 GiB; a larger count is kept
    /// as [`MAX_BYTES`]), and in the top bit whether a node that waits for a window to close
    /// holds it ([`PARKED`]): then flow control does not count it.
    bytes_parked: u32,
}

/// [`Held::published`] of a message whose publication time is not known.
const UNKNOWN: i64 = i64::MIN;
/// The flag bit of [`Held::bytes_parked`].
const PARKED: u32 = 1 << 31;
/// The largest byte count [`Held::bytes_parked`] keeps.
const MAX_BYTES: u32 = PARKED - 1;

impl Held {
    fn bytes(&self) -> u64 {
        u64::from(self.bytes_parked & MAX_BYTES)
    }

    fn parked(&self) -> bool {
        self.bytes_parked & PARKED != 0
    }

    fn park(&mut self) {
        self.bytes_parked |= PARKED;
    }

    /// Milliseconds since it was received, `now` being [`Outstanding::millis`] of now.
    fn age(&self, now: u32) -> u32 {
        now.wrapping_sub(self.received)
    }
}

/// Milliseconds since the Unix epoch of `at` (negative before it).
fn epoch_millis(at: SystemTime) -> i64 {
    match at.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
        Err(before) => -i64::try_from(before.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

#[derive(Debug)]
struct State<I> {
    messages: HashMap<I, Held>,
    /// Data bytes of the messages in flight (parked ones count none).
    bytes: u64,
    /// Messages parked.
    parked: u64,
}

/// The ids one partition holds, with its flow-control bounds.
#[derive(Debug)]
pub struct Outstanding<I: DeliveryId> {
    state: Mutex<State<I>>,
    /// What [`Held::received`] counts from.
    base: Instant,
    changed: Notify,
    max_messages: u64,
    max_bytes: u64,
}

impl<I> State<I> {
    /// Takes a message that left out of the totals.
    fn forget(&mut self, old: &Held) {
        if old.parked() {
            self.parked -= 1;
        } else {
            self.bytes -= old.bytes();
        }
    }
}

impl<I: DeliveryId> Outstanding<I> {
    /// An empty set bounded by `max_messages` and `max_bytes`.
    pub fn new(max_messages: u64, max_bytes: u64) -> Self {
        Outstanding {
            state: Mutex::new(State {
                messages: HashMap::new(),
                bytes: 0,
                parked: 0,
            }),
            base: Instant::now(),
            changed: Notify::new(),
            max_messages,
            max_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<I>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `at` as milliseconds after [`base`](Self::base), modulo 2^32 ([`Held::received`]).
    fn millis(&self, at: Instant) -> u32 {
        at.saturating_duration_since(self.base).as_millis() as u32
    }

    /// Records a received message of `bytes` data bytes.
    pub fn add(&self, id: I, bytes: u64) {
        self.add_published(id, bytes, None);
    }

    /// Records a received message of `bytes` data bytes, published at `published` when the
    /// service says.
    pub fn add_published(&self, id: I, bytes: u64, published: Option<SystemTime>) {
        let held = Held {
            published: published.map_or(UNKNOWN, epoch_millis),
            received: self.millis(Instant::now()),
            bytes_parked: u32::try_from(bytes).unwrap_or(MAX_BYTES).min(MAX_BYTES),
        };
        let bytes = held.bytes();
        let mut s = self.lock();
        if let Some(old) = s.messages.insert(id, held) {
            s.forget(&old);
        }
        s.bytes += bytes;
    }

    /// Parks messages a node holds until a window closes: they stay leased, but flow control
    /// no longer counts them (nor their bytes, which the holder no longer keeps). Unknown ids
    /// are ignored.
    pub fn park(&self, ids: &[I]) {
        {
            let mut s = self.lock();
            let mut freed = 0;
            let mut parked = 0;
            for id in ids {
                if let Some(held) = s.messages.get_mut(id)
                    && !held.parked()
                {
                    held.park();
                    freed += held.bytes();
                    parked += 1;
                }
            }
            s.bytes -= freed;
            s.parked += parked;
        }
        self.changed.notify_waiters();
    }

    /// Messages parked ([`park`](Self::park)).
    pub fn parked(&self) -> u64 {
        self.lock().parked
    }

    /// Forgets settled messages and wakes a stream waiting for room. Unknown ids (a lease that
    /// already lapsed) are ignored.
    pub fn remove(&self, ids: &[I]) {
        {
            let mut s = self.lock();
            for id in ids {
                if let Some(old) = s.messages.remove(id) {
                    s.forget(&old);
                }
            }
        }
        self.changed.notify_waiters();
    }

    /// Messages held.
    pub fn len(&self) -> usize {
        self.lock().messages.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// When the oldest id held was received (`None` when nothing is held).
    pub fn oldest(&self) -> Option<Instant> {
        let now = Instant::now();
        let millis = self.millis(now);
        let age = self
            .lock()
            .messages
            .values()
            .map(|held| held.age(millis))
            .max();
        age.map(|age| now - Duration::from_millis(u64::from(age)))
    }

    /// Data bytes held in flight.
    pub fn bytes(&self) -> u64 {
        self.lock().bytes
    }

    /// The age of the oldest message held, from its publication when known, else from when
    /// it was received; `None` when nothing is held. Walks the whole set: for a scrape, not for
    /// the hot path.
    pub fn oldest_age(&self) -> Option<Duration> {
        let (now, wall) = (self.millis(Instant::now()), epoch_millis(SystemTime::now()));
        let oldest = self
            .lock()
            .messages
            .values()
            .map(|held| match held.published {
                UNKNOWN => u64::from(held.age(now)),
                at => u64::try_from(wall.saturating_sub(at)).unwrap_or(0),
            })
            .max();
        oldest.map(Duration::from_millis)
    }

    /// Whether another response may be read: the messages in flight (held, not parked) below
    /// both bounds.
    pub fn has_room(&self) -> bool {
        let s = self.lock();
        (s.messages.len() as u64 - s.parked) < self.max_messages && s.bytes < self.max_bytes
    }

    /// Waits until [`has_room`](Self::has_room).
    pub async fn wait_for_room(&self) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.has_room() {
                return;
            }
            notified.await;
        }
    }

    /// The messages whose lease to extend now, and those held for `max_lease` or longer,
    /// which are dropped from the set (their lease is left to lapse).
    pub fn due(&self, max_lease: Duration) -> (Vec<I>, Vec<I>) {
        let now = self.millis(Instant::now());
        let max_lease = u64::try_from(max_lease.as_millis()).unwrap_or(u64::MAX);
        let mut expired = Vec::new();
        let extend = {
            let mut s = self.lock();
            // Sized once: grown by doubling, the copy of half a million ids would briefly
            // take half as much again.
            let mut extend = Vec::with_capacity(s.messages.len());
            let (mut freed, mut unparked) = (0, 0);
            s.messages.retain(|id, held| {
                if u64::from(held.age(now)) >= max_lease {
                    expired.push(id.clone());
                    if held.parked() {
                        unparked += 1;
                    } else {
                        freed += held.bytes();
                    }
                    false
                } else {
                    extend.push(id.clone());
                    true
                }
            });
            s.bytes -= freed;
            s.parked -= unparked;
            extend
        };
        if !expired.is_empty() {
            self.changed.notify_waiters();
        }
        (extend, expired)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_message_costs_16_bytes_beside_its_id() {
        // Its receipt and publication times as milliseconds, its size and parking in 32 bits:
        // a window that holds half a million messages keeps this many entries
        // (docs/benchmarks.md, "Memory per held message").
        assert_eq!(std::mem::size_of::<Held>(), 16);
        let o = Outstanding::<u32>::new(10, 100);
        o.add(1, u64::from(u32::MAX) + 10);
        assert_eq!(
            o.bytes(),
            u64::from(MAX_BYTES),
            "a count past 31 bits is kept whole"
        );
        o.park(&[1]);
        assert_eq!(
            (o.bytes(), o.parked()),
            (0, 1),
            "parking frees the whole count"
        );
        o.add(2, 7);
        o.remove(&[1, 2]);
        assert_eq!(
            (o.bytes(), o.parked()),
            (0, 0),
            "and removing takes away what was counted"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn ages_stay_exact_when_the_millisecond_clock_wraps() {
        let o = Outstanding::<u32>::new(10, 100);
        // Just before the 32-bit millisecond count wraps (49.7 days after the set was made).
        tokio::time::advance(Duration::from_millis(u64::from(u32::MAX) - 1_000)).await;
        o.add(1, 1);
        tokio::time::advance(Duration::from_secs(3)).await;
        o.add(2, 1);
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(o.oldest(), Some(Instant::now() - Duration::from_secs(7)));
        let (extend, expired) = o.due(Duration::from_secs(5));
        assert_eq!((extend, expired), (vec![2], vec![1]));
    }

    #[test]
    fn room_follows_both_bounds() {
        let o = Outstanding::<String>::new(2, 100);
        assert!(o.has_room());
        o.add("a".to_string(), 10);
        o.add("b".to_string(), 10);
        assert!(!o.has_room(), "count bound");
        o.remove(&["a".to_string()]);
        assert!(o.has_room());
        o.add("c".to_string(), 200);
        assert!(!o.has_room(), "byte bound");
        assert_eq!(o.bytes(), 210);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_stream_wakes_when_messages_are_settled() {
        let o = std::sync::Arc::new(Outstanding::<String>::new(1, 100));
        o.add("a".to_string(), 1);
        let waiter = {
            let o = o.clone();
            tokio::spawn(async move { o.wait_for_room().await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        o.remove(&["a".to_string()]);
        waiter.await.unwrap();
    }

    #[test]
    fn parked_messages_leave_flow_control_but_stay_leased() {
        let o = Outstanding::<String>::new(2, 100);
        o.add("a".to_string(), 60);
        o.add("b".to_string(), 30);
        assert!(!o.has_room());
        o.park(&["a".to_string(), "b".to_string(), "unknown".to_string()]);
        assert!(o.has_room(), "parked messages are not in flight");
        assert_eq!((o.parked(), o.bytes(), o.len()), (2, 0, 2));
        let (extend, expired) = o.due(Duration::from_secs(60));
        assert_eq!(
            (extend.len(), expired.len()),
            (2, 0),
            "their leases are still extended"
        );
        o.remove(&["a".to_string()]);
        assert_eq!((o.parked(), o.len()), (1, 1));
        o.add("c".to_string(), 10);
        o.add("d".to_string(), 10);
        assert!(!o.has_room(), "two in flight again");
    }

    #[tokio::test(start_paused = true)]
    async fn the_oldest_held_id_is_the_one_received_first_until_it_is_settled() {
        let o = Outstanding::<String>::new(10, 100);
        assert_eq!(o.oldest(), None);
        let first = Instant::now();
        o.add("a".to_string(), 1);
        tokio::time::advance(Duration::from_secs(5)).await;
        o.add("b".to_string(), 1);
        assert_eq!(o.oldest(), Some(first));
        o.remove(&["a".to_string()]);
        assert_eq!(o.oldest(), Some(first + Duration::from_secs(5)));
        o.remove(&["b".to_string()]);
        assert_eq!(o.oldest(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn leases_lapse_after_the_maximum() {
        let o = Outstanding::<String>::new(10, 100);
        o.add("old".to_string(), 5);
        tokio::time::advance(Duration::from_secs(30)).await;
        o.add("new".to_string(), 7);
        let (extend, expired) = o.due(Duration::from_secs(60));
        assert_eq!((extend.len(), expired.len()), (2, 0));
        tokio::time::advance(Duration::from_secs(30)).await;
        let (extend, expired) = o.due(Duration::from_secs(60));
        assert_eq!(extend, vec!["new".to_string()]);
        assert_eq!(expired, vec!["old".to_string()]);
        assert_eq!(o.bytes(), 7);
        assert_eq!(o.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_oldest_age_counts_from_publication_when_known() {
        let o = Outstanding::<String>::new(10, 100);
        assert_eq!(o.oldest_age(), None);
        o.add("read".to_string(), 1);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(o.oldest_age(), Some(Duration::from_secs(5)));
        let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
        o.add_published("old".to_string(), 1, Some(an_hour_ago));
        let age = o.oldest_age().expect("held");
        assert!(age >= Duration::from_secs(3600), "{age:?}");
        o.remove(&["old".to_string()]);
        assert_eq!(o.oldest_age(), Some(Duration::from_secs(5)));
    }
}
