//! The one sink every connector is: [`Sink<C>`], generic over a small [`Connector`] trait.
//!
//! What the three sinks share lives here: typed options checked against the table schema into
//! a row mapping and a [`FlowConfig`] when the table is declared (no service contacted), then,
//! per statement, a transport connected from the client settings and every batch encoded
//! through the flow-control core. A connector implements [`Connector`] with
//! only what differs: its kind, its options, mapping, client settings and transport types, how
//! the options become a `FlowConfig` and client settings, and how a batch is encoded.
//!
//! Each connector's `writer` module names its sink as an alias of `Sink<Marker>`, its
//! marker type.

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::TableProvider;
use datafusion::execution::SendableRecordBatchStream;

use super::dead_letter::{self, DeadLetterContext};
use super::descriptor::{ConnectorKind, Declared};
use super::shared::TableOptions;
use super::{Routing, SinkConnector};
use crate::core::run::{FlushSettings, WriterContext};
use crate::core::{
    DeadLetters, DeadPayload, Envelope, FlowConfig, FlowWriter, SinkMetrics, Transport,
    write_stream,
};
use crate::error::{Error, Result};
use crate::options::{EnvLookup, RawOptions};

/// The record type a connector's transport sends.
pub type RecordOf<C> = <<C as Connector>::Transport as Transport>::Record;

/// What one connector supplies to the generic [`Sink`]. Implemented by a marker type per
/// connector; every method is a plain function of the options (and the mapping built from
/// them), so a sink holds no connector state besides those.
#[async_trait]
pub trait Connector: Send + Sync + 'static {
    /// Which connector this is: the one its options are declared for.
    const KIND: ConnectorKind = <Self::Options as TableOptions>::KIND;

    /// The typed options (the connector's `*SinkOptions`).
    type Options: TableOptions + Debug + Send + Sync;
    /// The validated row mapping, built from the options and the table schema.
    type Mapping: Debug + Send + Sync;
    /// The connection settings the transport is built from.
    type ClientSettings: Debug + Send + Sync;
    /// The gRPC side: a core [`Transport`].
    type Transport: Transport;

    /// Checks the options (the rules between them that the connector checks here) and the
    /// schema against them, and builds the row mapping.
    fn mapping(options: &Self::Options, schema: &SchemaRef) -> Result<Self::Mapping>;

    /// Translates the options into the core's settings.
    fn flow_config(options: &Self::Options, mapping: &Self::Mapping) -> FlowConfig;

    /// Translates the options into the transport's connection settings.
    fn client_settings(options: &Self::Options, mapping: &Self::Mapping) -> Self::ClientSettings;

    /// How rows must be spread over the statement's writers (see [`Routing`]); by default, no
    /// constraint.
    fn routing(_options: &Self::Options, _mapping: &Self::Mapping) -> Routing {
        Routing::any()
    }

    /// A record the service refused, as its dead letter carries it: its payload where it has
    /// one, and the rest of it as a JSON object.
    fn describe_record(record: &RecordOf<Self>) -> DeadPayload;

    /// Connects the transport, once per statement, before the first row is read.
    async fn connect(settings: &Self::ClientSettings) -> Result<Self::Transport>;

    /// Adjusts the mapping to what the service says, once per statement after connecting (the
    /// Pub/Sub sink reads a topic's schema here); `None` keeps the declared mapping.
    async fn prepare(
        _options: &Self::Options,
        _mapping: &Self::Mapping,
        _schema: &SchemaRef,
        _transport: &Self::Transport,
        _ctx: &WriterContext,
    ) -> Result<Option<Self::Mapping>> {
        Ok(None)
    }

    /// The table's reading side (see [`SinkConnector::reader`]), built once when the table is
    /// declared; by default none (write-only).
    fn reader(
        _options: &Self::Options,
        _mapping: &Self::Mapping,
        _schema: &SchemaRef,
    ) -> Option<Arc<dyn TableProvider>> {
        None
    }

    /// Encodes `batch`, whose first row has index `first_row` within the statement: appends one
    /// entry per row, in row order, `Err` for a row that cannot be sent (it goes to the failure
    /// policy). An `Err` return fails the statement.
    fn encode_batch(
        options: &Self::Options,
        mapping: &Self::Mapping,
        batch: &RecordBatch,
        first_row: u64,
        out: &mut Vec<Result<Envelope<RecordOf<Self>>>>,
    ) -> Result<()>;
}

/// A declared sink of connector `C`: its options, checked against the table schema, the row
/// mapping and the flow-control settings they translate to. Building one contacts no service;
/// the transport connects when a statement starts writing.
pub struct Sink<C: Connector> {
    schema: SchemaRef,
    options: C::Options,
    mapping: C::Mapping,
    flow: FlowConfig,
    reader: Option<Arc<dyn TableProvider>>,
}

impl<C: Connector> Sink<C> {
    /// Checks the options and the schema; contacts no service.
    pub fn try_new(schema: SchemaRef, location: Option<&str>, raw: &RawOptions) -> Result<Self> {
        Self::from_options(schema, C::Options::from_raw(location, raw)?)
    }

    /// Builds the sink from typed options (the Rust API, without SQL). Checks the schema
    /// against the mapping; contacts no service.
    pub fn from_options(schema: SchemaRef, options: C::Options) -> Result<Self> {
        let mapping = C::mapping(&options, &schema)?;
        let mut flow = C::flow_config(&options, &mapping);
        options.shared().apply(&mut flow);
        let reader = C::reader(&options, &mapping, &schema);
        Ok(Self {
            schema,
            options,
            mapping,
            flow,
            reader,
        })
    }

    /// The parsed options.
    pub fn options(&self) -> &C::Options {
        &self.options
    }

    /// The validated row mapping.
    pub fn mapping(&self) -> &C::Mapping {
        &self.mapping
    }

    /// The flow-control settings the options translate to.
    pub fn flow_config(&self) -> &FlowConfig {
        &self.flow
    }

    /// The connection settings the transport is built from.
    pub fn client_settings(&self) -> C::ClientSettings {
        C::client_settings(&self.options, &self.mapping)
    }

    /// The flow-control settings, for a connector's own builder methods (such as Bigtable's
    /// budgets, which are not table options).
    pub(crate) fn flow_config_mut(&mut self) -> &mut FlowConfig {
        &mut self.flow
    }
}

impl<C: Connector> Debug for Sink<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink")
            .field("connector", &C::KIND)
            .field("schema", &self.schema)
            .field("options", &self.options)
            .field("mapping", &self.mapping)
            .field("flow", &self.flow)
            .finish()
    }
}

#[async_trait]
impl<C: Connector> SinkConnector for Sink<C> {
    fn kind(&self) -> ConnectorKind {
        C::KIND
    }

    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn routing(&self) -> Routing {
        C::routing(&self.options, &self.mapping)
    }

    fn parallelism(&self) -> Option<usize> {
        self.options.shared().run.sink_parallelism
    }

    fn reader(&self) -> Option<Arc<dyn TableProvider>> {
        self.reader.clone()
    }

    /// Connects the transport, writes every row through the core and returns how many the
    /// service acknowledged.
    async fn write_all(
        &self,
        input: SendableRecordBatchStream,
        metrics: SinkMetrics,
        ctx: &WriterContext,
    ) -> Result<u64> {
        // Nothing was read or sent yet, and the error says so like every failed statement. A
        // stop request ends a connection attempt that does not finish.
        let settings = self.client_settings();
        let connected = tokio::select! {
            biased;
            _ = ctx.stop.stopped() => Err(Error::Stopped {
                reason: ctx.stop.reason().unwrap_or_else(|| "the statement was stopped".into()),
            }),
            connected = C::connect(&settings) => connected,
        };
        let incomplete = |error| Error::Incomplete {
            source: Box::new(error),
            acknowledged: 0,
            not_delivered: 0,
            dead_lettered: 0,
        };
        let transport = match connected {
            Ok(transport) => Arc::new(transport),
            Err(error) => return Err(incomplete(error)),
        };
        let prepared = tokio::select! {
            biased;
            _ = ctx.stop.stopped() => Err(Error::Stopped {
                reason: ctx.stop.reason().unwrap_or_else(|| "the statement was stopped".into()),
            }),
            prepared = C::prepare(&self.options, &self.mapping, &self.schema, &transport, ctx) => prepared,
        }
        .map_err(incomplete)?;
        let mapping = prepared.as_ref().unwrap_or(&self.mapping);
        let dead_letters = match &self.options.shared().dead_letter {
            Some(target) => {
                let context = DeadLetterContext {
                    connector: C::KIND,
                    table: ctx.table.as_deref().unwrap_or_default().to_string(),
                    // A context built without a statement id (a Rust program calling
                    // `write_all` itself) still names its objects uniquely.
                    statement: if ctx.statement.is_empty() {
                        crate::core::run::new_statement_id()
                    } else {
                        ctx.statement.to_string()
                    },
                    writer: ctx.writer,
                    runtime: ctx.runtime.clone(),
                };
                let sink = dead_letter::open(target, context)
                    .await
                    .map_err(incomplete)?;
                Some(DeadLetters {
                    sink,
                    describe: Arc::new(C::describe_record),
                })
            }
            None => None,
        };
        // The statement's caps are split among its writers (ADR 0030): `ctx.writers` is the
        // plan's writer count, the same on every executor of a cluster.
        let writer = FlowWriter::with_dead_letters(
            transport,
            self.flow.share_of(ctx.writers),
            metrics,
            dead_letters,
        );
        let run = &self.options.shared().run;
        let flush = FlushSettings {
            interval: run.flush_interval,
            rows: run.flush_rows,
        };
        write_stream(
            writer,
            input,
            ctx,
            flush,
            dead_letter::source_row,
            |batch, first_row, out| C::encode_batch(&self.options, mapping, batch, first_row, out),
        )
        .await
    }
}

/// Declares a sink of connector `C` (what each connector's descriptor calls): parses the
/// options with the environment read through `env`, checks them and the schema, and returns
/// the sink with the connection its options resolved to.
pub fn declare<C: Connector>(
    schema: SchemaRef,
    location: Option<&str>,
    raw: &RawOptions,
    env: EnvLookup<'_>,
) -> Result<Declared> {
    let options = C::Options::from_raw_with_env(location, raw, env)?;
    let connection = options.shared().connection.clone();
    Ok(Declared {
        sink: Arc::new(Sink::<C>::from_options(schema, options)?),
        connection,
    })
}

#[cfg(test)]
mod tests {
    use crate::test_util::raw_options;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;
    use crate::connectors::registry::build_sink;

    #[test]
    fn every_connector_builds_the_generic_sink_of_its_kind() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, false),
            Field::new("data", DataType::Utf8, true),
        ]));
        let cases = [
            (
                crate::connectors::pubsub::KIND,
                raw_options(&[
                    ("topic", "projects/p/topics/clicks"),
                    ("data_column", "data"),
                    ("attribute_columns", "id"),
                ]),
            ),
            (
                crate::connectors::cloud_tasks::KIND,
                raw_options(&[
                    ("queue", "projects/p/locations/l/queues/q"),
                    ("url", "https://w.example.com/"),
                ]),
            ),
            (
                crate::connectors::bigtable::KIND,
                raw_options(&[
                    ("table", "projects/p/instances/i/tables/t"),
                    ("row_key", "id"),
                ]),
            ),
        ];
        for (kind, options) in cases {
            let sink = build_sink(kind, schema.clone(), None, &options).unwrap();
            assert_eq!(sink.kind(), kind);
            assert_eq!(sink.schema(), &schema);
            let debug = format!("{sink:?}");
            assert!(
                debug.starts_with("Sink {") && debug.contains(&format!("connector: {kind:?}")),
                "{debug}"
            );
        }
    }
}
