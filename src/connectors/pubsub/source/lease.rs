//! What one source partition holds: the messages received and not yet settled (acknowledged
//! or nacked), for flow control and lease extension.
//!
//! Flow control is client-side, as in the official subscribers: the stream reads no further
//! response while the partition holds `max_outstanding_messages` messages or
//! `max_outstanding_bytes` data bytes (the same bounds also travel in the StreamingPull
//! request, so the service holds back too). A message leaves when its acknowledgement or nack
//! was sent, or when its lease lapsed (`max_lease_duration`), after which the service delivers
//! it again.
//!
//! Leases: every [`lease_interval`] (a third of the ack deadline) the settler ([`super::acks`]) extends the ack deadline of
//! every held message by the stream's ack deadline ([`STREAM_ACK_DEADLINE`] unless set otherwise; a `ModifyAckDeadline`), until the message is
//! settled or has been held for `max_lease_duration`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// The ack deadline the stream asks for (`stream_ack_deadline_seconds`) and every lease
/// extension sets: 60 s, inside the service's 10–600 s. A killed reader's messages come back
/// to another reader within this time.
pub const STREAM_ACK_DEADLINE: Duration = Duration::from_secs(60);
/// Shortest ack deadline the service takes.
pub const MIN_ACK_DEADLINE: Duration = Duration::from_secs(10);
/// Longest ack deadline the service takes.
pub const MAX_ACK_DEADLINE: Duration = Duration::from_secs(600);

/// `deadline` within the service's 10–600 s, in whole seconds.
pub fn ack_deadline_seconds(deadline: Duration) -> i32 {
    deadline.clamp(MIN_ACK_DEADLINE, MAX_ACK_DEADLINE).as_secs() as i32
}

/// How often held messages are extended for an ack deadline of `deadline`: a third of it, so
/// that one failed extension still leaves time for the next.
pub fn lease_interval(deadline: Duration) -> Duration {
    Duration::from_secs(u64::from(ack_deadline_seconds(deadline).unsigned_abs())) / 3
}

#[derive(Debug)]
struct Held {
    bytes: u64,
    received: Instant,
}

#[derive(Debug, Default)]
struct State {
    messages: HashMap<String, Held>,
    bytes: u64,
}

/// The messages one partition holds, with its flow-control bounds.
#[derive(Debug)]
pub struct Outstanding {
    state: Mutex<State>,
    changed: Notify,
    max_messages: u64,
    max_bytes: u64,
}

impl Outstanding {
    /// An empty set bounded by `max_messages` and `max_bytes`.
    pub fn new(max_messages: u64, max_bytes: u64) -> Self {
        Outstanding {
            state: Mutex::new(State::default()),
            changed: Notify::new(),
            max_messages,
            max_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a received message of `bytes` data bytes.
    pub fn add(&self, ack_id: &str, bytes: u64) {
        let mut s = self.lock();
        let held = Held {
            bytes,
            received: Instant::now(),
        };
        if let Some(old) = s.messages.insert(ack_id.to_string(), held) {
            s.bytes -= old.bytes;
        }
        s.bytes += bytes;
    }

    /// Forgets settled messages and wakes a stream waiting for room. Unknown ids (a lease that
    /// already lapsed) are ignored.
    pub fn remove(&self, ack_ids: &[String]) {
        {
            let mut s = self.lock();
            for id in ack_ids {
                if let Some(old) = s.messages.remove(id) {
                    s.bytes -= old.bytes;
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

    /// Data bytes held.
    pub fn bytes(&self) -> u64 {
        self.lock().bytes
    }

    /// Whether another response may be read: below both bounds.
    pub fn has_room(&self) -> bool {
        let s = self.lock();
        (s.messages.len() as u64) < self.max_messages && s.bytes < self.max_bytes
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
    pub fn due(&self, max_lease: Duration) -> (Vec<String>, Vec<String>) {
        let now = Instant::now();
        let mut extend = Vec::new();
        let mut expired = Vec::new();
        {
            let mut s = self.lock();
            let mut freed = 0;
            s.messages.retain(|id, held| {
                if now.duration_since(held.received) >= max_lease {
                    expired.push(id.clone());
                    freed += held.bytes;
                    false
                } else {
                    extend.push(id.clone());
                    true
                }
            });
            s.bytes -= freed;
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
        let o = Outstanding::new(2, 100);
        assert!(o.has_room());
        o.add("a", 10);
        o.add("b", 10);
        assert!(!o.has_room(), "count bound");
        o.remove(&["a".to_string()]);
        assert!(o.has_room());
        o.add("c", 200);
        assert!(!o.has_room(), "byte bound");
        assert_eq!(o.bytes(), 210);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_stream_wakes_when_messages_are_settled() {
        let o = std::sync::Arc::new(Outstanding::new(1, 100));
        o.add("a", 1);
        let waiter = {
            let o = o.clone();
            tokio::spawn(async move { o.wait_for_room().await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        o.remove(&["a".to_string()]);
        waiter.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn leases_lapse_after_the_maximum() {
        let o = Outstanding::new(10, 100);
        o.add("old", 5);
        tokio::time::advance(Duration::from_secs(30)).await;
        o.add("new", 7);
        let (extend, expired) = o.due(Duration::from_secs(60));
        assert_eq!((extend.len(), expired.len()), (2, 0));
        tokio::time::advance(Duration::from_secs(30)).await;
        let (extend, expired) = o.due(Duration::from_secs(60));
        assert_eq!(extend, vec!["new".to_string()]);
        assert_eq!(expired, vec!["old".to_string()]);
        assert_eq!(o.bytes(), 7);
        assert_eq!(o.len(), 1);
    }
}
