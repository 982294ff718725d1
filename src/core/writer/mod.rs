//! [`FlowWriter`]: the engine every connector writes through, and its public lifecycle.
//!
//! ```text
//! write(envelope)
//!   -> admit    gate permit (count + bytes), awaited under the progress watchdog
//!   -> route    pool: open lazily; at the cap drain + release the LRU clean destination
//!   -> batch    DestBatches::push; a threshold sends now, the first record arms a delay timer
//!   -> send     spawned send task per batch (<= FlowConfig::concurrent_send_cap RPCs at once)
//!   -> resolve  ack | retry (gax timing) | NOT_FOUND recovery | isolation -> policy -> breaker
//! ```
//!
//! One file per stage:
//!
//! - this file: the lifecycle (`new`, `write`, `write_many`, `reject_encoded`, `flush`,
//!   `settle`, `close`, `delivered`, drop), the writer's shared state and its failure latch;
//! - [`route`]: admission hand-off to a destination's batches, the destination pool (lazy
//!   open, LRU and idle eviction), batch delay timers;
//! - [`send`]: taking batches out of the pool with a lease on their client, the send task,
//!   one RPC attempt under its deadline;
//! - [`resolve`]: what a send's outcome means for each record (ack, retry, NOT_FOUND recovery,
//!   rejection isolation, failure policy and breaker, fatal);
//! - [`stream`]: the writer loop over one writer's input stream (encode, write, flush points,
//!   the statement's stop request, the counts of a failure).
//!
//! Send tasks and delay timers run as tasks of one `JoinSet` owned by the writer, so they
//! make progress while nothing calls the writer, and are aborted when the writer is dropped.

mod resolve;
mod route;
mod send;
mod stream;
#[cfg(test)]
pub(crate) mod tests;

pub use stream::SourceRow;
pub(crate) use stream::write_stream;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::admission::Gate;
use super::batch::Item;
use super::breaker::Breaker;
use super::dead_letter::{DeadClass, DeadLetters, DeadPayload, DeadRow};
use super::delivery::{Delivery, DeliveryHandle, settle_all};
use super::metrics::SinkMetrics;
use super::pool::{self, Pool};
use super::progress::Progress;
use super::rate::Throttle;
use super::{Destination, Envelope, FailurePolicy, FlowConfig, Transport};
use crate::error::{Error, Result};

/// The first failure of a writer.
#[derive(Debug, Default)]
struct Failure {
    /// The error itself, handed out once.
    first: Option<Error>,
    /// Its text, for every later call.
    summary: Option<String>,
}

/// The writer's send tasks and delay timers. Once `closed` (the writer closed or dropped),
/// nothing more is spawned.
#[derive(Default)]
struct Tasks {
    set: JoinSet<()>,
    closed: bool,
}

/// The state a writer shares with its send tasks and delay timers. Each stage adds its own
/// methods from its file (`route`, `send`, `resolve`); this file holds the failure latch and
/// task spawning.
struct Shared<T: Transport> {
    transport: Arc<T>,
    config: FlowConfig,
    metrics: SinkMetrics,
    progress: Arc<Progress>,
    gate: Arc<Gate>,
    breaker: Breaker,
    /// The admission rate: `FlowConfig::max_records_per_second` and the service's load hints.
    throttle: Throttle,
    sends: Semaphore,
    pool: Mutex<Pool<T::Client, T::Record>>,
    failure: Mutex<Failure>,
    /// Set (under the `failure` lock) once `failure.summary` is; read without the lock.
    has_failed: AtomicBool,
    tasks: Mutex<Tasks>,
    /// Records acknowledged (delivered or de-duplicated).
    delivered: AtomicU64,
    /// Records admitted through the gate, whatever became of them.
    admitted: AtomicU64,
    /// Admitted records dropped under the `drop` policy (confirmed rejections).
    dropped: AtomicU64,
    /// Admitted records the service refused under the `fail` policy (confirmed rejections).
    refused: AtomicU64,
    /// Where the `dead_letter` policy puts rows, when it has somewhere.
    dead_letters: Option<DeadLetters<T::Record>>,
    /// Admitted records handed to the dead-letter sink (confirmed rejections; rows the encoder
    /// rejected were never admitted and are not in this count).
    dead_lettered: AtomicU64,
    /// Rows the encoder rejected that went to the dead-letter sink.
    encoding_dead_lettered: AtomicU64,
    /// Rows the encoder rejected whose dead-letter write failed (never admitted, but neither
    /// delivered nor dead-lettered: counted as not delivered).
    encoding_undelivered: AtomicU64,
    /// Which dead-lettered rows are stored, and the delivery handles of those not yet stored.
    dead_book: Mutex<DeadBook>,
    /// Set once the dead-letter sink was asked to finish (a dropped writer asks otherwise).
    dead_letters_finished: AtomicBool,
}

/// The dead-lettered rows of a writer whose dead-letter sink stores them only when it
/// completes an object ([`crate::core::DeadLetterSink::stored_on_write`] is false): the
/// delivery handles of the rows written since the last completed object, settled once it is
/// completed, and the counts of rows whose object failed.
#[derive(Default)]
struct DeadBook {
    /// Handles of rows written to the object being written, one entry per row.
    held: Vec<Arc<dyn DeliveryHandle>>,
    /// `Shared::dead_lettered` when the last object was completed.
    stored_admitted: u64,
    /// `Shared::encoding_dead_lettered` when the last object was completed.
    stored_encoding: u64,
    /// Admitted records written to an object that failed to complete: not stored.
    lost_admitted: u64,
    /// Rows the encoder rejected written to an object that failed to complete: not stored.
    lost_encoding: u64,
}

/// Whether two destinations are the same (the pointer test first: records of one batch usually
/// share one `Arc`).
fn same_destination(a: &Destination, b: &Destination) -> bool {
    Arc::ptr_eq(a, b) || a == b
}

fn lock<M>(m: &Mutex<M>) -> std::sync::MutexGuard<'_, M> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The flow-control engine of one sink writer (one statement).
///
/// ```no_run
/// # use std::sync::Arc;
/// # use gcp_sql::core::{FlowConfig, FlowWriter, SinkMetrics, Envelope, Transport};
/// # async fn demo<T: Transport>(transport: Arc<T>, config: FlowConfig, metrics: SinkMetrics,
/// #     records: Vec<Envelope<T::Record>>) -> gcp_sql::Result<u64> {
/// let mut writer = FlowWriter::new(transport, config, metrics);
/// for envelope in records {
///     writer.write(envelope).await?;
/// }
/// writer.flush().await?;
/// let delivered = writer.delivered();
/// writer.close().await?;
/// # Ok(delivered) }
/// ```
pub struct FlowWriter<T: Transport> {
    shared: Arc<Shared<T>>,
    closed: bool,
}

impl<T: Transport> std::fmt::Debug for FlowWriter<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowWriter")
            .field("config", &self.shared.config)
            .field("delivered", &self.delivered())
            .finish()
    }
}

impl<T: Transport> FlowWriter<T> {
    /// A writer over `transport`. No side effects: spawns nothing, opens nothing.
    pub fn new(transport: Arc<T>, config: FlowConfig, metrics: SinkMetrics) -> Self {
        Self::with_dead_letters(transport, config, metrics, None)
    }

    /// A writer whose `dead_letter` failure policy hands rows to `dead_letters`. Under that
    /// policy without one, the first row to dead-letter fails the statement.
    pub fn with_dead_letters(
        transport: Arc<T>,
        config: FlowConfig,
        metrics: SinkMetrics,
        dead_letters: Option<DeadLetters<T::Record>>,
    ) -> Self {
        let progress = Arc::new(Progress::new(
            config.progress_timeout,
            config.progress_option,
        ));
        let gate = Gate::new(
            config.max_in_flight_records,
            config.max_in_flight_bytes,
            progress.clone(),
            metrics.clone(),
        );
        let shared = Shared {
            breaker: Breaker::new(config.max_consecutive_rejections, config.breaker_option),
            throttle: Throttle::new(config.max_records_per_second),
            sends: Semaphore::new(config.concurrent_send_cap().min(Semaphore::MAX_PERMITS)),
            transport,
            metrics,
            progress,
            gate,
            pool: Mutex::default(),
            failure: Mutex::default(),
            has_failed: AtomicBool::new(false),
            tasks: Mutex::default(),
            delivered: AtomicU64::new(0),
            admitted: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            dead_letters,
            dead_lettered: AtomicU64::new(0),
            encoding_dead_lettered: AtomicU64::new(0),
            encoding_undelivered: AtomicU64::new(0),
            dead_book: Mutex::default(),
            dead_letters_finished: AtomicBool::new(false),
            config,
        };
        FlowWriter {
            shared: Arc::new(shared),
            closed: false,
        }
    }

    /// Admits `envelope` (awaiting room under the progress watchdog; never blocking a runtime
    /// thread), routes it to its destination's batch, and sends when a threshold is hit.
    /// Returns the writer's first fatal error if it has failed.
    pub async fn write(&mut self, envelope: Envelope<T::Record>) -> Result<()> {
        self.write_many(&mut vec![envelope]).await
    }

    /// Writes every envelope of `envelopes` in order (draining it), with the same admission,
    /// routing and batching decisions as calling [`FlowWriter::write`] for each, but admitting
    /// and routing each run of records that fits now under one lock instead of one per record.
    ///
    /// On an error, the envelopes not yet admitted are dropped unsent (and the error returned).
    pub async fn write_many(&mut self, envelopes: &mut Vec<Envelope<T::Record>>) -> Result<()> {
        let shared = &self.shared;
        let mut rest = envelopes.drain(..);
        while let Some(first) = rest.as_slice().first() {
            shared.check()?;
            let destination = first.destination.clone();
            // Under a rate limit the run is cut to the tokens there are (waiting for one).
            let asked = tokio::time::Instant::now();
            let tokens = shared.throttle.take(|| shared.check()).await?;
            if tokens.is_some() {
                shared.metrics.throttled(asked.elapsed());
            }
            let run = rest
                .as_slice()
                .iter()
                .take_while(|e| same_destination(&e.destination, &destination))
                .take(tokens.unwrap_or(usize::MAX))
                .map(|e| e.bytes);
            let permits = shared.gate.try_admit_many(run);
            if let Some(tokens) = tokens {
                // The tokens of records the gate did not admit now go back (when none was,
                // one record waits for the gate below, with its token).
                shared.throttle.unused(tokens - permits.len().max(1));
            }
            let items: Vec<Item<T::Record>> = if permits.is_empty() {
                // The gate is full: this record waits (sending what is open first).
                let Some(envelope) = rest.next() else { break };
                let check = || shared.check();
                let permit = shared
                    .gate
                    .admit(envelope.bytes, check, || shared.send_all_open())
                    .await
                    .map_err(|e| shared.failed(e))?;
                vec![Item::new(envelope, permit)]
            } else {
                permits
                    .into_iter()
                    .zip(&mut rest)
                    .map(|(permit, envelope)| Item::new(envelope, permit))
                    .collect()
            };
            shared
                .admitted
                .fetch_add(items.len() as u64, Ordering::Relaxed);
            shared.throttle.count(items.len());
            shared
                .ensure_open(&destination)
                .await
                .map_err(|e| shared.failed(e))?;
            // A send may have failed the writer since the check above: the run is then dropped
            // unsent (its permits released) rather than batched after the failure.
            shared.check()?;
            shared.enqueue(&destination, items);
        }
        Ok(())
    }

    /// How a row the failure policy took (not under `fail`, which fails the writer) settles
    /// its delivery handle: dropped or dead-lettered.
    pub(crate) fn policy_outcome(&self) -> crate::core::delivery::Delivery {
        match self.shared.config.failure_policy {
            FailurePolicy::DeadLetter => crate::core::delivery::Delivery::DeadLettered,
            FailurePolicy::Drop | FailurePolicy::Fail => crate::core::delivery::Delivery::Dropped,
        }
    }

    /// A row the encoder rejected (a serializer rejection). Under [`FailurePolicy::Fail`]
    /// returns `Err(error)` (and the writer is failed); under [`FailurePolicy::Drop`] counts it
    /// in `records_skipped` and returns `Ok`; under [`FailurePolicy::DeadLetter`] writes it to
    /// the dead-letter sink (the row as `row()` renders it, called only then), counts it in
    /// `records_dead_lettered` and returns `Ok`, or fails the writer when that write fails (the
    /// row then counts as not delivered).
    /// Never counts toward the rejection breaker.
    pub async fn reject_encoded(
        &mut self,
        error: Error,
        row: impl FnOnce() -> DeadPayload,
    ) -> Result<()> {
        self.shared.check()?;
        match self.shared.config.failure_policy {
            FailurePolicy::Fail => Err(self.shared.failed(error)),
            FailurePolicy::Drop => {
                tracing::warn!(%error, "skipping a row the encoder rejected");
                self.shared.metrics.record_skipped();
                Ok(())
            }
            FailurePolicy::DeadLetter => {
                let dead = DeadRow {
                    destination: String::new(),
                    class: DeadClass::Encoding,
                    code: None,
                    message: error.to_string(),
                    attempts: 0,
                    data: row(),
                };
                if let Err(e) = self.shared.dead_letter(dead).await {
                    self.shared
                        .encoding_undelivered
                        .fetch_add(1, Ordering::Relaxed);
                    return Err(self.shared.failed(e));
                }
                tracing::warn!(%error, "dead-lettered a row the encoder rejected");
                self.shared.metrics.encoding_dead_lettered();
                self.shared
                    .encoding_dead_lettered
                    .fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
        }
    }

    /// How a row the failure policy took (an encoder rejection under `drop` or `dead_letter`)
    /// settles its delivery handle: dropped at once; dead-lettered once its dead letter is
    /// stored (at once for a sink that stores on write, else when its object is completed).
    pub(crate) fn settle_taken(&self, handle: Option<&Arc<dyn DeliveryHandle>>) {
        match self.policy_outcome() {
            Delivery::DeadLettered => self.shared.settle_dead_lettered(handle),
            how => {
                if let Some(handle) = handle {
                    handle.settle(1, how);
                }
            }
        }
    }

    /// Completes the dead-letter object written so far (a flush point): the rows in it are
    /// stored, and their delivery handles settled as dead-lettered. Within one shutdown
    /// budget; when that fails, the rows written since the last completed object count as not
    /// delivered, the writer is failed and the error returned.
    pub async fn roll_dead_letters(&mut self) -> Result<()> {
        if self.shared.dead_letters.is_none() {
            return Ok(());
        }
        self.shared
            .commit_dead_letters(false)
            .await
            .map_err(|e| self.shared.failed(e))
    }

    /// Completes the dead-letter sink (an object written as it goes is completed here), once,
    /// at the end of the statement, whether it failed or not, within one shutdown budget.
    /// When that fails (or overruns the budget), the rows written since the last completed
    /// object were not stored: they count as not delivered (and no longer as dead-lettered),
    /// the writer is failed and the error returned.
    pub async fn finish_dead_letters(&mut self) -> Result<()> {
        if self.shared.dead_letters.is_none() {
            return Ok(());
        }
        self.shared
            .dead_letters_finished
            .store(true, Ordering::Release);
        self.shared
            .commit_dead_letters(true)
            .await
            .map_err(|e| self.shared.failed(e))
    }

    /// Rows handed to the dead-letter sink and stored there (or still being written to the
    /// object a later flush point or the end completes): admitted records the service refused
    /// and rows the encoder rejected, less those whose object failed to complete.
    pub fn dead_lettered(&self) -> u64 {
        let s = &self.shared;
        let book = lock(&s.dead_book);
        (s.dead_lettered.load(Ordering::Relaxed) + s.encoding_dead_lettered.load(Ordering::Relaxed))
            .saturating_sub(book.lost_admitted + book.lost_encoding)
    }

    /// Sends every open batch and waits until nothing admitted is unresolved (under the
    /// progress watchdog); then releases destinations idle for longer than
    /// `destination_idle_timeout`, within one shutdown budget.
    pub async fn flush(&mut self) -> Result<()> {
        let shared = &self.shared;
        shared.check()?;
        shared.send_all_open();
        shared
            .progress
            .wait_until(
                "flushing (waiting for every admitted record to resolve)",
                || {
                    shared.check()?;
                    Ok(shared.gate.in_flight().0 == 0)
                },
            )
            .await
            .map_err(|e| shared.failed(e))?;
        shared.evict_idle().await.map_err(|e| shared.failed(e))
    }

    /// Releases every client within one shutdown budget (all are asked before any is awaited);
    /// an overrun is [`Error::ShutdownTimeout`]. Does not flush: call [`FlowWriter::flush`]
    /// first. Sends still outstanding are aborted.
    pub async fn close(mut self) -> Result<()> {
        self.closed = true;
        shutdown(self.shared.clone()).await
    }

    /// After a failure: sends nothing new, waits (at most `shutdown_timeout`) for the sends
    /// already under way to finish, and returns how many admitted records are still unresolved
    /// (never sent, or still in an RPC when the budget ran out).
    ///
    /// A failed statement calls this before [`FlowWriter::close`], so that records already on
    /// the wire are acknowledged or reported instead of being cut off mid-RPC. A statement that
    /// failed outside the writer (its input, say) fails the writer here, so that no batch still
    /// open (its delay timer running) goes out afterwards.
    pub async fn settle(&mut self) -> u64 {
        let shared = &self.shared;
        shared.stop();
        let running = || {
            lock(&shared.pool)
                .dests
                .values()
                .map(|d| d.leases)
                .sum::<usize>()
        };
        // A send task's lease pokes the progress clock as it ends (see `send::Lease`), so this
        // wakes once per finished send and re-counts; nothing polls.
        let wait = shared.progress.wait_quietly(|| running() == 0);
        if tokio::time::timeout(shared.config.shutdown_timeout, wait)
            .await
            .is_err()
        {
            tracing::warn!(
                sends = running(),
                "sends still running when the shutdown budget ran out; they are cut off"
            );
        }
        shared.gate.in_flight().0
    }

    /// Records the service acknowledged so far (delivered and de-duplicated).
    pub fn delivered(&self) -> u64 {
        self.shared.delivered.load(Ordering::Relaxed)
    }

    /// Records admitted so far that are neither acknowledged, nor dropped under the `drop`
    /// policy, nor dead-lettered, nor refused by the service under the `fail` policy (plus the
    /// rows the encoder rejected that could not be dead-lettered, or whose dead-letter sink
    /// failed to finish): the records still to send or in an RPC, and those a failure left behind (never sent, sent without an answer, or
    /// answered with a fatal status). After a failure and [`FlowWriter::settle`], the rows of
    /// the statement that did not land and would on a re-run ([`Error::Incomplete`]).
    pub fn not_delivered(&self) -> u64 {
        let s = &self.shared;
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
        let admitted = load(&s.admitted)
            .saturating_sub(load(&s.delivered))
            .saturating_sub(load(&s.dropped))
            .saturating_sub(load(&s.refused))
            + load(&s.encoding_undelivered);
        let book = lock(&s.dead_book);
        admitted.saturating_sub(load(&s.dead_lettered).saturating_sub(book.lost_admitted))
            + book.lost_encoding
    }

    /// The writer's metrics.
    pub fn metrics(&self) -> &SinkMetrics {
        &self.shared.metrics
    }

    /// The shutdown budget (`shutdown_timeout` or the connector's name for it): what a drain
    /// and a settle may take.
    pub fn shutdown_timeout(&self) -> std::time::Duration {
        self.shared.config.shutdown_timeout
    }
}

impl<T: Transport> Drop for FlowWriter<T> {
    /// A statement cancelled (its future dropped) or failed: outstanding sends are aborted and
    /// the clients are released anyway, bounded by the shutdown budget, in a spawned task when
    /// a runtime is available. No error can be returned from here, so the counts a failed
    /// statement reports ([`Error::Incomplete`]) are logged at warn instead.
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        tracing::warn!(
            acknowledged = self.delivered(),
            not_delivered = self.not_delivered(),
            "writer dropped before it was closed (statement interrupted): {} row(s) were acknowledged; {} admitted row(s) were not delivered",
            self.delivered(),
            self.not_delivered(),
        );
        let set = {
            let mut tasks = lock(&self.shared.tasks);
            tasks.closed = true;
            std::mem::take(&mut tasks.set)
        };
        let mut set = set;
        set.abort_all();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let shared = self.shared.clone();
            handle.spawn(async move {
                if let Err(error) = shutdown_with(shared, set).await {
                    tracing::warn!(%error, "releasing clients of a dropped writer");
                }
            });
            // The rows already dead-lettered are kept: an object written as it goes is
            // completed (within one shutdown budget) rather than abandoned with the writer.
            if let Some(dead_letters) = &self.shared.dead_letters
                && !self
                    .shared
                    .dead_letters_finished
                    .swap(true, Ordering::AcqRel)
            {
                let sink = dead_letters.sink.clone();
                let budget = self.shared.config.shutdown_timeout;
                let held = std::mem::take(&mut lock(&self.shared.dead_book).held);
                handle.spawn(async move {
                    match tokio::time::timeout(budget, sink.finish()).await {
                        Ok(Ok(())) => settle_all(held.iter().map(Some), Delivery::DeadLettered),
                        Ok(Err(error)) => {
                            tracing::warn!(%error, "completing the dead letters of a dropped writer");
                        }
                        Err(_) => tracing::warn!(
                            target = sink.describe(),
                            "completing the dead letters of a dropped writer overran the shutdown budget"
                        ),
                    }
                });
            }
        }
    }
}

async fn shutdown<T: Transport>(shared: Arc<Shared<T>>) -> Result<()> {
    let mut set = {
        let mut tasks = lock(&shared.tasks);
        tasks.closed = true;
        std::mem::take(&mut tasks.set)
    };
    set.abort_all();
    shutdown_with(shared, set).await
}

/// Final release: waits for aborted tasks to let go of their clients, then closes every
/// client, all within one shutdown budget.
async fn shutdown_with<T: Transport>(shared: Arc<Shared<T>>, mut set: JoinSet<()>) -> Result<()> {
    let budget = shared.config.shutdown_timeout;
    let count = lock(&shared.pool).dests.len();
    let work = async {
        while set.join_next().await.is_some() {}
        let clients: Vec<(Destination, T::Client)> = {
            let mut pool = lock(&shared.pool);
            pool.dests
                .drain()
                .filter_map(|(name, d)| pool::unshare(&name, d.client).map(|c| (name, c)))
                .collect()
        };
        let n = clients.len();
        let all =
            futures::future::join_all(clients.into_iter().map(|(_, c)| shared.transport.close(c)));
        all.await;
        n
    };
    match tokio::time::timeout(budget, work).await {
        Ok(n) => {
            tracing::info!(clients = n, "writer closed");
            Ok(())
        }
        Err(_) => Err(Error::ShutdownTimeout {
            option: shared.config.shutdown_option,
            budget,
            clients: count,
        }),
    }
}

impl<T: Transport> Shared<T> {
    /// The writer's state: `Err` once it has failed (the first error once, then its summary).
    fn check(&self) -> Result<()> {
        // Fast path for every write: no lock while the writer has not failed.
        if !self.has_failed.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut f = lock(&self.failure);
        if let Some(e) = f.first.take() {
            return Err(e);
        }
        match &f.summary {
            Some(s) => Err(Error::Failed(s.clone())),
            None => Ok(()),
        }
    }

    /// Marks the writer failed by `e` (if it was not already) and hands `e` back to report.
    fn failed(&self, e: Error) -> Error {
        let mut f = lock(&self.failure);
        if f.summary.is_none() {
            // Debug only: the error is returned to the caller, who reports it (the tool prints it
            // once as `Error: ...`); an ERROR line here would say it twice.
            tracing::debug!(error = %e, "writer failed");
            self.metrics
                .writer_failed(matches!(e, Error::RejectionBreaker { .. }));
            f.summary = Some(e.to_string());
            self.has_failed.store(true, Ordering::Release);
        }
        drop(f);
        self.progress.poke();
        e
    }

    /// The statement ended early for a reason outside the writer: nothing new is sent from now
    /// on (a writer that failed already keeps its first failure).
    fn stop(&self) {
        let mut f = lock(&self.failure);
        if f.summary.is_none() {
            f.summary = Some("the statement stopped before the end of its input".into());
            self.has_failed.store(true, Ordering::Release);
        }
        drop(f);
        self.progress.poke();
    }

    /// A send task's fatal error: kept for the writer's next call.
    fn fail(&self, e: Error) {
        let mut f = lock(&self.failure);
        if f.summary.is_none() {
            // Debug only: the error is returned to the caller, who reports it (the tool prints it
            // once as `Error: ...`); an ERROR line here would say it twice.
            tracing::debug!(error = %e, "writer failed");
            self.metrics
                .writer_failed(matches!(e, Error::RejectionBreaker { .. }));
            f.summary = Some(e.to_string());
            f.first = Some(e);
            self.has_failed.store(true, Ordering::Release);
        }
        drop(f);
        self.progress.poke();
    }

    /// Hands `row` to the dead-letter sink; `Err` (which fails the writer) when there is none
    /// or its write fails.
    async fn dead_letter(&self, row: DeadRow) -> Result<()> {
        match &self.dead_letters {
            Some(dead_letters) => dead_letters.sink.write(row).await,
            None => Err(Error::DeadLetter {
                target: "no dead-letter destination".into(),
                message: "failure_policy 'dead_letter' needs a dead-letter sink \
                          (dead_letter_topic or dead_letter_path)"
                    .into(),
            }),
        }
    }

    /// A row was dead-lettered: its delivery handle, if any, is settled once the row is stored
    /// (now, for a sink that stores on write; else when its object is completed).
    fn settle_dead_lettered(&self, handle: Option<&Arc<dyn DeliveryHandle>>) {
        let Some(handle) = handle else { return };
        match &self.dead_letters {
            Some(d) if !d.sink.stored_on_write() => lock(&self.dead_book).held.push(handle.clone()),
            _ => handle.settle(1, Delivery::DeadLettered),
        }
    }

    /// Completes the dead-letter sink's object (`finish`: for the last time), within one
    /// shutdown budget. Then the rows written so far are stored and their handles settled; on
    /// failure the rows written since the last completed object are counted as lost (never
    /// settled) and the error returned.
    async fn commit_dead_letters(&self, finish: bool) -> Result<()> {
        let Some(dead_letters) = &self.dead_letters else {
            return Ok(());
        };
        let budget = self.config.shutdown_timeout;
        let sink = &dead_letters.sink;
        let done = if finish { sink.finish() } else { sink.roll() };
        let done = match tokio::time::timeout(budget, done).await {
            Ok(done) => done,
            Err(_) => Err(Error::DeadLetter {
                target: sink.describe(),
                message: format!(
                    "completing it took longer than the shutdown budget of {budget:?} ('{}')",
                    self.config.shutdown_option
                ),
            }),
        };
        let admitted = self.dead_lettered.load(Ordering::Relaxed);
        let encoding = self.encoding_dead_lettered.load(Ordering::Relaxed);
        let mut book = lock(&self.dead_book);
        let held = std::mem::take(&mut book.held);
        match done {
            Ok(()) => {
                book.stored_admitted = admitted;
                book.stored_encoding = encoding;
                drop(book);
                settle_all(held.iter().map(Some), Delivery::DeadLettered);
                Ok(())
            }
            Err(e) => {
                book.lost_admitted += admitted.saturating_sub(book.stored_admitted);
                book.lost_encoding += encoding.saturating_sub(book.stored_encoding);
                book.stored_admitted = admitted;
                book.stored_encoding = encoding;
                Err(e)
            }
        }
    }

    /// The dead-letter rendering of a refused record, when the policy will want it.
    fn describe_dead(&self, record: &T::Record) -> Option<DeadPayload> {
        match (&self.config.failure_policy, &self.dead_letters) {
            (FailurePolicy::DeadLetter, Some(dead_letters)) => {
                Some((dead_letters.describe)(record))
            }
            (FailurePolicy::DeadLetter, None) => Some(DeadPayload::default()),
            _ => None,
        }
    }

    fn is_failed(&self) -> bool {
        self.has_failed.load(Ordering::Acquire)
    }

    fn spawn(self: &Arc<Self>, fut: impl Future<Output = ()> + Send + 'static) {
        let mut tasks = lock(&self.tasks);
        if tasks.closed {
            return;
        }
        let mut panicked = false;
        while let Some(done) = tasks.set.try_join_next() {
            panicked |= done.as_ref().err().is_some_and(|e| e.is_panic());
        }
        tasks.set.spawn(fut);
        drop(tasks);
        if panicked {
            self.fail(Error::Failed("a send task panicked".into()));
        }
    }
}
