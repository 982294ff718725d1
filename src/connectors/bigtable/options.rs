//! Options of the Bigtable connector.
//!
//! Every option of the connector is declared here: the mapping and connection specs as statics,
//! the writer options as one row each of [`writer_options!`](crate::options) (which makes the
//! typed field, its default, getter, builder setter, bound check and SQL reading), and
//! [`options`] lists them all for the connector list.
//!
//! [`BigtableWriterOptions`] holds the writer options, one builder method per option.
//! [`BigtableSinkOptions`] adds the connection, the table and the row mapping, and is what both SQL forms build through
//! [`BigtableSinkOptions`]'s [`TableOptions::from_raw`].
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

use std::sync::LazyLock;
use std::time::Duration;

use arrow::datatypes::{DataType, Schema};

use super::names;
use crate::connectors::dead_letter::DeadLetterTopics;
use crate::connectors::descriptor::ConnectorKind;
use crate::connectors::shared::{SharedOptions, TableOptions};
use crate::error::{Error, Result};
use crate::options::Redact;
use crate::options::common::{self, MAX_CONSECUTIVE_REJECTIONS, PER_DESTINATION_METRICS};
use crate::options::docs::FixedBudget;
use crate::options::spec::{binary_size, format_duration, group_digits};
use crate::options::{
    Bound, DefaultValue, OptionGroup, OptionKind, OptionSpec, ParsedOptions, destination,
    schema_types, writer_options,
};

/// `max_consecutive_rejections` value that never fails the statement.
pub const UNBOUNDED: i32 = -1;

/// Entries the Java client's flow controller admits outstanding (the Java Bigtable client's
/// batcher flow-control default: 20,000 entries).
pub const CLIENT_FLOW_CONTROL_MAX_ENTRIES: i64 = 20_000;
/// Bytes the Java client's flow controller admits outstanding (the same defaults: 100 MiB).
pub const CLIENT_FLOW_CONTROL_MAX_BYTES: i64 = 100 << 20;
/// Largest `batch_element_count_threshold`: one under [`CLIENT_FLOW_CONTROL_MAX_ENTRIES`], which
/// the client's settings require the threshold to stay strictly below.
pub const MAX_BATCH_ELEMENT_COUNT_THRESHOLD: i64 = CLIENT_FLOW_CONTROL_MAX_ENTRIES - 1;
/// Largest `batch_request_byte_threshold`: one byte under [`CLIENT_FLOW_CONTROL_MAX_BYTES`].
pub const MAX_BATCH_REQUEST_BYTE_THRESHOLD: i64 = CLIENT_FLOW_CONTROL_MAX_BYTES - 1;
/// Default of `batch_element_count_threshold`: the client's 100 entries (the Java client's batching defaults).
pub const DEFAULT_BATCH_ELEMENT_COUNT_THRESHOLD: i64 = 100;
/// Default of `batch_request_byte_threshold`: the client's 20 MiB (the Java client's batching defaults).
pub const DEFAULT_BATCH_REQUEST_BYTE_THRESHOLD: i64 = 20 << 20;
/// Default of `max_in_flight_entries`.
pub const DEFAULT_MAX_IN_FLIGHT_ENTRIES: i32 = 1000;
/// Default of `max_in_flight_bytes`: 64 MiB.
pub const DEFAULT_MAX_IN_FLIGHT_BYTES: i64 = 64 << 20;
/// Default of `max_consecutive_rejections`.
pub const DEFAULT_MAX_CONSECUTIVE_REJECTIONS: i32 = common::DEFAULT_MAX_CONSECUTIVE_REJECTIONS;
/// Default of `recovery_initial_backoff`.
pub const DEFAULT_RECOVERY_INITIAL_BACKOFF: Duration = Duration::from_millis(500);
/// Default of `recovery_max_backoff`.
pub const DEFAULT_RECOVERY_MAX_BACKOFF: Duration = Duration::from_secs(10);
/// Default of `recovery_max_attempts`.
pub const DEFAULT_RECOVERY_MAX_ATTEMPTS: i32 = 10;
/// Default of `destination_idle_timeout`: ten minutes, as for Pub/Sub publishers.
pub const DEFAULT_DESTINATION_IDLE_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// Default of `max_active_instances`.
pub const DEFAULT_MAX_ACTIVE_INSTANCES: i32 = 16;

/// How long a batch waits to fill: the Java client's batcher default of 1 s. Not an option.
pub const BATCH_DELAY_THRESHOLD: Duration = Duration::from_secs(1);
/// No-progress budget of the writer. Not an option; Pub/Sub's `publish_progress_timeout`
/// default.
pub const PROGRESS_TIMEOUT: Duration = Duration::from_secs(600);
/// Budget of one release of instance clients. Not an option; Pub/Sub's `shutdown_timeout`
/// default.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// Default `row_key_delimiter`.
pub const DEFAULT_ROW_KEY_DELIMITER: &str = "#";
/// Default `column_family`.
pub const DEFAULT_COLUMN_FAMILY: &str = "cf";

/// `table`.
pub static TABLE: OptionSpec = OptionSpec {
    name: "table",
    group: OptionGroup::Mapping,
    kind: OptionKind::Text,
    default: DefaultValue::None,
    bound: Bound::None,
    cross_rule: "this, `LOCATION` or `table_column` is required; when both this and `LOCATION` are given they must name the same table; a short id needs `project` and `instance`",
    example: "projects/demo/instances/main/tables/events",
    description: "The table every row is written to: `projects/PROJECT/instances/INSTANCE/tables/TABLE`, or a short table id.",
    redact: Redact::None,
};

/// `instance`.
pub static INSTANCE: OptionSpec = OptionSpec {
    name: "instance",
    group: OptionGroup::Connection,
    kind: OptionKind::Text,
    default: DefaultValue::None,
    bound: Bound::None,
    cross_rule: "cannot be combined with `instance_column`; must agree with a full table name",
    example: "main",
    description: "Instance in which short table ids are resolved (a short id in `project`, or `projects/PROJECT/instances/INSTANCE`).",
    redact: Redact::None,
};

/// `table_column`.
pub static TABLE_COLUMN: OptionSpec = OptionSpec {
    name: "table_column",
    group: OptionGroup::Mapping,
    kind: OptionKind::Column,
    default: DefaultValue::None,
    bound: Bound::None,
    cross_rule: "cannot be combined with a fixed table (`table` or `LOCATION`)",
    example: "table_name",
    description: "A string column naming each row's table (full name, or short id in the row's instance).",
    redact: Redact::None,
};

/// `instance_column`.
pub static INSTANCE_COLUMN: OptionSpec = OptionSpec {
    name: "instance_column",
    group: OptionGroup::Mapping,
    kind: OptionKind::Column,
    default: DefaultValue::None,
    bound: Bound::None,
    cross_rule: "cannot be combined with `instance` or with a full table name",
    example: "instance_name",
    description: "A string column naming each row's instance (short id in `project`, or full name); short table ids are resolved in it.",
    redact: Redact::None,
};

/// `row_key`.
pub static ROW_KEY: OptionSpec = OptionSpec {
    name: "row_key",
    group: OptionGroup::Mapping,
    kind: OptionKind::ColumnList,
    default: DefaultValue::None,
    bound: Bound::None,
    cross_rule: "required; string, binary or integer columns",
    example: "user_id, ts",
    description: "The column, or comma-separated columns, that make the row key. Several are joined with `row_key_delimiter`. Key columns are not written as cells.",
    redact: Redact::None,
};

/// `row_key_delimiter`.
pub static ROW_KEY_DELIMITER: OptionSpec = OptionSpec {
    name: "row_key_delimiter",
    group: OptionGroup::Mapping,
    kind: OptionKind::Text,
    default: DefaultValue::Text(DEFAULT_ROW_KEY_DELIMITER),
    bound: Bound::None,
    cross_rule: "",
    example: "|",
    description: "Text placed between the parts of a multi-column row key (may be empty).",
    redact: Redact::None,
};

/// `column_family`.
pub static COLUMN_FAMILY: OptionSpec = OptionSpec {
    name: "column_family",
    group: OptionGroup::Mapping,
    kind: OptionKind::Text,
    default: DefaultValue::Text(DEFAULT_COLUMN_FAMILY),
    bound: Bound::NotEmpty,
    cross_rule: "",
    example: "d",
    description: "Column family of the cells written from top-level columns (the qualifier is the column name). A struct column is a family of its own, its fields the qualifiers.",
    redact: Redact::None,
};

/// `timestamp_column`.
pub static TIMESTAMP_COLUMN: OptionSpec = OptionSpec {
    name: "timestamp_column",
    group: OptionGroup::Mapping,
    kind: OptionKind::Column,
    default: DefaultValue::Unset("the writer's clock"),
    bound: Bound::None,
    cross_rule: "",
    example: "event_time",
    description: "A timestamp (or int64 microseconds) column giving every cell of the row its version; truncated to milliseconds, so a replay writes the same versions again.",
    redact: Redact::None,
};

/// `null_handling`.
pub static NULL_HANDLING: OptionSpec = OptionSpec {
    name: "null_handling",
    group: OptionGroup::Mapping,
    kind: OptionKind::Enum(&["ignore", "delete"]),
    default: DefaultValue::Text("ignore"),
    bound: Bound::None,
    cross_rule: "",
    example: "delete",
    description: "What a null cell value does: `ignore` writes nothing for it; `delete` deletes that cell's existing versions.",
    redact: Redact::None,
};

/// `auto_create_table`.
pub static AUTO_CREATE_TABLE: OptionSpec = OptionSpec {
    name: "auto_create_table",
    group: OptionGroup::Mapping,
    kind: OptionKind::Bool,
    default: DefaultValue::Bool(false),
    bound: Bound::None,
    cross_rule: "",
    example: "true",
    description: "When a write finds its table missing (NOT_FOUND), create it with the column families the mapping needs and write again under the `recovery_*` backoff. Nothing is created when the table is declared.",
    redact: Redact::None,
};

/// `app_profile_id`.
pub static APP_PROFILE_ID: OptionSpec = OptionSpec {
    name: "app_profile_id",
    group: OptionGroup::Connection,
    kind: OptionKind::Text,
    default: DefaultValue::Unset("the instance's default profile"),
    bound: Bound::None,
    cross_rule: "",
    example: "batch-writes",
    description: "Application profile the writes are routed by.",
    redact: Redact::None,
};

// ---- Changelogs and write modes (issue 34) ----

/// The `op_column` values that write the row (insert or update), Debezium's included.
pub const OP_WRITE_VALUES: &[&str] = &["insert", "upsert", "update", "c", "u", "r"];
/// The `op_column` values that delete the row, Debezium's included.
pub const OP_DELETE_VALUES: &[&str] = &["delete", "d"];

/// `op_column`.
pub static OP_COLUMN: OptionSpec = OptionSpec {
    name: "op_column",
    group: OptionGroup::Mapping,
    kind: OptionKind::Column,
    default: DefaultValue::Unset("every row is written"),
    bound: Bound::None,
    cross_rule: "a string column; only with `write_mode` `upsert` or `replace_row`",
    example: "op",
    description: "A string column saying what each row is, for a changelog: `insert`, `upsert`, `update` (and Debezium's `c`, `u`, `r`) write the row as `write_mode` says; `delete` (and Debezium's `d`) deletes the whole row (`DeleteFromRow`; only the key columns matter). Case is ignored; any other value, or a null, refuses the row (the failure policy). The column is not written as a cell.",
    redact: Redact::None,
};

/// `write_mode`.
pub static WRITE_MODE: OptionSpec = OptionSpec {
    name: "write_mode",
    group: OptionGroup::Mapping,
    kind: OptionKind::Enum(&[
        "upsert",
        "replace_row",
        "insert_if_absent",
        "increment",
        "add_to_cell",
    ]),
    default: DefaultValue::Text("upsert"),
    bound: Bound::None,
    cross_rule: "`insert_if_absent`, `increment` and `add_to_cell` cannot be combined with `op_column`; `increment` and `add_to_cell` need integer cell columns and cannot be combined with `null_handling = 'delete'`; `increment` cannot be combined with `timestamp_column`",
    example: "replace_row",
    description: "How a row is applied: `upsert` sets its cells (other cells of the row stay); `replace_row` deletes the row and sets its cells in one entry, so it ends with exactly them; `insert_if_absent` sets its cells only when the row does not exist (`CheckAndMutateRow`, one call per row); `increment` adds each integer cell's value to the stored 64-bit counter (`ReadModifyWriteRow`, one call per row, never retried); `add_to_cell` adds it to a cell of an aggregate (sum) family (`AddToCell` in `MutateRows`, batched, never retried; `auto_create_table` creates the families as sums of 64-bit integers). See docs/bigtable.md, \"Write modes and changelogs\", for what a replay does in each.",
    redact: Redact::None,
};

/// How each row is applied (`write_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WriteMode {
    /// Set the row's cells; other cells stay (the default).
    #[default]
    Upsert,
    /// Delete the row, then set its cells, in one `MutateRows` entry.
    ReplaceRow,
    /// Set the row's cells only when the row has no cell (`CheckAndMutateRow`).
    InsertIfAbsent,
    /// Add each cell's integer value to the stored counter (`ReadModifyWriteRow`).
    Increment,
    /// Add each cell's integer value to a cell of an aggregate family (`AddToCell`).
    AddToCell,
}

impl WriteMode {
    /// The option value naming this mode.
    pub fn name(self) -> &'static str {
        match self {
            WriteMode::Upsert => "upsert",
            WriteMode::ReplaceRow => "replace_row",
            WriteMode::InsertIfAbsent => "insert_if_absent",
            WriteMode::Increment => "increment",
            WriteMode::AddToCell => "add_to_cell",
        }
    }

    /// Whether a row adds to counters: such writes are not idempotent, so they are never
    /// retried.
    pub fn adds(self) -> bool {
        matches!(self, WriteMode::Increment | WriteMode::AddToCell)
    }

    /// The mode an option value names, if any.
    pub fn parse(text: &str) -> Option<Self> {
        [
            WriteMode::Upsert,
            WriteMode::ReplaceRow,
            WriteMode::InsertIfAbsent,
            WriteMode::Increment,
            WriteMode::AddToCell,
        ]
        .into_iter()
        .find(|m| m.name().eq_ignore_ascii_case(text.trim()))
    }
}

// ---- end of changelogs and write modes ----

/// Every option of the Bigtable connector, in the order the reference lists them: the shared
/// ones, the mapping, then the writer options in declaration order.
pub fn options() -> &'static [&'static OptionSpec] {
    static OPTIONS: LazyLock<Vec<&'static OptionSpec>> = LazyLock::new(|| {
        let own: &[&'static OptionSpec] = &[
            &TABLE,
            &INSTANCE,
            &TABLE_COLUMN,
            &INSTANCE_COLUMN,
            &ROW_KEY,
            &ROW_KEY_DELIMITER,
            &COLUMN_FAMILY,
            &TIMESTAMP_COLUMN,
            &NULL_HANDLING,
            &AUTO_CREATE_TABLE,
            &APP_PROFILE_ID,
            &OP_COLUMN,
            &WRITE_MODE,
        ];
        [
            &crate::options::common::SHARED_OPTIONS[..],
            own,
            BigtableWriterOptions::specs(),
            &super::lookup_options::SPECS[..],
        ]
        .concat()
    });
    &OPTIONS
}

/// The connector's fixed budgets, listed in the reference beside the options.
pub static FIXED_BUDGETS: &[FixedBudget] = &[
    FixedBudget {
        name: "batch delay threshold",
        value: DefaultValue::Duration(BATCH_DELAY_THRESHOLD),
        description: "How long the first entry of a batch waits for the batch to fill (the Java client's batcher default).",
    },
    FixedBudget {
        name: "progress timeout",
        value: DefaultValue::Duration(PROGRESS_TIMEOUT),
        description: "How long the writer waits with no MutateRows completing before the statement fails (Pub/Sub's `publish_progress_timeout` default). When it fires, the MutateRows calls still under way get up to the shutdown timeout to finish, so the statement returns up to that much later.",
    },
    FixedBudget {
        name: "shutdown timeout",
        value: DefaultValue::Duration(SHUTDOWN_TIMEOUT),
        description: "Budget of one release of instance clients, at eviction or at the end of a statement (Pub/Sub's `shutdown_timeout` default).",
    },
];

writer_options! {
    /// The Bigtable writer options: batching, in-flight bounds, the rejection breaker, recovery and
    /// the instance-client pool. Build with [`BigtableWriterOptions::builder`].
    pub struct BigtableWriterOptions / builder BigtableWriterOptionsBuilder {
        /// Entries per MutateRows request before it is sent.
        batch_element_count_threshold: i64 => BATCH_ELEMENT_COUNT_THRESHOLD {
            kind: OptionKind::Int,
            default: DefaultValue::Int(DEFAULT_BATCH_ELEMENT_COUNT_THRESHOLD),
            bound: Bound::IntRange {
                min: 1,
                max: MAX_BATCH_ELEMENT_COUNT_THRESHOLD,
            },
            cross_rule: "",
            example: "500",
            description: "Entries (one per row, however many cells it writes) gathered before a MutateRows request is sent. The ceiling is one under the 20,000 entries the client's flow control admits, which the batch threshold must stay below. (The service itself refuses a request of more than 100,000 mutations.)",
        };
        /// Mutation bytes per request before it is sent.
        batch_request_byte_threshold: i64 => BATCH_REQUEST_BYTE_THRESHOLD {
            kind: OptionKind::Int,
            default: DefaultValue::Bytes(DEFAULT_BATCH_REQUEST_BYTE_THRESHOLD),
            bound: Bound::IntRange {
                min: 1,
                max: MAX_BATCH_REQUEST_BYTE_THRESHOLD,
            },
            cross_rule: "",
            example: "4194304",
            description: "Bytes of mutations gathered before a request is sent; at most one byte under the 100 MiB the client's flow control admits.",
        };
        /// In-flight entry cap.
        max_in_flight_entries: i32 => MAX_IN_FLIGHT_ENTRIES {
            kind: OptionKind::Int,
            default: DefaultValue::Int(DEFAULT_MAX_IN_FLIGHT_ENTRIES as i64),
            bound: Bound::Positive,
            cross_rule: "above 20,000 the table is declared with a warning (the client's own flow-control budget)",
            example: "5000",
            description: "Entries the INSERT keeps unacknowledged. At its share of the cap a writer waits for completions before taking more input. The cap is per statement: an INSERT with N writers (`sink_parallelism`, by default one per input partition, also across a cluster's tasks) gives each writer 1/N of it, rounded up, at least 1.",
        };
        /// In-flight byte cap.
        max_in_flight_bytes: i64 => MAX_IN_FLIGHT_BYTES {
            kind: OptionKind::Int,
            default: DefaultValue::Bytes(DEFAULT_MAX_IN_FLIGHT_BYTES),
            bound: Bound::Positive,
            cross_rule: "above 100 MiB the table is declared with a warning (the client's own flow-control budget)",
            example: "33554432",
            description: "Serialized bytes of the entries the INSERT keeps unacknowledged: the bound that limits memory, since one entry may be megabytes. The cap is per statement: an INSERT with N writers (`sink_parallelism`, by default one per input partition, also across a cluster's tasks) gives each writer 1/N of it, rounded up, at least 1.",
        };
        /// Consecutive confirmed rejections that fail the statement; [`UNBOUNDED`] never does.
        max_consecutive_rejections: i32 => MAX_CONSECUTIVE_REJECTIONS;
        /// First backoff of the table auto-creation recovery.
        recovery_initial_backoff: Duration => RECOVERY_INITIAL_BACKOFF {
            kind: OptionKind::Duration,
            default: DefaultValue::Duration(DEFAULT_RECOVERY_INITIAL_BACKOFF),
            bound: Bound::AtLeastMillis,
            cross_rule: "",
            example: "1s",
            description: "First wait before writing again after `auto_create_table` created a missing table.",
        };
        /// Backoff cap of the table auto-creation recovery.
        recovery_max_backoff: Duration => RECOVERY_MAX_BACKOFF {
            kind: OptionKind::Duration,
            default: DefaultValue::Duration(DEFAULT_RECOVERY_MAX_BACKOFF),
            bound: Bound::AtLeastMillis,
            cross_rule: "at least `recovery_initial_backoff`",
            example: "30s",
            description: "Longest wait between attempts of the table auto-creation recovery.",
        };
        /// Attempts of the table auto-creation recovery.
        recovery_max_attempts: i32 => RECOVERY_MAX_ATTEMPTS {
            kind: OptionKind::Int,
            default: DefaultValue::Int(DEFAULT_RECOVERY_MAX_ATTEMPTS as i64),
            bound: Bound::Positive,
            cross_rule: "",
            example: "5",
            description: "Write attempts of the table auto-creation recovery; when they run out the statement fails.",
        };
        /// Idle time after which a table's batching state is dropped.
        destination_idle_timeout: Duration => DESTINATION_IDLE_TIMEOUT {
            kind: OptionKind::Duration,
            default: DefaultValue::Duration(DEFAULT_DESTINATION_IDLE_TIMEOUT),
            bound: Bound::PositiveNanos,
            cross_rule: "",
            example: "1h",
            description: "How long a table may go without writes before a successful flush drops its batching state; a later row rebuilds it. An instance's client closes with its last table. To never evict, give a very long duration (up to about 292 years).",
        };
        /// Open-or-closing instance client cap.
        max_active_instances: i32 => MAX_ACTIVE_INSTANCES {
            kind: OptionKind::Int,
            default: DefaultValue::Int(DEFAULT_MAX_ACTIVE_INSTANCES as i64),
            bound: Bound::Positive,
            cross_rule: "",
            example: "4",
            description: "Instance clients (open or closing) a writer holds. A new instance beyond the cap drains pending work and closes the least recently used client; a closing client keeps its slot until it has shut down.",
        };
        /// Whether per-table counters are registered.
        per_destination_metrics: bool => PER_DESTINATION_METRICS;
    }
    extra { warnings: Vec<String> = Vec::new() }
}

impl BigtableWriterOptions {
    /// The breaker bound for the core: `None` when unbounded ([`UNBOUNDED`]).
    pub fn rejection_limit(&self) -> Option<u64> {
        u64::try_from(self.max_consecutive_rejections).ok()
    }
    /// The warnings [`build`](BigtableWriterOptionsBuilder::build) logged: an in-flight bound
    /// above the client's own flow-control budget.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }
}

impl BigtableWriterOptionsBuilder {
    /// Checks every value and the cross-option rules; the error names the option and the rule.
    ///
    /// An in-flight bound above the client's own flow-control budget (20,000 entries, 100 MiB)
    /// is not refused — a sink spread over several instances draws on several such budgets — but
    /// logged as a warning and kept in [`BigtableWriterOptions::warnings`].
    pub fn build(self) -> Result<BigtableWriterOptions> {
        let mut o = self.checked()?;
        if o.recovery_max_backoff < o.recovery_initial_backoff {
            return Err(RECOVERY_MAX_BACKOFF.invalid(
                format_duration(o.recovery_max_backoff),
                format!(
                    "{} (which is {})",
                    RECOVERY_MAX_BACKOFF.cross_rule,
                    format_duration(o.recovery_initial_backoff)
                ),
            ));
        }
        if i64::from(o.max_in_flight_entries) > CLIENT_FLOW_CONTROL_MAX_ENTRIES {
            o.warnings.push(format!(
                "'{}' = {} is above the {} entries one Bigtable client admits in flight; with a single instance the \
                 client's flow control, not this bound, limits the writer",
                MAX_IN_FLIGHT_ENTRIES.name,
                group_digits(o.max_in_flight_entries.into()),
                group_digits(CLIENT_FLOW_CONTROL_MAX_ENTRIES)
            ));
        }
        if o.max_in_flight_bytes > CLIENT_FLOW_CONTROL_MAX_BYTES {
            o.warnings.push(format!(
                "'{}' = {} is above the {} one Bigtable client admits in flight; with a single instance the client's \
                 flow control, not this bound, limits the writer",
                MAX_IN_FLIGHT_BYTES.name,
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
    /// Column saying whether each row is written or deleted (a changelog's operation).
    pub op_column: Option<String>,
    /// How each row is applied.
    pub write_mode: WriteMode,
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
            op_column: None,
            write_mode: WriteMode::Upsert,
        }
    }

    /// The columns that are not written as cells: the key, the timestamp, the destinations and
    /// the operation.
    pub fn non_cell_columns(&self) -> Vec<&str> {
        let mut out: Vec<&str> = self.row_key.iter().map(String::as_str).collect();
        out.extend(
            [
                &self.timestamp_column,
                &self.table_column,
                &self.instance_column,
                &self.op_column,
            ]
            .into_iter()
            .filter_map(|c| c.as_deref()),
        );
        out
    }
}

/// Everything a Bigtable sink needs: connection, table, mapping, policy and writer options.
///
/// Built from a statement's `LOCATION` (the table; empty means none) and
/// options by [`TableOptions::from_raw`] (the emulator variable read from the process
/// environment) or [`TableOptions::from_raw_with_env`].
///
/// ```
/// use gcp_sql::connectors::shared::TableOptions;
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
#[derive(Debug, Clone, PartialEq)]
pub struct BigtableSinkOptions {
    /// The options every connector shares: connection, failure policy, dead letters, run.
    pub shared: SharedOptions,
    /// The fixed table (`projects/P/instances/I/tables/T`), if any.
    pub table: Option<String>,
    /// The row mapping.
    pub mapping: BigtableMappingOptions,
    /// Create a missing table (with the families the mapping needs) in the NOT_FOUND recovery.
    pub auto_create_table: bool,
    /// The application profile writes are routed by.
    pub app_profile_id: Option<String>,
    /// The writer options.
    pub writer: BigtableWriterOptions,
    /// The cache of lookup joins reading this table (`None`: off).
    pub lookup_cache: Option<super::lookup::CacheSettings>,
}

impl TableOptions for BigtableSinkOptions {
    const KIND: ConnectorKind = super::KIND;
    const DEAD_LETTER_TOPICS: &'static DeadLetterTopics =
        &crate::connectors::pubsub::dead_letter::TOPICS;

    fn shared(&self) -> &SharedOptions {
        &self.shared
    }

    /// Reads the LOCATION and the options of this connector (see [`TableOptions`]).
    fn from_parsed(
        location: Option<&str>,
        p: &ParsedOptions,
        shared: SharedOptions,
    ) -> Result<Self> {
        let project = shared.connection.project.as_deref();

        let instance_option = match p.non_empty_text(&INSTANCE)? {
            Some(i) => Some(
                names::bigtable_instance(i, project).map_err(|rule| INSTANCE.invalid(i, rule))?,
            ),
            None => None,
        };
        let table = destination(&TABLE, location, p, |t| {
            names::bigtable_table(t, instance_option.as_deref())
        })?;
        let table_instance = table
            .as_deref()
            .and_then(names::instance_of_table)
            .map(str::to_string);
        if let (Some(opt), Some(of_table)) = (&instance_option, &table_instance)
            && opt != of_table
        {
            return Err(INSTANCE.invalid(
                p.text_as_written(&INSTANCE).unwrap_or_default(),
                format!(
                    "the table '{}' belongs to instance '{of_table}'",
                    table.as_deref().unwrap_or_default()
                ),
            ));
        }

        let row_key = match p.list(&ROW_KEY)? {
            Some(cols) => cols.to_vec(),
            None => {
                return Err(Error::MissingOption {
                    option: ROW_KEY.name.into(),
                    rule: "a Bigtable sink needs the column (or comma-separated columns) that form the row key".into(),
                });
            }
        };
        let column_family = p
            .text(&COLUMN_FAMILY)?
            .unwrap_or(DEFAULT_COLUMN_FAMILY)
            .to_string();
        names::check_family_id(&column_family)
            .map_err(|rule| COLUMN_FAMILY.invalid(&column_family, rule))?;
        let null_handling = match p.text(&NULL_HANDLING)? {
            None | Some("ignore") => NullHandling::Ignore,
            Some("delete") => NullHandling::Delete,
            Some(other) => {
                return Err(NULL_HANDLING.invalid(other, "expected 'ignore' or 'delete'"));
            }
        };
        let mapping = BigtableMappingOptions {
            instance: table_instance.or(instance_option),
            table_column: p.text(&TABLE_COLUMN)?.map(str::to_string),
            instance_column: p.text(&INSTANCE_COLUMN)?.map(str::to_string),
            row_key,
            row_key_delimiter: p
                .text(&ROW_KEY_DELIMITER)?
                .unwrap_or(DEFAULT_ROW_KEY_DELIMITER)
                .to_string(),
            column_family,
            timestamp_column: p.text(&TIMESTAMP_COLUMN)?.map(str::to_string),
            null_handling,
            op_column: p.text(&OP_COLUMN)?.map(str::to_string),
            write_mode: match p.text(&WRITE_MODE)? {
                None => WriteMode::Upsert,
                Some(text) => WriteMode::parse(text).ok_or_else(|| {
                    WRITE_MODE.invalid(
                        text,
                        "expected 'upsert', 'replace_row', 'insert_if_absent', 'increment' or 'add_to_cell'",
                    )
                })?,
            },
        };

        let writer = BigtableWriterOptionsBuilder::from_parsed(p)?.build()?;

        let opts = BigtableSinkOptions {
            shared,
            table,
            mapping,
            auto_create_table: p.bool(&AUTO_CREATE_TABLE)?.unwrap_or(false),
            app_profile_id: p.non_empty_text(&APP_PROFILE_ID)?.map(str::to_string),
            writer,
            lookup_cache: super::lookup_options::from_parsed(p)?,
        };
        opts.validate()?;
        Ok(opts)
    }
}

impl BigtableSinkOptions {
    /// Checks the rules between sections: a table is required (fixed or from a column, not
    /// both), the instance is given once, and a short table id has an instance to live in.
    pub fn validate(&self) -> Result<()> {
        let m = &self.mapping;
        match (&self.table, &m.table_column) {
            (None, None) => {
                return Err(Error::MissingOption {
                    option: TABLE.name.into(),
                    rule: "a Bigtable sink needs a table: LOCATION 'projects/P/instances/I/tables/T', the 'table' \
                           option, or a per-row 'table_column'"
                        .into(),
                });
            }
            (Some(t), Some(c)) => {
                return Err(
                    TABLE_COLUMN.invalid(c, format!("{} (table '{t}')", TABLE_COLUMN.cross_rule))
                );
            }
            _ => {}
        }
        if let Some(c) = &m.instance_column {
            if let Some(t) = &self.table {
                return Err(INSTANCE_COLUMN.invalid(
                    c,
                    format!(
                        "{} (table '{t}' already names its instance)",
                        INSTANCE_COLUMN.cross_rule
                    ),
                ));
            }
            if let Some(i) = &m.instance {
                return Err(INSTANCE_COLUMN.invalid(
                    c,
                    format!("{} (instance '{i}')", INSTANCE_COLUMN.cross_rule),
                ));
            }
        }
        if m.row_key.is_empty() {
            return Err(Error::MissingOption {
                option: ROW_KEY.name.into(),
                rule: "at least one column".into(),
            });
        }
        self.validate_write_mode()
    }

    /// The rules between `write_mode` and the other mapping options; each error names both.
    fn validate_write_mode(&self) -> Result<()> {
        let m = &self.mapping;
        let mode = m.write_mode.name();
        if let Some(op) = &m.op_column
            && matches!(
                m.write_mode,
                WriteMode::InsertIfAbsent | WriteMode::Increment | WriteMode::AddToCell
            )
        {
            return Err(OP_COLUMN.invalid(
                op,
                format!(
                    "'{}' cannot be combined with '{}' = '{mode}': a changelog's updates and deletes \
                     are applied by 'upsert' or 'replace_row'",
                    OP_COLUMN.name, WRITE_MODE.name
                ),
            ));
        }
        if m.write_mode == WriteMode::Increment
            && let Some(ts) = &m.timestamp_column
        {
            return Err(TIMESTAMP_COLUMN.invalid(
                ts,
                format!(
                    "'{}' cannot be combined with '{}' = 'increment': the service gives an \
                     incremented cell its version",
                    TIMESTAMP_COLUMN.name, WRITE_MODE.name
                ),
            ));
        }
        if m.write_mode.adds() && m.null_handling == NullHandling::Delete {
            return Err(NULL_HANDLING.invalid(
                "delete",
                format!(
                    "'{}' = 'delete' cannot be combined with '{}' = '{mode}': a null adds \
                     nothing to a counter",
                    NULL_HANDLING.name, WRITE_MODE.name
                ),
            ));
        }
        Ok(())
    }

    /// Checks the table's columns against the mapping: key columns exist and are string, binary
    /// or integer; the timestamp column is a timestamp or int64; destination columns are
    /// strings; and at least one column is left to become a cell.
    pub fn validate_schema(&self, schema: &Schema) -> Result<()> {
        let m = &self.mapping;
        for c in &m.row_key {
            let dt = schema_types::column_type(schema, c, ROW_KEY.name)?;
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
            let dt = schema_types::column_type(schema, c, TIMESTAMP_COLUMN.name)?;
            if !matches!(dt, DataType::Timestamp(_, _) | DataType::Int64) {
                return Err(Error::schema(
                    c,
                    format!("'timestamp_column' needs a timestamp or int64 column, found {dt}"),
                ));
            }
        }
        for (option, col) in [
            (TABLE_COLUMN.name, &m.table_column),
            (INSTANCE_COLUMN.name, &m.instance_column),
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
        if let Some(c) = &m.op_column {
            let dt = schema_types::column_type(schema, c, OP_COLUMN.name)?;
            if !schema_types::is_string(dt) {
                return Err(Error::schema(
                    c,
                    format!("'{}' needs a string column, found {dt}", OP_COLUMN.name),
                ));
            }
        }
        let skip = m.non_cell_columns();
        if m.write_mode.adds() {
            check_increment_columns(schema, m.write_mode, &skip)?;
        }
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
                self.shared.connection.project.as_deref(),
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

/// Under `write_mode = 'increment'` or `'add_to_cell'` every cell column (and every field of a
/// struct column) must be an integer that fits a signed 64-bit counter.
fn check_increment_columns(schema: &Schema, mode: WriteMode, skip: &[&str]) -> Result<()> {
    let fits = |dt: &DataType| {
        matches!(
            dt,
            DataType::Int8
                | DataType::Int16
                | DataType::Int32
                | DataType::Int64
                | DataType::UInt8
                | DataType::UInt16
                | DataType::UInt32
        )
    };
    let refuse = |column: String, dt: &DataType| {
        Error::schema(
            column,
            format!(
                "'{}' = '{}' adds integers to 64-bit counters: every cell column must be an \
                 integer type up to BIGINT (UInt64 excluded), found {dt}",
                WRITE_MODE.name,
                mode.name()
            ),
        )
    };
    for field in schema.fields() {
        if skip.contains(&field.name().as_str()) {
            continue;
        }
        match field.data_type() {
            DataType::Struct(children) => {
                for child in children {
                    if !fits(child.data_type()) {
                        return Err(refuse(
                            format!("{}.{}", field.name(), child.name()),
                            child.data_type(),
                        ));
                    }
                }
            }
            dt if fits(dt) => {}
            dt => return Err(refuse(field.name().clone(), dt)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_defaults_equal_documented_defaults() {
        let built = BigtableWriterOptions::builder().build().unwrap();
        assert_eq!(built, BigtableWriterOptions::default());
        // The documented defaults (docs/options.md, ADRs 0024 and 0025), written out here rather
        // than read from the specs the builder starts from, so a changed spec default fails.
        let ms = Duration::from_millis;
        let s = Duration::from_secs;
        assert_eq!(built.batch_element_count_threshold(), 100);
        assert_eq!(built.batch_request_byte_threshold(), 20 << 20);
        assert_eq!(built.max_in_flight_entries(), 1_000);
        assert_eq!(built.max_in_flight_bytes(), 64 << 20);
        assert_eq!(built.max_consecutive_rejections(), 100);
        assert_eq!(built.recovery_initial_backoff(), ms(500));
        assert_eq!(built.recovery_max_backoff(), s(10));
        assert_eq!(built.recovery_max_attempts(), 10);
        assert_eq!(built.destination_idle_timeout(), s(600));
        assert_eq!(built.max_active_instances(), 16);
        assert!(!built.per_destination_metrics());
    }

    #[test]
    fn ceilings_are_one_under_client_flow_control() {
        assert_eq!(MAX_BATCH_ELEMENT_COUNT_THRESHOLD, 19_999);
        assert_eq!(MAX_BATCH_REQUEST_BYTE_THRESHOLD, 104_857_599);
    }
}
