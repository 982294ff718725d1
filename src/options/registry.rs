//! Every option of every connector, as data.
//!
//! Writer options are the snake_case of the seed builder methods (`seeds/*.Builder.txt`); their
//! defaults come from the constants in each connector's `options` module, so the builder, the
//! parser and `docs/options.md` read one number. An option with the same name but a different
//! default or bound on two connectors (`recovery_initial_backoff`, `batch_element_count_threshold`)
//! has one spec per connector.

use super::ConnectorKind::{self, Bigtable, CloudTasks, PubSub};
use super::spec::{Bound, DefaultValue, OptionGroup, OptionKind, OptionSpec};
use crate::connectors::bigtable::options as bt;
use crate::connectors::cloud_tasks::options as ct;
use crate::connectors::pubsub::options as ps;

const ALL: &[ConnectorKind] = &[PubSub, CloudTasks, Bigtable];
const PS: &[ConnectorKind] = &[PubSub];
const CT: &[ConnectorKind] = &[CloudTasks];
const BT: &[ConnectorKind] = &[Bigtable];

/// Options shared by several connectors with one meaning.
pub mod common {
    use super::*;

    /// `connector`.
    pub static CONNECTOR: OptionSpec = OptionSpec {
        name: "connector",
        connectors: ALL,
        group: OptionGroup::Connection,
        kind: OptionKind::Enum(&["pubsub", "cloud_tasks", "bigtable"]),
        default: DefaultValue::None,
        bound: Bound::None,
        cross_rule: "required in the `CREATE TABLE ... WITH` form; in `CREATE EXTERNAL TABLE` the `STORED AS` word chooses the connector and this option, if given, must agree",
        example: "pubsub",
        description: "Which service the table writes to.",
    };

    /// `project`.
    pub static PROJECT: OptionSpec = OptionSpec {
        name: "project",
        connectors: ALL,
        group: OptionGroup::Connection,
        kind: OptionKind::Text,
        default: DefaultValue::None,
        bound: Bound::None,
        cross_rule: "needed when a destination is given as a short id",
        example: "demo",
        description: "Google Cloud project in which short topic, queue, instance and table ids are resolved.",
    };

    /// `endpoint`.
    pub static ENDPOINT: OptionSpec = OptionSpec {
        name: "endpoint",
        connectors: ALL,
        group: OptionGroup::Connection,
        kind: OptionKind::Text,
        default: DefaultValue::Unset("the service's public endpoint"),
        bound: Bound::None,
        cross_rule: "an `http://` or `https://` URL; when given, the emulator environment variable is not consulted",
        example: "https://pubsub.googleapis.com",
        description: "Service endpoint to connect to instead of the default Google endpoint (a regional or private endpoint, for example).",
    };

    /// `emulator_host`.
    pub static EMULATOR_HOST: OptionSpec = OptionSpec {
        name: "emulator_host",
        connectors: ALL,
        group: OptionGroup::Connection,
        kind: OptionKind::Text,
        default: DefaultValue::Unset(
            "the connector's environment variable: `PUBSUB_EMULATOR_HOST`, `CLOUD_TASKS_EMULATOR_HOST` or `BIGTABLE_EMULATOR_HOST`",
        ),
        bound: Bound::None,
        cross_rule: "`host:port`; cannot be combined with `endpoint`",
        example: "localhost:8085",
        description: "Address of a local emulator. The connection is then plaintext gRPC without credentials. The environment variable is read when the table is declared.",
    };

    /// `credentials_file`.
    pub static CREDENTIALS_FILE: OptionSpec = OptionSpec {
        name: "credentials_file",
        connectors: ALL,
        group: OptionGroup::Connection,
        kind: OptionKind::Text,
        default: DefaultValue::Unset("Application Default Credentials"),
        bound: Bound::None,
        cross_rule: "",
        example: "/etc/gcp/writer-key.json",
        description: "Path of a service-account key file used to authenticate. Ignored with an emulator.",
    };

    /// `failure_policy`.
    pub static FAILURE_POLICY: OptionSpec = OptionSpec {
        name: "failure_policy",
        connectors: ALL,
        group: OptionGroup::Writer,
        kind: OptionKind::Enum(&["fail", "drop"]),
        default: DefaultValue::Text("fail"),
        bound: Bound::None,
        cross_rule: "",
        example: "drop",
        description: "What happens to a record the service refuses (confirmed by sending it alone) or a row that cannot be encoded: `fail` ends the statement with an error; `drop` counts it, skips it and goes on, bounded by `max_consecutive_rejections` where the connector has it.",
    };

    /// `per_destination_metrics`.
    pub static PER_DESTINATION_METRICS: OptionSpec = OptionSpec {
        name: "per_destination_metrics",
        connectors: ALL,
        group: OptionGroup::Writer,
        kind: OptionKind::Bool,
        default: DefaultValue::Bool(false),
        bound: Bound::None,
        cross_rule: "",
        example: "true",
        description: "Also count records sent and send errors per topic, queue or table, beside the sink totals. Off by default because a per-row destination column can name an unbounded set of destinations; turn it on when they are few and known.",
    };

    /// `format`.
    pub static FORMAT: OptionSpec = OptionSpec {
        name: "format",
        connectors: &[PubSub, CloudTasks],
        group: OptionGroup::Mapping,
        kind: OptionKind::Enum(&["json", "raw"]),
        default: DefaultValue::Text("json"),
        bound: Bound::None,
        cross_rule: "`raw` needs exactly one payload column, of a string or binary type",
        example: "raw",
        description: "How a row becomes the message data or task body when no column carries it: `json` writes the row's remaining columns as one JSON object; `raw` sends the bytes of the single remaining column as they are.",
    };
}

/// Pub/Sub options.
pub mod pubsub {
    use super::*;

    /// `topic`.
    pub static TOPIC: OptionSpec = OptionSpec {
        name: "topic",
        connectors: PS,
        group: OptionGroup::Mapping,
        kind: OptionKind::Text,
        default: DefaultValue::None,
        bound: Bound::None,
        cross_rule: "this, `LOCATION` or `topic_column` is required; when both this and `LOCATION` are given they must name the same topic; a short id needs `project`",
        example: "projects/demo/topics/clicks",
        description: "The topic every row is published to: `projects/PROJECT/topics/TOPIC`, or a short topic id in `project`.",
    };

    /// `topic_column`.
    pub static TOPIC_COLUMN: OptionSpec = OptionSpec {
        name: "topic_column",
        connectors: PS,
        group: OptionGroup::Mapping,
        kind: OptionKind::Column,
        default: DefaultValue::None,
        bound: Bound::None,
        cross_rule: "cannot be combined with a fixed topic (`topic` or `LOCATION`)",
        example: "topic_name",
        description: "A string column naming each row's topic (full name, or short id in `project`). The column is not part of the payload.",
    };

    /// `data_column`.
    pub static DATA_COLUMN: OptionSpec = OptionSpec {
        name: "data_column",
        connectors: PS,
        group: OptionGroup::Mapping,
        kind: OptionKind::Column,
        default: DefaultValue::Text(ps::DEFAULT_DATA_COLUMN),
        bound: Bound::None,
        cross_rule: "",
        example: "payload",
        description: "A binary or string column carrying the message data as is. When the table has no such column (and the option is not given), the row is encoded by `format`; a column named explicitly must exist.",
    };

    /// `attributes_column`.
    pub static ATTRIBUTES_COLUMN: OptionSpec = OptionSpec {
        name: "attributes_column",
        connectors: PS,
        group: OptionGroup::Mapping,
        kind: OptionKind::Column,
        default: DefaultValue::Text(ps::DEFAULT_ATTRIBUTES_COLUMN),
        bound: Bound::None,
        cross_rule: "",
        example: "attrs",
        description: "A map column (string keys, string values) whose entries become message attributes. Used when present; a column named explicitly must exist.",
    };

    /// `attribute_columns`.
    pub static ATTRIBUTE_COLUMNS: OptionSpec = OptionSpec {
        name: "attribute_columns",
        connectors: PS,
        group: OptionGroup::Mapping,
        kind: OptionKind::ColumnList,
        default: DefaultValue::None,
        bound: Bound::None,
        cross_rule: "",
        example: "user_id, region",
        description: "Columns whose values become attributes named after the column. They are left out of the encoded payload.",
    };

    /// `ordering_key_column`.
    pub static ORDERING_KEY_COLUMN: OptionSpec = OptionSpec {
        name: "ordering_key_column",
        connectors: PS,
        group: OptionGroup::Mapping,
        kind: OptionKind::Column,
        default: DefaultValue::Text(ps::DEFAULT_ORDERING_KEY_COLUMN),
        bound: Bound::None,
        cross_rule: "a row carrying a non-empty ordering key needs `enable_message_ordering = true`",
        example: "session_id",
        description: "A string column carrying each message's ordering key. Used when present; a column named explicitly must exist.",
    };

    /// `auto_create_topic`.
    pub static AUTO_CREATE_TOPIC: OptionSpec = OptionSpec {
        name: "auto_create_topic",
        connectors: PS,
        group: OptionGroup::Mapping,
        kind: OptionKind::Bool,
        default: DefaultValue::Bool(false),
        bound: Bound::None,
        cross_rule: "",
        example: "true",
        description: "When a publish finds its topic missing (NOT_FOUND), create the topic and publish again under the `recovery_*` backoff. Nothing is created when the table is declared.",
    };

    /// `batch_element_count_threshold`.
    pub static BATCH_ELEMENT_COUNT_THRESHOLD: OptionSpec = OptionSpec {
        name: "batch_element_count_threshold",
        connectors: PS,
        group: OptionGroup::Writer,
        kind: OptionKind::Int,
        default: DefaultValue::JavaSdk(&DefaultValue::Int(ps::SDK_BATCH_ELEMENT_COUNT_THRESHOLD)),
        bound: Bound::Positive,
        cross_rule: "",
        example: "500",
        description: "Messages gathered into one publish request before it is sent. A request never exceeds the service's own limits (1,000 messages, 10 MB).",
    };

    /// `batch_request_byte_threshold`.
    pub static BATCH_REQUEST_BYTE_THRESHOLD: OptionSpec = OptionSpec {
        name: "batch_request_byte_threshold",
        connectors: PS,
        group: OptionGroup::Writer,
        kind: OptionKind::Int,
        default: DefaultValue::JavaSdk(&DefaultValue::Int(ps::SDK_BATCH_REQUEST_BYTE_THRESHOLD)),
        bound: Bound::Positive,
        cross_rule: "",
        example: "1048576",
        description: "Bytes gathered into one publish request before it is sent.",
    };

    /// `batch_delay_threshold`.
    pub static BATCH_DELAY_THRESHOLD: OptionSpec = OptionSpec {
        name: "batch_delay_threshold",
        connectors: PS,
        group: OptionGroup::Writer,
        kind: OptionKind::Duration,
        default: DefaultValue::JavaSdk(&DefaultValue::Duration(ps::SDK_BATCH_DELAY_THRESHOLD)),
        bound: Bound::PositiveDuration,
        cross_rule: "",
        example: "10ms",
        description: "How long the first message of a batch waits for the batch to fill before the request is sent anyway.",
    };

    /// `retry_total_timeout`.
    pub static RETRY_TOTAL_TIMEOUT: OptionSpec = OptionSpec {
        name: "retry_total_timeout",
        connectors: PS,
        group: OptionGroup::Writer,
        kind: OptionKind::Duration,
        default: DefaultValue::JavaSdk(&DefaultValue::Duration(ps::SDK_RETRY_TOTAL_TIMEOUT)),
        bound: Bound::ZeroOrAtLeastMillis,
        cross_rule: "cannot be set together with `enable_message_ordering = true`",
        example: "2m",
        description: "Time budget of one publish including all its retries; when it runs out the statement fails. `0s` means the budget is set by `retry_max_attempts` alone.",
    };

    /// `retry_initial_delay`.
    pub static RETRY_INITIAL_DELAY: OptionSpec = OptionSpec {
        name: "retry_initial_delay",
        connectors: PS,
        group: OptionGroup::Writer,
        kind: OptionKind::Duration,
        default: DefaultValue::JavaSdk(&DefaultValue::Duration(ps::SDK_RETRY_INITIAL_DELAY)),
        bound: Bound::ZeroOrAtLeastMillis,
        cross_rule: "",
        example: "200ms",
        description: "Delay before the first retry of a failed publish (`0s`: retry at once). The delay actually slept is randomised below this value.",
    };

    /// `retry_delay_multiplier`.
    pub static RETRY_DELAY_MULTIPLIER: OptionSpec = OptionSpec {
        name: "retry_delay_multiplier",
        connectors: PS,
        group: OptionGroup::Writer,
        kind: OptionKind::Float,
        default: DefaultValue::JavaSdk(&DefaultValue::Float(ps::SDK_RETRY_DELAY_MULTIPLIER)),
        bound: Bound::AtLeastOne,
        cross_rule: "",
        example: "2.0",
        description: "Factor by which the retry delay grows after each attempt.",
    };

    /// `retry_max_delay`.
    pub static RETRY_MAX_DELAY: OptionSpec = OptionSpec {
        name: "retry_max_delay",
        connectors: PS,
        group: OptionGroup::Writer,
        kind: OptionKind::Duration,
        default: DefaultValue::JavaSdk(&DefaultValue::Duration(ps::SDK_RETRY_MAX_DELAY)),
        bound: Bound::ZeroOrAtLeastMillis,
        cross_rule: "",
        example: "30s",
        description: "Upper limit of the delay between publish retries (`0s` clamps every delay after the first retry to none).",
    };

    /// `retry_initial_rpc_timeout`.
    pub static RETRY_INITIAL_RPC_TIMEOUT: OptionSpec = OptionSpec {
        name: "retry_initial_rpc_timeout",
        connectors: PS,
        group: OptionGroup::Writer,
        kind: OptionKind::Duration,
        default: DefaultValue::JavaSdk(&DefaultValue::Duration(ps::SDK_RETRY_INITIAL_RPC_TIMEOUT)),
        bound: Bound::ZeroOrAtLeastMillis,
        cross_rule: "",
        example: "10s",
        description: "Deadline of the first publish attempt (`0s`: no deadline; the call lasts as long as the connection).",
    };

    /// `retry_rpc_timeout_multiplier`.
    pub static RETRY_RPC_TIMEOUT_MULTIPLIER: OptionSpec = OptionSpec {
        name: "retry_rpc_timeout_multiplier",
        connectors: PS,
        group: OptionGroup::Writer,
        kind: OptionKind::Float,
        default: DefaultValue::JavaSdk(&DefaultValue::Float(ps::SDK_RETRY_RPC_TIMEOUT_MULTIPLIER)),
        bound: Bound::AtLeastOne,
        cross_rule: "",
        example: "1.5",
        description: "Factor by which the per-attempt deadline grows after each attempt.",
    };

    /// `retry_max_rpc_timeout`.
    pub static RETRY_MAX_RPC_TIMEOUT: OptionSpec = OptionSpec {
        name: "retry_max_rpc_timeout",
        connectors: PS,
        group: OptionGroup::Writer,
        kind: OptionKind::Duration,
        default: DefaultValue::JavaSdk(&DefaultValue::Duration(ps::SDK_RETRY_MAX_RPC_TIMEOUT)),
        bound: Bound::ZeroOrAtLeastMillis,
        cross_rule: "",
        example: "30s",
        description: "Upper limit of the per-attempt deadline (`0s`: attempts after the first run without a deadline).",
    };

    /// `retry_max_attempts`.
    pub static RETRY_MAX_ATTEMPTS: OptionSpec = OptionSpec {
        name: "retry_max_attempts",
        connectors: PS,
        group: OptionGroup::Writer,
        kind: OptionKind::Int,
        default: DefaultValue::JavaSdk(&DefaultValue::Int(ps::SDK_RETRY_MAX_ATTEMPTS)),
        bound: Bound::NonNegative,
        cross_rule: "cannot be set together with `enable_message_ordering = true`",
        example: "5",
        description: "Upper limit of publish attempts. `0` leaves the limit to `retry_total_timeout` alone; with both at zero a failed publish is not retried.",
    };

    /// `enable_message_ordering`.
    pub static ENABLE_MESSAGE_ORDERING: OptionSpec = OptionSpec {
        name: "enable_message_ordering",
        connectors: PS,
        group: OptionGroup::Writer,
        kind: OptionKind::Bool,
        default: DefaultValue::Bool(false),
        bound: Bound::None,
        cross_rule: "`true` cannot be combined with an explicit `retry_total_timeout` or `retry_max_attempts`",
        example: "true",
        description: "Publish messages that share an ordering key in order. Ordered publishing retries without a time or attempt limit (giving up would break the order), so only `publish_progress_timeout` ends an outage. While it is off, a row carrying an ordering key is refused.",
    };

    /// `max_in_flight_messages`.
    pub static MAX_IN_FLIGHT_MESSAGES: OptionSpec = OptionSpec {
        name: "max_in_flight_messages",
        connectors: PS,
        group: OptionGroup::Writer,
        kind: OptionKind::Int,
        default: DefaultValue::Int(ps::DEFAULT_MAX_IN_FLIGHT_MESSAGES as i64),
        bound: Bound::Positive,
        cross_rule: "",
        example: "2000",
        description: "Messages the writer keeps published but not yet acknowledged. At the cap the writer waits (without blocking a thread) for acknowledgements before taking more input.",
    };

    /// `max_in_flight_bytes`.
    pub static MAX_IN_FLIGHT_BYTES: OptionSpec = OptionSpec {
        name: "max_in_flight_bytes",
        connectors: PS,
        group: OptionGroup::Writer,
        kind: OptionKind::Int,
        default: DefaultValue::Bytes(ps::DEFAULT_MAX_IN_FLIGHT_BYTES),
        bound: Bound::Positive,
        cross_rule: "",
        example: "134217728",
        description: "Serialized bytes of the messages the writer keeps unacknowledged; this is what bounds memory, since one message may hold up to 10 MiB. A single message larger than the cap is still sent, alone. `9223372036854775807` bounds by message count only.",
    };

    /// `recovery_initial_backoff`.
    pub static RECOVERY_INITIAL_BACKOFF: OptionSpec = OptionSpec {
        name: "recovery_initial_backoff",
        connectors: PS,
        group: OptionGroup::Writer,
        kind: OptionKind::Duration,
        default: DefaultValue::Duration(ps::DEFAULT_RECOVERY_INITIAL_BACKOFF),
        bound: Bound::AtLeastMillis,
        cross_rule: "",
        example: "1s",
        description: "First wait before publishing again after `auto_create_topic` created a missing topic.",
    };

    /// `recovery_max_backoff`.
    pub static RECOVERY_MAX_BACKOFF: OptionSpec = OptionSpec {
        name: "recovery_max_backoff",
        connectors: PS,
        group: OptionGroup::Writer,
        kind: OptionKind::Duration,
        default: DefaultValue::Duration(ps::DEFAULT_RECOVERY_MAX_BACKOFF),
        bound: Bound::AtLeastMillis,
        cross_rule: "at least `recovery_initial_backoff`",
        example: "30s",
        description: "Longest wait between publish attempts of the topic auto-creation recovery.",
    };

    /// `recovery_max_attempts`.
    pub static RECOVERY_MAX_ATTEMPTS: OptionSpec = OptionSpec {
        name: "recovery_max_attempts",
        connectors: PS,
        group: OptionGroup::Writer,
        kind: OptionKind::Int,
        default: DefaultValue::Int(ps::DEFAULT_RECOVERY_MAX_ATTEMPTS as i64),
        bound: Bound::Positive,
        cross_rule: "",
        example: "5",
        description: "Publish attempts of the topic auto-creation recovery; when they run out the statement fails.",
    };

    /// `publish_progress_timeout`.
    pub static PUBLISH_PROGRESS_TIMEOUT: OptionSpec = OptionSpec {
        name: "publish_progress_timeout",
        connectors: PS,
        group: OptionGroup::Writer,
        kind: OptionKind::Duration,
        default: DefaultValue::Duration(ps::DEFAULT_PUBLISH_PROGRESS_TIMEOUT),
        bound: Bound::PositiveNanos,
        cross_rule: "",
        example: "5m",
        description: "How long the writer may wait with no publish completing at all before the statement fails. Every completion restarts the budget, so a slow topic never spends it; a stalled one does. Nothing is lost when it fires: re-running the statement sends again.",
    };

    /// `shutdown_timeout`.
    pub static SHUTDOWN_TIMEOUT: OptionSpec = OptionSpec {
        name: "shutdown_timeout",
        connectors: PS,
        group: OptionGroup::Writer,
        kind: OptionKind::Duration,
        default: DefaultValue::Duration(ps::DEFAULT_SHUTDOWN_TIMEOUT),
        bound: Bound::PositiveNanos,
        cross_rule: "",
        example: "10s",
        description: "Budget of one publisher release (an eviction or the end of the statement). Every publisher in one release is asked to stop before any is waited on, so a release costs this once. A release that overruns it fails the statement.",
    };

    /// `max_active_publishers`.
    pub static MAX_ACTIVE_PUBLISHERS: OptionSpec = OptionSpec {
        name: "max_active_publishers",
        connectors: PS,
        group: OptionGroup::Writer,
        kind: OptionKind::Int,
        default: DefaultValue::Int(ps::DEFAULT_MAX_ACTIVE_PUBLISHERS as i64),
        bound: Bound::Positive,
        cross_rule: "",
        example: "20",
        description: "Publishers (one per topic) a writer keeps open. A new topic beyond the cap releases the least recently used publisher, after its pending work is done.",
    };

    /// `destination_idle_timeout`.
    pub static DESTINATION_IDLE_TIMEOUT: OptionSpec = OptionSpec {
        name: "destination_idle_timeout",
        connectors: PS,
        group: OptionGroup::Writer,
        kind: OptionKind::Duration,
        default: DefaultValue::Duration(ps::DEFAULT_DESTINATION_IDLE_TIMEOUT),
        bound: Bound::PositiveNanos,
        cross_rule: "",
        example: "1h",
        description: "How long a topic may go unused before a successful flush releases its publisher. A later row for the topic opens a new one.",
    };

    /// `max_consecutive_rejections` (Pub/Sub and Bigtable).
    pub static MAX_CONSECUTIVE_REJECTIONS: OptionSpec = OptionSpec {
        name: "max_consecutive_rejections",
        connectors: &[PubSub, Bigtable],
        group: OptionGroup::Writer,
        kind: OptionKind::Int,
        default: DefaultValue::Int(ps::DEFAULT_MAX_CONSECUTIVE_REJECTIONS as i64),
        bound: Bound::PositiveOrUnbounded,
        cross_rule: "",
        example: "-1",
        description: "With `failure_policy = 'drop'`, this many confirmed rejections in a row, with no record delivered between them, fail the statement: the pipeline is broken rather than seeing the odd bad record. Any delivery resets the count; rows the encoder refuses do not count. `-1` never fails.",
    };
}

/// Cloud Tasks options.
pub mod cloud_tasks {
    use super::*;

    /// `queue`.
    pub static QUEUE: OptionSpec = OptionSpec {
        name: "queue",
        connectors: CT,
        group: OptionGroup::Mapping,
        kind: OptionKind::Text,
        default: DefaultValue::None,
        bound: Bound::None,
        cross_rule: "this, `LOCATION` or `queue_column` is required; when both this and `LOCATION` are given they must name the same queue; a short id needs `project` and `location`",
        example: "projects/demo/locations/us-central1/queues/jobs",
        description: "The queue every task is created in: `projects/PROJECT/locations/LOCATION/queues/QUEUE`, or a short queue id.",
    };

    /// `location`.
    pub static LOCATION: OptionSpec = OptionSpec {
        name: "location",
        connectors: CT,
        group: OptionGroup::Connection,
        kind: OptionKind::Text,
        default: DefaultValue::None,
        bound: Bound::None,
        cross_rule: "",
        example: "us-central1",
        description: "Region in which short queue ids are resolved.",
    };

    /// `queue_column`.
    pub static QUEUE_COLUMN: OptionSpec = OptionSpec {
        name: "queue_column",
        connectors: CT,
        group: OptionGroup::Mapping,
        kind: OptionKind::Column,
        default: DefaultValue::None,
        bound: Bound::None,
        cross_rule: "cannot be combined with a fixed queue (`queue` or `LOCATION`)",
        example: "queue_name",
        description: "A string column naming each row's queue (full name, or short id in `project` and `location`).",
    };

    /// `url`.
    pub static URL: OptionSpec = OptionSpec {
        name: "url",
        connectors: CT,
        group: OptionGroup::Mapping,
        kind: OptionKind::Text,
        default: DefaultValue::None,
        bound: Bound::None,
        cross_rule: "this or `url_column` is required, not both; `http://` or `https://`, at most 2,083 characters",
        example: "https://worker.example.com/tasks",
        description: "The URL every task calls.",
    };

    /// `url_column`.
    pub static URL_COLUMN: OptionSpec = OptionSpec {
        name: "url_column",
        connectors: CT,
        group: OptionGroup::Mapping,
        kind: OptionKind::Column,
        default: DefaultValue::None,
        bound: Bound::None,
        cross_rule: "",
        example: "target_url",
        description: "A string column carrying each task's URL.",
    };

    /// `http_method`.
    pub static HTTP_METHOD: OptionSpec = OptionSpec {
        name: "http_method",
        connectors: CT,
        group: OptionGroup::Mapping,
        kind: OptionKind::Enum(&["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]),
        default: DefaultValue::Text("POST"),
        bound: Bound::None,
        cross_rule: "only `POST`, `PUT` and `PATCH` carry a body, so `body_column` needs one of them",
        example: "PUT",
        description: "HTTP method of the task's request. With a method that carries no body, no body is sent.",
    };

    /// `headers`.
    pub static HEADERS: OptionSpec = OptionSpec {
        name: "headers",
        connectors: CT,
        group: OptionGroup::Mapping,
        kind: OptionKind::Headers,
        default: DefaultValue::None,
        bound: Bound::None,
        cross_rule: "together less than 80 KB",
        example: "Content-Type: application/json; X-Source: gcp-sql",
        description: "Headers added to every task's request, written `Name: value; Other-Name: value`. A `;` that is not followed by `Name:` belongs to the value (`Content-Type: text/plain; charset=utf-8` is one header). With `format = 'json'` and no explicit `Content-Type`, `Content-Type: application/json` is sent.",
    };

    /// `headers_column`.
    pub static HEADERS_COLUMN: OptionSpec = OptionSpec {
        name: "headers_column",
        connectors: CT,
        group: OptionGroup::Mapping,
        kind: OptionKind::Column,
        default: DefaultValue::None,
        bound: Bound::None,
        cross_rule: "",
        example: "request_headers",
        description: "A map column (string keys, string values) of per-row headers; an entry overrides a `headers` entry of the same name.",
    };

    /// `body_column`.
    pub static BODY_COLUMN: OptionSpec = OptionSpec {
        name: "body_column",
        connectors: CT,
        group: OptionGroup::Mapping,
        kind: OptionKind::Column,
        default: DefaultValue::None,
        bound: Bound::None,
        cross_rule: "needs `http_method` `POST`, `PUT` or `PATCH`",
        example: "body",
        description: "A binary or string column carrying the request body as is. Without it, a body-carrying request gets the row encoded by `format`.",
    };

    /// `schedule_time_column`.
    pub static SCHEDULE_TIME_COLUMN: OptionSpec = OptionSpec {
        name: "schedule_time_column",
        connectors: CT,
        group: OptionGroup::Mapping,
        kind: OptionKind::Column,
        default: DefaultValue::None,
        bound: Bound::None,
        cross_rule: "",
        example: "run_at",
        description: "A timestamp column with the time each task should run (truncated to microseconds by the service); null or absent means now.",
    };

    /// `task_name_column`.
    pub static TASK_NAME_COLUMN: OptionSpec = OptionSpec {
        name: "task_name_column",
        connectors: CT,
        group: OptionGroup::Mapping,
        kind: OptionKind::Column,
        default: DefaultValue::None,
        bound: Bound::None,
        cross_rule: "",
        example: "task_id",
        description: "A string column with each task's id (or full task name), which makes creation idempotent: a task whose name exists already is counted as a de-duplicated delivery, not an error. Hashed ids spread load better than sequential ones.",
    };

    /// `oidc_service_account_email`.
    pub static OIDC_SERVICE_ACCOUNT_EMAIL: OptionSpec = OptionSpec {
        name: "oidc_service_account_email",
        connectors: CT,
        group: OptionGroup::Mapping,
        kind: OptionKind::Text,
        default: DefaultValue::None,
        bound: Bound::None,
        cross_rule: "cannot be combined with the `oauth_*` options",
        example: "invoker@demo.iam.gserviceaccount.com",
        description: "Service account whose OIDC token the request carries (for targets such as Cloud Run).",
    };

    /// `oidc_audience`.
    pub static OIDC_AUDIENCE: OptionSpec = OptionSpec {
        name: "oidc_audience",
        connectors: CT,
        group: OptionGroup::Mapping,
        kind: OptionKind::Text,
        default: DefaultValue::Unset("the task's URL"),
        bound: Bound::None,
        cross_rule: "needs `oidc_service_account_email`",
        example: "https://worker.example.com",
        description: "Audience of the OIDC token.",
    };

    /// `oauth_service_account_email`.
    pub static OAUTH_SERVICE_ACCOUNT_EMAIL: OptionSpec = OptionSpec {
        name: "oauth_service_account_email",
        connectors: CT,
        group: OptionGroup::Mapping,
        kind: OptionKind::Text,
        default: DefaultValue::None,
        bound: Bound::None,
        cross_rule: "cannot be combined with the `oidc_*` options",
        example: "caller@demo.iam.gserviceaccount.com",
        description: "Service account whose OAuth access token the request carries (for Google APIs as targets).",
    };

    /// `oauth_scope`.
    pub static OAUTH_SCOPE: OptionSpec = OptionSpec {
        name: "oauth_scope",
        connectors: CT,
        group: OptionGroup::Mapping,
        kind: OptionKind::Text,
        default: DefaultValue::Unset("`https://www.googleapis.com/auth/cloud-platform`"),
        bound: Bound::None,
        cross_rule: "needs `oauth_service_account_email`",
        example: "https://www.googleapis.com/auth/cloud-platform",
        description: "Scope of the OAuth access token.",
    };

    /// `dispatch_deadline`.
    pub static DISPATCH_DEADLINE: OptionSpec = OptionSpec {
        name: "dispatch_deadline",
        connectors: CT,
        group: OptionGroup::Mapping,
        kind: OptionKind::Duration,
        default: DefaultValue::Unset("the service's default, 10 minutes for HTTP targets"),
        bound: Bound::DurationRange {
            min: ct::MIN_DISPATCH_DEADLINE,
            max: ct::MAX_DISPATCH_DEADLINE,
        },
        cross_rule: "",
        example: "2m",
        description: "How long the queue waits for the target to answer before it counts the attempt as failed and retries it on the queue's schedule.",
    };

    /// `max_in_flight_tasks`.
    pub static MAX_IN_FLIGHT_TASKS: OptionSpec = OptionSpec {
        name: "max_in_flight_tasks",
        connectors: CT,
        group: OptionGroup::Writer,
        kind: OptionKind::Int,
        default: DefaultValue::Int(ct::DEFAULT_MAX_IN_FLIGHT_TASKS as i64),
        bound: Bound::Positive,
        cross_rule: "",
        example: "200",
        description: "Task creations the writer keeps outstanding, in flight or waiting out a retry backoff. At the cap the writer waits for creations to complete before taking more input.",
    };

    /// `channel_pool_size`.
    pub static CHANNEL_POOL_SIZE: OptionSpec = OptionSpec {
        name: "channel_pool_size",
        connectors: CT,
        group: OptionGroup::Writer,
        kind: OptionKind::Int,
        default: DefaultValue::Unset("one channel"),
        bound: Bound::Positive,
        cross_rule: "cannot be combined with an emulator (`emulator_host` or `CLOUD_TASKS_EMULATOR_HOST`), which always uses one plaintext channel",
        example: "4",
        description: "gRPC channels the client spreads creations over. One HTTP/2 channel carries about 100 concurrent calls, so a writer that needs more concurrent creations than that needs about one channel per 100. Mind the queue's ramp-up guidance (500 tasks/s per queue, then at most +50% every 5 minutes) before raising it.",
    };

    /// `recovery_initial_backoff`.
    pub static RECOVERY_INITIAL_BACKOFF: OptionSpec = OptionSpec {
        name: "recovery_initial_backoff",
        connectors: CT,
        group: OptionGroup::Writer,
        kind: OptionKind::Duration,
        default: DefaultValue::Duration(ct::DEFAULT_RECOVERY_INITIAL_BACKOFF),
        bound: Bound::AtLeastMillis,
        cross_rule: "",
        example: "250ms",
        description: "First backoff of the retry of a transient failure (UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED).",
    };

    /// `recovery_max_backoff`.
    pub static RECOVERY_MAX_BACKOFF: OptionSpec = OptionSpec {
        name: "recovery_max_backoff",
        connectors: CT,
        group: OptionGroup::Writer,
        kind: OptionKind::Duration,
        default: DefaultValue::Duration(ct::DEFAULT_RECOVERY_MAX_BACKOFF),
        bound: Bound::AtLeastMillis,
        cross_rule: "at least `recovery_initial_backoff`",
        example: "20s",
        description: "Longest backoff of the transient-failure retry.",
    };

    /// `recovery_max_attempts`.
    pub static RECOVERY_MAX_ATTEMPTS: OptionSpec = OptionSpec {
        name: "recovery_max_attempts",
        connectors: CT,
        group: OptionGroup::Writer,
        kind: OptionKind::Int,
        default: DefaultValue::Int(ct::DEFAULT_RECOVERY_MAX_ATTEMPTS as i64),
        bound: Bound::Positive,
        cross_rule: "",
        example: "12",
        description: "Attempts of the transient-failure retry, the first creation included; when they run out the statement fails.",
    };

    /// `not_found_recovery_initial_backoff`.
    pub static NOT_FOUND_RECOVERY_INITIAL_BACKOFF: OptionSpec = OptionSpec {
        name: "not_found_recovery_initial_backoff",
        connectors: CT,
        group: OptionGroup::Writer,
        kind: OptionKind::Duration,
        default: DefaultValue::Duration(ct::DEFAULT_NOT_FOUND_RECOVERY_INITIAL_BACKOFF),
        bound: Bound::AtLeastMillis,
        cross_rule: "",
        example: "1s",
        description: "First backoff of the retry when the queue is not found.",
    };

    /// `not_found_recovery_max_backoff`.
    pub static NOT_FOUND_RECOVERY_MAX_BACKOFF: OptionSpec = OptionSpec {
        name: "not_found_recovery_max_backoff",
        connectors: CT,
        group: OptionGroup::Writer,
        kind: OptionKind::Duration,
        default: DefaultValue::Duration(ct::DEFAULT_NOT_FOUND_RECOVERY_MAX_BACKOFF),
        bound: Bound::AtLeastMillis,
        cross_rule: "at least `not_found_recovery_initial_backoff`",
        example: "5s",
        description: "Longest backoff of the queue-not-found retry.",
    };

    /// `not_found_recovery_max_attempts`.
    pub static NOT_FOUND_RECOVERY_MAX_ATTEMPTS: OptionSpec = OptionSpec {
        name: "not_found_recovery_max_attempts",
        connectors: CT,
        group: OptionGroup::Writer,
        kind: OptionKind::Int,
        default: DefaultValue::Int(ct::DEFAULT_NOT_FOUND_RECOVERY_MAX_ATTEMPTS as i64),
        bound: Bound::Positive,
        cross_rule: "",
        example: "5",
        description: "Attempts when the queue is not found, the first creation included: enough to ride out a queue that is briefly unavailable, few enough that a misspelt queue fails fast.",
    };
}

/// Bigtable options.
pub mod bigtable {
    use super::*;

    /// `table`.
    pub static TABLE: OptionSpec = OptionSpec {
        name: "table",
        connectors: BT,
        group: OptionGroup::Mapping,
        kind: OptionKind::Text,
        default: DefaultValue::None,
        bound: Bound::None,
        cross_rule: "this, `LOCATION` or `table_column` is required; when both this and `LOCATION` are given they must name the same table; a short id needs `project` and `instance`",
        example: "projects/demo/instances/main/tables/events",
        description: "The table every row is written to: `projects/PROJECT/instances/INSTANCE/tables/TABLE`, or a short table id.",
    };

    /// `instance`.
    pub static INSTANCE: OptionSpec = OptionSpec {
        name: "instance",
        connectors: BT,
        group: OptionGroup::Connection,
        kind: OptionKind::Text,
        default: DefaultValue::None,
        bound: Bound::None,
        cross_rule: "cannot be combined with `instance_column`; must agree with a full table name",
        example: "main",
        description: "Instance in which short table ids are resolved (a short id in `project`, or `projects/PROJECT/instances/INSTANCE`).",
    };

    /// `table_column`.
    pub static TABLE_COLUMN: OptionSpec = OptionSpec {
        name: "table_column",
        connectors: BT,
        group: OptionGroup::Mapping,
        kind: OptionKind::Column,
        default: DefaultValue::None,
        bound: Bound::None,
        cross_rule: "cannot be combined with a fixed table (`table` or `LOCATION`)",
        example: "table_name",
        description: "A string column naming each row's table (full name, or short id in the row's instance).",
    };

    /// `instance_column`.
    pub static INSTANCE_COLUMN: OptionSpec = OptionSpec {
        name: "instance_column",
        connectors: BT,
        group: OptionGroup::Mapping,
        kind: OptionKind::Column,
        default: DefaultValue::None,
        bound: Bound::None,
        cross_rule: "cannot be combined with `instance` or with a full table name",
        example: "instance_name",
        description: "A string column naming each row's instance (short id in `project`, or full name); short table ids are resolved in it.",
    };

    /// `row_key`.
    pub static ROW_KEY: OptionSpec = OptionSpec {
        name: "row_key",
        connectors: BT,
        group: OptionGroup::Mapping,
        kind: OptionKind::ColumnList,
        default: DefaultValue::None,
        bound: Bound::None,
        cross_rule: "required; string, binary or integer columns",
        example: "user_id, ts",
        description: "The column, or comma-separated columns, that make the row key. Several are joined with `row_key_delimiter`. Key columns are not written as cells.",
    };

    /// `row_key_delimiter`.
    pub static ROW_KEY_DELIMITER: OptionSpec = OptionSpec {
        name: "row_key_delimiter",
        connectors: BT,
        group: OptionGroup::Mapping,
        kind: OptionKind::Text,
        default: DefaultValue::Text(bt::DEFAULT_ROW_KEY_DELIMITER),
        bound: Bound::None,
        cross_rule: "",
        example: "|",
        description: "Text placed between the parts of a multi-column row key (may be empty).",
    };

    /// `column_family`.
    pub static COLUMN_FAMILY: OptionSpec = OptionSpec {
        name: "column_family",
        connectors: BT,
        group: OptionGroup::Mapping,
        kind: OptionKind::Text,
        default: DefaultValue::Text(bt::DEFAULT_COLUMN_FAMILY),
        bound: Bound::NotEmpty,
        cross_rule: "",
        example: "d",
        description: "Column family of the cells written from top-level columns (the qualifier is the column name). A struct column is a family of its own, its fields the qualifiers.",
    };

    /// `timestamp_column`.
    pub static TIMESTAMP_COLUMN: OptionSpec = OptionSpec {
        name: "timestamp_column",
        connectors: BT,
        group: OptionGroup::Mapping,
        kind: OptionKind::Column,
        default: DefaultValue::Unset("the writer's clock"),
        bound: Bound::None,
        cross_rule: "",
        example: "event_time",
        description: "A timestamp (or int64 microseconds) column giving every cell of the row its version; truncated to milliseconds, so a replay writes the same versions again.",
    };

    /// `null_handling`.
    pub static NULL_HANDLING: OptionSpec = OptionSpec {
        name: "null_handling",
        connectors: BT,
        group: OptionGroup::Mapping,
        kind: OptionKind::Enum(&["ignore", "delete"]),
        default: DefaultValue::Text("ignore"),
        bound: Bound::None,
        cross_rule: "",
        example: "delete",
        description: "What a null cell value does: `ignore` writes nothing for it; `delete` deletes that cell's existing versions.",
    };

    /// `auto_create_table`.
    pub static AUTO_CREATE_TABLE: OptionSpec = OptionSpec {
        name: "auto_create_table",
        connectors: BT,
        group: OptionGroup::Mapping,
        kind: OptionKind::Bool,
        default: DefaultValue::Bool(false),
        bound: Bound::None,
        cross_rule: "",
        example: "true",
        description: "When a write finds its table missing (NOT_FOUND), create it with the column families the mapping needs and write again under the `recovery_*` backoff. Nothing is created when the table is declared.",
    };

    /// `app_profile_id`.
    pub static APP_PROFILE_ID: OptionSpec = OptionSpec {
        name: "app_profile_id",
        connectors: BT,
        group: OptionGroup::Connection,
        kind: OptionKind::Text,
        default: DefaultValue::Unset("the instance's default profile"),
        bound: Bound::None,
        cross_rule: "",
        example: "batch-writes",
        description: "Application profile the writes are routed by.",
    };

    /// `batch_element_count_threshold`.
    pub static BATCH_ELEMENT_COUNT_THRESHOLD: OptionSpec = OptionSpec {
        name: "batch_element_count_threshold",
        connectors: BT,
        group: OptionGroup::Writer,
        kind: OptionKind::Int,
        default: DefaultValue::Int(bt::DEFAULT_BATCH_ELEMENT_COUNT_THRESHOLD),
        bound: Bound::IntRange {
            min: 1,
            max: bt::MAX_BATCH_ELEMENT_COUNT_THRESHOLD,
        },
        cross_rule: "",
        example: "500",
        description: "Entries (one per row, however many cells it writes) gathered before a MutateRows request is sent. The ceiling is one under the 20,000 entries the client's flow control admits, which the batch threshold must stay below. (The service itself refuses a request of more than 100,000 mutations.)",
    };

    /// `batch_request_byte_threshold`.
    pub static BATCH_REQUEST_BYTE_THRESHOLD: OptionSpec = OptionSpec {
        name: "batch_request_byte_threshold",
        connectors: BT,
        group: OptionGroup::Writer,
        kind: OptionKind::Int,
        default: DefaultValue::Bytes(bt::DEFAULT_BATCH_REQUEST_BYTE_THRESHOLD),
        bound: Bound::IntRange {
            min: 1,
            max: bt::MAX_BATCH_REQUEST_BYTE_THRESHOLD,
        },
        cross_rule: "",
        example: "4194304",
        description: "Bytes of mutations gathered before a request is sent; at most one byte under the 100 MiB the client's flow control admits.",
    };

    /// `max_in_flight_entries`.
    pub static MAX_IN_FLIGHT_ENTRIES: OptionSpec = OptionSpec {
        name: "max_in_flight_entries",
        connectors: BT,
        group: OptionGroup::Writer,
        kind: OptionKind::Int,
        default: DefaultValue::Int(bt::DEFAULT_MAX_IN_FLIGHT_ENTRIES as i64),
        bound: Bound::Positive,
        cross_rule: "above 20,000 the table is declared with a warning (the client's own flow-control budget)",
        example: "5000",
        description: "Entries the writer keeps unacknowledged. At the cap the writer waits for completions before taking more input.",
    };

    /// `max_in_flight_bytes`.
    pub static MAX_IN_FLIGHT_BYTES: OptionSpec = OptionSpec {
        name: "max_in_flight_bytes",
        connectors: BT,
        group: OptionGroup::Writer,
        kind: OptionKind::Int,
        default: DefaultValue::Bytes(bt::DEFAULT_MAX_IN_FLIGHT_BYTES),
        bound: Bound::Positive,
        cross_rule: "above 100 MiB the table is declared with a warning (the client's own flow-control budget)",
        example: "33554432",
        description: "Serialized bytes of the entries the writer keeps unacknowledged: the bound that limits memory, since one entry may be megabytes.",
    };

    /// `recovery_initial_backoff`.
    pub static RECOVERY_INITIAL_BACKOFF: OptionSpec = OptionSpec {
        name: "recovery_initial_backoff",
        connectors: BT,
        group: OptionGroup::Writer,
        kind: OptionKind::Duration,
        default: DefaultValue::Duration(bt::DEFAULT_RECOVERY_INITIAL_BACKOFF),
        bound: Bound::AtLeastMillis,
        cross_rule: "",
        example: "1s",
        description: "First wait before writing again after `auto_create_table` created a missing table.",
    };

    /// `recovery_max_backoff`.
    pub static RECOVERY_MAX_BACKOFF: OptionSpec = OptionSpec {
        name: "recovery_max_backoff",
        connectors: BT,
        group: OptionGroup::Writer,
        kind: OptionKind::Duration,
        default: DefaultValue::Duration(bt::DEFAULT_RECOVERY_MAX_BACKOFF),
        bound: Bound::AtLeastMillis,
        cross_rule: "at least `recovery_initial_backoff`",
        example: "30s",
        description: "Longest wait between attempts of the table auto-creation recovery.",
    };

    /// `recovery_max_attempts`.
    pub static RECOVERY_MAX_ATTEMPTS: OptionSpec = OptionSpec {
        name: "recovery_max_attempts",
        connectors: BT,
        group: OptionGroup::Writer,
        kind: OptionKind::Int,
        default: DefaultValue::Int(bt::DEFAULT_RECOVERY_MAX_ATTEMPTS as i64),
        bound: Bound::Positive,
        cross_rule: "",
        example: "5",
        description: "Write attempts of the table auto-creation recovery; when they run out the statement fails.",
    };

    /// `destination_idle_timeout`.
    pub static DESTINATION_IDLE_TIMEOUT: OptionSpec = OptionSpec {
        name: "destination_idle_timeout",
        connectors: BT,
        group: OptionGroup::Writer,
        kind: OptionKind::Duration,
        default: DefaultValue::Duration(bt::DEFAULT_DESTINATION_IDLE_TIMEOUT),
        bound: Bound::PositiveNanos,
        cross_rule: "",
        example: "1h",
        description: "How long a table may go without writes before a successful flush drops its batching state; a later row rebuilds it. An instance's client closes with its last table. To never evict, give a very long duration (up to about 292 years).",
    };

    /// `max_active_instances`.
    pub static MAX_ACTIVE_INSTANCES: OptionSpec = OptionSpec {
        name: "max_active_instances",
        connectors: BT,
        group: OptionGroup::Writer,
        kind: OptionKind::Int,
        default: DefaultValue::Int(bt::DEFAULT_MAX_ACTIVE_INSTANCES as i64),
        bound: Bound::Positive,
        cross_rule: "",
        example: "4",
        description: "Instance clients (open or closing) a writer holds. A new instance beyond the cap drains pending work and closes the least recently used client; a closing client keeps its slot until it has shut down.",
    };
}

/// Every option, in the order the reference lists them.
pub static REGISTRY: &[&OptionSpec] = &[
    // Connection and policy, shared.
    &common::CONNECTOR,
    &common::PROJECT,
    &common::ENDPOINT,
    &common::EMULATOR_HOST,
    &common::CREDENTIALS_FILE,
    &common::FAILURE_POLICY,
    &common::PER_DESTINATION_METRICS,
    &common::FORMAT,
    // Pub/Sub.
    &pubsub::TOPIC,
    &pubsub::TOPIC_COLUMN,
    &pubsub::DATA_COLUMN,
    &pubsub::ATTRIBUTES_COLUMN,
    &pubsub::ATTRIBUTE_COLUMNS,
    &pubsub::ORDERING_KEY_COLUMN,
    &pubsub::AUTO_CREATE_TOPIC,
    &pubsub::BATCH_ELEMENT_COUNT_THRESHOLD,
    &pubsub::BATCH_REQUEST_BYTE_THRESHOLD,
    &pubsub::BATCH_DELAY_THRESHOLD,
    &pubsub::RETRY_TOTAL_TIMEOUT,
    &pubsub::RETRY_INITIAL_DELAY,
    &pubsub::RETRY_DELAY_MULTIPLIER,
    &pubsub::RETRY_MAX_DELAY,
    &pubsub::RETRY_INITIAL_RPC_TIMEOUT,
    &pubsub::RETRY_RPC_TIMEOUT_MULTIPLIER,
    &pubsub::RETRY_MAX_RPC_TIMEOUT,
    &pubsub::RETRY_MAX_ATTEMPTS,
    &pubsub::ENABLE_MESSAGE_ORDERING,
    &pubsub::MAX_IN_FLIGHT_MESSAGES,
    &pubsub::MAX_IN_FLIGHT_BYTES,
    &pubsub::RECOVERY_INITIAL_BACKOFF,
    &pubsub::RECOVERY_MAX_BACKOFF,
    &pubsub::RECOVERY_MAX_ATTEMPTS,
    &pubsub::PUBLISH_PROGRESS_TIMEOUT,
    &pubsub::SHUTDOWN_TIMEOUT,
    &pubsub::MAX_ACTIVE_PUBLISHERS,
    &pubsub::DESTINATION_IDLE_TIMEOUT,
    &pubsub::MAX_CONSECUTIVE_REJECTIONS,
    // Cloud Tasks.
    &cloud_tasks::QUEUE,
    &cloud_tasks::LOCATION,
    &cloud_tasks::QUEUE_COLUMN,
    &cloud_tasks::URL,
    &cloud_tasks::URL_COLUMN,
    &cloud_tasks::HTTP_METHOD,
    &cloud_tasks::HEADERS,
    &cloud_tasks::HEADERS_COLUMN,
    &cloud_tasks::BODY_COLUMN,
    &cloud_tasks::SCHEDULE_TIME_COLUMN,
    &cloud_tasks::TASK_NAME_COLUMN,
    &cloud_tasks::OIDC_SERVICE_ACCOUNT_EMAIL,
    &cloud_tasks::OIDC_AUDIENCE,
    &cloud_tasks::OAUTH_SERVICE_ACCOUNT_EMAIL,
    &cloud_tasks::OAUTH_SCOPE,
    &cloud_tasks::DISPATCH_DEADLINE,
    &cloud_tasks::MAX_IN_FLIGHT_TASKS,
    &cloud_tasks::CHANNEL_POOL_SIZE,
    &cloud_tasks::RECOVERY_INITIAL_BACKOFF,
    &cloud_tasks::RECOVERY_MAX_BACKOFF,
    &cloud_tasks::RECOVERY_MAX_ATTEMPTS,
    &cloud_tasks::NOT_FOUND_RECOVERY_INITIAL_BACKOFF,
    &cloud_tasks::NOT_FOUND_RECOVERY_MAX_BACKOFF,
    &cloud_tasks::NOT_FOUND_RECOVERY_MAX_ATTEMPTS,
    // Bigtable.
    &bigtable::TABLE,
    &bigtable::INSTANCE,
    &bigtable::TABLE_COLUMN,
    &bigtable::INSTANCE_COLUMN,
    &bigtable::ROW_KEY,
    &bigtable::ROW_KEY_DELIMITER,
    &bigtable::COLUMN_FAMILY,
    &bigtable::TIMESTAMP_COLUMN,
    &bigtable::NULL_HANDLING,
    &bigtable::AUTO_CREATE_TABLE,
    &bigtable::APP_PROFILE_ID,
    &bigtable::BATCH_ELEMENT_COUNT_THRESHOLD,
    &bigtable::BATCH_REQUEST_BYTE_THRESHOLD,
    &bigtable::MAX_IN_FLIGHT_ENTRIES,
    &bigtable::MAX_IN_FLIGHT_BYTES,
    &bigtable::RECOVERY_INITIAL_BACKOFF,
    &bigtable::RECOVERY_MAX_BACKOFF,
    &bigtable::RECOVERY_MAX_ATTEMPTS,
    &bigtable::DESTINATION_IDLE_TIMEOUT,
    &bigtable::MAX_ACTIVE_INSTANCES,
];

/// A fixed budget: a connector setting that is not an option, listed in the reference so that
/// its value is documented where the options are.
#[derive(Debug)]
pub struct FixedBudget {
    /// The connector it belongs to.
    pub connector: ConnectorKind,
    /// What it bounds.
    pub name: &'static str,
    /// Its value.
    pub value: DefaultValue,
    /// Why it has this value.
    pub description: &'static str,
}

/// The connectors' fixed budgets (not seed options; see each connector's `options` module).
pub static FIXED_BUDGETS: &[FixedBudget] = &[
    FixedBudget {
        connector: CloudTasks,
        name: "progress timeout",
        value: DefaultValue::Duration(ct::PROGRESS_TIMEOUT),
        description: "How long the writer waits with no creation completing before the statement fails; the same budget as Pub/Sub's `publish_progress_timeout` default. The transient retry's attempt budget normally ends an outage first.",
    },
    FixedBudget {
        connector: CloudTasks,
        name: "shutdown timeout",
        value: DefaultValue::Duration(ct::SHUTDOWN_TIMEOUT),
        description: "Budget of releasing the client at the end of a statement (Pub/Sub's `shutdown_timeout` default).",
    },
    FixedBudget {
        connector: CloudTasks,
        name: "queue idle timeout",
        value: DefaultValue::Duration(ct::DESTINATION_IDLE_TIMEOUT),
        description: "How long a queue's per-destination state is kept without tasks (the other connectors' `destination_idle_timeout` default).",
    },
    FixedBudget {
        connector: CloudTasks,
        name: "active queues",
        value: DefaultValue::Int(ct::MAX_ACTIVE_QUEUES as i64),
        description: "Queues a writer keeps per-destination state for at once (Pub/Sub's `max_active_publishers` default); all queues share one client.",
    },
    FixedBudget {
        connector: Bigtable,
        name: "batch delay threshold",
        value: DefaultValue::Duration(bt::BATCH_DELAY_THRESHOLD),
        description: "How long the first entry of a batch waits for the batch to fill (the Java client's batcher default).",
    },
    FixedBudget {
        connector: Bigtable,
        name: "progress timeout",
        value: DefaultValue::Duration(bt::PROGRESS_TIMEOUT),
        description: "How long the writer waits with no MutateRows completing before the statement fails (Pub/Sub's `publish_progress_timeout` default).",
    },
    FixedBudget {
        connector: Bigtable,
        name: "shutdown timeout",
        value: DefaultValue::Duration(bt::SHUTDOWN_TIMEOUT),
        description: "Budget of one release of instance clients, at eviction or at the end of a statement (Pub/Sub's `shutdown_timeout` default).",
    },
];
