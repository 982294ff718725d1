//! The leases of a subscription's messages: the ack deadlines the stream asks for and every
//! extension sets. What a partition holds is the core's [`crate::core::delivery::lease::Outstanding`],
//! keyed by ack id.
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

use std::time::Duration;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_stay_within_the_services_bounds_and_leases_tick_at_a_third() {
        assert_eq!(ack_deadline_seconds(Duration::from_secs(1)), 10);
        assert_eq!(ack_deadline_seconds(Duration::from_secs(6000)), 600);
        assert_eq!(lease_interval(STREAM_ACK_DEADLINE), Duration::from_secs(20));
    }
}
