//! Options of the Pub/Sub subscription source.
//!
//! A source table is declared with the same connector as the sink (`connector = 'pubsub'`,
//! `STORED AS PUBSUB`), with a subscription instead of a topic. Its options are the shared
//! connection options (`project`, `endpoint`, `emulator_host` / `PUBSUB_EMULATOR_HOST`,
//! `credentials_file`, `allow_remote_emulator`), the failure policy with its dead-letter
//! destination (parsed as the sinks parse them), the column mapping (`format`, with the sink's
//! `schema`, `schema_location` and `schema_encoding` for `avro` and `protobuf`, `data_column`
//! and the metadata columns) and the reader's bounds (flow control, parallel streams, lease,
//! idle stop), declared below.
//!
//! ```
//! use std::time::Duration;
//! use gcp_sql::connectors::pubsub::source::options::PubSubSourceOptions;
//! use gcp_sql::options::RawOptions;
//!
//! let raw = RawOptions::from_pairs([
//!     ("emulator_host".to_string(), "localhost:8085".to_string()),
//!     ("format".to_string(), "raw".to_string()),
//!     ("stop_after_idle".to_string(), "5s".to_string()),
//! ])?;
//! let opts = PubSubSourceOptions::from_raw_with_env(
//!     Some("projects/demo/subscriptions/clicks"),
//!     &raw,
//!     &|_| None,
//! )?;
//! assert_eq!(opts.subscription, "projects/demo/subscriptions/clicks");
//! assert_eq!(opts.max_outstanding_messages, 1000);
//! assert_eq!(opts.stop_after_idle, Some(Duration::from_secs(5)));
//! # Ok::<(), gcp_sql::Error>(())
//! ```

use std::sync::LazyLock;
use std::time::Duration;

use crate::connectors::dead_letter::DeadLetterTarget;
use crate::connectors::pubsub::names;
use crate::connectors::pubsub::sink::options::{SCHEMA, SCHEMA_ENCODING, SCHEMA_LOCATION, TOPIC};
use crate::core::FailurePolicy;
use crate::encode::schema::{PayloadSchema, SchemaLocation};
use crate::error::{Error, Result};
use crate::options::common;
use crate::options::event_time::{self, EventTimeOptions};
use crate::options::{
    Bound, ConnectionOptions, DefaultValue, EnvLookup, OptionGroup, OptionKind, OptionSpec,
    PayloadFormat, RawOptions,
};

/// Default of `max_outstanding_messages`: 1,000, the flow control of Google's Rust subscriber
/// and of Google's Flink connector.
pub const DEFAULT_MAX_OUTSTANDING_MESSAGES: i64 = 1000;
/// Default of `max_outstanding_bytes`: 100 MiB, the flow control of Google's Rust subscriber.
pub const DEFAULT_MAX_OUTSTANDING_BYTES: i64 = 100 << 20;
/// Default of `parallel_pull_count`.
pub const DEFAULT_PARALLEL_PULL_COUNT: i64 = 1;
/// Most StreamingPull streams one table opens (each is a DataFusion partition).
pub const MAX_PARALLEL_PULL_COUNT: i64 = 64;
/// Default of `max_lease_duration`: 60 minutes, as Google's Flink connector holds a lease.
pub const DEFAULT_MAX_LEASE_DURATION: Duration = Duration::from_secs(60 * 60);
/// Default `data_column` name under `format = 'raw'`.
pub const DEFAULT_DATA_COLUMN: &str = "data";

/// `subscription`.
pub static SUBSCRIPTION: OptionSpec = OptionSpec {
    name: "subscription",
    group: OptionGroup::Mapping,
    kind: OptionKind::Text,
    default: DefaultValue::None,
    bound: Bound::None,
    cross_rule: "this or `LOCATION` is required; when both are given they must name the same subscription; a short id needs `project`; cannot be combined with `topic`",
    example: "projects/demo/subscriptions/clicks",
    description: "The subscription the table reads: `projects/PROJECT/subscriptions/SUBSCRIPTION`, or a short subscription id in `project`. It makes the table a source.",
    redact: crate::options::Redact::None,
};

/// `type`.
pub static TYPE: OptionSpec = OptionSpec {
    name: "type",
    group: OptionGroup::Mapping,
    kind: OptionKind::Enum(&["source"]),
    default: DefaultValue::Unset("implied by `subscription`"),
    bound: Bound::None,
    cross_rule: "",
    example: "source",
    description: "`source` (the word Arroyo uses): the table reads a subscription. Accepted for readability; `subscription` implies it.",
    redact: crate::options::Redact::None,
};

/// `data_column` of a source.
pub static DATA_COLUMN: OptionSpec = OptionSpec {
    name: "data_column",
    group: OptionGroup::Mapping,
    kind: OptionKind::Column,
    default: DefaultValue::Text(DEFAULT_DATA_COLUMN),
    bound: Bound::None,
    cross_rule: "used with `format = 'raw'` only",
    example: "payload",
    description: "Under `format = 'raw'`, the column that receives each message's data as is: a binary column takes the bytes, a string column the text (a message whose data is not UTF-8 then fails to decode).",
    redact: crate::options::Redact::None,
};

/// `attributes_column` of a source.
pub static ATTRIBUTES_COLUMN: OptionSpec = OptionSpec {
    name: "attributes_column",
    group: OptionGroup::Mapping,
    kind: OptionKind::Column,
    default: DefaultValue::None,
    bound: Bound::None,
    cross_rule: "",
    example: "attrs",
    description: "A `MAP(VARCHAR, VARCHAR)` column that receives each message's attributes.",
    redact: crate::options::Redact::None,
};

/// `ordering_key_column` of a source.
pub static ORDERING_KEY_COLUMN: OptionSpec = OptionSpec {
    name: "ordering_key_column",
    group: OptionGroup::Mapping,
    kind: OptionKind::Column,
    default: DefaultValue::None,
    bound: Bound::None,
    cross_rule: "",
    example: "session_id",
    description: "A string column that receives each message's ordering key (empty when it has none).",
    redact: crate::options::Redact::None,
};

/// `message_id_column`.
pub static MESSAGE_ID_COLUMN: OptionSpec = OptionSpec {
    name: "message_id_column",
    group: OptionGroup::Mapping,
    kind: OptionKind::Column,
    default: DefaultValue::None,
    bound: Bound::None,
    cross_rule: "",
    example: "message_id",
    description: "A string column that receives the id the service gave each message.",
    redact: crate::options::Redact::None,
};

/// `publish_time_column`.
pub static PUBLISH_TIME_COLUMN: OptionSpec = OptionSpec {
    name: "publish_time_column",
    group: OptionGroup::Mapping,
    kind: OptionKind::Column,
    default: DefaultValue::None,
    bound: Bound::None,
    cross_rule: "",
    example: "pt",
    description: "A `TIMESTAMP` column (any unit, with or without a time zone) that receives the time the service stored each message.",
    redact: crate::options::Redact::None,
};

/// `delivery_attempt_column`.
pub static DELIVERY_ATTEMPT_COLUMN: OptionSpec = OptionSpec {
    name: "delivery_attempt_column",
    group: OptionGroup::Mapping,
    kind: OptionKind::Column,
    default: DefaultValue::None,
    bound: Bound::None,
    cross_rule: "",
    example: "attempt",
    description: "A nullable `INT` or `BIGINT` column that receives the delivery attempt of each message: set only when the subscription has a dead-letter policy, NULL otherwise.",
    redact: crate::options::Redact::None,
};

/// `max_outstanding_messages`.
pub static MAX_OUTSTANDING_MESSAGES: OptionSpec = OptionSpec {
    name: "max_outstanding_messages",
    group: OptionGroup::Reader,
    kind: OptionKind::Int,
    default: DefaultValue::Int(DEFAULT_MAX_OUTSTANDING_MESSAGES),
    bound: Bound::Positive,
    cross_rule: "",
    example: "5000",
    description: "Messages one stream holds received and not yet acknowledged or nacked. The stream stops reading at the cap (and asks the service to stop sending) until acknowledgements free room. The default is that of Google's Rust subscriber.",
    redact: crate::options::Redact::None,
};

/// `max_outstanding_bytes`.
pub static MAX_OUTSTANDING_BYTES: OptionSpec = OptionSpec {
    name: "max_outstanding_bytes",
    group: OptionGroup::Reader,
    kind: OptionKind::Int,
    default: DefaultValue::Bytes(DEFAULT_MAX_OUTSTANDING_BYTES),
    bound: Bound::Positive,
    cross_rule: "",
    example: "268435456",
    description: "Message data bytes one stream holds received and not yet acknowledged or nacked. The default is that of Google's Rust subscriber.",
    redact: crate::options::Redact::None,
};

/// `parallel_pull_count`.
pub static PARALLEL_PULL_COUNT: OptionSpec = OptionSpec {
    name: "parallel_pull_count",
    group: OptionGroup::Reader,
    kind: OptionKind::Int,
    default: DefaultValue::Int(DEFAULT_PARALLEL_PULL_COUNT),
    bound: Bound::IntRange {
        min: 1,
        max: MAX_PARALLEL_PULL_COUNT,
    },
    cross_rule: "",
    example: "4",
    description: "StreamingPull streams the table opens, one per partition of the scan. One stream carries about 10 MB/s; more streams read a busy subscription faster. Flow control applies per stream.",
    redact: crate::options::Redact::None,
};

/// `max_lease_duration`.
pub static MAX_LEASE_DURATION: OptionSpec = OptionSpec {
    name: "max_lease_duration",
    group: OptionGroup::Reader,
    kind: OptionKind::Duration,
    default: DefaultValue::Duration(DEFAULT_MAX_LEASE_DURATION),
    bound: Bound::DurationRange {
        min: Duration::from_secs(10),
        max: Duration::from_secs(7 * 24 * 60 * 60),
    },
    cross_rule: "",
    example: "2h",
    description: "How long the source keeps extending the ack deadline of a message whose rows are not yet delivered. Past it the lease lapses and the service delivers the message again (a duplicate, never a loss).",
    redact: crate::options::Redact::None,
};

/// `stop_after_idle`.
pub static STOP_AFTER_IDLE: OptionSpec = OptionSpec {
    name: "stop_after_idle",
    group: OptionGroup::Reader,
    kind: OptionKind::Duration,
    default: DefaultValue::Unset("the source reads until the statement is stopped"),
    bound: Bound::AtLeastMillis,
    cross_rule: "",
    example: "5s",
    description: "End the source (a graceful stop) once no message arrived for this long: the statement then delivers what it read and returns. For backfills and tests: drain a subscription and exit.",
    redact: crate::options::Redact::None,
};

/// `start_at`.
pub static START_AT: OptionSpec = OptionSpec {
    name: "start_at",
    group: OptionGroup::Reader,
    kind: OptionKind::Text,
    default: DefaultValue::Unset("the subscription's backlog, where it stands"),
    bound: Bound::NotEmpty,
    cross_rule: "needs `progress_path` (where the seek is recorded, so that a restart does not seek again)",
    example: "timestamp:2026-12-01T10:00:00Z",
    description: "Replay: before the first pull, seek the subscription once (Pub/Sub's `Seek`) to `timestamp:RFC3339` (every message published from then on is delivered again, those before it count as acknowledged; the subscription needs `retain_acked_messages` or the topic a retention for messages already acknowledged) or to `snapshot:NAME` (`projects/P/snapshots/S` or a short id in the subscription's project: the subscription's acknowledgement state when the snapshot was taken). The seek is recorded in `<progress_path>/<project>.<subscription>.start_at.json`; a scan that finds the same `start_at` recorded there does not seek again (delete the record, or change `start_at`, to replay once more).",
    redact: crate::options::Redact::None,
};

/// `ack_deadline`.
pub static ACK_DEADLINE: OptionSpec = OptionSpec {
    name: "ack_deadline",
    group: OptionGroup::Reader,
    kind: OptionKind::Duration,
    default: DefaultValue::Duration(super::lease::STREAM_ACK_DEADLINE),
    bound: Bound::DurationRange {
        min: Duration::from_secs(10),
        max: Duration::from_secs(600),
    },
    cross_rule: "",
    example: "10s",
    description: "The ack deadline the stream asks for, and each lease extension sets (the service accepts 10 s to 600 s). It is how soon the messages a killed reader held go to another reader; a shorter one costs more lease extensions.",
    redact: crate::options::Redact::None,
};

/// `format` of a source: how a message's data becomes the row's columns.
pub static FORMAT: OptionSpec = crate::options::payload::format_spec(
    "`raw` needs exactly one column to fill (`data_column`); `avro` and `protobuf` read `schema` or `schema_location`, else the schema of the subscription's topic",
    "How each message's data becomes the row's columns: `json` decodes each column from the member of its name; `raw` puts the data as it is in `data_column`; `avro` and `protobuf` decode each column from the field of its name, by the schema given by `schema` or `schema_location`. Without the option, the source reads the schema of the subscription's topic, if it has one, when a scan starts, and decodes in the topic's encoding. A message that Pub/Sub stamped with its encoding (the `googclient_schemaencoding` attribute) is decoded in that encoding.",
);

/// Every option of a Pub/Sub source, in the order the reference lists them.
pub fn options() -> &'static [&'static OptionSpec] {
    static OPTIONS: LazyLock<Vec<&'static OptionSpec>> = LazyLock::new(|| {
        vec![
            &common::PROJECT,
            &common::ENDPOINT,
            &common::EMULATOR_HOST,
            &common::ALLOW_REMOTE_EMULATOR,
            &common::CREDENTIALS_FILE,
            &common::FAILURE_POLICY,
            &common::DEAD_LETTER_TOPIC,
            &common::DEAD_LETTER_PATH,
            &SUBSCRIPTION,
            &TYPE,
            &FORMAT,
            &SCHEMA,
            &SCHEMA_LOCATION,
            &SCHEMA_ENCODING,
            &DATA_COLUMN,
            &ATTRIBUTES_COLUMN,
            &ORDERING_KEY_COLUMN,
            &MESSAGE_ID_COLUMN,
            &PUBLISH_TIME_COLUMN,
            &DELIVERY_ATTEMPT_COLUMN,
            &MAX_OUTSTANDING_MESSAGES,
            &MAX_OUTSTANDING_BYTES,
            &PARALLEL_PULL_COUNT,
            &MAX_LEASE_DURATION,
            &ACK_DEADLINE,
            &STOP_AFTER_IDLE,
            &START_AT,
            &event_time::EVENT_TIME_FIELD,
            &event_time::ALLOWED_LATENESS,
            &event_time::IDLE_TIMEOUT,
            &event_time::PROGRESS_PATH,
            &event_time::PROGRESS_START,
        ]
    });
    &OPTIONS
}

/// Which columns receive what of a message.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SourceColumns {
    /// `raw`: the column that receives the data (`data_column`).
    pub data: Option<String>,
    /// `attributes_column`.
    pub attributes: Option<String>,
    /// `ordering_key_column`.
    pub ordering_key: Option<String>,
    /// `message_id_column`.
    pub message_id: Option<String>,
    /// `publish_time_column`.
    pub publish_time: Option<String>,
    /// `delivery_attempt_column`.
    pub delivery_attempt: Option<String>,
}

impl SourceColumns {
    /// Every role a column can take, as (option, column) pairs in a fixed order (the data column
    /// first, then attributes, ordering key, message id, publish time, delivery attempt).
    pub fn slots(&self) -> [(&'static OptionSpec, Option<&str>); 6] {
        [
            (&DATA_COLUMN, self.data.as_deref()),
            (&ATTRIBUTES_COLUMN, self.attributes.as_deref()),
            (&ORDERING_KEY_COLUMN, self.ordering_key.as_deref()),
            (&MESSAGE_ID_COLUMN, self.message_id.as_deref()),
            (&PUBLISH_TIME_COLUMN, self.publish_time.as_deref()),
            (&DELIVERY_ATTEMPT_COLUMN, self.delivery_attempt.as_deref()),
        ]
    }

    /// The metadata columns as (option, column) pairs, the data column first.
    pub fn named(&self) -> Vec<(&'static str, &str)> {
        self.slots()
            .into_iter()
            .filter_map(|(spec, column)| column.map(|c| (spec.name, c)))
            .collect()
    }
}

/// Where a source's payload schema comes from (`format = 'avro' | 'protobuf'`, or none).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PayloadSource {
    /// None: `json` or `raw`, as `format` says (the default of a table built from Rust).
    #[default]
    Format,
    /// A schema known when the table is declared (`schema`, or a local `schema_location`).
    Schema(PayloadSchema),
    /// An object-store `schema_location`, read when a scan starts.
    Location(SchemaLocation),
    /// No `format` option: when a scan starts, the subscription's topic is looked up, and its
    /// Pub/Sub schema, if it has one, decodes the messages (else they are JSON). ADR 0053.
    Topic,
}

/// Everything a Pub/Sub source needs: connection, subscription, mapping, failure policy and
/// reader bounds.
#[derive(Debug, Clone, PartialEq)]
pub struct PubSubSourceOptions {
    /// Project, endpoint, emulator, credentials.
    pub connection: ConnectionOptions,
    /// `projects/P/subscriptions/S`.
    pub subscription: String,
    /// `json` decodes the declared columns by name (from JSON objects, or from the payloads of
    /// `schema` / `schema_at` under `avro` and `protobuf`); `raw` fills `data_column`.
    pub format: PayloadFormat,
    /// Where the schema of `avro` / `protobuf` payloads comes from, if any.
    pub schema: PayloadSource,
    /// Where the data and the metadata go.
    pub columns: SourceColumns,
    /// What a message that does not decode does.
    pub failure_policy: FailurePolicy,
    /// Where the `dead_letter` policy puts messages; `Some` exactly under that policy.
    pub dead_letter: Option<DeadLetterTarget>,
    /// Per stream: messages received and not settled.
    pub max_outstanding_messages: u64,
    /// Per stream: data bytes received and not settled.
    pub max_outstanding_bytes: u64,
    /// Streams (partitions).
    pub parallel_pull_count: usize,
    /// Longest lease extension of one message.
    pub max_lease_duration: Duration,
    /// End the source after this long without a message.
    pub stop_after_idle: Option<Duration>,
    /// The ack deadline the stream asks for and each lease extension sets (not an SQL option;
    /// [`STREAM_ACK_DEADLINE`](super::lease::STREAM_ACK_DEADLINE) by default). Clamped to the
    /// service's 10–600 s. A killed reader's messages come back within it.
    pub stream_ack_deadline: Duration,
    /// Event time, lateness, idleness and the progress marker of windows over the table
    /// (ADR 0068).
    pub event_time: EventTimeOptions,
    /// `start_at`: where the first scan seeks the subscription to (ADR 0072).
    pub start_at: Option<Replay>,
}

/// Where a replay starts (`start_at`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartAt {
    /// `timestamp:...`: the messages published at or after this time are delivered again.
    Time(chrono::DateTime<chrono::Utc>),
    /// `snapshot:...`: the acknowledgement state the snapshot `projects/P/snapshots/S` kept.
    Snapshot(String),
}

impl StartAt {
    /// Parses a `start_at` value of a subscription in `project`. The error is the rule broken.
    pub fn parse(text: &str, project: &str) -> std::result::Result<Self, String> {
        let text = text.trim();
        let Some((kind, value)) = text.split_once(':') else {
            return Err("expected 'timestamp:2026-12-01T10:00:00Z' or 'snapshot:NAME'".to_string());
        };
        let value = value.trim();
        match kind.trim().to_ascii_lowercase().as_str() {
            "timestamp" => chrono::DateTime::parse_from_rfc3339(value)
                .map(|t| StartAt::Time(t.with_timezone(&chrono::Utc)))
                .map_err(|e| {
                    format!(
                        "the time after 'timestamp:' is not an RFC 3339 time with a zone, \
                         like 2026-12-01T10:00:00Z ({e})"
                    )
                }),
            "snapshot" if value.is_empty() => {
                Err("'snapshot:' needs a snapshot name or id".to_string())
            }
            "snapshot" => names::pubsub_snapshot(value, Some(project)).map(StartAt::Snapshot),
            word if word.chars().all(|c| c.is_ascii_alphabetic()) => Err(format!(
                "'{kind}:' is not a start point: use 'timestamp:RFC3339' or 'snapshot:NAME'"
            )),
            _ => Err(
                "expected 'timestamp:2026-12-01T10:00:00Z' or 'snapshot:NAME' (a time needs \
                 the 'timestamp:' prefix)"
                    .to_string(),
            ),
        }
    }

    /// The start point as the record keeps it: `timestamp:` in UTC to the nanosecond, or
    /// `snapshot:` with the full name.
    pub fn canonical(&self) -> String {
        match self {
            StartAt::Time(t) => format!(
                "timestamp:{}",
                t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
            ),
            StartAt::Snapshot(name) => format!("snapshot:{name}"),
        }
    }
}

/// A replay: where to seek, and the folder whose record says whether it was done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    /// The start point.
    pub at: StartAt,
    /// The folder of the record (`progress_path`).
    pub folder: url::Url,
}

impl PubSubSourceOptions {
    /// Options for a subscription on an emulator, every other option at its default (a Rust
    /// program's shortcut; SQL goes through [`from_raw`](Self::from_raw)).
    pub fn emulator(subscription: impl Into<String>, emulator_host: impl Into<String>) -> Self {
        let subscription = subscription.into();
        let project = subscription
            .split('/')
            .nth(1)
            .unwrap_or_default()
            .to_string();
        PubSubSourceOptions {
            connection: ConnectionOptions::emulator(project, emulator_host),
            subscription,
            format: PayloadFormat::Json,
            schema: PayloadSource::Format,
            columns: SourceColumns::default(),
            failure_policy: FailurePolicy::Fail,
            dead_letter: None,
            max_outstanding_messages: DEFAULT_MAX_OUTSTANDING_MESSAGES as u64,
            max_outstanding_bytes: DEFAULT_MAX_OUTSTANDING_BYTES as u64,
            parallel_pull_count: DEFAULT_PARALLEL_PULL_COUNT as usize,
            max_lease_duration: DEFAULT_MAX_LEASE_DURATION,
            stop_after_idle: None,
            stream_ack_deadline: super::lease::STREAM_ACK_DEADLINE,
            event_time: EventTimeOptions::default(),
            start_at: None,
        }
    }

    /// Builds the source options from a statement's `LOCATION` (the subscription; empty means
    /// none) and options, reading `PUBSUB_EMULATOR_HOST` from the process environment.
    pub fn from_raw(location: Option<&str>, raw: &RawOptions) -> Result<Self> {
        Self::from_raw_with_env(location, raw, &ConnectionOptions::process_env)
    }

    /// [`from_raw`](Self::from_raw) with the environment read through `env`.
    pub fn from_raw_with_env(
        location: Option<&str>,
        raw: &RawOptions,
        env: EnvLookup<'_>,
    ) -> Result<Self> {
        // `topic` is not a source's option, but a table naming both gets the rule rather than
        // "unknown option".
        if let Some(topic) = raw.get(TOPIC.name) {
            return Err(TOPIC.invalid(
                topic,
                "a table either reads a subscription (a source) or publishes to a topic (a sink), \
                 not both: declare two tables",
            ));
        }
        let p = super::super::KIND.parse_options_of(options(), raw)?;
        let connection = ConnectionOptions::from_parsed(&p, super::super::SERVICE, env)?;
        let project = connection.project.as_deref();
        let resolve = |text: &str| -> std::result::Result<String, String> {
            if text.contains('/') {
                names::pubsub_subscription(text)
            } else {
                names::check_subscription_id(text)?;
                let project = project.ok_or(
                    "a short subscription id needs the 'project' option (or give \
                     'projects/PROJECT/subscriptions/SUBSCRIPTION')",
                )?;
                names::pubsub_subscription(&format!("projects/{project}/subscriptions/{text}"))
            }
        };
        let from_location = match location.map(str::trim).filter(|l| !l.is_empty()) {
            Some(l) => Some((
                resolve(l).map_err(|rule| Error::invalid("LOCATION", l, rule))?,
                l,
            )),
            None => None,
        };
        let from_option = match p.non_empty_text(&SUBSCRIPTION)? {
            Some(s) => Some((resolve(s).map_err(|rule| SUBSCRIPTION.invalid(s, rule))?, s)),
            None => None,
        };
        let subscription = match (from_location, from_option) {
            (Some((loc, loc_text)), Some((opt, opt_text))) if loc != opt => {
                return Err(SUBSCRIPTION.invalid(
                    opt_text,
                    format!(
                        "conflicts with LOCATION '{loc_text}': give the subscription in one \
                         place, or the same one in both"
                    ),
                ));
            }
            (Some((loc, _)), _) => loc,
            (None, Some((opt, _))) => opt,
            (None, None) => {
                return Err(Error::MissingOption {
                    option: SUBSCRIPTION.name.into(),
                    rule: "a Pub/Sub source needs a subscription: LOCATION \
                           'projects/P/subscriptions/S' or the 'subscription' option"
                        .into(),
                });
            }
        };

        let payload = crate::options::payload::payload_options(&p, &FORMAT)?;
        let format = payload.format;
        let data = match (format, p.text(&DATA_COLUMN)?) {
            (PayloadFormat::Raw, given) => Some(given.unwrap_or(DEFAULT_DATA_COLUMN).to_string()),
            (PayloadFormat::Json, Some(given)) => {
                return Err(DATA_COLUMN.invalid(
                    given,
                    "is used with format = 'raw' only: under 'json', 'avro' and 'protobuf' every \
                     column is decoded from the message data by its name",
                ));
            }
            (PayloadFormat::Json, None) => None,
        };
        let text =
            |spec: &OptionSpec| -> Result<Option<String>> { Ok(p.text(spec)?.map(str::to_string)) };
        let columns = SourceColumns {
            data,
            attributes: text(&ATTRIBUTES_COLUMN)?,
            ordering_key: text(&ORDERING_KEY_COLUMN)?,
            message_id: text(&MESSAGE_ID_COLUMN)?,
            publish_time: text(&PUBLISH_TIME_COLUMN)?,
            delivery_attempt: text(&DELIVERY_ATTEMPT_COLUMN)?,
        };
        let named = columns.named();
        for (i, (option, column)) in named.iter().enumerate() {
            if let Some((other, _)) = named[..i].iter().find(|(_, c)| c == column) {
                return Err(Error::invalid(
                    *option,
                    *column,
                    format!(
                        "column '{column}' is already named by '{other}': one column receives one thing"
                    ),
                ));
            }
        }

        let failure_policy = p.failure_policy()?;
        let dead_letter = DeadLetterTarget::from_parsed(
            &p,
            failure_policy,
            super::super::KIND,
            &connection,
            env,
            &crate::connectors::pubsub::dead_letter::TOPICS,
        )?;
        let int = |spec: &OptionSpec, default: i64| -> Result<i64> {
            Ok(p.int(spec)?.unwrap_or(default))
        };
        let event_time = EventTimeOptions::from_parsed(&p, columns.publish_time.as_deref())?;
        let start_at = match p.text(&START_AT)? {
            None => None,
            Some(text) => {
                let project = subscription.split('/').nth(1).unwrap_or_default();
                let at =
                    StartAt::parse(text, project).map_err(|rule| START_AT.invalid(text, rule))?;
                let Some(progress) = &event_time.progress else {
                    return Err(START_AT.invalid(
                        text,
                        "needs 'progress_path': the seek is recorded there, so that a restart \
                         does not seek the subscription again (add progress_path = \
                         'file:///var/lib/gcp-sql/progress')",
                    ));
                };
                Some(Replay {
                    at,
                    folder: progress.folder.clone(),
                })
            }
        };
        Ok(PubSubSourceOptions {
            connection,
            subscription,
            format,
            schema: match (payload.schema, payload.schema_at) {
                (Some(given), _) => PayloadSource::Schema(given),
                (None, Some(at)) => PayloadSource::Location(at),
                (None, None) if !payload.format_given => PayloadSource::Topic,
                (None, None) => PayloadSource::Format,
            },
            columns,
            failure_policy,
            dead_letter,
            max_outstanding_messages: int(
                &MAX_OUTSTANDING_MESSAGES,
                DEFAULT_MAX_OUTSTANDING_MESSAGES,
            )?
            .unsigned_abs(),
            max_outstanding_bytes: int(&MAX_OUTSTANDING_BYTES, DEFAULT_MAX_OUTSTANDING_BYTES)?
                .unsigned_abs(),
            parallel_pull_count: usize::try_from(int(
                &PARALLEL_PULL_COUNT,
                DEFAULT_PARALLEL_PULL_COUNT,
            )?)
            .unwrap_or(1),
            max_lease_duration: p
                .duration(&MAX_LEASE_DURATION)?
                .unwrap_or(DEFAULT_MAX_LEASE_DURATION),
            stop_after_idle: p.duration(&STOP_AFTER_IDLE)?,
            stream_ack_deadline: p
                .duration(&ACK_DEADLINE)?
                .unwrap_or(super::lease::STREAM_ACK_DEADLINE),
            event_time,
            start_at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(location: Option<&str>, pairs: &[(&str, &str)]) -> Result<PubSubSourceOptions> {
        let raw =
            RawOptions::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))?;
        PubSubSourceOptions::from_raw_with_env(location, &raw, &|_| None)
    }

    const SUB: &str = "projects/demo/subscriptions/clicks";

    /// The option names the reference's source section lists.
    fn listed_in_reference() -> Vec<String> {
        let reference = crate::connectors::catalog::reference_markdown();
        let section = reference
            .split("\n## ")
            .find(|s| s.starts_with("Pub/Sub source"))
            .expect("a Pub/Sub source section");
        section
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| l.split('`').next())
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn the_reference_lists_exactly_the_options_a_source_accepts() {
        let listed = listed_in_reference();
        // Every option a source parses, and the common ones the reference also shows there.
        let mut accepted: Vec<String> = options().iter().map(|s| s.name.to_string()).collect();
        accepted.sort();
        let mut sorted = listed.clone();
        sorted.sort();
        assert_eq!(sorted, accepted);
        // None of them is refused as another kind of table's option.
        for name in &listed {
            let spec = options().iter().find(|s| s.name == name).unwrap();
            let value = if spec.example.is_empty() {
                "x"
            } else {
                spec.example
            };
            if let Err(e) = parse(Some(SUB), &[(name.as_str(), value)]) {
                assert!(
                    !matches!(e, Error::UnknownOption { .. })
                        && !e.to_string().contains("not both"),
                    "{name}: {e}"
                );
            }
        }
        // The sink's own options are not listed, and are refused with what to do.
        for sink_only in ["topic", "topic_column", "batch_element_count_threshold"] {
            assert!(!listed.iter().any(|n| n == sink_only), "{sink_only} listed");
            assert!(
                parse(Some(SUB), &[(sink_only, "1")]).is_err(),
                "{sink_only}"
            );
        }
        let format = crate::connectors::catalog::reference_markdown();
        let section = format.split("\n## Pub/Sub source").nth(1).unwrap();
        let format_row = section
            .lines()
            .find(|l| l.starts_with("| `format`"))
            .unwrap();
        assert!(
            format_row.contains("becomes the row's columns"),
            "{format_row}"
        );
        assert!(
            !format_row.contains("message data when no column"),
            "{format_row}"
        );
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let o = parse(Some(SUB), &[("emulator_host", "localhost:8085")]).unwrap();
        assert_eq!(o.subscription, SUB);
        assert_eq!(o.format, PayloadFormat::Json);
        assert_eq!(o.columns, SourceColumns::default());
        assert_eq!(o.failure_policy, FailurePolicy::Fail);
        assert_eq!(o.max_outstanding_messages, 1000);
        assert_eq!(o.max_outstanding_bytes, 100 * 1024 * 1024);
        assert_eq!(o.parallel_pull_count, 1);
        assert_eq!(o.max_lease_duration, Duration::from_secs(3600));
        assert_eq!(o.stop_after_idle, None);
    }

    #[test]
    fn the_subscription_comes_from_location_the_option_or_a_short_id() {
        let o = parse(None, &[("subscription", SUB), ("type", "source")]).unwrap();
        assert_eq!(o.subscription, SUB);
        let o = parse(None, &[("subscription", "clicks"), ("project", "demo")]).unwrap();
        assert_eq!(o.subscription, SUB);
        let o = parse(Some(SUB), &[("subscription", SUB)]).unwrap();
        assert_eq!(o.subscription, SUB);
    }

    #[test]
    fn bad_subscriptions_are_refused_naming_the_option() {
        let missing = parse(None, &[]).unwrap_err().to_string();
        assert!(missing.contains("subscription"), "{missing}");
        let short = parse(None, &[("subscription", "clicks")])
            .unwrap_err()
            .to_string();
        assert!(
            short.contains("'subscription'") && short.contains("project"),
            "{short}"
        );
        let bad = parse(None, &[("subscription", "projects/demo/subscriptions/x")])
            .unwrap_err()
            .to_string();
        assert!(
            bad.contains("'subscription'") && bad.contains("3 to 255"),
            "{bad}"
        );
        let conflict = parse(
            Some(SUB),
            &[("subscription", "projects/demo/subscriptions/other")],
        )
        .unwrap_err()
        .to_string();
        assert!(conflict.contains("conflicts with LOCATION"), "{conflict}");
        let both = parse(Some(SUB), &[("topic", "projects/demo/topics/t")])
            .unwrap_err()
            .to_string();
        assert!(
            both.contains("'topic'") && both.contains("not both"),
            "{both}"
        );
        let sink = parse(Some(SUB), &[("type", "sink")])
            .unwrap_err()
            .to_string();
        assert!(sink.contains("'type'"), "{sink}");
    }

    #[test]
    fn bad_bounds_name_the_option() {
        for (option, value) in [
            ("max_outstanding_messages", "0"),
            ("max_outstanding_bytes", "-5"),
            ("parallel_pull_count", "0"),
            ("parallel_pull_count", "65"),
            ("max_lease_duration", "5s"),
            ("stop_after_idle", "0s"),
            ("stop_after_idle", "soon"),
            ("format", "xml"),
            ("failure_policy", "retry"),
        ] {
            let err = parse(Some(SUB), &[(option, value)])
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!("'{option}'")),
                "{option}={value}: {err}"
            );
        }
        let unknown = parse(Some(SUB), &[("max_outstanding_message", "5")])
            .unwrap_err()
            .to_string();
        assert!(unknown.contains("max_outstanding_messages"), "{unknown}");
    }

    #[test]
    fn columns_are_read_and_checked_against_each_other() {
        let o = parse(
            Some(SUB),
            &[
                ("format", "raw"),
                ("attributes_column", "attrs"),
                ("message_id_column", "id"),
                ("publish_time_column", "pt"),
                ("ordering_key_column", "k"),
                ("delivery_attempt_column", "n"),
            ],
        )
        .unwrap();
        assert_eq!(o.columns.data.as_deref(), Some("data"));
        assert_eq!(o.columns.named().len(), 6);
        let twice = parse(
            Some(SUB),
            &[("message_id_column", "id"), ("ordering_key_column", "id")],
        )
        .unwrap_err()
        .to_string();
        assert!(
            twice.contains("'ordering_key_column'") && twice.contains("message_id_column"),
            "{twice}"
        );
        let json_data = parse(Some(SUB), &[("data_column", "payload")])
            .unwrap_err()
            .to_string();
        assert!(
            json_data.contains("'data_column'") && json_data.contains("raw"),
            "{json_data}"
        );
    }

    #[test]
    fn start_at_takes_a_time_or_a_snapshot_and_needs_a_progress_path() {
        let with = |value: &str| {
            parse(
                Some(SUB),
                &[
                    ("start_at", value),
                    ("progress_path", "file:///tmp/progress"),
                ],
            )
        };
        let o = with("timestamp:2026-12-01T11:00:00+01:00").unwrap();
        let replay = o.start_at.unwrap();
        assert_eq!(replay.at.canonical(), "timestamp:2026-12-01T10:00:00Z");
        assert_eq!(replay.folder.as_str(), "file:///tmp/progress");
        let o = with("snapshot:before-deploy").unwrap();
        assert_eq!(
            o.start_at.unwrap().at,
            StartAt::Snapshot("projects/demo/snapshots/before-deploy".into())
        );
        let o = with("snapshot:projects/other/snapshots/snap").unwrap();
        assert_eq!(
            o.start_at.unwrap().at.canonical(),
            "snapshot:projects/other/snapshots/snap"
        );
        for (bad, says) in [
            ("2026-12-01T10:00:00Z", "expected 'timestamp:"),
            ("timestamp:yesterday", "RFC 3339"),
            ("timestamp:2026-12-01T10:00:00", "RFC 3339"),
            ("snapshot:", "needs a snapshot name"),
            ("snapshot:ab", "snapshot id has 3 to 255"),
            (
                "snapshot:projects/demo/topics/abc",
                "projects/PROJECT/snapshots/SNAPSHOT",
            ),
            ("offset:5", "is not a start point"),
        ] {
            let err = with(bad).unwrap_err().to_string();
            assert!(
                err.contains("'start_at'") && err.contains(says),
                "{bad}: {err}"
            );
        }
        let alone = parse(Some(SUB), &[("start_at", "timestamp:2026-12-01T10:00:00Z")])
            .unwrap_err()
            .to_string();
        assert!(
            alone.contains("'start_at'") && alone.contains("progress_path"),
            "{alone}"
        );
        assert_eq!(parse(Some(SUB), &[]).unwrap().start_at, None);
    }

    #[test]
    fn the_dead_letter_policy_is_parsed_as_the_sinks_parse_it() {
        let o = parse(
            Some(SUB),
            &[
                ("failure_policy", "dead_letter"),
                ("dead_letter_topic", "projects/demo/topics/dead"),
                ("emulator_host", "localhost:8085"),
            ],
        )
        .unwrap();
        assert_eq!(o.failure_policy, FailurePolicy::DeadLetter);
        assert!(o.dead_letter.is_some());
        let missing = parse(Some(SUB), &[("failure_policy", "dead_letter")])
            .unwrap_err()
            .to_string();
        assert!(missing.contains("dead_letter_topic"), "{missing}");
    }
}
