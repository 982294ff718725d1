//! The Pub/Sub subscription source: a table whose rows are the messages of a subscription,
//! acknowledged only after every row made from them was delivered.
//!
//! - [`options`]: the source's options ([`options::PubSubSourceOptions`]).
//! - [`pull`]: one StreamingPull stream per partition, flow control, reconnection.
//! - [`lease`]: the ack deadlines of the stream and of lease extensions.
//! - [`acks`]: the [`Acknowledger`](crate::core::delivery::settler::Acknowledger) of a
//!   subscription (`Acknowledge`, `ModifyAckDeadline`) that the core's settler drives.
//!
//! The acknowledgement contract between the source and its consumers (the ticket of each
//! batch, its seal, retain and settle), what a partition holds, the settler loop, the counts
//! and the stop kind are the core's ([`crate::core::delivery`], [`crate::core::StopKind`]).
//! - [`decode`]: messages to rows (`json` / `raw` / `avro` / `protobuf`, metadata columns).
//! - [`replay`]: `start_at`, the seek applied once before the first pull (ADR 0072).
//! - [`revisions`]: the other revisions of a topic's schema a scan meets (ADR 0062).
//! - [`exec`]: the execution plan node ([`exec::PubSubSourceExec`]) and its
//!   [`exec::SourceHandle`] (stop, counts, slots).
//! - [`table`]: the [`table::PubSubSourceTable`] a session registers.
//!
//! See `docs/pubsub.md` ("Reading a subscription") and ADR 0041 for the acknowledgement rule.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::TableProvider;
use datafusion::physical_plan::ExecutionPlan;

use crate::connectors::descriptor::{SourceDescriptor, WindowedSource};
use crate::core::delivery::DeliveryInput;
use crate::core::delivery::ticket::{Ticket, TicketSlot, Verdicts};
use crate::options::RawOptions;

pub mod acks;
pub mod decode;
pub mod exec;
pub mod lease;
pub mod options;
pub mod pull;
pub mod replay;
pub mod revisions;
pub mod table;

pub use exec::{PubSubSourceExec, SourceHandle};
pub use table::PubSubSourceTable;

/// A message's ack id, as the source keeps it: one shared block for the partition's lease table
/// and the ticket of the batch the message went into (the service's ack ids are about 150
/// bytes, and a window may hold a message for minutes).
pub type AckId = std::sync::Arc<str>;
/// The handle of one emitted batch: a ticket naming its messages' ack ids
/// ([`crate::core::delivery::ticket`]).
pub type BatchTicket = Ticket<AckId>;
/// Where a partition's tickets send their verdicts (ack ids).
pub type AckQueue = Verdicts<AckId>;
/// The handoff slot of one partition: the ticket of the batch it emitted last.
pub type SourceSlot = TicketSlot<AckId>;

/// The source, as the connector's descriptor lists it.
pub static SOURCE: SourceDescriptor = SourceDescriptor {
    location: "subscription",
    options: options::options,
    declares_source,
    declare,
    is_table: |table| table.downcast_ref::<PubSubSourceTable>().is_some(),
    is_node: is_source_node,
    origin_slot,
    table_event_time: |table| {
        let table = table.downcast_ref::<PubSubSourceTable>()?;
        Some(table.options().event_time.clone())
    },
    windows,
};

fn windows(plan: &dyn ExecutionPlan) -> Option<WindowedSource> {
    let exec = plan.downcast_ref::<exec::PubSubSourceExec>()?;
    let config = exec.config();
    let opts = &config.options;
    let mut parts = opts.subscription.split('/');
    let key = match (parts.nth(1), parts.nth(1)) {
        (Some(project), Some(subscription)) => format!("{project}.{subscription}"),
        _ => opts.subscription.replace('/', "."),
    };
    Some(WindowedSource {
        table: config.table.clone(),
        describe: format!("subscription {}", opts.subscription),
        key,
        connector: super::KIND,
        event_time: opts.event_time.clone(),
        failure_policy: opts.failure_policy,
        dead_letter: opts.dead_letter.clone(),
        max_lease_duration: opts.max_lease_duration,
        max_outstanding_messages: opts.max_outstanding_messages,
        // A killed reader's leases lapse within one ack deadline; twice that, and a margin.
        recovery_hold: opts.stream_ack_deadline * 2 + std::time::Duration::from_secs(5),
    })
}

/// Whether `plan` is a subscription's plan node ([`exec::PubSubSourceExec`]).
pub fn is_source_node(plan: &dyn ExecutionPlan) -> bool {
    plan.downcast_ref::<exec::PubSubSourceExec>().is_some()
}

fn origin_slot(plan: &dyn ExecutionPlan, partition: usize) -> Option<Arc<dyn DeliveryInput>> {
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
