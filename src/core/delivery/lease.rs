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

#[derive(Debug)]
struct Held {
    bytes: u64,
    received: Instant,
    /// Held by a node that waits for a window to close: not counted by flow control.
    parked: bool,
    /// When the service says the message was published.
    published: Option<SystemTime>,
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
    changed: Notify,
    max_messages: u64,
    max_bytes: u64,
}

impl<I> State<I> {
    /// Takes a message that left out of the totals.
    fn forget(&mut self, old: &Held) {
        if old.parked {
            self.parked -= 1;
        } else {
            self.bytes -= old.bytes;
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
            changed: Notify::new(),
            max_messages,
            max_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<I>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a received message of `bytes` data bytes.
    pub fn add(&self, id: I, bytes: u64) {
        self.add_published(id, bytes, None);
    }

    /// Records a received message of `bytes` data bytes, published at `published` when the
    /// service says.
    pub fn add_published(&self, id: I, bytes: u64, published: Option<SystemTime>) {
        let mut s = self.lock();
        let held = Held {
            bytes,
            received: Instant::now(),
            parked: false,
            published,
        };
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
                    && !held.parked
                {
                    held.parked = true;
                    freed += held.bytes;
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
        self.lock()
            .messages
            .values()
            .map(|held| held.received)
            .min()
    }

    /// Data bytes held in flight.
    pub fn bytes(&self) -> u64 {
        self.lock().bytes
    }

    /// The age of the oldest message held, from its publication when known, else from when
    /// it was received; `None` when nothing is held. Walks the whole set: for a scrape, not for
    /// the hot path.
    pub fn oldest_age(&self) -> Option<Duration> {
        let (now, wall) = (Instant::now(), SystemTime::now());
        self.lock()
            .messages
            .values()
            .map(|held| match held.published {
                Some(at) => wall.duration_since(at).unwrap_or_default(),
                None => now.duration_since(held.received),
            })
            .max()
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
        let now = Instant::now();
        let mut extend = Vec::new();
        let mut expired = Vec::new();
        {
            let mut s = self.lock();
            let (mut freed, mut unparked) = (0, 0);
            s.messages.retain(|id, held| {
                if now.duration_since(held.received) >= max_lease {
                    expired.push(id.clone());
                    if held.parked {
                        unparked += 1;
                    } else {
                        freed += held.bytes;
                    }
                    false
                } else {
                    extend.push(id.clone());
                    true
                }
            });
            s.bytes -= freed;
            s.parked -= unparked;
        }
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
