//! Live progress of a running statement and the summary printed after an `INSERT` into a sink.
//!
//! The live line and the flush-point lines give the current rate (over the last
//! [`RATE_WINDOW`] for the live line, since the writer's previous flush point for its lines)
//! beside the average over the whole run, and a source's backlog age: how long ago the oldest
//! message it holds unacknowledged was read. The summary at the end gives the average.
//!
//! Both read the sink counters by their registered names ([`crate::core::metrics::names`]) from
//! the metrics of every node of the physical plan, so they work for every connector alike (the
//! `SinkWriterExec` reports its writers' metrics, added up over them).

use std::collections::{HashMap, VecDeque};
use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::metrics::MetricsSet;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::core::metrics::names;
use crate::core::run::FlushPoint;
use crate::sql::StatementControl;
use crate::sql::exec::WRITERS_METRIC;

/// How often the live progress line is redrawn.
const TICK: Duration = Duration::from_millis(200);

/// The window of the live line's current rate.
pub const RATE_WINDOW: Duration = Duration::from_secs(10);

/// The rate of a count that only grows (rows acknowledged), over a recent window: the samples
/// of the last `window` (and the one just before it, so the window is covered whole).
#[derive(Debug)]
pub(crate) struct RecentRate {
    window: Duration,
    samples: VecDeque<(Instant, u64)>,
}

impl RecentRate {
    /// No samples yet, a window of `window`.
    pub(crate) fn new(window: Duration) -> Self {
        RecentRate {
            window,
            samples: VecDeque::new(),
        }
    }

    /// Records `count` at `now` and returns the rate per second since the oldest sample of the
    /// window: `None` until two samples lie apart in time.
    pub(crate) fn record(&mut self, now: Instant, count: u64) -> Option<f64> {
        self.samples.push_back((now, count));
        // Drop samples older than the window, keeping the last one before it.
        while self
            .samples
            .get(1)
            .is_some_and(|(at, _)| now.duration_since(*at) >= self.window)
        {
            self.samples.pop_front();
        }
        let (from, first) = *self.samples.front()?;
        per_second(count.saturating_sub(first), now.duration_since(from))
    }
}

/// `delta` over `elapsed` per second; `None` over no time.
fn per_second(delta: u64, elapsed: Duration) -> Option<f64> {
    let seconds = elapsed.as_secs_f64();
    (seconds > 0.0).then(|| delta as f64 / seconds)
}

/// A backlog age as the lines print it: `0.8 s`, `12 s`, `3 min 5 s`.
fn age_text(age: Duration) -> String {
    let seconds = age.as_secs_f64();
    if seconds < 10.0 {
        format!("{seconds:.1} s")
    } else if seconds < 60.0 {
        format!("{} s", age.as_secs())
    } else {
        format!("{} min {} s", age.as_secs() / 60, age.as_secs() % 60)
    }
}

/// The sink counters of one statement, summed over every node of its plan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SinkCounters {
    /// Records handed to a client (each record once, at its first hand-off).
    pub sent: usize,
    /// Records the service acknowledged.
    pub acked: usize,
    /// Records admitted and not yet resolved.
    pub in_flight: usize,
    /// Retried sends.
    pub retries: usize,
    /// Records the service refused and the `drop` failure policy dropped.
    pub dropped: usize,
    /// Rows the encoder rejected (never sent) and the `drop` failure policy skipped.
    pub skipped: usize,
    /// Rows the `dead_letter` failure policy wrote to the dead-letter destination (encoder
    /// and service rejections).
    pub dead_lettered: usize,
    /// Missing destinations (topics, tables, column families) the sink created because it was
    /// asked to (`auto_create_topic`, `auto_create_table`).
    pub created: usize,
    /// How many writers the statement ran (0 before any started).
    pub writers: usize,
    /// Messages the statement's sources read (a subscription), 0 without a source.
    pub source_read: usize,
    /// Messages the sources acknowledged: every row made from them was settled.
    pub source_acked: usize,
    /// Messages the sources handed back for another reader.
    pub source_nacked: usize,
    /// Of the acknowledged messages, those the service confirmed id by id (exactly-once
    /// delivery).
    pub source_ack_confirmed: usize,
    /// Acknowledgements the service refused for good (their lease had lapsed).
    pub source_ack_refused: usize,
    /// The age, in milliseconds, of the oldest message a source holds unacknowledged (the
    /// oldest over the sources; 0 when they hold none).
    pub source_oldest_unacked_ms: usize,
    /// Only a source reported: the statement read a subscription into a table that is not one
    /// of this crate's sinks (a Parquet folder, say), which counts no rows sent. The summary
    /// then has the source's line alone.
    pub source_only: bool,
}

impl SinkCounters {
    /// Reads the counters from `plan` and its descendants; `None` when no node reports any of
    /// them (the statement writes to no sink).
    pub fn read(plan: &Arc<dyn ExecutionPlan>) -> Option<SinkCounters> {
        let mut sets = Vec::new();
        let mut pending: Vec<&Arc<dyn ExecutionPlan>> = vec![plan];
        while let Some(node) = pending.pop() {
            sets.extend(node.metrics());
            pending.extend(node.children());
        }
        Self::from_metrics(&sets)
    }

    /// Sums the counters over metric sets (of a plan's nodes, or of a cluster job's sink
    /// stage); `None` when none of them has any.
    pub fn from_metrics(sets: &[MetricsSet]) -> Option<SinkCounters> {
        let mut counters = SinkCounters::default();
        let (mut sink, mut source) = (false, false);
        for metrics in sets {
            for (name, slot) in [
                (names::RECORDS_SENT, &mut counters.sent),
                (names::RECORDS_ACKED, &mut counters.acked),
                (names::IN_FLIGHT_RECORDS, &mut counters.in_flight),
                (names::RETRIES, &mut counters.retries),
                (names::RECORDS_DROPPED, &mut counters.dropped),
                (names::RECORDS_SKIPPED, &mut counters.skipped),
                (names::RECORDS_DEAD_LETTERED, &mut counters.dead_lettered),
                (names::RESOURCES_CREATED, &mut counters.created),
                (WRITERS_METRIC, &mut counters.writers),
            ] {
                if let Some(value) = metrics.sum_by_name(name) {
                    *slot += value.as_usize();
                    sink = true;
                }
            }
            for (name, slot) in [
                (names::SOURCE_MESSAGES_READ, &mut counters.source_read),
                (names::SOURCE_MESSAGES_ACKED, &mut counters.source_acked),
                (names::SOURCE_MESSAGES_NACKED, &mut counters.source_nacked),
                (
                    names::SOURCE_MESSAGES_ACK_CONFIRMED,
                    &mut counters.source_ack_confirmed,
                ),
                (
                    names::SOURCE_MESSAGES_ACK_REFUSED,
                    &mut counters.source_ack_refused,
                ),
            ] {
                if let Some(value) = metrics.sum_by_name(name) {
                    *slot += value.as_usize();
                    source = true;
                }
            }
            if let Some(value) = metrics.sum_by_name(names::SOURCE_OLDEST_UNACKED_MS) {
                counters.source_oldest_unacked_ms =
                    counters.source_oldest_unacked_ms.max(value.as_usize());
            }
        }
        counters.source_only = source && !sink;
        (sink || source).then_some(counters)
    }

    /// The one-line summary printed after a statement that wrote to a sink.
    ///
    /// Both kinds of rows the `drop` failure policy let go are named: `skipped` rows the encoder
    /// rejected (they were never sent, so they are not in `sent`), `dropped` rows the service
    /// refused. A destination the sink created (asked to by `auto_create_topic` or
    /// `auto_create_table`) is counted as `created`, shown when there is one; the re-send that
    /// follows a creation is not a retry. Rows the `dead_letter` policy wrote to its
    /// destination are counted as `dead-lettered`, shown when there is one.
    ///
    /// ```
    /// use std::time::Duration;
    /// use gcp_sql::cli::SinkCounters;
    ///
    /// let counters = SinkCounters {
    ///     sent: 20,
    ///     acked: 20,
    ///     in_flight: 0,
    ///     retries: 1,
    ///     dropped: 0,
    ///     skipped: 3,
    ///     dead_lettered: 0,
    ///     created: 0,
    ///     writers: 1,
    ///     ..SinkCounters::default()
    /// };
    /// assert_eq!(
    ///     counters.summary(Duration::from_secs(2)),
    ///     "Sink: 20 row(s) acknowledged of 20 sent in 2.000 s (10 rows/s); 3 skipped, 0 dropped, 1 retries"
    /// );
    /// let created = SinkCounters { retries: 0, skipped: 0, created: 1, ..counters };
    /// assert_eq!(
    ///     created.summary(Duration::from_secs(2)),
    ///     "Sink: 20 row(s) acknowledged of 20 sent in 2.000 s (10 rows/s); 0 skipped, 0 dropped, 0 retries; 1 destination(s) created"
    /// );
    /// let dead = SinkCounters { skipped: 0, dead_lettered: 3, ..counters };
    /// assert_eq!(
    ///     dead.summary(Duration::from_secs(2)),
    ///     "Sink: 20 row(s) acknowledged of 20 sent in 2.000 s (10 rows/s); 0 skipped, 0 dropped, 1 retries; 3 dead-lettered"
    /// );
    /// // Several writers: the counts are their sum, and the summary says over how many.
    /// let four = SinkCounters { writers: 4, ..counters };
    /// assert!(four.summary(Duration::from_secs(2)).ends_with("1 retries; 4 writers"));
    /// // A subscription read into a table of another kind: the source's line alone.
    /// let parquet = SinkCounters {
    ///     source_read: 200,
    ///     source_acked: 200,
    ///     source_only: true,
    ///     ..SinkCounters::default()
    /// };
    /// assert_eq!(
    ///     parquet.summary(Duration::from_secs(2)),
    ///     "Source: 200 message(s) read, 200 acknowledged, 0 nacked"
    /// );
    /// ```
    pub fn summary(&self, elapsed: Duration) -> String {
        if self.source_only {
            return self.source_line();
        }
        let mut line = format!(
            "Sink: {} row(s) acknowledged of {} sent in {:.3} s ({} rows/s); {} skipped, {} dropped, {} retries",
            self.acked,
            self.sent,
            elapsed.as_secs_f64(),
            rate(self.acked, elapsed),
            self.skipped,
            self.dropped,
            self.retries
        );
        if self.dead_lettered > 0 {
            line.push_str(&format!("; {} dead-lettered", self.dead_lettered));
        }
        if self.created > 0 {
            line.push_str(&format!("; {} destination(s) created", self.created));
        }
        if self.writers > 1 {
            line.push_str(&format!("; {} writers", self.writers));
        }
        if self.source_read > 0 {
            line.push('\n');
            line.push_str(&self.source_line());
        }
        line
    }

    fn source_line(&self) -> String {
        let mut line = format!(
            "Source: {} message(s) read, {} acknowledged, {} nacked",
            self.source_read, self.source_acked, self.source_nacked
        );
        // Only a subscription with exactly-once delivery confirms or refuses acknowledgements.
        if self.source_ack_confirmed > 0 || self.source_ack_refused > 0 {
            line.push_str(&format!(
                " ({} confirmed, {} refused: lease lapsed, delivered again)",
                self.source_ack_confirmed, self.source_ack_refused
            ));
        }
        line
    }

    /// The live line: the counts, the current rate (`now`, over the last [`RATE_WINDOW`], once
    /// known) beside the average over `elapsed`, and a source's backlog age.
    fn live_line(&self, elapsed: Duration, now: Option<f64>) -> String {
        let current = now.map_or_else(|| "…".to_string(), |r| format!("{}", r.round() as u64));
        let mut line = format!(
            "sent {} · acked {} · in flight {} · retries {} · skipped {} · dropped {} · {current} rows/s now, {} rows/s average",
            self.sent,
            self.acked,
            self.in_flight,
            self.retries,
            self.skipped,
            self.dropped,
            rate(self.acked, elapsed)
        );
        if self.source_read > 0 {
            line.push_str(&format!(
                " · oldest unacknowledged {}",
                if self.source_oldest_unacked_ms == 0 {
                    "none".to_string()
                } else {
                    age_text(Duration::from_millis(self.source_oldest_unacked_ms as u64))
                }
            ));
        }
        if self.dead_lettered > 0 {
            line.push_str(&format!(" · dead-lettered {}", self.dead_lettered));
        }
        if self.writers > 1 {
            line.push_str(&format!(" · {} writers", self.writers));
        }
        if let Some(ago) = last_flush_point().map(|at| at.elapsed()) {
            line.push_str(&format!(
                " · last flush point {:.1} s ago",
                ago.as_secs_f64()
            ));
        }
        line
    }
}

fn rate(records: usize, elapsed: Duration) -> u64 {
    let seconds = elapsed.as_secs_f64();
    if seconds > 0.0 {
        (records as f64 / seconds).round() as u64
    } else {
        0
    }
}

/// When the latest flush point of any writer of this process was made.
static LAST_FLUSH_POINT: Mutex<Option<Instant>> = Mutex::new(None);

fn last_flush_point() -> Option<Instant> {
    *LAST_FLUSH_POINT.lock().unwrap_or_else(|p| p.into_inner())
}

/// The tool's [`StatementControl`]: its observer records each flush point for the live line,
/// and, when stderr is not a terminal (a service's log) and the run is not quiet, prints one
/// line per flush point instead of a redrawn bar.
pub(crate) fn statement_control(quiet: bool) -> StatementControl {
    let log_lines = !quiet && !std::io::stderr().is_terminal();
    // Per writer: the time and the acknowledged count of its previous flush point.
    let previous: Mutex<HashMap<usize, (Duration, u64)>> = Mutex::default();
    StatementControl::new().with_observer(move |point: &FlushPoint| {
        *LAST_FLUSH_POINT.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        if log_lines {
            let before = previous
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(point.writer, (point.elapsed, point.counts.acknowledged))
                .unwrap_or_default();
            eprintln!("{}", flush_point_line(point, before));
        }
    })
}

/// One flush point as the tool logs it, given the time and acknowledged count of the writer's
/// previous one (zeros for its first): the rate since then beside the average, and the
/// source's backlog age.
///
/// ```ignore
/// flush point 3 of writer 1/2 at 3.0 s: 1200 row(s) read, 1200 acknowledged (400 rows/s since the previous point, 400 rows/s average), 0 skipped, 0 dropped, 0 retries, 0 destination(s) released
/// ```
fn flush_point_line(p: &FlushPoint, (before_at, before_acked): (Duration, u64)) -> String {
    let c = &p.counts;
    let source = p
        .delivery
        .map(|s| {
            let oldest = s
                .oldest_unacked
                .map_or_else(|| "none".to_string(), age_text);
            format!(
                "; source: {} message(s) read, {} acknowledged, {} nacked, oldest unacknowledged {oldest}",
                s.messages_read, s.messages_acked, s.messages_nacked
            )
        })
        .unwrap_or_default();
    let since = per_second(
        c.acknowledged.saturating_sub(before_acked),
        p.elapsed.saturating_sub(before_at),
    )
    .map_or_else(|| "…".to_string(), |r| format!("{}", r.round() as u64));
    let average = rate(
        usize::try_from(c.acknowledged).unwrap_or(usize::MAX),
        p.elapsed,
    );
    format!(
        "flush point {} of writer {}/{} at {:.1} s: {} row(s) read, {} acknowledged ({since} rows/s since the previous point, {average} rows/s average), {} skipped, {} dropped, {} retries, {} destination(s) released",
        p.sequence,
        p.writer + 1,
        p.writers,
        p.elapsed.as_secs_f64(),
        p.rows_read,
        c.acknowledged,
        c.skipped,
        c.dropped,
        c.retries,
        c.destinations_released
    ) + &source
}

/// A live progress line on stderr while a statement runs; drawn only once the plan reports sink
/// counters.
pub(crate) struct LiveProgress {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl LiveProgress {
    /// Starts drawing when `enabled` and stderr is a terminal; otherwise does nothing.
    pub(crate) fn start(plan: &Arc<dyn ExecutionPlan>, enabled: bool) -> Option<LiveProgress> {
        if !enabled || !std::io::stderr().is_terminal() {
            return None;
        }
        let plan = Arc::clone(plan);
        let (stop, mut stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let mut recent = RecentRate::new(RATE_WINDOW);
            let mut bar: Option<ProgressBar> = None;
            let mut ticker = tokio::time::interval(TICK);
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = ticker.tick() => {}
                }
                let Some(counters) = SinkCounters::read(&plan) else {
                    continue;
                };
                let bar = bar.get_or_insert_with(|| {
                    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
                    if let Ok(style) =
                        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_msg}")
                    {
                        bar.set_style(style);
                    }
                    bar
                });
                let now = recent.record(Instant::now(), counters.acked as u64);
                bar.set_message(counters.live_line(started.elapsed(), now));
                bar.tick();
            }
            if let Some(bar) = bar {
                bar.finish_and_clear();
            }
        });
        Some(LiveProgress { stop, task })
    }

    /// Stops drawing and clears the line.
    pub(crate) async fn finish(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
    use datafusion::datasource::sink::{DataSink, DataSinkExec};
    use datafusion::execution::{SendableRecordBatchStream, TaskContext};
    use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
    use datafusion::physical_plan::empty::EmptyExec;
    use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
    use datafusion::physical_plan::{DisplayAs, DisplayFormatType};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_current_rate_covers_the_window_not_the_whole_run() {
        let mut recent = RecentRate::new(Duration::from_secs(10));
        let start = Instant::now();
        assert_eq!(recent.record(start, 0), None, "one sample is no rate");
        // A burst: 1000 rows a second for 5 s.
        for s in 1..=5 {
            tokio::time::advance(Duration::from_secs(1)).await;
            assert_eq!(recent.record(Instant::now(), s * 1000), Some(1000.0));
        }
        // Then idle for 60 s: the average over the run falls slowly, the current rate is 0
        // once the burst left the window.
        for _ in 0..60 {
            tokio::time::advance(Duration::from_secs(1)).await;
            recent.record(Instant::now(), 5000);
        }
        assert_eq!(recent.record(Instant::now(), 5000), Some(0.0));
        assert_eq!(
            rate(5000, start.elapsed()),
            77,
            "the average still says 77 rows/s"
        );
        // Work again: 200 rows a second for 4 s; the window still holds 6 idle seconds.
        for s in 1..=4 {
            tokio::time::advance(Duration::from_secs(1)).await;
            recent.record(Instant::now(), 5000 + s * 200);
        }
        assert_eq!(recent.record(Instant::now(), 5800), Some(80.0));
    }

    #[test]
    fn a_flush_point_line_gives_the_rate_since_the_previous_one_and_the_backlog_age() {
        let point = FlushPoint {
            writer: 0,
            writers: 1,
            sequence: 2,
            elapsed: Duration::from_secs(20),
            rows_read: 1000,
            counts: crate::core::metrics::WriterCounts {
                acknowledged: 1000,
                ..Default::default()
            },
            per_destination: Vec::new(),
            delivery: Some(crate::core::delivery::DeliveryCounts {
                messages_read: 1000,
                messages_acked: 1000,
                oldest_unacked: Some(Duration::from_millis(2500)),
                ..Default::default()
            }),
        };
        // 900 rows in the first 10 s, 100 in the 10 s since: 10 rows/s now, 50 on average.
        let line = flush_point_line(&point, (Duration::from_secs(10), 900));
        assert!(
            line.contains(
                "1000 acknowledged (10 rows/s since the previous point, 50 rows/s average)"
            ),
            "{line}"
        );
        assert!(line.ends_with("oldest unacknowledged 2.5 s"), "{line}");
        let first = flush_point_line(&point, (Duration::ZERO, 0));
        assert!(
            first.contains("(50 rows/s since the previous point, 50 rows/s average)"),
            "{first}"
        );
    }

    #[test]
    fn backlog_ages_read_in_the_unit_that_fits() {
        assert_eq!(age_text(Duration::from_millis(800)), "0.8 s");
        assert_eq!(age_text(Duration::from_secs(42)), "42 s");
        assert_eq!(age_text(Duration::from_secs(185)), "3 min 5 s");
    }

    #[test]
    fn the_source_line_tells_confirmed_and_refused_acknowledgements_apart() {
        let mut c = SinkCounters {
            source_read: 10,
            source_acked: 9,
            source_only: true,
            ..SinkCounters::default()
        };
        let plain = c.summary(Duration::from_secs(1));
        assert_eq!(
            plain,
            "Source: 10 message(s) read, 9 acknowledged, 0 nacked"
        );
        c.source_ack_confirmed = 9;
        c.source_ack_refused = 1;
        let eod = c.summary(Duration::from_secs(1));
        assert!(
            eod.ends_with(
                "9 acknowledged, 0 nacked (9 confirmed, 1 refused: lease lapsed, delivered again)"
            ),
            "{eod}"
        );
    }

    #[test]
    fn rate_of_an_instant_statement_is_zero() {
        assert_eq!(rate(100, Duration::ZERO), 0);
        assert_eq!(rate(100, Duration::from_millis(500)), 200);
    }

    /// A sink that only reports the counters it was given.
    #[derive(Debug)]
    struct CountingSink {
        metrics: ExecutionPlanMetricsSet,
        schema: SchemaRef,
    }

    impl DisplayAs for CountingSink {
        fn fmt_as(
            &self,
            _: DisplayFormatType,
            f: &mut std::fmt::Formatter<'_>,
        ) -> std::fmt::Result {
            f.write_str("CountingSink")
        }
    }

    #[async_trait::async_trait]
    impl DataSink for CountingSink {
        fn metrics(&self) -> Option<MetricsSet> {
            Some(self.metrics.clone_inner())
        }

        fn schema(&self) -> &SchemaRef {
            &self.schema
        }

        async fn write_all(
            &self,
            _data: SendableRecordBatchStream,
            _context: &Arc<TaskContext>,
        ) -> datafusion::error::Result<u64> {
            Ok(0)
        }
    }

    #[test]
    fn counters_are_read_by_name_from_a_sink_below_the_root() {
        let metrics = ExecutionPlanMetricsSet::new();
        for (name, value) in [
            (names::RECORDS_SENT, 7),
            (names::RECORDS_ACKED, 5),
            (names::RETRIES, 3),
            (names::RECORDS_DROPPED, 1),
            (names::RECORDS_SKIPPED, 4),
            (names::RESOURCES_CREATED, 1),
            // Another counter must not leak into the seven.
            (names::BYTES_SENT, 1000),
        ] {
            MetricBuilder::new(&metrics).global_counter(name).add(value);
        }
        MetricBuilder::new(&metrics)
            .global_gauge(names::IN_FLIGHT_RECORDS)
            .set(2);
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, true)]));
        let sink = Arc::new(CountingSink {
            metrics,
            schema: Arc::clone(&schema),
        });
        let input = Arc::new(EmptyExec::new(schema));
        let sink_exec: Arc<dyn ExecutionPlan> = Arc::new(DataSinkExec::new(input, sink, None));
        let root: Arc<dyn ExecutionPlan> = Arc::new(CoalescePartitionsExec::new(sink_exec));
        assert_eq!(
            SinkCounters::read(&root),
            Some(SinkCounters {
                sent: 7,
                acked: 5,
                in_flight: 2,
                retries: 3,
                dropped: 1,
                skipped: 4,
                dead_lettered: 0,
                created: 1,
                writers: 0,
                ..SinkCounters::default()
            })
        );
    }

    #[tokio::test]
    async fn plan_without_sink_has_no_counters() {
        let ctx = datafusion::prelude::SessionContext::new();
        let plan = ctx
            .sql("SELECT 1")
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        assert_eq!(SinkCounters::read(&plan), None);
    }
}
