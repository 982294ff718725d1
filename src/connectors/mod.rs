//! The three connectors. Each is split the same way: `options` (the typed option model and
//! its builder), `mapping` (Arrow rows to records, pure), `client` (the gRPC side, a
//! [`Transport`](crate::core::Transport)), `writer` (the glue onto the flow-control core).

pub mod bigtable;
pub mod cloud_tasks;
pub mod pubsub;

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::execution::SendableRecordBatchStream;

use crate::core::SinkMetrics;
use crate::error::Result;
use crate::options::{ConnectorKind, RawOptions};

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
    async fn write_all(&self, input: SendableRecordBatchStream, metrics: SinkMetrics) -> Result<u64>;
}

/// Builds the sink of `kind` from its options, checking them and the schema.
pub fn build_sink(
    kind: ConnectorKind,
    schema: SchemaRef,
    location: Option<&str>,
    raw: &RawOptions,
) -> Result<Arc<dyn SinkConnector>> {
    crate::options::validate_names(kind, raw)?;
    match kind {
        ConnectorKind::PubSub => Ok(Arc::new(pubsub::writer::PubSubSink::try_new(schema, location, raw)?)),
        ConnectorKind::CloudTasks => {
            Ok(Arc::new(cloud_tasks::writer::CloudTasksSink::try_new(schema, location, raw)?))
        }
        ConnectorKind::Bigtable => Ok(Arc::new(bigtable::writer::BigtableSink::try_new(schema, location, raw)?)),
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
