//! What one writer of a running statement is told and tells: which writer it is, the stop
//! request it watches, when it makes flush points, and who hears about them.

use std::sync::Arc;
use std::time::Duration;

use super::metrics::WriterCounts;
use super::stop::StopSignal;

/// One flush point of one writer: every row it had admitted until then is resolved.
///
/// The counts are the writer's own since the statement started (add them over the writers for
/// the statement's), read when the flush point completed: `in_flight` is then 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlushPoint {
    /// The writer (its partition), from 0.
    pub writer: usize,
    /// How many writers the statement runs.
    pub writers: usize,
    /// This writer's flush points so far, this one included (from 1).
    pub sequence: u64,
    /// When the point was made, from the writer's start (the flush then took what it took).
    pub elapsed: Duration,
    /// Rows the writer has read from its input.
    pub rows_read: u64,
    /// The writer's counters.
    pub counts: WriterCounts,
    /// Per destination: records sent and send errors (with `per_destination_metrics` only).
    pub per_destination: Vec<(String, u64, u64)>,
    /// What the input behind the writer did so far (its whole scan), when the input carries
    /// delivery handles ([`crate::core::delivery`]; a subscription).
    pub delivery: Option<crate::core::delivery::DeliveryCounts>,
}

/// Called at each flush point of each writer, from the writer's task: keep it short (send the
/// point to a channel, say).
pub type FlushObserver = Arc<dyn Fn(&FlushPoint) + Send + Sync>;

/// When a writer makes flush points: `flush_interval` and `flush_rows`, whichever comes first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlushSettings {
    /// A flush point this often.
    pub interval: Option<Duration>,
    /// A flush point each time this many rows were read since the last one.
    pub rows: Option<u64>,
}

/// What a writer of a statement runs with besides its input: its place among the writers, the
/// statement's stop request, and who observes its flush points.
#[derive(Clone, Default)]
pub struct WriterContext {
    /// This writer (its partition), from 0.
    pub writer: usize,
    /// How many writers the statement runs.
    pub writers: usize,
    /// The statement's stop request.
    pub stop: StopSignal,
    /// Told about every flush point, if set.
    pub observer: Option<FlushObserver>,
    /// The statement's id, shared by its writers (names its dead-letter objects).
    pub statement: Arc<str>,
    /// The table written to, when the statement names one (for dead letters).
    pub table: Option<Arc<str>>,
    /// The session's runtime (its object stores, for `dead_letter_path`), when there is one.
    pub runtime: Option<Arc<datafusion::execution::runtime_env::RuntimeEnv>>,
    /// Where the writer finds the delivery handle of each input batch, when its input carries
    /// them (see [`crate::core::delivery`]).
    pub delivery: Option<Arc<dyn crate::core::delivery::DeliveryInput>>,
}

impl std::fmt::Debug for WriterContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriterContext")
            .field("writer", &self.writer)
            .field("writers", &self.writers)
            .field("stop", &self.stop)
            .field("observer", &self.observer.is_some())
            .field("statement", &self.statement)
            .field("table", &self.table)
            .field("delivery", &self.delivery.is_some())
            .finish()
    }
}

impl WriterContext {
    /// The only writer of a statement, with a stop request nobody raises and no observer.
    pub fn single() -> Self {
        WriterContext {
            writer: 0,
            writers: 1,
            statement: new_statement_id().into(),
            ..Self::default()
        }
    }
}

/// A new statement id: the UTC time to the millisecond, the process id, a tag drawn once per
/// process and a counter (`20261201T140512.345Z-4242-9f3a1c-7`), unique within a process and
/// sortable by time. The tag keeps two replicas apart that have the same process id (pid 1 in
/// containers) and start in the same millisecond, so their dead-letter objects do not collide.
pub fn new_statement_id() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let seconds = i64::try_from(since.as_secs()).unwrap_or(i64::MAX);
    let time = chrono::DateTime::from_timestamp(seconds, since.subsec_nanos())
        .map(|t| t.format("%Y%m%dT%H%M%S%.3fZ").to_string())
        .unwrap_or_default();
    static TAG: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let tag = TAG.get_or_init(|| fastrand::u32(..) & 0x00ff_ffff);
    format!("{time}-{}-{tag:06x}-{n}", std::process::id())
}

/// The next tick of `ticker`; never, when there is none. A `tokio::select!` arm on it is off
/// without a ticker (a writer without `flush_interval`, a server without reports).
pub async fn next_tick(ticker: &mut Option<tokio::time::Interval>) {
    match ticker.as_mut() {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending::<()>().await,
    }
}
