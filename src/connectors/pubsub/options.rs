//! Options of the Pub/Sub connector.
//!
//! [`PubSubPublisherOptions`] holds the writer options of the seed
//! (`PubSubPublisherOptions.Builder`), one builder method per seed method. [`PubSubSinkOptions`]
//! adds the connection, the destination and the row mapping, and is what both SQL forms build
//! through [`PubSubSinkOptions::from_raw`].
//!
//! ```
//! use std::time::Duration;
//! use gcp_sql::connectors::pubsub::options::PubSubPublisherOptions;
//!
//! let opts = PubSubPublisherOptions::builder()
//!     .batch_element_count_threshold(500)
//!     .retry_total_timeout(Duration::from_secs(120))
//!     .max_in_flight_bytes(128 << 20)
//!     .build()?;
//! assert_eq!(opts.max_in_flight_messages(), 1000);
//!
//! // A positive sub-millisecond retry setting would silently become zero: refused.
//! let err = PubSubPublisherOptions::builder()
//!     .retry_initial_delay(Duration::from_micros(500))
//!     .build()
//!     .unwrap_err();
//! assert!(err.to_string().contains("retry_initial_delay"));
//! # Ok::<(), gcp_sql::Error>(())
//! ```

use std::time::Duration;

use crate::core::FailurePolicy;
use crate::error::{Error, Result};
use crate::options::registry::{common, pubsub as spec};
use crate::options::{
    ColumnRef, ConnectionOptions, ConnectorKind, EnvLookup, ParsedOptions, PayloadFormat,
    RawOptions, location_text, merge_location, names,
};

/// `max_consecutive_rejections` value that never fails the statement.
pub const UNBOUNDED: i32 = -1;

/// Default of `max_in_flight_messages` (seed).
pub const DEFAULT_MAX_IN_FLIGHT_MESSAGES: i32 = 1000;
/// Default of `max_in_flight_bytes`: 64 MiB (seed).
pub const DEFAULT_MAX_IN_FLIGHT_BYTES: i64 = 64 << 20;
/// `max_in_flight_bytes` value that bounds by message count only (seed: `Long.MAX_VALUE`).
pub const COUNT_ONLY: i64 = i64::MAX;
/// Default of `recovery_initial_backoff` (seed).
pub const DEFAULT_RECOVERY_INITIAL_BACKOFF: Duration = Duration::from_millis(500);
/// Default of `recovery_max_backoff` (seed).
pub const DEFAULT_RECOVERY_MAX_BACKOFF: Duration = Duration::from_secs(10);
/// Default of `recovery_max_attempts` (seed).
pub const DEFAULT_RECOVERY_MAX_ATTEMPTS: i32 = 10;
/// Default of `publish_progress_timeout` (seed).
pub const DEFAULT_PUBLISH_PROGRESS_TIMEOUT: Duration = Duration::from_secs(600);
/// Default of `shutdown_timeout` (seed).
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of `max_active_publishers` (seed).
pub const DEFAULT_MAX_ACTIVE_PUBLISHERS: i32 = 100;
/// Default of `destination_idle_timeout`. The seed leaves the value open; ten minutes keeps a
/// topic written every few minutes warm while releasing a date-suffixed topic soon after its day.
pub const DEFAULT_DESTINATION_IDLE_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// Default of `max_consecutive_rejections` (seed).
pub const DEFAULT_MAX_CONSECUTIVE_REJECTIONS: i32 = 100;

/// Java publisher default batch size in messages (GCP_FACTS: Java publisher defaults).
pub const SDK_BATCH_ELEMENT_COUNT_THRESHOLD: i64 = 100;
/// Java publisher default batch size in bytes (GCP_FACTS: Java publisher defaults).
pub const SDK_BATCH_REQUEST_BYTE_THRESHOLD: i64 = 1000;
/// Java publisher default batch delay (GCP_FACTS: Java publisher defaults).
pub const SDK_BATCH_DELAY_THRESHOLD: Duration = Duration::from_millis(1);
/// Java publisher default total retry timeout (GCP_FACTS: Java publisher defaults).
pub const SDK_RETRY_TOTAL_TIMEOUT: Duration = Duration::from_secs(600);
/// Java publisher default initial retry delay (GCP_FACTS: Java publisher defaults).
pub const SDK_RETRY_INITIAL_DELAY: Duration = Duration::from_millis(100);
/// Java publisher default retry delay multiplier (GCP_FACTS: Java publisher defaults).
pub const SDK_RETRY_DELAY_MULTIPLIER: f64 = 4.0;
/// Java publisher default maximum retry delay (GCP_FACTS: Java publisher defaults).
pub const SDK_RETRY_MAX_DELAY: Duration = Duration::from_secs(60);
/// Java publisher default first RPC timeout (GCP_FACTS: Java publisher defaults).
pub const SDK_RETRY_INITIAL_RPC_TIMEOUT: Duration = Duration::from_secs(5);
/// Java publisher default RPC timeout multiplier (GCP_FACTS: Java publisher defaults).
pub const SDK_RETRY_RPC_TIMEOUT_MULTIPLIER: f64 = 4.0;
/// Java publisher default maximum RPC timeout (GCP_FACTS: Java publisher defaults).
pub const SDK_RETRY_MAX_RPC_TIMEOUT: Duration = Duration::from_secs(60);
/// gax default attempt limit: 0, retries bounded by the total timeout only (GCP_FACTS).
pub const SDK_RETRY_MAX_ATTEMPTS: i64 = 0;

/// Default `data_column` name.
pub const DEFAULT_DATA_COLUMN: &str = "data";
/// Default `attributes_column` name.
pub const DEFAULT_ATTRIBUTES_COLUMN: &str = "attributes";
/// Default `ordering_key_column` name.
pub const DEFAULT_ORDERING_KEY_COLUMN: &str = "ordering_key";

/// The Pub/Sub writer options: batching, retry, in-flight bounds, recovery, publisher pool and
/// the rejection breaker. Build with [`PubSubPublisherOptions::builder`].
#[derive(Debug, Clone, PartialEq)]
pub struct PubSubPublisherOptions {
    batch_element_count_threshold: i64,
    batch_request_byte_threshold: i64,
    batch_delay_threshold: Duration,
    retry_total_timeout: Duration,
    retry_initial_delay: Duration,
    retry_delay_multiplier: f64,
    retry_max_delay: Duration,
    retry_initial_rpc_timeout: Duration,
    retry_rpc_timeout_multiplier: f64,
    retry_max_rpc_timeout: Duration,
    retry_max_attempts: i32,
    enable_message_ordering: bool,
    max_in_flight_messages: i32,
    max_in_flight_bytes: i64,
    recovery_initial_backoff: Duration,
    recovery_max_backoff: Duration,
    recovery_max_attempts: i32,
    publish_progress_timeout: Duration,
    shutdown_timeout: Duration,
    max_active_publishers: i32,
    destination_idle_timeout: Duration,
    per_destination_metrics: bool,
    max_consecutive_rejections: i32,
}

impl Default for PubSubPublisherOptions {
    fn default() -> Self {
        PubSubPublisherOptions {
            batch_element_count_threshold: SDK_BATCH_ELEMENT_COUNT_THRESHOLD,
            batch_request_byte_threshold: SDK_BATCH_REQUEST_BYTE_THRESHOLD,
            batch_delay_threshold: SDK_BATCH_DELAY_THRESHOLD,
            retry_total_timeout: SDK_RETRY_TOTAL_TIMEOUT,
            retry_initial_delay: SDK_RETRY_INITIAL_DELAY,
            retry_delay_multiplier: SDK_RETRY_DELAY_MULTIPLIER,
            retry_max_delay: SDK_RETRY_MAX_DELAY,
            retry_initial_rpc_timeout: SDK_RETRY_INITIAL_RPC_TIMEOUT,
            retry_rpc_timeout_multiplier: SDK_RETRY_RPC_TIMEOUT_MULTIPLIER,
            retry_max_rpc_timeout: SDK_RETRY_MAX_RPC_TIMEOUT,
            retry_max_attempts: SDK_RETRY_MAX_ATTEMPTS as i32,
            enable_message_ordering: false,
            max_in_flight_messages: DEFAULT_MAX_IN_FLIGHT_MESSAGES,
            max_in_flight_bytes: DEFAULT_MAX_IN_FLIGHT_BYTES,
            recovery_initial_backoff: DEFAULT_RECOVERY_INITIAL_BACKOFF,
            recovery_max_backoff: DEFAULT_RECOVERY_MAX_BACKOFF,
            recovery_max_attempts: DEFAULT_RECOVERY_MAX_ATTEMPTS,
            publish_progress_timeout: DEFAULT_PUBLISH_PROGRESS_TIMEOUT,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            max_active_publishers: DEFAULT_MAX_ACTIVE_PUBLISHERS,
            destination_idle_timeout: DEFAULT_DESTINATION_IDLE_TIMEOUT,
            per_destination_metrics: false,
            max_consecutive_rejections: DEFAULT_MAX_CONSECUTIVE_REJECTIONS,
        }
    }
}

impl PubSubPublisherOptions {
    /// A builder with every option at its default.
    pub fn builder() -> PubSubPublisherOptionsBuilder {
        PubSubPublisherOptionsBuilder::default()
    }

    /// Messages per publish request before it is sent.
    pub fn batch_element_count_threshold(&self) -> i64 {
        self.batch_element_count_threshold
    }
    /// Bytes per publish request before it is sent.
    pub fn batch_request_byte_threshold(&self) -> i64 {
        self.batch_request_byte_threshold
    }
    /// How long a batch waits to fill.
    pub fn batch_delay_threshold(&self) -> Duration {
        self.batch_delay_threshold
    }
    /// Total budget of one publish and its retries (zero: bounded by attempts only).
    pub fn retry_total_timeout(&self) -> Duration {
        self.retry_total_timeout
    }
    /// Delay before the first retry.
    pub fn retry_initial_delay(&self) -> Duration {
        self.retry_initial_delay
    }
    /// Growth factor of the retry delay.
    pub fn retry_delay_multiplier(&self) -> f64 {
        self.retry_delay_multiplier
    }
    /// Cap of the retry delay.
    pub fn retry_max_delay(&self) -> Duration {
        self.retry_max_delay
    }
    /// Deadline of the first attempt (zero: none).
    pub fn retry_initial_rpc_timeout(&self) -> Duration {
        self.retry_initial_rpc_timeout
    }
    /// Growth factor of the per-attempt deadline.
    pub fn retry_rpc_timeout_multiplier(&self) -> f64 {
        self.retry_rpc_timeout_multiplier
    }
    /// Cap of the per-attempt deadline (zero: none).
    pub fn retry_max_rpc_timeout(&self) -> Duration {
        self.retry_max_rpc_timeout
    }
    /// Attempt cap (zero: bounded by the total timeout only).
    pub fn retry_max_attempts(&self) -> i32 {
        self.retry_max_attempts
    }
    /// Whether ordering keys are honoured. When true, the writer retries a publish without a
    /// time or attempt limit (the retry budget above does not apply).
    pub fn enable_message_ordering(&self) -> bool {
        self.enable_message_ordering
    }
    /// In-flight message cap.
    pub fn max_in_flight_messages(&self) -> i32 {
        self.max_in_flight_messages
    }
    /// In-flight byte cap; [`COUNT_ONLY`] bounds by message count only.
    pub fn max_in_flight_bytes(&self) -> i64 {
        self.max_in_flight_bytes
    }
    /// The in-flight byte cap for the core: `u64::MAX` when it bounds by count only.
    pub fn in_flight_byte_cap(&self) -> u64 {
        if self.max_in_flight_bytes == COUNT_ONLY {
            u64::MAX
        } else {
            self.max_in_flight_bytes.unsigned_abs()
        }
    }
    /// First backoff of the topic auto-creation recovery.
    pub fn recovery_initial_backoff(&self) -> Duration {
        self.recovery_initial_backoff
    }
    /// Backoff cap of the topic auto-creation recovery.
    pub fn recovery_max_backoff(&self) -> Duration {
        self.recovery_max_backoff
    }
    /// Attempts of the topic auto-creation recovery.
    pub fn recovery_max_attempts(&self) -> i32 {
        self.recovery_max_attempts
    }
    /// No-progress budget.
    pub fn publish_progress_timeout(&self) -> Duration {
        self.publish_progress_timeout
    }
    /// Budget of one publisher release.
    pub fn shutdown_timeout(&self) -> Duration {
        self.shutdown_timeout
    }
    /// Open publisher cap.
    pub fn max_active_publishers(&self) -> i32 {
        self.max_active_publishers
    }
    /// Idle time after which a topic's publisher is released.
    pub fn destination_idle_timeout(&self) -> Duration {
        self.destination_idle_timeout
    }
    /// Whether per-topic counters are registered.
    pub fn per_destination_metrics(&self) -> bool {
        self.per_destination_metrics
    }
    /// Consecutive confirmed rejections that fail the statement; [`UNBOUNDED`] never does.
    pub fn max_consecutive_rejections(&self) -> i32 {
        self.max_consecutive_rejections
    }
    /// The breaker bound for the core: `None` when unbounded.
    pub fn rejection_limit(&self) -> Option<u64> {
        u64::try_from(self.max_consecutive_rejections).ok()
    }
}

/// Builder of [`PubSubPublisherOptions`]; every value is checked in [`build`](Self::build).
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct PubSubPublisherOptionsBuilder {
    batch_element_count_threshold: Option<i64>,
    batch_request_byte_threshold: Option<i64>,
    batch_delay_threshold: Option<Duration>,
    retry_total_timeout: Option<Duration>,
    retry_initial_delay: Option<Duration>,
    retry_delay_multiplier: Option<f64>,
    retry_max_delay: Option<Duration>,
    retry_initial_rpc_timeout: Option<Duration>,
    retry_rpc_timeout_multiplier: Option<f64>,
    retry_max_rpc_timeout: Option<Duration>,
    retry_max_attempts: Option<i32>,
    enable_message_ordering: Option<bool>,
    max_in_flight_messages: Option<i32>,
    max_in_flight_bytes: Option<i64>,
    recovery_initial_backoff: Option<Duration>,
    recovery_max_backoff: Option<Duration>,
    recovery_max_attempts: Option<i32>,
    publish_progress_timeout: Option<Duration>,
    shutdown_timeout: Option<Duration>,
    max_active_publishers: Option<i32>,
    destination_idle_timeout: Option<Duration>,
    per_destination_metrics: Option<bool>,
    max_consecutive_rejections: Option<i32>,
}

impl PubSubPublisherOptionsBuilder {
    /// Messages per publish request (positive; default: the Java SDK's 100).
    pub fn batch_element_count_threshold(mut self, v: i64) -> Self {
        self.batch_element_count_threshold = Some(v);
        self
    }
    /// Bytes per publish request (positive; default: the Java SDK's 1000).
    pub fn batch_request_byte_threshold(mut self, v: i64) -> Self {
        self.batch_request_byte_threshold = Some(v);
        self
    }
    /// How long a batch waits to fill (positive; default: the Java SDK's 1 ms).
    pub fn batch_delay_threshold(mut self, v: Duration) -> Self {
        self.batch_delay_threshold = Some(v);
        self
    }
    /// Total retry budget (zero or at least 1 ms; not with message ordering).
    pub fn retry_total_timeout(mut self, v: Duration) -> Self {
        self.retry_total_timeout = Some(v);
        self
    }
    /// Delay before the first retry (zero or at least 1 ms).
    pub fn retry_initial_delay(mut self, v: Duration) -> Self {
        self.retry_initial_delay = Some(v);
        self
    }
    /// Growth factor of the retry delay (at least 1.0).
    pub fn retry_delay_multiplier(mut self, v: f64) -> Self {
        self.retry_delay_multiplier = Some(v);
        self
    }
    /// Cap of the retry delay (zero or at least 1 ms).
    pub fn retry_max_delay(mut self, v: Duration) -> Self {
        self.retry_max_delay = Some(v);
        self
    }
    /// Deadline of the first attempt (zero or at least 1 ms).
    pub fn retry_initial_rpc_timeout(mut self, v: Duration) -> Self {
        self.retry_initial_rpc_timeout = Some(v);
        self
    }
    /// Growth factor of the per-attempt deadline (at least 1.0).
    pub fn retry_rpc_timeout_multiplier(mut self, v: f64) -> Self {
        self.retry_rpc_timeout_multiplier = Some(v);
        self
    }
    /// Cap of the per-attempt deadline (zero or at least 1 ms).
    pub fn retry_max_rpc_timeout(mut self, v: Duration) -> Self {
        self.retry_max_rpc_timeout = Some(v);
        self
    }
    /// Attempt cap (non-negative; not with message ordering).
    pub fn retry_max_attempts(mut self, v: i32) -> Self {
        self.retry_max_attempts = Some(v);
        self
    }
    /// Honour ordering keys (default false).
    pub fn enable_message_ordering(mut self, v: bool) -> Self {
        self.enable_message_ordering = Some(v);
        self
    }
    /// In-flight message cap (positive; default 1000).
    pub fn max_in_flight_messages(mut self, v: i32) -> Self {
        self.max_in_flight_messages = Some(v);
        self
    }
    /// In-flight byte cap (positive; default 64 MiB; [`COUNT_ONLY`] for count only).
    pub fn max_in_flight_bytes(mut self, v: i64) -> Self {
        self.max_in_flight_bytes = Some(v);
        self
    }
    /// First backoff of the topic auto-creation recovery (at least 1 ms; default 500 ms).
    pub fn recovery_initial_backoff(mut self, v: Duration) -> Self {
        self.recovery_initial_backoff = Some(v);
        self
    }
    /// Backoff cap of the recovery (at least 1 ms and the initial backoff; default 10 s).
    pub fn recovery_max_backoff(mut self, v: Duration) -> Self {
        self.recovery_max_backoff = Some(v);
        self
    }
    /// Attempts of the recovery (positive; default 10).
    pub fn recovery_max_attempts(mut self, v: i32) -> Self {
        self.recovery_max_attempts = Some(v);
        self
    }
    /// No-progress budget (positive, at most `i64::MAX` ns; default 600 s).
    pub fn publish_progress_timeout(mut self, v: Duration) -> Self {
        self.publish_progress_timeout = Some(v);
        self
    }
    /// Budget of one publisher release (positive, at most `i64::MAX` ns; default 30 s).
    pub fn shutdown_timeout(mut self, v: Duration) -> Self {
        self.shutdown_timeout = Some(v);
        self
    }
    /// Open publisher cap (positive; default 100).
    pub fn max_active_publishers(mut self, v: i32) -> Self {
        self.max_active_publishers = Some(v);
        self
    }
    /// Idle time before a topic's publisher is released (positive, at most `i64::MAX` ns;
    /// default [`DEFAULT_DESTINATION_IDLE_TIMEOUT`]).
    pub fn destination_idle_timeout(mut self, v: Duration) -> Self {
        self.destination_idle_timeout = Some(v);
        self
    }
    /// Register per-topic counters (default false).
    pub fn per_destination_metrics(mut self, v: bool) -> Self {
        self.per_destination_metrics = Some(v);
        self
    }
    /// Consecutive confirmed rejections that fail the statement (positive or [`UNBOUNDED`];
    /// default 100).
    pub fn max_consecutive_rejections(mut self, v: i32) -> Self {
        self.max_consecutive_rejections = Some(v);
        self
    }

    /// Checks every value and the cross-option rules; the error names the option and the rule.
    pub fn build(self) -> Result<PubSubPublisherOptions> {
        let mut o = PubSubPublisherOptions::default();
        macro_rules! take {
            ($field:ident, $spec:expr, int) => {
                if let Some(v) = self.$field {
                    $spec.check_int(v.into())?;
                    o.$field = v;
                }
            };
            ($field:ident, $spec:expr, float) => {
                if let Some(v) = self.$field {
                    $spec.check_float(v)?;
                    o.$field = v;
                }
            };
            ($field:ident, $spec:expr, duration) => {
                if let Some(v) = self.$field {
                    $spec.check_duration(v)?;
                    o.$field = v;
                }
            };
            ($field:ident) => {
                if let Some(v) = self.$field {
                    o.$field = v;
                }
            };
        }
        take!(
            batch_element_count_threshold,
            spec::BATCH_ELEMENT_COUNT_THRESHOLD,
            int
        );
        take!(
            batch_request_byte_threshold,
            spec::BATCH_REQUEST_BYTE_THRESHOLD,
            int
        );
        take!(batch_delay_threshold, spec::BATCH_DELAY_THRESHOLD, duration);
        take!(retry_total_timeout, spec::RETRY_TOTAL_TIMEOUT, duration);
        take!(retry_initial_delay, spec::RETRY_INITIAL_DELAY, duration);
        take!(retry_delay_multiplier, spec::RETRY_DELAY_MULTIPLIER, float);
        take!(retry_max_delay, spec::RETRY_MAX_DELAY, duration);
        take!(
            retry_initial_rpc_timeout,
            spec::RETRY_INITIAL_RPC_TIMEOUT,
            duration
        );
        take!(
            retry_rpc_timeout_multiplier,
            spec::RETRY_RPC_TIMEOUT_MULTIPLIER,
            float
        );
        take!(retry_max_rpc_timeout, spec::RETRY_MAX_RPC_TIMEOUT, duration);
        take!(retry_max_attempts, spec::RETRY_MAX_ATTEMPTS, int);
        take!(enable_message_ordering);
        take!(max_in_flight_messages, spec::MAX_IN_FLIGHT_MESSAGES, int);
        take!(max_in_flight_bytes, spec::MAX_IN_FLIGHT_BYTES, int);
        take!(
            recovery_initial_backoff,
            spec::RECOVERY_INITIAL_BACKOFF,
            duration
        );
        take!(recovery_max_backoff, spec::RECOVERY_MAX_BACKOFF, duration);
        take!(recovery_max_attempts, spec::RECOVERY_MAX_ATTEMPTS, int);
        take!(
            publish_progress_timeout,
            spec::PUBLISH_PROGRESS_TIMEOUT,
            duration
        );
        take!(shutdown_timeout, spec::SHUTDOWN_TIMEOUT, duration);
        take!(max_active_publishers, spec::MAX_ACTIVE_PUBLISHERS, int);
        take!(
            destination_idle_timeout,
            spec::DESTINATION_IDLE_TIMEOUT,
            duration
        );
        take!(per_destination_metrics);
        take!(
            max_consecutive_rejections,
            spec::MAX_CONSECUTIVE_REJECTIONS,
            int
        );

        if o.recovery_max_backoff < o.recovery_initial_backoff {
            return Err(spec::RECOVERY_MAX_BACKOFF.invalid(
                crate::options::spec::format_duration(o.recovery_max_backoff),
                format!(
                    "{} (which is {})",
                    spec::RECOVERY_MAX_BACKOFF.cross_rule,
                    crate::options::spec::format_duration(o.recovery_initial_backoff)
                ),
            ));
        }
        // With ordering the SDK publisher replaces the retry budget with an unlimited one, so an
        // explicit budget would promise a bound the publisher does not keep.
        if o.enable_message_ordering {
            for (given, name) in [
                (
                    self.retry_total_timeout.is_some(),
                    spec::RETRY_TOTAL_TIMEOUT.name,
                ),
                (
                    self.retry_max_attempts.is_some(),
                    spec::RETRY_MAX_ATTEMPTS.name,
                ),
            ] {
                if given {
                    return Err(Error::invalid(
                        spec::ENABLE_MESSAGE_ORDERING.name,
                        "true",
                        format!(
                            "cannot be combined with an explicit '{name}': an ordered publisher retries without a time or \
                             attempt limit, so the budget would not hold (publish_progress_timeout bounds a stall instead)"
                        ),
                    ));
                }
            }
        }
        Ok(o)
    }
}

/// How rows become Pub/Sub messages (the columns and encodings). Checked against the table's
/// schema by the mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PubSubMappingOptions {
    /// Column naming each row's topic, instead of a fixed topic.
    pub topic_column: Option<String>,
    /// Column carrying the message data as is.
    pub data_column: ColumnRef,
    /// How the row is encoded when there is no data column.
    pub format: PayloadFormat,
    /// Map column of attributes.
    pub attributes_column: ColumnRef,
    /// Columns that become one attribute each.
    pub attribute_columns: Vec<String>,
    /// Column carrying the ordering key.
    pub ordering_key_column: ColumnRef,
}

impl Default for PubSubMappingOptions {
    fn default() -> Self {
        PubSubMappingOptions {
            topic_column: None,
            data_column: ColumnRef::by_default(DEFAULT_DATA_COLUMN),
            format: PayloadFormat::Json,
            attributes_column: ColumnRef::by_default(DEFAULT_ATTRIBUTES_COLUMN),
            attribute_columns: Vec::new(),
            ordering_key_column: ColumnRef::by_default(DEFAULT_ORDERING_KEY_COLUMN),
        }
    }
}

/// Everything a Pub/Sub sink needs: connection, destination, mapping, policy and writer options.
#[derive(Debug, Clone, PartialEq)]
pub struct PubSubSinkOptions {
    /// Project, endpoint, emulator, credentials.
    pub connection: ConnectionOptions,
    /// The fixed topic (`projects/P/topics/T`), if any.
    pub topic: Option<String>,
    /// The row mapping.
    pub mapping: PubSubMappingOptions,
    /// Create a missing topic in the NOT_FOUND recovery.
    pub auto_create_topic: bool,
    /// What to do with a refused record.
    pub failure_policy: FailurePolicy,
    /// The writer options.
    pub publisher: PubSubPublisherOptions,
}

impl PubSubSinkOptions {
    /// Builds the sink options from a statement's `LOCATION` (the topic; empty means none) and
    /// options, reading the emulator variable from the process environment.
    ///
    /// ```
    /// use gcp_sql::connectors::pubsub::options::PubSubSinkOptions;
    /// use gcp_sql::options::RawOptions;
    ///
    /// let raw = RawOptions::from_pairs([
    ///     ("project".to_string(), "demo".to_string()),
    ///     ("max_in_flight_messages".to_string(), "200".to_string()),
    /// ])?;
    /// let opts = PubSubSinkOptions::from_raw(Some("clicks"), &raw)?;
    /// assert_eq!(opts.topic.as_deref(), Some("projects/demo/topics/clicks"));
    /// assert_eq!(opts.publisher.max_in_flight_messages(), 200);
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
        let p = ParsedOptions::parse(ConnectorKind::PubSub, raw)?;
        let connection = ConnectionOptions::from_parsed(&p, env)?;
        let project = connection.project.as_deref();

        let from_location = match location_text(location) {
            Some(l) => Some((
                names::pubsub_topic(l, project)
                    .map_err(|rule| Error::invalid("LOCATION", l, rule))?,
                l,
            )),
            None => None,
        };
        let from_option = match p.non_empty_text(&spec::TOPIC)? {
            Some(t) => Some((
                names::pubsub_topic(t, project).map_err(|rule| spec::TOPIC.invalid(t, rule))?,
                t,
            )),
            None => None,
        };
        let topic = merge_location(&spec::TOPIC, from_location, from_option)?;

        let mapping = PubSubMappingOptions {
            topic_column: p.text(&spec::TOPIC_COLUMN)?.map(str::to_string),
            data_column: p.column_ref(&spec::DATA_COLUMN, DEFAULT_DATA_COLUMN)?,
            format: p.payload_format()?,
            attributes_column: p.column_ref(&spec::ATTRIBUTES_COLUMN, DEFAULT_ATTRIBUTES_COLUMN)?,
            attribute_columns: p
                .list(&spec::ATTRIBUTE_COLUMNS)?
                .map(<[String]>::to_vec)
                .unwrap_or_default(),
            ordering_key_column: p
                .column_ref(&spec::ORDERING_KEY_COLUMN, DEFAULT_ORDERING_KEY_COLUMN)?,
        };

        let mut b = PubSubPublisherOptions::builder();
        if let Some(v) = p.int(&spec::BATCH_ELEMENT_COUNT_THRESHOLD)? {
            b = b.batch_element_count_threshold(v);
        }
        if let Some(v) = p.int(&spec::BATCH_REQUEST_BYTE_THRESHOLD)? {
            b = b.batch_request_byte_threshold(v);
        }
        if let Some(v) = p.duration(&spec::BATCH_DELAY_THRESHOLD)? {
            b = b.batch_delay_threshold(v);
        }
        if let Some(v) = p.duration(&spec::RETRY_TOTAL_TIMEOUT)? {
            b = b.retry_total_timeout(v);
        }
        if let Some(v) = p.duration(&spec::RETRY_INITIAL_DELAY)? {
            b = b.retry_initial_delay(v);
        }
        if let Some(v) = p.float(&spec::RETRY_DELAY_MULTIPLIER)? {
            b = b.retry_delay_multiplier(v);
        }
        if let Some(v) = p.duration(&spec::RETRY_MAX_DELAY)? {
            b = b.retry_max_delay(v);
        }
        if let Some(v) = p.duration(&spec::RETRY_INITIAL_RPC_TIMEOUT)? {
            b = b.retry_initial_rpc_timeout(v);
        }
        if let Some(v) = p.float(&spec::RETRY_RPC_TIMEOUT_MULTIPLIER)? {
            b = b.retry_rpc_timeout_multiplier(v);
        }
        if let Some(v) = p.duration(&spec::RETRY_MAX_RPC_TIMEOUT)? {
            b = b.retry_max_rpc_timeout(v);
        }
        if let Some(v) = p.int32(&spec::RETRY_MAX_ATTEMPTS)? {
            b = b.retry_max_attempts(v);
        }
        if let Some(v) = p.bool(&spec::ENABLE_MESSAGE_ORDERING)? {
            b = b.enable_message_ordering(v);
        }
        if let Some(v) = p.int32(&spec::MAX_IN_FLIGHT_MESSAGES)? {
            b = b.max_in_flight_messages(v);
        }
        if let Some(v) = p.int(&spec::MAX_IN_FLIGHT_BYTES)? {
            b = b.max_in_flight_bytes(v);
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
        if let Some(v) = p.duration(&spec::PUBLISH_PROGRESS_TIMEOUT)? {
            b = b.publish_progress_timeout(v);
        }
        if let Some(v) = p.duration(&spec::SHUTDOWN_TIMEOUT)? {
            b = b.shutdown_timeout(v);
        }
        if let Some(v) = p.int32(&spec::MAX_ACTIVE_PUBLISHERS)? {
            b = b.max_active_publishers(v);
        }
        if let Some(v) = p.duration(&spec::DESTINATION_IDLE_TIMEOUT)? {
            b = b.destination_idle_timeout(v);
        }
        if let Some(v) = p.bool(&common::PER_DESTINATION_METRICS)? {
            b = b.per_destination_metrics(v);
        }
        if let Some(v) = p.int32(&spec::MAX_CONSECUTIVE_REJECTIONS)? {
            b = b.max_consecutive_rejections(v);
        }

        let opts = PubSubSinkOptions {
            connection,
            topic,
            mapping,
            auto_create_topic: p.bool(&spec::AUTO_CREATE_TOPIC)?.unwrap_or(false),
            failure_policy: p.failure_policy()?,
            publisher: b.build()?,
        };
        opts.validate()?;
        Ok(opts)
    }

    /// Checks the rules between sections: a destination is required, and a fixed topic and a
    /// topic column exclude each other.
    pub fn validate(&self) -> Result<()> {
        match (&self.topic, &self.mapping.topic_column) {
            (None, None) => Err(Error::MissingOption {
                option: spec::TOPIC.name.into(),
                rule: "a Pub/Sub sink needs a topic: LOCATION 'projects/P/topics/T', the 'topic' option, \
                       or a per-row 'topic_column'"
                    .into(),
            }),
            (Some(t), Some(c)) => Err(spec::TOPIC_COLUMN.invalid(c, format!("{} (topic '{t}')", spec::TOPIC_COLUMN.cross_rule))),
            _ => Ok(()),
        }
    }

    /// The topic of one row: the topic column's value (a full name, or a short id in `project`)
    /// or the fixed topic. The error is the reason, for the mapping to report with the row.
    pub fn resolve_topic(&self, column_value: Option<&str>) -> std::result::Result<String, String> {
        match (&self.mapping.topic_column, column_value, &self.topic) {
            (Some(_), Some(v), _) => names::pubsub_topic(v, self.connection.project.as_deref()),
            (Some(c), None, _) => Err(format!("the topic column '{c}' is null")),
            (None, _, Some(t)) => Ok(t.clone()),
            (None, _, None) => Err("the sink has no topic".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_defaults_equal_documented_defaults() {
        assert_eq!(
            PubSubPublisherOptions::builder().build().unwrap(),
            PubSubPublisherOptions::default()
        );
    }

    #[test]
    fn count_only_byte_cap_maps_to_unbounded_bytes() {
        let o = PubSubPublisherOptions::builder()
            .max_in_flight_bytes(COUNT_ONLY)
            .build()
            .unwrap();
        assert_eq!(o.in_flight_byte_cap(), u64::MAX);
        assert_eq!(
            PubSubPublisherOptions::default().in_flight_byte_cap(),
            64 << 20
        );
    }

    #[test]
    fn unbounded_rejections_have_no_limit() {
        let o = PubSubPublisherOptions::builder()
            .max_consecutive_rejections(UNBOUNDED)
            .build()
            .unwrap();
        assert_eq!(o.rejection_limit(), None);
        assert_eq!(
            PubSubPublisherOptions::default().rejection_limit(),
            Some(100)
        );
    }
}
