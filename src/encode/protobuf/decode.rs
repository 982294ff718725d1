//! Protocol Buffers payloads back to rows (ADR 0065): the reading side of
//! [`ProtoRowEncoder`](super::ProtoRowEncoder).
//!
//! `prost-reflect` decodes each payload into a dynamic message of the schema's one top-level
//! message type, from the wire format (`binary`) or from the proto3 JSON mapping (`json`), and
//! [`ProtoRowDecoder`] walks each bound field of it straight into an Arrow builder chosen for
//! the field and its column: integers, floats, booleans, strings and bytes in their own widths,
//! an enum as its value's name (or its number, for an integer column), a
//! `google.protobuf.Timestamp` as a UTC timestamp in the column's unit, a message as a struct of
//! the fields the column's struct names, `repeated` as a list, `map` as a map (entries in key
//! order). An unset field with presence (`optional`, a message) is NULL and an unset one
//! without presence its default. The arrays are then made into the columns' types by
//! [`conform`](crate::encode::conform) (a string into a `TIMESTAMP`, a decimal, a `DATE`).

use std::sync::Arc;

use arrow::array::{
    ArrayRef, BinaryBuilder, BooleanBuilder, Float32Builder, Float64Builder, Int32Builder,
    Int64Builder, ListArray, MapArray, StringBuilder, StructArray, TimestampMicrosecondBuilder,
    TimestampMillisecondBuilder, TimestampNanosecondBuilder, TimestampSecondBuilder, UInt32Builder,
    UInt64Builder,
};
use arrow::buffer::{NullBuffer, OffsetBuffer};
use arrow::datatypes::{DataType, Field, FieldRef, Fields, Schema, TimeUnit};
use prost_reflect::{DynamicMessage, FieldDescriptor, Kind, MessageDescriptor, Value};

use super::{Direction, TIMESTAMP_MESSAGE, bind_columns, compile};
use crate::encode::rows::{DecodedRows, RowFault, column_fault, conform_rows, targets};
use crate::encode::schema::{PayloadSchema, SchemaEncoding};
use crate::error::{Error, Result};

/// A compiled `.proto` schema that turns payloads into rows; see the module docs.
#[derive(Debug, Clone)]
pub struct ProtoRowDecoder {
    message: MessageDescriptor,
    /// The bound columns, in the order given.
    targets: Arc<[FieldRef]>,
    /// Each bound column's field, and whether its empty string reads as NULL: a top-level
    /// string field without presence bound to a column that is not a string (a `TIMESTAMP`, a
    /// decimal), whose empty default stands for the NULL the sink wrote.
    fields: Vec<(FieldDescriptor, bool)>,
}

impl ProtoRowDecoder {
    /// Compiles the schema and checks the table's `columns` against the message's fields by
    /// name: a column the message lacks, or a type that does not convert, is an error naming
    /// the column, the field and both types. Fields without a column are skipped.
    pub fn new(schema: &PayloadSchema, table: &Schema, columns: &[usize]) -> Result<Self> {
        let message = compile(schema)?;
        let bound = bind_columns(schema, &message, table, columns, Direction::Read)?;
        let fields = bound
            .into_iter()
            .map(|(field, c, _)| {
                let empty_is_null = matches!(field.kind(), Kind::String)
                    && !field.supports_presence()
                    && !field.is_list()
                    && !super::is_string(table.field(c).data_type());
                (field, empty_is_null)
            })
            .collect();
        Ok(ProtoRowDecoder {
            message,
            targets: targets(table, columns),
            fields,
        })
    }

    /// The columns this decoder fills, in the order it was given them.
    pub fn targets(&self) -> &[FieldRef] {
        &self.targets
    }

    /// Decodes each payload (in `encodings[i]`) into the bound columns. A payload that is not
    /// a message of the schema, or whose value does not fit its column, is a fault naming the
    /// message type or the column, never the data.
    pub fn decode(&self, datas: &[&[u8]], encodings: &[SchemaEncoding]) -> Result<DecodedRows> {
        let mut builders = self
            .fields
            .iter()
            .zip(self.targets.iter())
            .map(|((field, empty_is_null), target)| {
                Builder::for_field(field, target.data_type(), *empty_is_null)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut rows = Vec::with_capacity(datas.len());
        let mut faults = Vec::new();
        for (i, (data, encoding)) in datas.iter().zip(encodings).enumerate() {
            let message = match self.decode_one(data, *encoding) {
                Ok(message) => message,
                Err(reason) => {
                    faults.push((i, RowFault::Payload(reason)));
                    continue;
                }
            };
            rows.push(i);
            let mut fault = None;
            for (((field, _), builder), target) in self
                .fields
                .iter()
                .zip(&mut builders)
                .zip(self.targets.iter())
            {
                if builder.append_field(&message, field).is_err() && fault.is_none() {
                    fault = Some(column_fault(target, "protobuf field"));
                }
            }
            if let Some(fault) = fault {
                faults.push((i, fault));
            }
        }
        let natural = builders
            .iter_mut()
            .map(Builder::finish)
            .collect::<Result<Vec<_>>>()?;
        conform_rows(rows, natural, &self.targets, faults, "protobuf field")
    }

    fn decode_one(
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
                            classify(&e)
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
fn classify(e: &serde_json::Error) -> String {
    format!(
        "{:?} error at line {}, column {}",
        e.classify(),
        e.line(),
        e.column()
    )
}

/// A value that does not fit its builder (a timestamp out of range; a value of another kind).
#[derive(Debug)]
struct Unfit;

/// The values of one field across messages, in an Arrow builder chosen for the field's kind
/// and its column's type.
enum Builder {
    Bool(BooleanBuilder),
    I32(Int32Builder),
    I64(Int64Builder),
    U32(UInt32Builder),
    U64(UInt64Builder),
    F32(Float32Builder),
    F64(Float64Builder),
    /// A string; with `true`, an empty one is NULL.
    Str(StringBuilder, bool),
    Bytes(BinaryBuilder),
    /// An enum as its value's name (an unknown number as its digits).
    EnumName(prost_reflect::EnumDescriptor, StringBuilder),
    /// A `google.protobuf.Timestamp`, in UTC.
    Timestamp(TimeUnit, TimestampBuilder),
    /// A message as a struct: each named field with its builder, and which rows are set.
    Message {
        fields: Vec<(FieldDescriptor, Builder)>,
        names: Vec<String>,
        valid: Vec<bool>,
    },
    /// A repeated field: the offsets of each row's items.
    List {
        item: Box<Builder>,
        item_name: String,
        lengths: Vec<usize>,
    },
    /// A map field: the offsets of each row's entries, which are sorted by key.
    Map {
        key: Box<Builder>,
        value: Box<Builder>,
        names: [String; 3],
        lengths: Vec<usize>,
        sorted: bool,
    },
}

/// The timestamp builders, one per unit.
enum TimestampBuilder {
    Second(TimestampSecondBuilder),
    Millisecond(TimestampMillisecondBuilder),
    Microsecond(TimestampMicrosecondBuilder),
    Nanosecond(TimestampNanosecondBuilder),
}

impl Builder {
    /// The builder of `field` (repeated and map fields included) for a column of `target`.
    fn for_field(field: &FieldDescriptor, target: &DataType, empty_is_null: bool) -> Result<Self> {
        if field.is_map() {
            let (Kind::Message(entry), DataType::Map(entries, sorted)) = (field.kind(), target)
            else {
                return internal(field);
            };
            let DataType::Struct(kv) = entries.data_type() else {
                return internal(field);
            };
            let (Some(k), Some(v)) = (kv.first(), kv.get(1)) else {
                return internal(field);
            };
            return Ok(Builder::Map {
                key: Box::new(Builder::for_kind(
                    &entry.map_entry_key_field(),
                    k.data_type(),
                    false,
                )?),
                value: Box::new(Builder::for_kind(
                    &entry.map_entry_value_field(),
                    v.data_type(),
                    false,
                )?),
                names: [entries.name().clone(), k.name().clone(), v.name().clone()],
                lengths: Vec::new(),
                sorted: *sorted,
            });
        }
        if field.is_list() {
            let (DataType::List(item)
            | DataType::LargeList(item)
            | DataType::FixedSizeList(item, _)) = target
            else {
                return internal(field);
            };
            return Ok(Builder::List {
                item: Box::new(Builder::for_kind(field, item.data_type(), false)?),
                item_name: item.name().clone(),
                lengths: Vec::new(),
            });
        }
        Builder::for_kind(field, target, empty_is_null)
    }

    /// The builder of one value of `field`'s kind for a column value of `target`.
    fn for_kind(field: &FieldDescriptor, target: &DataType, empty_is_null: bool) -> Result<Self> {
        Ok(match field.kind() {
            Kind::Bool => Builder::Bool(BooleanBuilder::new()),
            Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => Builder::I32(Int32Builder::new()),
            Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => Builder::I64(Int64Builder::new()),
            Kind::Uint32 | Kind::Fixed32 => Builder::U32(UInt32Builder::new()),
            Kind::Uint64 | Kind::Fixed64 => Builder::U64(UInt64Builder::new()),
            Kind::Float => Builder::F32(Float32Builder::new()),
            Kind::Double => Builder::F64(Float64Builder::new()),
            Kind::String => Builder::Str(StringBuilder::new(), empty_is_null),
            Kind::Bytes => Builder::Bytes(BinaryBuilder::new()),
            Kind::Enum(_) if target.is_integer() => Builder::I32(Int32Builder::new()),
            Kind::Enum(e) => Builder::EnumName(e, StringBuilder::new()),
            Kind::Message(m) if m.full_name() == TIMESTAMP_MESSAGE => {
                let unit = match target {
                    DataType::Timestamp(unit, _) => *unit,
                    _ => TimeUnit::Millisecond,
                };
                Builder::Timestamp(
                    unit,
                    match unit {
                        TimeUnit::Second => TimestampBuilder::Second(Default::default()),
                        TimeUnit::Millisecond => TimestampBuilder::Millisecond(Default::default()),
                        TimeUnit::Microsecond => TimestampBuilder::Microsecond(Default::default()),
                        TimeUnit::Nanosecond => TimestampBuilder::Nanosecond(Default::default()),
                    },
                )
            }
            Kind::Message(m) => {
                let DataType::Struct(children) = target else {
                    return internal(field);
                };
                let mut fields = Vec::with_capacity(children.len());
                for child in children.iter() {
                    let Some(f) = m.get_field_by_name(child.name()) else {
                        return internal(field);
                    };
                    let builder = Builder::for_field(&f, child.data_type(), false)?;
                    fields.push((f, builder));
                }
                Builder::Message {
                    fields,
                    names: children.iter().map(|c| c.name().clone()).collect(),
                    valid: Vec::new(),
                }
            }
        })
    }

    /// Appends `message`'s value of `field`: NULL when it has presence and is unset.
    fn append_field(
        &mut self,
        message: &DynamicMessage,
        field: &FieldDescriptor,
    ) -> std::result::Result<(), Unfit> {
        if field.supports_presence() && !message.has_field(field) {
            self.append_null();
            return Ok(());
        }
        self.append(&message.get_field(field))
    }

    fn append_null(&mut self) {
        match self {
            Builder::Bool(b) => b.append_null(),
            Builder::I32(b) => b.append_null(),
            Builder::I64(b) => b.append_null(),
            Builder::U32(b) => b.append_null(),
            Builder::U64(b) => b.append_null(),
            Builder::F32(b) => b.append_null(),
            Builder::F64(b) => b.append_null(),
            Builder::Str(b, _) | Builder::EnumName(_, b) => b.append_null(),
            Builder::Bytes(b) => b.append_null(),
            Builder::Timestamp(_, b) => match b {
                TimestampBuilder::Second(b) => b.append_null(),
                TimestampBuilder::Millisecond(b) => b.append_null(),
                TimestampBuilder::Microsecond(b) => b.append_null(),
                TimestampBuilder::Nanosecond(b) => b.append_null(),
            },
            Builder::Message { fields, valid, .. } => {
                for (_, b) in fields {
                    b.append_null();
                }
                valid.push(false);
            }
            Builder::List { lengths, .. } | Builder::Map { lengths, .. } => lengths.push(0),
        }
    }

    /// Appends one value (a list for a repeated field, a map for a map field).
    fn append(&mut self, value: &Value) -> std::result::Result<(), Unfit> {
        match (self, value) {
            (Builder::Bool(b), Value::Bool(v)) => b.append_value(*v),
            (Builder::I32(b), Value::I32(v) | Value::EnumNumber(v)) => b.append_value(*v),
            (Builder::I64(b), Value::I64(v)) => b.append_value(*v),
            (Builder::U32(b), Value::U32(v)) => b.append_value(*v),
            (Builder::U64(b), Value::U64(v)) => b.append_value(*v),
            (Builder::F32(b), Value::F32(v)) => b.append_value(*v),
            (Builder::F64(b), Value::F64(v)) => b.append_value(*v),
            (Builder::Str(b, empty_is_null), Value::String(v)) => {
                if v.is_empty() && *empty_is_null {
                    b.append_null();
                } else {
                    b.append_value(v);
                }
            }
            (Builder::Bytes(b), Value::Bytes(v)) => b.append_value(v),
            (Builder::EnumName(e, b), Value::EnumNumber(n)) => match e.get_value(*n) {
                Some(v) => b.append_value(v.name()),
                None => b.append_value(n.to_string()),
            },
            (Builder::Timestamp(unit, b), Value::Message(m)) => {
                let get = |name: &str| m.get_field_by_name(name).map(|v| v.into_owned());
                let seconds = get("seconds").and_then(|v| v.as_i64()).unwrap_or(0);
                let nanos = get("nanos").and_then(|v| v.as_i32()).unwrap_or(0);
                let in_range = chrono::DateTime::from_timestamp(
                    seconds,
                    u32::try_from(nanos).map_err(|_| Unfit)?,
                )
                .is_some();
                let (per_second, per_unit) = match unit {
                    TimeUnit::Second => (1, 1_000_000_000),
                    TimeUnit::Millisecond => (1_000, 1_000_000),
                    TimeUnit::Microsecond => (1_000_000, 1_000),
                    TimeUnit::Nanosecond => (1_000_000_000, 1),
                };
                let value = seconds
                    .checked_mul(per_second)
                    .and_then(|s| s.checked_add(i64::from(nanos / per_unit)))
                    .filter(|_| in_range);
                let Some(value) = value else {
                    // Outside what the column holds: NULL here, and the row is a bad one.
                    match b {
                        TimestampBuilder::Second(b) => b.append_null(),
                        TimestampBuilder::Millisecond(b) => b.append_null(),
                        TimestampBuilder::Microsecond(b) => b.append_null(),
                        TimestampBuilder::Nanosecond(b) => b.append_null(),
                    }
                    return Err(Unfit);
                };
                match b {
                    TimestampBuilder::Second(b) => b.append_value(value),
                    TimestampBuilder::Millisecond(b) => b.append_value(value),
                    TimestampBuilder::Microsecond(b) => b.append_value(value),
                    TimestampBuilder::Nanosecond(b) => b.append_value(value),
                }
            }
            (Builder::Message { fields, valid, .. }, Value::Message(m)) => {
                let mut result = Ok(());
                for (f, b) in fields.iter_mut() {
                    if let Err(e) = b.append_field(m, f) {
                        result = Err(e);
                    }
                }
                valid.push(true);
                return result;
            }
            (Builder::List { item, lengths, .. }, Value::List(items)) => {
                let mut result = Ok(());
                for v in items {
                    if let Err(e) = item.append(v) {
                        result = Err(e);
                    }
                }
                lengths.push(items.len());
                return result;
            }
            (
                Builder::Map {
                    key,
                    value,
                    lengths,
                    ..
                },
                Value::Map(entries),
            ) => {
                let mut sorted: Vec<_> = entries.iter().collect();
                sorted.sort_by(|a, b| a.0.cmp(b.0));
                let mut result = Ok(());
                for (k, v) in sorted {
                    let k: Value = k.clone().into();
                    if let Err(e) = key.append(&k).and_then(|()| value.append(v)) {
                        result = Err(e);
                    }
                }
                lengths.push(entries.len());
                return result;
            }
            (b, _) => {
                b.append_null();
                return Err(Unfit);
            }
        }
        Ok(())
    }

    /// The values built so far, in the field's own Arrow type; the builder starts over.
    fn finish(&mut self) -> Result<ArrayRef> {
        Ok(match self {
            Builder::Bool(b) => Arc::new(b.finish()),
            Builder::I32(b) => Arc::new(b.finish()),
            Builder::I64(b) => Arc::new(b.finish()),
            Builder::U32(b) => Arc::new(b.finish()),
            Builder::U64(b) => Arc::new(b.finish()),
            Builder::F32(b) => Arc::new(b.finish()),
            Builder::F64(b) => Arc::new(b.finish()),
            Builder::Str(b, _) | Builder::EnumName(_, b) => Arc::new(b.finish()),
            Builder::Bytes(b) => Arc::new(b.finish()),
            Builder::Timestamp(_, b) => match b {
                TimestampBuilder::Second(b) => Arc::new(b.finish().with_timezone("UTC")),
                TimestampBuilder::Millisecond(b) => Arc::new(b.finish().with_timezone("UTC")),
                TimestampBuilder::Microsecond(b) => Arc::new(b.finish().with_timezone("UTC")),
                TimestampBuilder::Nanosecond(b) => Arc::new(b.finish().with_timezone("UTC")),
            },
            Builder::Message {
                fields,
                names,
                valid,
            } => {
                let arrays = fields
                    .iter_mut()
                    .map(|(_, b)| b.finish())
                    .collect::<Result<Vec<_>>>()?;
                let children: Fields = names
                    .iter()
                    .zip(&arrays)
                    .map(|(n, a)| Field::new(n, a.data_type().clone(), true))
                    .collect();
                let nulls = NullBuffer::from(std::mem::take(valid));
                if arrays.is_empty() {
                    Arc::new(StructArray::new_empty_fields(nulls.len(), Some(nulls)))
                } else {
                    Arc::new(StructArray::try_new(children, arrays, Some(nulls))?)
                }
            }
            Builder::List {
                item,
                item_name,
                lengths,
            } => {
                let values = item.finish()?;
                let field = Arc::new(Field::new(
                    item_name.as_str(),
                    values.data_type().clone(),
                    true,
                ));
                Arc::new(ListArray::try_new(
                    field,
                    OffsetBuffer::from_lengths(std::mem::take(lengths)),
                    values,
                    None,
                )?)
            }
            Builder::Map {
                key,
                value,
                names,
                lengths,
                sorted,
            } => {
                let keys = key.finish()?;
                let values = value.finish()?;
                let kv = Fields::from(vec![
                    Field::new(names[1].as_str(), keys.data_type().clone(), false),
                    Field::new(names[2].as_str(), values.data_type().clone(), true),
                ]);
                let entries = StructArray::try_new(kv.clone(), vec![keys, values], None)?;
                Arc::new(MapArray::try_new(
                    Arc::new(Field::new(names[0].as_str(), DataType::Struct(kv), false)),
                    OffsetBuffer::from_lengths(std::mem::take(lengths)),
                    entries,
                    None,
                    *sorted,
                )?)
            }
        })
    }
}

fn internal<T>(field: &FieldDescriptor) -> Result<T> {
    Err(Error::Unsupported(format!(
        "internal: field '{}' was bound to a column it cannot fill",
        field.name()
    )))
}
