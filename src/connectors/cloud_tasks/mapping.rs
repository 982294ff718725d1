//! Arrow rows to Cloud Tasks HTTP tasks (pure: no I/O).
//!
//! # Which column becomes what
//!
//! | Part of the task | Source |
//! |---|---|
//! | queue (the `CreateTask` parent) | the `queue_column` value (a full `projects/P/locations/L/queues/Q` name, or a queue id resolved in `project` and `location`), else the table's fixed queue (`queue` or `LOCATION`). A null or empty value in the queue column is a rejected row: there is no fixed queue to fall back to, since the two cannot be combined |
//! | `http_request.url` | the `url` option, or the `url_column` value (null or empty: a rejected row). Either must be `http://` or `https://` with a host and at most [`MAX_URL_LEN`] characters once percent-encoded |
//! | `http_request.http_method` | the `http_method` option (`POST` by default) |
//! | `http_request.headers` | the `headers` option, then the `headers_column` map entries (null map: none; null values skipped). A row entry replaces an option header of the same name, compared without regard to case. With an encoded body (`json`, `avro`, `protobuf`) and no `Content-Type` among the option headers, the body's media type ([`body_media_type`]) is added first, so a row can still replace it |
//! | `http_request.body` | only for `POST`, `PUT` and `PATCH`: the `body_column` value as it is (null: empty), else the row's other columns encoded by `format` — `json` (see [`crate::encode::json`]), `raw` (the one remaining string or binary column), or `avro` / `protobuf` to match the schema ([`crate::encode::schema`]; a row the schema refuses is a rejected row naming the field). With another method no body is sent, and the columns without a role are not sent anywhere |
//! | `http_request.oidc_token` / `oauth_token` | the `oidc_*` / `oauth_*` options; an empty audience or scope leaves the service default (the task's URL, `cloud-platform`) |
//! | `schedule_time` | the `schedule_time_column` value, truncated to whole microseconds (the service's precision, so that a replay sends the same value); null: unset, which the service reads as "now" |
//! | `name` | the `task_name_column` value: a task id (`[A-Za-z0-9_-]`, 1 to 500 characters) becomes `<queue>/tasks/<id>`; a full task name must belong to the row's queue. Null or empty: unnamed (the service picks a name) |
//! | `dispatch_deadline` | the `dispatch_deadline` option (15 s to 30 min, checked when the table is declared) |
//!
//! The role columns (queue, URL, headers, schedule time, task name and body column) are never
//! part of an encoded body. With a `body_column`, every other column must have a role: a
//! column that would silently go nowhere is a schema error (as for Pub/Sub's data column,
//! ADR 0013). One column cannot have two roles.
//!
//! # Limits
//!
//! A row that breaks a Cloud Tasks limit is refused before it is sent, as an [`Error::Encode`]
//! naming the row, the column and the limit (a serializer rejection for the failure policy):
//! the serialized task at most [`MAX_TASK_BYTES`], the URL at most [`MAX_URL_LEN`] characters,
//! the headers under [`MAX_HEADERS_BYTES`], a task id of the allowed characters and length. The
//! rest of the batch is encoded as usual.
//!
//! # Records
//!
//! A [`TaskRecord`] holds the serialized `google.cloud.tasks.v2.Task`: its length is exactly
//! what the task size limit counts, and a `CreateTaskRequest` is built from it by concatenation
//! (see [`write_create_task_request`]), so a retry re-encodes nothing.
//!
//! ```
//! use gcp_sql::connectors::TableOptions;
//! use std::sync::Arc;
//! use arrow::array::{Int64Array, RecordBatch};
//! use arrow::datatypes::{DataType, Field, Schema};
//! use gcp_sql::connectors::cloud_tasks::mapping::CloudTasksMapping;
//! use gcp_sql::connectors::cloud_tasks::options::CloudTasksSinkOptions;
//! use gcp_sql::options::RawOptions;
//!
//! let raw = RawOptions::from_pairs([
//!     ("url".to_string(), "https://worker.example.com/run".to_string()),
//!     ("headers".to_string(), "X-Source: gcp-sql".to_string()),
//! ])?;
//! let options = CloudTasksSinkOptions::from_raw(Some("projects/demo/locations/us-central1/queues/jobs"), &raw)?;
//! let schema = Arc::new(Schema::new(vec![Field::new("user_id", DataType::Int64, false)]));
//! let mapping = CloudTasksMapping::new(&options, &schema)?;
//! let batch = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![7]))])?;
//! let mut out = Vec::new();
//! mapping.encode_batch(&batch, 0, &mut out)?;
//! let envelope = out.remove(0)?;
//! assert_eq!(&*envelope.destination, "projects/demo/locations/us-central1/queues/jobs");
//! let request = envelope.record.http_request()?.expect("an HTTP task");
//! assert_eq!(request.url, "https://worker.example.com/run");
//! assert_eq!(request.body, br#"{"user_id":7}"#);
//! assert_eq!(request.headers["Content-Type"], "application/json");
//! assert_eq!(request.headers["X-Source"], "gcp-sql");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{
    DataType, Schema, TimeUnit, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType,
};
use gcloud_sdk::google::cloud::tasks::v2 as proto;
use prost::Message as _;

use super::names;
use super::options::{CloudTasksSinkOptions, HttpMethod, TaskAuth};
use crate::core::{Destination, Envelope};
use crate::encode::json::JsonRowEncoder;
use crate::encode::raw::{BytesColumn, RawEncoder};
use crate::encode::schema::{
    RowPayload, SchemaEncoding, SchemaLocation, SchemaRowEncoder, SchemaType,
};
use crate::error::{Error, Result};
use crate::options::PayloadFormat;
use crate::options::names::unknown_column;

/// Largest serialized task, in bytes. Source: Cloud Tasks quotas ("Maximum task size: 100 KB",
/// see docs/service_facts.md), read as 100 × 1024 bytes, the push-task limit Cloud Tasks inherited
/// from App Engine task queues. (Google's current quota page lists a larger maximum; the sink keeps the
/// stricter figure it was specified with, so a task it accepts is accepted everywhere.)
pub const MAX_TASK_BYTES: u64 = 100 * 1024;
/// Longest task URL, in characters after percent-encoding. Source: Cloud Tasks `HttpRequest.url`
/// reference ("The maximum allowed URL length is 2083 characters after encoding").
pub const MAX_URL_LEN: usize = super::options::MAX_URL_LEN;
/// Headers must total less than this many bytes (name, value and separator per header).
/// Source: Cloud Tasks `HttpRequest.headers` reference ("less than 80KB").
pub const MAX_HEADERS_BYTES: usize = super::options::MAX_HEADERS_BYTES;
/// The header added to a JSON-encoded body unless the `headers` option sets one.
pub const CONTENT_TYPE: &str = "Content-Type";
/// The media type of a JSON-encoded body (`format = 'json'`, or `schema_encoding = 'json'`).
pub const JSON_MEDIA_TYPE: &str = "application/json";
/// The media type of a binary protobuf body: the IANA registration `application/protobuf`
/// (ADR 0061).
pub const PROTOBUF_MEDIA_TYPE: &str = "application/protobuf";
/// The media type of a binary Avro body, a bare datum: `application/octet-stream`, since no
/// media type is registered for one (ADR 0061).
pub const AVRO_BINARY_MEDIA_TYPE: &str = "application/octet-stream";

/// The `Content-Type` an encoded body gets unless a header sets one: JSON for `format =
/// 'json'` (`schema` `None`) and for either schema language in its JSON encoding, else the
/// binary encoding's type (ADR 0061).
pub fn body_media_type(schema: Option<(SchemaType, SchemaEncoding)>) -> &'static str {
    match schema {
        None | Some((_, SchemaEncoding::Json)) => JSON_MEDIA_TYPE,
        Some((SchemaType::Protobuf, SchemaEncoding::Binary)) => PROTOBUF_MEDIA_TYPE,
        Some((SchemaType::Avro, SchemaEncoding::Binary)) => AVRO_BINARY_MEDIA_TYPE,
    }
}

/// One encoded task: the serialized `google.cloud.tasks.v2.Task`.
#[derive(Clone, PartialEq, Eq)]
pub struct TaskRecord {
    encoded: Box<[u8]>,
    named: bool,
}

impl std::fmt::Debug for TaskRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskRecord")
            .field("encoded_len", &self.encoded.len())
            .field("named", &self.named)
            .finish()
    }
}

impl TaskRecord {
    /// Serializes `task` (for tests and callers that build tasks themselves).
    pub fn from_task(task: &proto::Task) -> Self {
        TaskRecord {
            encoded: task.encode_to_vec().into_boxed_slice(),
            named: !task.name.is_empty(),
        }
    }

    /// The serialized `Task`.
    pub fn encoded(&self) -> &[u8] {
        &self.encoded
    }

    /// The serialized size, the unit of the task size limit.
    pub fn encoded_len(&self) -> usize {
        self.encoded.len()
    }

    /// Whether the task carries a name (and so is de-duplicated by the service).
    pub fn is_named(&self) -> bool {
        self.named
    }

    /// Decodes the task back (for tests, logs and the failure policy).
    pub fn to_task(&self) -> std::result::Result<proto::Task, prost::DecodeError> {
        proto::Task::decode(&self.encoded[..])
    }

    /// The task's HTTP request, decoded (every task this mapping builds has one; `None` for a
    /// task built elsewhere without one).
    pub fn http_request(
        &self,
    ) -> std::result::Result<Option<proto::HttpRequest>, prost::DecodeError> {
        Ok(match self.to_task()?.message_type {
            Some(proto::task::MessageType::HttpRequest(request)) => Some(request),
            _ => None,
        })
    }
}

/// Bytes of a `CreateTaskRequest` for `parent` carrying a task of `task_len` serialized bytes.
pub fn create_task_request_len(parent: &str, task_len: usize) -> usize {
    field_len(parent.len()) + field_len(task_len)
}

/// Appends a `CreateTaskRequest` body: field 1 the queue (`parent`), field 2 the serialized
/// task. (`response_view`, field 3, is left at its default.)
pub fn write_create_task_request(out: &mut Vec<u8>, parent: &str, task: &[u8]) {
    put_bytes_field(out, 1, parent.as_bytes());
    put_bytes_field(out, 2, task);
}

fn field_len(len: usize) -> usize {
    1 + prost::encoding::encoded_len_varint(len as u64) + len
}

fn put_bytes_field(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    prost::encoding::encode_key(field, prost::encoding::WireType::LengthDelimited, out);
    prost::encoding::encode_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// The protobuf value of a method.
pub fn proto_method(method: HttpMethod) -> proto::HttpMethod {
    match method {
        HttpMethod::Get => proto::HttpMethod::Get,
        HttpMethod::Head => proto::HttpMethod::Head,
        HttpMethod::Post => proto::HttpMethod::Post,
        HttpMethod::Put => proto::HttpMethod::Put,
        HttpMethod::Delete => proto::HttpMethod::Delete,
        HttpMethod::Patch => proto::HttpMethod::Patch,
        HttpMethod::Options => proto::HttpMethod::Options,
    }
}

/// What an error may show of a task URL: its scheme, host and port, never its user name,
/// password, path or query (see [`crate::encode::redact`]); `<not a URL>` when it has none.
fn shown_url(url: &str) -> String {
    crate::encode::redact::url_origin(url).unwrap_or_else(|| "<not a URL>".to_string())
}

/// Checks a task URL: `http://` or `https://` with a host, at most [`MAX_URL_LEN`] characters
/// after percent-encoding. Returns the broken rule, which never repeats the URL (it can carry a
/// password or an API key): at most its scheme.
pub fn check_task_url(url: &str) -> std::result::Result<(), String> {
    let parsed = url::Url::parse(url).map_err(|e| {
        format!(
            "the value ({} characters) is not a URL ({e})",
            url.chars().count()
        )
    })?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        let scheme = parsed.scheme();
        // A scheme is letters, digits and + - . only, so it cannot carry a secret.
        return Err(format!(
            "the URL (scheme '{scheme}') is not an http:// or https:// URL with a host"
        ));
    }
    let encoded = parsed.as_str().len();
    if encoded > MAX_URL_LEN {
        return Err(format!(
            "the URL is {encoded} characters once percent-encoded, over the Cloud Tasks limit of \
             {MAX_URL_LEN}"
        ));
    }
    Ok(())
}

/// Checks a header name (an HTTP token) and value (no line breaks). Returns the broken rule,
/// which repeats neither (a header from `headers_column` is a row's value; a header value can
/// be a token); the caller says which header it is.
pub fn check_header(name: &str, value: &str) -> std::result::Result<(), String> {
    const TOKEN_PUNCTUATION: &str = "!#$%&'*+-.^_`|~";
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || TOKEN_PUNCTUATION.contains(c))
    {
        return Err(format!(
            "the name ({} characters) is not a valid HTTP header name",
            name.chars().count()
        ));
    }
    if value.contains(['\r', '\n', '\0']) {
        return Err("the header's value contains a line break or NUL".to_string());
    }
    Ok(())
}

/// A column with a role: its index and name.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Col {
    index: usize,
    name: String,
}

/// Where a body comes from.
#[derive(Debug, Clone)]
enum BodyPlan {
    /// No body: a method without one, or no column left to encode.
    None,
    /// The body column, as it is.
    Column(Col),
    /// The payload columns as one JSON object.
    Json(JsonRowEncoder),
    /// The one payload column, as it is.
    Raw(RawEncoder, String),
    /// The payload columns encoded to match an Avro or Protobuf schema.
    Schema(Arc<SchemaRowEncoder>),
    /// A schema read when a statement starts ([`CloudTasksMapping::read_schema`] replaces this).
    Pending(SchemaLocation),
}

/// A validated mapping from a table schema to Cloud Tasks HTTP tasks.
#[derive(Debug, Clone)]
pub struct CloudTasksMapping {
    queue: Option<Destination>,
    project: Option<String>,
    location: Option<String>,
    queue_column: Option<Col>,
    url: Option<String>,
    url_column: Option<Col>,
    method: HttpMethod,
    headers: Vec<(String, String)>,
    headers_column: Option<Col>,
    body: BodyPlan,
    /// The columns without a role, which an encoded body is made of.
    body_columns: Vec<usize>,
    schedule_time_column: Option<Col>,
    task_name_column: Option<Col>,
    auth: Option<proto::http_request::AuthorizationHeader>,
    dispatch_deadline: Option<prost_types::Duration>,
}

fn find(schema: &Schema, option: &str, name: Option<&str>) -> Result<Option<Col>> {
    let Some(name) = name else {
        return Ok(None);
    };
    let index = schema
        .index_of(name)
        .map_err(|_| unknown_column(schema, name, option))?;
    Ok(Some(Col {
        index,
        name: name.to_string(),
    }))
}

impl CloudTasksMapping {
    /// Validates the mapping options against the table `schema`, once. Errors name the column
    /// and the rule ([`Error::Schema`]) or the option ([`Error::InvalidOption`]).
    pub fn new(options: &CloudTasksSinkOptions, schema: &Schema) -> Result<Self> {
        options.validate_schema(schema)?;
        let m = &options.mapping;
        let queue_column = find(schema, "queue_column", m.queue_column.as_deref())?;
        let url_column = find(schema, "url_column", m.url_column.as_deref())?;
        let headers_column = find(schema, "headers_column", m.headers_column.as_deref())?;
        let body_column = find(schema, "body_column", m.body_column.as_deref())?;
        let schedule_time_column = find(
            schema,
            "schedule_time_column",
            m.schedule_time_column.as_deref(),
        )?;
        let task_name_column = find(schema, "task_name_column", m.task_name_column.as_deref())?;

        let roles = [
            ("queue_column", &queue_column),
            ("url_column", &url_column),
            ("headers_column", &headers_column),
            ("body_column", &body_column),
            ("schedule_time_column", &schedule_time_column),
            ("task_name_column", &task_name_column),
        ];
        for (n, (role_a, a)) in roles.iter().enumerate() {
            for (role_b, b) in &roles[n + 1..] {
                if let (Some(a), Some(b)) = (a, b)
                    && a.index == b.index
                {
                    return Err(Error::schema(
                        &a.name,
                        format!("used as both {role_a} and {role_b}"),
                    ));
                }
            }
        }
        let taken = |i: usize| {
            roles
                .iter()
                .any(|(_, c)| c.as_ref().is_some_and(|c| c.index == i))
        };
        let rest: Vec<usize> = (0..schema.fields().len()).filter(|&i| !taken(i)).collect();

        let body = match (&body_column, m.http_method.has_body()) {
            (Some(column), true) => {
                if let Some(&stray) = rest.first() {
                    return Err(Error::schema(
                        schema.field(stray).name(),
                        format!(
                            "not part of the task: the body comes from body_column '{}'; give the column a \
                             role (queue_column, url_column, headers_column, schedule_time_column, \
                             task_name_column) or leave it out of the table",
                            column.name
                        ),
                    ));
                }
                BodyPlan::Column(column.clone())
            }
            (Some(column), false) => {
                // The options refuse this combination already; kept so the mapping never sends a
                // body the service would refuse.
                return Err(Error::schema(
                    &column.name,
                    format!(
                        "body_column needs http_method POST, PUT or PATCH, not {}",
                        m.http_method.name()
                    ),
                ));
            }
            (None, false) => BodyPlan::None,
            (None, true) => {
                match (&m.schema, &m.schema_at, m.format) {
                    (Some(payload_schema), _, _) => BodyPlan::Schema(Arc::new(
                        SchemaRowEncoder::new(payload_schema, schema, &rest)?,
                    )),
                    (None, Some(at), _) => BodyPlan::Pending(at.clone()),
                    (None, None, PayloadFormat::Json) if rest.is_empty() => BodyPlan::None,
                    (None, None, PayloadFormat::Json) => {
                        BodyPlan::Json(JsonRowEncoder::new(schema, &rest)?)
                    }
                    (None, None, PayloadFormat::Raw) => {
                        let raw = RawEncoder::new(schema, &rest)?;
                        let name = schema.field(raw.column()).name().clone();
                        BodyPlan::Raw(raw, name)
                    }
                }
            }
        };

        let url = match &m.url {
            Some(u) => {
                check_task_url(u).map_err(|rule| Error::invalid("url", shown_url(u), rule))?;
                Some(u.clone())
            }
            None => None,
        };

        let mut headers: Vec<(String, String)> = Vec::with_capacity(m.headers.len() + 1);
        let media_type = match &body {
            BodyPlan::Json(_) => Some(body_media_type(None)),
            BodyPlan::Schema(_) => m
                .schema
                .as_ref()
                .map(|s| body_media_type(Some((s.kind, s.encoding)))),
            BodyPlan::Pending(at) => Some(body_media_type(Some((at.kind, at.encoding)))),
            BodyPlan::None | BodyPlan::Column(_) | BodyPlan::Raw(..) => None,
        };
        if let Some(media_type) = media_type
            && !m
                .headers
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case(CONTENT_TYPE))
        {
            headers.push((CONTENT_TYPE.to_string(), media_type.to_string()));
        }
        for (name, value) in &m.headers {
            // An option header's name is the statement's own text; its value is not shown.
            check_header(name, value).map_err(|rule| Error::invalid("headers", name, rule))?;
            merge_header(&mut headers, name, value);
        }

        let queue = options.queue.as_deref().map(Destination::from);
        if queue.is_none() && queue_column.is_none() {
            return Err(Error::MissingOption {
                option: "queue".into(),
                rule: "a Cloud Tasks sink needs a queue or a queue_column".into(),
            });
        }
        if url.is_none() && url_column.is_none() {
            return Err(Error::MissingOption {
                option: "url".into(),
                rule: "a Cloud Tasks sink needs a url or a url_column".into(),
            });
        }

        let auth = m.auth.as_ref().map(|auth| match auth {
            TaskAuth::Oidc {
                service_account_email,
                audience,
            } => proto::http_request::AuthorizationHeader::OidcToken(proto::OidcToken {
                service_account_email: service_account_email.clone(),
                audience: audience.clone().unwrap_or_default(),
            }),
            TaskAuth::OAuth {
                service_account_email,
                scope,
            } => proto::http_request::AuthorizationHeader::OauthToken(proto::OAuthToken {
                service_account_email: service_account_email.clone(),
                scope: scope.clone().unwrap_or_default(),
            }),
        });
        let dispatch_deadline = m.dispatch_deadline.map(|d| prost_types::Duration {
            seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
        });

        Ok(CloudTasksMapping {
            queue,
            project: options.shared.connection.project.clone(),
            location: m.location.clone(),
            queue_column,
            url,
            url_column,
            method: m.http_method,
            headers,
            headers_column,
            body,
            body_columns: rest,
            schedule_time_column,
            task_name_column,
            auth,
            dispatch_deadline,
        })
    }

    /// With an object-store `schema_location`, this mapping with the body bound to the schema
    /// read now through `runtime`'s object stores (the same checks as a `schema` option at
    /// declaration, naming the column, the field and both types); `None` when there is nothing
    /// to read.
    pub async fn read_schema(
        &self,
        table: &Schema,
        runtime: Option<&Arc<datafusion::execution::runtime_env::RuntimeEnv>>,
    ) -> Result<Option<Self>> {
        let BodyPlan::Pending(at) = &self.body else {
            return Ok(None);
        };
        let encoder = SchemaRowEncoder::new(&at.read(runtime).await?, table, &self.body_columns)?;
        Ok(Some(CloudTasksMapping {
            body: BodyPlan::Schema(Arc::new(encoder)),
            ..self.clone()
        }))
    }

    /// The table's fixed queue, when it has one.
    pub fn default_queue(&self) -> Option<&Destination> {
        self.queue.as_ref()
    }

    /// The headers every task starts from (the `headers` option, plus the body's media type
    /// when the body is encoded and the option sets no `Content-Type`).
    pub fn base_headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// Encodes every row of `batch` into `out`, one entry per row in row order: the envelope,
    /// or an [`Error::Encode`] whose `row` is `first_row_index` plus the row's index in the
    /// batch.
    ///
    /// A bad row never affects the others. The outer error is returned only when `batch` does
    /// not have the schema the mapping was built for.
    pub fn encode_batch(
        &self,
        batch: &RecordBatch,
        first_row_index: u64,
        out: &mut Vec<std::result::Result<Envelope<TaskRecord>, Error>>,
    ) -> Result<()> {
        let arrays = self.arrays(batch)?;
        let mut bound = self.bind(&arrays, batch)?;
        let mut queues: HashMap<Vec<u8>, std::result::Result<Destination, String>> = HashMap::new();
        out.reserve(batch.num_rows());
        for row in 0..batch.num_rows() {
            let encoded = self.encode_row(&mut bound, row, &mut queues);
            out.push(encoded.map_err(|reason| Error::Encode {
                row: first_row_index + row as u64,
                reason,
            }));
        }
        Ok(())
    }

    /// The role columns of `batch`, with dictionary-encoded columns decoded.
    fn arrays(&self, batch: &RecordBatch) -> Result<RoleArrays> {
        let get = |c: &Option<Col>| -> Result<Option<ArrayRef>> {
            let Some(c) = c else {
                return Ok(None);
            };
            let array = batch.columns().get(c.index).ok_or_else(|| {
                Error::schema(&c.name, "the batch has fewer columns than the table schema")
            })?;
            Ok(Some(decode_dictionary(&c.name, array)?))
        };
        let body_column = match &self.body {
            BodyPlan::Column(c) => Some(c.clone()),
            _ => None,
        };
        Ok(RoleArrays {
            queue: get(&self.queue_column)?,
            url: get(&self.url_column)?,
            headers: get(&self.headers_column)?,
            body: get(&body_column)?,
            schedule_time: get(&self.schedule_time_column)?,
            task_name: get(&self.task_name_column)?,
        })
    }

    fn bind<'a>(&'a self, arrays: &'a RoleArrays, batch: &'a RecordBatch) -> Result<Bound<'a>> {
        let bytes = |c: &Option<Col>, a: &'a Option<ArrayRef>| -> Result<Option<BytesColumn<'a>>> {
            match (c, a) {
                (Some(c), Some(a)) => Ok(Some(BytesColumn::new(&c.name, a.as_ref())?)),
                _ => Ok(None),
            }
        };
        let body = match &self.body {
            BodyPlan::None => BoundBody::None,
            BodyPlan::Column(c) => match bytes(&Some(c.clone()), &arrays.body)? {
                Some(column) => BoundBody::Bytes(column, c.name.as_str(), ""),
                None => BoundBody::None,
            },
            BodyPlan::Json(json) => BoundBody::Json(json.bind(batch)?),
            BodyPlan::Raw(raw, name) => BoundBody::Bytes(raw.bind(batch)?, name, " (format 'raw')"),
            BodyPlan::Schema(encoder) => BoundBody::Schema(encoder.encode_batch(batch)?),
            BodyPlan::Pending(at) => return Err(at.unread()),
        };
        let headers = match (&self.headers_column, &arrays.headers) {
            (Some(c), Some(a)) => Some(MapColumn::new(&c.name, a.as_ref())?),
            _ => None,
        };
        let schedule_time = match (&self.schedule_time_column, &arrays.schedule_time) {
            (Some(c), Some(a)) => Some(TimestampColumn::new(&c.name, a.as_ref())?),
            _ => None,
        };
        Ok(Bound {
            queue: bytes(&self.queue_column, &arrays.queue)?,
            url: bytes(&self.url_column, &arrays.url)?,
            headers,
            body,
            schedule_time,
            task_name: bytes(&self.task_name_column, &arrays.task_name)?,
        })
    }

    fn encode_row(
        &self,
        bound: &mut Bound<'_>,
        row: usize,
        queues: &mut HashMap<Vec<u8>, std::result::Result<Destination, String>>,
    ) -> std::result::Result<Envelope<TaskRecord>, String> {
        // The queue first: a row without a destination is refused whatever else it holds.
        let queue = self.row_queue(bound, row, queues)?;

        let url = match (&self.url, &bound.url, &self.url_column) {
            (Some(url), _, _) => url.clone(),
            (None, Some(column), Some(c)) => {
                let value = column.str_value(row).unwrap_or_default();
                if value.is_empty() {
                    return Err(format!("column '{}' (url_column) is null or empty", c.name));
                }
                check_task_url(value).map_err(|rule| format!("column '{}': {rule}", c.name))?;
                value.to_string()
            }
            _ => return Err("the sink has neither a url nor a url_column".into()),
        };

        let headers = self.row_headers(bound, row)?;

        let (body, body_source) = match &mut bound.body {
            BoundBody::None => (Vec::new(), String::new()),
            BoundBody::Bytes(column, name, note) => {
                let value = column.value(row).unwrap_or_default();
                let source = format!("column '{name}'{note}");
                if value.len() as u64 > MAX_TASK_BYTES {
                    return Err(format!(
                        "the body from {source} is {} bytes, over the Cloud Tasks limit of {MAX_TASK_BYTES} \
                         bytes per task",
                        value.len()
                    ));
                }
                (value.to_vec(), source)
            }
            BoundBody::Json(rows) => {
                let mut body = Vec::new();
                rows.write_row(row, &mut body);
                (body, "the row encoded as JSON".to_string())
            }
            BoundBody::Schema(payloads) => match &mut payloads[row] {
                Ok(bytes) => (
                    std::mem::take(bytes),
                    "the row encoded by the schema".to_string(),
                ),
                Err(reason) => return Err(reason.clone()),
            },
        };

        let name = match (&bound.task_name, &self.task_name_column) {
            (Some(column), Some(c)) => match column.str_value(row).filter(|v| !v.is_empty()) {
                Some(value) => names::cloud_tasks_task(value, &queue)
                    .map_err(|rule| format!("column '{}' (task_name_column): {rule}", c.name))?,
                None => String::new(),
            },
            _ => String::new(),
        };

        let schedule_time = match (&bound.schedule_time, &self.schedule_time_column) {
            (Some(column), Some(c)) => column
                .micros(row)
                .map_err(|rule| format!("column '{}' (schedule_time_column): {rule}", c.name))?
                .map(|micros| prost_types::Timestamp {
                    seconds: micros.div_euclid(1_000_000),
                    // In [0, 999_000_000]: fits an i32.
                    nanos: (micros.rem_euclid(1_000_000) * 1_000) as i32,
                }),
            _ => None,
        };

        let body_len = body.len();
        let named = !name.is_empty();
        let task = proto::Task {
            name,
            schedule_time,
            dispatch_deadline: self.dispatch_deadline,
            message_type: Some(proto::task::MessageType::HttpRequest(proto::HttpRequest {
                url,
                http_method: proto_method(self.method) as i32,
                headers,
                body,
                authorization_header: self.auth.clone(),
            })),
            ..Default::default()
        };
        let len = task.encoded_len() as u64;
        if len > MAX_TASK_BYTES {
            let body_note = if body_len > 0 {
                format!("; the body from {body_source} is {body_len} bytes")
            } else {
                String::new()
            };
            return Err(format!(
                "the task is {len} bytes serialized, over the Cloud Tasks limit of {MAX_TASK_BYTES} bytes \
                 per task{body_note}"
            ));
        }
        Ok(Envelope {
            bytes: len,
            record: TaskRecord {
                encoded: task.encode_to_vec().into_boxed_slice(),
                named,
            },
            destination: queue,
            sequence_key: None,
            serial_key: None,
            handle: None,
        })
    }

    fn row_queue(
        &self,
        bound: &Bound<'_>,
        row: usize,
        queues: &mut HashMap<Vec<u8>, std::result::Result<Destination, String>>,
    ) -> std::result::Result<Destination, String> {
        let (Some(column), Some(c)) = (&bound.queue, &self.queue_column) else {
            return self
                .queue
                .clone()
                .ok_or_else(|| "the sink has neither a queue nor a queue_column".to_string());
        };
        let value = column
            .value(row)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| format!("column '{}' (queue_column) is null or empty", c.name))?;
        if let Some(known) = queues.get(value) {
            return known.clone();
        }
        let text = String::from_utf8_lossy(value);
        let resolved =
            names::cloud_tasks_queue(&text, self.project.as_deref(), self.location.as_deref())
                .map(Destination::from)
                .map_err(|rule| format!("column '{}' (queue_column): {rule}", c.name));
        queues.insert(value.to_vec(), resolved.clone());
        resolved
    }

    fn row_headers(
        &self,
        bound: &Bound<'_>,
        row: usize,
    ) -> std::result::Result<HashMap<String, String>, String> {
        let mut headers = self.headers.clone();
        if let (Some(map), Some(c)) = (&bound.headers, &self.headers_column)
            && let Some(range) = map.entries(row)
        {
            let first = range.start;
            for entry in range {
                let (Some(key), Some(value)) =
                    (map.keys.str_value(entry), map.values.str_value(entry))
                else {
                    continue;
                };
                check_header(key, value).map_err(|rule| {
                    format!(
                        "column '{}' (headers_column), entry {}: {rule}",
                        c.name,
                        entry - first + 1
                    )
                })?;
                merge_header(&mut headers, key, value);
            }
        }
        let total: usize = headers.iter().map(|(n, v)| n.len() + v.len() + 2).sum();
        if total >= MAX_HEADERS_BYTES {
            let column = self
                .headers_column
                .as_ref()
                .map_or("the headers option".to_string(), |c| {
                    format!("column '{}' and the headers option", c.name)
                });
            return Err(format!(
                "the headers from {column} total {total} bytes; Cloud Tasks needs less than {MAX_HEADERS_BYTES}"
            ));
        }
        Ok(headers.into_iter().collect())
    }
}

/// Sets `name: value`, replacing a header of the same name regardless of case.
fn merge_header(headers: &mut Vec<(String, String)>, name: &str, value: &str) {
    match headers
        .iter_mut()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
    {
        Some(slot) => *slot = (name.to_string(), value.to_string()),
        None => headers.push((name.to_string(), value.to_string())),
    }
}

/// A dictionary-encoded column decoded to its value type; any other column as it is.
fn decode_dictionary(name: &str, array: &ArrayRef) -> Result<ArrayRef> {
    match array.data_type() {
        DataType::Dictionary(_, value) => arrow::compute::cast(array, value)
            .map_err(|e| Error::schema(name, format!("cannot decode the dictionary column: {e}"))),
        _ => Ok(array.clone()),
    }
}

/// The role columns of one batch, owned (a decoded dictionary is a new array).
struct RoleArrays {
    queue: Option<ArrayRef>,
    url: Option<ArrayRef>,
    headers: Option<ArrayRef>,
    body: Option<ArrayRef>,
    schedule_time: Option<ArrayRef>,
    task_name: Option<ArrayRef>,
}

/// The per-batch view of the mapping's columns.
struct Bound<'a> {
    queue: Option<BytesColumn<'a>>,
    url: Option<BytesColumn<'a>>,
    headers: Option<MapColumn<'a>>,
    body: BoundBody<'a>,
    schedule_time: Option<TimestampColumn<'a>>,
    task_name: Option<BytesColumn<'a>>,
}

enum BoundBody<'a> {
    None,
    /// A column's bytes, its name and a note for messages.
    Bytes(BytesColumn<'a>, &'a str, &'static str),
    Json(crate::encode::json::JsonRows<'a>),
    /// Each row's schema'd payload, or why the schema refuses the row.
    Schema(Vec<RowPayload>),
}

/// A `MAP<string, string>` column.
struct MapColumn<'a> {
    nulls: Option<arrow::buffer::NullBuffer>,
    offsets: &'a [i32],
    keys: BytesColumn<'a>,
    values: BytesColumn<'a>,
}

impl<'a> MapColumn<'a> {
    fn new(name: &str, array: &'a dyn Array) -> Result<Self> {
        let map = array
            .as_map_opt()
            .ok_or_else(|| Error::schema(name, "headers_column is not a MAP column"))?;
        Ok(MapColumn {
            nulls: map.logical_nulls(),
            offsets: map.value_offsets(),
            keys: BytesColumn::new(name, map.keys().as_ref())?,
            values: BytesColumn::new(name, map.values().as_ref())?,
        })
    }

    /// The entry indices of `row`, or `None` when the map is null.
    fn entries(&self, row: usize) -> Option<std::ops::Range<usize>> {
        if self.nulls.as_ref().is_some_and(|n| n.is_null(row)) {
            return None;
        }
        let start = usize::try_from(self.offsets[row]).unwrap_or(0);
        let end = usize::try_from(self.offsets[row + 1]).unwrap_or(start);
        Some(start..end)
    }
}

/// A timestamp column read as microseconds since the epoch (UTC, whatever its time zone).
enum TimestampColumn<'a> {
    Second(&'a arrow::array::PrimitiveArray<TimestampSecondType>),
    Millisecond(&'a arrow::array::PrimitiveArray<TimestampMillisecondType>),
    Microsecond(&'a arrow::array::PrimitiveArray<TimestampMicrosecondType>),
    Nanosecond(&'a arrow::array::PrimitiveArray<TimestampNanosecondType>),
}

impl<'a> TimestampColumn<'a> {
    fn new(name: &str, array: &'a dyn Array) -> Result<Self> {
        let mismatch = || {
            Error::schema(
                name,
                format!(
                    "schedule_time_column needs a timestamp column, found {}",
                    array.data_type()
                ),
            )
        };
        Ok(match array.data_type() {
            DataType::Timestamp(TimeUnit::Second, _) => {
                TimestampColumn::Second(array.as_primitive_opt().ok_or_else(mismatch)?)
            }
            DataType::Timestamp(TimeUnit::Millisecond, _) => {
                TimestampColumn::Millisecond(array.as_primitive_opt().ok_or_else(mismatch)?)
            }
            DataType::Timestamp(TimeUnit::Microsecond, _) => {
                TimestampColumn::Microsecond(array.as_primitive_opt().ok_or_else(mismatch)?)
            }
            DataType::Timestamp(TimeUnit::Nanosecond, _) => {
                TimestampColumn::Nanosecond(array.as_primitive_opt().ok_or_else(mismatch)?)
            }
            _ => return Err(mismatch()),
        })
    }

    /// Microseconds since the epoch, rounded down (`None` when null).
    fn micros(&self, row: usize) -> std::result::Result<Option<i64>, String> {
        let out_of_range = || "the timestamp is out of the representable range".to_string();
        Ok(match self {
            TimestampColumn::Second(a) => match a.is_valid(row) {
                true => Some(
                    a.value(row)
                        .checked_mul(1_000_000)
                        .ok_or_else(out_of_range)?,
                ),
                false => None,
            },
            TimestampColumn::Millisecond(a) => match a.is_valid(row) {
                true => Some(a.value(row).checked_mul(1_000).ok_or_else(out_of_range)?),
                false => None,
            },
            TimestampColumn::Microsecond(a) => a.is_valid(row).then(|| a.value(row)),
            TimestampColumn::Nanosecond(a) => {
                a.is_valid(row).then(|| a.value(row).div_euclid(1_000))
            }
        })
    }
}

#[cfg(test)]
mod tests;
