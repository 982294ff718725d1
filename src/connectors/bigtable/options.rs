//! Options of the Bigtable connector.
//!
//! [`BigtableWriterOptions`] holds the writer options of the seed
//! (`BigtableWriterOptions.Builder`), one builder method per seed method. [`BigtableSinkOptions`]
//! adds the connection, the table and the row mapping, and is what both SQL forms build through
//! [`BigtableSinkOptions::from_raw`].
//!
//! ```
//! use gcp_sql::connectors::bigtable::options::BigtableWriterOptions;
//!
//! let opts = BigtableWriterOptions::builder().batch_element_count_threshold(19_999).build()?;
//! assert_eq!(opts.batch_element_count_threshold(), 19_999);
//!
//! // One over the client's ceiling is refused, naming the option.
//! let err = BigtableWriterOptions::builder().batch_element_count_threshold(20_000).build().unwrap_err();
//! assert!(err.to_string().contains("batch_element_count_threshold"));
//!
//! // An in-flight bound above the client's own flow control is allowed, with a warning.
//! let opts = BigtableWriterOptions::builder().max_in_flight_entries(50_000).build()?;
//! assert_eq!(opts.warnings().len(), 1);
//! # Ok::<(), gcp_sql::Error>(())
//! ```

use std::time::Duration;

use arrow::datatypes::{DataType, Schema};

use crate::core::FailurePolicy;
use crate::error::{Error, Result};
use crate::options::registry::{bigtable as spec, common, pubsub as shared};
use crate::options::spec::{binary_size, format_duration, group_digits};
use crate::options::{
    ConnectionOptions, ConnectorKind, EnvLookup, ParsedOptions, RawOptions, location_text,
    merge_location, names, schema_types,
};

/// `max_consecutive_rejections` value that never fails the statement.
pub const UNBOUNDED: i32 = -1;

/// Entries the Java client's flow controller admits outstanding (GCP_FACTS: Bigtable batcher
/// flow control 20,000 entries).
pub const CLIENT_FLOW_CONTROL_MAX_ENTRIES: i64 = 20_000;
/// Bytes the Java client's flow controller admits outstanding (GCP_FACTS: 100 MiB).
pub const CLIENT_FLOW_CONTROL_MAX_BYTES: i64 = 100 << 20;
/// Largest `batch_element_count_threshold`: one under [`CLIENT_FLOW_CONTROL_MAX_ENTRIES`], which
/// the client's settings require the threshold to stay strictly below (seed).
pub const MAX_BATCH_ELEMENT_COUNT_THRESHOLD: i64 = CLIENT_FLOW_CONTROL_MAX_ENTRIES - 1;
/// Largest `batch_request_byte_threshold`: one byte under [`CLIENT_FLOW_CONTROL_MAX_BYTES`] (seed).
pub const MAX_BATCH_REQUEST_BYTE_THRESHOLD: i64 = CLIENT_FLOW_CONTROL_MAX_BYTES - 1;
/// Default of `batch_element_count_threshold`: the client's 100 entries (seed, GCP_FACTS).
pub const DEFAULT_BATCH_ELEMENT_COUNT_THRESHOLD: i64 = 100;
/// Default of `batch_request_byte_threshold`: the client's 20 MiB (seed, GCP_FACTS).
pub const DEFAULT_BATCH_REQUEST_BYTE_THRESHOLD: i64 = 20 << 20;
/// Default of `max_in_flight_entries` (seed).
pub const DEFAULT_MAX_IN_FLIGHT_ENTRIES: i32 = 1000;
/// Default of `max_in_flight_bytes`: 64 MiB (seed).
pub const DEFAULT_MAX_IN_FLIGHT_BYTES: i64 = 64 << 20;
/// Default of `max_consecutive_rejections` (seed).
pub const DEFAULT_MAX_CONSECUTIVE_REJECTIONS: i32 = 100;
/// Default of `recovery_initial_backoff` (seed).
pub const DEFAULT_RECOVERY_INITIAL_BACKOFF: Duration = Duration::from_millis(500);
/// Default of `recovery_max_backoff` (seed).
pub const DEFAULT_RECOVERY_MAX_BACKOFF: Duration = Duration::from_secs(10);
/// Default of `recovery_max_attempts` (seed).
pub const DEFAULT_RECOVERY_MAX_ATTEMPTS: i32 = 10;
/// Default of `destination_idle_timeout`. The seed leaves the value open; ten minutes, as for
/// Pub/Sub publishers.
pub const DEFAULT_DESTINATION_IDLE_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// Default of `max_active_instances` (seed).
pub const DEFAULT_MAX_ACTIVE_INSTANCES: i32 = 16;

/// How long a batch waits to fill: the Java client's batcher default of 1 s (GCP_FACTS). Not a
/// seed option.
pub const BATCH_DELAY_THRESHOLD: Duration = Duration::from_secs(1);
/// No-progress budget of the writer. Not a seed option; Pub/Sub's `publish_progress_timeout`
/// default.
pub const PROGRESS_TIMEOUT: Duration = Duration::from_secs(600);
/// Budget of one release of instance clients. Not a seed option; Pub/Sub's `shutdown_timeout`
/// default.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// Default `row_key_delimiter`.
pub const DEFAULT_ROW_KEY_DELIMITER: &str = "#";
/// Default `column_family`.
pub const DEFAULT_COLUMN_FAMILY: &str = "cf";

/// The Bigtable writer options: batching, in-flight bounds, the rejection breaker, recovery and
/// the instance-client pool. Build with [`BigtableWriterOptions::builder`].
#[derive(Debug, Clone, PartialEq)]
pub struct BigtableWriterOptions {
    batch_element_count_threshold: i64,
    batch_request_byte_threshold: i64,
    max_in_flight_entries: i32,
    max_in_flight_bytes: i64,
    max_consecutive_rejections: i32,
    recovery_initial_backoff: Duration,
    recovery_max_backoff: Duration,
    recovery_max_attempts: i32,
    destination_idle_timeout: Duration,
    max_active_instances: i32,
    per_destination_metrics: bool,
    warnings: Vec<String>,
}

impl Default for BigtableWriterOptions {
    fn default() -> Self {
        BigtableWriterOptions {
            batch_element_count_threshold: DEFAULT_BATCH_ELEMENT_COUNT_THRESHOLD,
            batch_request_byte_threshold: DEFAULT_BATCH_REQUEST_BYTE_THRESHOLD,
            max_in_flight_entries: DEFAULT_MAX_IN_FLIGHT_ENTRIES,
            max_in_flight_bytes: DEFAULT_MAX_IN_FLIGHT_BYTES,
            max_consecutive_rejections: DEFAULT_MAX_CONSECUTIVE_REJECTIONS,
            recovery_initial_backoff: DEFAULT_RECOVERY_INITIAL_BACKOFF,
            recovery_max_backoff: DEFAULT_RECOVERY_MAX_BACKOFF,
            recovery_max_attempts: DEFAULT_RECOVERY_MAX_ATTEMPTS,
            destination_idle_timeout: DEFAULT_DESTINATION_IDLE_TIMEOUT,
            max_active_instances: DEFAULT_MAX_ACTIVE_INSTANCES,
            per_destination_metrics: false,
            warnings: Vec::new(),
        }
    }
}

impl BigtableWriterOptions {
    /// A builder with every option at its default.
    pub fn builder() -> BigtableWriterOptionsBuilder {
        BigtableWriterOptionsBuilder::default()
    }
    /// Entries per MutateRows request before it is sent.
    pub fn batch_element_count_threshold(&self) -> i64 {
        self.batch_element_count_threshold
    }
    /// Mutation bytes per request before it is sent.
    pub fn batch_request_byte_threshold(&self) -> i64 {
        self.batch_request_byte_threshold
    }
    /// In-flight entry cap.
    pub fn max_in_flight_entries(&self) -> i32 {
        self.max_in_flight_entries
    }
    /// In-flight byte cap.
    pub fn max_in_flight_bytes(&self) -> i64 {
        self.max_in_flight_bytes
    }
    /// Consecutive confirmed rejections that fail the statement; [`UNBOUNDED`] never does.
    pub fn max_consecutive_rejections(&self) -> i32 {
        self.max_consecutive_rejections
    }
    /// The breaker bound for the core: `None` when unbounded.
    pub fn rejection_limit(&self) -> Option<u64> {
        u64::try_from(self.max_consecutive_rejections).ok()
    }
    /// First backoff of the table auto-creation recovery.
    pub fn recovery_initial_backoff(&self) -> Duration {
        self.recovery_initial_backoff
    }
    /// Backoff cap of the table auto-creation recovery.
    pub fn recovery_max_backoff(&self) -> Duration {
        self.recovery_max_backoff
    }
    /// Attempts of the table auto-creation recovery.
    pub fn recovery_max_attempts(&self) -> i32 {
        self.recovery_max_attempts
    }
    /// Idle time after which a table's batching state is dropped.
    pub fn destination_idle_timeout(&self) -> Duration {
        self.destination_idle_timeout
    }
    /// Open-or-closing instance client cap.
    pub fn max_active_instances(&self) -> i32 {
        self.max_active_instances
    }
    /// Whether per-table counters are registered.
    pub fn per_destination_metrics(&self) -> bool {
        self.per_destination_metrics
    }
    /// The warnings [`build`](BigtableWriterOptionsBuilder::build) logged: an in-flight bound
    /// above the client's own flow-control budget.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }
}

/// Builder of [`BigtableWriterOptions`]; every value is checked in [`build`](Self::build).
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct BigtableWriterOptionsBuilder {
    batch_element_count_threshold: Option<i64>,
    batch_request_byte_threshold: Option<i64>,
    max_in_flight_entries: Option<i32>,
    max_in_flight_bytes: Option<i64>,
    max_consecutive_rejections: Option<i32>,
    recovery_initial_backoff: Option<Duration>,
    recovery_max_backoff: Option<Duration>,
    recovery_max_attempts: Option<i32>,
    destination_idle_timeout: Option<Duration>,
    max_active_instances: Option<i32>,
    per_destination_metrics: Option<bool>,
}

impl BigtableWriterOptionsBuilder {
    /// Entries per request (1 to 19,999; default 100).
    pub fn batch_element_count_threshold(mut self, v: i64) -> Self {
        self.batch_element_count_threshold = Some(v);
        self
    }
    /// Mutation bytes per request (1 to 100 MiB - 1; default 20 MiB).
    pub fn batch_request_byte_threshold(mut self, v: i64) -> Self {
        self.batch_request_byte_threshold = Some(v);
        self
    }
    /// In-flight entry cap (positive; default 1000; above 20,000 warns).
    pub fn max_in_flight_entries(mut self, v: i32) -> Self {
        self.max_in_flight_entries = Some(v);
        self
    }
    /// In-flight byte cap (positive; default 64 MiB; above 100 MiB warns).
    pub fn max_in_flight_bytes(mut self, v: i64) -> Self {
        self.max_in_flight_bytes = Some(v);
        self
    }
    /// Consecutive confirmed rejections that fail the statement (positive or [`UNBOUNDED`];
    /// default 100).
    pub fn max_consecutive_rejections(mut self, v: i32) -> Self {
        self.max_consecutive_rejections = Some(v);
        self
    }
    /// First backoff of the table auto-creation recovery (at least 1 ms; default 500 ms).
    pub fn recovery_initial_backoff(mut self, v: Duration) -> Self {
        self.recovery_initial_backoff = Some(v);
        self
    }
    /// Backoff cap of the recovery (at least 1 ms and the initial; default 10 s).
    pub fn recovery_max_backoff(mut self, v: Duration) -> Self {
        self.recovery_max_backoff = Some(v);
        self
    }
    /// Attempts of the recovery (positive; default 10).
    pub fn recovery_max_attempts(mut self, v: i32) -> Self {
        self.recovery_max_attempts = Some(v);
        self
    }
    /// Idle time before a table's batching state is dropped (positive, at most `i64::MAX` ns;
    /// default [`DEFAULT_DESTINATION_IDLE_TIMEOUT`]).
    pub fn destination_idle_timeout(mut self, v: Duration) -> Self {
        self.destination_idle_timeout = Some(v);
        self
    }
    /// Open-or-closing instance client cap (positive; default 16).
    pub fn max_active_instances(mut self, v: i32) -> Self {
        self.max_active_instances = Some(v);
        self
    }
    /// Register per-table counters (default false).
    pub fn per_destination_metrics(mut self, v: bool) -> Self {
        self.per_destination_metrics = Some(v);
        self
    }

    /// Checks every value and the cross-option rules; the error names the option and the rule.
    ///
    /// An in-flight bound above the client's own flow-control budget (20,000 entries, 100 MiB)
    /// is not refused — a sink spread over several instances draws on several such budgets — but
    /// logged as a warning and kept in [`BigtableWriterOptions::warnings`].
    pub fn build(self) -> Result<BigtableWriterOptions> {
        let mut o = BigtableWriterOptions::default();
        if let Some(v) = self.batch_element_count_threshold {
            spec::BATCH_ELEMENT_COUNT_THRESHOLD.check_int(v)?;
            o.batch_element_count_threshold = v;
        }
        if let Some(v) = self.batch_request_byte_threshold {
            spec::BATCH_REQUEST_BYTE_THRESHOLD.check_int(v)?;
            o.batch_request_byte_threshold = v;
        }
        if let Some(v) = self.max_in_flight_entries {
            spec::MAX_IN_FLIGHT_ENTRIES.check_int(v.into())?;
            o.max_in_flight_entries = v;
        }
        if let Some(v) = self.max_in_flight_bytes {
            spec::MAX_IN_FLIGHT_BYTES.check_int(v)?;
            o.max_in_flight_bytes = v;
        }
        if let Some(v) = self.max_consecutive_rejections {
            shared::MAX_CONSECUTIVE_REJECTIONS.check_int(v.into())?;
            o.max_consecutive_rejections = v;
        }
        if let Some(v) = self.recovery_initial_backoff {
            spec::RECOVERY_INITIAL_BACKOFF.check_duration(v)?;
            o.recovery_initial_backoff = v;
        }
        if let Some(v) = self.recovery_max_backoff {
            spec::RECOVERY_MAX_BACKOFF.check_duration(v)?;
            o.recovery_max_backoff = v;
        }
        if let Some(v) = self.recovery_max_attempts {
            spec::RECOVERY_MAX_ATTEMPTS.check_int(v.into())?;
            o.recovery_max_attempts = v;
        }
        if let Some(v) = self.destination_idle_timeout {
            spec::DESTINATION_IDLE_TIMEOUT.check_duration(v)?;
            o.destination_idle_timeout = v;
        }
        if let Some(v) = self.max_active_instances {
            spec::MAX_ACTIVE_INSTANCES.check_int(v.into())?;
            o.max_active_instances = v;
        }
        if let Some(v) = self.per_destination_metrics {
            o.per_destination_metrics = v;
        }
        if o.recovery_max_backoff < o.recovery_initial_backoff {
            return Err(spec::RECOVERY_MAX_BACKOFF.invalid(
                format_duration(o.recovery_max_backoff),
                format!(
                    "{} (which is {})",
                    spec::RECOVERY_MAX_BACKOFF.cross_rule,
                    format_duration(o.recovery_initial_backoff)
                ),
            ));
        }
        if i64::from(o.max_in_flight_entries) > CLIENT_FLOW_CONTROL_MAX_ENTRIES {
            o.warnings.push(format!(
                "'{}' = {} is above the {} entries one Bigtable client admits in flight; with a single instance the \
                 client's flow control, not this bound, limits the writer",
                spec::MAX_IN_FLIGHT_ENTRIES.name,
                group_digits(o.max_in_flight_entries.into()),
                group_digits(CLIENT_FLOW_CONTROL_MAX_ENTRIES)
            ));
        }
        if o.max_in_flight_bytes > CLIENT_FLOW_CONTROL_MAX_BYTES {
            o.warnings.push(format!(
                "'{}' = {} is above the {} one Bigtable client admits in flight; with a single instance the client's \
                 flow control, not this bound, limits the writer",
                spec::MAX_IN_FLIGHT_BYTES.name,
                group_digits(o.max_in_flight_bytes),
                binary_size(CLIENT_FLOW_CONTROL_MAX_BYTES)
            ));
        }
        for w in &o.warnings {
            tracing::warn!(target: "gcp_sql::bigtable", "{w}");
        }
        Ok(o)
    }
}

/// What a null cell value does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NullHandling {
    /// Write nothing for it (the default).
    #[default]
    Ignore,
    /// Delete the cell's existing versions.
    Delete,
}

/// How rows become Bigtable mutations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BigtableMappingOptions {
    /// The fixed instance (`projects/P/instances/I`) in which short table ids are resolved.
    pub instance: Option<String>,
    /// Column naming each row's table.
    pub table_column: Option<String>,
    /// Column naming each row's instance.
    pub instance_column: Option<String>,
    /// Columns forming the row key, in order.
    pub row_key: Vec<String>,
    /// Text between the parts of a multi-column key.
    pub row_key_delimiter: String,
    /// Family of the cells written from top-level columns.
    pub column_family: String,
    /// Column giving every cell of the row its version.
    pub timestamp_column: Option<String>,
    /// What a null cell value does.
    pub null_handling: NullHandling,
}

impl BigtableMappingOptions {
    /// A mapping with `row_key` and every other setting at its default.
    pub fn with_row_key(row_key: Vec<String>) -> Self {
        BigtableMappingOptions {
            instance: None,
            table_column: None,
            instance_column: None,
            row_key,
            row_key_delimiter: DEFAULT_ROW_KEY_DELIMITER.into(),
            column_family: DEFAULT_COLUMN_FAMILY.into(),
            timestamp_column: None,
            null_handling: NullHandling::Ignore,
        }
    }

    /// The columns that are not written as cells: the key, the timestamp and the destinations.
    pub fn non_cell_columns(&self) -> Vec<&str> {
        let mut out: Vec<&str> = self.row_key.iter().map(String::as_str).collect();
        out.extend(
            [
                &self.timestamp_column,
                &self.table_column,
                &self.instance_column,
            ]
            .into_iter()
            .filter_map(|c| c.as_deref()),
        );
        out
    }
}

/// Everything a Bigtable sink needs: connection, table, mapping, policy and writer options.
#[derive(Debug, Clone, PartialEq)]
pub struct BigtableSinkOptions {
    /// Project, endpoint, emulator, credentials.
    pub connection: ConnectionOptions,
    /// The fixed table (`projects/P/instances/I/tables/T`), if any.
    pub table: Option<String>,
    /// The row mapping.
    pub mapping: BigtableMappingOptions,
    /// Create a missing table (with the families the mapping needs) in the NOT_FOUND recovery.
    pub auto_create_table: bool,
    /// The application profile writes are routed by.
    pub app_profile_id: Option<String>,
    /// What to do with a refused record.
    pub failure_policy: FailurePolicy,
    /// The writer options.
    pub writer: BigtableWriterOptions,
}

impl BigtableSinkOptions {
    /// Builds the sink options from a statement's `LOCATION` (the table; empty means none) and
    /// options, reading the emulator variable from the process environment.
    ///
    /// ```
    /// use gcp_sql::connectors::bigtable::options::BigtableSinkOptions;
    /// use gcp_sql::options::RawOptions;
    ///
    /// let raw = RawOptions::from_pairs([
    ///     ("project".to_string(), "demo".to_string()),
    ///     ("instance".to_string(), "main".to_string()),
    ///     ("row_key".to_string(), "user_id, ts".to_string()),
    /// ])?;
    /// let opts = BigtableSinkOptions::from_raw(Some("events"), &raw)?;
    /// assert_eq!(opts.table.as_deref(), Some("projects/demo/instances/main/tables/events"));
    /// assert_eq!(opts.mapping.row_key, ["user_id", "ts"]);
    /// # Ok::<(), gcp_sql::Error>(())
    /// ```
    pub fn from_raw(location: Option<&str>, raw: &RawOptions) -> Result<Self> {
        Self::from_raw_with_env(location, raw, &ConnectionOptions::process_env)
    }

    /// [`from_raw`](Self::from_raw) with the environment read through `env`.
    pub fn from_raw_with_env(
        location: Option<&str>,
        raw: &RawOptions,
        env: EnvLookup<'_>,
    ) -> Result<Self> {
        let p = ParsedOptions::parse(ConnectorKind::Bigtable, raw)?;
        let connection = ConnectionOptions::from_parsed(&p, env)?;
        let project = connection.project.as_deref();

        let instance_option = match p.non_empty_text(&spec::INSTANCE)? {
            Some(i) => Some(
                names::bigtable_instance(i, project)
                    .map_err(|rule| spec::INSTANCE.invalid(i, rule))?,
            ),
            None => None,
        };
        let from_location = match location_text(location) {
            Some(l) => Some((
                names::bigtable_table(l, instance_option.as_deref())
                    .map_err(|rule| Error::invalid("LOCATION", l, rule))?,
                l,
            )),
            None => None,
        };
        let from_option = match p.non_empty_text(&spec::TABLE)? {
            Some(t) => Some((
                names::bigtable_table(t, instance_option.as_deref())
                    .map_err(|rule| spec::TABLE.invalid(t, rule))?,
                t,
            )),
            None => None,
        };
        let table = merge_location(&spec::TABLE, from_location, from_option)?;
        let table_instance = table
            .as_deref()
            .and_then(names::instance_of_table)
            .map(str::to_string);
        if let (Some(opt), Some(of_table)) = (&instance_option, &table_instance)
            && opt != of_table
        {
            return Err(spec::INSTANCE.invalid(
                p.text_as_written(&spec::INSTANCE).unwrap_or_default(),
                format!(
                    "the table '{}' belongs to instance '{of_table}'",
                    table.as_deref().unwrap_or_default()
                ),
            ));
        }

        let row_key = match p.list(&spec::ROW_KEY)? {
            Some(cols) => cols.to_vec(),
            None => {
                return Err(Error::MissingOption {
                    option: spec::ROW_KEY.name.into(),
                    rule: "a Bigtable sink needs the column (or comma-separated columns) that form the row key".into(),
                });
            }
        };
        let column_family = p
            .text(&spec::COLUMN_FAMILY)?
            .unwrap_or(DEFAULT_COLUMN_FAMILY)
            .to_string();
        names::check_family_id(&column_family)
            .map_err(|rule| spec::COLUMN_FAMILY.invalid(&column_family, rule))?;
        let null_handling = match p.text(&spec::NULL_HANDLING)? {
            None | Some("ignore") => NullHandling::Ignore,
            Some("delete") => NullHandling::Delete,
            Some(other) => {
                return Err(spec::NULL_HANDLING.invalid(other, "expected 'ignore' or 'delete'"));
            }
        };
        let mapping = BigtableMappingOptions {
            instance: table_instance.or(instance_option),
            table_column: p.text(&spec::TABLE_COLUMN)?.map(str::to_string),
            instance_column: p.text(&spec::INSTANCE_COLUMN)?.map(str::to_string),
            row_key,
            row_key_delimiter: p
                .text(&spec::ROW_KEY_DELIMITER)?
                .unwrap_or(DEFAULT_ROW_KEY_DELIMITER)
                .to_string(),
            column_family,
            timestamp_column: p.text(&spec::TIMESTAMP_COLUMN)?.map(str::to_string),
            null_handling,
        };

        let mut b = BigtableWriterOptions::builder();
        if let Some(v) = p.int(&spec::BATCH_ELEMENT_COUNT_THRESHOLD)? {
            b = b.batch_element_count_threshold(v);
        }
        if let Some(v) = p.int(&spec::BATCH_REQUEST_BYTE_THRESHOLD)? {
            b = b.batch_request_byte_threshold(v);
        }
        if let Some(v) = p.int32(&spec::MAX_IN_FLIGHT_ENTRIES)? {
            b = b.max_in_flight_entries(v);
        }
        if let Some(v) = p.int(&spec::MAX_IN_FLIGHT_BYTES)? {
            b = b.max_in_flight_bytes(v);
        }
        if let Some(v) = p.int32(&shared::MAX_CONSECUTIVE_REJECTIONS)? {
            b = b.max_consecutive_rejections(v);
        }
        if let Some(v) = p.duration(&spec::RECOVERY_INITIAL_BACKOFF)? {
            b = b.recovery_initial_backoff(v);
        }
        if let Some(v) = p.duration(&spec::RECOVERY_MAX_BACKOFF)? {
            b = b.recovery_max_backoff(v);
        }
        if let Some(v) = p.int32(&spec::RECOVERY_MAX_ATTEMPTS)? {
            b = b.recovery_max_attempts(v);
        }
        if let Some(v) = p.duration(&spec::DESTINATION_IDLE_TIMEOUT)? {
            b = b.destination_idle_timeout(v);
        }
        if let Some(v) = p.int32(&spec::MAX_ACTIVE_INSTANCES)? {
            b = b.max_active_instances(v);
        }
        if let Some(v) = p.bool(&common::PER_DESTINATION_METRICS)? {
            b = b.per_destination_metrics(v);
        }

        let opts = BigtableSinkOptions {
            connection,
            table,
            mapping,
            auto_create_table: p.bool(&spec::AUTO_CREATE_TABLE)?.unwrap_or(false),
            app_profile_id: p.non_empty_text(&spec::APP_PROFILE_ID)?.map(str::to_string),
            failure_policy: p.failure_policy()?,
            writer: b.build()?,
        };
        opts.validate()?;
        Ok(opts)
    }

    /// Checks the rules between sections: a table is required (fixed or from a column, not
    /// both), the instance is given once, and a short table id has an instance to live in.
    pub fn validate(&self) -> Result<()> {
        let m = &self.mapping;
        match (&self.table, &m.table_column) {
            (None, None) => {
                return Err(Error::MissingOption {
                    option: spec::TABLE.name.into(),
                    rule: "a Bigtable sink needs a table: LOCATION 'projects/P/instances/I/tables/T', the 'table' \
                           option, or a per-row 'table_column'"
                        .into(),
                });
            }
            (Some(t), Some(c)) => {
                return Err(spec::TABLE_COLUMN.invalid(
                    c,
                    format!("{} (table '{t}')", spec::TABLE_COLUMN.cross_rule),
                ));
            }
            _ => {}
        }
        if let Some(c) = &m.instance_column {
            if let Some(t) = &self.table {
                return Err(spec::INSTANCE_COLUMN.invalid(
                    c,
                    format!(
                        "{} (table '{t}' already names its instance)",
                        spec::INSTANCE_COLUMN.cross_rule
                    ),
                ));
            }
            if let Some(i) = &m.instance {
                return Err(spec::INSTANCE_COLUMN.invalid(
                    c,
                    format!("{} (instance '{i}')", spec::INSTANCE_COLUMN.cross_rule),
                ));
            }
        }
        if m.row_key.is_empty() {
            return Err(Error::MissingOption {
                option: spec::ROW_KEY.name.into(),
                rule: "at least one column".into(),
            });
        }
        Ok(())
    }

    /// Checks the table's columns against the mapping: key columns exist and are string, binary
    /// or integer; the timestamp column is a timestamp or int64; destination columns are
    /// strings; and at least one column is left to become a cell.
    pub fn validate_schema(&self, schema: &Schema) -> Result<()> {
        let m = &self.mapping;
        for c in &m.row_key {
            let dt = schema_types::column_type(schema, c, spec::ROW_KEY.name)?;
            if !(schema_types::is_string(dt)
                || schema_types::is_binary(dt)
                || schema_types::is_integer(dt))
            {
                return Err(Error::schema(
                    c,
                    format!(
                        "a row key column must be a string, binary or integer type, found {dt}"
                    ),
                ));
            }
        }
        if let Some(c) = &m.timestamp_column {
            let dt = schema_types::column_type(schema, c, spec::TIMESTAMP_COLUMN.name)?;
            if !matches!(dt, DataType::Timestamp(_, _) | DataType::Int64) {
                return Err(Error::schema(
                    c,
                    format!("'timestamp_column' needs a timestamp or int64 column, found {dt}"),
                ));
            }
        }
        for (option, col) in [
            (spec::TABLE_COLUMN.name, &m.table_column),
            (spec::INSTANCE_COLUMN.name, &m.instance_column),
        ] {
            if let Some(c) = col {
                let dt = schema_types::column_type(schema, c, option)?;
                if !schema_types::is_string(dt) {
                    return Err(Error::schema(
                        c,
                        format!("'{option}' needs a string column, found {dt}"),
                    ));
                }
            }
        }
        let skip = m.non_cell_columns();
        if !schema
            .fields()
            .iter()
            .any(|f| !skip.contains(&f.name().as_str()))
        {
            return Err(Error::schema(
                m.row_key.join(","),
                "no column is left to become a cell: every column is the row key, the timestamp or a destination",
            ));
        }
        Ok(())
    }

    /// The table of one row: the table column's value (full name, or short id in the row's
    /// instance) or the fixed table. The error is the reason, for the mapping to report.
    pub fn resolve_table(
        &self,
        table_value: Option<&str>,
        instance_value: Option<&str>,
    ) -> std::result::Result<String, String> {
        let m = &self.mapping;
        let instance = match (&m.instance_column, instance_value) {
            (Some(_), Some(i)) => Some(names::bigtable_instance(
                i,
                self.connection.project.as_deref(),
            )?),
            (Some(c), None) => return Err(format!("the instance column '{c}' is null")),
            (None, _) => m.instance.clone(),
        };
        match (&m.table_column, table_value, &self.table) {
            (Some(_), Some(t), _) => names::bigtable_table(t, instance.as_deref()),
            (Some(c), None, _) => Err(format!("the table column '{c}' is null")),
            (None, _, Some(t)) => Ok(t.clone()),
            (None, _, None) => Err("the sink has no table".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_defaults_equal_documented_defaults() {
        assert_eq!(
            BigtableWriterOptions::builder().build().unwrap(),
            BigtableWriterOptions::default()
        );
    }

    #[test]
    fn ceilings_are_one_under_client_flow_control() {
        assert_eq!(MAX_BATCH_ELEMENT_COUNT_THRESHOLD, 19_999);
        assert_eq!(MAX_BATCH_REQUEST_BYTE_THRESHOLD, 104_857_599);
    }
}
