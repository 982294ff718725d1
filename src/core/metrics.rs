//! The sink's metrics: one inventory for every connector.
//!
//! Every metric is registered in the sink's DataFusion [`ExecutionPlanMetricsSet`] (what
//! `EXPLAIN ANALYZE` shows) under a name from [`names`], so a test can assert a metric by its
//! registered name (the core's own tests also read them all at once, as plain numbers).
//!
//! Status-code and per-destination counters are created on first use, with a label
//! (`code=UNAVAILABLE`, `destination=<name>`), and kept for the sink's lifetime.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use datafusion::common::format::MetricType;
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, MetricValue, Time,
};

/// Registered metric names.
pub mod names {
    /// Records handed to the service, each counted once at its first send (never per retry).
    pub const RECORDS_SENT: &str = "records_sent";
    /// A source's node: messages read from the service.
    pub const SOURCE_MESSAGES_READ: &str = "source_messages_read";
    /// A source's node: messages acknowledged (every row made from them settled).
    pub const SOURCE_MESSAGES_ACKED: &str = "source_messages_acked";
    /// A source's node: messages handed back for another reader (nacked).
    pub const SOURCE_MESSAGES_NACKED: &str = "source_messages_nacked";
    /// A source's node: of the acknowledged messages, those the service confirmed id by id
    /// (a subscription with exactly-once delivery).
    pub const SOURCE_MESSAGES_ACK_CONFIRMED: &str = "source_messages_ack_confirmed";
    /// A source's node: acknowledgements the service refused for good (their lease lapsed).
    pub const SOURCE_MESSAGES_ACK_REFUSED: &str = "source_messages_ack_refused";
    /// A source's node (a gauge): the age, in milliseconds, of the oldest message it holds
    /// unacknowledged (0 when it holds none): its backlog age.
    pub const SOURCE_OLDEST_UNACKED_MS: &str = "source_oldest_unacked_ms";
    /// Records the service acknowledged (delivered or de-duplicated).
    pub const RECORDS_ACKED: &str = "records_acked";
    /// Bytes of the records handed to the service, each record counted once.
    pub const BYTES_SENT: &str = "bytes_sent";
    /// Records whose send attempt came back with an error (per record, per failed attempt).
    pub const SEND_ERRORS: &str = "send_errors";
    /// Send errors by gRPC status code, labelled `code=<CODE>`.
    pub const SEND_ERRORS_BY_CODE: &str = "send_errors_by_code";
    /// Retried send RPCs (the retry timing of the transient path and of recovery).
    pub const RETRIES: &str = "retries";
    /// Records the service refused, confirmed by sending them alone.
    pub const RECORDS_REJECTED: &str = "records_rejected";
    /// Records dropped by the `drop` failure policy.
    pub const RECORDS_DROPPED: &str = "records_dropped";
    /// Rows the encoder rejected (serializer rejections) skipped under the `drop` policy.
    pub const RECORDS_SKIPPED: &str = "records_skipped";
    /// Rows handed to the dead-letter destination under the `dead_letter` policy: rows the
    /// encoder rejected and records the service refused (confirmed alone).
    pub const RECORDS_DEAD_LETTERED: &str = "records_dead_lettered";
    /// Gauge: records admitted and not yet resolved (parked ones included).
    pub const IN_FLIGHT_RECORDS: &str = "in_flight_records";
    /// Gauge: bytes admitted and not yet resolved.
    pub const IN_FLIGHT_BYTES: &str = "in_flight_bytes";
    /// Gauge: the highest `in_flight_records` seen.
    pub const IN_FLIGHT_RECORDS_HIGH_WATER: &str = "in_flight_records_high_water";
    /// Gauge: the highest `in_flight_bytes` seen.
    pub const IN_FLIGHT_BYTES_HIGH_WATER: &str = "in_flight_bytes_high_water";
    /// Gauge: records waiting out a retry or recovery backoff.
    pub const PARKED_FOR_RETRY: &str = "parked_for_retry";
    /// Destinations (topics, tables, families, queues) the sink created.
    pub const RESOURCES_CREATED: &str = "resources_created";
    /// Destinations whose client the writer released while running: idle ones at a flush
    /// point, least-recently-used ones at the `max_active_*` cap.
    pub const DESTINATIONS_RELEASED: &str = "destinations_released";
    /// Flush points the writer completed (`flush_interval`, `flush_rows`).
    pub const FLUSH_POINTS: &str = "flush_points";
    /// Records the service reported as already delivered.
    pub const RECORDS_DEDUPLICATED: &str = "records_deduplicated";
    /// Send RPC attempts.
    pub const SEND_RPCS: &str = "send_rpcs";
    /// The send RPC latencies added up. RPCs run concurrently, so this exceeds the
    /// statement's elapsed time on a busy writer (its name says it is a sum).
    pub const SEND_TIME: &str = "rpc_latency_sum";
    /// Per-destination records sent, labelled `destination=<name>` (only when asked for).
    pub const RECORDS_SENT_BY_DESTINATION: &str = "records_sent_by_destination";
    /// Per-destination send errors, labelled `destination=<name>` (only when asked for).
    pub const SEND_ERRORS_BY_DESTINATION: &str = "send_errors_by_destination";
    /// Retried send RPCs by the gRPC status code that caused the retry, labelled
    /// `code=<CODE>`.
    pub const RETRIES_BY_CODE: &str = "retries_by_code";
    /// Time the writer's admission waited on its rate limit (`max_*_per_second` and the
    /// service's load hints).
    pub const THROTTLED_TIME: &str = "throttled_time";
    /// Label of [`SEND_ERRORS_BY_CODE`] and [`RETRIES_BY_CODE`].
    pub const CODE_LABEL: &str = "code";
    /// Label of the per-destination counters.
    pub const DESTINATION_LABEL: &str = "destination";
}

/// The sink's counters and gauges. Cheap to clone: clones share the same metrics.
///
/// ```
/// use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
/// use gcp_sql::core::SinkMetrics;
///
/// let set = ExecutionPlanMetricsSet::new();
/// let _metrics = SinkMetrics::new(&set);
/// // Registered at once, read by name (what `EXPLAIN ANALYZE` shows).
/// assert_eq!(set.clone_inner().sum_by_name("resources_created").map(|v| v.as_usize()), Some(0));
/// ```
#[derive(Debug, Clone)]
pub struct SinkMetrics {
    set: ExecutionPlanMetricsSet,
    /// The writer's partition, on every metric this registers later (the labelled ones).
    partition: Option<usize>,
    records_sent: Count,
    records_acked: Count,
    bytes_sent: Gauge,
    send_errors: Count,
    retries: Count,
    records_rejected: Count,
    records_dropped: Count,
    records_skipped: Count,
    records_dead_lettered: Count,
    in_flight_records: Gauge,
    in_flight_bytes: Gauge,
    in_flight_records_high_water: Gauge,
    in_flight_bytes_high_water: Gauge,
    parked_for_retry: Gauge,
    resources_created: Count,
    destinations_released: Count,
    flush_points: Count,
    records_deduplicated: Count,
    send_rpcs: Count,
    send_time: Time,
    throttled_time: Time,
    by_code: Arc<Mutex<HashMap<tonic::Code, Count>>>,
    retries_by_code: Arc<Mutex<HashMap<tonic::Code, Count>>>,
    by_destination: Arc<Mutex<HashMap<String, (Count, Count)>>>,
    /// Send latencies, for the exporter ([`SinkMetrics::reading`]).
    latency: Arc<LatencyHistogram>,
    /// Whether the writer reaches its service, for readiness ([`SinkMetrics::reading`]).
    health: Arc<WriterHealth>,
}

/// A writer's counters at one moment ([`SinkMetrics::counts`]): what a flush point reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterCounts {
    /// Records handed to the service (each once).
    pub sent: u64,
    /// Records the service acknowledged.
    pub acknowledged: u64,
    /// Records admitted and not yet resolved.
    pub in_flight: u64,
    /// Rows the encoder rejected that the `drop` policy skipped.
    pub skipped: u64,
    /// Records the service refused that the `drop` policy dropped.
    pub dropped: u64,
    /// Records the service refused (confirmed alone).
    pub rejected: u64,
    /// Rows the `dead_letter` policy handed to the dead-letter destination (encoder and
    /// service rejections).
    pub dead_lettered: u64,
    /// Retried sends.
    pub retries: u64,
    /// Destinations released while running.
    pub destinations_released: u64,
    /// Destinations the writer created.
    pub resources_created: u64,
}

/// Plain numbers read from a [`SinkMetrics`].
#[cfg(test)]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[allow(missing_docs)] // each field is the metric of the same name in [`names`]
pub(crate) struct MetricsSnapshot {
    pub records_sent: u64,
    pub records_acked: u64,
    pub bytes_sent: u64,
    pub send_errors: u64,
    pub retries: u64,
    pub records_rejected: u64,
    pub records_dropped: u64,
    pub records_skipped: u64,
    pub records_dead_lettered: u64,
    pub in_flight_records: u64,
    pub in_flight_bytes: u64,
    pub in_flight_records_high_water: u64,
    pub in_flight_bytes_high_water: u64,
    pub parked_for_retry: u64,
    pub resources_created: u64,
    pub records_deduplicated: u64,
    pub send_rpcs: u64,
    /// Sum of the send RPC latencies.
    pub send_time: Duration,
    /// Send errors by status code.
    pub send_errors_by_code: HashMap<tonic::Code, u64>,
}

#[cfg(test)]
fn n(v: usize) -> u64 {
    v as u64
}

fn us(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

impl SinkMetrics {
    /// Registers the sink's metrics in `set`, for no partition in particular.
    pub fn new(set: &ExecutionPlanMetricsSet) -> Self {
        Self::registered(set, None)
    }

    /// Registers the metrics of the writer of `partition` in `set`: `EXPLAIN ANALYZE` sums them
    /// over the partitions, and lists them per partition in its verbose form.
    pub fn for_partition(set: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        Self::registered(set, Some(partition))
    }

    fn registered(set: &ExecutionPlanMetricsSet, partition: Option<usize>) -> Self {
        let builder = move || {
            let b = MetricBuilder::new(set);
            match partition {
                Some(p) => b.with_partition(p),
                None => b,
            }
        };
        // The metrics `SET datafusion.explain.analyze_level = 'summary'` keeps: what was
        // delivered, what went wrong, and how many writers; the rest are `dev` (the default
        // level shows both).
        let summary = |name: &str| {
            matches!(
                name,
                names::RECORDS_SENT
                    | names::RECORDS_ACKED
                    | names::BYTES_SENT
                    | names::SEND_ERRORS
                    | names::RETRIES
                    | names::RECORDS_DROPPED
                    | names::RECORDS_SKIPPED
                    | names::RECORDS_DEAD_LETTERED
                    | names::SEND_RPCS
                    | names::SEND_TIME
            )
        };
        let typed = move |name: &'static str| {
            let b = builder();
            if summary(name) {
                b.with_type(MetricType::Summary)
            } else {
                b
            }
        };
        let counter = |name: &'static str| typed(name).global_counter(name);
        let gauge = |name: &'static str| typed(name).global_gauge(name);
        // Byte metrics shown as sizes (`4.3 MB`) rather than counts (`4.49 M`): DataFusion's
        // named gauge in bytes, summed over partitions and read by name like the others.
        let bytes = |name: &'static str| {
            let gauge = Gauge::new();
            typed(name).build(MetricValue::PeakMemoryUsage {
                name: name.into(),
                gauge: gauge.clone(),
            });
            gauge
        };
        let time = |name: &'static str| {
            let time = Time::new();
            typed(name).build(MetricValue::Time {
                name: name.into(),
                time: time.clone(),
            });
            time
        };
        let send_time = time(names::SEND_TIME);
        let throttled_time = time(names::THROTTLED_TIME);
        SinkMetrics {
            set: set.clone(),
            partition,
            records_sent: counter(names::RECORDS_SENT),
            records_acked: counter(names::RECORDS_ACKED),
            bytes_sent: bytes(names::BYTES_SENT),
            send_errors: counter(names::SEND_ERRORS),
            retries: counter(names::RETRIES),
            records_rejected: counter(names::RECORDS_REJECTED),
            records_dropped: counter(names::RECORDS_DROPPED),
            records_skipped: counter(names::RECORDS_SKIPPED),
            records_dead_lettered: counter(names::RECORDS_DEAD_LETTERED),
            in_flight_records: gauge(names::IN_FLIGHT_RECORDS),
            in_flight_bytes: bytes(names::IN_FLIGHT_BYTES),
            in_flight_records_high_water: gauge(names::IN_FLIGHT_RECORDS_HIGH_WATER),
            in_flight_bytes_high_water: bytes(names::IN_FLIGHT_BYTES_HIGH_WATER),
            parked_for_retry: gauge(names::PARKED_FOR_RETRY),
            resources_created: counter(names::RESOURCES_CREATED),
            destinations_released: counter(names::DESTINATIONS_RELEASED),
            flush_points: counter(names::FLUSH_POINTS),
            records_deduplicated: counter(names::RECORDS_DEDUPLICATED),
            send_rpcs: counter(names::SEND_RPCS),
            send_time,
            throttled_time,
            by_code: Arc::default(),
            retries_by_code: Arc::default(),
            by_destination: Arc::default(),
            latency: Arc::default(),
            health: Arc::default(),
        }
    }

    /// Counts a resource (topic, table, column family, queue) the sink created: called when
    /// [`Transport::create_destination`](super::Transport::create_destination) returns
    /// `Ok(true)`.
    pub(crate) fn resource_created(&self) {
        self.resources_created.add(1);
    }

    /// Counts destinations released while the writer runs (idle, or at the cap).
    pub(crate) fn destinations_released(&self, n: usize) {
        self.destinations_released.add(n);
    }

    /// Counts a completed flush point.
    pub(crate) fn flush_point(&self) {
        self.flush_points.add(1);
    }

    /// The writer's counters as they are now, read without stopping it.
    pub fn counts(&self) -> WriterCounts {
        let v = |c: &Count| c.value() as u64;
        WriterCounts {
            sent: v(&self.records_sent),
            acknowledged: v(&self.records_acked),
            in_flight: self.in_flight_records.value() as u64,
            skipped: v(&self.records_skipped),
            dropped: v(&self.records_dropped),
            rejected: v(&self.records_rejected),
            dead_lettered: v(&self.records_dead_lettered),
            retries: v(&self.retries),
            destinations_released: v(&self.destinations_released),
            resources_created: v(&self.resources_created),
        }
    }

    /// Per destination, the records sent and the send errors, when `per_destination_metrics`
    /// is on (empty otherwise), sorted by destination.
    pub fn per_destination(&self) -> Vec<(String, u64, u64)> {
        let map = self
            .by_destination
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<(String, u64, u64)> = map
            .iter()
            .map(|(d, (sent, errors))| (d.clone(), sent.value() as u64, errors.value() as u64))
            .collect();
        out.sort();
        out
    }

    /// Counts a row the encoder rejected and the `drop` policy skipped.
    pub(crate) fn record_skipped(&self) {
        self.records_skipped.add(1);
    }

    pub(crate) fn sent(&self, destination: &str, records: u64, bytes: u64, per_destination: bool) {
        self.records_sent.add(us(records));
        self.bytes_sent.add(us(bytes));
        if per_destination {
            self.destination_counters(destination).0.add(us(records));
        }
    }

    pub(crate) fn send_error(
        &self,
        destination: &str,
        code: tonic::Code,
        records: u64,
        per_destination: bool,
    ) {
        self.send_errors.add(us(records));
        self.coded(&self.by_code, names::SEND_ERRORS_BY_CODE, code)
            .add(us(records));
        if per_destination {
            self.destination_counters(destination).1.add(us(records));
        }
    }

    /// The counter of `code` in `map`, registered as `name` with a `code` label on first use.
    fn coded(
        &self,
        map: &Mutex<HashMap<tonic::Code, Count>>,
        name: &'static str,
        code: tonic::Code,
    ) -> Count {
        let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(code)
            .or_insert_with(|| {
                self.builder()
                    .with_new_label(names::CODE_LABEL, code_name(code))
                    .global_counter(name)
            })
            .clone()
    }

    fn destination_counters(&self, destination: &str) -> (Count, Count) {
        let mut map = self
            .by_destination
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        map.entry(destination.to_string())
            .or_insert_with(|| {
                let label = || {
                    self.builder()
                        .with_new_label(names::DESTINATION_LABEL, destination.to_string())
                };
                (
                    label().global_counter(names::RECORDS_SENT_BY_DESTINATION),
                    label().global_counter(names::SEND_ERRORS_BY_DESTINATION),
                )
            })
            .clone()
    }

    fn builder(&self) -> MetricBuilder<'_> {
        let b = MetricBuilder::new(&self.set);
        match self.partition {
            Some(p) => b.with_partition(p),
            None => b,
        }
    }

    pub(crate) fn acked(&self, records: u64, duplicates: u64) {
        self.records_acked.add(us(records));
        self.records_deduplicated.add(us(duplicates));
    }

    /// A send RPC is about to go on the wire.
    pub(crate) fn rpc_started(&self) {
        self.health.started();
    }

    /// A send RPC came back after `latency`; `answered` says whether the service answered it
    /// (any status but a transport failure: `UNAVAILABLE`, `DEADLINE_EXCEEDED`).
    pub(crate) fn rpc(&self, latency: Duration, answered: bool) {
        self.send_rpcs.add(1);
        self.send_time.add_duration(latency);
        self.latency.observe(latency);
        self.health.completed(answered);
    }

    /// A send is retried because of `code`.
    pub(crate) fn retried(&self, code: tonic::Code) {
        self.retries.add(1);
        self.coded(&self.retries_by_code, names::RETRIES_BY_CODE, code)
            .add(1);
    }

    /// The writer's admission waited `waited` on its rate limit.
    pub(crate) fn throttled(&self, waited: Duration) {
        if !waited.is_zero() {
            self.throttled_time.add_duration(waited);
        }
    }

    /// The writer failed (its first failure); `breaker` when the rejection breaker tripped.
    pub(crate) fn writer_failed(&self, breaker: bool) {
        self.health.failed(breaker);
    }

    /// Everything the exporter reads of this writer, now ([`crate::core::telemetry`]).
    pub fn reading(&self) -> SinkReading {
        let v = |c: &Count| c.value() as u64;
        let codes = |map: &Mutex<HashMap<tonic::Code, Count>>| {
            map.lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .map(|(code, c)| (code_name(*code), v(c)))
                .collect()
        };
        SinkReading {
            records_sent: v(&self.records_sent),
            records_acked: v(&self.records_acked),
            records_deduplicated: v(&self.records_deduplicated),
            bytes_sent: self.bytes_sent.value() as u64,
            send_errors_by_code: codes(&self.by_code),
            retries_by_code: codes(&self.retries_by_code),
            records_rejected: v(&self.records_rejected),
            records_dropped: v(&self.records_dropped),
            records_skipped: v(&self.records_skipped),
            records_dead_lettered: v(&self.records_dead_lettered),
            in_flight_records: self.in_flight_records.value() as u64,
            in_flight_bytes: self.in_flight_bytes.value() as u64,
            resources_created: v(&self.resources_created),
            send_rpcs: v(&self.send_rpcs),
            throttled: Duration::from_nanos(self.throttled_time.value() as u64),
            latency: self.latency.snapshot(),
            health: self.health.snapshot(),
        }
    }

    pub(crate) fn rejected_and_dropped(&self) {
        self.records_rejected.add(1);
        self.records_dropped.add(1);
    }

    /// A record the service refused, handed to the dead-letter destination.
    pub(crate) fn rejected_and_dead_lettered(&self) {
        self.records_rejected.add(1);
        self.records_dead_lettered.add(1);
    }

    /// A row the encoder rejected, handed to the dead-letter destination.
    pub(crate) fn encoding_dead_lettered(&self) {
        self.records_dead_lettered.add(1);
    }

    pub(crate) fn rejected(&self) {
        self.records_rejected.add(1);
    }

    pub(crate) fn parked(&self, records: u64) {
        self.parked_for_retry.add(us(records));
    }

    pub(crate) fn unparked(&self, records: u64) {
        self.parked_for_retry.sub(us(records));
    }

    pub(crate) fn set_in_flight(&self, records: u64, bytes: u64) {
        self.in_flight_records.set(us(records));
        self.in_flight_bytes.set(us(bytes));
        self.in_flight_records_high_water.set_max(us(records));
        self.in_flight_bytes_high_water.set_max(us(bytes));
    }

    /// Reads every metric as plain numbers.
    #[cfg(test)]
    pub(crate) fn snapshot(&self) -> MetricsSnapshot {
        let by_code = self.by_code.lock().unwrap_or_else(|p| p.into_inner());
        MetricsSnapshot {
            records_sent: n(self.records_sent.value()),
            records_acked: n(self.records_acked.value()),
            bytes_sent: n(self.bytes_sent.value()),
            send_errors: n(self.send_errors.value()),
            retries: n(self.retries.value()),
            records_rejected: n(self.records_rejected.value()),
            records_dropped: n(self.records_dropped.value()),
            records_skipped: n(self.records_skipped.value()),
            records_dead_lettered: n(self.records_dead_lettered.value()),
            in_flight_records: n(self.in_flight_records.value()),
            in_flight_bytes: n(self.in_flight_bytes.value()),
            in_flight_records_high_water: n(self.in_flight_records_high_water.value()),
            in_flight_bytes_high_water: n(self.in_flight_bytes_high_water.value()),
            parked_for_retry: n(self.parked_for_retry.value()),
            resources_created: n(self.resources_created.value()),
            records_deduplicated: n(self.records_deduplicated.value()),
            send_rpcs: n(self.send_rpcs.value()),
            send_time: Duration::from_nanos(n(self.send_time.value())),
            send_errors_by_code: by_code.iter().map(|(c, v)| (*c, n(v.value()))).collect(),
        }
    }
}

pub(crate) use crate::error::code_name;

/// Upper bounds, in seconds, of the send latency histogram's buckets (a last one, `+Inf`,
/// takes the rest): from 1 ms, where a loopback emulator answers, to 60 s, Pub/Sub's longest
/// attempt deadline.
pub const LATENCY_BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// A histogram of send latencies: one atomic counter per bucket of [`LATENCY_BUCKETS`] and
/// one for the rest, and the sum. Observing takes no lock.
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
}

impl LatencyHistogram {
    /// Counts one latency.
    pub fn observe(&self, latency: Duration) {
        let seconds = latency.as_secs_f64();
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The counts now.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut snapshot = HistogramSnapshot::default();
        for (i, bucket) in self.buckets.iter().enumerate() {
            snapshot.buckets[i] = bucket.load(Ordering::Relaxed);
        }
        snapshot.sum = Duration::from_nanos(self.sum_nanos.load(Ordering::Relaxed));
        snapshot
    }
}

/// A [`LatencyHistogram`] read at one moment; adds up over writers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Observations per bucket (not cumulative), the bounds of [`LATENCY_BUCKETS`] then `+Inf`.
    pub buckets: [u64; LATENCY_BUCKETS.len() + 1],
    /// The latencies added up.
    pub sum: Duration,
}

impl HistogramSnapshot {
    /// Observations in all.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// Adds `other`'s observations to these.
    pub fn add(&mut self, other: &HistogramSnapshot) {
        for (mine, theirs) in self.buckets.iter_mut().zip(other.buckets) {
            *mine += theirs;
        }
        self.sum += other.sum;
    }
}

/// Nanoseconds since the first call in this process, on the monotonic clock.
fn monotonic_nanos() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(std::time::Instant::now);
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Whether a writer reaches its service: its send RPCs on the wire, when one last came back,
/// whether the service answered the last one, and whether the writer failed.
#[derive(Debug, Default)]
struct WriterHealth {
    on_the_wire: AtomicU64,
    /// [`monotonic_nanos`] of the last completion, or of the start of a send when none was
    /// on the wire.
    last_progress: AtomicU64,
    /// The last send that came back got no answer from the service.
    unanswered: AtomicBool,
    /// 0: running; 1: failed; 2: failed because the rejection breaker tripped.
    failed: AtomicU8,
}

impl WriterHealth {
    fn started(&self) {
        if self.on_the_wire.fetch_add(1, Ordering::AcqRel) == 0 {
            self.last_progress
                .store(monotonic_nanos(), Ordering::Release);
        }
    }

    fn completed(&self, answered: bool) {
        self.last_progress
            .store(monotonic_nanos(), Ordering::Release);
        self.unanswered.store(!answered, Ordering::Release);
        self.on_the_wire.fetch_sub(1, Ordering::AcqRel);
    }

    fn failed(&self, breaker: bool) {
        self.failed
            .store(if breaker { 2 } else { 1 }, Ordering::Release);
    }

    fn snapshot(&self) -> WriterHealthSnapshot {
        let on_the_wire = self.on_the_wire.load(Ordering::Acquire);
        let since = self.last_progress.load(Ordering::Acquire);
        let failed = self.failed.load(Ordering::Acquire);
        WriterHealthSnapshot {
            sends_on_the_wire: on_the_wire,
            waiting: if on_the_wire > 0 {
                Duration::from_nanos(monotonic_nanos().saturating_sub(since))
            } else {
                Duration::ZERO
            },
            unanswered: self.unanswered.load(Ordering::Acquire),
            failed: failed > 0,
            breaker_open: failed == 2,
        }
    }
}

/// Whether a writer reaches its service, read at one moment ([`SinkReading::health`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterHealthSnapshot {
    /// Send RPCs on the wire now.
    pub sends_on_the_wire: u64,
    /// With sends on the wire: how long since a send last came back (or since the oldest of
    /// them left, when none came back since); zero with none on the wire.
    pub waiting: Duration,
    /// The last send that came back got no answer from the service (`UNAVAILABLE`,
    /// `DEADLINE_EXCEEDED`: it was not reached).
    pub unanswered: bool,
    /// The writer failed.
    pub failed: bool,
    /// It failed because its consecutive-rejection breaker tripped.
    pub breaker_open: bool,
}

/// Everything the exporter reads of a sink's writers ([`SinkMetrics::reading`]); adds up over
/// the writers of a statement ([`SinkReading::add`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SinkReading {
    /// See [`names::RECORDS_SENT`].
    pub records_sent: u64,
    /// See [`names::RECORDS_ACKED`].
    pub records_acked: u64,
    /// See [`names::RECORDS_DEDUPLICATED`].
    pub records_deduplicated: u64,
    /// See [`names::BYTES_SENT`].
    pub bytes_sent: u64,
    /// See [`names::SEND_ERRORS_BY_CODE`]: by status code name.
    pub send_errors_by_code: std::collections::BTreeMap<&'static str, u64>,
    /// See [`names::RETRIES_BY_CODE`]: by status code name.
    pub retries_by_code: std::collections::BTreeMap<&'static str, u64>,
    /// See [`names::RECORDS_REJECTED`].
    pub records_rejected: u64,
    /// See [`names::RECORDS_DROPPED`].
    pub records_dropped: u64,
    /// See [`names::RECORDS_SKIPPED`].
    pub records_skipped: u64,
    /// See [`names::RECORDS_DEAD_LETTERED`].
    pub records_dead_lettered: u64,
    /// See [`names::IN_FLIGHT_RECORDS`].
    pub in_flight_records: u64,
    /// See [`names::IN_FLIGHT_BYTES`].
    pub in_flight_bytes: u64,
    /// See [`names::RESOURCES_CREATED`].
    pub resources_created: u64,
    /// See [`names::SEND_RPCS`].
    pub send_rpcs: u64,
    /// See [`names::THROTTLED_TIME`].
    pub throttled: Duration,
    /// The send latencies.
    pub latency: HistogramSnapshot,
    /// The writer's health (for a sum over writers: the first writer's; see
    /// [`crate::core::telemetry`], which reads each writer's on its own).
    pub health: WriterHealthSnapshot,
}

impl SinkReading {
    /// Adds `other`'s counts to these (the health stays this one's).
    pub fn add(&mut self, other: &SinkReading) {
        self.records_sent += other.records_sent;
        self.records_acked += other.records_acked;
        self.records_deduplicated += other.records_deduplicated;
        self.bytes_sent += other.bytes_sent;
        for (code, n) in &other.send_errors_by_code {
            *self.send_errors_by_code.entry(code).or_default() += n;
        }
        for (code, n) in &other.retries_by_code {
            *self.retries_by_code.entry(code).or_default() += n;
        }
        self.records_rejected += other.records_rejected;
        self.records_dropped += other.records_dropped;
        self.records_skipped += other.records_skipped;
        self.records_dead_lettered += other.records_dead_lettered;
        self.in_flight_records += other.in_flight_records;
        self.in_flight_bytes += other.in_flight_bytes;
        self.resources_created += other.resources_created;
        self.send_rpcs += other.send_rpcs;
        self.throttled += other.throttled;
        self.latency.add(&other.latency);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registered(set: &ExecutionPlanMetricsSet, name: &str) -> Option<usize> {
        set.clone_inner().sum_by_name(name).map(|v| v.as_usize())
    }

    #[test]
    fn every_inventory_name_is_registered() {
        let set = ExecutionPlanMetricsSet::new();
        let _m = SinkMetrics::new(&set);
        for name in [
            names::RECORDS_SENT,
            names::RECORDS_ACKED,
            names::BYTES_SENT,
            names::SEND_ERRORS,
            names::RETRIES,
            names::RECORDS_REJECTED,
            names::RECORDS_DROPPED,
            names::RECORDS_SKIPPED,
            names::RECORDS_DEAD_LETTERED,
            names::IN_FLIGHT_RECORDS,
            names::IN_FLIGHT_BYTES,
            names::IN_FLIGHT_RECORDS_HIGH_WATER,
            names::IN_FLIGHT_BYTES_HIGH_WATER,
            names::PARKED_FOR_RETRY,
            names::RESOURCES_CREATED,
            names::RECORDS_DEDUPLICATED,
            names::SEND_RPCS,
        ] {
            assert_eq!(registered(&set, name), Some(0), "{name}");
        }
        // A DataFusion Time never reads below 1 ns; it is registered all the same.
        assert!(registered(&set, names::SEND_TIME).is_some());
    }

    #[test]
    fn errors_by_code_are_labelled_and_created_on_first_use() {
        let set = ExecutionPlanMetricsSet::new();
        let m = SinkMetrics::new(&set);
        assert_eq!(registered(&set, names::SEND_ERRORS_BY_CODE), None);
        m.send_error("d", tonic::Code::Unavailable, 2, false);
        m.send_error("d", tonic::Code::Unavailable, 1, false);
        m.send_error("d", tonic::Code::Internal, 1, false);
        assert_eq!(registered(&set, names::SEND_ERRORS_BY_CODE), Some(4));
        assert_eq!(registered(&set, names::SEND_ERRORS), Some(4));
        let inner = set.clone_inner();
        let unavailable: usize = inner
            .iter()
            .filter(|m| m.value().name() == names::SEND_ERRORS_BY_CODE)
            .filter(|m| {
                m.labels()
                    .iter()
                    .any(|l| l.name() == "code" && l.value() == "UNAVAILABLE")
            })
            .map(|m| m.value().as_usize())
            .sum();
        assert_eq!(unavailable, 3);
        assert_eq!(registered(&set, names::SEND_ERRORS_BY_DESTINATION), None);
    }

    #[test]
    fn a_created_resource_counts_in_the_snapshot_and_under_its_name() {
        let set = ExecutionPlanMetricsSet::new();
        let metrics = SinkMetrics::new(&set);
        metrics.resource_created();
        assert_eq!(metrics.snapshot().resources_created, 1);
        assert_eq!(registered(&set, names::RESOURCES_CREATED), Some(1));
    }

    #[test]
    fn per_destination_counters_only_when_asked() {
        let set = ExecutionPlanMetricsSet::new();
        let m = SinkMetrics::new(&set);
        m.sent("a", 3, 30, true);
        m.sent("b", 1, 10, true);
        m.sent("a", 2, 20, true);
        assert_eq!(registered(&set, names::RECORDS_SENT), Some(6));
        assert_eq!(
            registered(&set, names::RECORDS_SENT_BY_DESTINATION),
            Some(6)
        );
        let a: usize = set
            .clone_inner()
            .iter()
            .filter(|x| x.value().name() == names::RECORDS_SENT_BY_DESTINATION)
            .filter(|x| x.labels().iter().any(|l| l.value() == "a"))
            .map(|x| x.value().as_usize())
            .sum();
        assert_eq!(a, 5);
    }
}
