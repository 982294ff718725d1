//! The Cloud Tasks sink: rows in, created tasks out, through the shared core.
//!
//! This file is glue, the [`Connector`] the generic [`Sink`] is built on: the options become a
//! [`FlowConfig`], the mapping encodes each batch, and the core admits, sends, retries and
//! resolves. How each writer option acts:
//!
//! | option | here |
//! |---|---|
//! | `max_in_flight_tasks` | the core's in-flight record cap (tasks being created plus those waiting out a backoff); the byte cap is off (`u64::MAX`), since a task is at most [`MAX_TASK_BYTES`](super::mapping::MAX_TASK_BYTES) and so the count bounds memory at `max_in_flight_tasks` × 100 KiB |
//! | `channel_pool_size` | gRPC channels to Google, used in turn ([`client`](super::client)); refused with an emulator |
//! | `recovery_initial_backoff`, `recovery_max_backoff`, `recovery_max_attempts` | the core's [`RetrySettings`] for `UNAVAILABLE`, `DEADLINE_EXCEEDED` and `RESOURCE_EXHAUSTED`: bounded by attempts only (total timeout zero, which gax reads as "attempts only"), attempts counting the first creation, the backoff doubling from the initial one up to the cap, slept as it is (no jitter) |
//! | `not_found_recovery_*` | the core's [`RecoverySettings`] for a missing queue, with `create = false`: the task is re-sent after a doubling backoff until the attempts (the first included) run out, then the statement fails naming `not_found_recovery_max_attempts` |
//! | `max_tasks_per_second` | the core's admission rate limit ([`RateLimiter`](crate::core::rate::RateLimiter)): one token per task, before it is admitted; a retry takes none |
//! | `per_destination_metrics` | per-queue `records_sent_by_destination` / `send_errors_by_destination` |
//!
//! Not options in the writer option contract, so fixed (see the constants in [`options`](super::options)): the progress
//! budget [`PROGRESS_TIMEOUT`], the release budget [`SHUTDOWN_TIMEOUT`], the open-queue cap
//! [`MAX_ACTIVE_QUEUES`] and the idle timeout [`DESTINATION_IDLE_TIMEOUT`]. The contract has no
//! consecutive-rejection breaker, so under `failure_policy = 'drop'` every confirmed rejection
//! is dropped and counted, however many there are. Each `CreateTask` carries one task, so the
//! batch size is 1 and a batch never waits.

use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;

use super::client::{CREATE_TASK_TIMEOUT, ClientSettings, CloudTasksTransport};
use super::mapping::{CloudTasksMapping, TaskRecord};
use super::options::{
    CloudTasksSinkOptions, CloudTasksWriterOptions, DESTINATION_IDLE_TIMEOUT, MAX_ACTIVE_QUEUES,
    PROGRESS_TIMEOUT, SHUTDOWN_TIMEOUT,
};
use crate::connectors::sink::{Connector, Sink};
use crate::core::run::WriterContext;
use crate::core::{BatchThresholds, Envelope, FlowConfig, RecoverySettings, RetrySettings};
use crate::error::Result;

/// Growth of the transient-failure backoff per retry. The option contract gives the first backoff and the
/// cap but not the growth; doubling is the usual exponential backoff (and what the other
/// recovery paths of this crate use).
pub const RECOVERY_BACKOFF_MULTIPLIER: f64 = 2.0;
/// Growth of the NOT_FOUND backoff per retry; doubling, as for the transient retry.
pub const NOT_FOUND_BACKOFF_MULTIPLIER: f64 = 2.0;
/// What the progress watchdog names in its error: the budget is not an option here.
pub const PROGRESS_BUDGET_NAME: &str =
    "the Cloud Tasks writer's fixed progress budget (not an option)";
/// What a release overrun names in its error: the budget is not an option here.
pub const SHUTDOWN_BUDGET_NAME: &str =
    "the Cloud Tasks writer's fixed shutdown budget (not an option)";

/// The Cloud Tasks connector as the generic [`Sink`] sees it: [`CloudTasksSinkOptions`] in, a
/// [`CloudTasksMapping`] and a [`CloudTasksTransport`] out.
#[derive(Debug, Clone, Copy, Default)]
pub struct CloudTasks;

/// A declared Cloud Tasks sink: its options, checked against the table schema.
///
/// Built with `try_new(schema, location, raw)` (SQL options) or `from_options(schema, options)`
/// (the Rust API, without SQL, which checks the schema against the mapping and contacts no
/// service). Its `write_all` creates one task per row and returns how many the service
/// acknowledged (a named task that already existed counts as delivered, and in
/// `records_deduplicated`).
///
/// ```
/// use gcp_sql::connectors::TableOptions;
/// use std::sync::Arc;
/// use datafusion::arrow::datatypes::{DataType, Field, Schema};
/// use gcp_sql::connectors::cloud_tasks::options::CloudTasksSinkOptions;
/// use gcp_sql::connectors::cloud_tasks::writer::CloudTasksSink;
/// use gcp_sql::options::RawOptions;
///
/// let raw = RawOptions::from_pairs([
///     ("queue".to_string(), "projects/demo/locations/us-central1/queues/jobs".to_string()),
///     ("url".to_string(), "https://worker.example.com/run".to_string()),
///     ("max_in_flight_tasks".to_string(), "200".to_string()),
/// ])?;
/// let options = CloudTasksSinkOptions::from_raw(None, &raw)?;
/// let schema = Arc::new(Schema::new(vec![Field::new("user_id", DataType::Int64, false)]));
/// let sink = CloudTasksSink::from_options(schema, options)?;
/// assert_eq!(sink.flow_config().max_in_flight_records, 200);
/// assert_eq!(sink.flow_config().batch.max_records, 1);
/// # Ok::<(), gcp_sql::Error>(())
/// ```
pub type CloudTasksSink = Sink<CloudTasks>;

impl Sink<CloudTasks> {
    /// Replaces the retry timing of `CreateTask` (by default [`retry_settings`] of the
    /// `recovery_*` options, with the [`CREATE_TASK_TIMEOUT`] attempt deadline), the attempt
    /// deadline included. For embedders and tests (a fault test needs deadlines of
    /// milliseconds); it is not a table option.
    pub fn with_retry(mut self, retry: RetrySettings) -> Self {
        self.flow_config_mut().retry = retry;
        self
    }
}

#[async_trait]
impl Connector for CloudTasks {
    type Options = CloudTasksSinkOptions;
    type Mapping = CloudTasksMapping;
    type ClientSettings = ClientSettings;
    type Transport = CloudTasksTransport;

    fn mapping(options: &CloudTasksSinkOptions, schema: &SchemaRef) -> Result<CloudTasksMapping> {
        options.validate()?;
        CloudTasksMapping::new(options, schema)
    }

    fn describe_record(record: &TaskRecord) -> crate::core::DeadPayload {
        describe_task(record)
    }

    fn flow_config(options: &CloudTasksSinkOptions, _mapping: &CloudTasksMapping) -> FlowConfig {
        flow_config(options)
    }

    fn client_settings(
        options: &CloudTasksSinkOptions,
        _mapping: &CloudTasksMapping,
    ) -> ClientSettings {
        let connection = &options.shared.connection;
        ClientSettings {
            endpoint: connection.endpoint.clone(),
            emulator_host: connection.emulator.as_ref().map(|e| e.host.clone()),
            credentials_file: connection.credentials_file.clone(),
            channel_pool_size: options
                .writer
                .channel_pool_size()
                .map(|n| usize::try_from(n).unwrap_or(1)),
        }
    }

    async fn connect(settings: &ClientSettings) -> Result<CloudTasksTransport> {
        CloudTasksTransport::connect(settings).await
    }

    /// An object-store `schema_location` is read here, through the session's object stores,
    /// and the body columns are checked against it.
    async fn prepare(
        _options: &CloudTasksSinkOptions,
        mapping: &CloudTasksMapping,
        schema: &SchemaRef,
        _transport: &CloudTasksTransport,
        ctx: &WriterContext,
    ) -> Result<Option<CloudTasksMapping>> {
        mapping.read_schema(schema, ctx.runtime.as_ref()).await
    }

    fn encode_batch(
        _options: &CloudTasksSinkOptions,
        mapping: &CloudTasksMapping,
        batch: &RecordBatch,
        first_row: u64,
        out: &mut Vec<Result<Envelope<TaskRecord>>>,
    ) -> Result<()> {
        mapping.encode_batch(batch, first_row, out)
    }
}

/// The contract's transient-failure retry as the core's retry settings.
pub fn retry_settings(writer: &CloudTasksWriterOptions) -> RetrySettings {
    RetrySettings {
        // Zero: bounded by attempts only (gax's reading, see `core::retry`).
        total_timeout: Duration::ZERO,
        max_attempts: u32::try_from(writer.recovery_max_attempts())
            .unwrap_or(1)
            .max(1),
        initial_retry_delay: writer.recovery_initial_backoff(),
        retry_delay_multiplier: RECOVERY_BACKOFF_MULTIPLIER,
        max_retry_delay: writer.recovery_max_backoff(),
        initial_rpc_timeout: CREATE_TASK_TIMEOUT,
        rpc_timeout_multiplier: 1.0,
        max_rpc_timeout: CREATE_TASK_TIMEOUT,
        // The contract sets "the backoff"; it is slept as it is.
        jitter: false,
    }
}

/// The contract's NOT_FOUND retry as the core's recovery settings (never creating the queue).
pub fn not_found_settings(writer: &CloudTasksWriterOptions) -> RecoverySettings {
    RecoverySettings::new(
        writer.not_found_recovery_initial_backoff(),
        writer.not_found_recovery_max_backoff(),
        NOT_FOUND_BACKOFF_MULTIPLIER,
        writer.not_found_recovery_max_attempts(),
        "not_found_recovery_max_attempts",
        false,
    )
}

/// Translates the sink options into the core's settings; see the module docs.
pub fn flow_config(options: &CloudTasksSinkOptions) -> FlowConfig {
    let w = &options.writer;
    let max_tasks = usize::try_from(w.max_in_flight_tasks()).unwrap_or(1).max(1);
    FlowConfig {
        max_in_flight_records: max_tasks,
        // Count only: each task is at most MAX_TASK_BYTES, so the count bounds the bytes.
        max_in_flight_bytes: u64::MAX,
        in_flight_option: "max_in_flight_tasks",
        progress_timeout: Some(PROGRESS_TIMEOUT),
        progress_option: PROGRESS_BUDGET_NAME,
        shutdown_timeout: SHUTDOWN_TIMEOUT,
        shutdown_option: SHUTDOWN_BUDGET_NAME,
        max_active_destinations: MAX_ACTIVE_QUEUES,
        destination_idle_timeout: DESTINATION_IDLE_TIMEOUT,
        per_destination_metrics: w.per_destination_metrics(),
        // The contract has no breaker: a dropping policy drops every confirmed rejection.
        max_consecutive_rejections: None,
        breaker_option: "failure_policy",
        batch: BatchThresholds {
            // CreateTask takes one task.
            max_records: 1,
            max_bytes: u64::MAX,
            max_delay: Duration::ZERO,
        },
        retry: retry_settings(w),
        retry_option: Some("recovery_max_attempts"),
        not_found: Some(not_found_settings(w)),
        failure_policy: options.shared.failure_policy,
        // Every send carries one task, so the task cap is the concurrency cap.
        max_concurrent_sends: max_tasks,
        max_records_per_second: w.max_tasks_per_second(),
    }
}

/// A refused Cloud Tasks task: its body is the payload; its name, URL, method and headers
/// the row (never its authorization).
fn describe_task(record: &TaskRecord) -> crate::core::DeadPayload {
    use gcloud_sdk::google::cloud::tasks::v2::task::MessageType;
    let Ok(task) = record.to_task() else {
        return crate::core::DeadPayload::default();
    };
    let mut row = serde_json::Map::new();
    if !task.name.is_empty() {
        row.insert("name".into(), serde_json::Value::String(task.name));
    }
    if let Some(t) = task.schedule_time {
        row.insert(
            "schedule_time_seconds".into(),
            serde_json::Value::from(t.seconds),
        );
    }
    let mut payload = None;
    if let Some(MessageType::HttpRequest(request)) = task.message_type {
        row.insert("url".into(), serde_json::Value::String(request.url));
        let method =
            gcloud_sdk::google::cloud::tasks::v2::HttpMethod::try_from(request.http_method)
                .map(|m| m.as_str_name().to_string())
                .unwrap_or_default();
        row.insert("http_method".into(), serde_json::Value::String(method));
        let mut headers: Vec<_> = request.headers.into_iter().collect();
        headers.sort();
        if !headers.is_empty() {
            row.insert(
                "headers".into(),
                serde_json::Value::Object(
                    headers
                        .into_iter()
                        .map(|(k, v)| (k, serde_json::Value::String(v)))
                        .collect(),
                ),
            );
        }
        payload = Some(request.body);
    }
    crate::core::DeadPayload {
        payload,
        row: Some(row),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::connectors::TableOptions;
    use crate::core::FailurePolicy;
    use crate::options::RawOptions;

    fn options(pairs: &[(&str, &str)]) -> CloudTasksSinkOptions {
        let mut all = vec![
            ("queue", "projects/demo/locations/us-central1/queues/jobs"),
            ("url", "https://w.example.com/"),
        ];
        all.extend_from_slice(pairs);
        let raw = RawOptions::from_pairs(all.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .unwrap();
        CloudTasksSinkOptions::from_raw_with_env(None, &raw, &|_| None).unwrap()
    }

    #[test]
    fn defaults_translate_to_the_documented_values() {
        let flow = flow_config(&options(&[]));
        assert_eq!(flow.max_in_flight_records, 1000);
        assert_eq!(flow.max_concurrent_sends, 1000);
        assert_eq!(flow.max_in_flight_bytes, u64::MAX);
        assert_eq!(flow.batch.max_records, 1);
        assert_eq!(flow.retry.total_timeout, Duration::ZERO);
        assert_eq!(flow.retry.max_attempts, 8);
        assert_eq!(flow.retry.initial_retry_delay, Duration::from_millis(100));
        assert_eq!(flow.retry.max_retry_delay, Duration::from_secs(10));
        assert!(!flow.retry.jitter);
        let nf = flow.not_found.expect("NOT_FOUND recovery");
        assert_eq!(nf.max_attempts, 3);
        assert_eq!(nf.backoff.initial, Duration::from_millis(500));
        assert_eq!(nf.backoff.max, Duration::from_secs(2));
        assert_eq!(nf.attempts_option, "not_found_recovery_max_attempts");
        assert!(!nf.create, "a missing queue is never created");
        assert_eq!(flow.max_consecutive_rejections, None);
        assert!(!flow.per_destination_metrics);
        assert_eq!(flow.failure_policy, FailurePolicy::Fail);
        assert_eq!(
            flow.max_records_per_second, None,
            "no rate limit by default"
        );
    }

    #[test]
    fn every_writer_option_reaches_the_core() {
        let flow = flow_config(&options(&[
            ("max_in_flight_tasks", "7"),
            ("recovery_initial_backoff", "3ms"),
            ("recovery_max_backoff", "40ms"),
            ("recovery_max_attempts", "2"),
            ("not_found_recovery_initial_backoff", "5ms"),
            ("not_found_recovery_max_backoff", "9ms"),
            ("not_found_recovery_max_attempts", "6"),
            ("per_destination_metrics", "true"),
            ("failure_policy", "drop"),
            ("max_tasks_per_second", "12.5"),
        ]));
        assert_eq!(flow.max_in_flight_records, 7);
        assert_eq!(flow.max_records_per_second, Some(12.5));
        assert_eq!(flow.retry.max_attempts, 2);
        assert_eq!(flow.retry.initial_retry_delay, Duration::from_millis(3));
        assert_eq!(flow.retry.max_retry_delay, Duration::from_millis(40));
        let nf = flow.not_found.unwrap();
        assert_eq!(nf.max_attempts, 6);
        assert_eq!(nf.backoff.initial, Duration::from_millis(5));
        assert_eq!(nf.backoff.max, Duration::from_millis(9));
        assert!(flow.per_destination_metrics);
        assert_eq!(flow.failure_policy, FailurePolicy::Drop);
    }

    #[test]
    fn transient_backoff_doubles_up_to_the_cap_and_stops_at_the_attempt_budget() {
        let settings = retry_settings(
            &CloudTasksWriterOptions::builder()
                .recovery_initial_backoff(Duration::from_millis(100))
                .recovery_max_backoff(Duration::from_millis(300))
                .recovery_max_attempts(4)
                .build()
                .unwrap(),
        );
        let now = tokio::time::Instant::now();
        let mut state = settings.start(now);
        let mut delays = Vec::new();
        loop {
            assert_eq!(state.begin_attempt(now), Some(CREATE_TASK_TIMEOUT));
            match state.next_delay(now) {
                Some(d) => delays.push(d),
                None => break,
            }
        }
        // Four attempts, the first included: three backoffs.
        assert_eq!(state.attempts(), 4);
        assert_eq!(
            delays,
            [
                Duration::from_millis(100),
                Duration::from_millis(200),
                Duration::from_millis(300)
            ]
        );
    }

    #[test]
    fn one_attempt_means_no_transient_retry() {
        let settings = retry_settings(
            &CloudTasksWriterOptions::builder()
                .recovery_max_attempts(1)
                .build()
                .unwrap(),
        );
        let now = tokio::time::Instant::now();
        let mut state = settings.start(now);
        state.begin_attempt(now);
        assert_eq!(state.next_delay(now), None);
    }

    #[test]
    fn the_transient_budget_is_named_by_recovery_max_attempts() {
        let config = flow_config(&options(&[("recovery_max_attempts", "3")]));
        assert_eq!(config.retry_option, Some("recovery_max_attempts"));
        assert_eq!(config.retry.max_attempts, 3);
    }

    #[test]
    fn channel_pool_size_reaches_the_client_settings() {
        let schema = Arc::new(datafusion::arrow::datatypes::Schema::new(vec![
            datafusion::arrow::datatypes::Field::new(
                "id",
                datafusion::arrow::datatypes::DataType::Int64,
                true,
            ),
        ]));
        let sink =
            CloudTasksSink::from_options(schema, options(&[("channel_pool_size", "4")])).unwrap();
        let settings = sink.client_settings();
        assert_eq!(settings.channel_pool_size, Some(4));
        assert_eq!(settings.emulator_host, None);
    }
}
