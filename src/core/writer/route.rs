//! The route and batch stages: admitted records into their destination's batches, and the
//! destination pool they live in.
//!
//! [`Shared::enqueue`] takes a run of admitted records bound for one destination and pushes
//! them into its batches under one pool lock; a batch that reaches a threshold is sent at once,
//! and the first record of a batch arms a delay timer ([`Shared::on_timer`]) that sends it when
//! it has waited `max_delay`. A sequence key's next batch is sent when its previous one resolved
//! ([`Shared::key_done`]); a flush, a blocked admission or a drain sends everything open
//! ([`Shared::send_all_open`]). All four take their batches out through
//! [`Shared::dispatch`](super::send).
//!
//! The pool side: [`Shared::ensure_open`] opens a destination's client on its first record; at
//! `max_active_destinations` it first releases the least-recently-used clean destination
//! ([`Shared::evict_one`], draining under the progress watchdog when none is clean). After a
//! successful flush, destinations idle past `destination_idle_timeout` are released
//! ([`Shared::evict_idle`]).

use std::sync::Arc;

use tokio::time::Instant;

use super::{Shared, lock};
use crate::core::batch::{Batch, DestBatches, Item, TimerTag};
use crate::core::pool::{self, Dest};
use crate::core::{Destination, Transport};
use crate::error::{Error, Result};

impl<T: Transport> Shared<T> {
    /// Sends every open batch now (a flush, a blocked admission, a drain).
    pub(super) fn send_all_open(self: &Arc<Self>) {
        self.dispatch(|pool, out| {
            for (name, dest) in pool.dests.iter_mut() {
                for batch in dest.batches.take_ready() {
                    out.send(name, dest, batch);
                }
            }
        });
    }

    /// Routes admitted records, all bound for `name`, into its batches under one pool lock, and
    /// sends the batches that reach a threshold.
    pub(super) fn enqueue(self: &Arc<Self>, name: &Destination, items: Vec<Item<T::Record>>) {
        let routed = self.dispatch(|pool, out| {
            let Some(dest) = pool.dests.get_mut(name) else {
                return Err(items);
            };
            dest.last_used = Instant::now();
            let mut timers = Vec::new();
            for item in items {
                let pushed = dest.batches.push(item);
                for batch in pushed.ready {
                    out.send(name, dest, batch);
                }
                timers.extend(pushed.timer);
            }
            Ok(timers)
        });
        let timers = match routed {
            Ok(timers) => timers,
            Err(items) => {
                // ensure_open ran just before without an await in between; unreachable, but a
                // lost record must not pass silently. The records leave the gate only once the
                // writer is marked failed.
                self.fail(Error::Failed(format!(
                    "destination '{name}' vanished from the pool"
                )));
                drop(items);
                return;
            }
        };
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

    /// A batch delay timer went off: sends the batch it was armed for, if still open and the
    /// writer has not failed (after a failure the batch stays open, unsent, and its records
    /// count as not delivered).
    fn on_timer(self: &Arc<Self>, name: &Destination, tag: &TimerTag) {
        self.send_next(name, |batches| batches.on_timer(tag));
    }

    /// A batch of sequence key `key` resolved: sends the key's next batch, unless the writer
    /// has failed.
    pub(super) fn key_done(self: &Arc<Self>, name: &Destination, key: &Arc<str>) {
        self.send_next(name, |batches| batches.key_done(key));
    }

    /// Sends the batch `next` takes from destination `name`'s batches, if the destination is
    /// still open and gives one, unless the writer has failed.
    fn send_next(
        self: &Arc<Self>,
        name: &Destination,
        next: impl FnOnce(&mut DestBatches<T::Record>) -> Option<Batch<T::Record>>,
    ) {
        if self.is_failed() {
            return;
        }
        self.dispatch(|pool, out| {
            if let Some(dest) = pool.dests.get_mut(name)
                && let Some(batch) = next(&mut dest.batches)
            {
                out.send(name, dest, batch);
            }
        });
    }

    /// A batch holding records of serial keys `keys` resolved: the next waiting record of each
    /// key goes, unless the writer has failed (the waiting records then count as not
    /// delivered, as an unsent open batch does).
    pub(super) fn serial_done(self: &Arc<Self>, name: &Destination, keys: &[Arc<[u8]>]) {
        if self.is_failed() {
            return;
        }
        self.dispatch(|pool, out| {
            if let Some(dest) = pool.dests.get_mut(name) {
                for batch in dest.batches.serial_done(keys) {
                    out.send(name, dest, batch);
                }
            }
        });
    }

    /// Makes sure `name` has an open client, evicting the LRU clean destination at the cap.
    pub(super) async fn ensure_open(self: &Arc<Self>, name: &Destination) -> Result<()> {
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
        self.metrics.destinations_released(1);
        let clients: Vec<_> = pool::unshare(&name, dest.client)
            .map(|c| (name, c))
            .into_iter()
            .collect();
        self.release(clients).await
    }

    /// Releases the clients of evicted destinations within the shutdown budget.
    async fn release(&self, clients: Vec<(Destination, T::Client)>) -> Result<()> {
        pool::release(
            &*self.transport,
            clients,
            self.config.shutdown_timeout,
            self.config.shutdown_option,
        )
        .await
    }

    /// Releases destinations idle for longer than the idle timeout (after a successful flush).
    pub(super) async fn evict_idle(self: &Arc<Self>) -> Result<()> {
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
        self.metrics.destinations_released(clients.len());
        self.release(clients).await
    }
}
