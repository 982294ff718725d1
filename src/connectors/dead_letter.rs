//! The two dead-letter destinations of the `dead_letter` failure policy: a Pub/Sub topic
//! (`dead_letter_topic`) and a folder of NDJSON objects in an object store
//! (`dead_letter_path`). Both implement the core's [`DeadLetterSink`]; the core hands them one
//! [`DeadRow`] per row the encoder rejected or the service refused (confirmed alone).
//!
//! - **Topic**: one `Publish` per dead row, through the transport of the connector that
//!   provides dead-letter topics ([`DeadLetterTopics`], the Pub/Sub connector's). The
//!   message data is the row's payload where the record has one (a Pub/Sub message's data, a
//!   Cloud Tasks body), else the row as JSON; the attributes say why (see [`ATTRIBUTES`]). A
//!   transient status is retried a few times ([`TOPIC_ATTEMPTS`]); any other failure (a
//!   missing topic included: the topic is never created) fails the statement.
//! - **Path**: `<path>/<statement>-w<writer>-<n>.ndjson` (`n` counts the writer's objects
//!   from `000000`), one JSON line per dead row, through the object store the session
//!   registered for the URL (`RuntimeEnv`; `file://` is always there). An object is a multipart
//!   upload opened at the first dead row after the previous object was completed, written as
//!   rows come (parts of [`PART_BYTES`], at most [`PARTS_IN_FLIGHT`] uploading, so memory stays
//!   bounded) and completed at the next flush point ([`DeadLetterSink::roll`]; a source's
//!   partition also on its own bound) or when the statement ends, whichever comes first: in a
//!   statement that never ends, its rows are stored (and the messages they came from
//!   acknowledged) within a flush interval (ADR 0071). Until completed an object does not
//!   exist under its name: a process that dies mid-statement leaves an incomplete upload (a
//!   local file store: a `<name>#<n>` staging file next to it; `gs://`, `s3://`: an upload the
//!   bucket's lifecycle rules clean up), not a half-written object. A statement cancelled by
//!   dropping its future still completes the object, from a task its dropped writer spawns
//!   (within one shutdown budget).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::object_store::path::Path as StorePath;
use datafusion::object_store::{ObjectStore, ObjectStoreExt as _, WriteMultipart};
use futures::future::BoxFuture;
use serde_json::{Map, Value};

use super::descriptor::ConnectorKind;
use crate::core::{DeadLetterSink, DeadPayload, DeadRow, FailurePolicy};
use crate::encode::json::JsonRowEncoder;
use crate::error::{Error, Result};
use crate::options::{ClientCore, ConnectionOptions, EnvLookup, Service, is_loopback_host};
use crate::options::{ParsedOptions, common};

/// The Pub/Sub limit on an attribute value, in bytes (docs/service_facts.md): a longer error
/// message is cut there, at a character boundary.
pub const MAX_ATTRIBUTE_VALUE_BYTES: usize = 1024;

/// The attributes of a dead-letter message (and the fields of an NDJSON line, besides the
/// row): which connector, where the row was going (left out when the encoder rejected it before
/// it had a destination), the table, `encoding` or `rejected`, the status code (left out for an
/// encoding rejection), the message, send attempts, and when (RFC 3339, UTC).
pub const ATTRIBUTES: [&str; 8] = [
    "connector",
    "destination",
    "table",
    "error_class",
    "status_code",
    "error_message",
    "attempts",
    "timestamp",
];

/// Attempts of one dead-letter `Publish` when the status is transient.
pub const TOPIC_ATTEMPTS: u32 = 5;
/// Deadline of one dead-letter `Publish` attempt.
pub const TOPIC_TIMEOUT: Duration = Duration::from_secs(60);
/// Size of one uploaded part of a dead-letter object.
pub const PART_BYTES: usize = 5 * 1024 * 1024;
/// Parts of one dead-letter object uploading at once.
pub const PARTS_IN_FLIGHT: usize = 2;

/// Opens the dead-letter sink of a topic for one writer: the full topic name, where to
/// connect, the writer's context, and how errors name the target.
pub type OpenTopicFn = fn(
    String,
    ClientCore,
    DeadLetterContext,
    String,
) -> BoxFuture<'static, Result<Arc<dyn DeadLetterSink>>>;

/// What a connector that publishes dead letters to topics supplies (the Pub/Sub connector):
/// its service, how a `dead_letter_topic` value resolves to a full name, and how a topic's
/// dead-letter sink opens. Every connector's options take it, so that the generic code here
/// names no connector.
pub struct DeadLetterTopics {
    /// The topic service: its emulator variable is read for a table of another connector.
    pub service: Service,
    /// A full topic name from the option's value and the table's `project`; the error is
    /// the rule the value breaks.
    pub resolve: fn(&str, Option<&str>) -> std::result::Result<String, String>,
    /// Opens a topic's dead-letter sink (never creating the topic).
    pub open: OpenTopicFn,
}

impl std::fmt::Debug for DeadLetterTopics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadLetterTopics")
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

/// Where a table's dead rows go, as its options say (checked when the table is declared).
#[derive(Debug, Clone)]
pub enum DeadLetterTarget {
    /// `dead_letter_topic`: a full topic name and the connection to publish through.
    Topic {
        /// `projects/P/topics/T`.
        topic: String,
        /// Where the topic's service is reached.
        connection: ClientCore,
        /// The connector that publishes to it.
        via: &'static DeadLetterTopics,
    },
    /// `dead_letter_path`: the folder URL.
    Path {
        /// `file:///...`, `gs://bucket/...`, `s3://bucket/...`.
        url: url::Url,
    },
}

impl PartialEq for DeadLetterTarget {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (
                DeadLetterTarget::Topic {
                    topic, connection, ..
                },
                DeadLetterTarget::Topic {
                    topic: t,
                    connection: c,
                    ..
                },
            ) => topic == t && connection == c,
            (DeadLetterTarget::Path { url }, DeadLetterTarget::Path { url: u }) => url == u,
            _ => false,
        }
    }
}

impl Eq for DeadLetterTarget {}

impl DeadLetterTarget {
    /// Reads `dead_letter_topic` and `dead_letter_path` against the failure policy: the
    /// `dead_letter` policy needs exactly one of them, and neither is accepted under another
    /// policy. `connection` is the sink's own: a sink of the topics' own service publishes its
    /// dead letters through it; the other connectors publish through the topic service's
    /// emulator variable (`PUBSUB_EMULATOR_HOST`) when set (checked as their own emulator
    /// address is), else the public endpoint with their `credentials_file`.
    pub fn from_parsed(
        p: &ParsedOptions,
        policy: FailurePolicy,
        kind: ConnectorKind,
        connection: &ConnectionOptions,
        env: EnvLookup<'_>,
        topics: &'static DeadLetterTopics,
    ) -> Result<Option<Self>> {
        let topic = p.non_empty_text(&common::DEAD_LETTER_TOPIC)?;
        let path = p.non_empty_text(&common::DEAD_LETTER_PATH)?;
        if policy != FailurePolicy::DeadLetter {
            for (spec, value) in [
                (&common::DEAD_LETTER_TOPIC, topic),
                (&common::DEAD_LETTER_PATH, path),
            ] {
                if let Some(v) = value {
                    return Err(spec.invalid(
                        v,
                        "is used only with failure_policy = 'dead_letter' (set failure_policy, \
                         or remove this option)",
                    ));
                }
            }
            return Ok(None);
        }
        match (topic, path) {
            (Some(_), Some(path)) => Err(common::DEAD_LETTER_PATH.invalid(
                path,
                "give one of dead_letter_topic and dead_letter_path, not both",
            )),
            (None, None) => Err(Error::MissingOption {
                option: "dead_letter_topic".into(),
                rule: "failure_policy = 'dead_letter' needs dead_letter_topic or \
                       dead_letter_path (exactly one)"
                    .into(),
            }),
            (Some(t), None) => {
                let topic = (topics.resolve)(t, connection.project.as_deref())
                    .map_err(|rule| common::DEAD_LETTER_TOPIC.invalid(t, rule))?;
                let connection = topic_connection(p, kind, connection, env, topics.service)?;
                Ok(Some(DeadLetterTarget::Topic {
                    topic,
                    connection,
                    via: topics,
                }))
            }
            (None, Some(u)) => Ok(Some(DeadLetterTarget::Path {
                url: parse_path(u).map_err(|rule| common::DEAD_LETTER_PATH.invalid(u, rule))?,
            })),
        }
    }

    /// The option and its value, for errors (`dead_letter_topic 'projects/p/topics/t'`).
    pub fn describe(&self) -> String {
        match self {
            DeadLetterTarget::Topic { topic, .. } => format!("dead_letter_topic '{topic}'"),
            DeadLetterTarget::Path { url } => format!("dead_letter_path '{url}'"),
        }
    }
}

/// The connection of a dead-letter topic on `service`.
fn topic_connection(
    p: &ParsedOptions,
    kind: ConnectorKind,
    connection: &ConnectionOptions,
    env: EnvLookup<'_>,
    service: Service,
) -> Result<ClientCore> {
    if kind.service() == service {
        return Ok(connection.client_core());
    }
    let var = service.emulator_env_var;
    let emulator = ConnectionOptions::emulator_from_env(var, env)?;
    let allow_remote = p.bool(&common::ALLOW_REMOTE_EMULATOR)?.unwrap_or(false);
    if let Some(e) = &emulator
        && !allow_remote
        && !is_loopback_host(&e.host)
    {
        return Err(Error::invalid(
            format!("dead_letter_topic (emulator from environment variable {var})"),
            e.host.clone(),
            "not a loopback address; set allow_remote_emulator = 'true' to accept it",
        ));
    }
    Ok(ClientCore {
        endpoint: None,
        emulator_host: emulator.map(|e| e.host),
        credentials_file: connection.credentials_file.clone(),
    })
}

/// Checks a `dead_letter_path` URL: `file:///absolute/folder`, `gs://bucket[/folder]` or
/// `s3://bucket[/folder]`, with no user name, query or fragment.
fn parse_path(text: &str) -> std::result::Result<url::Url, String> {
    let url = url::Url::parse(text.trim()).map_err(|e| {
        format!(
            "expected a URL like 'file:///var/dead', 'gs://bucket/dead' or 's3://bucket/dead' ({e})"
        )
    })?;
    match url.scheme() {
        "file" => {
            if url.host_str().is_some_and(|h| !h.is_empty()) {
                return Err("a file:// URL names a local folder: 'file:///absolute/path'".into());
            }
        }
        "gs" | "s3" => {
            if url.host_str().is_none_or(str::is_empty) {
                return Err(format!("a {}:// URL needs a bucket", url.scheme()));
            }
        }
        other => {
            return Err(format!(
                "'{other}://' is not a dead-letter store: use file://, gs:// or s3://"
            ));
        }
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("a dead-letter URL carries no user name or password".into());
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err("a dead-letter URL has no query or fragment".into());
    }
    Ok(url)
}

/// What a dead letter says about the statement besides the row: the connector, the table,
/// and which statement and writer wrote it.
#[derive(Debug, Clone)]
pub struct DeadLetterContext {
    /// The connector of the sink.
    pub connector: ConnectorKind,
    /// The table's name (empty when the sink was built without SQL).
    pub table: String,
    /// The statement's id (one per INSERT).
    pub statement: String,
    /// The writer (its partition), from 0.
    pub writer: usize,
    /// The session's object stores (a default runtime, with `file://` only, when `None`).
    pub runtime: Option<Arc<RuntimeEnv>>,
}

/// Opens the dead-letter sink of `target` for one writer of a statement: a topic connects its
/// Pub/Sub transport (lazily for an emulator); a path resolves its object store (an
/// unregistered scheme or bucket fails here, before anything is sent). Nothing is written yet.
pub async fn open(
    target: &DeadLetterTarget,
    context: DeadLetterContext,
) -> Result<Arc<dyn DeadLetterSink>> {
    match target {
        DeadLetterTarget::Topic {
            topic,
            connection,
            via,
        } => {
            (via.open)(
                topic.clone(),
                connection.clone(),
                context,
                target.describe(),
            )
            .await
        }
        DeadLetterTarget::Path { url } => {
            let describe = target.describe();
            let store_url =
                ObjectStoreUrl::parse(&url[..url::Position::BeforePath]).map_err(|e| {
                    Error::DeadLetter {
                        target: describe.clone(),
                        message: e.to_string(),
                    }
                })?;
            let runtime = context
                .runtime
                .clone()
                .unwrap_or_else(|| Arc::new(RuntimeEnv::default()));
            let store = runtime
                .object_store(&store_url)
                .map_err(|e| Error::DeadLetter {
                    target: describe.clone(),
                    message: format!("no object store is registered for it: {e}"),
                })?;
            let folder = url.path().trim_end_matches('/');
            let prefix = format!("{folder}/{}-w{}", context.statement, context.writer);
            // Checked here, so that an unusable name fails before anything is written.
            object_location(&prefix, 0).map_err(|e| Error::DeadLetter {
                target: describe.clone(),
                message: e.to_string(),
            })?;
            Ok(Arc::new(PathSink {
                store,
                prefix,
                context,
                describe,
                state: tokio::sync::Mutex::new(PathState {
                    upload: Upload::NotStarted,
                    objects: 0,
                    location: None,
                }),
            }))
        }
    }
}

/// The row of a rejected encoding: the source row as one JSON object (`None` when a column
/// has a type the JSON encoder refuses).
pub fn source_row(batch: &RecordBatch, row: usize) -> DeadPayload {
    let columns: Vec<usize> = (0..batch.num_columns()).collect();
    let row = JsonRowEncoder::new(batch.schema_ref(), &columns)
        .and_then(|encoder| {
            let mut rows = encoder.bind(batch)?;
            let mut out = Vec::new();
            rows.write_row(row, &mut out);
            Ok(out)
        })
        .ok()
        .and_then(|json| serde_json::from_slice::<Map<String, Value>>(&json).ok());
    DeadPayload { payload: None, row }
}

/// Bytes as a JSON value: a string when they are UTF-8, else `{"base64": "..."}`.
pub fn bytes_value(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(text) => Value::String(text.to_string()),
        Err(_) => {
            let mut m = Map::new();
            m.insert(
                "base64".into(),
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes)),
            );
            Value::Object(m)
        }
    }
}

/// Cuts `text` to at most `max` bytes, at a character boundary.
pub fn truncate_at_char(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Now, as RFC 3339 in UTC with milliseconds.
fn now_rfc3339() -> String {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let seconds = i64::try_from(since.as_secs()).unwrap_or(i64::MAX);
    match chrono::DateTime::from_timestamp(seconds, since.subsec_nanos()) {
        Some(t) => t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        None => String::new(),
    }
}

/// The "why" fields of a dead row, as strings (the message attributes; NDJSON fields).
pub fn reasons(context: &DeadLetterContext, row: &DeadRow) -> Vec<(&'static str, String)> {
    let mut out = vec![("connector", context.connector.name().to_string())];
    if !row.destination.is_empty() {
        out.push(("destination", row.destination.clone()));
    }
    if !context.table.is_empty() {
        out.push(("table", context.table.clone()));
    }
    out.push(("error_class", row.class.name().to_string()));
    if let Some(code) = row.code {
        out.push(("status_code", code.to_string()));
    }
    out.push((
        "error_message",
        truncate_at_char(&row.message, MAX_ATTRIBUTE_VALUE_BYTES).to_string(),
    ));
    out.push(("attempts", row.attempts.to_string()));
    out.push(("timestamp", now_rfc3339()));
    out
}

/// The location of object `n` of a writer whose objects are named `prefix-<n>.ndjson`.
fn object_location(
    prefix: &str,
    n: u64,
) -> std::result::Result<StorePath, datafusion::object_store::path::Error> {
    StorePath::from_url_path(format!("{prefix}-{n:06}.ndjson"))
}

/// Where the current dead-letter object stands.
enum Upload {
    /// No dead row since the last completed object: no object open.
    NotStarted,
    /// Being written.
    Writing(WriteMultipart),
    /// Failed (nothing more is written), or the statement's last object was completed.
    Done,
}

/// A path sink's objects: the one being written, and how many were opened.
struct PathState {
    upload: Upload,
    /// Objects opened so far (the next one is numbered by it).
    objects: u64,
    /// The object being written.
    location: Option<StorePath>,
}

/// Dead letters written as NDJSON objects, one after another for each statement and writer:
/// each completed at a flush point or at the end.
struct PathSink {
    store: Arc<dyn ObjectStore>,
    /// `<folder>/<statement>-w<writer>`: object `n` is `<prefix>-<n>.ndjson`.
    prefix: String,
    context: DeadLetterContext,
    describe: String,
    state: tokio::sync::Mutex<PathState>,
}

impl PathSink {
    fn error(&self, location: Option<&StorePath>, e: impl std::fmt::Display) -> Error {
        let at = location.map_or_else(|| self.prefix.clone(), ToString::to_string);
        Error::DeadLetter {
            target: self.describe.clone(),
            message: format!("{at}: {e}"),
        }
    }

    /// One NDJSON line for `row`.
    fn line(&self, row: DeadRow) -> Vec<u8> {
        let mut object: Map<String, Value> = reasons(&self.context, &row)
            .into_iter()
            .map(|(k, v)| (k.to_string(), Value::String(v)))
            .collect();
        if let Some(payload) = row.data.payload {
            match String::from_utf8(payload) {
                Ok(text) => object.insert("payload".into(), Value::String(text)),
                Err(bytes) => object.insert(
                    "payload_base64".into(),
                    Value::String(
                        base64::engine::general_purpose::STANDARD.encode(bytes.into_bytes()),
                    ),
                ),
            };
        }
        object.insert(
            "row".into(),
            row.data.row.map_or(Value::Null, Value::Object),
        );
        let mut line = Value::Object(object).to_string().into_bytes();
        line.push(b'\n');
        line
    }

    /// Completes the object being written, if any; `next` is what the state becomes
    /// ([`Upload::NotStarted`] to go on with a new object, [`Upload::Done`] at the end).
    async fn complete(&self, next: Upload) -> Result<()> {
        let mut state = self.state.lock().await;
        match std::mem::replace(&mut state.upload, Upload::Done) {
            Upload::Writing(writer) => {
                let location = state.location.take();
                writer
                    .finish()
                    .await
                    .map_err(|e| self.error(location.as_ref(), e))?;
                if let Some(object) = &location {
                    tracing::info!(%object, "dead letters written");
                }
                state.upload = next;
                Ok(())
            }
            Upload::NotStarted => {
                state.upload = next;
                Ok(())
            }
            Upload::Done => Ok(()),
        }
    }
}

#[async_trait]
impl DeadLetterSink for PathSink {
    fn describe(&self) -> String {
        self.describe.clone()
    }

    async fn write(&self, row: DeadRow) -> Result<()> {
        let line = self.line(row);
        let mut state = self.state.lock().await;
        if matches!(state.upload, Upload::NotStarted) {
            let location =
                object_location(&self.prefix, state.objects).map_err(|e| self.error(None, e))?;
            state.objects += 1;
            let started = self
                .store
                .put_multipart(&location)
                .await
                .map_err(|e| self.error(Some(&location), e))?;
            state.upload =
                Upload::Writing(WriteMultipart::new_with_chunk_size(started, PART_BYTES));
            state.location = Some(location);
        }
        let PathState {
            upload, location, ..
        } = &mut *state;
        match upload {
            Upload::Writing(writer) => {
                if let Err(e) = writer.wait_for_capacity(PARTS_IN_FLIGHT).await {
                    *upload = Upload::Done;
                    return Err(self.error(location.as_ref(), e));
                }
                writer.write(&line);
                Ok(())
            }
            _ => Err(self.error(
                location.as_ref(),
                "the dead letters were already completed, or an earlier write failed",
            )),
        }
    }

    fn stored_on_write(&self) -> bool {
        false
    }

    async fn roll(&self) -> Result<()> {
        self.complete(Upload::NotStarted).await
    }

    async fn finish(&self) -> Result<()> {
        self.complete(Upload::Done).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_message_is_cut_at_a_char_boundary() {
        let text = "é".repeat(600);
        let cut = truncate_at_char(&text, MAX_ATTRIBUTE_VALUE_BYTES);
        assert_eq!(cut.len(), 1024);
        assert!(cut.chars().all(|c| c == 'é'));
        let odd = format!("a{text}");
        assert_eq!(truncate_at_char(&odd, 1024).len(), 1023);
        assert_eq!(truncate_at_char("short", 1024), "short");
    }

    fn bigtable_target(
        pairs: &[(&str, &str)],
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<DeadLetterTarget>> {
        let mut all = vec![
            ("table", "projects/p/instances/i/tables/t"),
            ("row_key", "id"),
            ("failure_policy", "dead_letter"),
        ];
        all.extend_from_slice(pairs);
        let raw = crate::options::RawOptions::from_pairs(
            all.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        )?;
        <crate::connectors::bigtable::options::BigtableSinkOptions as crate::connectors::TableOptions>::from_raw_with_env(
            None, &raw, env,
        )
        .map(|o| o.shared.dead_letter)
    }

    #[test]
    fn another_sinks_dead_letter_topic_goes_through_pubsub_emulator_host() {
        let topic = [("dead_letter_topic", "projects/p/topics/dead")];
        let local = |var: &str| (var == "PUBSUB_EMULATOR_HOST").then(|| "localhost:8085".into());
        match bigtable_target(&topic, &local).unwrap() {
            Some(DeadLetterTarget::Topic {
                topic, connection, ..
            }) => {
                assert_eq!(topic, "projects/p/topics/dead");
                assert_eq!(connection.emulator_host.as_deref(), Some("localhost:8085"));
                // Never created: see pubsub::dead_letter's a_dead_letter_topic_is_never_created.
            }
            other => panic!("unexpected {other:?}"),
        }
        // Without the variable: the public endpoint (no emulator).
        match bigtable_target(&topic, &|_| None).unwrap() {
            Some(DeadLetterTarget::Topic { connection, .. }) => {
                assert_eq!(connection.emulator_host, None);
                assert_eq!(connection.endpoint, None);
            }
            other => panic!("unexpected {other:?}"),
        }
        // A remote emulator address is refused, as the sink's own would be.
        let remote = |var: &str| (var == "PUBSUB_EMULATOR_HOST").then(|| "10.1.2.3:8085".into());
        let error = bigtable_target(&topic, &remote).unwrap_err().to_string();
        assert!(error.contains("dead_letter_topic"), "{error}");
        assert!(error.contains("PUBSUB_EMULATOR_HOST"), "{error}");
        let allowed = [topic[0], ("allow_remote_emulator", "true")];
        assert!(bigtable_target(&allowed, &remote).is_ok());
    }

    #[test]
    fn dead_letter_paths_are_checked() {
        assert!(parse_path("file:///tmp/dead").is_ok());
        assert!(parse_path("gs://bucket/dead").is_ok());
        assert!(parse_path("s3://bucket").is_ok());
        for (bad, says) in [
            ("/tmp/dead", "expected a URL"),
            ("http://example.com/x", "not a dead-letter store"),
            ("gs:///x", "needs a bucket"),
            ("file://host/x", "local folder"),
            ("s3://user:pw@bucket/x", "user name"),
            ("gs://bucket/x?y=1", "query"),
        ] {
            let e = parse_path(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
