//! Protocol Buffers payloads back to rows: each message becomes one JSON object whose members
//! the source's JSON decoder reads into the declared columns (ADR 0052).
//!
//! `prost-reflect` decodes the payload into a dynamic message of the schema's one top-level
//! message type: from the wire format (`binary`) or from the proto3 JSON mapping (`json`). The
//! dynamic message is then written as a JSON object by [`ProtoRowDecoder`] rather than by
//! `prost-reflect`'s proto3 JSON writer, because the columns need other forms than proto3 JSON
//! gives: 64-bit integers as numbers (proto3 JSON quotes them), bytes as hex (not base64), an
//! unset field with presence (`optional`, a message) as null and an unset one without presence
//! as its default, a `google.protobuf.Timestamp` as RFC 3339 text, an enum as its value's name.

use arrow::datatypes::Schema;
use prost_reflect::{DynamicMessage, Kind, MapKey, MessageDescriptor, ReflectMessage, Value};
use serde_json::{Map as JsonMap, Value as Json};

use super::{Direction, TIMESTAMP_MESSAGE, bind_columns, compile};
use crate::encode::avro::read::JsonPayload;
use crate::encode::schema::{PayloadSchema, SchemaEncoding};
use crate::error::Result;

/// A compiled `.proto` schema that turns payloads into JSON objects; see the module docs.
#[derive(Debug, Clone)]
pub struct ProtoRowDecoder {
    message: MessageDescriptor,
    /// Top-level string fields without presence bound to a column that is not a string (a
    /// `TIMESTAMP`, a decimal): their empty default reads as NULL, as the sink writes a NULL.
    empty_is_null: Vec<String>,
}

impl ProtoRowDecoder {
    /// Compiles the schema and checks the table's `columns` against the message's fields by
    /// name: a column the message lacks, or a type that does not convert, is an error naming
    /// the column, the field and both types. Fields without a column are skipped.
    pub fn new(schema: &PayloadSchema, table: &Schema, columns: &[usize]) -> Result<Self> {
        let message = compile(schema)?;
        let bound = bind_columns(schema, &message, table, columns, Direction::Read)?;
        let empty_is_null = bound
            .iter()
            .filter(|(field, c, _)| {
                matches!(field.kind(), Kind::String)
                    && !field.supports_presence()
                    && !field.is_list()
                    && !super::is_string(table.field(*c).data_type())
            })
            .map(|(field, _, _)| field.name().to_string())
            .collect();
        Ok(ProtoRowDecoder {
            message,
            empty_is_null,
        })
    }

    /// Each payload (in `encodings[i]`) as one JSON object, in order.
    pub fn to_json(&self, datas: &[&[u8]], encodings: &[SchemaEncoding]) -> Vec<JsonPayload> {
        datas
            .iter()
            .zip(encodings)
            .map(|(data, encoding)| {
                let message = self.decode(data, *encoding)?;
                let mut object = message_json(&message);
                for name in &self.empty_is_null {
                    if let Some(v) = object.get_mut(name.as_str())
                        && v.as_str() == Some("")
                    {
                        *v = Json::Null;
                    }
                }
                serde_json::to_vec(&object).map_err(|e| e.to_string())
            })
            .collect()
    }

    fn decode(
        &self,
        data: &[u8],
        encoding: SchemaEncoding,
    ) -> std::result::Result<DynamicMessage, String> {
        let name = self.message.full_name();
        match encoding {
            SchemaEncoding::Binary => DynamicMessage::decode(self.message.clone(), data)
                .map_err(|e| format!("the data is not a {name} in the protobuf wire format: {e}")),
            SchemaEncoding::Json => {
                let mut json = serde_json::Deserializer::from_slice(data);
                let message = DynamicMessage::deserialize(self.message.clone(), &mut json)
                    .map_err(|e| {
                        format!(
                            "the data is not a {name} in the proto3 JSON mapping: {}",
                            e.classify_text()
                        )
                    })?;
                json.end().map_err(|_| {
                    format!(
                        "the data is not one {name} in the proto3 JSON mapping: text follows it"
                    )
                })?;
                Ok(message)
            }
        }
    }
}

/// What a serde_json error was, without the position's text (which may hold data).
trait Classify {
    fn classify_text(&self) -> String;
}

impl Classify for serde_json::Error {
    fn classify_text(&self) -> String {
        format!(
            "{:?} error at line {}, column {}",
            self.classify(),
            self.line(),
            self.column()
        )
    }
}

/// The message as the JSON object the source decodes.
fn message_json(message: &DynamicMessage) -> Json {
    let descriptor = message.descriptor();
    if descriptor.full_name() == TIMESTAMP_MESSAGE {
        return timestamp(message);
    }
    let mut object = JsonMap::new();
    for field in descriptor.fields() {
        let value = if field.supports_presence() && !message.has_field(&field) {
            Json::Null
        } else {
            value_json(&message.get_field(&field), &field.kind())
        };
        object.insert(field.name().to_string(), value);
    }
    Json::Object(object)
}

fn timestamp(message: &DynamicMessage) -> Json {
    let get = |name: &str| message.get_field_by_name(name).map(|v| v.into_owned());
    let seconds = get("seconds").and_then(|v| v.as_i64()).unwrap_or(0);
    let nanos = get("nanos").and_then(|v| v.as_i32()).unwrap_or(0);
    match chrono::DateTime::from_timestamp(seconds, u32::try_from(nanos).unwrap_or(0)) {
        Some(t) => Json::String(t.format("%Y-%m-%dT%H:%M:%S%.fZ").to_string()),
        // Outside what a TIMESTAMP holds: a text the column's decoder refuses, naming it.
        None => Json::String(format!("out of range: {seconds} s")),
    }
}

fn value_json(value: &Value, kind: &Kind) -> Json {
    match value {
        Value::Bool(b) => Json::Bool(*b),
        Value::I32(n) => Json::from(*n),
        Value::I64(n) => Json::from(*n),
        Value::U32(n) => Json::from(*n),
        Value::U64(n) => Json::from(*n),
        Value::F32(x) => float(f64::from(*x)),
        Value::F64(x) => float(*x),
        Value::String(s) => Json::String(s.clone()),
        Value::Bytes(b) => Json::String(b.iter().map(|x| format!("{x:02x}")).collect()),
        Value::EnumNumber(n) => match kind {
            Kind::Enum(e) => match e.get_value(*n) {
                Some(v) => Json::String(v.name().to_string()),
                None => Json::from(*n),
            },
            _ => Json::from(*n),
        },
        Value::Message(m) => message_json(m),
        Value::List(items) => Json::Array(items.iter().map(|v| value_json(v, kind)).collect()),
        Value::Map(entries) => {
            let value_kind = match kind {
                Kind::Message(entry) => entry.map_entry_value_field().kind(),
                other => other.clone(),
            };
            Json::Object(
                entries
                    .iter()
                    .map(|(k, v)| (map_key(k), value_json(v, &value_kind)))
                    .collect(),
            )
        }
    }
}

/// A float; NaN and the infinities as the text Arrow's float parser reads.
fn float(x: f64) -> Json {
    serde_json::Number::from_f64(x)
        .map(Json::Number)
        .unwrap_or_else(|| Json::String(x.to_string()))
}

fn map_key(k: &MapKey) -> String {
    match k {
        MapKey::Bool(b) => b.to_string(),
        MapKey::I32(n) => n.to_string(),
        MapKey::I64(n) => n.to_string(),
        MapKey::U32(n) => n.to_string(),
        MapKey::U64(n) => n.to_string(),
        MapKey::String(s) => s.clone(),
    }
}
