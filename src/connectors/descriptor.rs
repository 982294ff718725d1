//! What a connector tells the rest of the crate about itself: one [`ConnectorDescriptor`] per
//! connector folder, and [`ConnectorKind`], the copyable handle every layer passes around.
//!
//! A connector folder exports one `pub static CONNECTOR: ConnectorDescriptor`; the registry
//! (`connectors/registry.rs`) lists them, and every list the crate needs (the `STORED AS`
//! factories, the `connector` option's words, the option reference, the inspection
//! functions) is derived from it. What only the tests and benchmarks need (the emulator, the
//! null server) is not here: it is the connector's testing part, which the registry lists beside
//! the descriptor with the `testing` feature. This file names no connector.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{TableFunctionImpl, TableProvider};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::ExecutionPlan;

#[cfg(any(test, feature = "testing"))]
use crate::bench::null_method::NullService;
use crate::core::SinkMetrics;
#[cfg(doc)]
use crate::core::StopKind;
use crate::core::delivery::DeliveryInput;
use crate::core::run::WriterContext;
#[cfg(any(test, feature = "testing"))]
use crate::emulators::kind::EmulatorKind;
use crate::error::{Error, Result};
use crate::options::docs::FixedBudget;
use crate::options::event_time::EventTimeOptions;
use crate::options::{
    ConnectionOptions, EnvLookup, OptionGroup, OptionSpec, ParsedOptions, RawOptions, Service,
};

/// A declared sink and the connection its options resolved to (the emulator address read from
/// the environment included), as [`ConnectorDescriptor::declare`] returns them.
pub struct Declared {
    /// The sink, options and schema checked.
    pub sink: Arc<dyn SinkConnector>,
    /// The connection the options resolved to.
    pub connection: ConnectionOptions,
}

/// Builds a sink from a declaration: the table schema, the `LOCATION` (`None` or non-empty),
/// the options as written and the environment the emulator variable is read from.
pub type DeclareFn = fn(SchemaRef, Option<&str>, &RawOptions, EnvLookup<'_>) -> Result<Declared>;

/// Builds a source table from its name, schema, `LOCATION` (`None` or non-empty) and options.
pub type DeclareSourceFn =
    fn(&str, SchemaRef, Option<&str>, &RawOptions) -> Result<Arc<dyn TableProvider>>;

/// A connector's source (a table whose rows are read from the service, a subscription for
/// instance): how a `CREATE` declares it, and how the SQL layer finds its scans in a plan and
/// the [`DeliveryInput`] of each scan partition (see [`crate::core::delivery`]).
pub struct SourceDescriptor {
    /// What a source's `LOCATION` names (`subscription`).
    pub location: &'static str,
    /// Every option a source table accepts besides `connector`.
    pub options: fn() -> &'static [&'static OptionSpec],
    /// Whether a declaration (its `LOCATION` and options) is of a source rather than a sink.
    pub declares_source: fn(Option<&str>, &RawOptions) -> bool,
    /// Builds the source table from its name, schema, `LOCATION` and options, checking them;
    /// contacts no service.
    pub declare: DeclareSourceFn,
    /// Whether a table is one of this source's tables.
    pub is_table: fn(&dyn TableProvider) -> bool,
    /// Whether a plan node is one of this source's scans.
    pub is_node: fn(&dyn ExecutionPlan) -> bool,
    /// The delivery input of partition `p` of a scan node; `None` for another node or a
    /// partition out of range.
    pub origin_slot: fn(&dyn ExecutionPlan, usize) -> Option<Arc<dyn DeliveryInput>>,
    /// The event-time settings of a source table (`None` for another table), for planning
    /// windows before the scan exists.
    pub table_event_time: fn(&dyn TableProvider) -> Option<EventTimeOptions>,
    /// What windows over a scan node need of its source (`None` for another node): ADR 0068.
    pub windows: fn(&dyn ExecutionPlan) -> Option<WindowedSource>,
}

/// What a windowed aggregate over a source needs of it (ADR 0068): its event time and
/// progress marker, what a late row does, and how long a message may be held.
#[derive(Debug, Clone)]
pub struct WindowedSource {
    /// The source table's name.
    pub table: String,
    /// The source, for messages (`subscription projects/p/subscriptions/s`).
    pub describe: String,
    /// A stable name of what is read, safe in an object name (`p.s`): the progress marker's
    /// name starts with it.
    pub key: String,
    /// The connector, for dead letters.
    pub connector: ConnectorKind,
    /// Event time, lateness, idleness, progress marker.
    pub event_time: EventTimeOptions,
    /// What a late row does.
    pub failure_policy: crate::core::FailurePolicy,
    /// Where late rows go under `failure_policy = 'dead_letter'`.
    pub dead_letter: Option<crate::connectors::dead_letter::DeadLetterTarget>,
    /// The longest a message may be held (its lease lapses after it).
    pub max_lease_duration: std::time::Duration,
    /// The most messages one stream keeps in flight, for the held capacity it asks for.
    pub max_outstanding_messages: u64,
    /// After a run that did not end gracefully, how long no window is emitted, so that the
    /// messages the killed run held (redelivered once their leases lapse) come back first.
    pub recovery_hold: std::time::Duration,
}

impl fmt::Debug for SourceDescriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SourceDescriptor")
            .field("location", &self.location)
            .finish_non_exhaustive()
    }
}

/// The table functions a connector offers for inspection (`pubsub_pull`, `bigtable_read`,
/// ...), by name.
pub type InspectionFn = fn() -> Vec<(&'static str, Arc<dyn TableFunctionImpl>)>;

/// Everything the crate outside a connector's folder needs to know about it.
///
/// ```
/// use gcp_sql::connectors::registry;
///
/// let names: Vec<&str> = registry::kinds().map(|k| k.name()).collect();
/// assert!(names.contains(&"pubsub"));
/// let kind = registry::kind_named("BIGTABLE")?;
/// assert_eq!(kind.descriptor().destination, "table");
/// # Ok::<(), gcp_sql::Error>(())
/// ```
pub struct ConnectorDescriptor {
    /// The name used in `connector = '...'` (`pubsub`).
    pub name: &'static str,
    /// The word after `STORED AS` (`PUBSUB`); DataFusion upper-cases it before it looks up
    /// the table factory.
    pub stored_as: &'static str,
    /// The product name, for prose (`Pub/Sub`).
    pub display_name: &'static str,
    /// What `LOCATION` names (`topic`, `queue`, `table`).
    pub destination: &'static str,
    /// The service's emulator variable and public endpoint.
    pub service: Service,
    /// Every option the connector accepts except `connector` itself, in the order the
    /// reference lists them.
    pub options: fn() -> &'static [&'static OptionSpec],
    /// Paragraphs the option reference shows above a group's table.
    pub group_notes: &'static [(OptionGroup, &'static str)],
    /// Settings that are not options, documented beside them.
    pub fixed_budgets: &'static [FixedBudget],
    /// Builds a sink from a declaration, checking its options and schema; contacts no service.
    pub declare: DeclareFn,
    /// The connector's inspection table functions.
    pub inspection: InspectionFn,
    /// The connector's source, if it has one.
    pub source: Option<&'static SourceDescriptor>,
}

impl fmt::Debug for ConnectorDescriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectorDescriptor")
            .field("name", &self.name)
            .field("stored_as", &self.stored_as)
            .finish_non_exhaustive()
    }
}

/// What the tests and benchmarks need of one connector (feature `testing`), kept out of its
/// production descriptor: each connector folder's `testing` module defines one, and
/// the registry's `CONNECTORS` lists it beside the descriptor. The launcher ([`crate::emulators`]) and the
/// null servers ([`crate::bench`]) read only the spec types these handles carry, never this.
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
#[derive(Debug)]
pub struct TestingPart {
    /// Its emulator; `None` for a service without one.
    pub emulator: Option<EmulatorKind>,
    /// The service its null server stands in for (`gcp-sql serve-null`); `None` for a service
    /// without one.
    pub null_service: Option<NullService>,
    /// A table of the connector that the crate's tests declare and write to without a service
    /// (the cluster codec's round trips, for instance).
    pub sample: SampleTable,
}

/// A table of one connector as the tests declare it, and a statement that writes to it
/// (feature `testing`).
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
#[derive(Debug, Clone, Copy)]
pub struct SampleTable {
    /// The table's name.
    pub name: &'static str,
    /// The `CREATE EXTERNAL TABLE` that declares it, with options of every kind (a duration, a
    /// count, a column mapping) and an emulator address given as an option.
    pub create: &'static str,
    /// An `INSERT` into it, ordered as its writers require their input.
    pub insert: &'static str,
}

/// A connector, as every layer passes it around: a copyable handle on its
/// [`ConnectorDescriptor`]. Two handles are equal when they name the same connector.
#[derive(Clone, Copy)]
pub struct ConnectorKind(&'static ConnectorDescriptor);

impl ConnectorKind {
    /// The handle of `descriptor` (each connector folder defines its `KIND` with it).
    pub const fn of(descriptor: &'static ConnectorDescriptor) -> Self {
        ConnectorKind(descriptor)
    }

    /// The connector's descriptor.
    pub const fn descriptor(self) -> &'static ConnectorDescriptor {
        self.0
    }

    /// The name used in `connector = '...'` (`pubsub`, `cloud_tasks`, `bigtable`).
    pub fn name(self) -> &'static str {
        self.0.name
    }

    /// The word after `STORED AS` (`PUBSUB`, `CLOUD_TASKS`, `BIGTABLE`).
    pub fn stored_as(self) -> &'static str {
        self.0.stored_as
    }

    /// The product name, for prose.
    pub fn display_name(self) -> &'static str {
        self.0.display_name
    }

    /// The environment variable that points the connector at an emulator when the
    /// `emulator_host` option is absent.
    pub fn emulator_env_var(self) -> &'static str {
        self.0.service.emulator_env_var
    }

    /// The service's public endpoint.
    pub fn public_endpoint(self) -> &'static str {
        self.0.service.public_endpoint
    }

    /// What the connection options need to know of the connector's service.
    pub fn service(self) -> Service {
        self.0.service
    }

    /// Checks the names of `raw` against this connector's options
    /// ([`Error::UnknownOption`] with the nearest valid name) and parses every value by its
    /// type and value-level bound. A `connector` option, if given, must name this connector.
    ///
    /// This is the one path from a statement's pairs to parsed options: each connector's
    /// A `*SinkOptions`'s `TableOptions::from_raw` starts here and builds its typed options from the result.
    /// Cross-option rules (a destination is required, `recovery_max_backoff` at least
    /// `recovery_initial_backoff`, ...) are checked when the typed options are built.
    pub fn parse_options(self, raw: &RawOptions) -> Result<ParsedOptions> {
        self.parse_options_of((self.0.options)(), raw)
    }

    /// The connector's source when a declaration (its `LOCATION`, `None` or non-empty, and its
    /// options) is of a source table rather than a sink: the one test the table factory, the
    /// option checks and the Python package ask. `None` for a sink, and for a connector
    /// without a source.
    pub fn source_declared(
        self,
        location: Option<&str>,
        raw: &RawOptions,
    ) -> Option<&'static SourceDescriptor> {
        self.0
            .source
            .filter(|source| (source.declares_source)(location, raw))
    }

    /// [`parse_options`](Self::parse_options) against another list of this connector's
    /// options (a source's, for instance).
    pub fn parse_options_of(
        self,
        specs: &'static [&'static OptionSpec],
        raw: &RawOptions,
    ) -> Result<ParsedOptions> {
        let mut rest = Vec::with_capacity(raw.len());
        for (name, value) in raw.iter() {
            if name != "connector" {
                rest.push((name.to_string(), value.to_string()));
            } else if !value.trim().eq_ignore_ascii_case(self.name()) {
                return Err(Error::invalid(
                    "connector",
                    value,
                    format!(
                        "the table is declared for connector '{}' (STORED AS {}); the two must agree",
                        self.name(),
                        self.stored_as()
                    ),
                ));
            }
        }
        ParsedOptions::parse(self.name(), specs, &RawOptions::from_pairs(rest)?)
    }
}

impl PartialEq for ConnectorKind {
    fn eq(&self, other: &Self) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for ConnectorKind {}

impl Hash for ConnectorKind {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.name.hash(state);
    }
}

impl fmt::Debug for ConnectorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.name)
    }
}

impl fmt::Display for ConnectorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.name)
    }
}

/// A declared sink: validated options and schema, ready to write. Building one contacts no
/// service; clients open when the first record of a statement needs them.
#[async_trait]
pub trait SinkConnector: fmt::Debug + Send + Sync {
    /// Which connector this is.
    fn kind(&self) -> ConnectorKind;

    /// The table schema the sink accepts.
    fn schema(&self) -> &SchemaRef;

    /// Writes every row of `input` and returns how many rows the service acknowledged.
    /// Every admitted record is resolved before this returns, whether it returns `Ok` or not.
    ///
    /// `ctx` says which writer of the statement this is, carries the statement's stop request
    /// (see [`StopKind`]) and the observer of flush points. A stopped writer returns
    /// [`Error::Incomplete`] with [`Error::Stopped`] as its source, unless it drained every
    /// admitted row.
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

    /// The table's reading side, for a connector that can read back what it writes (a
    /// Bigtable table answers `SELECT`); `None`: the table is write-only.
    fn reader(&self) -> Option<Arc<dyn TableProvider>> {
        None
    }
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
