//! The Pub/Sub subscription source: a table whose rows are the messages of a subscription,
//! acknowledged only after every row made from them was delivered.
//!
//! - [`options`]: the source's options ([`options::PubSubSourceOptions`]).
//! - [`pull`]: one StreamingPull stream per partition, flow control, reconnection.
//! - [`lease`]: what a partition holds (flow control and lease extension).
//! - [`acks`]: the settler that acknowledges, nacks and extends leases.
//! - [`ticket`]: the acknowledgement contract between the source and its consumers
//!   ([`ticket::BatchTicket`], [`ticket::SourceSlot`]).
//! - [`decode`]: messages to rows (`json` / `raw` / `avro` / `protobuf`, metadata columns).
//! - [`revisions`]: the other revisions of a topic's schema a scan meets (ADR 0062).
//! - [`exec`]: the execution plan node ([`exec::PubSubSourceExec`]) and its
//!   [`exec::SourceHandle`] (stop, counts, slots).
//! - [`table`]: the [`table::PubSubSourceTable`] a session registers.
//!
//! See `docs/pubsub.md` ("Reading a subscription") and ADR 0041 for the acknowledgement rule.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::TableProvider;
use datafusion::physical_plan::ExecutionPlan;

use crate::connectors::descriptor::SourceDescriptor;
use crate::core::origin::OriginSlot;
use crate::options::RawOptions;

pub mod acks;
pub mod decode;
pub mod exec;
pub mod lease;
pub mod options;
pub mod pull;
pub mod revisions;
pub mod table;
pub mod ticket;

pub use exec::{PubSubSourceExec, SourceHandle};
pub use pull::StopKind;
pub use table::PubSubSourceTable;
pub use ticket::{BatchTicket, Outcome, SourceSlot};

/// The live counters of one source scan (all partitions).
#[derive(Debug, Default)]
pub struct SourceCounters {
    read: AtomicU64,
    emitted: AtomicU64,
    acked: AtomicU64,
    nacked: AtomicU64,
    dropped: AtomicU64,
    dead_lettered: AtomicU64,
    lease_expired: AtomicU64,
    reconnects: AtomicU64,
}

/// What a source scan did so far: a snapshot of its counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SourceCounts {
    /// Messages received from the service.
    pub messages_read: u64,
    /// Rows emitted (one per message that decoded).
    pub rows_emitted: u64,
    /// Messages whose acknowledgement the service took.
    pub messages_acked: u64,
    /// Messages nacked (deadline set to 0: delivered again at once).
    pub messages_nacked: u64,
    /// Messages that did not decode and were dropped (`failure_policy = 'drop'`).
    pub messages_dropped: u64,
    /// Messages that did not decode and were dead-lettered.
    pub messages_dead_lettered: u64,
    /// Messages held past `max_lease_duration` (left to be delivered again).
    pub leases_expired: u64,
    /// Streams opened again after a transient failure.
    pub reconnects: u64,
}

impl SourceCounters {
    /// A snapshot.
    pub fn snapshot(&self) -> SourceCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        SourceCounts {
            messages_read: get(&self.read),
            rows_emitted: get(&self.emitted),
            messages_acked: get(&self.acked),
            messages_nacked: get(&self.nacked),
            messages_dropped: get(&self.dropped),
            messages_dead_lettered: get(&self.dead_lettered),
            leases_expired: get(&self.lease_expired),
            reconnects: get(&self.reconnects),
        }
    }
}

/// The source, as the connector's descriptor lists it.
pub static SOURCE: SourceDescriptor = SourceDescriptor {
    location: "subscription",
    options: options::options,
    declares_source,
    declare,
    is_table: |table| table.downcast_ref::<PubSubSourceTable>().is_some(),
    is_node: is_source_node,
    origin_slot,
};

/// Whether `plan` is a subscription's plan node ([`exec::PubSubSourceExec`]).
pub fn is_source_node(plan: &dyn ExecutionPlan) -> bool {
    plan.downcast_ref::<exec::PubSubSourceExec>().is_some()
}

fn origin_slot(plan: &dyn ExecutionPlan, partition: usize) -> Option<Arc<dyn OriginSlot>> {
    plan.downcast_ref::<exec::PubSubSourceExec>()?
        .origin_slot(partition)
}

/// A Pub/Sub table is a source when it names a subscription (option or `LOCATION`) or says
/// `type = 'source'`; anything else declares a sink.
fn declares_source(location: Option<&str>, raw: &RawOptions) -> bool {
    let said = |name: &str| raw.get(name).map(|v| v.trim().to_ascii_lowercase());
    said(options::TYPE.name).is_some_and(|t| t == "source")
        || raw.get(options::SUBSCRIPTION.name).is_some()
        || location.is_some_and(|l| l.contains("/subscriptions/"))
}

fn declare(
    name: &str,
    schema: SchemaRef,
    location: Option<&str>,
    raw: &RawOptions,
) -> crate::Result<Arc<dyn TableProvider>> {
    let options = options::PubSubSourceOptions::from_raw(location, raw)?;
    Ok(Arc::new(PubSubSourceTable::try_new(name, schema, options)?))
}
