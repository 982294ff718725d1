//! The send stage: taking batches out of the pool, the send task, one RPC attempt.
//!
//! Every batch leaves the pool the same way, through [`Shared::dispatch`]: under one pool lock
//! it is taken from its destination's batches and given a [`Lease`] on the destination's
//! client; once the lock is released, each batch gets a send task. A send task
//! ([`Shared::run_batch`]) resolves its batch (see [`super::resolve`]), releases the records'
//! gate permits in one go, and lets the batch's sequence key move on. One attempt
//! ([`Shared::attempt`]) takes a send permit (at most
//! [`FlowConfig::concurrent_send_cap`](crate::core::FlowConfig::concurrent_send_cap) RPCs at
//! once: the connector's `max_concurrent_sends`, lowered by the byte cap; see ADR 0023),
//! counts the records' first send, and enforces the attempt deadline around the transport's
//! future.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Shared, lock};
use crate::core::admission::Permit;
use crate::core::batch::{Batch, Item};
use crate::core::pool::{Dest, Pool};
use crate::core::{Destination, SendOutcome, Transport};

/// A batch on its way to a send task, with its lease on the destination's client.
pub(super) struct Dispatch<T: Transport> {
    destination: Destination,
    lease: Lease<T>,
    batch: Batch<T::Record>,
}

/// A send task's hold on a destination's client: the destination is not clean (and not
/// released) while one is alive. Its end pokes the progress clock, which is what wakes a
/// drain before an eviction and a settle.
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

/// The batches taken out of the pool under one lock, each already holding its lease. They are
/// spawned as send tasks by [`Shared::dispatch`] once the lock is released (a lease's drop
/// takes the pool lock, so none may be dropped while it is held).
pub(super) struct Outbox<'a, T: Transport> {
    shared: &'a Arc<Shared<T>>,
    dispatches: Vec<Dispatch<T>>,
}

impl<T: Transport> Outbox<'_, T> {
    /// Leases `dest`'s client for `batch` and queues the two for a send task.
    pub(super) fn send(
        &mut self,
        destination: &Destination,
        dest: &mut Dest<T::Client, T::Record>,
        batch: Batch<T::Record>,
    ) {
        dest.leases += 1;
        self.dispatches.push(Dispatch {
            destination: destination.clone(),
            lease: Lease {
                shared: self.shared.clone(),
                destination: destination.clone(),
                client: Some(dest.client.clone()),
            },
            batch,
        });
    }
}

impl<T: Transport> Shared<T> {
    /// Locks the pool, lets `take` move batches out of it into the [`Outbox`] (each leasing its
    /// destination's client), releases the lock, and spawns one send task per batch. Returns
    /// what `take` returns.
    pub(super) fn dispatch<X>(
        self: &Arc<Self>,
        take: impl FnOnce(&mut Pool<T::Client, T::Record>, &mut Outbox<'_, T>) -> X,
    ) -> X {
        let mut outbox = Outbox {
            shared: self,
            dispatches: Vec::new(),
        };
        let taken = {
            let mut pool = lock(&self.pool);
            take(&mut pool, &mut outbox)
        };
        for d in outbox.dispatches {
            let shared = self.clone();
            self.spawn(async move { shared.run_batch(d).await });
        }
        taken
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
        if !batch.serial.is_empty() {
            self.serial_done(&destination, &batch.serial);
        }
        drop(lease);
    }

    /// One RPC attempt: one status for the whole batch, or exactly one per item. `timeout` is
    /// the attempt deadline (`None`: none); a send still unanswered at it ends as
    /// `DEADLINE_EXCEEDED`. `None` when the writer failed (or was stopped) while the attempt
    /// waited for a send permit (the concurrent-send cap was reached): that batch is not sent.
    pub(super) async fn attempt(
        &self,
        destination: &Destination,
        client: &T::Client,
        items: &mut [Item<T::Record>],
        timeout: Option<Duration>,
    ) -> Option<SendOutcome> {
        let n = items.len();
        // A batch dispatched while a send permit was free is on its way, failure or not (the
        // settle waits for it); one that queued behind the concurrent-send cap is not sent if
        // the writer failed while it waited.
        let _permit = match self.sends.try_acquire() {
            Ok(permit) => permit,
            Err(_) => {
                let Ok(permit) = self.sends.acquire().await else {
                    return Some(SendOutcome::Whole(Err(tonic::Status::cancelled(
                        "writer closed",
                    ))));
                };
                if self.is_failed() {
                    return None;
                }
                permit
            }
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
        self.metrics.rpc_started();
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
        // A transport failure says the service was not reached (readiness, `core::telemetry`).
        let answered = !matches!(
            &outcome,
            SendOutcome::Whole(Err(status))
                if matches!(status.code(), tonic::Code::Unavailable | tonic::Code::DeadlineExceeded)
        );
        self.metrics.rpc(start.elapsed(), answered);
        if let Some(hint) = self.transport.take_load_hint() {
            self.throttle.hint(hint);
        }
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
        Some(outcome)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
    use tokio::time::Instant;

    use crate::core::metrics::names;
    use crate::core::{
        BatchThresholds, Envelope, FlowConfig, FlowWriter, MIN_CONCURRENT_SENDS, RPC_BYTE_CHARGE,
        RetrySettings, SinkMetrics,
    };
    use crate::testing::{FakeReply, FakeTransport};

    /// The writer tests' settings with the byte cap and the send cap given, no breaker, one
    /// attempt per RPC, and batches cut by bytes.
    fn config(max_in_flight_bytes: u64, max_concurrent_sends: usize) -> FlowConfig {
        let base = crate::core::test_flow_config();
        FlowConfig {
            max_in_flight_records: 1_000_000,
            max_in_flight_bytes,
            in_flight_option: "max_in_flight_bytes",
            max_consecutive_rejections: None,
            // Every record is over the byte threshold, so each one is an RPC of its own (the
            // case that made tens of thousands of RPCs at once).
            batch: BatchThresholds {
                max_records: 1000,
                max_bytes: 1000,
                max_delay: Duration::from_millis(10),
            },
            retry: RetrySettings {
                max_attempts: 1,
                retry_delay_multiplier: 1.0,
                max_retry_delay: Duration::from_millis(100),
                ..base.retry.clone()
            },
            retry_option: None,
            max_concurrent_sends,
            ..base
        }
    }

    #[test]
    fn the_byte_cap_sets_the_concurrent_send_cap() {
        // One RPC per RPC_BYTE_CHARGE of the byte cap: 64 MiB -> 256, 16 MiB -> 64.
        assert_eq!(config(64 << 20, 1_000_000).concurrent_send_cap(), 256);
        assert_eq!(config(16 << 20, 1_000_000).concurrent_send_cap(), 64);
        // A small cap still keeps a floor of RPCs; the connector's cap stays the upper bound.
        assert_eq!(
            config(4096, 1_000_000).concurrent_send_cap(),
            MIN_CONCURRENT_SENDS
        );
        assert_eq!(config(64 << 20, 10).concurrent_send_cap(), 10);
        assert_eq!(config(4096, 1).concurrent_send_cap(), 1);
        assert_eq!(config(4096, 0).concurrent_send_cap(), 1);
        // Count only: the byte cap does not bound the RPCs.
        assert_eq!(config(u64::MAX, 5_000).concurrent_send_cap(), 5_000);
    }

    /// Writes `records` records of `bytes` each, every one its own RPC answered after one
    /// second, and returns the most RPCs outstanding at once and the gate's byte high water.
    async fn run(config: FlowConfig, records: u32, bytes: u64) -> (usize, u64) {
        let fake = Arc::new(FakeTransport::<u32>::new());
        let starts: Arc<Mutex<Vec<Instant>>> = Arc::default();
        let seen = starts.clone();
        fake.respond_with(move |_| {
            seen.lock().expect("starts").push(Instant::now());
            FakeReply::Delay(Duration::from_secs(1), Box::new(FakeReply::Ok))
        });
        let set = ExecutionPlanMetricsSet::new();
        let mut writer = FlowWriter::new(fake.clone(), config, SinkMetrics::new(&set));
        for n in 0..records {
            let envelope = Envelope {
                record: n,
                bytes,
                destination: Arc::from("d"),
                sequence_key: None,
                serial_key: None,
                handle: None,
            };
            writer.write(envelope).await.expect("write");
        }
        writer.flush().await.expect("flush");
        assert_eq!(writer.delivered(), u64::from(records));
        writer.close().await.expect("close");
        // Every RPC lasts exactly one second, so the RPCs outstanding when one starts are those
        // started within the second before it, itself included.
        let starts = starts.lock().expect("starts").clone();
        assert_eq!(starts.len(), records as usize, "one RPC per record");
        let most = starts
            .iter()
            .map(|s| {
                starts
                    .iter()
                    .filter(|t| *t <= s && s.duration_since(**t) < Duration::from_secs(1))
                    .count()
            })
            .max()
            .unwrap_or(0);
        let high_water = set
            .clone_inner()
            .sum_by_name(names::IN_FLIGHT_BYTES_HIGH_WATER)
            .map_or(0, |v| v.as_usize() as u64);
        (most, high_water)
    }

    #[tokio::test(start_paused = true)]
    async fn many_single_record_rpcs_stay_under_the_byte_cap_share() {
        // 8 MiB of cap: 128 records of 64 KiB fit, but only 32 RPCs may be outstanding.
        let cap = 32 * RPC_BYTE_CHARGE;
        let (most, high_water) = run(config(cap, 1_000_000), 400, 64 << 10).await;
        assert_eq!(most, 32, "RPCs outstanding at once = cap / RPC_BYTE_CHARGE");
        assert!(
            high_water <= cap,
            "held bytes {high_water} over the cap {cap}"
        );
        assert_eq!(high_water, cap, "the records still fill the byte cap");
    }

    #[tokio::test(start_paused = true)]
    async fn small_records_are_bounded_by_the_floor_and_the_connector_cap() {
        // 64 KiB of cap: 64 records of 1 KiB, each alone; the byte share would allow none, the
        // floor keeps MIN_CONCURRENT_SENDS outstanding.
        let (most, high_water) = run(config(64 << 10, 1_000_000), 200, 1 << 10).await;
        assert_eq!(most, MIN_CONCURRENT_SENDS);
        assert!(high_water <= 64 << 10);
        // The connector's own cap stays the upper bound.
        let (most, _) = run(config(64 << 20, 3), 20, 1 << 10).await;
        assert_eq!(most, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn time_to_send_follows_the_concurrent_send_cap() {
        // 64 single-record RPCs of one second each, 16 at a time: four rounds.
        let start = Instant::now();
        let (most, _) = run(config(16 * RPC_BYTE_CHARGE, 1_000_000), 64, 2000).await;
        assert_eq!(most, 16);
        assert_eq!(start.elapsed(), Duration::from_secs(4));
    }
}
