//! The send stage: taking batches out of the pool, the send task, one RPC attempt.
//!
//! Every batch leaves the pool the same way, through [`Shared::dispatch`]: under one pool lock
//! it is taken from its destination's batches and given a [`Lease`] on the destination's
//! client; once the lock is released, each batch gets a send task. A send task
//! ([`Shared::run_batch`]) resolves its batch (see [`super::resolve`]), releases the records'
//! gate permits in one go, and lets the batch's sequence key move on. One attempt
//! ([`Shared::attempt`]) takes a send permit (at most `max_concurrent_sends` RPCs at once),
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
        drop(lease);
    }

    /// One RPC attempt: one status for the whole batch, or exactly one per item. `timeout` is
    /// the attempt deadline (`None`: none); a send still unanswered at it ends as
    /// `DEADLINE_EXCEEDED`.
    pub(super) async fn attempt(
        &self,
        destination: &Destination,
        client: &T::Client,
        items: &mut [Item<T::Record>],
        timeout: Option<Duration>,
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
}
