//! Options that more than one connector accepts with one meaning: the connection, the failure policy,
//! how a statement runs (writers, flush points), per-destination counters and the rejection
//! breaker. A connector accepts one of them by listing it among its own options. The payload
//! options (`schema`, `schema_location`, `schema_encoding`) are in [`payload`](super::payload).

use std::time::Duration;

use super::spec::{Bound, DefaultValue, OptionGroup, OptionKind, OptionSpec, Redact};

/// How a statement runs, whatever the connector: how many writers, and when they make flush
/// points. Parsed from `sink_parallelism`, `flush_interval` and `flush_rows`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunOptions {
    /// How many writers an INSERT runs; `None`: one per input partition.
    pub sink_parallelism: Option<usize>,
    /// A flush point this often; `None`: none by time.
    pub flush_interval: Option<Duration>,
    /// A flush point every this many rows read by a writer; `None`: none by count.
    pub flush_rows: Option<u64>,
}

/// The options every connector accepts, first in each connector's list (after `connector`,
/// which the registry adds): the connection, the failure policy, and how a statement runs
/// (writers, flush points). Each connector parses them once, into its
/// [`SharedOptions`](crate::connectors::shared::SharedOptions).
pub static SHARED_OPTIONS: [&OptionSpec; 11] = [
    &PROJECT,
    &ENDPOINT,
    &EMULATOR_HOST,
    &ALLOW_REMOTE_EMULATOR,
    &CREDENTIALS_FILE,
    &FAILURE_POLICY,
    &DEAD_LETTER_TOPIC,
    &DEAD_LETTER_PATH,
    &SINK_PARALLELISM,
    &FLUSH_INTERVAL,
    &FLUSH_ROWS,
];

/// Default of [`MAX_CONSECUTIVE_REJECTIONS`].
pub const DEFAULT_MAX_CONSECUTIVE_REJECTIONS: i32 = 100;

/// `project`.
pub static PROJECT: OptionSpec = OptionSpec {
    name: "project",
    group: OptionGroup::Connection,
    kind: OptionKind::Text,
    default: DefaultValue::None,
    bound: Bound::None,
    cross_rule: "needed when a destination is given as a short id",
    example: "demo",
    description: "Google Cloud project in which short topic, queue, instance and table ids are resolved.",
    redact: Redact::None,
};

/// `endpoint`.
pub static ENDPOINT: OptionSpec = OptionSpec {
    name: "endpoint",
    group: OptionGroup::Connection,
    kind: OptionKind::Text,
    default: DefaultValue::Unset("the service's public endpoint"),
    bound: Bound::None,
    cross_rule: "an `https://` URL with a host; `http://` is refused, since credentials would travel in plaintext (for a local emulator use `emulator_host`); when given, the emulator environment variable is not consulted",
    example: "https://private.googleapis.com",
    description: "Service endpoint to connect to instead of the default Google endpoint (a regional or private endpoint, for example). Always TLS with credentials.",
    redact: Redact::None,
};

/// `emulator_host`.
pub static EMULATOR_HOST: OptionSpec = OptionSpec {
    name: "emulator_host",
    group: OptionGroup::Connection,
    kind: OptionKind::Text,
    default: DefaultValue::Unset(
        "the connector's emulator environment variable, named in its section below",
    ),
    bound: Bound::None,
    cross_rule: "`host:port` on a loopback address (`localhost`, `127.0.0.0/8`, `[::1]`) unless `allow_remote_emulator` is `true`; cannot be combined with `endpoint`",
    example: "localhost:8085",
    description: "Address of a local emulator. The connection is then plaintext gRPC without credentials. The environment variable is read when the table is declared, and checked by the same rules.",
    redact: Redact::None,
};

/// `allow_remote_emulator`.
pub static ALLOW_REMOTE_EMULATOR: OptionSpec = OptionSpec {
    name: "allow_remote_emulator",
    group: OptionGroup::Connection,
    kind: OptionKind::Bool,
    default: DefaultValue::Bool(false),
    bound: Bound::None,
    cross_rule: "has an effect only with an emulator address (`emulator_host` or the emulator environment variable)",
    example: "true",
    description: "Accept an emulator address that is not a loopback address (an emulator in another container or on another machine). The rows then cross the network in plaintext; no credentials are ever sent to an emulator.",
    redact: Redact::None,
};

/// `credentials_file`.
pub static CREDENTIALS_FILE: OptionSpec = OptionSpec {
    name: "credentials_file",
    group: OptionGroup::Connection,
    kind: OptionKind::Text,
    default: DefaultValue::Unset("Application Default Credentials"),
    bound: Bound::None,
    cross_rule: "",
    example: "/etc/gcp/writer-key.json",
    description: "Path of a service-account key file used to authenticate. Ignored with an emulator.",
    redact: Redact::None,
};

/// `failure_policy`.
pub static FAILURE_POLICY: OptionSpec = OptionSpec {
    name: "failure_policy",
    group: OptionGroup::Writer,
    kind: OptionKind::Enum(&["fail", "drop", "dead_letter"]),
    default: DefaultValue::Text("fail"),
    bound: Bound::None,
    cross_rule: "`dead_letter` needs exactly one of `dead_letter_topic` and `dead_letter_path`",
    example: "drop",
    description: "What happens to a record the service refuses (confirmed by sending it alone) or a row that cannot be encoded: `fail` ends the statement with an error; `drop` counts it, skips it and goes on, bounded by `max_consecutive_rejections` where the connector has it; `dead_letter` does what `drop` does but first writes the row, with why it was refused, to `dead_letter_topic` or `dead_letter_path` (a write there that fails fails the statement).",
    redact: Redact::None,
};

/// `dead_letter_topic`.
pub static DEAD_LETTER_TOPIC: OptionSpec = OptionSpec {
    name: "dead_letter_topic",
    group: OptionGroup::Writer,
    kind: OptionKind::Text,
    default: DefaultValue::None,
    bound: Bound::None,
    cross_rule: "only with `failure_policy = 'dead_letter'`; cannot be combined with `dead_letter_path`; a short topic id needs `project`",
    example: "projects/demo/topics/dead-rows",
    description: "The Pub/Sub topic the `dead_letter` policy publishes each undeliverable row to: the message data is the row's payload (a Pub/Sub message's data, a task's body), else the row as JSON; its attributes say why (`connector`, `destination`, `table`, `error_class`, `status_code`, `error_message` cut at 1024 bytes, `attempts`, `timestamp`). The topic must exist: it is never created. A Pub/Sub sink publishes there through its own connection; the other sinks through `PUBSUB_EMULATOR_HOST` when it is set, else the public endpoint with their `credentials_file`.",
    redact: Redact::None,
};

/// `dead_letter_path`.
pub static DEAD_LETTER_PATH: OptionSpec = OptionSpec {
    name: "dead_letter_path",
    group: OptionGroup::Writer,
    kind: OptionKind::Text,
    default: DefaultValue::None,
    bound: Bound::None,
    cross_rule: "only with `failure_policy = 'dead_letter'`; cannot be combined with `dead_letter_topic`; a `file:///`, `gs://` or `s3://` URL whose store the session has registered",
    example: "file:///var/lib/pipeline/dead",
    description: "The folder the `dead_letter` policy writes undeliverable rows to: NDJSON objects per statement and writer, `<path>/<statement>-w<writer>-<n>.ndjson` (`n` from `000000`), each created at the first dead row after the previous one was completed, written as it goes (in parts), and completed at the next flush point (`flush_interval`, `flush_rows`) or at the end of the statement: a source message whose row is dead-lettered is acknowledged only once that object is complete (a subscription source also completes its own object once the oldest message in it was held for half of `max_lease_duration`). Each line holds `connector`, `destination`, `table`, `error_class`, `status_code`, `error_message`, `attempts`, `timestamp`, the `payload` (as text, or `payload_base64`) and the `row` as a JSON object.",
    redact: Redact::None,
};

/// Largest `sink_parallelism`.
pub const MAX_SINK_PARALLELISM: i64 = 1024;

/// `sink_parallelism`.
pub static SINK_PARALLELISM: OptionSpec = OptionSpec {
    name: "sink_parallelism",
    group: OptionGroup::Writer,
    kind: OptionKind::Int,
    default: DefaultValue::Unset(
        "one writer per input partition: `datafusion.execution.target_partitions` when the sink routes by key",
    ),
    bound: Bound::IntRange {
        min: 1,
        max: MAX_SINK_PARALLELISM,
    },
    cross_rule: "at most the input's partition count (the session's `target_partitions` for a sink that routes by key); a larger value runs one writer per partition",
    example: "1",
    description: "How many writers an INSERT runs at once, each with its own flow-control core: its own batches and client pool, and a 1/N share of the statement's in-flight caps (`max_in_flight_*`) and rate cap, so the statement as a whole stays within them. `1` runs one writer for the whole statement.",
    redact: Redact::None,
};

/// `flush_interval`.
pub static FLUSH_INTERVAL: OptionSpec = OptionSpec {
    name: "flush_interval",
    group: OptionGroup::Writer,
    kind: OptionKind::Duration,
    default: DefaultValue::Unset("flush only at the end of the input"),
    bound: Bound::AtLeastMillis,
    cross_rule: "",
    example: "1s",
    description: "Make a flush point this often while the statement runs: each writer sends every open batch, waits until every row it admitted is resolved, releases destinations idle for longer than `destination_idle_timeout`, and reports a progress event (a log line at info, and the embedder's observer). For an unbounded input, this is what says how far the job has got. Input is not read during the wait.",
    redact: Redact::None,
};

/// `flush_rows`.
pub static FLUSH_ROWS: OptionSpec = OptionSpec {
    name: "flush_rows",
    group: OptionGroup::Writer,
    kind: OptionKind::Int,
    default: DefaultValue::Unset("no flush point by row count"),
    bound: Bound::Positive,
    cross_rule: "counted per writer; may be combined with `flush_interval` (whichever comes first)",
    example: "100000",
    description: "Make a flush point (see `flush_interval`) each time a writer has read this many rows since its last one.",
    redact: Redact::None,
};

/// `per_destination_metrics`.
pub static PER_DESTINATION_METRICS: OptionSpec = OptionSpec {
    name: "per_destination_metrics",
    group: OptionGroup::Writer,
    kind: OptionKind::Bool,
    default: DefaultValue::Bool(false),
    bound: Bound::None,
    cross_rule: "",
    example: "true",
    description: "Also count records sent and send errors per topic, queue or table, beside the sink totals. Off by default because a per-row destination column can name an unbounded set of destinations; turn it on when they are few and known.",
    redact: Redact::None,
};

/// `max_consecutive_rejections`.
pub static MAX_CONSECUTIVE_REJECTIONS: OptionSpec = OptionSpec {
    name: "max_consecutive_rejections",
    group: OptionGroup::Writer,
    kind: OptionKind::Int,
    default: DefaultValue::Int(DEFAULT_MAX_CONSECUTIVE_REJECTIONS as i64),
    bound: Bound::PositiveOrUnbounded,
    cross_rule: "",
    example: "-1",
    description: "With `failure_policy = 'drop'` or `'dead_letter'`, this many confirmed rejections in a row, with no record delivered between them, fail the statement: the pipeline is broken rather than seeing the odd bad record. Any delivery resets the count; rows the encoder refuses do not count. `-1` never fails.",
    redact: Redact::None,
};
