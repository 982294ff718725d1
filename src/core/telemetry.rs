//! The process's sink statements as an exporter reads them: every statement's writers and the
//! inputs behind them, registered as they start, read at each scrape, and judged ready or not.
//!
//! Nothing is counted twice: a writer registers the [`SinkMetrics`] it already keeps (what
//! `EXPLAIN ANALYZE` shows) and the [`DeliveryInput`] it already reads from; a scrape reads
//! them ([`Telemetry::statements`]) and adds up the writers of each statement. Registering
//! costs one lock per writer start; a scrape costs one read of each counter, and a walk over
//! the messages each input holds (for the age of the oldest).
//!
//! Every label is a bounded value of a declaration (the statement's id, the table, the
//! connector, the destination the table declares), never a value of a row: a destination a
//! row picks (a topic column, say) is not one.
//!
//! A finished statement is kept, with its last readings, among the [`FINISHED_KEPT`] most
//! recent, so that a scrape after its end still sees its final counts; a running one is
//! always there. Readiness ([`readiness`]) looks at the running ones only.
//!
//! The registry is one per process ([`global`]), like Prometheus' default registry: the
//! tool, a library embedder and the Python package all serve it through
//! [`crate::ops::MetricsServer`].

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use super::delivery::{DeliveryCounts, DeliveryInput, Held, InputIdentity};
use super::metrics::{SinkMetrics, SinkReading, WriterHealthSnapshot};

/// How many finished statements a registry keeps, the most recent ones.
pub const FINISHED_KEPT: usize = 32;

/// What a statement's metrics are labelled with: bounded values of its declaration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatementLabels {
    /// The statement's id ([`crate::core::run::new_statement_id`]).
    pub statement: Arc<str>,
    /// The table written to.
    pub table: String,
    /// The sink's connector (`pubsub`, `bigtable`, ...).
    pub connector: &'static str,
    /// The destination the table declares (its topic, queue or table); empty for a sink built
    /// without a declaration.
    pub destination: String,
}

/// One statement's writers and inputs.
#[derive(Debug)]
struct Tracked {
    labels: StatementLabels,
    state: Mutex<TrackedState>,
}

#[derive(Debug, Default)]
struct TrackedState {
    /// Each writer's partition and metrics.
    writers: Vec<(usize, SinkMetrics)>,
    /// The inputs behind the writers, one per resource read.
    inputs: Vec<Arc<dyn DeliveryInput>>,
    /// Writers registered and not yet ended.
    running: usize,
}

impl Tracked {
    fn state(&self) -> std::sync::MutexGuard<'_, TrackedState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(Debug, Default)]
struct Registered {
    running: Vec<Arc<Tracked>>,
    finished: VecDeque<Arc<Tracked>>,
}

/// The registry of a process's sink statements (see the module docs).
#[derive(Debug, Default)]
pub struct Telemetry {
    registered: Mutex<Registered>,
}

/// The process's registry.
pub fn global() -> &'static Telemetry {
    static GLOBAL: OnceLock<Telemetry> = OnceLock::new();
    GLOBAL.get_or_init(Telemetry::default)
}

/// A registered writer: counts as running until dropped.
#[must_use = "the writer counts as running while its registration lives"]
#[derive(Debug)]
pub struct WriterRegistration {
    telemetry: &'static Telemetry,
    tracked: Arc<Tracked>,
}

impl Drop for WriterRegistration {
    fn drop(&mut self) {
        let ended = {
            let mut state = self.tracked.state();
            state.running = state.running.saturating_sub(1);
            state.running == 0
        };
        if ended {
            self.telemetry.finished(&self.tracked);
        }
    }
}

/// One input behind a statement's writers, read at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputReading {
    /// What it reads.
    pub identity: InputIdentity,
    /// What it did so far.
    pub counts: DeliveryCounts,
    /// What it holds now.
    pub held: Held,
}

/// One statement, read at one moment ([`Telemetry::statements`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatementReading {
    /// Its labels.
    pub labels: StatementLabels,
    /// Whether a writer of it still runs.
    pub running: bool,
    /// Its writers' counts, added up.
    pub sink: SinkReading,
    /// Each writer's health, by partition.
    pub writers: Vec<(usize, WriterHealthSnapshot)>,
    /// The inputs behind its writers.
    pub inputs: Vec<InputReading>,
}

impl Telemetry {
    /// Registers the writer of `partition` of the statement `labels` name, with the metrics it
    /// keeps and the input it reads (when that input carries delivery handles). The writers of
    /// one statement share its entry; an input already registered for the statement (the
    /// same resource of the same table, read by another writer) is not added again.
    pub fn writer_started(
        &'static self,
        labels: StatementLabels,
        partition: usize,
        metrics: SinkMetrics,
        input: Option<Arc<dyn DeliveryInput>>,
    ) -> WriterRegistration {
        let tracked = {
            let mut registered = self.lock();
            match registered
                .running
                .iter()
                .find(|t| t.labels.statement == labels.statement)
            {
                Some(tracked) => tracked.clone(),
                None => {
                    let tracked = Arc::new(Tracked {
                        labels,
                        state: Mutex::default(),
                    });
                    registered.running.push(tracked.clone());
                    tracked
                }
            }
        };
        {
            let mut state = tracked.state();
            state.running += 1;
            state.writers.push((partition, metrics));
            if let Some(input) = input {
                let identity = input.identity();
                if !state.inputs.iter().any(|i| i.identity() == identity) {
                    state.inputs.push(input);
                }
            }
        }
        WriterRegistration {
            telemetry: self,
            tracked,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registered> {
        self.registered.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The last writer of `tracked` ended: it moves to the finished ones.
    fn finished(&self, tracked: &Arc<Tracked>) {
        let mut registered = self.lock();
        // A writer of the same statement may have started again meanwhile (a plan run twice
        // keeps its statement): only a statement with no writer running moves.
        if tracked.state().running > 0 {
            return;
        }
        registered.running.retain(|t| !Arc::ptr_eq(t, tracked));
        registered.finished.push_back(tracked.clone());
        while registered.finished.len() > FINISHED_KEPT {
            registered.finished.pop_front();
        }
    }

    /// Every statement it knows, read now: the finished ones first (oldest first), then the
    /// running ones in the order they started.
    pub fn statements(&self) -> Vec<StatementReading> {
        let tracked: Vec<(Arc<Tracked>, bool)> = {
            let registered = self.lock();
            registered
                .finished
                .iter()
                .map(|t| (t.clone(), false))
                .chain(registered.running.iter().map(|t| (t.clone(), true)))
                .collect()
        };
        tracked
            .into_iter()
            .map(|(tracked, running)| {
                let state = tracked.state();
                let mut sink = SinkReading::default();
                let mut writers = Vec::with_capacity(state.writers.len());
                for (partition, metrics) in &state.writers {
                    let reading = metrics.reading();
                    sink.add(&reading);
                    writers.push((*partition, reading.health));
                }
                writers.sort_by_key(|(partition, _)| *partition);
                let inputs = state
                    .inputs
                    .iter()
                    .map(|input| InputReading {
                        identity: input.identity(),
                        counts: input.counts(),
                        held: input.held(),
                    })
                    .collect();
                StatementReading {
                    labels: tracked.labels.clone(),
                    running,
                    sink,
                    writers,
                    inputs,
                }
            })
            .collect()
    }
}

/// What makes a statement not ready ([`readiness`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadinessSettings {
    /// A writer whose sends have been on the wire this long with none coming back is not
    /// connected (a black-holed service answers nothing, and its attempt deadline may be a
    /// minute away).
    pub stalled_after: Duration,
}

impl Default for ReadinessSettings {
    /// Ten seconds: far above a healthy send's latency (milliseconds), well under Pub/Sub's
    /// and Bigtable's attempt deadlines.
    fn default() -> Self {
        ReadinessSettings {
            stalled_after: Duration::from_secs(10),
        }
    }
}

/// Whether the running statements are ready, and why not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Readiness {
    /// Every running statement's writers reach their service, its inputs' streams are
    /// connected, and no writer failed (no rejection breaker is open).
    pub ready: bool,
    /// One line per thing that is not: which statement, table and writer or input, and what.
    pub reasons: Vec<String>,
}

/// Judges the running statements of `statements`: a statement is ready when each of its
/// writers has not failed, got an answer to its last send (not `UNAVAILABLE` or
/// `DEADLINE_EXCEEDED`), and has no send on the wire for [`ReadinessSettings::stalled_after`]
/// without one coming back; and when every stream of each of its inputs is connected. With no
/// statement running, the process is ready.
pub fn readiness(statements: &[StatementReading], settings: &ReadinessSettings) -> Readiness {
    let mut reasons = Vec::new();
    for statement in statements.iter().filter(|s| s.running) {
        let l = &statement.labels;
        let who = format!(
            "statement {} (INSERT INTO {}, {} sink{})",
            l.statement,
            l.table,
            l.connector,
            if l.destination.is_empty() {
                String::new()
            } else {
                format!(" {}", l.destination)
            }
        );
        for (partition, health) in &statement.writers {
            let writer = format!("{who}: writer {}", partition + 1);
            if health.breaker_open {
                reasons.push(format!(
                    "{writer} failed: its consecutive-rejection breaker is open"
                ));
            } else if health.failed {
                reasons.push(format!("{writer} failed"));
            } else if health.sends_on_the_wire > 0 && health.waiting >= settings.stalled_after {
                reasons.push(format!(
                    "{writer}: {} send(s) on the wire and no answer for {:.1} s",
                    health.sends_on_the_wire,
                    health.waiting.as_secs_f64()
                ));
            } else if health.unanswered {
                reasons.push(format!(
                    "{writer}: the service did not answer its last send (unreachable or timed out)"
                ));
            }
        }
        for input in &statement.inputs {
            let held = &input.held;
            if held.streams_connected < held.streams {
                reasons.push(format!(
                    "{who}: {} of the {} stream(s) reading {} are connected",
                    held.streams_connected, held.streams, input.identity.resource
                ));
            }
        }
    }
    Readiness {
        ready: reasons.is_empty(),
        reasons,
    }
}

#[cfg(test)]
mod tests {
    use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;

    use super::*;

    fn labels(statement: &str) -> StatementLabels {
        StatementLabels {
            statement: statement.into(),
            table: "t".into(),
            connector: "bigtable",
            destination: "projects/p/instances/i/tables/t".into(),
        }
    }

    fn leaked() -> &'static Telemetry {
        Box::leak(Box::default())
    }

    #[test]
    fn writers_of_one_statement_add_up_and_it_stays_readable_after_its_end() {
        let telemetry = leaked();
        let set = ExecutionPlanMetricsSet::new();
        let (a, b) = (
            SinkMetrics::for_partition(&set, 0),
            SinkMetrics::for_partition(&set, 1),
        );
        a.sent("d", 3, 30, false);
        b.sent("d", 4, 40, false);
        a.acked(3, 0);
        let first = telemetry.writer_started(labels("s1"), 0, a, None);
        let second = telemetry.writer_started(labels("s1"), 1, b, None);
        let read = telemetry.statements();
        assert_eq!(read.len(), 1);
        assert!(read[0].running);
        assert_eq!(read[0].sink.records_sent, 7);
        assert_eq!(read[0].sink.bytes_sent, 70);
        assert_eq!(read[0].sink.records_acked, 3);
        assert_eq!(read[0].writers.len(), 2);
        drop(first);
        assert!(telemetry.statements()[0].running, "one writer still runs");
        drop(second);
        let read = telemetry.statements();
        assert!(!read[0].running);
        assert_eq!(read[0].sink.records_sent, 7, "the final counts stay");
    }

    #[test]
    fn only_the_most_recent_finished_statements_are_kept() {
        let telemetry = leaked();
        for i in 0..FINISHED_KEPT + 3 {
            let set = ExecutionPlanMetricsSet::new();
            drop(telemetry.writer_started(
                labels(&format!("s{i}")),
                0,
                SinkMetrics::new(&set),
                None,
            ));
        }
        let read = telemetry.statements();
        assert_eq!(read.len(), FINISHED_KEPT);
        assert_eq!(&*read[0].labels.statement, "s3");
    }

    #[test]
    fn a_failed_or_unanswered_writer_makes_its_statement_not_ready() {
        let telemetry = leaked();
        let set = ExecutionPlanMetricsSet::new();
        let metrics = SinkMetrics::new(&set);
        let _running = telemetry.writer_started(labels("s"), 0, metrics.clone(), None);
        let settings = ReadinessSettings::default();
        assert!(readiness(&telemetry.statements(), &settings).ready);
        metrics.rpc_started();
        metrics.rpc(Duration::from_millis(5), false);
        let not = readiness(&telemetry.statements(), &settings);
        assert!(!not.ready);
        assert!(not.reasons[0].contains("writer 1"), "{:?}", not.reasons);
        assert!(
            not.reasons[0].contains("INSERT INTO t"),
            "{:?}",
            not.reasons
        );
        metrics.rpc_started();
        metrics.rpc(Duration::from_millis(5), true);
        assert!(readiness(&telemetry.statements(), &settings).ready);
        metrics.writer_failed(true);
        let not = readiness(&telemetry.statements(), &settings);
        assert!(
            not.reasons[0].contains("breaker is open"),
            "{:?}",
            not.reasons
        );
    }

    #[test]
    fn a_send_on_the_wire_too_long_makes_its_statement_not_ready() {
        let telemetry = leaked();
        let set = ExecutionPlanMetricsSet::new();
        let metrics = SinkMetrics::new(&set);
        let _running = telemetry.writer_started(labels("s"), 0, metrics.clone(), None);
        metrics.rpc_started();
        let eager = ReadinessSettings {
            stalled_after: Duration::ZERO,
        };
        let not = readiness(&telemetry.statements(), &eager);
        assert!(
            not.reasons[0].contains("1 send(s) on the wire"),
            "{:?}",
            not.reasons
        );
        assert!(readiness(&telemetry.statements(), &ReadinessSettings::default()).ready);
    }
}
