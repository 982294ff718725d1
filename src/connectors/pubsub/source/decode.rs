//! Messages to rows.
//!
//! `format = 'json'`: each message's data is one JSON object; every declared column that is
//! not a metadata column is decoded from the member of the same name with Arrow's JSON decoder
//! (a missing member is NULL; numbers and booleans are accepted into string columns; a
//! timestamp column takes RFC 3339 text or a number). `format = 'raw'`: the data fills
//! `data_column` as it is, bytes into a binary column, UTF-8 text into a string column.
//! `format = 'avro'` / `'protobuf'` ([`MessageDecoder::with_schema`]): the schema's decoder
//! ([`SchemaRowDecoder`], in the formats layer) turns the payloads straight into the columns'
//! Arrow arrays (ADR 0065). The payload decoders live in [`crate::encode`]; this module keeps
//! what is Pub/Sub's: the metadata columns filled from the message (`message_id`,
//! `publish_time`, `ordering_key`, `attributes`, `delivery_attempt`), the encoding and the
//! schema revision Pub/Sub stamps on a message, and a bad message per payload that does not
//! decode.
//!
//! With a topic's schema, a message Pub/Sub stamped with another revision of it is read with
//! that revision's [`RevisionReader`] ([`MessageDecoder::decode_with`]; the readers are kept by
//! [`super::revisions`], ADR 0062).
//!
//! A message that does not decode is reported as a [`BadMessage`] naming its message id and,
//! where one can be singled out, the column; never the data. The whole response decodes in one
//! pass; only when that pass fails is each payload decoded alone to find the bad ones.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BinaryArray, Int32Array, MapArray, RecordBatch, RecordBatchOptions, StringArray,
    StructArray, TimestampNanosecondArray,
};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Fields, SchemaRef};
use gcloud_sdk::google::pubsub::v1::ReceivedMessage;

use super::options::{DATA_COLUMN, SourceColumns};
use crate::encode::json::decode::JsonRowDecoder;
use crate::encode::rows::{DecodedRows, RowFault, null_columns};
use crate::encode::schema::{PayloadSchema, SchemaEncoding, SchemaRowDecoder};
use crate::error::{Error, Result};
use crate::options::PayloadFormat;

/// The attribute Pub/Sub stamps on a message published to a topic with a schema: the encoding
/// it was validated in (`JSON` or `BINARY`).
pub const SCHEMA_ENCODING_ATTRIBUTE: &str = "googclient_schemaencoding";
/// The attribute Pub/Sub stamps on a message published to a topic with a schema: the schema's
/// name, `projects/P/schemas/S`.
pub const SCHEMA_NAME_ATTRIBUTE: &str = "googclient_schemaname";
/// The attribute Pub/Sub stamps on a message published to a topic with a schema: the id of the
/// schema revision the message was validated against.
pub const SCHEMA_REVISION_ATTRIBUTE: &str = "googclient_schemarevisionid";

/// How the payloads published with another revision of the schema a scan bound are read
/// ([`MessageDecoder::for_revision`], ADR 0062).
#[derive(Debug)]
pub enum RevisionReader {
    /// The revision's decoder, bound to the columns whose fields the revision has.
    Decoder {
        /// The decoder.
        decoder: SchemaRowDecoder,
        /// `revision R of schema 'S'`, for the reasons.
        label: String,
    },
    /// The revision cannot be read into the table: each of its messages is a bad message.
    Refused {
        /// The column to blame, when one is.
        column: Option<String>,
        /// Why, naming the revision (never data).
        reason: String,
    },
}

/// Where one column's values come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Filler {
    /// The payload's field or JSON member of the column's name (index among the payload
    /// columns).
    Json(usize),
    /// The message data (raw).
    Data,
    Attributes,
    OrderingKey,
    MessageId,
    PublishTime,
    DeliveryAttempt,
}

/// A message that did not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadMessage {
    /// Its position in the decoded slice.
    pub index: usize,
    /// The service's id of the message.
    pub message_id: String,
    /// The column that did not decode, when one can be named.
    pub column: Option<String>,
    /// Why, without the data.
    pub reason: String,
}

impl BadMessage {
    /// The text of an error or a dead letter: message id, column and reason.
    pub fn describe(&self) -> String {
        match &self.column {
            Some(c) => format!(
                "message '{}': column '{c}': {}",
                self.message_id, self.reason
            ),
            None => format!("message '{}': {}", self.message_id, self.reason),
        }
    }
}

/// The rows of the good messages, and the bad ones.
#[derive(Debug)]
pub struct Decoded {
    /// One row per good message, in order, in the table's schema.
    pub batch: RecordBatch,
    /// The messages that did not decode, in order.
    pub bad: Vec<BadMessage>,
}

/// Turns messages into rows of one table schema; built once per table, checked against it.
#[derive(Debug, Clone)]
pub struct MessageDecoder {
    schema: SchemaRef,
    /// The columns decoded from the payload: with `format = 'json'`, from its members.
    json: JsonRowDecoder,
    fillers: Vec<Filler>,
    payload: Option<Arc<SchemaPayload>>,
}

/// `format = 'avro' | 'protobuf'`: the schema's decoder, which turns the payloads into the
/// payload columns.
#[derive(Debug)]
struct SchemaPayload {
    decoder: SchemaRowDecoder,
    /// The encoding of a message without the [`SCHEMA_ENCODING_ATTRIBUTE`].
    encoding: SchemaEncoding,
    /// `avro` or `protobuf`, for the reasons.
    format: &'static str,
}

impl SchemaPayload {
    /// The encoding of `m`: the one Pub/Sub stamped on it, else the configured one.
    fn encoding_of(&self, m: &ReceivedMessage) -> SchemaEncoding {
        let stamped = m
            .message
            .as_ref()
            .and_then(|m| m.attributes.get(SCHEMA_ENCODING_ATTRIBUTE));
        match stamped.map(String::as_str) {
            Some("JSON") => SchemaEncoding::Json,
            Some("BINARY") => SchemaEncoding::Binary,
            _ => self.encoding,
        }
    }
}

fn is_string(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

fn is_binary(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView
    )
}

/// The key and value fields of a `MAP(VARCHAR, VARCHAR)` type.
fn string_map(t: &DataType) -> Option<(&Fields, bool)> {
    if let DataType::Map(entries, sorted) = t
        && let DataType::Struct(fields) = entries.data_type()
        && fields.len() == 2
        && is_string(fields[0].data_type())
        && is_string(fields[1].data_type())
    {
        return Some((fields, *sorted));
    }
    None
}

impl MessageDecoder {
    /// Checks `schema` against the format and the metadata columns, naming the column and both
    /// types on a mismatch.
    pub fn new(schema: SchemaRef, format: PayloadFormat, columns: &SourceColumns) -> Result<Self> {
        // In the order of `SourceColumns::slots`.
        let roles = [
            Filler::Data,
            Filler::Attributes,
            Filler::OrderingKey,
            Filler::MessageId,
            Filler::PublishTime,
            Filler::DeliveryAttempt,
        ];
        let meta: Vec<_> = columns
            .slots()
            .into_iter()
            .zip(roles)
            .map(|((spec, column), filler)| (spec, column, filler))
            .collect();
        for (spec, column, _) in &meta {
            if let Some(c) = column
                && schema.field_with_name(c).is_err()
            {
                return Err(Error::schema(
                    *c,
                    format!("named by '{}' but the table has no such column", spec.name),
                ));
            }
        }
        let mut fillers = Vec::with_capacity(schema.fields().len());
        let mut json_fields = Vec::new();
        for field in schema.fields() {
            let name = field.name();
            let t = field.data_type();
            let found = meta.iter().find(|(_, c, _)| *c == Some(name.as_str()));
            let filler = match found {
                Some((spec, _, filler)) => {
                    let (ok, wanted) = match filler {
                        Filler::Data => (
                            is_string(t) || is_binary(t),
                            "a binary type (BYTEA) for the bytes, or a string type (VARCHAR) for UTF-8 text",
                        ),
                        Filler::Attributes => (string_map(t).is_some(), "MAP(VARCHAR, VARCHAR)"),
                        Filler::OrderingKey | Filler::MessageId => {
                            (is_string(t), "a string type (VARCHAR)")
                        }
                        Filler::PublishTime => (
                            matches!(t, DataType::Timestamp(_, _)),
                            "a TIMESTAMP type (any unit, with or without a time zone)",
                        ),
                        Filler::DeliveryAttempt => (
                            matches!(t, DataType::Int32 | DataType::Int64) && field.is_nullable(),
                            "a nullable INT or BIGINT (it is NULL when the subscription has no dead-letter policy)",
                        ),
                        Filler::Json(_) => (true, ""),
                    };
                    if !ok {
                        return Err(Error::schema(
                            name,
                            format!(
                                "the column named by '{}' is declared {t}{}, but it must be {wanted}",
                                spec.name,
                                if field.is_nullable() { "" } else { " NOT NULL" },
                            ),
                        ));
                    }
                    *filler
                }
                None => match format {
                    PayloadFormat::Raw => {
                        return Err(Error::schema(
                            name,
                            format!(
                                "format = 'raw' fills only '{}' ({}) and the metadata columns the \
                                 options name; decode columns from JSON with format = 'json', or \
                                 name this column in a *_column option",
                                DATA_COLUMN.name,
                                columns.data.as_deref().unwrap_or_default()
                            ),
                        ));
                    }
                    PayloadFormat::Json => {
                        if let Err(e) = JsonRowDecoder::check(field) {
                            return Err(Error::schema(
                                name,
                                format!(
                                    "format = 'json' cannot decode a column of type {t} from JSON \
                                     ({e}); declare a type Arrow's JSON decoder reads"
                                ),
                            ));
                        }
                        json_fields.push(field.clone());
                        Filler::Json(json_fields.len() - 1)
                    }
                },
            };
            fillers.push(filler);
        }
        Ok(MessageDecoder {
            schema,
            json: JsonRowDecoder::new(json_fields),
            fillers,
            payload: None,
        })
    }

    /// This decoder with its data columns decoded from payloads of `schema` (`format = 'avro'`
    /// or `'protobuf'`, or a topic's schema) instead of JSON objects: the columns are checked
    /// against the schema's fields by name (an error names the column, the field and both
    /// types). A message Pub/Sub stamped with its encoding ([`SCHEMA_ENCODING_ATTRIBUTE`]) is
    /// decoded in that encoding, any other in `schema.encoding`.
    pub fn with_schema(&self, schema: &PayloadSchema) -> Result<Self> {
        let columns: Vec<usize> = self
            .fillers
            .iter()
            .enumerate()
            .filter_map(|(i, f)| matches!(f, Filler::Json(_)).then_some(i))
            .collect();
        let decoder = SchemaRowDecoder::new(schema, &self.schema, &columns)?;
        Ok(MessageDecoder {
            payload: Some(Arc::new(SchemaPayload {
                decoder,
                encoding: schema.encoding,
                format: schema.kind.name(),
            })),
            ..self.clone()
        })
    }

    /// The reader of the payloads published with another revision of the schema, `schema`
    /// (described as `label` in reasons): the same column-to-field rules as
    /// [`with_schema`](Self::with_schema), except that a column whose field the revision lacks
    /// reads NULL when it is nullable. A NOT NULL column the revision lacks, a field whose type
    /// does not convert, or a definition that does not compile refuses every message of the
    /// revision, naming the column and field where one is to blame.
    pub fn for_revision(&self, schema: &PayloadSchema, label: &str) -> RevisionReader {
        let refused = |column: Option<String>, reason: String| RevisionReader::Refused {
            column,
            reason: format!("{label}: {reason}"),
        };
        let names = match SchemaRowDecoder::field_names(schema) {
            Ok(names) => names,
            Err(e) => return refused(None, e.to_string()),
        };
        let mut columns = Vec::new();
        for (i, filler) in self.fillers.iter().enumerate() {
            if !matches!(filler, Filler::Json(_)) {
                continue;
            }
            let field = self.schema.field(i);
            if names.iter().any(|n| n == field.name()) {
                columns.push(i);
            } else if !field.is_nullable() {
                return refused(
                    Some(field.name().clone()),
                    format!(
                        "the revision has no field '{}' and the column is NOT NULL",
                        field.name()
                    ),
                );
            }
        }
        match SchemaRowDecoder::new(schema, &self.schema, &columns) {
            Ok(decoder) => RevisionReader::Decoder {
                decoder,
                label: label.to_string(),
            },
            Err(e) => refused(None, e.to_string()),
        }
    }

    /// The table schema rows are decoded into.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn data(m: &ReceivedMessage) -> &[u8] {
        m.message.as_ref().map_or(&[][..], |m| m.data.as_slice())
    }

    fn message_id(m: &ReceivedMessage) -> &str {
        m.message.as_ref().map_or("", |m| m.message_id.as_str())
    }

    /// Decodes `messages`: one row per message that decodes, and the ones that do not.
    pub fn decode(&self, messages: &[ReceivedMessage]) -> Result<Decoded> {
        self.decode_with(messages, |_| None)
    }

    /// [`decode`](Self::decode), reading the payload of each message for which `revision`
    /// gives a [`RevisionReader`] with that reader instead of this decoder's schema (a
    /// [`RevisionReader::Refused`] makes the message a bad message). Rows keep the messages'
    /// order.
    pub fn decode_with<'r>(
        &self,
        messages: &[ReceivedMessage],
        revision: impl Fn(&ReceivedMessage) -> Option<&'r RevisionReader>,
    ) -> Result<Decoded> {
        let mut bad = Vec::new();
        let mut good: Vec<usize> = (0..messages.len()).collect();
        // The data column of a string type must be UTF-8.
        if let Some(i) = self.fillers.iter().position(|f| *f == Filler::Data)
            && is_string(self.schema.field(i).data_type())
        {
            good.retain(|&m| {
                if std::str::from_utf8(Self::data(&messages[m])).is_ok() {
                    true
                } else {
                    bad.push(BadMessage {
                        index: m,
                        message_id: Self::message_id(&messages[m]).to_string(),
                        column: Some(self.schema.field(i).name().clone()),
                        reason: "the data is not UTF-8 text (declare the column as a binary type to take any bytes)".into(),
                    });
                    false
                }
            });
        }
        let (good, payload_columns) = self.decode_payloads(messages, good, &revision, &mut bad)?;
        bad.sort_by_key(|b| b.index);
        let rows: Vec<&ReceivedMessage> = good.iter().map(|&i| &messages[i]).collect();
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(self.fillers.len());
        for (field, filler) in self.schema.fields().iter().zip(&self.fillers) {
            let t = field.data_type();
            let built: ArrayRef = match filler {
                Filler::Json(j) => payload_columns[*j].clone(),
                Filler::Data => {
                    let bytes = BinaryArray::from_iter_values(rows.iter().map(|m| Self::data(m)));
                    if is_string(t) {
                        // Checked above: every row left is UTF-8.
                        let text = StringArray::from_iter_values(
                            rows.iter()
                                .map(|m| std::str::from_utf8(Self::data(m)).unwrap_or_default()),
                        );
                        cast(&text, t)?
                    } else {
                        cast(&bytes, t)?
                    }
                }
                Filler::MessageId => cast(
                    &StringArray::from_iter_values(rows.iter().map(|m| Self::message_id(m))),
                    t,
                )?,
                Filler::OrderingKey => cast(
                    &StringArray::from_iter_values(
                        rows.iter()
                            .map(|m| m.message.as_ref().map_or("", |m| m.ordering_key.as_str())),
                    ),
                    t,
                )?,
                Filler::PublishTime => {
                    let nanos: TimestampNanosecondArray = rows
                        .iter()
                        .map(|m| {
                            m.message
                                .as_ref()
                                .and_then(|m| m.publish_time.as_ref())
                                .and_then(|ts| {
                                    ts.seconds
                                        .checked_mul(1_000_000_000)
                                        .and_then(|s| s.checked_add(i64::from(ts.nanos)))
                                })
                        })
                        .collect();
                    cast(&nanos.with_timezone("UTC"), t)?
                }
                Filler::DeliveryAttempt => {
                    let attempts: Int32Array = rows
                        .iter()
                        .map(|m| (m.delivery_attempt > 0).then_some(m.delivery_attempt))
                        .collect();
                    cast(&attempts, t)?
                }
                Filler::Attributes => attributes_array(t, &rows)?,
            };
            arrays.push(built);
        }
        let batch = RecordBatch::try_new_with_options(
            self.schema.clone(),
            arrays,
            &RecordBatchOptions::new().with_row_count(Some(rows.len())),
        )?;
        Ok(Decoded { batch, bad })
    }

    /// The payload columns of the `good` messages: decoded by the schema's decoders (each
    /// message by its revision's, ADR 0062), or from JSON objects. The messages that do not
    /// decode join `bad`; the rest are returned in order with one array per payload column.
    fn decode_payloads<'r>(
        &self,
        messages: &[ReceivedMessage],
        good: Vec<usize>,
        revision: &impl Fn(&ReceivedMessage) -> Option<&'r RevisionReader>,
        bad: &mut Vec<BadMessage>,
    ) -> Result<(Vec<usize>, Vec<ArrayRef>)> {
        let fields = self.json.fields();
        if fields.is_empty() {
            return Ok((good, Vec::new()));
        }
        let Some(p) = &self.payload else {
            let datas: Vec<&[u8]> = messages.iter().map(Self::data).collect();
            let decoded = self.json.decode(good, &datas, "JSON member")?;
            for (i, fault) in decoded.faults {
                bad.push(Self::bad_message(i, &messages[i], fault, |r| r));
            }
            return Ok((decoded.rows, decoded.columns));
        };
        // The messages of each decoder (this one's first), in order.
        let mut groups: Vec<(&SchemaRowDecoder, Option<&str>, Vec<usize>)> =
            vec![(&p.decoder, None, Vec::new())];
        for i in good {
            let (decoder, label) = match revision(&messages[i]) {
                None => (&p.decoder, None),
                Some(RevisionReader::Decoder { decoder, label }) => (decoder, Some(label.as_str())),
                Some(RevisionReader::Refused { column, reason }) => {
                    bad.push(BadMessage {
                        index: i,
                        message_id: Self::message_id(&messages[i]).to_string(),
                        column: column.clone(),
                        reason: reason.clone(),
                    });
                    continue;
                }
            };
            match groups.iter_mut().find(|g| std::ptr::eq(g.0, decoder)) {
                Some(group) => group.2.push(i),
                None => groups.push((decoder, label, vec![i])),
            }
        }
        let mut parts = Vec::with_capacity(groups.len());
        for (decoder, label, members) in groups {
            if members.is_empty() {
                continue;
            }
            let datas: Vec<&[u8]> = members.iter().map(|&i| Self::data(&messages[i])).collect();
            let encodings: Vec<SchemaEncoding> = members
                .iter()
                .map(|&i| p.encoding_of(&messages[i]))
                .collect();
            let decoded = decoder.decode(&datas, &encodings)?;
            for (local, fault) in decoded.faults {
                let i = members[local];
                bad.push(Self::bad_message(i, &messages[i], fault, |reason| {
                    format!(
                        "format '{}' ({}{}{}): {reason}",
                        p.format,
                        encodings[local].name(),
                        if label.is_some() { ", " } else { "" },
                        label.unwrap_or_default()
                    )
                }));
            }
            // A revision's decoder fills the columns whose fields it has; the others are NULL.
            let mut columns = null_columns(fields, decoded.rows.len());
            for (target, array) in decoder.targets().iter().zip(decoded.columns) {
                if let Some(j) = fields.iter().position(|f| f.name() == target.name()) {
                    columns[j] = array;
                }
            }
            parts.push(DecodedRows {
                rows: decoded
                    .rows
                    .into_iter()
                    .map(|local| members[local])
                    .collect(),
                columns,
                faults: Vec::new(),
            });
        }
        let merged = DecodedRows::merge(parts, fields)?;
        Ok((merged.rows, merged.columns))
    }

    /// The bad message of `fault`; `payload` words the reason of a payload that does not
    /// decode at all.
    fn bad_message(
        index: usize,
        m: &ReceivedMessage,
        fault: RowFault,
        payload: impl FnOnce(String) -> String,
    ) -> BadMessage {
        let (column, reason) = match fault {
            RowFault::Payload(reason) => (None, payload(reason)),
            RowFault::Column { column, reason } => (Some(column), reason),
        };
        BadMessage {
            index,
            message_id: Self::message_id(m).to_string(),
            column,
            reason,
        }
    }
}

/// The attributes of `rows` as a map column of type `t` (checked to be a string map), keys in
/// order.
fn attributes_array(t: &DataType, rows: &[&ReceivedMessage]) -> Result<ArrayRef> {
    let Some((fields, sorted)) = string_map(t) else {
        return Err(Error::Unsupported(format!(
            "internal: attributes column of type {t}"
        )));
    };
    let DataType::Map(entries, _) = t else {
        return unreachable_map();
    };
    let mut keys = Vec::new();
    let mut values = Vec::new();
    let mut offsets = vec![0usize];
    for m in rows {
        if let Some(message) = &m.message {
            let mut pairs: Vec<(&String, &String)> = message.attributes.iter().collect();
            pairs.sort();
            for (k, v) in pairs {
                keys.push(k.as_str());
                values.push(v.as_str());
            }
        }
        offsets.push(keys.len());
    }
    let keys = cast(&StringArray::from(keys), fields[0].data_type())?;
    let values = cast(&StringArray::from(values), fields[1].data_type())?;
    let entries_array = StructArray::try_new(fields.clone(), vec![keys, values], None)?;
    Ok(Arc::new(MapArray::try_new(
        entries.clone(),
        OffsetBuffer::from_lengths(offsets.windows(2).map(|w| w[1] - w[0])),
        entries_array,
        None,
        sorted,
    )?))
}

fn unreachable_map<T>() -> Result<T> {
    Err(Error::Unsupported("internal: not a map type".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::{Field, Int64Type, Schema, TimeUnit};
    use gcloud_sdk::google::pubsub::v1::PubsubMessage;

    fn message(id: &str, data: &[u8]) -> ReceivedMessage {
        ReceivedMessage {
            ack_id: format!("ack-{id}"),
            message: Some(PubsubMessage {
                data: data.to_vec(),
                message_id: id.to_string(),
                attributes: [
                    ("b".to_string(), "2".to_string()),
                    ("a".to_string(), "1".to_string()),
                ]
                .into_iter()
                .collect(),
                ordering_key: "k".into(),
                publish_time: Some(prost_types::Timestamp {
                    seconds: 1_700_000_000,
                    nanos: 123_000,
                }),
            }),
            delivery_attempt: 0,
        }
    }

    fn attrs_type() -> DataType {
        DataType::Map(
            Arc::new(Field::new(
                "entries",
                DataType::Struct(Fields::from(vec![
                    Field::new("key", DataType::Utf8, false),
                    Field::new("value", DataType::Utf8View, true),
                ])),
                false,
            )),
            false,
        )
    }

    fn columns() -> SourceColumns {
        SourceColumns {
            attributes: Some("attrs".into()),
            message_id: Some("id".into()),
            publish_time: Some("pt".into()),
            ordering_key: Some("key".into()),
            delivery_attempt: Some("n".into()),
            ..Default::default()
        }
    }

    fn json_schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("user_id", DataType::Int64, true),
            Field::new("url", DataType::Utf8View, true),
            Field::new("id", DataType::Utf8, true),
            Field::new("pt", DataType::Timestamp(TimeUnit::Microsecond, None), true),
            Field::new("key", DataType::Utf8View, true),
            Field::new("attrs", attrs_type(), true),
            Field::new("n", DataType::Int64, true),
        ]))
    }

    #[test]
    fn json_messages_fill_the_declared_and_metadata_columns() {
        let d = MessageDecoder::new(json_schema(), PayloadFormat::Json, &columns()).unwrap();
        let out = d
            .decode(&[
                message("m1", br#"{"user_id": 7, "url": "/a"}"#),
                message("m2", br#"{"url": "/b", "other": true}"#),
            ])
            .unwrap();
        assert!(out.bad.is_empty());
        let b = out.batch;
        assert_eq!(b.num_rows(), 2);
        let ids = b.column(0).as_primitive::<Int64Type>();
        assert_eq!(ids.value(0), 7);
        assert!(ids.is_null(1));
        let url = cast(b.column(1), &DataType::Utf8).unwrap();
        assert_eq!(url.as_string::<i32>().value(1), "/b");
        assert_eq!(b.column(2).as_string::<i32>().value(0), "m1");
        let pt = b
            .column(3)
            .as_primitive::<datafusion::arrow::datatypes::TimestampMicrosecondType>();
        assert_eq!(pt.value(0), 1_700_000_000_000_123);
        let attrs = b.column(5).as_map();
        let keys = attrs.value(0).column(0).as_string::<i32>().clone();
        assert_eq!(keys.value(0), "a");
        assert_eq!(keys.value(1), "b");
        assert!(
            b.column(6).is_null(0),
            "no dead-letter policy: NULL attempt"
        );
    }

    #[test]
    fn a_bad_message_is_named_with_its_column_and_never_its_data() {
        let d = MessageDecoder::new(json_schema(), PayloadFormat::Json, &columns()).unwrap();
        let out = d
            .decode(&[
                message("m1", br#"{"user_id": 1}"#),
                message("m2", br#"{"user_id": "secret-value"}"#),
                message("m3", b"not json secret"),
                message("m4", br#"{"user_id": 4}{"user_id": 5}"#),
                message("m5", br#"{"user_id": 5}"#),
            ])
            .unwrap();
        assert_eq!(out.batch.num_rows(), 2);
        let ids: Vec<_> = out.bad.iter().map(|b| b.message_id.as_str()).collect();
        assert_eq!(ids, ["m2", "m3", "m4"]);
        assert_eq!(out.bad[0].column.as_deref(), Some("user_id"));
        for b in &out.bad {
            assert!(!b.describe().contains("secret"), "{}", b.describe());
        }
        assert!(out.bad[1].describe().contains("not one JSON object"));
        let kept = out.batch.column(0).as_primitive::<Int64Type>();
        assert_eq!(kept.values().to_vec(), vec![1, 5]);
    }

    #[test]
    fn raw_fills_bytes_or_text() {
        let cols = SourceColumns {
            data: Some("data".into()),
            ..Default::default()
        };
        let text = Arc::new(Schema::new(vec![Field::new(
            "data",
            DataType::Utf8View,
            true,
        )]));
        let d = MessageDecoder::new(text, PayloadFormat::Raw, &cols).unwrap();
        let out = d
            .decode(&[message("m1", b"hello"), message("m2", &[0xff, 0xfe])])
            .unwrap();
        assert_eq!(out.batch.num_rows(), 1);
        assert_eq!(out.bad[0].message_id, "m2");
        assert!(out.bad[0].reason.contains("UTF-8"));
        let bytes = Arc::new(Schema::new(vec![Field::new(
            "data",
            DataType::Binary,
            true,
        )]));
        let d = MessageDecoder::new(bytes, PayloadFormat::Raw, &cols).unwrap();
        let out = d.decode(&[message("m2", &[0xff, 0xfe])]).unwrap();
        assert_eq!(
            out.batch.column(0).as_binary::<i32>().value(0),
            &[0xff, 0xfe]
        );
    }

    #[test]
    fn schemas_that_cannot_be_filled_are_refused_naming_column_and_types() {
        let with = |fields: Vec<Field>, format, cols: &SourceColumns| {
            MessageDecoder::new(Arc::new(Schema::new(fields)), format, cols)
                .unwrap_err()
                .to_string()
        };
        let only = |set: fn(&mut SourceColumns)| {
            let mut c = SourceColumns::default();
            set(&mut c);
            c
        };
        let e = with(
            vec![Field::new("pt", DataType::Utf8, true)],
            PayloadFormat::Json,
            &only(|c| c.publish_time = Some("pt".into())),
        );
        assert!(
            e.contains("'pt'")
                && e.contains("publish_time_column")
                && e.contains("Utf8")
                && e.contains("TIMESTAMP"),
            "{e}"
        );
        let e = with(
            vec![Field::new("attrs", DataType::Utf8, true)],
            PayloadFormat::Json,
            &only(|c| c.attributes = Some("attrs".into())),
        );
        assert!(
            e.contains("'attrs'") && e.contains("MAP(VARCHAR, VARCHAR)"),
            "{e}"
        );
        let e = with(
            vec![Field::new("n", DataType::Int64, false)],
            PayloadFormat::Json,
            &only(|c| c.delivery_attempt = Some("n".into())),
        );
        assert!(
            e.contains("'n'") && e.contains("NOT NULL") && e.contains("nullable"),
            "{e}"
        );
        let e = with(
            vec![Field::new("x", DataType::Int64, true)],
            PayloadFormat::Json,
            &columns(),
        );
        assert!(e.contains("'attrs'") && e.contains("no such column"), "{e}");
        let raw = SourceColumns {
            data: Some("data".into()),
            ..Default::default()
        };
        let e = with(
            vec![
                Field::new("data", DataType::Binary, true),
                Field::new("extra", DataType::Int64, true),
            ],
            PayloadFormat::Raw,
            &raw,
        );
        assert!(e.contains("'extra'") && e.contains("raw"), "{e}");
        let e = with(
            vec![Field::new("data", DataType::Int64, true)],
            PayloadFormat::Raw,
            &raw,
        );
        assert!(
            e.contains("'data'") && e.contains("Int64") && e.contains("binary"),
            "{e}"
        );
    }

    const AVRO: &str = r#"{"type": "record", "name": "R", "fields": [
      {"name": "id", "type": "long"},
      {"name": "ts", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
      {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
      {"name": "bin", "type": ["null", "bytes"]},
      {"name": "tags", "type": {"type": "array", "items": "string"}},
      {"name": "unused", "type": "string"}
    ]}"#;

    const PROTO: &str = r#"syntax = "proto3";
    import "google/protobuf/timestamp.proto";
    message R {
      int64 id = 1;
      google.protobuf.Timestamp ts = 2;
      string amount = 3;
      optional bytes bin = 4;
      repeated string tags = 5;
      string unused = 6;
    }"#;

    /// The columns of the schema tests; the last one named `last`.
    fn schema_table_with(last: &str) -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("ts", DataType::Timestamp(TimeUnit::Microsecond, None), true),
            Field::new("amount", DataType::Decimal128(10, 2), true),
            Field::new("bin", DataType::Binary, true),
            Field::new(
                "tags",
                DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
                true,
            ),
            Field::new(last, DataType::Utf8, true),
        ]))
    }

    /// The source's table: the message id in `mid`.
    fn schema_table() -> SchemaRef {
        schema_table_with("mid")
    }

    /// Two rows, encoded by the sink's encoder for `kind` and `encoding` (the `unused` field
    /// left out: a NULL, or the proto3 default).
    fn payloads(kind: SchemaType, definition: &str, encoding: SchemaEncoding) -> Vec<Vec<u8>> {
        use datafusion::arrow::array::{Decimal128Array, Int64Array, ListBuilder, StringBuilder};
        let schema = schema_table_with("unused");
        let mut tags = ListBuilder::new(StringBuilder::new());
        tags.values().append_value("a");
        tags.values().append_value("b");
        tags.append(true);
        tags.append(true);
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(datafusion::arrow::array::TimestampMicrosecondArray::from(
                    vec![Some(1_700_000_000_123_456), None],
                )),
                Arc::new(
                    Decimal128Array::from(vec![1234, -5])
                        .with_precision_and_scale(10, 2)
                        .unwrap(),
                ),
                Arc::new(BinaryArray::from(vec![Some(&[0u8, 255][..]), None])),
                Arc::new(tags.finish()),
                Arc::new(StringArray::from(vec!["u", "v"])),
            ],
        )
        .unwrap();
        let encoder = crate::encode::schema::SchemaRowEncoder::new(
            &PayloadSchema {
                kind,
                definition: definition.into(),
                encoding,
                origin: "test".into(),
            },
            &schema,
            &[0, 1, 2, 3, 4, 5],
        )
        .unwrap();
        encoder
            .encode_batch(&batch)
            .unwrap()
            .into_iter()
            .map(|p| p.unwrap())
            .collect()
    }

    fn schema_decoder(
        kind: SchemaType,
        definition: &str,
        encoding: SchemaEncoding,
    ) -> MessageDecoder {
        let cols = SourceColumns {
            message_id: Some("mid".into()),
            ..Default::default()
        };
        MessageDecoder::new(schema_table(), PayloadFormat::Json, &cols)
            .unwrap()
            .with_schema(&PayloadSchema {
                kind,
                definition: definition.into(),
                encoding,
                origin: "option 'schema'".into(),
            })
            .unwrap()
    }

    use crate::encode::schema::SchemaType;

    fn check_two_rows(b: &RecordBatch) {
        assert_eq!(b.num_rows(), 2);
        assert_eq!(
            b.column(0).as_primitive::<Int64Type>().values().to_vec(),
            vec![1, 2]
        );
        let ts = b
            .column(1)
            .as_primitive::<datafusion::arrow::datatypes::TimestampMicrosecondType>();
        assert_eq!(ts.value(0), 1_700_000_000_123_456);
        assert!(ts.is_null(1));
        let amount = b
            .column(2)
            .as_primitive::<datafusion::arrow::datatypes::Decimal128Type>();
        assert_eq!(amount.values().to_vec(), vec![1234, -5]);
        let bin = b.column(3).as_binary::<i32>();
        assert_eq!(bin.value(0), &[0, 255]);
        assert!(bin.is_null(1));
        let tags = b.column(4).as_list::<i32>();
        assert_eq!(tags.value(0).as_string::<i32>().value(1), "b");
        assert_eq!(tags.value(1).len(), 0);
        assert_eq!(b.column(5).as_string::<i32>().value(1), "m2");
    }

    /// Runs `check` for each format and encoding with the sink's two payloads and a decoder.
    fn each_schema(check: impl Fn(SchemaType, SchemaEncoding, Vec<Vec<u8>>, MessageDecoder)) {
        for (kind, definition) in [(SchemaType::Avro, AVRO), (SchemaType::Protobuf, PROTO)] {
            for encoding in [SchemaEncoding::Binary, SchemaEncoding::Json] {
                check(
                    kind,
                    encoding,
                    payloads(kind, definition, encoding),
                    schema_decoder(kind, definition, encoding),
                );
            }
        }
    }

    #[test]
    fn avro_and_protobuf_payloads_decode_in_both_encodings() {
        each_schema(|kind, encoding, datas, d| {
            let out = d
                .decode(&[message("m1", &datas[0]), message("m2", &datas[1])])
                .unwrap();
            assert!(out.bad.is_empty(), "{kind:?} {encoding:?}: {:?}", out.bad);
            check_two_rows(&out.batch);
        });
    }

    #[test]
    fn the_encoding_pubsub_stamped_on_a_message_wins() {
        for (kind, definition) in [(SchemaType::Avro, AVRO), (SchemaType::Protobuf, PROTO)] {
            let json = payloads(kind, definition, SchemaEncoding::Json);
            let binary = payloads(kind, definition, SchemaEncoding::Binary);
            let d = schema_decoder(kind, definition, SchemaEncoding::Binary);
            let mut first = message("m1", &json[0]);
            if let Some(m) = first.message.as_mut() {
                m.attributes
                    .insert(SCHEMA_ENCODING_ATTRIBUTE.into(), "JSON".into());
            }
            let out = d.decode(&[first, message("m2", &binary[1])]).unwrap();
            assert!(out.bad.is_empty(), "{kind:?}: {:?}", out.bad);
            check_two_rows(&out.batch);
        }
    }

    #[test]
    fn a_payload_that_does_not_decode_is_a_bad_message_without_its_data() {
        each_schema(|kind, encoding, datas, d| {
            let out = d
                .decode(&[
                    message("m1", &datas[0]),
                    message("m2", b"\x02{secret"),
                    message("m3", &datas[1][..datas[1].len() - 1]),
                    message("m4", &datas[1]),
                ])
                .unwrap();
            let ids: Vec<_> = out.bad.iter().map(|b| b.message_id.as_str()).collect();
            assert_eq!(ids, ["m2", "m3"], "{kind:?} {encoding:?}");
            for b in &out.bad {
                let text = b.describe();
                assert!(
                    !text.contains("secret") && text.contains(kind.name()),
                    "{text}"
                );
            }
            assert_eq!(
                out.batch
                    .column(0)
                    .as_primitive::<Int64Type>()
                    .values()
                    .to_vec(),
                vec![1, 2]
            );
        });
    }

    #[test]
    fn a_column_the_schema_cannot_fill_is_refused_naming_column_field_and_types() {
        for (kind, definition, field_type) in [
            (SchemaType::Avro, AVRO, "long"),
            (SchemaType::Protobuf, PROTO, "int64"),
        ] {
            let table = Arc::new(Schema::new(vec![Field::new("id", DataType::Boolean, true)]));
            let e = MessageDecoder::new(table, PayloadFormat::Json, &SourceColumns::default())
                .unwrap()
                .with_schema(&PayloadSchema {
                    kind,
                    definition: definition.into(),
                    encoding: SchemaEncoding::Binary,
                    origin: "option 'schema'".into(),
                })
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("'id'") && e.contains("Boolean") && e.contains(field_type),
                "{e}"
            );
        }
    }
}
