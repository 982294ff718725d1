//! The sink's metrics: one inventory for every connector.
//!
//! Every metric is registered in the sink's DataFusion [`ExecutionPlanMetricsSet`] (what
//! `EXPLAIN ANALYZE` shows) under a name from [`names`], so a test can assert a metric by its
//! registered name (the core's own tests also read them all at once, as plain numbers).
//!
//! Status-code and per-destination counters are created on first use, with a label
//! (`code=UNAVAILABLE`, `destination=<name>`), and kept for the sink's lifetime.

use std::collections::HashMap;
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
    /// Label of [`SEND_ERRORS_BY_CODE`].
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
    by_code: Arc<Mutex<HashMap<tonic::Code, Count>>>,
    by_destination: Arc<Mutex<HashMap<String, (Count, Count)>>>,
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
        let send_time = Time::new();
        typed(names::SEND_TIME).build(MetricValue::Time {
            name: names::SEND_TIME.into(),
            time: send_time.clone(),
        });
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
            by_code: Arc::default(),
            by_destination: Arc::default(),
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
        let counter = {
            let mut map = self.by_code.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(code)
                .or_insert_with(|| {
                    self.builder()
                        .with_new_label(names::CODE_LABEL, code_name(code))
                        .global_counter(names::SEND_ERRORS_BY_CODE)
                })
                .clone()
        };
        counter.add(us(records));
        if per_destination {
            self.destination_counters(destination).1.add(us(records));
        }
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

    pub(crate) fn rpc(&self, latency: Duration) {
        self.send_rpcs.add(1);
        self.send_time.add_duration(latency);
    }

    pub(crate) fn retried(&self) {
        self.retries.add(1);
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
