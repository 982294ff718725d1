//! The Bigtable sink: rows in, applied row mutations out, through the shared core.
//!
//! This file is glue, the [`Connector`] the generic [`Sink`] is built on: the options become a
//! [`FlowConfig`], the mapping encodes each batch into `MutateRows` entries, and the core
//! admits, batches, sends, retries and resolves.
//!
//! # Settings that are not options
//!
//! The writer option contract (the Java connector's `BigtableWriterOptions` builder) has no retry, delay, progress or shutdown options;
//! these are constants:
//!
//! | setting | value | from |
//! |---|---|---|
//! | batch delay | [`BATCH_DELAY_THRESHOLD`] (1 s) | the Java client's batcher default |
//! | `MutateRows` retry | [`mutate_rows_retry`]: 10 ms first delay, ×2, at most 60 s, 60 s attempt deadline, 10 min in total, jittered; a spent budget is named [`RETRY_BUDGET_NAME`] in the error | the Bigtable client defaults for idempotent calls |
//! | progress budget | [`PROGRESS_TIMEOUT`] (10 min) | Pub/Sub's `publish_progress_timeout` default; [`BigtableSink::with_progress_timeout`] changes it |
//! | shutdown budget | [`SHUTDOWN_TIMEOUT`] (30 s) | Pub/Sub's `shutdown_timeout` default; [`BigtableSink::with_shutdown_timeout`] changes it |
//! | open tables | [`MAX_OPEN_TABLES`] | ADR 0020: the core's pool is per table; the instance cap lives in the transport |

use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;

use super::client::{BigtableTransport, ClientSettings};
use super::mapping::{self, BigtableEntry, BigtableMapping};
use super::options::{
    BATCH_DELAY_THRESHOLD, BigtableSinkOptions, PROGRESS_TIMEOUT, SHUTDOWN_TIMEOUT,
};
use crate::connectors::Routing;
use crate::connectors::sink::{Connector, Sink};
use crate::core::{BatchThresholds, Envelope, FlowConfig, RecoverySettings, RetrySettings};
use crate::error::Result;

/// Tables one writer keeps batching state for at once. The Java connector bounds per-table state only by
/// `destination_idle_timeout`, which is swept after a flush; a statement flushes once, at its
/// end, so this cap keeps a statement spread over very many tables (date-suffixed ones) bounded.
/// At the cap the least recently used table with nothing pending is released. Our number:
/// far above the tables a statement usually writes, far below what its state would weigh.
pub const MAX_OPEN_TABLES: usize = 1_000;

/// The name reported when the progress budget runs out (it is not a table option).
pub const PROGRESS_BUDGET_NAME: &str =
    "bigtable progress budget (BigtableSink::with_progress_timeout)";
/// The name reported when a release overruns its budget (it is not a table option).
pub const SHUTDOWN_BUDGET_NAME: &str =
    "bigtable shutdown budget (BigtableSink::with_shutdown_timeout)";

/// The name reported when the `MutateRows` retry budget runs out (it is not a table option):
/// [`mutate_rows_retry`]'s 10 minutes, or what [`BigtableSink::with_retry`] set.
pub const RETRY_BUDGET_NAME: &str =
    "bigtable MutateRows retry budget (10 min; BigtableSink::with_retry)";

/// Most entry bytes one batch may carry: one byte under the 100 MiB the client's flow control
/// admits (the `batch_request_byte_threshold` ceiling), less what the request adds around them
/// (table name, profile and per-entry framing are small next to it, so a 64 KiB margin is ample).
const BATCH_BYTE_CEILING: u64 = super::options::MAX_BATCH_REQUEST_BYTE_THRESHOLD as u64 - 64 * 1024;

/// Retry timing of `MutateRows`: the Bigtable client defaults for idempotent calls (first delay
/// 10 ms, multiplier 2, at most 60 s; a 60 s attempt deadline; 10 minutes in total), with the
/// delay jittered. Entries are idempotent here because every cell has an explicit timestamp.
pub fn mutate_rows_retry() -> RetrySettings {
    RetrySettings {
        total_timeout: Duration::from_secs(600),
        max_attempts: 0,
        initial_retry_delay: Duration::from_millis(10),
        retry_delay_multiplier: 2.0,
        max_retry_delay: Duration::from_secs(60),
        initial_rpc_timeout: Duration::from_secs(60),
        rpc_timeout_multiplier: 1.0,
        max_rpc_timeout: Duration::from_secs(60),
        jitter: true,
    }
}

/// The Bigtable connector as the generic [`Sink`] sees it: [`BigtableSinkOptions`] in, a
/// [`BigtableMapping`] and a [`BigtableTransport`] out.
#[derive(Debug, Clone, Copy, Default)]
pub struct Bigtable;

/// A declared Bigtable sink: its options, checked against the table schema.
///
/// Built with `try_new(schema, location, raw)` (SQL options) or `from_options(schema, options)`
/// (the Rust API, without SQL):
///
/// ```
/// use gcp_sql::connectors::TableOptions;
/// use std::sync::Arc;
/// use datafusion::arrow::datatypes::{DataType, Field, Schema};
/// use gcp_sql::connectors::bigtable::options::BigtableSinkOptions;
/// use gcp_sql::connectors::bigtable::writer::BigtableSink;
/// use gcp_sql::options::RawOptions;
///
/// let raw = RawOptions::from_pairs([
///     ("table".to_string(), "projects/demo/instances/main/tables/users".to_string()),
///     ("row_key".to_string(), "id".to_string()),
///     ("batch_element_count_threshold".to_string(), "500".to_string()),
/// ]).unwrap();
/// let options = BigtableSinkOptions::from_raw(None, &raw).unwrap();
/// let schema = Arc::new(Schema::new(vec![
///     Field::new("id", DataType::Utf8, false),
///     Field::new("name", DataType::Utf8, true),
/// ]));
/// let sink = BigtableSink::from_options(schema, options).unwrap();
/// assert_eq!(sink.flow_config().batch.max_records, 500);
/// assert_eq!(sink.flow_config().max_in_flight_records, 1000);
/// ```
pub type BigtableSink = Sink<Bigtable>;

impl Sink<Bigtable> {
    /// Replaces the progress budget (default [`PROGRESS_TIMEOUT`]): how long the writer waits
    /// with no send completing before it fails the statement. For embedders and tests; it is not
    /// a table option.
    pub fn with_progress_timeout(mut self, budget: Duration) -> Self {
        self.flow_config_mut().progress_timeout = Some(budget);
        self
    }

    /// Replaces the shutdown budget (default [`SHUTDOWN_TIMEOUT`]) of each release of clients.
    /// For embedders and tests; it is not a table option.
    pub fn with_shutdown_timeout(mut self, budget: Duration) -> Self {
        self.flow_config_mut().shutdown_timeout = budget;
        self
    }

    /// Replaces the retry timing of `MutateRows` (default [`mutate_rows_retry`]): attempt
    /// deadlines, delays and the total budget. For embedders and tests (a fault test needs
    /// deadlines of milliseconds); it is not a table option.
    pub fn with_retry(mut self, retry: RetrySettings) -> Self {
        self.flow_config_mut().retry = retry;
        self
    }
}

#[async_trait]
impl Connector for Bigtable {
    type Options = BigtableSinkOptions;
    type Mapping = BigtableMapping;
    type ClientSettings = ClientSettings;
    type Transport = BigtableTransport;

    fn mapping(options: &BigtableSinkOptions, schema: &SchemaRef) -> Result<BigtableMapping> {
        BigtableMapping::new(options, schema)
    }

    /// Each row (per table) has one writer, which keeps the input's order: the last row of a
    /// key in input order is the last one written.
    fn routing(_options: &BigtableSinkOptions, mapping: &BigtableMapping) -> Routing {
        Routing::by_key(mapping.row_identity_columns())
    }

    fn describe_record(record: &BigtableEntry) -> crate::core::DeadPayload {
        describe_bigtable(record)
    }

    fn flow_config(options: &BigtableSinkOptions, mapping: &BigtableMapping) -> FlowConfig {
        flow_config(options, mapping)
    }

    fn client_settings(options: &BigtableSinkOptions, mapping: &BigtableMapping) -> ClientSettings {
        let connection = &options.shared.connection;
        ClientSettings {
            endpoint: connection.endpoint.clone(),
            emulator_host: connection.emulator.as_ref().map(|e| e.host.clone()),
            credentials_file: connection.credentials_file.clone(),
            app_profile_id: options.app_profile_id.clone(),
            auto_create_table: options.auto_create_table,
            families: mapping.families().to_vec(),
            max_active_instances: usize::try_from(options.writer.max_active_instances())
                .unwrap_or(1)
                .max(1),
            write_mode: options.mapping.write_mode,
        }
    }

    /// A Bigtable table is read back by a scan (`scan::BigtableScanTable`), and deleted from
    /// and updated by row key (`dml::BigtableTable`).
    fn reader(
        options: &BigtableSinkOptions,
        mapping: &BigtableMapping,
        schema: &SchemaRef,
    ) -> Option<std::sync::Arc<dyn datafusion::catalog::TableProvider>> {
        Some(std::sync::Arc::new(super::dml::BigtableTable::new(
            options.clone(),
            schema.clone(),
            Self::client_settings(options, mapping),
        )))
    }

    async fn connect(settings: &ClientSettings) -> Result<BigtableTransport> {
        BigtableTransport::connect(settings).await
    }

    fn encode_batch(
        _options: &BigtableSinkOptions,
        mapping: &BigtableMapping,
        batch: &RecordBatch,
        first_row: u64,
        out: &mut Vec<Result<Envelope<BigtableEntry>>>,
    ) -> Result<()> {
        mapping.encode_batch(batch, first_row, out)
    }
}

/// Translates the writer options into the core's settings.
fn flow_config(options: &BigtableSinkOptions, mapping: &BigtableMapping) -> FlowConfig {
    let w = &options.writer;
    let max_records = usize::try_from(w.max_in_flight_entries())
        .unwrap_or(1)
        .max(1);
    // The service refuses a request of more than 100,000 mutations: with every entry carrying
    // at most `max_mutations_per_entry`, this many entries always fit.
    let mutation_guard =
        (mapping::MAX_MUTATIONS_PER_REQUEST / mapping.max_mutations_per_entry()).max(1);
    FlowConfig {
        max_in_flight_records: max_records,
        max_in_flight_bytes: u64::try_from(w.max_in_flight_bytes())
            .unwrap_or(u64::MAX)
            .max(1),
        in_flight_option: "max_in_flight_entries",
        progress_timeout: Some(PROGRESS_TIMEOUT),
        progress_option: PROGRESS_BUDGET_NAME,
        shutdown_timeout: SHUTDOWN_TIMEOUT,
        shutdown_option: SHUTDOWN_BUDGET_NAME,
        max_active_destinations: MAX_OPEN_TABLES,
        destination_idle_timeout: w.destination_idle_timeout(),
        per_destination_metrics: w.per_destination_metrics(),
        max_consecutive_rejections: w.rejection_limit(),
        breaker_option: "max_consecutive_rejections",
        batch: BatchThresholds {
            max_records: usize::try_from(w.batch_element_count_threshold())
                .unwrap_or(usize::MAX)
                .clamp(1, mutation_guard),
            max_bytes: u64::try_from(w.batch_request_byte_threshold())
                .unwrap_or(u64::MAX)
                .clamp(1, BATCH_BYTE_CEILING),
            max_delay: BATCH_DELAY_THRESHOLD,
        },
        retry: mutate_rows_retry(),
        retry_option: Some(RETRY_BUDGET_NAME),
        not_found: options.auto_create_table.then(|| {
            RecoverySettings::new(
                w.recovery_initial_backoff(),
                w.recovery_max_backoff(),
                2.0,
                w.recovery_max_attempts(),
                "recovery_max_attempts",
                true,
            )
        }),
        failure_policy: options.shared.failure_policy,
        // Every send carries at least one entry, so the entry cap already bounds this.
        max_concurrent_sends: max_records,
        max_records_per_second: None,
    }
}

/// A refused Bigtable entry: no payload; the row key and its mutations (cells set, cells and
/// families deleted) as the row.
fn describe_bigtable(record: &BigtableEntry) -> crate::core::DeadPayload {
    use gcloud_sdk::google::bigtable::v2::mutation::Mutation as M;

    use crate::connectors::dead_letter::bytes_value;
    if record.kind() == mapping::EntryKind::Increment {
        let Ok(increment) = record.to_increment() else {
            return crate::core::DeadPayload::default();
        };
        let mut row = serde_json::Map::new();
        row.insert("row_key".into(), bytes_value(&increment.row_key));
        let rules = increment
            .rules
            .into_iter()
            .map(|r| {
                use gcloud_sdk::google::bigtable::v2::read_modify_write_rule::Rule;
                let amount = match r.rule {
                    Some(Rule::IncrementAmount(n)) => n,
                    _ => 0,
                };
                serde_json::json!({"increment": {
                    "family": r.family_name,
                    "qualifier": bytes_value(&r.column_qualifier),
                    "amount": amount,
                }})
            })
            .collect();
        row.insert("mutations".into(), serde_json::Value::Array(rules));
        return crate::core::DeadPayload {
            payload: None,
            row: Some(row),
        };
    }
    let Ok(entry) = record.to_entry() else {
        return crate::core::DeadPayload::default();
    };
    let mut row = serde_json::Map::new();
    row.insert("row_key".into(), bytes_value(&entry.row_key));
    let mutations = entry
        .mutations
        .into_iter()
        .filter_map(|m| m.mutation)
        .map(|m| {
            let mut out = serde_json::Map::new();
            // The family and qualifier fields of a mutation of one cell.
            let cell = |family: String, qualifier: &[u8]| {
                vec![
                    ("family", serde_json::Value::String(family)),
                    ("qualifier", bytes_value(qualifier)),
                ]
            };
            let (kind, fields): (&str, Vec<(&str, serde_json::Value)>) = match m {
                M::SetCell(c) => {
                    let mut fields = cell(c.family_name, &c.column_qualifier);
                    fields.push((
                        "timestamp_micros",
                        serde_json::Value::from(c.timestamp_micros),
                    ));
                    fields.push(("value", bytes_value(&c.value)));
                    ("set_cell", fields)
                }
                M::DeleteFromColumn(c) => (
                    "delete_from_column",
                    cell(c.family_name, &c.column_qualifier),
                ),
                M::DeleteFromFamily(f) => (
                    "delete_from_family",
                    vec![("family", serde_json::Value::String(f.family_name))],
                ),
                M::DeleteFromRow(_) => ("delete_from_row", vec![]),
                _ => ("other", vec![]),
            };
            out.insert(
                kind.into(),
                serde_json::Value::Object(
                    fields
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), v))
                        .collect(),
                ),
            );
            serde_json::Value::Object(out)
        })
        .collect();
    row.insert("mutations".into(), serde_json::Value::Array(mutations));
    crate::core::DeadPayload {
        payload: None,
        row: Some(row),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;
    use crate::core::FailurePolicy;
    use crate::options::RawOptions;
    use crate::test_util::struct_field;

    fn sink(schema: Schema, pairs: &[(&str, &str)]) -> Result<BigtableSink> {
        let raw =
            RawOptions::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))?;
        BigtableSink::try_new(Arc::new(schema), None, &raw)
    }

    fn simple() -> Schema {
        Schema::new(vec![
            Field::new("id", DataType::Utf8, false),
            Field::new("v", DataType::Int64, true),
        ])
    }

    const TABLE: (&str, &str) = ("table", "projects/p/instances/i/tables/t");

    #[test]
    fn defaults_follow_the_option_contract_and_the_client() {
        let s = sink(simple(), &[TABLE, ("row_key", "id")]).unwrap();
        let f = s.flow_config();
        assert_eq!(f.batch.max_records, 100);
        assert_eq!(f.batch.max_bytes, 20 << 20);
        assert_eq!(f.batch.max_delay, Duration::from_secs(1));
        assert_eq!(f.max_in_flight_records, 1000);
        assert_eq!(f.max_in_flight_bytes, 64 << 20);
        assert_eq!(f.max_consecutive_rejections, Some(100));
        assert!(
            f.not_found.is_none(),
            "no recovery without auto_create_table"
        );
        assert_eq!(f.failure_policy, FailurePolicy::Fail);
        assert_eq!(s.client_settings().max_active_instances, 16);
        assert_eq!(s.client_settings().families, vec!["cf".to_string()]);
    }

    #[test]
    fn options_reach_the_core_settings() {
        let s = sink(
            simple(),
            &[
                TABLE,
                ("row_key", "id"),
                ("batch_element_count_threshold", "19999"),
                ("batch_request_byte_threshold", "1000"),
                ("max_in_flight_entries", "7"),
                ("max_in_flight_bytes", "4096"),
                ("max_consecutive_rejections", "-1"),
                ("auto_create_table", "true"),
                ("recovery_initial_backoff", "5ms"),
                ("recovery_max_backoff", "50ms"),
                ("recovery_max_attempts", "4"),
                ("destination_idle_timeout", "2s"),
                ("per_destination_metrics", "true"),
                ("max_active_instances", "3"),
                ("failure_policy", "drop"),
            ],
        )
        .unwrap();
        let f = s.flow_config();
        assert_eq!(f.batch.max_records, 19_999);
        assert_eq!(f.batch.max_bytes, 1000);
        assert_eq!(f.max_in_flight_records, 7);
        assert_eq!(f.max_in_flight_bytes, 4096);
        assert_eq!(f.max_consecutive_rejections, None);
        let recovery = f.not_found.as_ref().unwrap();
        assert_eq!(recovery.backoff.initial, Duration::from_millis(5));
        assert_eq!(recovery.backoff.max, Duration::from_millis(50));
        assert_eq!(recovery.max_attempts, 4);
        assert_eq!(recovery.attempts_option, "recovery_max_attempts");
        assert_eq!(f.destination_idle_timeout, Duration::from_secs(2));
        assert!(f.per_destination_metrics);
        assert_eq!(f.failure_policy, FailurePolicy::Drop);
        assert_eq!(s.client_settings().max_active_instances, 3);
        assert!(s.client_settings().auto_create_table);
    }

    #[test]
    fn wide_rows_shrink_the_batch_under_the_mutation_guard() {
        let mut fields = vec![Field::new("id", DataType::Utf8, false)];
        fields.extend((0..40).map(|i| Field::new(format!("c{i}"), DataType::Int64, true)));
        let s = sink(
            Schema::new(fields),
            &[
                TABLE,
                ("row_key", "id"),
                ("batch_element_count_threshold", "19999"),
            ],
        )
        .unwrap();
        // 40 mutations per entry: 100,000 / 40 entries fit in one request.
        assert_eq!(s.flow_config().batch.max_records, 2_500);
    }

    #[test]
    fn struct_columns_add_their_families() {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Utf8, false),
            Field::new("v", DataType::Int64, true),
            struct_field("stats", vec![Field::new("n", DataType::Int32, true)]),
        ]);
        let s = sink(schema, &[TABLE, ("row_key", "id"), ("column_family", "d")]).unwrap();
        assert_eq!(
            s.client_settings().families,
            vec!["d".to_string(), "stats".to_string()]
        );
    }

    #[test]
    fn budgets_can_be_replaced_through_the_rust_api() {
        let s = sink(simple(), &[TABLE, ("row_key", "id")])
            .unwrap()
            .with_progress_timeout(Duration::from_millis(200))
            .with_shutdown_timeout(Duration::from_secs(1));
        assert_eq!(
            s.flow_config().progress_timeout,
            Some(Duration::from_millis(200))
        );
        assert_eq!(s.flow_config().shutdown_timeout, Duration::from_secs(1));
        assert_eq!(s.flow_config().progress_option, PROGRESS_BUDGET_NAME);
    }
}
