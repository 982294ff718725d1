//! [`FlowWriter`]: the engine every connector writes through.
//!
//! ```text
//! write(envelope)
//!   -> admit    gate permit (count + bytes), awaited under the progress watchdog
//!   -> route    pool: open lazily; at the cap drain + release the LRU clean destination
//!   -> batch    DestBatches::push; a threshold sends now, the first record arms a delay timer
//!   -> send     spawned send task per batch (<= max_concurrent_sends RPCs at once)
//!   -> resolve  ack | retry (gax timing) | NOT_FOUND recovery | isolation -> policy -> breaker
//! ```
//!
//! Send tasks and delay timers run as tasks of one `JoinSet` owned by the writer, so they
//! make progress while nothing calls the writer, and are aborted when the writer is dropped.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::admission::{Gate, Permit};
use super::batch::{Batch, Item, TimerTag};
use super::breaker::Breaker;
use super::metrics::{SinkMetrics, code_name};
use super::pool::{self, Dest, Pool};
use super::progress::Progress;
use super::{Class, Destination, Envelope, FailurePolicy, FlowConfig, SendOutcome, Transport};
use crate::error::{Error, Result};

/// The first failure of a writer.
#[derive(Debug, Default)]
struct Failure {
    /// The error itself, handed out once.
    first: Option<Error>,
    /// Its text, for every later call.
    summary: Option<String>,
}

#[derive(Default)]
struct Tasks {
    set: JoinSet<()>,
    closed: bool,
}

struct Shared<T: Transport> {
    transport: Arc<T>,
    config: FlowConfig,
    metrics: SinkMetrics,
    progress: Arc<Progress>,
    gate: Arc<Gate>,
    breaker: Breaker,
    sends: Semaphore,
    pool: Mutex<Pool<T::Client, T::Record>>,
    failure: Mutex<Failure>,
    /// Set (under the `failure` lock) once `failure.summary` is; read without the lock.
    has_failed: AtomicBool,
    tasks: Mutex<Tasks>,
    delivered: AtomicU64,
}

/// A batch on its way to a send task, with its lease on the destination's client.
struct Dispatch<T: Transport> {
    destination: Destination,
    lease: Lease<T>,
    batch: Batch<T::Record>,
}

/// A send task's hold on a destination's client: the destination is not clean (and not
/// released) while one is alive.
struct Lease<T: Transport> {
    shared: Arc<Shared<T>>,
    destination: Destination,
    client: Option<Arc<T::Client>>,
}

impl<T: Transport> Drop for Lease<T> {
    fn drop(&mut self) {
        // The client reference goes first, so a clean destination's client is unshared.
        self.client.take();
        if let Some(d) = lock(&self.shared.pool).dests.get_mut(&self.destination) {
            d.leases = d.leases.saturating_sub(1);
        }
        self.shared.progress.poke();
    }
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

/// How often [`FlowWriter::settle`] looks whether the running sends have finished.
const SETTLE_POLL: std::time::Duration = std::time::Duration::from_millis(10);

impl<T: Transport> FlowWriter<T> {
    /// A writer over `transport`. No side effects: spawns nothing, opens nothing.
    pub fn new(transport: Arc<T>, config: FlowConfig, metrics: SinkMetrics) -> Self {
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
            sends: Semaphore::new(config.max_concurrent_sends.clamp(1, Semaphore::MAX_PERMITS)),
            transport,
            metrics,
            progress,
            gate,
            pool: Mutex::default(),
            failure: Mutex::default(),
            has_failed: AtomicBool::new(false),
            tasks: Mutex::default(),
            delivered: AtomicU64::new(0),
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
            let run = rest
                .as_slice()
                .iter()
                .take_while(|e| same_destination(&e.destination, &destination))
                .map(|e| e.bytes);
            let permits = shared.gate.try_admit_many(run);
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

    /// A row the encoder rejected (a serializer rejection). Under [`FailurePolicy::Fail`]
    /// returns `Err(error)` (and the writer is failed); under [`FailurePolicy::Drop`] counts it
    /// in `records_skipped` and returns `Ok`. Never counts toward the rejection breaker.
    pub fn reject_encoded(&mut self, error: Error) -> Result<()> {
        self.shared.check()?;
        match self.shared.config.failure_policy {
            FailurePolicy::Fail => Err(self.shared.failed(error)),
            FailurePolicy::Drop => {
                tracing::warn!(%error, "skipping a row the encoder rejected");
                self.shared.metrics.record_skipped();
                Ok(())
            }
        }
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
    /// the wire are acknowledged or reported instead of being cut off mid-RPC.
    pub async fn settle(&mut self) -> u64 {
        let shared = &self.shared;
        let running = || {
            lock(&shared.pool)
                .dests
                .values()
                .map(|d| d.leases)
                .sum::<usize>()
        };
        let wait = async {
            // Leases end when send tasks finish; poll, as a lease ends without a notification.
            while running() > 0 {
                tokio::time::sleep(SETTLE_POLL).await;
            }
        };
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

    /// The writer's metrics.
    pub fn metrics(&self) -> &SinkMetrics {
        &self.shared.metrics
    }
}

impl<T: Transport> Drop for FlowWriter<T> {
    /// A statement cancelled (its future dropped) or failed: outstanding sends are aborted and
    /// the clients are released anyway, bounded by the shutdown budget, in a spawned task when
    /// a runtime is available.
    fn drop(&mut self) {
        if self.closed {
            return;
        }
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
            tracing::error!(error = %e, "writer failed");
            f.summary = Some(e.to_string());
            self.has_failed.store(true, Ordering::Release);
        }
        drop(f);
        self.progress.poke();
        e
    }

    /// A send task's fatal error: kept for the writer's next call.
    fn fail(&self, e: Error) {
        let mut f = lock(&self.failure);
        if f.summary.is_none() {
            tracing::error!(error = %e, "writer failed");
            f.summary = Some(e.to_string());
            f.first = Some(e);
            self.has_failed.store(true, Ordering::Release);
        }
        drop(f);
        self.progress.poke();
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

    /// Takes a lease on `destination`'s client for a batch (the pool lock is held by the caller).
    fn lease(
        self: &Arc<Self>,
        destination: &Destination,
        dest: &mut Dest<T::Client, T::Record>,
    ) -> Lease<T> {
        dest.leases += 1;
        Lease {
            shared: self.clone(),
            destination: destination.clone(),
            client: Some(dest.client.clone()),
        }
    }

    fn launch(self: &Arc<Self>, dispatches: Vec<Dispatch<T>>) {
        for d in dispatches {
            let shared = self.clone();
            self.spawn(async move { shared.run_batch(d).await });
        }
    }

    /// Sends every open batch now (a flush, a blocked admission, a drain).
    fn send_all_open(self: &Arc<Self>) {
        let mut out = Vec::new();
        {
            let mut pool = lock(&self.pool);
            for (name, dest) in pool.dests.iter_mut() {
                for batch in dest.batches.take_ready() {
                    out.push(Dispatch {
                        destination: name.clone(),
                        lease: self.lease(name, dest),
                        batch,
                    });
                }
            }
        }
        self.launch(out);
    }

    /// Routes admitted records, all bound for `name`, into its batches under one pool lock, and
    /// sends the batches that reach a threshold.
    fn enqueue(self: &Arc<Self>, name: &Destination, items: Vec<Item<T::Record>>) {
        let mut out = Vec::new();
        let mut timers = Vec::new();
        {
            let mut pool = lock(&self.pool);
            let Some(dest) = pool.dests.get_mut(name) else {
                // ensure_open ran just before without an await in between; unreachable, but a
                // lost record must not pass silently.
                drop(pool);
                self.fail(Error::Failed(format!(
                    "destination '{name}' vanished from the pool"
                )));
                return;
            };
            dest.last_used = Instant::now();
            for item in items {
                let pushed = dest.batches.push(item);
                for batch in pushed.ready {
                    out.push(Dispatch {
                        destination: name.clone(),
                        lease: self.lease(name, dest),
                        batch,
                    });
                }
                timers.extend(pushed.timer);
            }
        }
        self.launch(out);
        for tag in timers {
            let shared = self.clone();
            let name = name.clone();
            let delay = self.config.batch.max_delay;
            self.spawn(async move {
                tokio::time::sleep(delay).await;
                shared.on_timer(&name, &tag);
            });
        }
    }

    fn on_timer(self: &Arc<Self>, name: &Destination, tag: &TimerTag) {
        let mut out = Vec::new();
        {
            let mut pool = lock(&self.pool);
            if let Some(dest) = pool.dests.get_mut(name)
                && let Some(batch) = dest.batches.on_timer(tag)
            {
                out.push(Dispatch {
                    destination: name.clone(),
                    lease: self.lease(name, dest),
                    batch,
                });
            }
        }
        self.launch(out);
    }

    fn key_done(self: &Arc<Self>, name: &Destination, key: &Arc<str>) {
        if self.is_failed() {
            return;
        }
        let mut out = Vec::new();
        {
            let mut pool = lock(&self.pool);
            if let Some(dest) = pool.dests.get_mut(name)
                && let Some(batch) = dest.batches.key_done(key)
            {
                out.push(Dispatch {
                    destination: name.clone(),
                    lease: self.lease(name, dest),
                    batch,
                });
            }
        }
        self.launch(out);
    }

    /// Makes sure `name` has an open client, evicting the LRU clean destination at the cap.
    async fn ensure_open(self: &Arc<Self>, name: &Destination) -> Result<()> {
        if lock(&self.pool).dests.contains_key(name) {
            return Ok(());
        }
        let cap = self.config.max_active_destinations.max(1);
        while lock(&self.pool).dests.len() >= cap {
            self.evict_one().await?;
        }
        let client = self.transport.open(name).await?;
        tracing::debug!(destination = %name, "opened a client");
        lock(&self.pool)
            .dests
            .insert(name.clone(), Dest::new(client, self.config.batch));
        Ok(())
    }

    /// Releases the least-recently-used clean destination, draining first when none is clean.
    async fn evict_one(self: &Arc<Self>) -> Result<()> {
        if lock(&self.pool).lru_clean().is_none() {
            self.send_all_open();
            self.progress
                .wait_until(
                    "draining a destination before evicting it (max active destinations)",
                    || {
                        self.check()?;
                        Ok(lock(&self.pool).lru_clean().is_some())
                    },
                )
                .await?;
        }
        let taken = {
            let mut pool = lock(&self.pool);
            let name = pool.lru_clean();
            name.and_then(|n| pool.dests.remove(&n).map(|d| (n, d)))
        };
        let Some((name, dest)) = taken else {
            return Ok(());
        };
        tracing::info!(destination = %name, "evicting the least-recently-used destination (cap reached)");
        let clients: Vec<_> = pool::unshare(&name, dest.client)
            .map(|c| (name, c))
            .into_iter()
            .collect();
        pool::release(
            &*self.transport,
            clients,
            self.config.shutdown_timeout,
            self.config.shutdown_option,
        )
        .await
    }

    /// Releases destinations idle for longer than the idle timeout (after a successful flush).
    async fn evict_idle(self: &Arc<Self>) -> Result<()> {
        let clients: Vec<(Destination, T::Client)> = {
            let mut pool = lock(&self.pool);
            let idle = pool.idle(Instant::now(), self.config.destination_idle_timeout);
            idle.into_iter()
                .filter_map(|name| {
                    let d = pool.dests.remove(&name)?;
                    tracing::info!(destination = %name, "evicting an idle destination");
                    pool::unshare(&name, d.client).map(|c| (name, c))
                })
                .collect()
        };
        pool::release(
            &*self.transport,
            clients,
            self.config.shutdown_timeout,
            self.config.shutdown_option,
        )
        .await
    }

    /// A send task: resolves one batch, then lets its sequence key move on.
    async fn run_batch(self: Arc<Self>, dispatch: Dispatch<T>) {
        let Dispatch {
            destination,
            lease,
            batch,
        } = dispatch;
        let Some(client) = lease.client.clone() else {
            return;
        };
        // Records leave the gate (their permits drop) only after their outcome is counted and,
        // for a failure, after the writer is marked failed: a waiting write must neither see a
        // delivered count that lags the permits nor slip in past a failure.
        let mut retired = Vec::new();
        if let Err(e) = self
            .resolve(&destination, &client, batch.items, &mut retired)
            .await
        {
            self.fail(e);
        }
        // One gate release for the whole batch rather than one per record.
        Permit::release_all(retired.into_iter().map(|item| item.permit));
        drop(client);
        if let Some(key) = &batch.key {
            self.key_done(&destination, key);
        }
        drop(lease);
    }

    /// One RPC attempt: one status for the whole batch, or exactly one per item.
    async fn attempt(
        &self,
        destination: &Destination,
        client: &T::Client,
        items: &mut [Item<T::Record>],
        timeout: Option<std::time::Duration>,
    ) -> SendOutcome {
        let n = items.len();
        let Ok(_permit) = self.sends.acquire().await else {
            return SendOutcome::Whole(Err(tonic::Status::cancelled("writer closed")));
        };
        let (mut records, mut bytes) = (0u64, 0u64);
        for item in items.iter_mut().filter(|i| !i.counted) {
            item.counted = true;
            records += 1;
            bytes = bytes.saturating_add(item.envelope.bytes);
        }
        if records > 0 {
            self.metrics.sent(
                destination,
                records,
                bytes,
                self.config.per_destination_metrics,
            );
        }
        let batch: Vec<&T::Record> = items.iter().map(|i| &i.envelope.record).collect();
        let start = Instant::now();
        let send = self.transport.send(client, destination, &batch, timeout);
        let outcome = match timeout {
            Some(t) => tokio::time::timeout(t, send).await.unwrap_or_else(|_| {
                SendOutcome::Whole(Err(tonic::Status::deadline_exceeded(format!(
                    "no answer within the {t:?} attempt deadline"
                ))))
            }),
            None => send.await,
        };
        self.metrics.rpc(start.elapsed());
        let outcome = match outcome {
            SendOutcome::PerRecord(mut v) if v.len() != n => {
                let msg = format!(
                    "the transport returned {} statuses for {n} records",
                    v.len()
                );
                v.resize_with(n, || Err(tonic::Status::internal(msg.clone())));
                v.truncate(n);
                SendOutcome::PerRecord(v)
            }
            other => other,
        };
        let failed = match &outcome {
            SendOutcome::Whole(r) => r.as_ref().map_or(n, |_| 0),
            SendOutcome::PerRecord(v) => v.iter().filter(|r| r.is_err()).count(),
        };
        tracing::debug!(operation = self.transport.operation(), %destination, records = n, failed, "send attempt resolved");
        outcome
    }

    /// Resolves a batch: acks, retries, recovers, isolates and applies the failure policy until
    /// every item is resolved, or returns the error that fails the writer.
    async fn resolve(
        self: &Arc<Self>,
        destination: &Destination,
        client: &T::Client,
        mut items: Vec<Item<T::Record>>,
        retired: &mut Vec<Item<T::Record>>,
    ) -> Result<()> {
        let cfg = &self.config;
        let operation = self.transport.operation();
        let mut retry = cfg.retry.start(Instant::now());
        let mut recovery_attempts = 0u32;
        let mut created = false;
        let mut first_rejection: Option<Error> = None;
        loop {
            let solo = items.len() == 1;
            let timeout = retry.begin_attempt(Instant::now());
            let results = match self.attempt(destination, client, &mut items, timeout).await {
                SendOutcome::Whole(Ok(())) => {
                    // The common case, without a status per record.
                    let acked = items.len() as u64;
                    retired.append(&mut items);
                    self.metrics.acked(acked, 0);
                    self.delivered.fetch_add(acked, Ordering::Relaxed);
                    self.breaker.on_success();
                    return first_rejection.map_or(Ok(()), Err);
                }
                SendOutcome::Whole(r) => vec![r; items.len()],
                SendOutcome::PerRecord(v) => v,
            };
            let (mut acked, mut duplicates) = (0u64, 0u64);
            let mut again: Vec<Item<T::Record>> = Vec::new();
            let mut rejected: Vec<(Item<T::Record>, tonic::Status)> = Vec::new();
            let mut last: Option<tonic::Status> = None;
            let mut missing = false;
            let mut fatal: Option<tonic::Status> = None;
            for (item, result) in items.into_iter().zip(results) {
                let (class, status) = match result {
                    Ok(()) => (Class::Ok, None),
                    Err(status) => (self.transport.classify(&status, solo), Some(status)),
                };
                match class {
                    Class::Ok => {
                        acked += 1;
                        retired.push(item);
                    }
                    Class::Duplicate => {
                        acked += 1;
                        duplicates += 1;
                        retired.push(item);
                    }
                    _ => {
                        let status = status.unwrap_or_else(|| tonic::Status::unknown("no status"));
                        self.metrics.send_error(
                            destination,
                            status.code(),
                            1,
                            cfg.per_destination_metrics,
                        );
                        match class {
                            Class::Retryable => again.push(item),
                            Class::NotFound => {
                                missing = true;
                                again.push(item);
                            }
                            Class::Rejected => {
                                rejected.push((item, status.clone()));
                                continue;
                            }
                            _ => {
                                fatal = Some(status.clone());
                                retired.push(item);
                            }
                        }
                        last = Some(status);
                    }
                }
            }
            if acked > 0 {
                self.metrics.acked(acked, duplicates);
                self.delivered.fetch_add(acked, Ordering::Relaxed);
                self.breaker.on_success();
            }
            if let Some(status) = fatal {
                retired.append(&mut again);
                retired.extend(rejected.into_iter().map(|(item, _)| item));
                return Err(rpc_error(operation, destination, &status, retry.attempts()));
            }
            for (item, status) in rejected {
                let outcome = if solo {
                    retired.push(item);
                    self.confirmed_rejection(destination, &status)
                } else {
                    tracing::warn!(%destination, code = code_name(status.code()), "isolating a rejected record by sending it alone");
                    Box::pin(self.resolve(destination, client, vec![item], retired)).await
                };
                match outcome {
                    Ok(()) => {}
                    // Under the fail policy the first confirmed rejection fails the statement,
                    // but the isolation pass still runs to its end, so the good records batched
                    // with the bad one are delivered rather than left unresolved behind it.
                    Err(e @ Error::Rejected { .. }) => {
                        first_rejection.get_or_insert(e);
                    }
                    Err(e) => {
                        retired.append(&mut again);
                        return Err(e);
                    }
                }
            }
            if again.is_empty() {
                return first_rejection.map_or(Ok(()), Err);
            }
            let status = last.unwrap_or_else(|| tonic::Status::unknown("no status"));
            let delay = if missing {
                let Some(recovery) = &cfg.not_found else {
                    retired.append(&mut again);
                    return Err(rpc_error(operation, destination, &status, retry.attempts()));
                };
                recovery_attempts += 1;
                if recovery_attempts >= recovery.max_attempts {
                    retired.append(&mut again);
                    return Err(Error::RecoveryExhausted {
                        destination: destination.to_string(),
                        option: recovery.attempts_option,
                        attempts: recovery_attempts,
                        message: status.message().to_string(),
                    });
                }
                if recovery.create && !created {
                    let made = match self.transport.create_destination(client, destination).await {
                        Ok(made) => made,
                        Err(e) => {
                            retired.append(&mut again);
                            return Err(e);
                        }
                    };
                    if made {
                        tracing::info!(%destination, "created a missing destination");
                        self.metrics.resource_created();
                    }
                    created = true;
                }
                // The transient budget starts over once the destination is back.
                retry = cfg.retry.start(Instant::now());
                recovery.backoff.delay(recovery_attempts)
            } else {
                match retry.next_delay(Instant::now()) {
                    Some(d) => d,
                    None => {
                        retired.append(&mut again);
                        return Err(retry_exhausted(
                            rpc_error(operation, destination, &status, retry.attempts()),
                            cfg.retry_option,
                        ));
                    }
                }
            };
            self.metrics.retried();
            tracing::warn!(%destination, code = code_name(status.code()), records = again.len(), ?delay, "retrying a send");
            let parked = Parked::new(&self.metrics, again.len() as u64);
            tokio::time::sleep(delay).await;
            drop(parked);
            items = again;
        }
    }

    fn confirmed_rejection(&self, destination: &Destination, status: &tonic::Status) -> Result<()> {
        match self.config.failure_policy {
            FailurePolicy::Fail => {
                self.metrics.rejected();
                Err(Error::Rejected {
                    destination: destination.to_string(),
                    code: status.code(),
                    message: status.message().to_string(),
                })
            }
            FailurePolicy::Drop => {
                self.metrics.rejected_and_dropped();
                tracing::warn!(%destination, code = code_name(status.code()), message = status.message(), "dropping a rejected record");
                self.breaker.on_confirmed_rejection()
            }
        }
    }
}

/// Names the option behind a spent retry budget, when the connector has one.
fn retry_exhausted(error: Error, option: Option<&'static str>) -> Error {
    match option {
        Some(option) => Error::RetryExhausted {
            source: Box::new(error),
            option,
        },
        None => error,
    }
}

fn rpc_error(
    operation: &'static str,
    destination: &Destination,
    status: &tonic::Status,
    attempts: u32,
) -> Error {
    Error::rpc(operation, destination, status, attempts)
}

/// Counts records in `parked_for_retry` while alive (an aborted sleep uncounts them too).
struct Parked<'a> {
    metrics: &'a SinkMetrics,
    records: u64,
}

impl<'a> Parked<'a> {
    fn new(metrics: &'a SinkMetrics, records: u64) -> Self {
        metrics.parked(records);
        Parked { metrics, records }
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.metrics.unparked(self.records);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
    use tonic::Code;

    use super::*;
    use crate::core::metrics::names;
    use crate::core::{Backoff, BatchThresholds, RecoverySettings, RetrySettings};
    use crate::testing::{FakeReply, FakeTransport};

    type Fake = FakeTransport<u32>;

    fn config() -> FlowConfig {
        FlowConfig {
            max_in_flight_records: 100,
            max_in_flight_bytes: u64::MAX,
            in_flight_option: "max_in_flight_messages",
            progress_timeout: Some(Duration::from_secs(600)),
            progress_option: "publish_progress_timeout",
            shutdown_timeout: Duration::from_secs(30),
            shutdown_option: "shutdown_timeout",
            max_active_destinations: 10,
            destination_idle_timeout: Duration::from_secs(300),
            per_destination_metrics: false,
            max_consecutive_rejections: Some(100),
            breaker_option: "max_consecutive_rejections",
            batch: BatchThresholds {
                max_records: 10,
                max_bytes: 1_000_000,
                max_delay: Duration::from_millis(10),
            },
            retry: RetrySettings {
                total_timeout: Duration::ZERO,
                max_attempts: 5,
                initial_retry_delay: Duration::from_millis(100),
                retry_delay_multiplier: 2.0,
                max_retry_delay: Duration::from_secs(1),
                initial_rpc_timeout: Duration::ZERO,
                rpc_timeout_multiplier: 1.0,
                max_rpc_timeout: Duration::ZERO,
                jitter: false,
            },
            retry_option: Some("retry_max_attempts"),
            not_found: None,
            failure_policy: FailurePolicy::Fail,
            max_concurrent_sends: 10,
        }
    }

    struct Harness {
        fake: Arc<Fake>,
        writer: FlowWriter<Fake>,
        set: ExecutionPlanMetricsSet,
    }

    impl Harness {
        fn new(config: FlowConfig) -> Self {
            let fake = Arc::new(Fake::new());
            let set = ExecutionPlanMetricsSet::new();
            let writer = FlowWriter::new(fake.clone(), config, SinkMetrics::new(&set));
            Harness { fake, writer, set }
        }

        fn metric(&self, name: &str) -> usize {
            self.set
                .clone_inner()
                .sum_by_name(name)
                .map(|v| v.as_usize())
                .unwrap_or(0)
        }

        async fn write(&mut self, n: u32, destination: &str) -> Result<()> {
            self.writer.write(envelope(n, destination, None)).await
        }

        async fn write_all(
            &mut self,
            range: std::ops::RangeInclusive<u32>,
            destination: &str,
        ) -> Result<()> {
            for n in range {
                self.write(n, destination).await?;
            }
            Ok(())
        }
    }

    fn envelope(n: u32, destination: &str, key: Option<&str>) -> Envelope<u32> {
        Envelope {
            record: n,
            bytes: 10,
            destination: Arc::from(destination),
            sequence_key: key.map(Arc::from),
        }
    }

    fn sorted(mut v: Vec<u32>) -> Vec<u32> {
        v.sort_unstable();
        v
    }

    #[tokio::test(start_paused = true)]
    async fn new_writer_has_no_side_effects() {
        let h = Harness::new(config());
        tokio::task::yield_now().await;
        assert!(h.fake.opened().is_empty());
        assert!(h.fake.calls().is_empty());
        drop(h.writer);
        tokio::task::yield_now().await;
        assert!(h.fake.closed().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn delay_timer_sends_while_the_writer_is_not_called() {
        let mut h = Harness::new(config());
        h.write(1, "d").await.expect("write");
        assert!(h.fake.calls().is_empty(), "below every threshold");
        // The input stalls: nothing calls the writer, the 10 ms delay still sends the batch.
        tokio::time::sleep(Duration::from_millis(11)).await;
        assert_eq!(h.fake.batches(), vec![vec![1]]);
        assert_eq!(h.writer.delivered(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn count_threshold_sends_full_batches_and_flush_sends_the_rest() {
        let mut h = Harness::new(config());
        h.write_all(1..=25, "d").await.expect("write");
        h.writer.flush().await.expect("flush");
        let sizes: Vec<usize> = h.fake.batches().iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![10, 10, 5]);
        assert_eq!(h.writer.delivered(), 25);
        assert_eq!(h.metric(names::RECORDS_SENT), 25);
        assert_eq!(h.metric(names::RECORDS_ACKED), 25);
        assert_eq!(h.metric(names::BYTES_SENT), 250);
        assert_eq!(h.metric(names::SEND_RPCS), 3);
        assert_eq!(h.metric(names::IN_FLIGHT_RECORDS), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn writing_many_batches_like_writing_one_by_one_across_destinations_and_a_full_gate() {
        let mut c = config();
        c.max_in_flight_records = 15;
        c.batch.max_records = 4;
        let mut h = Harness::new(c);
        h.fake
            .respond_with(|_| FakeReply::Delay(Duration::from_secs(1), Box::new(FakeReply::Ok)));
        let mut envelopes: Vec<Envelope<u32>> = (1..=30)
            .map(|n| envelope(n, if n <= 20 { "a" } else { "b" }, None))
            .collect();
        let start = Instant::now();
        h.writer.write_many(&mut envelopes).await.expect("write");
        assert!(envelopes.is_empty(), "the input is drained");
        // 15 fit at once; the 16th waited for the first batches to resolve, 1 s in.
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        assert_eq!(h.metric(names::IN_FLIGHT_RECORDS_HIGH_WATER), 15);
        h.writer.flush().await.expect("flush");
        assert_eq!(h.writer.delivered(), 30);
        let calls = h.fake.calls();
        let to = |d: &str| -> Vec<Vec<u32>> {
            calls
                .iter()
                .filter(|c| &*c.destination == d)
                .map(|c| c.records.clone())
                .collect()
        };
        // Batches per destination in admission order, cut at 4 records; the blocked admission of
        // 16 sent the open [13, 14, 15] first, and the flush sent the [20] left open.
        assert_eq!(
            to("a"),
            vec![
                vec![1, 2, 3, 4],
                vec![5, 6, 7, 8],
                vec![9, 10, 11, 12],
                vec![13, 14, 15],
                vec![16, 17, 18, 19],
                vec![20]
            ]
        );
        assert_eq!(
            to("b"),
            vec![vec![21, 22, 23, 24], vec![25, 26, 27, 28], vec![29, 30]]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn write_at_the_in_flight_cap_waits_for_a_completion() {
        let mut c = config();
        c.max_in_flight_records = 2;
        c.batch.max_records = 1;
        let mut h = Harness::new(c);
        h.fake
            .respond_with(|_| FakeReply::Delay(Duration::from_secs(5), Box::new(FakeReply::Ok)));
        let start = Instant::now();
        h.write_all(1..=3, "d").await.expect("write");
        // The third write waited for the first completion, 5 s in.
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        assert_eq!(h.metric(names::IN_FLIGHT_RECORDS_HIGH_WATER), 2);
        h.writer.flush().await.expect("flush");
        assert_eq!(h.writer.delivered(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn retryable_failure_is_retried_and_counted_once_as_sent() {
        let mut h = Harness::new(config());
        h.fake
            .push(FakeReply::code(Code::Unavailable))
            .push(FakeReply::code(Code::ResourceExhausted));
        h.write_all(1..=3, "d").await.expect("write");
        let start = Instant::now();
        h.writer.flush().await.expect("flush");
        // 100 ms then 200 ms of backoff.
        assert_eq!(start.elapsed(), Duration::from_millis(300));
        assert_eq!(h.fake.batches(), vec![vec![1, 2, 3]; 3]);
        assert_eq!(
            h.metric(names::RECORDS_SENT),
            3,
            "each record once, never per retry"
        );
        assert_eq!(h.metric(names::SEND_RPCS), 3);
        assert_eq!(h.metric(names::RETRIES), 2);
        assert_eq!(h.metric(names::SEND_ERRORS), 6);
        assert_eq!(h.metric(names::SEND_ERRORS_BY_CODE), 6);
        let snapshot = h.writer.metrics().snapshot();
        assert_eq!(
            snapshot.send_errors_by_code.get(&Code::Unavailable),
            Some(&3)
        );
        assert_eq!(snapshot.parked_for_retry, 0);
        assert_eq!(h.writer.delivered(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn records_waiting_out_a_backoff_are_parked_and_stay_in_flight() {
        let mut h = Harness::new(config());
        h.fake.push(FakeReply::code(Code::Unavailable));
        h.write_all(1..=2, "d").await.expect("write");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(h.metric(names::PARKED_FOR_RETRY), 2);
        assert_eq!(h.metric(names::IN_FLIGHT_RECORDS), 2);
        h.writer.flush().await.expect("flush");
        assert_eq!(h.metric(names::PARKED_FOR_RETRY), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn retry_exhaustion_names_operation_destination_and_code() {
        let mut c = config();
        c.retry.max_attempts = 3;
        let mut h = Harness::new(c);
        h.fake.respond_with(|_| FakeReply::code(Code::Unavailable));
        h.write(1, "projects/p/topics/t").await.expect("write");
        match h.writer.flush().await {
            Err(Error::RetryExhausted { source, option }) => {
                assert_eq!(option, "retry_max_attempts");
                let Error::Rpc {
                    operation,
                    destination,
                    code,
                    attempts,
                    ..
                } = *source
                else {
                    panic!("unexpected {source:?}");
                };
                assert_eq!(operation, "FakeSend");
                assert_eq!(destination, "projects/p/topics/t");
                assert_eq!(code, Code::Unavailable);
                assert_eq!(attempts, 3);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(h.metric(names::RETRIES), 2);
        // Later calls report the failure by its summary.
        assert!(matches!(
            h.write(2, "projects/p/topics/t").await,
            Err(Error::Failed(_))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn attempt_deadline_is_passed_and_enforced() {
        let mut c = config();
        c.retry.initial_rpc_timeout = Duration::from_secs(1);
        c.retry.max_rpc_timeout = Duration::from_secs(1);
        let mut h = Harness::new(c);
        h.fake.push(FakeReply::Delay(
            Duration::from_secs(3600),
            Box::new(FakeReply::Ok),
        ));
        h.write(1, "d").await.expect("write");
        h.writer.flush().await.expect("the retry succeeds");
        let calls = h.fake.calls();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].timeout, Some(Duration::from_secs(1)));
        assert_eq!(
            h.writer
                .metrics()
                .snapshot()
                .send_errors_by_code
                .get(&Code::DeadlineExceeded),
            Some(&1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn fatal_status_fails_the_writer_with_its_first_error() {
        let mut h = Harness::new(config());
        h.fake.push(FakeReply::code(Code::PermissionDenied));
        h.write(1, "d").await.expect("write");
        assert!(matches!(
            h.writer.flush().await,
            Err(Error::Rpc {
                code: Code::PermissionDenied,
                attempts: 1,
                ..
            })
        ));
        assert!(matches!(h.writer.flush().await, Err(Error::Failed(_))));
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_waiting_at_the_cap_does_not_slip_in_past_a_failure() {
        let mut c = config();
        c.max_in_flight_records = 1;
        c.batch.max_records = 1;
        let mut h = Harness::new(c);
        h.fake.push(FakeReply::code(Code::PermissionDenied));
        h.write(1, "d").await.expect("the first write is admitted");
        // The second write waits for the first record's permit; that permit is released only
        // after the writer is marked failed, so the second record is never sent.
        assert!(h.write(2, "d").await.is_err());
        assert_eq!(h.fake.batches(), vec![vec![1]]);
    }

    #[tokio::test(start_paused = true)]
    async fn delivered_is_final_when_flush_returns() {
        let mut h = Harness::new(config());
        h.fake
            .respond_with(|_| FakeReply::Delay(Duration::from_millis(5), Box::new(FakeReply::Ok)));
        h.write_all(1..=50, "d").await.expect("write");
        h.writer.flush().await.expect("flush");
        assert_eq!(h.writer.delivered(), 50);
        assert_eq!(h.metric(names::RECORDS_ACKED), 50);
    }

    #[tokio::test(start_paused = true)]
    async fn per_record_failures_retry_only_the_failed_entries() {
        let mut h = Harness::new(config());
        h.fake.push(FakeReply::PerRecord(vec![
            Ok(()),
            Err(tonic::Status::unavailable("busy")),
            Ok(()),
        ]));
        h.write_all(1..=3, "d").await.expect("write");
        h.writer.flush().await.expect("flush");
        assert_eq!(h.fake.batches(), vec![vec![1, 2, 3], vec![2]]);
        assert_eq!(h.writer.delivered(), 3);
        assert_eq!(h.metric(names::RECORDS_SENT), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn duplicate_counts_as_delivered_and_deduplicated() {
        let mut h = Harness::new(config());
        h.fake.push(FakeReply::PerRecord(vec![
            Ok(()),
            Err(tonic::Status::already_exists("task exists")),
        ]));
        h.write_all(1..=2, "d").await.expect("write");
        h.writer.flush().await.expect("flush");
        assert_eq!(h.writer.delivered(), 2);
        assert_eq!(h.metric(names::RECORDS_DEDUPLICATED), 1);
        assert_eq!(h.metric(names::RECORDS_ACKED), 2);
    }

    fn reject_seven(fake: &Fake) {
        fake.respond_with(|call| {
            if call.records.contains(&7) {
                FakeReply::code(Code::InvalidArgument)
            } else {
                FakeReply::Ok
            }
        });
    }

    #[tokio::test(start_paused = true)]
    async fn isolation_finds_the_one_bad_record_in_a_batch_of_ten() {
        let mut c = config();
        c.failure_policy = FailurePolicy::Drop;
        let mut h = Harness::new(c);
        reject_seven(&h.fake);
        h.write_all(1..=10, "d").await.expect("write");
        h.writer.flush().await.expect("flush");
        let batches = h.fake.batches();
        assert_eq!(batches[0], (1..=10).collect::<Vec<_>>());
        // Every record of the refused batch is re-sent alone.
        assert_eq!(
            sorted(batches[1..].iter().map(|b| b[0]).collect()),
            (1..=10).collect::<Vec<_>>()
        );
        assert!(batches[1..].iter().all(|b| b.len() == 1));
        assert_eq!(h.writer.delivered(), 9);
        assert_eq!(h.metric(names::RECORDS_ACKED), 9);
        assert_eq!(h.metric(names::RECORDS_REJECTED), 1);
        assert_eq!(h.metric(names::RECORDS_DROPPED), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn fail_policy_fails_at_the_first_confirmed_rejection() {
        let mut h = Harness::new(config());
        reject_seven(&h.fake);
        h.write_all(1..=10, "projects/p/topics/t")
            .await
            .expect("write");
        match h.writer.flush().await {
            Err(Error::Rejected {
                destination, code, ..
            }) => {
                assert_eq!(destination, "projects/p/topics/t");
                assert_eq!(code, Code::InvalidArgument);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(h.metric(names::RECORDS_REJECTED), 1);
        assert_eq!(h.metric(names::RECORDS_DROPPED), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn breaker_trips_after_n_consecutive_confirmed_rejections() {
        let mut c = config();
        c.failure_policy = FailurePolicy::Drop;
        c.max_consecutive_rejections = Some(3);
        c.batch.max_records = 1;
        let mut h = Harness::new(c);
        h.fake
            .respond_with(|_| FakeReply::code(Code::InvalidArgument));
        let mut result = Ok(());
        for n in 1..=10 {
            result = h.write(n, "d").await;
            if result.is_err() {
                break;
            }
            tokio::task::yield_now().await;
        }
        if result.is_ok() {
            result = h.writer.flush().await;
        }
        match result {
            Err(Error::RejectionBreaker { option, count }) => {
                assert_eq!(option, "max_consecutive_rejections");
                assert_eq!(count, 3);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn any_success_resets_the_breaker() {
        let mut c = config();
        c.failure_policy = FailurePolicy::Drop;
        c.max_consecutive_rejections = Some(2);
        c.batch.max_records = 1;
        let mut h = Harness::new(c);
        // Odd records are refused, even ones delivered: never two refusals in a row.
        h.fake.respond_with(|call| {
            if call.records[0] % 2 == 1 {
                FakeReply::code(Code::InvalidArgument)
            } else {
                FakeReply::Ok
            }
        });
        for n in 1..=40 {
            h.write(n, "d").await.expect("write");
            h.writer.flush().await.expect("flush");
        }
        assert_eq!(h.metric(names::RECORDS_DROPPED), 20);
        assert_eq!(h.writer.delivered(), 20);
    }

    #[tokio::test(start_paused = true)]
    async fn unbounded_breaker_never_trips() {
        let mut c = config();
        c.failure_policy = FailurePolicy::Drop;
        c.max_consecutive_rejections = None;
        let mut h = Harness::new(c);
        h.fake
            .respond_with(|_| FakeReply::code(Code::InvalidArgument));
        h.write_all(1..=50, "d").await.expect("write");
        h.writer.flush().await.expect("flush");
        assert_eq!(h.metric(names::RECORDS_DROPPED), 50);
    }

    #[tokio::test(start_paused = true)]
    async fn serializer_rejections_never_count_toward_the_breaker() {
        let mut c = config();
        c.failure_policy = FailurePolicy::Drop;
        c.max_consecutive_rejections = Some(1);
        let mut h = Harness::new(c);
        for row in 0..10 {
            h.writer
                .reject_encoded(Error::Encode {
                    row,
                    reason: "too big".into(),
                })
                .expect("skipped");
        }
        h.write(1, "d").await.expect("write");
        h.writer.flush().await.expect("flush");
        assert_eq!(h.metric(names::RECORDS_SKIPPED), 10);
        assert_eq!(h.metric(names::RECORDS_REJECTED), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn serializer_rejection_under_fail_policy_is_returned() {
        let mut h = Harness::new(config());
        let err = h
            .writer
            .reject_encoded(Error::Encode {
                row: 4,
                reason: "attribute key over 256 bytes".into(),
            })
            .unwrap_err();
        assert!(matches!(err, Error::Encode { row: 4, .. }));
        assert_eq!(h.metric(names::RECORDS_SKIPPED), 0);
        assert!(matches!(h.write(1, "d").await, Err(Error::Failed(_))));
    }

    #[tokio::test(start_paused = true)]
    async fn stall_trips_the_watchdog_once_naming_the_option() {
        let mut h = Harness::new(config());
        h.fake.push(FakeReply::Stall);
        h.write(1, "d").await.expect("write");
        let start = Instant::now();
        match h.writer.flush().await {
            Err(Error::ProgressTimeout {
                option,
                waiting_for,
                ..
            }) => {
                assert_eq!(option, "publish_progress_timeout");
                assert!(waiting_for.contains("flush"));
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(start.elapsed(), Duration::from_secs(600));
        assert!(matches!(h.writer.flush().await, Err(Error::Failed(_))));
    }

    #[tokio::test(start_paused = true)]
    async fn slow_but_answering_service_never_trips_the_watchdog() {
        let mut c = config();
        c.progress_timeout = Some(Duration::from_secs(10));
        c.batch.max_records = 1;
        c.max_concurrent_sends = 1;
        let mut h = Harness::new(c);
        h.fake
            .respond_with(|_| FakeReply::Delay(Duration::from_secs(8), Box::new(FakeReply::Ok)));
        h.write_all(1..=20, "d").await.expect("write");
        let start = Instant::now();
        h.writer
            .flush()
            .await
            .expect("a slow service is not a stall");
        assert!(start.elapsed() > Duration::from_secs(100));
        assert_eq!(h.writer.delivered(), 20);
    }

    fn recovery(create: bool) -> RecoverySettings {
        RecoverySettings {
            backoff: Backoff {
                initial: Duration::from_millis(500),
                max: Duration::from_secs(10),
                multiplier: 2.0,
            },
            max_attempts: 3,
            attempts_option: "recovery_max_attempts",
            create,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn not_found_recovery_creates_then_resends() {
        let mut c = config();
        c.not_found = Some(recovery(true));
        let mut h = Harness::new(c);
        h.fake.set_missing("projects/p/topics/new");
        h.write(1, "projects/p/topics/new").await.expect("write");
        let start = Instant::now();
        h.writer.flush().await.expect("recovered");
        assert_eq!(start.elapsed(), Duration::from_millis(500));
        assert_eq!(
            h.fake.created(),
            vec![Arc::<str>::from("projects/p/topics/new")]
        );
        assert_eq!(h.fake.batches(), vec![vec![1], vec![1]]);
        assert_eq!(h.metric(names::RESOURCES_CREATED), 1);
        assert_eq!(h.writer.delivered(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn not_found_recovery_exhausts_naming_the_attempts_option() {
        let mut c = config();
        c.not_found = Some(recovery(false));
        let mut h = Harness::new(c);
        h.fake.set_missing("q");
        h.write(1, "q").await.expect("write");
        match h.writer.flush().await {
            Err(Error::RecoveryExhausted {
                destination,
                option,
                attempts,
                ..
            }) => {
                assert_eq!(destination, "q");
                assert_eq!(option, "recovery_max_attempts");
                assert_eq!(attempts, 3);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(h.fake.created().is_empty(), "creation was not asked for");
        assert_eq!(h.fake.calls().len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn not_found_without_recovery_is_fatal() {
        let mut h = Harness::new(config());
        h.fake.set_missing("q");
        h.write(1, "q").await.expect("write");
        assert!(matches!(
            h.writer.flush().await,
            Err(Error::Rpc {
                code: Code::NotFound,
                ..
            })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn sequence_key_failure_is_repaired_before_later_records_of_the_key() {
        let mut c = config();
        c.batch.max_records = 2;
        let mut h = Harness::new(c);
        h.fake.push(FakeReply::code(Code::Unavailable));
        for n in 1..=4 {
            h.writer
                .write(envelope(n, "d", Some("k")))
                .await
                .expect("write");
        }
        // Records 3 and 4 wait while the key's first batch is in flight (and retried).
        h.writer
            .write(envelope(100, "d", None))
            .await
            .expect("unkeyed");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let during = h.fake.batches();
        assert_eq!(
            during,
            vec![vec![1, 2], vec![100]],
            "later records of the key wait for the repair"
        );
        h.writer.flush().await.expect("flush");
        assert_eq!(
            h.fake.batches(),
            vec![vec![1, 2], vec![100], vec![1, 2], vec![3, 4]]
        );
        assert_eq!(h.writer.delivered(), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn eviction_drains_before_release_at_one_active_destination() {
        let mut c = config();
        c.max_active_destinations = 1;
        let mut h = Harness::new(c);
        h.fake
            .respond_with(|_| FakeReply::Delay(Duration::from_secs(2), Box::new(FakeReply::Ok)));
        let start = Instant::now();
        for d in ["a", "b", "c"] {
            h.write_all(1..=3, d).await.expect("write");
        }
        // Each switch waited for the previous destination's batch to resolve (2 s each).
        assert_eq!(start.elapsed(), Duration::from_secs(4));
        let names = |v: Vec<Destination>| v.iter().map(|d| d.to_string()).collect::<Vec<_>>();
        assert_eq!(names(h.fake.opened()), vec!["a", "b", "c"]);
        assert_eq!(names(h.fake.closed()), vec!["a", "b"]);
        assert_eq!(
            h.writer.delivered(),
            6,
            "a and b were drained before release"
        );
        h.writer.flush().await.expect("flush");
        assert_eq!(h.writer.delivered(), 9);
    }

    #[tokio::test(start_paused = true)]
    async fn release_overrun_fails_the_writer_before_opening_the_replacement() {
        let mut c = config();
        c.max_active_destinations = 1;
        let mut h = Harness::new(c);
        h.fake.set_close_delay(Duration::from_secs(60));
        h.write(1, "a").await.expect("write");
        h.writer.flush().await.expect("flush");
        match h.write(2, "b").await {
            Err(Error::ShutdownTimeout {
                option,
                budget,
                clients,
            }) => {
                assert_eq!(option, "shutdown_timeout");
                assert_eq!(budget, Duration::from_secs(30));
                assert_eq!(clients, 1);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(h.fake.opened().len(), 1, "no replacement was opened");
    }

    #[tokio::test(start_paused = true)]
    async fn close_costs_one_budget_for_all_clients_and_overrun_fails() {
        let mut c = config();
        let mut h = Harness::new(c.clone());
        h.fake.set_close_delay(Duration::from_secs(20));
        for d in ["a", "b", "c"] {
            h.write(1, d).await.expect("write");
        }
        h.writer.flush().await.expect("flush");
        let start = Instant::now();
        h.writer
            .close()
            .await
            .expect("three 20 s closes fit one 30 s budget");
        assert_eq!(start.elapsed(), Duration::from_secs(20));
        assert_eq!(h.fake.closed().len(), 3);

        c.shutdown_timeout = Duration::from_secs(10);
        let mut h = Harness::new(c);
        h.fake.set_close_delay(Duration::from_secs(20));
        h.write(1, "a").await.expect("write");
        h.writer.flush().await.expect("flush");
        assert!(matches!(
            h.writer.close().await,
            Err(Error::ShutdownTimeout { clients: 1, .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn idle_destinations_are_released_after_a_flush_and_reopen_transparently() {
        let mut h = Harness::new(config());
        h.write(1, "a").await.expect("write");
        h.writer.flush().await.expect("flush");
        tokio::time::sleep(Duration::from_secs(301)).await;
        h.write(2, "b").await.expect("write");
        h.writer.flush().await.expect("flush");
        let names = |v: Vec<Destination>| v.iter().map(|d| d.to_string()).collect::<Vec<_>>();
        assert_eq!(names(h.fake.closed()), vec!["a"]);
        h.write(3, "a").await.expect("write");
        h.writer.flush().await.expect("flush");
        assert_eq!(names(h.fake.opened()), vec!["a", "b", "a"]);
        assert_eq!(h.writer.delivered(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn dropped_writer_aborts_sends_and_releases_clients() {
        let mut h = Harness::new(config());
        h.fake.push(FakeReply::Stall);
        h.write_all(1..=10, "a").await.expect("write");
        tokio::task::yield_now().await;
        assert_eq!(h.fake.calls().len(), 1);
        let Harness { fake, writer, set } = h;
        drop(writer);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(fake.closed(), vec![Arc::<str>::from("a")]);
        assert_eq!(
            set.clone_inner()
                .sum_by_name(names::IN_FLIGHT_RECORDS)
                .map(|v| v.as_usize()),
            Some(0)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn open_failure_is_returned_by_write() {
        let mut h = Harness::new(config());
        h.fake.set_open_error("no credentials");
        assert!(matches!(h.write(1, "a").await, Err(Error::Connect { .. })));
    }

    #[tokio::test(start_paused = true)]
    async fn per_destination_counters_only_when_enabled() {
        let mut c = config();
        c.per_destination_metrics = true;
        let mut h = Harness::new(c);
        h.write_all(1..=3, "a").await.expect("write");
        h.write_all(1..=2, "b").await.expect("write");
        h.writer.flush().await.expect("flush");
        assert_eq!(h.metric(names::RECORDS_SENT_BY_DESTINATION), 5);

        let mut h = Harness::new(config());
        h.write(1, "a").await.expect("write");
        h.writer.flush().await.expect("flush");
        assert_eq!(
            h.set
                .clone_inner()
                .sum_by_name(names::RECORDS_SENT_BY_DESTINATION),
            None
        );
    }
}
