//! The shared flow-control core.
//!
//! Every connector writes through this one engine. A connector supplies a [`Transport`]: how to
//! open a client for a destination, send a batch, classify what came back, recover a missing
//! destination and close a client. The core supplies everything else, and never names a
//! connector:
//!
//! ```text
//! records -> admit (count + byte gate, progress watchdog)
//!         -> route (destination pool: LRU cap, idle eviction, bounded shutdown)
//!         -> batch + send (thresholds; retry/backoff with the SDK's semantics)
//!         -> resolve (ack | retry | NOT_FOUND recovery | rejection -> isolation pass
//!                     -> failure policy (fail | drop | dead letter)
//!                     -> consecutive-rejection breaker) -> metrics
//! flush: wait until nothing admitted is unresolved
//! ```
//!
//! See `docs/architecture.md` for the whole picture.

mod admission;
mod batch;
mod breaker;
pub mod dead_letter;
pub mod delivery;
pub mod metrics;
mod pool;
mod progress;
pub mod rate;
pub mod retry;
pub mod run;
pub mod statement;
mod stop;
pub mod telemetry;
mod writer;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;

pub use dead_letter::{DeadClass, DeadLetterSink, DeadLetters, DeadPayload, DeadRow};
pub use metrics::{SinkMetrics, WriterCounts};
pub use rate::LoadHint;
pub use retry::{Backoff, RetrySettings, retry};
pub use stop::{StopKind, StopSignal};
#[cfg(test)]
pub(crate) use writer::tests::config as test_flow_config;
pub(crate) use writer::write_stream;
pub use writer::{FlowWriter, SourceRow};

/// A 64-bit FNV-1a hash: the same value from every build and platform, unlike the standard
/// library's hasher, for names that must stay put across releases (a progress marker's
/// pipeline, a cached environment's folder).
#[derive(Debug, Clone, Copy)]
pub(crate) struct StableHash(u64);

impl StableHash {
    /// The hash of nothing yet.
    pub(crate) fn new() -> Self {
        StableHash(0xcbf2_9ce4_8422_2325)
    }

    /// Hashes `bytes` in.
    pub(crate) fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 ^= u64::from(byte);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    /// The hash of what was written.
    pub(crate) fn finish(self) -> u64 {
        self.0
    }
}

/// A destination: the full resource name of a topic, queue or table.
pub type Destination = Arc<str>;

/// One encoded record handed to the core.
#[derive(Debug, Clone)]
pub struct Envelope<R> {
    /// The connector's record (a message, a task, a row mutation).
    pub record: R,
    /// The bytes this record counts against the in-flight byte cap and the batch byte threshold
    /// (the serialized protobuf size of what is sent for it).
    pub bytes: u64,
    /// Where it goes.
    pub destination: Destination,
    /// Records sharing a sequence key (a Pub/Sub ordering key) are sent in admission order,
    /// with at most one batch of that key in flight, and a key's failure is repaired before
    /// later records of that key are sent.
    pub sequence_key: Option<Arc<str>>,
    /// Records without a sequence key that share a serial key (a Bigtable row key under
    /// `timestamp_column`) are never in flight together: a record of a serial key joins a batch
    /// only once the previous record of that key is resolved, so they land in admission order.
    /// Unlike a sequence key, records of different serial keys share batches (see ADR 0031).
    /// Ignored on a record that has a sequence key (which already keeps that order).
    pub serial_key: Option<Arc<[u8]>>,
    /// The delivery handle of the batch the row came from, when its input must hear how its
    /// rows ended ([`delivery`]): settled once the record is delivered, dead-lettered or
    /// dropped.
    pub handle: Option<Arc<dyn delivery::DeliveryHandle>>,
}

/// What a send returned.
#[derive(Debug)]
pub enum SendOutcome {
    /// One status for the whole batch.
    Whole(std::result::Result<(), tonic::Status>),
    /// One status per record, in the order of the batch (Bigtable `MutateRows`).
    PerRecord(Vec<std::result::Result<(), tonic::Status>>),
}

/// How the core treats a status. Classification is kept apart from timing: the core decides
/// when to retry from the class and the connector's [`RetrySettings`]/[`RecoverySettings`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Delivered.
    Ok,
    /// Delivered earlier (a named Cloud Tasks task that already exists); counted as delivered
    /// and as de-duplicated.
    Duplicate,
    /// Transient: retried under the retry settings.
    Retryable,
    /// The destination is missing: handled by the recovery path (creation when asked, then a
    /// re-send under the recovery backoff), else fatal.
    NotFound,
    /// The service refused the records themselves: isolation pass, then the failure policy.
    Rejected,
    /// A configuration or permission problem: fails the statement.
    Fatal,
}

/// What to do with records the service confirmed it refuses (and rows the encoder rejects).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailurePolicy {
    /// Fail the statement at the first confirmed rejection (the default).
    #[default]
    Fail,
    /// Drop the record, count it, and go on (bounded by the consecutive-rejection breaker).
    Drop,
    /// Hand the row to the writer's [`DeadLetterSink`], count it, and go on (bounded by the
    /// same breaker as `Drop`); a dead-letter write that fails fails the statement.
    DeadLetter,
}

/// Batch thresholds: a batch is sent on whichever arrives first.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchThresholds {
    /// Records per batch.
    pub max_records: usize,
    /// Bytes per batch (sum of [`Envelope::bytes`]).
    pub max_bytes: u64,
    /// How long the first record of a batch waits for the batch to fill.
    pub max_delay: Duration,
}

/// The recovery path for a missing destination.
#[derive(Debug, Clone, PartialEq)]
pub struct RecoverySettings {
    /// Backoff between re-sends.
    pub backoff: Backoff,
    /// Attempts of the re-send, the first included.
    pub max_attempts: u32,
    /// The option that sets `max_attempts`, named in the error when the budget runs out.
    pub attempts_option: &'static str,
    /// Whether to ask the transport to create the destination before re-sending.
    pub create: bool,
}

impl RecoverySettings {
    /// A recovery whose backoff grows by `multiplier` from `initial` up to `max`, with
    /// `max_attempts` (the first send included; values below 1 count as 1) named by
    /// `attempts_option` when they run out.
    pub fn new(
        initial: std::time::Duration,
        max: std::time::Duration,
        multiplier: f64,
        max_attempts: i32,
        attempts_option: &'static str,
        create: bool,
    ) -> Self {
        RecoverySettings {
            backoff: Backoff {
                initial,
                max,
                multiplier,
            },
            max_attempts: u32::try_from(max_attempts).unwrap_or(1).max(1),
            attempts_option,
            create,
        }
    }
}

/// Everything the core needs to know, filled from a connector's options.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowConfig {
    /// In-flight record cap (admitted, not yet resolved, including those parked for retry).
    pub max_in_flight_records: usize,
    /// In-flight byte cap; `u64::MAX` bounds by count only. A record larger than the cap is
    /// admitted alone.
    pub max_in_flight_bytes: u64,
    /// The option names reported when a cap is involved (for messages and metrics docs).
    pub in_flight_option: &'static str,
    /// No-progress budget while waiting; `None` never times out.
    pub progress_timeout: Option<Duration>,
    /// The option that sets `progress_timeout`.
    pub progress_option: &'static str,
    /// Budget of one release (eviction or close), shared by every client it covers.
    pub shutdown_timeout: Duration,
    /// The option that sets `shutdown_timeout`.
    pub shutdown_option: &'static str,
    /// Open destinations cap (LRU eviction beyond it).
    pub max_active_destinations: usize,
    /// Idle destinations are released after a successful non-terminal flush.
    pub destination_idle_timeout: Duration,
    /// Register per-destination counters.
    pub per_destination_metrics: bool,
    /// Consecutive confirmed rejections that fail the statement; `None` is unbounded.
    pub max_consecutive_rejections: Option<u64>,
    /// The option that sets `max_consecutive_rejections`.
    pub breaker_option: &'static str,
    /// Batch thresholds.
    pub batch: BatchThresholds,
    /// Retry of [`Class::Retryable`] outcomes.
    pub retry: RetrySettings,
    /// The option(s) that set the retry budget, named when it runs out; `None` when the budget
    /// is fixed by the connector rather than set by an option.
    pub retry_option: Option<&'static str>,
    /// Recovery of [`Class::NotFound`] outcomes; `None` makes NOT_FOUND fatal.
    pub not_found: Option<RecoverySettings>,
    /// Failure policy for rejected records.
    pub failure_policy: FailurePolicy,
    /// Concurrent send RPCs the writer may have outstanding (across destinations); the byte cap
    /// lowers it further (see [`FlowConfig::concurrent_send_cap`]).
    pub max_concurrent_sends: usize,
    /// Records the writer admits per second at most ([`rate::RateLimiter`]); `None`: no rate
    /// limit. Retries do not count.
    pub max_records_per_second: Option<f64>,
}

/// The share of `max_in_flight_bytes` that one outstanding send RPC stands for: the writer keeps
/// at most `max_in_flight_bytes / RPC_BYTE_CHARGE` RPCs outstanding (see
/// [`FlowConfig::concurrent_send_cap`]). An RPC holds memory the record bytes do not show (its
/// encoded request, its HTTP/2 stream, its task); without this cap, records each large enough to
/// be sent alone made one RPC each, tens of thousands at once under a 64 MiB cap.
pub const RPC_BYTE_CHARGE: u64 = 256 * 1024;

/// The fewest concurrent send RPCs the byte cap leaves a writer (a small cap still keeps this
/// many RPCs outstanding; at most `max_concurrent_sends`).
pub const MIN_CONCURRENT_SENDS: usize = 16;

impl FlowConfig {
    /// Send RPCs the writer keeps outstanding at once: one per [`RPC_BYTE_CHARGE`] of
    /// `max_in_flight_bytes`, at least [`MIN_CONCURRENT_SENDS`], and never more than
    /// `max_concurrent_sends` (nor less than one). A count-only gate (`u64::MAX` bytes) leaves
    /// `max_concurrent_sends` alone.
    pub fn concurrent_send_cap(&self) -> usize {
        let by_bytes = usize::try_from(self.max_in_flight_bytes / RPC_BYTE_CHARGE)
            .unwrap_or(usize::MAX)
            .max(MIN_CONCURRENT_SENDS);
        self.max_concurrent_sends.min(by_bytes).max(1)
    }

    /// The settings one of `writers` writers of a statement runs with: the caps that bound the
    /// statement (what the service sees and what the process holds) divided among its writers,
    /// so that together they stay within the configured values whatever the partition count
    /// (see ADR 0030). Split: `max_in_flight_records`, `max_in_flight_bytes` (a count-only
    /// gate stays count-only), `max_concurrent_sends` and `max_records_per_second`. A count or
    /// byte share is the total divided and rounded up (so the writers' shares add up to at most
    /// `writers - 1` more than the total), and at least 1; the rate share is the rate divided
    /// exactly. Everything else (batch thresholds, retry budgets, timeouts, the destination
    /// cap, the breaker) stays per writer. `writers` of 0 or 1 returns the settings unchanged.
    pub fn share_of(&self, writers: usize) -> FlowConfig {
        let mut share = self.clone();
        if writers <= 1 {
            return share;
        }
        let n = writers as u64;
        let split = |total: usize| total.div_ceil(writers).max(1);
        share.max_in_flight_records = split(self.max_in_flight_records);
        share.max_concurrent_sends = split(self.max_concurrent_sends);
        if self.max_in_flight_bytes != u64::MAX {
            share.max_in_flight_bytes = self.max_in_flight_bytes.div_ceil(n).max(1);
        }
        share.max_records_per_second = self.max_records_per_second.map(|r| r / writers as f64);
        share
    }
}

/// What a connector supplies to the core: the RPC side of one sink.
///
/// Implementations hold no per-statement state beyond their clients; the core calls them from
/// several tasks at once.
#[async_trait]
pub trait Transport: Send + Sync + 'static {
    /// The encoded record (a `PubsubMessage`, a `Task`, a `MutateRowsRequest` entry).
    type Record: Send + Sync + 'static;
    /// The per-destination client (a publisher, a queue client, a table client).
    type Client: Send + Sync + 'static;

    /// The RPC's name, for errors and tracing (`"Publish"`).
    fn operation(&self) -> &'static str;

    /// Opens a client for `destination`. Called lazily, when the first record for it arrives.
    async fn open(&self, destination: &Destination) -> Result<Self::Client>;

    /// Sends one batch. `timeout` is the per-attempt RPC deadline (`None`: no deadline); the
    /// core also enforces it around the returned future.
    async fn send(
        &self,
        client: &Self::Client,
        destination: &Destination,
        batch: &[&Self::Record],
        timeout: Option<Duration>,
    ) -> SendOutcome;

    /// Classifies a non-OK status. `solo` says whether the batch held one record.
    fn classify(&self, status: &tonic::Status, solo: bool) -> Class;

    /// Creates a missing destination (the auto-create recovery). Returns `Ok(true)` when it
    /// created it, `Ok(false)` when it already existed.
    async fn create_destination(
        &self,
        client: &Self::Client,
        destination: &Destination,
    ) -> Result<bool>;

    /// Releases a client. The core bounds the wait by the shutdown budget.
    async fn close(&self, client: Self::Client);

    /// The latest request of the service to change the load (Bigtable's `RateLimitInfo`), if
    /// one arrived since the last call; the core asks after every send and slows its admission
    /// rate down accordingly (see [`rate`]). By default the service never asks.
    fn take_load_hint(&self) -> Option<LoadHint> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::StableHash;

    #[test]
    fn the_stable_hash_is_fnv_1a_and_never_changes() {
        // Published FNV-1a 64-bit values: a changed hash would rename every progress marker
        // (a restarted pipeline would start over) and every cached environment.
        let of = |text: &str| {
            let mut h = StableHash::new();
            h.write(text.as_bytes());
            h.finish()
        };
        assert_eq!(of(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(of("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(of("foobar"), 0x8594_4171_f739_67e8);
        let mut parts = StableHash::new();
        parts.write(b"foo");
        parts.write(b"bar");
        assert_eq!(parts.finish(), of("foobar"), "written in parts or at once");
    }
}
