//! Arrow rows to Protocol Buffers messages, one per row, to match a `.proto` schema compiled at
//! run time.
//!
//! The schema is compiled by `protox` (a pure-Rust compiler; the well-known types such as
//! `google/protobuf/timestamp.proto` may be imported) and each row becomes a `prost-reflect`
//! dynamic message of the file's one top-level message type (what a Pub/Sub Protocol Buffer
//! schema holds). `prost-reflect` writes the wire format (`binary`) and the proto3 JSON mapping
//! (`json`); this module only checks the table against the message and fills the fields.
//!
//! # Type mapping
//!
//! | Protobuf field | Arrow columns accepted |
//! |---|---|
//! | `bool` | `BOOLEAN` |
//! | `int32`, `sint32`, `sfixed32`, `int64`, `sint64`, `sfixed64`, `uint32`, `fixed32`, `uint64`, `fixed64` | any integer (a value out of range refuses the row) |
//! | `float`, `double` | any integer, float or decimal |
//! | `string` | any string; also `TIMESTAMP` (RFC 3339, UTC, `Z`), `DATE` (`YYYY-MM-DD`) and decimals (their exact text) |
//! | `bytes` | any binary |
//! | an enum | a string (the value's name) or an integer (its number); an unknown one refuses the row |
//! | `google.protobuf.Timestamp` | `TIMESTAMP`, `DATE` |
//! | another message | `STRUCT`, fields by name |
//! | `repeated` | `LIST` (any layout; a null element refuses the row) |
//! | `map<K, V>` | `MAP` (a null value refuses the row) |
//!
//! A null value leaves the field unset (proto3: its default; with `optional`, absent). A
//! proto2 `required` field must have a column, and a null there refuses the row.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{
    DataType, Field, Float64Type, Int64Type, Schema, TimeUnit, TimestampMicrosecondType, UInt64Type,
};
use prost::Message as _;
use prost_reflect::{
    Cardinality, DynamicMessage, FieldDescriptor, Kind, MapKey, MessageDescriptor, Value,
};
use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};

use super::avro::Direction;
use super::schema::{PayloadSchema, RowPayload, SchemaEncoding, arrow_type_name};
use crate::error::{Error, Result};

pub mod decode;

/// The file name the inline schema is compiled under.
const SCHEMA_FILE: &str = "schema.proto";
const TIMESTAMP_MESSAGE: &str = "google.protobuf.Timestamp";

/// A compiled `.proto` schema bound to a table's payload columns; see the module docs.
#[derive(Debug, Clone)]
pub struct ProtoRowEncoder {
    message: MessageDescriptor,
    encoding: SchemaEncoding,
    /// Each bound field with its column and conversion.
    fields: Vec<(FieldDescriptor, usize, Conv)>,
}

/// How a column's values become a field's values.
#[derive(Debug, Clone)]
enum Conv {
    Bool,
    /// An integer field, from values cast to `Int64`.
    Signed,
    /// An unsigned integer field, from values cast to `UInt64`.
    Unsigned,
    /// A float or double field, from values cast to `Float64`.
    Float,
    /// A string field, from values cast to `Utf8`.
    Str,
    /// A string field holding an RFC 3339 time, from values cast to microseconds.
    TimestampText,
    /// A `google.protobuf.Timestamp` message, from values cast to microseconds.
    TimestampMessage(MessageDescriptor),
    /// A bytes field, from values cast to `Binary`.
    Bytes,
    /// An enum field from names.
    EnumName(prost_reflect::EnumDescriptor),
    /// An enum field from numbers.
    EnumNumber(prost_reflect::EnumDescriptor),
    /// A message field from a struct: each field with its struct child index.
    Message(MessageDescriptor, Vec<(FieldDescriptor, usize, Conv)>),
    /// A repeated field from a list.
    List(Box<Conv>),
    /// A map field from a map.
    Map(FieldDescriptor, Box<Conv>, FieldDescriptor, Box<Conv>),
}

struct Inline(String);

impl FileResolver for Inline {
    fn open_file(&self, name: &str) -> std::result::Result<File, protox::Error> {
        if name == SCHEMA_FILE {
            File::from_source(name, &self.0)
        } else {
            Err(protox::Error::file_not_found(name))
        }
    }
}

fn kind_name(field: &FieldDescriptor) -> String {
    let base = match field.kind() {
        Kind::Double => "double".to_string(),
        Kind::Float => "float".into(),
        Kind::Int32 => "int32".into(),
        Kind::Int64 => "int64".into(),
        Kind::Uint32 => "uint32".into(),
        Kind::Uint64 => "uint64".into(),
        Kind::Sint32 => "sint32".into(),
        Kind::Sint64 => "sint64".into(),
        Kind::Fixed32 => "fixed32".into(),
        Kind::Fixed64 => "fixed64".into(),
        Kind::Sfixed32 => "sfixed32".into(),
        Kind::Sfixed64 => "sfixed64".into(),
        Kind::Bool => "bool".into(),
        Kind::String => "string".into(),
        Kind::Bytes => "bytes".into(),
        Kind::Message(m) => m.full_name().to_string(),
        Kind::Enum(e) => format!("enum {}", e.full_name()),
    };
    if field.is_map() {
        let Kind::Message(entry) = field.kind() else {
            return base;
        };
        format!(
            "map<{}, {}>",
            kind_name(&entry.map_entry_key_field()),
            kind_name(&entry.map_entry_value_field())
        )
    } else if field.is_list() {
        format!("repeated {base}")
    } else {
        base
    }
}

fn is_string(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

fn is_time(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Timestamp(..) | DataType::Date32 | DataType::Date64
    )
}

/// The conversion of one (non-repeated) value of type `src` to `field`'s kind.
fn scalar_conv(
    src: &DataType,
    field: &FieldDescriptor,
    at: &str,
) -> std::result::Result<Conv, String> {
    let conv = match field.kind() {
        Kind::Bool if matches!(src, DataType::Boolean) => Some(Conv::Bool),
        Kind::Int32
        | Kind::Int64
        | Kind::Sint32
        | Kind::Sint64
        | Kind::Sfixed32
        | Kind::Sfixed64
            if src.is_integer() =>
        {
            Some(Conv::Signed)
        }
        Kind::Uint32 | Kind::Uint64 | Kind::Fixed32 | Kind::Fixed64 if src.is_integer() => {
            Some(Conv::Unsigned)
        }
        Kind::Float | Kind::Double if src.is_integer() || src.is_floating() || src.is_decimal() => {
            Some(Conv::Float)
        }
        Kind::String
            if is_string(src)
                || src.is_decimal()
                || matches!(src, DataType::Date32 | DataType::Date64) =>
        {
            Some(Conv::Str)
        }
        Kind::String if matches!(src, DataType::Timestamp(..)) => Some(Conv::TimestampText),
        Kind::Bytes
            if matches!(
                src,
                DataType::Binary
                    | DataType::LargeBinary
                    | DataType::BinaryView
                    | DataType::FixedSizeBinary(_)
            ) =>
        {
            Some(Conv::Bytes)
        }
        Kind::Enum(e) if is_string(src) => Some(Conv::EnumName(e)),
        Kind::Enum(e) if src.is_integer() => Some(Conv::EnumNumber(e)),
        Kind::Message(m) if m.full_name() == TIMESTAMP_MESSAGE && is_time(src) => {
            Some(Conv::TimestampMessage(m))
        }
        Kind::Message(m) => match src {
            DataType::Struct(children) => {
                let children: Vec<(String, DataType)> = children
                    .iter()
                    .map(|c| (c.name().clone(), c.data_type().clone()))
                    .collect();
                return message_conv(&m, &children, at).map(|fields| Conv::Message(m, fields));
            }
            _ => None,
        },
        _ => None,
    };
    conv.ok_or_else(|| {
        format!(
            "field '{at}' has the Protobuf type {} and the column's value there is {}, which cannot be converted",
            kind_name(field),
            arrow_type_name(src)
        )
    })
}

fn field_conv(
    src: &DataType,
    field: &FieldDescriptor,
    at: &str,
) -> std::result::Result<Conv, String> {
    if field.is_map() {
        let Kind::Message(entry) = field.kind() else {
            return Err(format!(
                "field '{at}': a map field without an entry message"
            ));
        };
        let DataType::Map(entries, _) = src else {
            return Err(format!(
                "field '{at}' has the Protobuf type {} and the column's value there is {}, which is not a MAP",
                kind_name(field),
                arrow_type_name(src)
            ));
        };
        let DataType::Struct(kv) = entries.data_type() else {
            return Err(format!("field '{at}': the map's entries are not a struct"));
        };
        let (key, value) = (entry.map_entry_key_field(), entry.map_entry_value_field());
        let key_conv = scalar_conv(kv[0].data_type(), &key, &format!("{at} (key)"))?;
        let value_conv = scalar_conv(kv[1].data_type(), &value, &format!("{at}{{}}"))?;
        return Ok(Conv::Map(
            key,
            Box::new(key_conv),
            value,
            Box::new(value_conv),
        ));
    }
    if field.is_list() {
        return match src {
            DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
                Ok(Conv::List(Box::new(scalar_conv(
                    f.data_type(),
                    field,
                    &format!("{at}[]"),
                )?)))
            }
            _ => Err(format!(
                "field '{at}' has the Protobuf type {} and the column's value there is {}, which is not a LIST",
                kind_name(field),
                arrow_type_name(src)
            )),
        };
    }
    scalar_conv(src, field, at)
}

/// Binds the fields of `message` to `children` (name, type) by name.
fn message_conv(
    message: &MessageDescriptor,
    children: &[(String, DataType)],
    at: &str,
) -> std::result::Result<Vec<(FieldDescriptor, usize, Conv)>, String> {
    let mut out = Vec::with_capacity(children.len());
    for (i, (name, t)) in children.iter().enumerate() {
        let fat = format!("{at}.{name}");
        let Some(field) = message.get_field_by_name(name) else {
            return Err(format!(
                "struct field '{fat}' ({}) has no field in message {}",
                arrow_type_name(t),
                message.full_name()
            ));
        };
        out.push((field.clone(), i, field_conv(t, &field, &fat)?));
    }
    for field in message.fields() {
        if field.cardinality() == Cardinality::Required
            && !children.iter().any(|(n, _)| n == field.name())
        {
            return Err(format!(
                "field '{at}.{}' ({}) is required and the struct has no field '{}'",
                field.name(),
                kind_name(&field),
                field.name()
            ));
        }
    }
    Ok(out)
}

/// Compiles the `.proto` source (one top-level message; well-known imports allowed): its message.
fn compile(schema: &PayloadSchema) -> Result<MessageDescriptor> {
    let invalid = |rule: String| Error::invalid("schema", schema.origin.clone(), rule);
    let mut resolver = ChainFileResolver::new();
    resolver.add(Inline(schema.definition.clone()));
    resolver.add(GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(resolver);
    compiler
        .open_file(SCHEMA_FILE)
        .map_err(|e| invalid(format!("the Protocol Buffer schema does not compile: {e}")))?;
    let pool = compiler.descriptor_pool();
    let file = pool
        .get_file_by_name(SCHEMA_FILE)
        .ok_or_else(|| invalid("internal: the compiled schema has no file".into()))?;
    let top: Vec<MessageDescriptor> = file.messages().collect();
    let [message] = top.as_slice() else {
        return Err(invalid(format!(
            "the Protocol Buffer schema defines {} top-level messages; it must define exactly one \
             (nested messages and enums go inside it), as a Pub/Sub schema does",
            top.len()
        )));
    };
    Ok(message.clone())
}

/// The names of the top-level message's fields, in declaration order.
pub(crate) fn message_field_names(schema: &PayloadSchema) -> Result<Vec<String>> {
    Ok(compile(schema)?
        .fields()
        .map(|f| f.name().to_string())
        .collect())
}

/// Binds the fields of `message` to the table's `columns` by name, checking each pair's types;
/// the errors name the column, the field and both types.
fn bind_columns(
    schema: &PayloadSchema,
    message: &MessageDescriptor,
    table: &Schema,
    columns: &[usize],
    direction: Direction,
) -> Result<Vec<(FieldDescriptor, usize, Conv)>> {
    let mut fields = Vec::with_capacity(columns.len());
    for &c in columns {
        let (name, t) = (table.field(c).name(), table.field(c).data_type());
        let Some(field) = message.get_field_by_name(name) else {
            return Err(Error::schema(
                name,
                format!(
                    "column '{name}' ({}) has no field in message {} ({}); its fields are {}. {}",
                    arrow_type_name(t),
                    message.full_name(),
                    schema.origin,
                    message
                        .fields()
                        .map(|f| format!("'{}'", f.name()))
                        .collect::<Vec<_>>()
                        .join(", "),
                    direction.hint()
                ),
            ));
        };
        let conv = field_conv(t, &field, name).map_err(|rule| {
            Error::schema(
                name,
                format!(
                    "column '{name}' ({}) cannot be {} message {} ({}): {rule}",
                    arrow_type_name(t),
                    direction.verb(),
                    message.full_name(),
                    schema.origin
                ),
            )
        })?;
        fields.push((field, c, conv));
    }
    Ok(fields)
}

impl ProtoRowEncoder {
    /// Compiles the `.proto` source (one top-level message; well-known imports allowed) and
    /// binds the message's fields to the table's `columns` by name; see
    /// [`SchemaRowEncoder::new`](super::schema::SchemaRowEncoder::new).
    pub fn new(schema: &PayloadSchema, table: &Schema, columns: &[usize]) -> Result<Self> {
        let message = compile(schema)?;
        let fields = bind_columns(schema, &message, table, columns, Direction::Write)?;
        for field in message.fields() {
            if field.cardinality() == Cardinality::Required
                && !fields.iter().any(|(f, _, _)| f.name() == field.name())
            {
                return Err(Error::schema(
                    field.name(),
                    format!(
                        "message {} ({}) requires field '{}' ({}) and the table has no column '{}' \
                         (or it has another role)",
                        message.full_name(),
                        schema.origin,
                        field.name(),
                        kind_name(&field),
                        field.name()
                    ),
                ));
            }
        }
        Ok(ProtoRowEncoder {
            message,
            encoding: schema.encoding,
            fields,
        })
    }

    /// The message type rows are written as (its full name).
    pub fn message_name(&self) -> &str {
        self.message.full_name()
    }

    /// Encodes every row of `batch`; see [`SchemaRowEncoder::encode_batch`](super::schema::SchemaRowEncoder::encode_batch).
    pub fn encode_batch(&self, batch: &RecordBatch) -> Result<Vec<RowPayload>> {
        let mut prepared = Vec::with_capacity(self.fields.len());
        for (field, c, conv) in &self.fields {
            let array = batch.columns().get(*c).ok_or_else(|| {
                Error::schema(
                    field.name(),
                    "the batch has fewer columns than the table schema",
                )
            })?;
            prepared.push(
                Prepared::new(array, conv).map_err(|rule| Error::schema(field.name(), rule))?,
            );
        }
        let mut out = Vec::with_capacity(batch.num_rows());
        for row in 0..batch.num_rows() {
            out.push(self.row(&prepared, row));
        }
        Ok(out)
    }

    fn row(&self, prepared: &[Prepared], row: usize) -> RowPayload {
        let message = fill(&self.message, &self.fields, prepared, row, "")?;
        match self.encoding {
            SchemaEncoding::Binary => Ok(message.encode_to_vec()),
            SchemaEncoding::Json => serde_json::to_vec(&message)
                .map_err(|e| format!("the proto3 JSON could not be written: {e}")),
        }
    }
}

fn fill(
    descriptor: &MessageDescriptor,
    fields: &[(FieldDescriptor, usize, Conv)],
    prepared: &[Prepared],
    row: usize,
    at: &str,
) -> std::result::Result<DynamicMessage, String> {
    let mut message = DynamicMessage::new(descriptor.clone());
    for ((field, _, conv), p) in fields.iter().zip(prepared) {
        let fat = if at.is_empty() {
            field.name().to_string()
        } else {
            format!("{at}.{}", field.name())
        };
        match p.value(row, conv, field, &fat)? {
            Some(v) => message.set_field(field, v),
            None if field.cardinality() == Cardinality::Required => {
                return Err(format!("field '{fat}' is required and the value is null"));
            }
            None => {}
        }
    }
    Ok(message)
}

/// A column converted once per batch to the types the conversion reads.
enum Prepared {
    Leaf(ArrayRef),
    Message(ArrayRef, Vec<Prepared>),
    List(ArrayRef, Box<Prepared>),
    Map(ArrayRef, Box<Prepared>, Box<Prepared>),
}

fn cast_to(array: &ArrayRef, to: &DataType) -> std::result::Result<ArrayRef, String> {
    let options = CastOptions {
        safe: true,
        ..Default::default()
    };
    cast_with_options(array, to, &options)
        .map_err(|e| format!("{} cannot be converted to {to}: {e}", array.data_type()))
}

impl Prepared {
    fn new(array: &ArrayRef, conv: &Conv) -> std::result::Result<Self, String> {
        Ok(match conv {
            Conv::Bool => Prepared::Leaf(array.clone()),
            Conv::Signed | Conv::EnumNumber(_) => Prepared::Leaf(cast_to(array, &DataType::Int64)?),
            Conv::Unsigned => Prepared::Leaf(cast_to(array, &DataType::UInt64)?),
            Conv::Float => Prepared::Leaf(cast_to(array, &DataType::Float64)?),
            Conv::Str | Conv::EnumName(_) => Prepared::Leaf(cast_to(array, &DataType::Utf8)?),
            Conv::Bytes => Prepared::Leaf(cast_to(array, &DataType::Binary)?),
            Conv::TimestampText | Conv::TimestampMessage(_) => Prepared::Leaf(cast_to(
                array,
                &DataType::Timestamp(TimeUnit::Microsecond, None),
            )?),
            Conv::Message(_, fields) => {
                let s = array.as_struct();
                let children = fields
                    .iter()
                    .map(|(_, i, c)| Prepared::new(s.column(*i), c))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                Prepared::Message(array.clone(), children)
            }
            Conv::List(item) => {
                let list = match array.data_type() {
                    DataType::List(_) => array.clone(),
                    DataType::LargeList(f) | DataType::FixedSizeList(f, _) => cast_to(
                        array,
                        &DataType::List(Arc::new(Field::new("item", f.data_type().clone(), true))),
                    )?,
                    other => return Err(format!("{other} is not a list")),
                };
                let values = Prepared::new(list.as_list::<i32>().values(), item)?;
                Prepared::List(list, Box::new(values))
            }
            Conv::Map(_, key, _, value) => {
                let m = array.as_map();
                let keys = Prepared::new(m.keys(), key)?;
                let values = Prepared::new(m.values(), value)?;
                Prepared::Map(array.clone(), Box::new(keys), Box::new(values))
            }
        })
    }

    fn array(&self) -> &ArrayRef {
        match self {
            Prepared::Leaf(a)
            | Prepared::Message(a, _)
            | Prepared::List(a, _)
            | Prepared::Map(a, ..) => a,
        }
    }

    /// The value at `i` for `field`, `None` when null.
    fn value(
        &self,
        i: usize,
        conv: &Conv,
        field: &FieldDescriptor,
        at: &str,
    ) -> std::result::Result<Option<Value>, String> {
        if self.array().is_null(i) {
            return Ok(None);
        }
        let one = |p: &Prepared,
                   k: usize,
                   c: &Conv,
                   item_at: &str|
         -> std::result::Result<Value, String> {
            p.value(k, c, field, item_at)?.ok_or_else(|| {
                format!(
                    "field '{at}' is {} and the value holds a null element, which it cannot carry",
                    kind_name(field)
                )
            })
        };
        Ok(Some(match (self, conv) {
            (Prepared::List(list, values), Conv::List(item)) => {
                let l = list.as_list::<i32>();
                let (start, end) = (
                    l.value_offsets()[i] as usize,
                    l.value_offsets()[i + 1] as usize,
                );
                let item_at = format!("{at}[]");
                Value::List(
                    (start..end)
                        .map(|k| one(values, k, item, &item_at))
                        .collect::<std::result::Result<_, _>>()?,
                )
            }
            (Prepared::Map(map, keys, values), Conv::Map(kf, kc, vf, vc)) => {
                let m = map.as_map();
                let (start, end) = (
                    m.value_offsets()[i] as usize,
                    m.value_offsets()[i + 1] as usize,
                );
                let mut out = HashMap::with_capacity(end - start);
                let value_at = format!("{at}{{}}");
                for e in start..end {
                    let key = keys
                        .value(e, kc, kf, at)?
                        .and_then(|k| map_key(k, kf))
                        .ok_or_else(|| {
                            format!(
                                "field '{at}': a map key does not fit the key type {}",
                                kind_name(kf)
                            )
                        })?;
                    let value = values.value(e, vc, vf, &value_at)?.ok_or_else(|| {
                        format!("field '{at}' is a map and a value is null, which it cannot carry")
                    })?;
                    out.insert(key, value);
                }
                Value::Map(out)
            }
            (Prepared::Message(_, children), Conv::Message(m, fields)) => {
                Value::Message(fill(m, fields, children, i, at)?)
            }
            (Prepared::Leaf(a), conv) => leaf(a, i, conv, field, at)?,
            _ => {
                return Err(format!(
                    "internal: field '{at}' was prepared for another conversion"
                ));
            }
        }))
    }
}

fn map_key(v: Value, kf: &FieldDescriptor) -> Option<MapKey> {
    let _ = kf;
    Some(match v {
        Value::Bool(b) => MapKey::Bool(b),
        Value::I32(x) => MapKey::I32(x),
        Value::I64(x) => MapKey::I64(x),
        Value::U32(x) => MapKey::U32(x),
        Value::U64(x) => MapKey::U64(x),
        Value::String(s) => MapKey::String(s),
        _ => return None,
    })
}

fn leaf(
    a: &ArrayRef,
    i: usize,
    conv: &Conv,
    field: &FieldDescriptor,
    at: &str,
) -> std::result::Result<Value, String> {
    let misfit = || {
        format!(
            "field '{at}': the value does not fit the Protobuf type {}",
            kind_name(field)
        )
    };
    Ok(match conv {
        Conv::Bool => Value::Bool(a.as_boolean().value(i)),
        Conv::Signed => {
            let v = a.as_primitive::<Int64Type>().value(i);
            match field.kind() {
                Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => {
                    Value::I32(i32::try_from(v).map_err(|_| misfit())?)
                }
                _ => Value::I64(v),
            }
        }
        Conv::Unsigned => {
            let v = a.as_primitive::<UInt64Type>().value(i);
            match field.kind() {
                Kind::Uint32 | Kind::Fixed32 => Value::U32(u32::try_from(v).map_err(|_| misfit())?),
                _ => Value::U64(v),
            }
        }
        Conv::Float => {
            let v = a.as_primitive::<Float64Type>().value(i);
            match field.kind() {
                Kind::Float => Value::F32(v as f32),
                _ => Value::F64(v),
            }
        }
        Conv::Str => Value::String(a.as_string::<i32>().value(i).to_string()),
        Conv::Bytes => Value::Bytes(prost::bytes::Bytes::copy_from_slice(
            a.as_binary::<i32>().value(i),
        )),
        Conv::EnumName(e) => {
            let name = a.as_string::<i32>().value(i);
            Value::EnumNumber(
                e.get_value_by_name(name)
                    .ok_or_else(|| {
                        format!(
                            "field '{at}': the value is not a name of enum {}",
                            e.full_name()
                        )
                    })?
                    .number(),
            )
        }
        Conv::EnumNumber(e) => {
            let n = i32::try_from(a.as_primitive::<Int64Type>().value(i)).map_err(|_| misfit())?;
            if e.get_value(n).is_none() {
                return Err(format!(
                    "field '{at}': the value is not a number of enum {}",
                    e.full_name()
                ));
            }
            Value::EnumNumber(n)
        }
        Conv::TimestampText => {
            let micros = a.as_primitive::<TimestampMicrosecondType>().value(i);
            let t = chrono::DateTime::from_timestamp_micros(micros).ok_or_else(misfit)?;
            Value::String(t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true))
        }
        Conv::TimestampMessage(m) => {
            let micros = a.as_primitive::<TimestampMicrosecondType>().value(i);
            let mut t = DynamicMessage::new(m.clone());
            t.set_field_by_name("seconds", Value::I64(micros.div_euclid(1_000_000)));
            t.set_field_by_name(
                "nanos",
                Value::I32((micros.rem_euclid(1_000_000) * 1_000) as i32),
            );
            Value::Message(t)
        }
        Conv::Message(..) | Conv::List(_) | Conv::Map(..) => {
            return Err(format!("internal: field '{at}' is not a single value"));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, ListBuilder, StringArray, StringBuilder};
    use prost_reflect::ReflectMessage as _;

    const PROTO: &str = r#"syntax = "proto3";
        import "google/protobuf/timestamp.proto";
        message M {
          enum Color { RED = 0; BLUE = 1; }
          int32 small = 1;
          Color color = 2;
          repeated string tags = 3;
          google.protobuf.Timestamp at = 4;
        }"#;

    fn encoder(table: &Schema, encoding: SchemaEncoding) -> ProtoRowEncoder {
        let columns: Vec<usize> = (0..table.fields().len()).collect();
        ProtoRowEncoder::new(
            &PayloadSchema {
                kind: super::super::schema::SchemaType::Protobuf,
                definition: PROTO.into(),
                encoding,
                origin: "test".into(),
            },
            table,
            &columns,
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn values_out_of_range_unknown_enum_names_and_null_elements_refuse_the_row() {
        let table = Schema::new(vec![
            Field::new("small", DataType::Int64, true),
            Field::new("color", DataType::Utf8, true),
            Field::new(
                "tags",
                DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
                true,
            ),
            Field::new("at", DataType::Timestamp(TimeUnit::Nanosecond, None), true),
        ]);
        let enc = encoder(&table, SchemaEncoding::Binary);
        assert_eq!(enc.message_name(), "M");
        let mut tags = ListBuilder::new(StringBuilder::new());
        for row in [vec![Some("a")], vec![], vec![], vec![Some("b"), None]] {
            for t in row {
                tags.values().append_option(t);
            }
            tags.append(true);
        }
        let batch = RecordBatch::try_new(
            Arc::new(table),
            vec![
                Arc::new(Int64Array::from(vec![Some(-3), Some(1 << 40), None, None])),
                Arc::new(StringArray::from(vec!["BLUE", "RED", "GREEN", "RED"])),
                Arc::new(tags.finish()),
                Arc::new(arrow::array::TimestampNanosecondArray::from(vec![
                    Some(1_500_000_000),
                    None,
                    None,
                    None,
                ])),
            ],
        )
        .unwrap();
        let out = enc.encode_batch(&batch).unwrap();
        let decoded =
            DynamicMessage::decode(enc.message.clone(), &out[0].as_ref().unwrap()[..]).unwrap();
        assert_eq!(decoded.descriptor().full_name(), "M");
        assert_eq!(
            decoded.get_field_by_name("small").unwrap().as_i32(),
            Some(-3)
        );
        assert_eq!(
            decoded.get_field_by_name("color").unwrap().as_enum_number(),
            Some(1)
        );
        let at = decoded.get_field_by_name("at").unwrap();
        let at = at.as_message().unwrap();
        assert_eq!(at.get_field_by_name("seconds").unwrap().as_i64(), Some(1));
        assert_eq!(
            at.get_field_by_name("nanos").unwrap().as_i32(),
            Some(500_000_000)
        );
        let why: Vec<&str> = out[1..]
            .iter()
            .map(|r| r.as_ref().unwrap_err().as_str())
            .collect();
        assert!(
            why[0].contains("field 'small'") && why[0].contains("int32"),
            "{}",
            why[0]
        );
        assert!(
            why[1].contains("field 'color'") && why[1].contains("M.Color"),
            "{}",
            why[1]
        );
        assert!(
            why[2].contains("'tags'") && why[2].contains("null"),
            "{}",
            why[2]
        );
    }

    #[test]
    fn json_encoding_is_the_proto3_json_mapping() {
        let table = Schema::new(vec![
            Field::new("small", DataType::Int64, true),
            Field::new("color", DataType::Utf8, true),
        ]);
        let enc = encoder(&table, SchemaEncoding::Json);
        let batch = RecordBatch::try_new(
            Arc::new(table),
            vec![
                Arc::new(Int64Array::from(vec![7])),
                Arc::new(StringArray::from(vec!["BLUE"])),
            ],
        )
        .unwrap();
        let out = enc.encode_batch(&batch).unwrap();
        let json: serde_json::Value = serde_json::from_slice(out[0].as_ref().unwrap()).unwrap();
        assert_eq!(json, serde_json::json!({"small": 7, "color": "BLUE"}));
    }
}

#[cfg(test)]
mod time_zone_tests {
    use super::*;
    use arrow::array::TimestampMicrosecondArray;

    /// A timestamp column with a time zone is the same instant in the message: 12:00 at
    /// +02:00 is 10:00Z.
    #[test]
    fn a_zoned_timestamp_keeps_its_instant() {
        let zoned = DataType::Timestamp(TimeUnit::Microsecond, Some("+02:00".into()));
        let table = Schema::new(vec![Field::new("at", zoned.clone(), true)]);
        let encoder = ProtoRowEncoder::new(
            &PayloadSchema {
                kind: super::super::schema::SchemaType::Protobuf,
                definition: r#"syntax = "proto3"; message M { string at = 1; }"#.into(),
                encoding: SchemaEncoding::Json,
                origin: "test".into(),
            },
            &table,
            &[0],
        )
        .unwrap();
        // 2024-01-01T10:00:00Z in microseconds.
        let at =
            TimestampMicrosecondArray::from(vec![1_704_103_200_000_000]).with_timezone("+02:00");
        let batch = RecordBatch::try_new(Arc::new(table), vec![Arc::new(at)]).unwrap();
        let out = encoder.encode_batch(&batch).unwrap();
        let json: serde_json::Value = serde_json::from_slice(out[0].as_ref().unwrap()).unwrap();
        assert_eq!(json, serde_json::json!({"at": "2024-01-01T10:00:00Z"}));
    }
}
