//! The destination pool: one client per destination, an LRU cap, idle eviction, and releases
//! bounded by one shutdown budget.
//!
//! The writer opens a destination's client lazily, on its first record. At the cap
//! (`max_active_destinations`) a new destination first releases the least-recently-used
//! *clean* destination (nothing open, queued or in flight); when none is clean, the writer
//! drains under the progress watchdog until one is. The replacement opens only after the
//! release finished. A release asks every client it covers to close before awaiting any, and
//! the whole release costs the shutdown budget once; an overrun is
//! [`crate::Error::ShutdownTimeout`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::batch::DestBatches;
use super::{BatchThresholds, Destination, Transport};
use crate::error::{Error, Result};

/// One open destination.
#[derive(Debug)]
pub(crate) struct Dest<C, R> {
    /// Its client, shared with the send tasks that hold a lease on it.
    pub(crate) client: Arc<C>,
    /// When a record last arrived for it.
    pub(crate) last_used: Instant,
    /// Send tasks running with its client.
    pub(crate) leases: usize,
    /// Its open batches and sequence-key queues.
    pub(crate) batches: DestBatches<R>,
}

impl<C, R> Dest<C, R> {
    /// A destination with a freshly opened client.
    pub(crate) fn new(client: C, thresholds: BatchThresholds) -> Self {
        Dest {
            client: Arc::new(client),
            last_used: Instant::now(),
            leases: 0,
            batches: DestBatches::new(thresholds),
        }
    }

    /// Nothing open, queued or in flight: it may be released.
    pub(crate) fn is_clean(&self) -> bool {
        self.leases == 0 && self.batches.is_empty()
    }
}

/// The open destinations of one writer.
#[derive(Debug)]
pub(crate) struct Pool<C, R> {
    /// The destinations by name.
    pub(crate) dests: HashMap<Destination, Dest<C, R>>,
}

impl<C, R> Default for Pool<C, R> {
    fn default() -> Self {
        Pool {
            dests: HashMap::new(),
        }
    }
}

impl<C, R> Pool<C, R> {
    /// The least-recently-used clean destination.
    pub(crate) fn lru_clean(&self) -> Option<Destination> {
        self.dests
            .iter()
            .filter(|(_, d)| d.is_clean())
            .min_by_key(|(_, d)| d.last_used)
            .map(|(k, _)| k.clone())
    }

    /// Clean destinations unused for longer than `idle` at `now`.
    pub(crate) fn idle(&self, now: Instant, idle: Duration) -> Vec<Destination> {
        self.dests
            .iter()
            .filter(|(_, d)| d.is_clean() && now.saturating_duration_since(d.last_used) > idle)
            .map(|(k, _)| k.clone())
            .collect()
    }
}

/// Releases `clients` within one `budget`: every client is asked to close before any is
/// awaited, so the release costs the budget once however many clients it covers.
pub(crate) async fn release<T: Transport>(
    transport: &T,
    clients: Vec<(Destination, T::Client)>,
    budget: Duration,
    option: &'static str,
) -> Result<()> {
    if clients.is_empty() {
        return Ok(());
    }
    let count = clients.len();
    let names: Vec<String> = clients.iter().map(|(d, _)| d.to_string()).collect();
    // join_all polls every close future on its first poll: all are asked before any is awaited.
    let all = futures::future::join_all(clients.into_iter().map(|(_, c)| transport.close(c)));
    match tokio::time::timeout(budget, all).await {
        Ok(_) => {
            tracing::info!(destinations = ?names, "released {count} client(s)");
            Ok(())
        }
        Err(_) => {
            tracing::warn!(destinations = ?names, ?budget, "client release overran its shutdown budget");
            Err(Error::ShutdownTimeout {
                option,
                budget,
                clients: count,
            })
        }
    }
}

/// Takes a client out of its `Arc` for release. The pool holds the last reference once no send
/// task leases it; if one still does, the client is dropped instead of closed, with a warning.
pub(crate) fn unshare<C>(destination: &Destination, client: Arc<C>) -> Option<C> {
    match Arc::try_unwrap(client) {
        Ok(c) => Some(c),
        Err(_) => {
            tracing::warn!(%destination, "client still leased at release; dropped without close");
            None
        }
    }
}
