//! Arrow rows to Pub/Sub messages (pure: no I/O).
//!
//! # Which column becomes what
//!
//! | Part of the message | Source |
//! |---|---|
//! | `data` | the data column (`data` unless `data_column` names another), any string or binary type; a null value is empty data. Without a data column, the row's other columns encoded by `format`: `json` (an object keyed by column name, see [`crate::encode::json`]) or `raw` (exactly one string/binary column, byte for byte) |
//! | `attributes` | the attributes column (`attributes` unless `attributes_column` names another), a `MAP` with string keys and values (null entries skipped), plus every column listed in `attribute_columns`, keyed by column name, its value as text (strings as they are, numbers and times as in JSON without quotes, binary as its bytes, which must be UTF-8); null values are skipped |
//! | `ordering_key` | the ordering key column (`ordering_key` unless `ordering_key_column` names another), a string; null or empty means no key |
//! | topic | the `topic_column` value (a full `projects/P/topics/T` name or a topic id resolved in `project`), falling back to the table's topic when the value is null or empty; else the table's topic |
//!
//! Columns used as attributes, ordering key or topic are not part of the JSON/raw payload. With a
//! data column, every other column must have one of those roles: a column that would silently go
//! nowhere is a schema error.
//!
//! # Limits
//!
//! A row that breaks a Pub/Sub limit is refused before it is sent, as an [`Error::Encode`] for
//! that row alone (a serializer rejection for the failure policy); the rest of the batch is
//! encoded as usual. See the `MAX_*` constants for the limits and their sources.
//!
//! # Why records are pre-encoded protobuf
//!
//! A [`PubsubRecord`] holds the serialized `PubsubMessage` bytes, written directly from the Arrow
//! buffers, rather than a `PubsubMessage` struct. The struct would cost a `String` pair and a hash
//! map insertion per attribute and a re-serialization on every (re)send; the bytes cost one
//! exact-size allocation per message, their size is exactly what the in-flight byte cap counts,
//! and a `PublishRequest` body is built from them by concatenation (see
//! [`client`](crate::connectors::pubsub::client)). The `#[ignore]`d benchmark in `tests/pubsub_mapping.rs`
//! (`mapping_throughput_benchmark`) measures the two paths. In a release build on a 2-core
//! machine (1M rows of 3 JSON columns, 2 attributes and an ordering key), records were built at
//! about 3.3M rows/s and request bodies at about 25M rows/s. The struct path built messages at
//! about 1.8M rows/s, sized them at 10M rows/s and cloned and encoded them into requests at
//! 2.2M rows/s, so it spent roughly three times the CPU per message.
//!
//! ```
//! use std::sync::Arc;
//! use arrow::array::{Int64Array, RecordBatch, StringArray};
//! use arrow::datatypes::{DataType, Field, Schema};
//! use gcp_sql::connectors::pubsub::sink::mapping::{MappingSpec, PubSubMapping};
//!
//! let schema = Arc::new(Schema::new(vec![
//!     Field::new("user_id", DataType::Int64, false),
//!     Field::new("ordering_key", DataType::Utf8, true),
//! ]));
//! let batch = RecordBatch::try_new(
//!     schema.clone(),
//!     vec![Arc::new(Int64Array::from(vec![7])), Arc::new(StringArray::from(vec![Some("u7")]))],
//! )?;
//! let mapping = PubSubMapping::new(&MappingSpec::default(), &schema, Some("clicks"), Some("demo"))?;
//! let mut out = Vec::new();
//! mapping.encode_batch(&batch, 0, &mut out)?;
//! let envelope = out.remove(0)?;
//! assert_eq!(&*envelope.destination, "projects/demo/topics/clicks");
//! assert_eq!(envelope.sequence_key.as_deref(), Some("u7"));
//! let message = envelope.record.to_message()?;
//! assert_eq!(message.data, br#"{"user_id":7}"#);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Schema};
use gcloud_sdk::google::pubsub::v1::PubsubMessage;
use prost::Message as _;

use crate::core::{Destination, Envelope};
use crate::encode::json::{ColumnEncoder, JsonRowEncoder, JsonRows, check_json_type};
use crate::encode::raw::{BytesColumn, RawEncoder, is_bytes_type, is_string_type};
use crate::encode::schema::{PayloadSchema, RowPayload, SchemaLocation, SchemaRowEncoder};
use crate::error::{Error, Result};
use crate::options::names::unknown_column;
use crate::options::schema_types::is_map_of;

/// Most messages in one `Publish` request. Source: Pub/Sub quotas and limits ("Publish
/// request: 1,000 messages").
pub const MAX_MESSAGES_PER_REQUEST: usize = 1_000;
/// Largest `Publish` request, in bytes. Source: Pub/Sub quotas and limits ("Publish request:
/// 10 MB total size", enforced as 10,000,000 bytes).
pub const MAX_REQUEST_BYTES: u64 = 10_000_000;
/// Largest serialized message (data, attributes and ordering key). Source: Pub/Sub limits; a
/// message must fit in one request, so the request limit (10,000,000 bytes) binds before the
/// 10 MiB data limit does (docs/service_facts.md).
pub const MAX_MESSAGE_BYTES: u64 = 10_000_000;
/// Most attributes per message. Source: Pub/Sub limits ("Attributes per message: 100").
pub const MAX_ATTRIBUTES: usize = 100;
/// Longest attribute key, in bytes. Source: Pub/Sub limits ("Attribute key size: 256 bytes").
pub const MAX_ATTRIBUTE_KEY_BYTES: usize = 256;
/// Longest attribute value, in bytes. Source: Pub/Sub limits ("Attribute value size: 1024 bytes").
pub const MAX_ATTRIBUTE_VALUE_BYTES: usize = 1_024;
/// Longest ordering key, in bytes. Source: Pub/Sub limits ("Ordering key size: 1 KB").
pub const MAX_ORDERING_KEY_BYTES: usize = 1_024;
/// The prefix Pub/Sub reserves for its own attribute keys and resource ids. Source: Pub/Sub
/// resource-name rules ("must not start with goog").
pub const RESERVED_PREFIX: &str = "goog";
/// Shortest topic id. Source: Pub/Sub resource-name rules (3 to 255 characters).
pub const MIN_TOPIC_ID_LEN: usize = 3;
/// Longest topic id. Source: Pub/Sub resource-name rules (3 to 255 characters).
pub const MAX_TOPIC_ID_LEN: usize = 255;

/// The data column used when `data_column` is not set (only if the table has it).
pub const DEFAULT_DATA_COLUMN: &str = "data";
/// The attributes column used when `attributes_column` is not set (only if the table has it).
pub const DEFAULT_ATTRIBUTES_COLUMN: &str = "attributes";
/// The ordering key column used when `ordering_key_column` is not set (only if the table has it).
pub const DEFAULT_ORDERING_KEY_COLUMN: &str = "ordering_key";

/// How the payload is built when the table has no data column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PayloadFormat {
    /// The payload columns as one JSON object per row.
    #[default]
    Json,
    /// The one payload column's bytes, as they are.
    Raw,
}

/// The mapping options, as plain values (filled from the `pubsub` table options).
///
/// For the three defaulted columns, `None` means "the default name, if the table has such a
/// column", while `Some(name)` requires the column to exist.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MappingSpec {
    /// Column holding a per-record topic (`topic_column`).
    pub topic_column: Option<String>,
    /// Column holding the payload (`data_column`; default [`DEFAULT_DATA_COLUMN`]).
    pub data_column: Option<String>,
    /// Payload format when there is no data column (`format`).
    pub format: PayloadFormat,
    /// The schema of `format = 'avro'` or `'protobuf'`; when set it takes the place of `format`.
    pub schema: Option<PayloadSchema>,
    /// Where such a schema is read when a statement starts (an object-store `schema_location`);
    /// [`PubSubMapping::with_schema`] then binds it.
    pub schema_at: Option<SchemaLocation>,
    /// Whether the format was chosen (`format` given): when not, a fixed topic's Pub/Sub schema
    /// may choose it when a statement starts ([`PubSubMapping::with_schema`]).
    pub format_given: bool,
    /// Map column holding attributes (`attributes_column`; default [`DEFAULT_ATTRIBUTES_COLUMN`]).
    pub attributes_column: Option<String>,
    /// Columns sent as attributes keyed by their name (`attribute_columns`).
    pub attribute_columns: Vec<String>,
    /// Column holding the ordering key (`ordering_key_column`; default
    /// [`DEFAULT_ORDERING_KEY_COLUMN`]).
    pub ordering_key_column: Option<String>,
}

/// One encoded message: the serialized `google.pubsub.v1.PubsubMessage`.
#[derive(Clone, PartialEq, Eq)]
pub struct PubsubRecord {
    encoded: Box<[u8]>,
}

impl std::fmt::Debug for PubsubRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PubsubRecord")
            .field("encoded_len", &self.encoded.len())
            .finish()
    }
}

impl PubsubRecord {
    /// Serializes `message` (for tests and callers that build messages themselves).
    pub fn from_message(message: &PubsubMessage) -> Self {
        PubsubRecord {
            encoded: message.encode_to_vec().into_boxed_slice(),
        }
    }

    /// The serialized `PubsubMessage`.
    pub fn encoded(&self) -> &[u8] {
        &self.encoded
    }

    /// The serialized size (`PubsubMessage.encoded_len()`), the unit of the byte caps.
    pub fn encoded_len(&self) -> usize {
        self.encoded.len()
    }

    /// Decodes the message back (for tests, logs and the failure policy).
    pub fn to_message(&self) -> std::result::Result<PubsubMessage, prost::DecodeError> {
        PubsubMessage::decode(&self.encoded[..])
    }
}

/// Bytes a message of `message_len` serialized bytes adds to a `PublishRequest` (field tag,
/// length prefix and the message).
pub fn request_entry_len(message_len: u64) -> u64 {
    1 + varint_len(message_len) + message_len
}

/// Bytes of a `PublishRequest` for `topic` with no messages (the topic field).
pub fn request_base_len(topic: &str) -> u64 {
    let len = topic.len() as u64;
    1 + varint_len(len) + len
}

/// Checks a topic id against Pub/Sub's resource-name rules: 3 to 255 characters, starting with a
/// letter, only `[A-Za-z0-9-_.~+%]`, not starting with `goog`. Returns the broken rule.
pub fn validate_topic_id(id: &str) -> std::result::Result<(), String> {
    if !(MIN_TOPIC_ID_LEN..=MAX_TOPIC_ID_LEN).contains(&id.len()) {
        return Err(format!(
            "a topic id must be {MIN_TOPIC_ID_LEN} to {MAX_TOPIC_ID_LEN} characters long, not {}",
            id.len()
        ));
    }
    if !id.as_bytes()[0].is_ascii_alphabetic() {
        return Err("a topic id must start with a letter".into());
    }
    if let Some(at) = id
        .chars()
        .position(|c| !(c.is_ascii_alphanumeric() || "-_.~+%".contains(c)))
    {
        let bad = id.chars().nth(at).unwrap_or_default();
        // The character is named only when it is punctuation, never a letter of the value.
        let shown = if bad.is_ascii_punctuation() || bad == ' ' {
            format!("'{bad}'")
        } else {
            "a character".to_string()
        };
        return Err(format!(
            "the topic id contains {shown} at position {}; allowed are letters, digits and - _ . ~ + %",
            at + 1
        ));
    }
    if id.starts_with(RESERVED_PREFIX) {
        return Err(format!(
            "a topic id must not start with '{RESERVED_PREFIX}'"
        ));
    }
    Ok(())
}

/// Resolves a topic given as `projects/P/topics/T` or as a topic id `T` (in `project`) to its
/// full name, checking the id. Returns the broken rule.
pub fn resolve_topic(topic: &str, project: Option<&str>) -> std::result::Result<String, String> {
    if let Some(rest) = topic.strip_prefix("projects/") {
        let Some((project, id)) = rest.split_once("/topics/") else {
            return Err("the topic is not of the form projects/PROJECT/topics/TOPIC".into());
        };
        if project.is_empty() || project.contains('/') {
            return Err(
                "the topic has an invalid project (projects/PROJECT/topics/TOPIC, PROJECT without '/')"
                    .into(),
            );
        }
        validate_topic_id(id)?;
        return Ok(topic.to_string());
    }
    if topic.contains('/') {
        return Err(
            "the topic is neither a topic id nor of the form projects/PROJECT/topics/TOPIC".into(),
        );
    }
    validate_topic_id(topic)?;
    match project {
        Some(project) if !project.is_empty() => Ok(format!("projects/{project}/topics/{topic}")),
        _ => Err("the topic is a bare topic id, but no project is set to resolve it in".into()),
    }
}

/// A validated mapping from a table schema to Pub/Sub messages.
#[derive(Debug, Clone)]
pub struct PubSubMapping {
    topic: Option<Destination>,
    project: Option<String>,
    topic_column: Option<(usize, String)>,
    data_column: Option<(usize, String)>,
    attributes_column: Option<(usize, String)>,
    attribute_columns: Vec<(usize, String)>,
    ordering_key_column: Option<(usize, String)>,
    /// The columns the payload is encoded from (every column without another role).
    payload_columns: Vec<usize>,
    /// Whether a topic schema may choose the encoding (no `format`, no data column).
    format_open: bool,
    payload: PayloadPlan,
}

#[derive(Debug, Clone)]
enum PayloadPlan {
    /// The data column is the payload.
    DataColumn,
    /// No payload column: messages carry attributes only.
    Empty,
    /// The payload columns as JSON.
    Json(JsonRowEncoder),
    /// The one payload column as it is.
    Raw(RawEncoder),
    /// The payload columns encoded to match an Avro or Protobuf schema.
    Schema(Arc<SchemaRowEncoder>),
    /// A schema read when a statement starts ([`PubSubMapping::with_schema`] replaces this).
    Pending(SchemaLocation),
}

/// Finds a column named by an option. `explicit` says whether the user named it (then it must
/// exist) or the default name applies (then it is optional).
fn find_column(
    schema: &Schema,
    option: &str,
    explicit: Option<&str>,
    default: Option<&str>,
) -> Result<Option<(usize, String)>> {
    match (explicit, default) {
        (Some(name), _) => schema
            .index_of(name)
            .map(|i| Some((i, name.to_string())))
            .map_err(|_| unknown_column(schema, name, option)),
        (None, Some(name)) => Ok(schema.index_of(name).ok().map(|i| (i, name.to_string()))),
        (None, None) => Ok(None),
    }
}

/// `format = 'raw'` sends one column as the message data: an [`Error::Schema`] on the columns
/// left without another role when there are none or several, naming them and the ways out.
fn check_one_raw_column(schema: &Schema, rest: &[usize]) -> Result<()> {
    let names: Vec<&str> = rest
        .iter()
        .map(|&i| schema.field(i).name().as_str())
        .collect();
    let left = match names.as_slice() {
        [_] => return Ok(()),
        [] => "no column is left: every column has another role".to_string(),
        several => format!(
            "these {} columns are left: {}",
            several.len(),
            several
                .iter()
                .map(|n| format!("'{n}'"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    Err(Error::schema(
        if names.is_empty() {
            "(none)".to_string()
        } else {
            names.join(", ")
        },
        format!(
            "format 'raw' needs exactly one payload column, but {left}; map the others to \
             attributes ('attribute_columns') or to 'ordering_key_column', or use format = 'json' \
             to send them together as one JSON object"
        ),
    ))
}

impl PubSubMapping {
    /// The columns that keep an ordering key's rows on one writer: the topic column (when the
    /// topic is per row) and the ordering key column; empty without an ordering key column.
    pub fn ordering_columns(&self) -> Vec<String> {
        let Some((_, key)) = &self.ordering_key_column else {
            return Vec::new();
        };
        self.topic_column
            .iter()
            .map(|(_, topic)| topic.clone())
            .chain([key.clone()])
            .collect()
    }

    /// Validates `spec` against the table `schema`, once.
    ///
    /// `default_topic` is the table's topic (`topic` option or `LOCATION`), a full name or an id
    /// resolved in `project`. Errors name the column and the rule ([`Error::Schema`]), or the
    /// option ([`Error::InvalidOption`] for a bad topic, [`Error::MissingOption`] when there is
    /// neither a topic nor a topic column).
    pub fn new(
        spec: &MappingSpec,
        schema: &Schema,
        default_topic: Option<&str>,
        project: Option<&str>,
    ) -> Result<Self> {
        let topic = match default_topic {
            Some(t) => Some(Destination::from(
                resolve_topic(t, project).map_err(|rule| Error::invalid("topic", t, rule))?,
            )),
            None => None,
        };
        let topic_column = find_column(schema, "topic_column", spec.topic_column.as_deref(), None)?;
        if topic.is_none() && topic_column.is_none() {
            return Err(Error::MissingOption {
                option: "topic".into(),
                rule: "a Pub/Sub table needs a topic (the 'topic' option or LOCATION) or a 'topic_column'".into(),
            });
        }
        // The columns of a role that a column of the default name takes when no option names one.
        let [data_column, attributes_column, ordering_key_column] = [
            ("data_column", &spec.data_column, DEFAULT_DATA_COLUMN),
            (
                "attributes_column",
                &spec.attributes_column,
                DEFAULT_ATTRIBUTES_COLUMN,
            ),
            (
                "ordering_key_column",
                &spec.ordering_key_column,
                DEFAULT_ORDERING_KEY_COLUMN,
            ),
        ]
        .map(|(option, given, default)| {
            find_column(schema, option, given.as_deref(), Some(default))
        });
        let (data_column, attributes_column, ordering_key_column) =
            (data_column?, attributes_column?, ordering_key_column?);

        let type_of = |i: usize| schema.field(i).data_type();
        // Each role's column, the types it takes and the rule an other type breaks.
        let typed_roles = [
            (
                &topic_column,
                is_string_type as fn(&DataType) -> bool,
                "topic_column must be a string column",
            ),
            (
                &data_column,
                is_bytes_type,
                "the data column must be a string or binary column",
            ),
            (
                &attributes_column,
                |t| is_map_of(t, is_string_type),
                "the attributes column must be a MAP of string keys to string values",
            ),
            (
                &ordering_key_column,
                is_string_type,
                "the ordering key column must be a string column",
            ),
        ];
        for (column, fits, rule) in typed_roles {
            if let Some((i, name)) = column
                && !fits(type_of(*i))
            {
                return Err(Error::schema(name, format!("{rule}, not {}", type_of(*i))));
            }
        }

        // One role per column among the four single-column roles.
        let roles = [
            ("topic_column", &topic_column),
            ("data_column", &data_column),
            ("attributes_column", &attributes_column),
            ("ordering_key_column", &ordering_key_column),
        ];
        for (n, (role_a, a)) in roles.iter().enumerate() {
            for (role_b, b) in &roles[n + 1..] {
                if let (Some((ia, name)), Some((ib, _))) = (a, b)
                    && ia == ib
                {
                    return Err(Error::schema(
                        name,
                        format!("used as both {role_a} and {role_b}"),
                    ));
                }
            }
        }

        let mut attribute_columns: Vec<(usize, String)> =
            Vec::with_capacity(spec.attribute_columns.len());
        for name in &spec.attribute_columns {
            let index = schema
                .index_of(name)
                .map_err(|_| unknown_column(schema, name, "attribute_columns"))?;
            if attribute_columns.iter().any(|(i, _)| *i == index) {
                return Err(Error::schema(
                    name,
                    "listed twice in option 'attribute_columns'",
                ));
            }
            if data_column.as_ref().is_some_and(|(i, _)| *i == index) {
                return Err(Error::schema(
                    name,
                    "used as both data_column and in attribute_columns",
                ));
            }
            if attributes_column.as_ref().is_some_and(|(i, _)| *i == index) {
                return Err(Error::schema(
                    name,
                    "used as both attributes_column and in attribute_columns",
                ));
            }
            check_attribute_key(name)
                .map_err(|rule| Error::schema(name, format!("as an attribute key: {rule}")))?;
            check_json_type(name, type_of(index))?;
            attribute_columns.push((index, name.clone()));
        }
        if attribute_columns.len() > MAX_ATTRIBUTES {
            return Err(Error::invalid(
                "attribute_columns",
                spec.attribute_columns.join(","),
                format!("at most {MAX_ATTRIBUTES} attributes fit in a message"),
            ));
        }

        // Payload columns: everything without another role.
        let taken = |i: usize| {
            [
                &topic_column,
                &data_column,
                &attributes_column,
                &ordering_key_column,
            ]
            .iter()
            .any(|c| c.as_ref().is_some_and(|(j, _)| *j == i))
                || attribute_columns.iter().any(|(j, _)| *j == i)
        };
        let rest: Vec<usize> = (0..schema.fields().len()).filter(|&i| !taken(i)).collect();
        let schema_kind = spec
            .schema
            .as_ref()
            .map(|s| s.kind)
            .or(spec.schema_at.as_ref().map(|s| s.kind));
        if let (Some((_, data_name)), Some(kind)) = (&data_column, schema_kind) {
            return Err(Error::schema(
                data_name,
                format!(
                    "the payload comes from data column '{data_name}', so format '{}' would encode nothing; \
                     drop the format, or leave the data column out of the table",
                    kind.name()
                ),
            ));
        }
        let payload = if let Some(payload_schema) = &spec.schema {
            PayloadPlan::Schema(Arc::new(SchemaRowEncoder::new(
                payload_schema,
                schema,
                &rest,
            )?))
        } else if let Some(at) = &spec.schema_at {
            PayloadPlan::Pending(at.clone())
        } else if let Some((_, data_name)) = &data_column {
            if let Some(&stray) = rest.first() {
                return Err(Error::schema(
                    schema.field(stray).name(),
                    format!(
                        "not part of the message: the payload comes from data column '{data_name}'; \
                         list the column in 'attribute_columns' or leave it out of the table"
                    ),
                ));
            }
            PayloadPlan::DataColumn
        } else {
            match spec.format {
                PayloadFormat::Json if rest.is_empty() => PayloadPlan::Empty,
                PayloadFormat::Json => PayloadPlan::Json(JsonRowEncoder::new(schema, &rest)?),
                PayloadFormat::Raw => {
                    check_one_raw_column(schema, &rest)?;
                    PayloadPlan::Raw(RawEncoder::new(schema, &rest)?)
                }
            }
        };

        let format_open = !spec.format_given
            && data_column.is_none()
            && spec.schema.is_none()
            && spec.schema_at.is_none();
        Ok(PubSubMapping {
            topic,
            project: project.map(str::to_string),
            topic_column,
            data_column,
            attributes_column,
            attribute_columns,
            ordering_key_column,
            format_open,
            payload_columns: rest,
            payload,
        })
    }

    /// Whether the encoding is still open to a topic's Pub/Sub schema: no `format` was given,
    /// there is no data column, and the table has a fixed topic (whose schema is read when a
    /// statement starts).
    pub fn takes_topic_schema(&self) -> bool {
        self.format_open && self.topic.is_some()
    }

    /// The object-store schema to read when a statement starts, if any.
    pub fn pending_schema(&self) -> Option<&SchemaLocation> {
        match &self.payload {
            PayloadPlan::Pending(at) => Some(at),
            _ => None,
        }
    }

    /// This mapping with the payload encoded to match `schema` (a topic's Pub/Sub schema, or
    /// one read from an object store): the same errors as a `schema` option at declaration,
    /// naming the column, the field and both types.
    pub fn with_schema(&self, schema: &PayloadSchema, table: &Schema) -> Result<Self> {
        let mut mapping = self.clone();
        mapping.payload = PayloadPlan::Schema(Arc::new(SchemaRowEncoder::new(
            schema,
            table,
            &self.payload_columns,
        )?));
        mapping.format_open = false;
        Ok(mapping)
    }

    /// The table's topic, fully resolved, when it has one.
    pub fn default_topic(&self) -> Option<&Destination> {
        self.topic.as_ref()
    }

    /// Encodes every row of `batch` into `out`, one entry per row in row order: the envelope, or
    /// an [`Error::Encode`] whose `row` is `first_row_index` plus the row's index in the batch.
    ///
    /// A bad row never affects the others. The outer error is returned only when `batch` does
    /// not have the schema the mapping was built for.
    pub fn encode_batch(
        &self,
        batch: &RecordBatch,
        first_row_index: u64,
        out: &mut Vec<std::result::Result<Envelope<PubsubRecord>, Error>>,
    ) -> Result<()> {
        let mut bound = self.bind(batch)?;
        let mut scratch = Scratch::default();
        let mut topics: HashMap<&[u8], std::result::Result<Destination, String>> = HashMap::new();
        out.reserve(batch.num_rows());
        for row in 0..batch.num_rows() {
            let encoded = self.encode_row(&mut bound, row, &mut scratch, &mut topics);
            out.push(encoded.map_err(|reason| Error::Encode {
                row: first_row_index + row as u64,
                reason,
            }));
        }
        Ok(())
    }

    fn bind<'a>(&'a self, batch: &'a RecordBatch) -> Result<Bound<'a>> {
        let column = |(i, name): &(usize, String)| -> Result<&'a dyn Array> {
            batch.columns().get(*i).map(|a| a.as_ref()).ok_or_else(|| {
                Error::schema(name, "the batch has fewer columns than the table schema")
            })
        };
        let bytes = |c: &Option<(usize, String)>| -> Result<Option<BytesColumn<'a>>> {
            c.as_ref()
                .map(|c| BytesColumn::new(&c.1, column(c)?))
                .transpose()
        };
        let payload = match &self.payload {
            PayloadPlan::DataColumn => {
                BoundPayload::Bytes(bytes(&self.data_column)?.ok_or_else(|| {
                    Error::schema(
                        DEFAULT_DATA_COLUMN,
                        "internal: the data column disappeared from the mapping",
                    )
                })?)
            }
            PayloadPlan::Empty => BoundPayload::Empty,
            PayloadPlan::Json(json) => BoundPayload::Json(json.bind(batch)?),
            PayloadPlan::Raw(raw) => BoundPayload::Bytes(raw.bind(batch)?),
            PayloadPlan::Schema(encoder) => BoundPayload::Schema(encoder.encode_batch(batch)?),
            PayloadPlan::Pending(at) => return Err(at.unread()),
        };
        let attribute_map = match &self.attributes_column {
            Some(c) => {
                let array = column(c)?;
                let map = array
                    .as_map_opt()
                    .ok_or_else(|| Error::schema(&c.1, "the column is not a MAP"))?;
                Some(MapAttributes {
                    map_nulls: map.logical_nulls(),
                    offsets: map.value_offsets(),
                    keys: BytesColumn::new(&c.1, map.keys().as_ref())?,
                    values: BytesColumn::new(&c.1, map.values().as_ref())?,
                })
            }
            None => None,
        };
        let mut attribute_columns = Vec::with_capacity(self.attribute_columns.len());
        for c in &self.attribute_columns {
            attribute_columns.push((c.1.as_str(), ColumnEncoder::new(&c.1, column(c)?)?));
        }
        Ok(Bound {
            topic: bytes(&self.topic_column)?,
            payload,
            attribute_map,
            attribute_columns,
            ordering_key: bytes(&self.ordering_key_column)?,
        })
    }

    fn encode_row<'a>(
        &self,
        bound: &mut Bound<'a>,
        row: usize,
        scratch: &mut Scratch<'a>,
        topics: &mut HashMap<&'a [u8], std::result::Result<Destination, String>>,
    ) -> std::result::Result<Envelope<PubsubRecord>, String> {
        // Topic first: a row without a destination is refused whatever else it holds.
        let destination = self.row_topic(bound, row, topics)?;

        // Payload.
        scratch.json.clear();
        let data: &[u8] = match &mut bound.payload {
            BoundPayload::Bytes(column) => column.value(row).unwrap_or_default(),
            BoundPayload::Json(rows) => {
                rows.write_row(row, &mut scratch.json);
                &scratch.json
            }
            BoundPayload::Schema(payloads) => match &payloads[row] {
                Ok(bytes) => bytes,
                Err(reason) => return Err(reason.clone()),
            },
            BoundPayload::Empty => &[],
        };

        // Attributes, as (key, value) pieces.
        scratch.attributes.clear();
        scratch.text.clear();
        if let Some(map) = &bound.attribute_map
            && !map.map_nulls.as_ref().is_some_and(|n| n.is_null(row))
        {
            let (start, end) = (map.offsets[row] as usize, map.offsets[row + 1] as usize);
            for entry in start..end {
                let (Some(key), Some(value)) = (map.keys.value(entry), map.values.value(entry))
                else {
                    continue;
                };
                scratch
                    .attributes
                    .push((Piece::Slice(key), Piece::Slice(value)));
            }
        }
        // Attributes before this index are keys of the attributes map (a row's values); the
        // rest are attribute columns, keyed by their column names.
        let from_map = scratch.attributes.len();
        for (name, encoder) in &mut bound.attribute_columns {
            let name: &'a str = name;
            let start = scratch.text.len();
            if !encoder.write_text(row, &mut scratch.text) {
                continue;
            }
            let range = start..scratch.text.len();
            if encoder.text_may_be_binary()
                && std::str::from_utf8(&scratch.text[range.clone()]).is_err()
            {
                return Err(format!(
                    "attribute column '{name}' holds bytes that are not valid UTF-8 text"
                ));
            }
            scratch
                .attributes
                .push((Piece::Slice(name.as_bytes()), Piece::Text(range)));
        }
        let attributes = &scratch.attributes;
        let text = &scratch.text;
        if attributes.len() > MAX_ATTRIBUTES {
            return Err(format!(
                "{} attributes exceed the Pub/Sub limit of {MAX_ATTRIBUTES} per message",
                attributes.len()
            ));
        }
        let mut attributes_len = 0u64;
        // Where attribute `n` came from, for messages: an attribute column is named by its
        // column name; a key of the attributes map is a row's value, so only its position in
        // the map is shown.
        let label = |n: usize| -> String {
            if n < from_map {
                let column = self
                    .attributes_column
                    .as_ref()
                    .map_or("attributes", |c| c.1.as_str());
                format!("attribute {} of column '{column}'", n + 1)
            } else {
                let name = String::from_utf8_lossy(attributes[n].0.bytes(text));
                format!("attribute '{name}'")
            }
        };
        for (n, (key, value)) in attributes.iter().enumerate() {
            let (key, value) = (key.bytes(text), value.bytes(text));
            let key_text = String::from_utf8_lossy(key);
            check_attribute_key(&key_text).map_err(|rule| format!("{}: {rule}", label(n)))?;
            if value.len() > MAX_ATTRIBUTE_VALUE_BYTES {
                return Err(format!(
                    "{} has a {}-byte value, over the Pub/Sub limit of \
                     {MAX_ATTRIBUTE_VALUE_BYTES} bytes",
                    label(n),
                    value.len()
                ));
            }
            if let Some(first) = attributes[..n]
                .iter()
                .position(|(k, _)| k.bytes(text) == key)
            {
                return Err(format!(
                    "{} has the same key as {}: a key is given more than once",
                    label(n),
                    label(first)
                ));
            }
            attributes_len += field_len(map_entry_len(key.len() as u64, value.len() as u64));
        }

        // Ordering key.
        let ordering_key = bound
            .ordering_key
            .and_then(|c| c.str_value(row))
            .filter(|k| !k.is_empty());
        if let Some(key) = ordering_key
            && key.len() > MAX_ORDERING_KEY_BYTES
        {
            return Err(format!(
                "ordering key of {} bytes exceeds the Pub/Sub limit of {MAX_ORDERING_KEY_BYTES} bytes",
                key.len()
            ));
        }

        if data.is_empty() && attributes.is_empty() {
            return Err(
                "the message has neither data nor attributes; Pub/Sub requires at least one".into(),
            );
        }

        // Size, then the bytes.
        let data_len = if data.is_empty() {
            0
        } else {
            field_len(data.len() as u64)
        };
        let key_len = ordering_key.map_or(0, |k| field_len(k.len() as u64));
        let message_len = data_len + attributes_len + key_len;
        if message_len > MAX_MESSAGE_BYTES {
            return Err(format!(
                "the message is {message_len} bytes serialized, over the Pub/Sub limit of {MAX_MESSAGE_BYTES} bytes"
            ));
        }
        let solo_request = request_base_len(&destination) + request_entry_len(message_len);
        if solo_request > MAX_REQUEST_BYTES {
            return Err(format!(
                "a publish request carrying this message alone is {solo_request} bytes, over the Pub/Sub \
                 request limit of {MAX_REQUEST_BYTES} bytes"
            ));
        }
        let mut encoded = Vec::with_capacity(message_len as usize);
        if !data.is_empty() {
            put_bytes_field(&mut encoded, TAG_DATA, data);
        }
        for (key, value) in attributes {
            let (key, value) = (key.bytes(text), value.bytes(text));
            encoded.push(TAG_ATTRIBUTES);
            put_varint(
                &mut encoded,
                map_entry_len(key.len() as u64, value.len() as u64),
            );
            if !key.is_empty() {
                put_bytes_field(&mut encoded, TAG_MAP_KEY, key);
            }
            if !value.is_empty() {
                put_bytes_field(&mut encoded, TAG_MAP_VALUE, value);
            }
        }
        if let Some(key) = ordering_key {
            put_bytes_field(&mut encoded, TAG_ORDERING_KEY, key.as_bytes());
        }
        debug_assert_eq!(encoded.len() as u64, message_len);
        Ok(Envelope {
            bytes: encoded.len() as u64,
            record: PubsubRecord {
                encoded: encoded.into_boxed_slice(),
            },
            destination,
            sequence_key: ordering_key.map(|key| {
                scratch
                    .ordering_keys
                    .entry(key)
                    .or_insert_with(|| Arc::from(key))
                    .clone()
            }),
            serial_key: None,
            handle: None,
        })
    }

    fn row_topic<'a>(
        &self,
        bound: &Bound<'a>,
        row: usize,
        topics: &mut HashMap<&'a [u8], std::result::Result<Destination, String>>,
    ) -> std::result::Result<Destination, String> {
        let value = bound
            .topic
            .and_then(|c| c.value(row))
            .filter(|v| !v.is_empty());
        let Some(value) = value else {
            let column = self
                .topic_column
                .as_ref()
                .map_or("topic_column", |c| c.1.as_str());
            return self.topic.clone().ok_or_else(|| {
                format!("column '{column}' is null or empty and the table has no default topic")
            });
        };
        topics
            .entry(value)
            .or_insert_with(|| {
                let text = String::from_utf8_lossy(value);
                // The column's value is not shown: it failed the name rules, so it may be
                // anything, and it is a row's value.
                resolve_topic(&text, self.project.as_deref())
                    .map(Destination::from)
                    .map_err(|rule| {
                        let column = self
                            .topic_column
                            .as_ref()
                            .map_or("topic_column", |c| c.1.as_str());
                        format!("column '{column}' (topic_column): {rule}")
                    })
            })
            .clone()
    }
}

/// Checks an attribute key; the rule does not repeat the key (a key from the attributes
/// column is a row's value), the caller names where it came from.
fn check_attribute_key(key: &str) -> std::result::Result<(), String> {
    if key.len() > MAX_ATTRIBUTE_KEY_BYTES {
        return Err(format!(
            "the key is {} bytes, over the Pub/Sub limit of {MAX_ATTRIBUTE_KEY_BYTES} bytes",
            key.len()
        ));
    }
    if key.starts_with(RESERVED_PREFIX) {
        return Err(format!(
            "the key starts with '{RESERVED_PREFIX}', which Pub/Sub reserves"
        ));
    }
    Ok(())
}

/// The per-batch view of the mapping's columns.
struct Bound<'a> {
    topic: Option<BytesColumn<'a>>,
    payload: BoundPayload<'a>,
    attribute_map: Option<MapAttributes<'a>>,
    attribute_columns: Vec<(&'a str, ColumnEncoder<'a>)>,
    ordering_key: Option<BytesColumn<'a>>,
}

enum BoundPayload<'a> {
    Bytes(BytesColumn<'a>),
    Json(JsonRows<'a>),
    /// Each row's schema'd payload (or the reason the schema refuses it), encoded per batch.
    Schema(Vec<RowPayload>),
    Empty,
}

struct MapAttributes<'a> {
    map_nulls: Option<arrow::buffer::NullBuffer>,
    offsets: &'a [i32],
    keys: BytesColumn<'a>,
    values: BytesColumn<'a>,
}

/// Buffers reused from row to row.
#[derive(Default)]
struct Scratch<'a> {
    json: Vec<u8>,
    text: Vec<u8>,
    attributes: Vec<(Piece<'a>, Piece<'a>)>,
    /// One shared copy per ordering key of the batch, rather than an allocation per row.
    ordering_keys: HashMap<&'a str, Arc<str>>,
}

/// An attribute key or value: borrowed from the batch, or a range of the text scratch buffer.
enum Piece<'a> {
    Slice(&'a [u8]),
    Text(Range<usize>),
}

impl Piece<'_> {
    fn bytes<'s>(&'s self, text: &'s [u8]) -> &'s [u8] {
        match self {
            Piece::Slice(s) => s,
            Piece::Text(r) => &text[r.clone()],
        }
    }
}

// --- protobuf wire format of google.pubsub.v1.PubsubMessage ------------------------------------
// Field numbers from pubsub.proto: data = 1, attributes = 2 (map<string, string>: an entry message
// with key = 1, value = 2), ordering_key = 5. Length-delimited fields use wire type 2.

const TAG_DATA: u8 = (1 << 3) | 2;
const TAG_ATTRIBUTES: u8 = (2 << 3) | 2;
const TAG_ORDERING_KEY: u8 = (5 << 3) | 2;
const TAG_MAP_KEY: u8 = (1 << 3) | 2;
const TAG_MAP_VALUE: u8 = (2 << 3) | 2;
// PublishRequest: topic = 1, messages = 2 (repeated PubsubMessage).
const TAG_REQUEST_TOPIC: u8 = (1 << 3) | 2;
const TAG_REQUEST_MESSAGES: u8 = (2 << 3) | 2;

fn varint_len(value: u64) -> u64 {
    // 7 payload bits per byte; 0 still takes one byte.
    u64::from((64 - (value | 1).leading_zeros()).div_ceil(7))
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Length of a length-delimited field with a one-byte tag and a `len`-byte body.
fn field_len(len: u64) -> u64 {
    1 + varint_len(len) + len
}

/// Length of an attributes map entry's body; empty strings are left out, as protobuf does.
fn map_entry_len(key: u64, value: u64) -> u64 {
    (if key == 0 { 0 } else { field_len(key) }) + (if value == 0 { 0 } else { field_len(value) })
}

fn put_bytes_field(out: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
    out.push(tag);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Appends a `PublishRequest` body for `topic` carrying `messages` (serialized `PubsubMessage`s):
/// field 1 the topic, field 2 each message.
pub fn write_publish_request<'r>(
    out: &mut Vec<u8>,
    topic: &str,
    messages: impl IntoIterator<Item = &'r [u8]>,
) {
    put_bytes_field(out, TAG_REQUEST_TOPIC, topic.as_bytes());
    for message in messages {
        put_bytes_field(out, TAG_REQUEST_MESSAGES, message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_lengths_match_prost() {
        for v in [0u64, 1, 127, 128, 16_383, 16_384, 1 << 35, u64::MAX] {
            assert_eq!(
                varint_len(v) as usize,
                prost::encoding::encoded_len_varint(v),
                "{v}"
            );
            let mut ours = Vec::new();
            put_varint(&mut ours, v);
            let mut theirs = Vec::new();
            prost::encoding::encode_varint(v, &mut theirs);
            assert_eq!(ours, theirs);
        }
    }

    #[test]
    fn topic_ids_follow_the_resource_name_rules() {
        assert!(validate_topic_id("abc").is_ok());
        assert!(validate_topic_id("a-b_c.d~e+f%g").is_ok());
        assert!(validate_topic_id("ab").unwrap_err().contains("3 to 255"));
        assert!(
            validate_topic_id(&"a".repeat(256))
                .unwrap_err()
                .contains("3 to 255")
        );
        assert!(validate_topic_id(&"a".repeat(255)).is_ok());
        assert!(
            validate_topic_id("1abc")
                .unwrap_err()
                .contains("start with a letter")
        );
        assert!(validate_topic_id("ab/c").unwrap_err().contains("'/'"));
        assert!(
            validate_topic_id("goog-topic")
                .unwrap_err()
                .contains("goog")
        );
    }

    #[test]
    fn resolves_short_and_full_topic_names() {
        assert_eq!(
            resolve_topic("clicks", Some("demo")).unwrap(),
            "projects/demo/topics/clicks"
        );
        assert_eq!(
            resolve_topic("projects/p1/topics/clicks", None).unwrap(),
            "projects/p1/topics/clicks"
        );
        for (name, project, rule) in [
            ("clicks", None, "no project"),
            (
                "projects/p1/subscriptions/x",
                None,
                "projects/PROJECT/topics/TOPIC",
            ),
            ("projects//topics/abc", None, "invalid project"),
            ("projects/p/topics/x", None, "3 to 255"),
            ("a/b", Some("p"), "neither"),
        ] {
            let err = resolve_topic(name, project).unwrap_err();
            assert!(err.contains(rule), "{name}: {err}");
        }
    }

    #[test]
    fn a_role_column_of_another_type_is_refused_naming_the_column_and_the_rule() {
        for (column, is_topic_column, rule) in [
            ("t", true, "topic_column must be a string column, not Int64"),
            (
                DEFAULT_DATA_COLUMN,
                false,
                "the data column must be a string or binary column, not Int64",
            ),
            (
                DEFAULT_ATTRIBUTES_COLUMN,
                false,
                "the attributes column must be a MAP of string keys to string values, not Int64",
            ),
            (
                DEFAULT_ORDERING_KEY_COLUMN,
                false,
                "the ordering key column must be a string column, not Int64",
            ),
        ] {
            let schema = Schema::new(vec![
                arrow::datatypes::Field::new(column, DataType::Int64, true),
                arrow::datatypes::Field::new("other", DataType::Utf8, true),
            ]);
            let spec = MappingSpec {
                topic_column: is_topic_column.then(|| column.to_string()),
                ..MappingSpec::default()
            };
            let err = PubSubMapping::new(&spec, &schema, Some("projects/p/topics/clicks"), None)
                .unwrap_err();
            assert!(
                matches!(&err, Error::Schema { column: c, rule: r } if c == column && r == rule),
                "{column}: {err}"
            );
        }
    }

    #[test]
    fn publish_request_bytes_decode_as_the_generated_type() {
        let message = PubsubMessage {
            data: b"x".to_vec(),
            ordering_key: "k".into(),
            ..Default::default()
        };
        let record = PubsubRecord::from_message(&message);
        let mut body = Vec::new();
        write_publish_request(
            &mut body,
            "projects/p/topics/abc",
            [record.encoded(), record.encoded()],
        );
        let decoded = gcloud_sdk::google::pubsub::v1::PublishRequest::decode(&body[..]).unwrap();
        assert_eq!(decoded.topic, "projects/p/topics/abc");
        assert_eq!(decoded.messages, vec![message.clone(), message]);
        assert_eq!(
            body.len() as u64,
            request_base_len("projects/p/topics/abc")
                + 2 * request_entry_len(record.encoded_len() as u64)
        );
    }
}
