//! The three connectors. Each is split the same way: `options` (the typed option model and
//! its builder), `mapping` (Arrow rows to records, pure), `client` (the gRPC side, a
//! [`crate::core::Transport`]), `writer` (the connector's [`sink::Connector`] impl: what the one
//! generic [`sink::Sink`] needs from it).

pub mod bigtable;
pub mod catalog;
pub mod cloud_tasks;
pub mod dead_letter;
pub mod google;
pub mod kind;
pub mod pubsub;
pub mod sink;

pub use kind::ConnectorKind;

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::execution::SendableRecordBatchStream;

use crate::core::SinkMetrics;
use crate::core::run::WriterContext;
use crate::error::Result;
use crate::options::RawOptions;

/// A declared sink: validated options and schema, ready to write. Building one contacts no
/// service; clients open when the first record of a statement needs them.
#[async_trait]
pub trait SinkConnector: Debug + Send + Sync {
    /// Which connector this is.
    fn kind(&self) -> ConnectorKind;

    /// The table schema the sink accepts.
    fn schema(&self) -> &SchemaRef;

    /// Writes every row of `input` and returns how many rows the service acknowledged.
    /// Every admitted record is resolved before this returns, whether it returns `Ok` or not.
    ///
    /// `ctx` says which writer of the statement this is, carries the statement's stop request
    /// (see [`crate::core::StopKind`]) and the observer of flush points. A stopped writer
    /// returns [`crate::Error::Incomplete`] with [`crate::Error::Stopped`] as its source,
    /// unless it drained every admitted row.
    async fn write_all(
        &self,
        input: SendableRecordBatchStream,
        metrics: SinkMetrics,
        ctx: &WriterContext,
    ) -> Result<u64>;

    /// How the statement's rows must be spread over writers: which columns keep rows on one
    /// writer, and whether the input's order matters within a writer.
    fn routing(&self) -> Routing;

    /// How many writers a statement runs, when the table says (`sink_parallelism`); `None`:
    /// one per input partition.
    fn parallelism(&self) -> Option<usize>;
}

/// How a sink needs its input spread over the statement's writers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routing {
    /// Rows equal in these columns (table columns, by name) must reach the same writer: a
    /// Pub/Sub ordering key (with the topic column), a Bigtable row key (with the table
    /// column). Empty: any writer will do.
    pub key_columns: Vec<String>,
    /// Whether the input's order must be kept within each writer (the order of an ordering
    /// key's messages, the last write of a row key).
    pub keep_order: bool,
}

impl Routing {
    /// No constraint: rows may go to any writer, in any order.
    pub fn any() -> Self {
        Self::default()
    }

    /// Rows with equal values in `columns` go to one writer, in input order.
    pub fn by_key(columns: Vec<String>) -> Self {
        Routing {
            key_columns: columns,
            keep_order: true,
        }
    }
}

/// Builds the sink of `kind` from its options, checking them and the schema.
pub fn build_sink(
    kind: ConnectorKind,
    schema: SchemaRef,
    location: Option<&str>,
    raw: &RawOptions,
) -> Result<Arc<dyn SinkConnector>> {
    // The options are parsed and checked once, by the connector's `*SinkOptions::from_raw`.
    match kind {
        ConnectorKind::PubSub => Ok(Arc::new(pubsub::writer::PubSubSink::try_new(
            schema, location, raw,
        )?)),
        ConnectorKind::CloudTasks => Ok(Arc::new(cloud_tasks::writer::CloudTasksSink::try_new(
            schema, location, raw,
        )?)),
        ConnectorKind::Bigtable => Ok(Arc::new(bigtable::writer::BigtableSink::try_new(
            schema, location, raw,
        )?)),
    }
}

/// Selects the process-wide TLS crypto provider (ring) unless one is installed already.
///
/// The dependency tree enables two rustls providers, and rustls then refuses to pick one by
/// itself; every TLS connection this crate opens (Google endpoints, `gs://`, `s3://`) calls this
/// first.
pub fn install_crypto_provider() {
    // An Err only says that a provider is installed already, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
