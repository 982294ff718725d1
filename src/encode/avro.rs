//! Arrow rows to Avro datums, one per row, to match a given Avro schema.
//!
//! The binary encoding is a bare datum: no container file header, no single-object encoding
//! header, exactly what a Pub/Sub topic with an Avro schema and `BINARY` encoding expects. The
//! bytes are written by `arrow-avro` (its `AvroBinaryFormat` row encoder); this module checks the
//! table against the schema, converts each column to the Arrow type that encoder writes for the
//! field's Avro type (so an `INT64` column feeds an Avro `int`, a nanosecond timestamp a
//! `timestamp-micros`), and finds the rows the schema refuses before anything is written. The
//! JSON encoding is Avro's own (a union's non-null value is wrapped in an object keyed by the
//! branch's type name, bytes are a string of code points U+0000 to U+00FF); `arrow-avro` does not
//! write it, so [`AvroRowEncoder`] does.
//!
//! # Type mapping
//!
//! | Avro | Arrow columns accepted |
//! |---|---|
//! | `boolean` | `BOOLEAN` |
//! | `int`, `long` | any integer (a value out of range refuses the row) |
//! | `float`, `double` | any integer, float or decimal |
//! | `string` (also `uuid`) | any string |
//! | `enum` | any string (a value that is not a symbol refuses the row) |
//! | `bytes`, `fixed` | any binary (a `fixed` of another length refuses the row) |
//! | `int` + `date` | `DATE` |
//! | `int` + `time-millis`, `long` + `time-micros` | `TIME` |
//! | `long` + `timestamp-millis`/`-micros`/`-nanos` (and `local-timestamp-*`) | `TIMESTAMP`, `DATE` |
//! | `bytes`/`fixed` + `decimal(p, s)` | any decimal or integer (a value that does not fit refuses the row) |
//! | `record` | `STRUCT`, fields by name |
//! | `array` | `LIST` (any layout) |
//! | `map` | `MAP` with string keys |
//! | `["null", T]` / `[T, "null"]` | a nullable column of a type `T` accepts; a null refuses the row where the field is not such a union |
//!
//! Other unions are refused at declaration.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, ListArray, MapArray, RecordBatch, StructArray, new_null_array,
};
use arrow::compute::{CastOptions, cast, cast_with_options};
use arrow::datatypes::{
    DataType, Date32Type, Decimal128Type, Decimal256Type, Field, Fields, Float32Type, Float64Type,
    Int32Type, Int64Type, Schema, TimeUnit,
};
use arrow_avro::schema::SCHEMA_METADATA_KEY;
use arrow_avro::writer::WriterBuilder;
use arrow_avro::writer::format::AvroBinaryFormat;
use serde_json::{Map as JsonMap, Value as Json};

use super::schema::{PayloadSchema, RowPayload, SchemaEncoding, arrow_type_name};
use crate::error::{Error, Result};

pub mod decode;

/// A checked Avro schema bound to a table's payload columns; see the module docs.
#[derive(Debug, Clone)]
pub struct AvroRowEncoder {
    definition: String,
    encoding: SchemaEncoding,
    /// The top-level record's fields, in schema order, each with its table column (if any).
    fields: Vec<(FieldSlot, Option<usize>)>,
    /// The Arrow schema handed to `arrow-avro`: one field per Avro field, of its target type.
    target: Arc<Schema>,
}

#[derive(Debug, Clone)]
struct FieldSlot {
    name: String,
    slot: Slot,
}

#[derive(Debug, Clone)]
struct Slot {
    ty: Ty,
    /// A union with `null`.
    nullable: bool,
    /// The non-null branch's name, as Avro JSON keys a union value.
    branch: String,
}

#[derive(Debug, Clone)]
enum Ty {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    Bytes,
    Str,
    Date,
    TimeMillis,
    TimeMicros,
    Timestamp {
        unit: TimeUnit,
        utc: bool,
    },
    Decimal {
        precision: u8,
        scale: i8,
        fixed: Option<usize>,
    },
    Fixed(usize),
    Enum(Arc<[String]>),
    Record(Arc<[FieldSlot]>),
    Array(Box<Slot>),
    Map(Box<Slot>),
}

impl std::fmt::Display for Ty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ty::Null => f.write_str("null"),
            Ty::Boolean => f.write_str("boolean"),
            Ty::Int => f.write_str("int"),
            Ty::Long => f.write_str("long"),
            Ty::Float => f.write_str("float"),
            Ty::Double => f.write_str("double"),
            Ty::Bytes => f.write_str("bytes"),
            Ty::Str => f.write_str("string"),
            Ty::Date => f.write_str("int (date)"),
            Ty::TimeMillis => f.write_str("int (time-millis)"),
            Ty::TimeMicros => f.write_str("long (time-micros)"),
            Ty::Timestamp { unit, utc } => {
                let unit = match unit {
                    TimeUnit::Millisecond => "millis",
                    TimeUnit::Microsecond => "micros",
                    _ => "nanos",
                };
                let local = if *utc { "" } else { "local-" };
                write!(f, "long ({local}timestamp-{unit})")
            }
            Ty::Decimal {
                precision, scale, ..
            } => write!(f, "decimal({precision}, {scale})"),
            Ty::Fixed(n) => write!(f, "fixed({n})"),
            Ty::Enum(_) => f.write_str("enum"),
            Ty::Record(_) => f.write_str("record"),
            Ty::Array(item) => write!(f, "array of {}", item.ty),
            Ty::Map(value) => write!(f, "map of {}", value.ty),
        }
    }
}

impl Slot {
    fn describe(&self) -> String {
        if self.nullable {
            format!("{} or null", self.ty)
        } else {
            self.ty.to_string()
        }
    }
}

// --- schema parsing ------------------------------------------------------------------------------

struct Parser {
    /// Named types (records, enums, fixed) by full name, for references.
    named: HashMap<String, (Ty, String)>,
}

fn full_name(name: &str, namespace: Option<&str>) -> String {
    match namespace {
        Some(ns) if !name.contains('.') && !ns.is_empty() => format!("{ns}.{name}"),
        _ => name.to_string(),
    }
}

impl Parser {
    fn slot(&mut self, v: &Json, ns: Option<&str>, at: &str) -> std::result::Result<Slot, String> {
        if let Json::Array(branches) = v {
            let non_null: Vec<&Json> = branches
                .iter()
                .filter(|b| b.as_str() != Some("null"))
                .collect();
            let has_null = non_null.len() < branches.len();
            return match non_null.as_slice() {
                [one] => {
                    let (ty, branch) = self.ty(one, ns, at)?;
                    Ok(Slot {
                        ty,
                        nullable: has_null,
                        branch,
                    })
                }
                [] => Ok(Slot {
                    ty: Ty::Null,
                    nullable: true,
                    branch: "null".into(),
                }),
                _ => Err(format!(
                    "{at}: a union of {} types; only a type, or a union of one type with \"null\", \
                     can be written from a column",
                    branches.len()
                )),
            };
        }
        let (ty, branch) = self.ty(v, ns, at)?;
        Ok(Slot {
            nullable: matches!(ty, Ty::Null),
            ty,
            branch,
        })
    }

    /// A non-union type and its name as a union branch.
    fn ty(
        &mut self,
        v: &Json,
        ns: Option<&str>,
        at: &str,
    ) -> std::result::Result<(Ty, String), String> {
        match v {
            Json::String(s) => {
                let ty = match s.as_str() {
                    "null" => Ty::Null,
                    "boolean" => Ty::Boolean,
                    "int" => Ty::Int,
                    "long" => Ty::Long,
                    "float" => Ty::Float,
                    "double" => Ty::Double,
                    "bytes" => Ty::Bytes,
                    "string" => Ty::Str,
                    name => {
                        let full = full_name(name, ns);
                        let found = self
                            .named
                            .get(&full)
                            .or_else(|| self.named.get(name))
                            .cloned();
                        return found.ok_or_else(|| format!("{at}: unknown type name '{name}'"));
                    }
                };
                Ok((ty, s.clone()))
            }
            Json::Object(o) => self.complex(o, ns, at),
            Json::Array(_) => Err(format!("{at}: a union nested directly in a union")),
            _ => Err(format!("{at}: not an Avro type")),
        }
    }

    fn complex(
        &mut self,
        o: &JsonMap<String, Json>,
        ns: Option<&str>,
        at: &str,
    ) -> std::result::Result<(Ty, String), String> {
        let Some(t) = o.get("type") else {
            return Err(format!("{at}: an object without \"type\""));
        };
        let logical = o.get("logicalType").and_then(Json::as_str);
        let name = o.get("name").and_then(Json::as_str);
        let own_ns = o.get("namespace").and_then(Json::as_str).or(ns);
        let named = |this: &mut Parser, ty: Ty| -> std::result::Result<(Ty, String), String> {
            let Some(name) = name else {
                return Err(format!("{at}: a named type without \"name\""));
            };
            let full = full_name(name, own_ns);
            this.named.insert(full.clone(), (ty.clone(), full.clone()));
            Ok((ty, full))
        };
        match t.as_str() {
            Some("record" | "error") => {
                let name = name.ok_or_else(|| format!("{at}: a record without \"name\""))?;
                let full = full_name(name, own_ns);
                let record_ns = full.rsplit_once('.').map(|(n, _)| n.to_string());
                let Some(Json::Array(fields)) = o.get("fields") else {
                    return Err(format!("{at}: record '{name}' has no \"fields\" list"));
                };
                let mut out = Vec::with_capacity(fields.len());
                for f in fields {
                    let fname = f
                        .get("name")
                        .and_then(Json::as_str)
                        .ok_or_else(|| format!("{at}: a field of record '{name}' has no name"))?;
                    let fat = if at.is_empty() {
                        fname.to_string()
                    } else {
                        format!("{at}.{fname}")
                    };
                    let ftype = f
                        .get("type")
                        .ok_or_else(|| format!("field '{fat}' has no type"))?;
                    let slot = self.slot(ftype, record_ns.as_deref(), &fat)?;
                    out.push(FieldSlot {
                        name: fname.to_string(),
                        slot,
                    });
                }
                let ty = Ty::Record(out.into());
                self.named.insert(full.clone(), (ty.clone(), full.clone()));
                Ok((ty, full))
            }
            Some("enum") => {
                let symbols: Vec<String> = o
                    .get("symbols")
                    .and_then(Json::as_array)
                    .map(|s| {
                        s.iter()
                            .filter_map(|x| x.as_str().map(str::to_string))
                            .collect()
                    })
                    .ok_or_else(|| format!("{at}: an enum without \"symbols\""))?;
                named(self, Ty::Enum(symbols.into()))
            }
            Some("fixed") => {
                let size = o
                    .get("size")
                    .and_then(Json::as_u64)
                    .ok_or_else(|| format!("{at}: a fixed without \"size\""))?
                    as usize;
                let ty = match logical {
                    Some("decimal") => decimal(o, Some(size), at)?,
                    _ => Ty::Fixed(size),
                };
                named(self, ty)
            }
            Some("array") => {
                let items = o
                    .get("items")
                    .ok_or_else(|| format!("{at}: an array without \"items\""))?;
                let item = self.slot(items, ns, &format!("{at}[]"))?;
                Ok((Ty::Array(Box::new(item)), "array".into()))
            }
            Some("map") => {
                let values = o
                    .get("values")
                    .ok_or_else(|| format!("{at}: a map without \"values\""))?;
                let value = self.slot(values, ns, &format!("{at}{{}}"))?;
                Ok((Ty::Map(Box::new(value)), "map".into()))
            }
            Some(primitive) => {
                let base = self.ty(&Json::String(primitive.to_string()), ns, at)?;
                let ty = match (primitive, logical) {
                    ("int", Some("date")) => Ty::Date,
                    ("int", Some("time-millis")) => Ty::TimeMillis,
                    ("long", Some("time-micros")) => Ty::TimeMicros,
                    ("long", Some(l)) if l.ends_with("timestamp-millis") => Ty::Timestamp {
                        unit: TimeUnit::Millisecond,
                        utc: !l.starts_with("local-"),
                    },
                    ("long", Some(l)) if l.ends_with("timestamp-micros") => Ty::Timestamp {
                        unit: TimeUnit::Microsecond,
                        utc: !l.starts_with("local-"),
                    },
                    ("long", Some(l)) if l.ends_with("timestamp-nanos") => Ty::Timestamp {
                        unit: TimeUnit::Nanosecond,
                        utc: !l.starts_with("local-"),
                    },
                    ("bytes", Some("decimal")) => decimal(o, None, at)?,
                    // Unknown logical types are ignored, as the specification says.
                    _ => base.0,
                };
                Ok((ty, base.1))
            }
            None => {
                // {"type": {...}} or {"type": [...]}: the inner type.
                let slot = self.slot(t, ns, at)?;
                if slot.nullable && !matches!(slot.ty, Ty::Null) {
                    return Err(format!("{at}: a union given as an object's \"type\""));
                }
                Ok((slot.ty, slot.branch))
            }
        }
    }
}

fn decimal(
    o: &JsonMap<String, Json>,
    fixed: Option<usize>,
    at: &str,
) -> std::result::Result<Ty, String> {
    let precision = o
        .get("precision")
        .and_then(Json::as_u64)
        .ok_or_else(|| format!("{at}: a decimal without \"precision\""))?;
    let scale = o.get("scale").and_then(Json::as_u64).unwrap_or(0);
    if precision == 0 || precision > 76 || scale > precision {
        return Err(format!(
            "{at}: decimal({precision}, {scale}) is outside what can be written (precision 1 to 76, scale at most the precision)"
        ));
    }
    Ok(Ty::Decimal {
        precision: precision as u8,
        scale: scale as i8,
        fixed,
    })
}

/// The Arrow type `arrow-avro` writes for an Avro type. Every Arrow field is nullable: the Avro
/// schema, not Arrow, says which nulls are allowed, and refused rows are found before encoding.
fn target_type(ty: &Ty) -> DataType {
    match ty {
        Ty::Null => DataType::Null,
        Ty::Boolean => DataType::Boolean,
        Ty::Int => DataType::Int32,
        Ty::Long => DataType::Int64,
        Ty::Float => DataType::Float32,
        Ty::Double => DataType::Float64,
        Ty::Bytes => DataType::Binary,
        Ty::Str => DataType::Utf8,
        Ty::Date => DataType::Date32,
        Ty::TimeMillis => DataType::Time32(TimeUnit::Millisecond),
        Ty::TimeMicros => DataType::Time64(TimeUnit::Microsecond),
        Ty::Timestamp { unit, utc } => DataType::Timestamp(*unit, utc.then(|| Arc::from("+00:00"))),
        Ty::Decimal {
            precision, scale, ..
        } if *precision <= 38 => DataType::Decimal128(*precision, *scale),
        Ty::Decimal {
            precision, scale, ..
        } => DataType::Decimal256(*precision, *scale),
        Ty::Fixed(n) => DataType::FixedSizeBinary(*n as i32),
        Ty::Enum(_) => DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
        Ty::Record(fields) => DataType::Struct(record_fields(fields)),
        Ty::Array(item) => {
            DataType::List(Arc::new(Field::new("item", target_type(&item.ty), true)))
        }
        Ty::Map(value) => DataType::Map(map_entries(&value.ty), false),
    }
}

fn record_fields(fields: &[FieldSlot]) -> Fields {
    fields
        .iter()
        .map(|f| Field::new(&f.name, target_type(&f.slot.ty), true))
        .collect()
}

fn map_entries(value: &Ty) -> Arc<Field> {
    Arc::new(Field::new(
        "entries",
        DataType::Struct(Fields::from(vec![
            Field::new("key", DataType::Utf8, false),
            Field::new("value", target_type(value), true),
        ])),
        false,
    ))
}

// --- declaration checks --------------------------------------------------------------------------

fn is_int(t: &DataType) -> bool {
    t.is_integer()
}

fn is_string(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

fn is_binary(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView
            | DataType::FixedSizeBinary(_)
    )
}

/// Whether a column of type `src` can be written to an Avro slot; the error is the reason
/// (without the column and field names, which the caller adds).
fn check(src: &DataType, slot: &Slot, at: &str) -> std::result::Result<(), String> {
    let mismatch = || {
        Err(format!(
            "field '{at}' has the Avro type {} and the column's value there is {}, which cannot be converted",
            slot.describe(),
            arrow_type_name(src)
        ))
    };
    let ok = match (&slot.ty, src) {
        (_, DataType::Null) => true,
        (Ty::Null, _) => false,
        (Ty::Boolean, DataType::Boolean) => true,
        (Ty::Int | Ty::Long, t) => is_int(t),
        (Ty::Float | Ty::Double, t) => is_int(t) || t.is_floating() || t.is_decimal(),
        (Ty::Str | Ty::Enum(_), t) => is_string(t),
        (Ty::Bytes | Ty::Fixed(_), t) => is_binary(t),
        (Ty::Date, DataType::Date32 | DataType::Date64) => true,
        (Ty::TimeMillis | Ty::TimeMicros, DataType::Time32(_) | DataType::Time64(_)) => true,
        (Ty::Timestamp { .. }, DataType::Timestamp(..) | DataType::Date32 | DataType::Date64) => {
            true
        }
        (Ty::Decimal { .. }, t) => t.is_decimal() || is_int(t),
        (Ty::Record(fields), DataType::Struct(children)) => {
            return check_record(fields, children, at);
        }
        (
            Ty::Array(item),
            DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _),
        ) => return check(f.data_type(), item, &format!("{at}[]")),
        (Ty::Map(value), DataType::Map(entries, _)) => {
            let DataType::Struct(kv) = entries.data_type() else {
                return mismatch();
            };
            if kv.len() != 2 || !is_string(kv[0].data_type()) {
                return Err(format!(
                    "field '{at}' is an Avro map, whose keys are strings, and the column's map has {} keys",
                    kv.first()
                        .map_or("no".to_string(), |k| arrow_type_name(k.data_type()))
                ));
            }
            return check(kv[1].data_type(), value, &format!("{at}{{}}"));
        }
        _ => false,
    };
    if ok { Ok(()) } else { mismatch() }
}

fn check_record(
    fields: &[FieldSlot],
    children: &Fields,
    at: &str,
) -> std::result::Result<(), String> {
    for child in children.iter() {
        if !fields.iter().any(|f| &f.name == child.name()) {
            return Err(format!(
                "struct field '{at}.{}' ({}) has no field in the Avro record (its fields: {})",
                child.name(),
                arrow_type_name(child.data_type()),
                names(fields)
            ));
        }
    }
    for f in fields {
        let fat = format!("{at}.{}", f.name);
        match children.iter().find(|c| c.name() == &f.name) {
            Some(c) => check(c.data_type(), &f.slot, &fat)?,
            None if f.slot.nullable => {}
            None => {
                return Err(format!(
                    "field '{fat}' ({}) is required and the struct has no field '{}'",
                    f.slot.describe(),
                    f.name
                ));
            }
        }
    }
    Ok(())
}

fn names(fields: &[FieldSlot]) -> String {
    fields
        .iter()
        .map(|f| format!("'{}'", f.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Which way a schema is bound to columns: the sink writes rows to it, the source reads rows
/// from it (a field without a column is then skipped, required or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Rows become payloads.
    Write,
    /// Payloads become rows.
    Read,
}

impl Direction {
    pub(crate) fn verb(self) -> &'static str {
        match self {
            Direction::Write => "written to",
            Direction::Read => "read from",
        }
    }

    /// What to do with a column the schema lacks.
    pub(crate) fn hint(self) -> &'static str {
        match self {
            Direction::Write => {
                "Leave the column out, or map it to an attribute ('attribute_columns')"
            }
            Direction::Read => "Leave the column out, or name it in a *_column option",
        }
    }
}

/// Parses an Avro schema whose top level is a record: its fields.
fn parse_record(schema: &PayloadSchema) -> Result<Arc<[FieldSlot]>> {
    let invalid = |rule: String| Error::invalid("schema", schema.origin.clone(), rule);
    let json: Json = serde_json::from_str(&schema.definition)
        .map_err(|e| invalid(format!("the Avro schema is not valid JSON: {e}")))?;
    let mut parser = Parser {
        named: HashMap::new(),
    };
    let root = parser
        .slot(&json, None, "")
        .map_err(|rule| invalid(format!("the Avro schema cannot be used: {rule}")))?;
    match root.ty {
        Ty::Record(fields) => Ok(fields),
        other => Err(invalid(format!(
            "the Avro schema's top level is {other}, not a record; a row is a record"
        ))),
    }
}

/// The names of the top-level record's fields, in order.
pub(crate) fn record_field_names(schema: &PayloadSchema) -> Result<Vec<String>> {
    Ok(parse_record(schema)?
        .iter()
        .map(|f| f.name.clone())
        .collect())
}

/// Binds the record's `fields` to the table's `columns` by name, checking each pair's types;
/// the errors name the column, the field and both types.
fn bind_columns(
    schema: &PayloadSchema,
    fields: &[FieldSlot],
    table: &Schema,
    columns: &[usize],
    direction: Direction,
) -> Result<Vec<(FieldSlot, Option<usize>)>> {
    for &c in columns {
        let name = table.field(c).name();
        if !fields.iter().any(|f| &f.name == name) {
            return Err(Error::schema(
                name,
                format!(
                    "column '{name}' ({}) has no field in the Avro schema ({}); its fields are {}. {}",
                    arrow_type_name(table.field(c).data_type()),
                    schema.origin,
                    names(fields),
                    direction.hint()
                ),
            ));
        }
    }
    let mut bound = Vec::with_capacity(fields.len());
    for f in fields.iter() {
        let column = columns
            .iter()
            .copied()
            .find(|&c| table.field(c).name() == &f.name);
        match column {
            Some(c) => {
                let t = table.field(c).data_type();
                check(t, &f.slot, &f.name).map_err(|rule| {
                    Error::schema(
                        &f.name,
                        format!(
                            "column '{}' ({}) cannot be {} the Avro schema ({}): {rule}",
                            f.name,
                            arrow_type_name(t),
                            direction.verb(),
                            schema.origin
                        ),
                    )
                })?;
            }
            None if f.slot.nullable || direction == Direction::Read => {}
            None => {
                return Err(Error::schema(
                    &f.name,
                    format!(
                        "the Avro schema ({}) requires field '{}' ({}) and the table has no column '{}' \
                         (or it has another role); add the column, or make the field a union with \"null\"",
                        schema.origin,
                        f.name,
                        f.slot.describe(),
                        f.name
                    ),
                ));
            }
        }
        bound.push((f.clone(), column));
    }
    Ok(bound)
}

impl AvroRowEncoder {
    /// Parses the Avro schema (a record at the top level) and binds its fields to the table's
    /// `columns` by name; see [`SchemaRowEncoder::new`](super::schema::SchemaRowEncoder::new).
    pub fn new(schema: &PayloadSchema, table: &Schema, columns: &[usize]) -> Result<Self> {
        let invalid = |rule: String| Error::invalid("schema", schema.origin.clone(), rule);
        let fields = parse_record(schema)?;
        let bound = bind_columns(schema, &fields, table, columns, Direction::Write)?;
        let mut metadata = HashMap::new();
        metadata.insert(SCHEMA_METADATA_KEY.to_string(), schema.definition.clone());
        let target = Arc::new(Schema::new_with_metadata(record_fields(&fields), metadata));
        let encoder = AvroRowEncoder {
            definition: schema.definition.clone(),
            encoding: schema.encoding,
            fields: bound,
            target,
        };
        // Let arrow-avro build its plan once now, so that a schema it cannot write is an error
        // at declaration rather than at every batch.
        encoder
            .binary_encoder()
            .map_err(|e| invalid(format!("the Avro schema cannot be written: {e}")))?;
        Ok(encoder)
    }

    fn binary_encoder(
        &self,
    ) -> std::result::Result<arrow_avro::writer::Encoder, arrow_avro::errors::AvroError> {
        WriterBuilder::new(self.target.as_ref().clone()).build_encoder::<AvroBinaryFormat>()
    }

    /// Encodes every row of `batch`; see [`SchemaRowEncoder::encode_batch`](super::schema::SchemaRowEncoder::encode_batch).
    pub fn encode_batch(&self, batch: &RecordBatch) -> Result<Vec<RowPayload>> {
        let n = batch.num_rows();
        let mut bad: Vec<Option<String>> = vec![None; n];
        let owners: Vec<Option<usize>> = (0..n).map(Some).collect();
        let mut columns = Vec::with_capacity(self.fields.len());
        for (f, column) in &self.fields {
            let conformed = match column {
                Some(c) => {
                    let array = batch.columns().get(*c).ok_or_else(|| {
                        Error::schema(&f.name, "the batch has fewer columns than the table schema")
                    })?;
                    conform(array, &f.slot, &f.name, &owners, &mut bad)
                        .map_err(|rule| Error::schema(&f.name, rule))?
                }
                None => new_null_array(&target_type(&f.slot.ty), n),
            };
            columns.push(conformed);
        }
        let conformed = RecordBatch::try_new(self.target.clone(), columns)
            .map_err(|e| Error::schema("(payload)", format!("internal: Avro batch: {e}")))?;
        match self.encoding {
            SchemaEncoding::Binary => self.binary(&conformed, bad),
            SchemaEncoding::Json => Ok(self.json(&conformed, bad)),
        }
    }

    fn binary(&self, batch: &RecordBatch, bad: Vec<Option<String>>) -> Result<Vec<RowPayload>> {
        let encoder_error = |e: arrow_avro::errors::AvroError| {
            Error::schema("(payload)", format!("the Avro encoder: {e}"))
        };
        let mut encoder = self.binary_encoder().map_err(encoder_error)?;
        if encoder.encode(batch).is_ok() {
            let rows = encoder.flush();
            return Ok(bad
                .into_iter()
                .enumerate()
                .map(|(i, reason)| match reason {
                    Some(reason) => Err(reason),
                    None => rows
                        .row(i)
                        .map(|b| b.to_vec())
                        .map_err(|e| format!("the Avro encoder lost the row: {e}")),
                })
                .collect());
        }
        // The encoder refused the batch: encode row by row so that only the rows it refuses
        // are refused.
        let mut out = Vec::with_capacity(bad.len());
        for (i, reason) in bad.into_iter().enumerate() {
            if let Some(reason) = reason {
                out.push(Err(reason));
                continue;
            }
            let mut one = self.binary_encoder().map_err(encoder_error)?;
            out.push(match one.encode(&batch.slice(i, 1)) {
                Ok(()) => one
                    .flush()
                    .row(0)
                    .map(|b| b.to_vec())
                    .map_err(|e| format!("the Avro encoder lost the row: {e}")),
                Err(e) => Err(format!("the Avro encoder refused the row: {e}")),
            });
        }
        Ok(out)
    }

    fn json(&self, batch: &RecordBatch, bad: Vec<Option<String>>) -> Vec<RowPayload> {
        bad.into_iter()
            .enumerate()
            .map(|(row, reason)| {
                if let Some(reason) = reason {
                    return Err(reason);
                }
                let mut object = JsonMap::with_capacity(self.fields.len());
                for (n, (f, _)) in self.fields.iter().enumerate() {
                    object.insert(
                        f.name.clone(),
                        avro_json(batch.column(n).as_ref(), row, &f.slot, &f.name)?,
                    );
                }
                serde_json::to_vec(&Json::Object(object))
                    .map_err(|e| format!("the Avro JSON could not be written: {e}"))
            })
            .collect()
    }

    /// The schema definition (Avro JSON) this encoder writes.
    pub fn definition(&self) -> &str {
        &self.definition
    }
}

// --- conversion and row checks -------------------------------------------------------------------

fn safe() -> CastOptions<'static> {
    CastOptions {
        safe: true,
        ..Default::default()
    }
}

fn refuse(bad: &mut [Option<String>], row: usize, reason: impl FnOnce() -> String) {
    if bad[row].is_none() {
        bad[row] = Some(reason());
    }
}

/// The row of each child element of a list or map array: element `k` of entry `i` belongs to
/// `owners[i]`, and to no row under a null entry.
fn child_owners(
    owners: &[Option<usize>],
    offsets: &[i32],
    children: usize,
    valid: impl Fn(usize) -> bool,
) -> Vec<Option<usize>> {
    let mut out = vec![None; children];
    for (i, o) in owners.iter().enumerate() {
        if let Some(row) = o
            && valid(i)
        {
            for slot in &mut out[offsets[i] as usize..offsets[i + 1] as usize] {
                *slot = Some(*row);
            }
        }
    }
    out
}

/// Converts `src` to the type `arrow-avro` writes for `slot`, recording in `bad` each row
/// (`owners[i]` is the row of element `i`, `None` under a null parent) that the schema refuses:
/// a null where the field is not nullable, a value that does not fit the field's type.
fn conform(
    src: &ArrayRef,
    slot: &Slot,
    at: &str,
    owners: &[Option<usize>],
    bad: &mut [Option<String>],
) -> std::result::Result<ArrayRef, String> {
    let target = target_type(&slot.ty);
    let converted: ArrayRef = match (&slot.ty, src.data_type()) {
        (_, DataType::Null) => new_null_array(&target, src.len()),
        (Ty::Record(fields), DataType::Struct(_)) => {
            let s = src.as_struct();
            let child_owners: Vec<Option<usize>> = owners
                .iter()
                .enumerate()
                .map(|(i, o)| o.filter(|_| s.is_valid(i)))
                .collect();
            let mut children = Vec::with_capacity(fields.len());
            for f in fields.iter() {
                let fat = format!("{at}.{}", f.name);
                children.push(match s.column_by_name(&f.name) {
                    Some(child) => conform(child, &f.slot, &fat, &child_owners, bad)?,
                    None => new_null_array(&target_type(&f.slot.ty), s.len()),
                });
            }
            Arc::new(
                StructArray::try_new(record_fields(fields), children, s.nulls().cloned())
                    .map_err(|e| format!("internal: record '{at}': {e}"))?,
            )
        }
        (Ty::Array(item), _) => {
            let list = match src.data_type() {
                DataType::List(_) => src.clone(),
                other => {
                    let as_list = DataType::List(Arc::new(Field::new(
                        "item",
                        match other {
                            DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
                                f.data_type().clone()
                            }
                            _ => return Err(format!("field '{at}': not a list")),
                        },
                        true,
                    )));
                    cast(src, &as_list).map_err(|e| format!("field '{at}': {e}"))?
                }
            };
            let l = list.as_list::<i32>();
            let item_owners = child_owners(owners, l.value_offsets(), l.values().len(), |i| {
                l.is_valid(i)
            });
            let values = conform(l.values(), item, &format!("{at}[]"), &item_owners, bad)?;
            let DataType::List(field) = &target else {
                unreachable!("an Avro array targets a list")
            };
            Arc::new(
                ListArray::try_new(
                    field.clone(),
                    l.offsets().clone(),
                    values,
                    l.nulls().cloned(),
                )
                .map_err(|e| format!("internal: array '{at}': {e}"))?,
            )
        }
        (Ty::Map(value), DataType::Map(..)) => {
            let m = src.as_map();
            let entry_owners = child_owners(owners, m.value_offsets(), m.entries().len(), |i| {
                m.is_valid(i)
            });
            let keys = cast(m.keys(), &DataType::Utf8).map_err(|e| format!("field '{at}': {e}"))?;
            let values = conform(m.values(), value, &format!("{at}{{}}"), &entry_owners, bad)?;
            let entries_field = map_entries(&value.ty);
            let DataType::Struct(kv) = entries_field.data_type() else {
                unreachable!("map entries are a struct")
            };
            let entries = StructArray::try_new(kv.clone(), vec![keys, values], None)
                .map_err(|e| format!("internal: map '{at}': {e}"))?;
            Arc::new(
                MapArray::try_new(
                    entries_field,
                    m.offsets().clone(),
                    entries,
                    m.nulls().cloned(),
                    false,
                )
                .map_err(|e| format!("internal: map '{at}': {e}"))?,
            )
        }
        (Ty::Enum(symbols), _) => {
            // `arrow-avro` writes an enum from a dictionary whose values are the symbols, in
            // order; a value that is no symbol refuses the row.
            let text = cast(src, &DataType::Utf8).map_err(|e| format!("field '{at}': {e}"))?;
            let t = text.as_string::<i32>();
            let keys: arrow::array::Int32Array = (0..t.len())
                .map(|i| {
                    if t.is_null(i) {
                        return None;
                    }
                    let found = symbols.iter().position(|s| s == t.value(i));
                    if found.is_none()
                        && let Some(row) = owners[i]
                    {
                        refuse(bad, row, || {
                            format!(
                                "field '{at}': the value is not one of the Avro enum's {} symbols",
                                symbols.len()
                            )
                        });
                    }
                    found.map(|k| k as i32)
                })
                .collect();
            let values: ArrayRef = Arc::new(arrow::array::StringArray::from(symbols.to_vec()));
            Arc::new(
                arrow::array::DictionaryArray::<Int32Type>::try_new(keys, values)
                    .map_err(|e| format!("internal: enum '{at}': {e}"))?,
            )
        }
        (Ty::Fixed(n), _) => {
            // A binary value of another length cannot be a `fixed`: refused per row.
            let bytes = cast(src, &DataType::Binary).map_err(|e| format!("field '{at}': {e}"))?;
            let b = bytes.as_binary::<i32>();
            let mut builder =
                arrow::array::FixedSizeBinaryBuilder::with_capacity(b.len(), *n as i32);
            for (i, owner) in owners.iter().enumerate().take(b.len()) {
                if b.is_valid(i) && b.value(i).len() == *n {
                    builder
                        .append_value(b.value(i))
                        .map_err(|e| e.to_string())?;
                } else {
                    if b.is_valid(i)
                        && let Some(row) = *owner
                    {
                        let len = b.value(i).len();
                        refuse(bad, row, || {
                            format!(
                                "field '{at}' is an Avro fixed of {n} bytes and the value has {len}"
                            )
                        });
                    }
                    builder.append_null();
                }
            }
            Arc::new(builder.finish())
        }
        _ => cast_with_options(src, &target, &safe()).map_err(|e| {
            format!(
                "field '{at}': {} cannot be converted to {}: {e}",
                src.data_type(),
                slot.ty
            )
        })?,
    };
    // Nulls: a non-null value that became null did not fit; a null where the field is not
    // nullable is refused.
    for (i, o) in owners.iter().enumerate() {
        let Some(row) = *o else { continue };
        if converted.is_null(i) {
            if src.is_valid(i) && !matches!(src.data_type(), DataType::Null) {
                refuse(bad, row, || {
                    format!(
                        "field '{at}': the value of type {} does not fit the Avro type {}",
                        src.data_type(),
                        slot.ty
                    )
                });
            } else if !slot.nullable {
                refuse(bad, row, || {
                    format!(
                        "field '{at}' is null and its Avro type {} is not a union with null",
                        slot.ty
                    )
                });
            }
        }
    }
    Ok(converted)
}

/// One value in Avro's JSON encoding.
fn avro_json(
    array: &dyn Array,
    i: usize,
    slot: &Slot,
    at: &str,
) -> std::result::Result<Json, String> {
    if array.is_null(i) {
        return Ok(Json::Null);
    }
    let value = match &slot.ty {
        Ty::Null => Json::Null,
        Ty::Boolean => Json::Bool(array.as_boolean().value(i)),
        Ty::Int => Json::from(array.as_primitive::<Int32Type>().value(i)),
        Ty::Date => Json::from(array.as_primitive::<Date32Type>().value(i)),
        Ty::TimeMillis => Json::from(
            array
                .as_primitive::<arrow::datatypes::Time32MillisecondType>()
                .value(i),
        ),
        Ty::TimeMicros => Json::from(
            array
                .as_primitive::<arrow::datatypes::Time64MicrosecondType>()
                .value(i),
        ),
        Ty::Long => Json::from(array.as_primitive::<Int64Type>().value(i)),
        Ty::Timestamp { .. } => {
            let t = cast(&array.slice(i, 1), &DataType::Int64).map_err(|e| e.to_string())?;
            Json::from(t.as_primitive::<Int64Type>().value(0))
        }
        Ty::Float => finite(f64::from(array.as_primitive::<Float32Type>().value(i)), at)?,
        Ty::Double => finite(array.as_primitive::<Float64Type>().value(i), at)?,
        Ty::Str => Json::String(array.as_string::<i32>().value(i).to_string()),
        Ty::Enum(_) => {
            let d = array.as_dictionary::<Int32Type>();
            let k = d.keys().value(i) as usize;
            Json::String(d.values().as_string::<i32>().value(k).to_string())
        }
        Ty::Bytes => latin1(array.as_binary::<i32>().value(i)),
        Ty::Fixed(_) => latin1(array.as_fixed_size_binary().value(i)),
        Ty::Decimal { fixed, .. } => {
            let be: Vec<u8> = match array.data_type() {
                DataType::Decimal128(..) => array
                    .as_primitive::<Decimal128Type>()
                    .value(i)
                    .to_be_bytes()
                    .to_vec(),
                _ => array
                    .as_primitive::<Decimal256Type>()
                    .value(i)
                    .to_be_bytes()
                    .to_vec(),
            };
            latin1(&twos_complement(&be, *fixed))
        }
        Ty::Record(fields) => {
            let s = array.as_struct();
            let mut object = JsonMap::with_capacity(fields.len());
            for (n, f) in fields.iter().enumerate() {
                object.insert(
                    f.name.clone(),
                    avro_json(
                        s.column(n).as_ref(),
                        i,
                        &f.slot,
                        &format!("{at}.{}", f.name),
                    )?,
                );
            }
            Json::Object(object)
        }
        Ty::Array(item) => {
            let l = array.as_list::<i32>();
            let values = l.value(i);
            (0..values.len())
                .map(|k| avro_json(values.as_ref(), k, item, &format!("{at}[]")))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map(Json::Array)?
        }
        Ty::Map(value) => {
            let m = array.as_map();
            let (start, end) = (
                m.value_offsets()[i] as usize,
                m.value_offsets()[i + 1] as usize,
            );
            let keys = m.keys().as_string::<i32>();
            let mut object = JsonMap::with_capacity(end - start);
            for e in start..end {
                object.insert(
                    keys.value(e).to_string(),
                    avro_json(m.values().as_ref(), e, value, &format!("{at}{{}}"))?,
                );
            }
            Json::Object(object)
        }
    };
    Ok(if slot.nullable && !matches!(slot.ty, Ty::Null) {
        let mut wrapped = JsonMap::with_capacity(1);
        wrapped.insert(slot.branch.clone(), value);
        Json::Object(wrapped)
    } else {
        value
    })
}

fn finite(v: f64, at: &str) -> std::result::Result<Json, String> {
    serde_json::Number::from_f64(v)
        .map(Json::Number)
        .ok_or_else(|| format!("field '{at}': NaN or an infinity cannot be written in Avro JSON"))
}

/// Bytes as Avro JSON writes them: one code point U+0000 to U+00FF per byte.
fn latin1(bytes: &[u8]) -> Json {
    Json::String(bytes.iter().map(|&b| char::from(b)).collect())
}

/// A big-endian two's complement integer at its shortest (`bytes`) or sign-extended to `size`
/// bytes (`fixed`).
fn twos_complement(be: &[u8], size: Option<usize>) -> Vec<u8> {
    let negative = be.first().is_some_and(|b| b & 0x80 != 0);
    let fill = if negative { 0xff } else { 0x00 };
    let mut start = 0;
    while start + 1 < be.len() && be[start] == fill && (be[start + 1] & 0x80 != 0) == negative {
        start += 1;
    }
    let short = &be[start..];
    match size {
        Some(n) if n > short.len() => {
            let mut out = vec![fill; n - short.len()];
            out.extend_from_slice(short);
            out
        }
        _ => short.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Decimal128Array, FixedSizeBinaryArray, Int64Array, StringArray};
    use arrow::buffer::NullBuffer;

    fn encoder(definition: &str, table: &Schema, encoding: SchemaEncoding) -> AvroRowEncoder {
        let columns: Vec<usize> = (0..table.fields().len()).collect();
        AvroRowEncoder::new(
            &PayloadSchema {
                kind: super::super::schema::SchemaType::Avro,
                definition: definition.into(),
                encoding,
                origin: "test".into(),
            },
            table,
            &columns,
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn reasons(out: &[RowPayload]) -> Vec<Option<&str>> {
        out.iter()
            .map(|r| r.as_ref().err().map(String::as_str))
            .collect()
    }

    #[test]
    fn rows_the_schema_refuses_are_named_by_field_and_the_others_are_encoded() {
        let definition = r#"{"type":"record","name":"R","fields":[
            {"name":"n","type":"int"},
            {"name":"d","type":{"type":"bytes","logicalType":"decimal","precision":4,"scale":2}},
            {"name":"f","type":{"type":"fixed","name":"F","size":2}},
            {"name":"e","type":{"type":"enum","name":"E","symbols":["A","B"]}},
            {"name":"s","type":{"type":"record","name":"S","fields":[{"name":"x","type":"string"}]}}]}"#;
        let s_fields = Fields::from(vec![Field::new("x", DataType::Utf8, true)]);
        let table = Schema::new(vec![
            Field::new("n", DataType::Int64, true),
            Field::new("d", DataType::Decimal128(10, 2), true),
            Field::new("f", DataType::FixedSizeBinary(2), true),
            Field::new("e", DataType::Utf8, true),
            Field::new("s", DataType::Struct(s_fields.clone()), true),
        ]);
        let enc = encoder(definition, &table, SchemaEncoding::Binary);
        // Row 0 fits; rows 1-5 each break one field.
        let batch = RecordBatch::try_new(
            Arc::new(table),
            vec![
                Arc::new(Int64Array::from(vec![1, 1 << 40, 1, 1, 1, 1])),
                Arc::new(
                    Decimal128Array::from(vec![1234, 1, 1_000_000, 1, 1, 1])
                        .with_precision_and_scale(10, 2)
                        .unwrap(),
                ),
                Arc::new(
                    FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                        [
                            Some(b"ab"),
                            Some(b"ab"),
                            Some(b"ab"),
                            None,
                            Some(b"ab"),
                            Some(b"ab"),
                        ]
                        .into_iter(),
                        2,
                    )
                    .unwrap(),
                ),
                Arc::new(StringArray::from(vec!["A", "B", "A", "A", "C", "A"])),
                Arc::new(StructArray::new(
                    s_fields,
                    vec![Arc::new(StringArray::from(vec![
                        Some("x"),
                        Some("x"),
                        Some("x"),
                        Some("x"),
                        Some("x"),
                        None,
                    ]))],
                    Some(NullBuffer::from(vec![true; 6])),
                )),
            ],
        )
        .unwrap();
        let out = enc.encode_batch(&batch).unwrap();
        let why = reasons(&out);
        assert_eq!(why[0], None);
        // n = 1, d = 12.34 (two's complement 0x04D2, length 2), f = "ab", e = A (index 0), s.x = "x".
        assert_eq!(
            out[0].as_ref().unwrap(),
            &vec![0x02, 0x04, 0x04, 0xD2, b'a', b'b', 0x00, 0x02, b'x']
        );
        assert!(why[1].unwrap().contains("field 'n'") && why[1].unwrap().contains("int"));
        assert!(why[2].unwrap().contains("field 'd'") && why[2].unwrap().contains("decimal"));
        assert!(why[3].unwrap().contains("field 'f'") && why[3].unwrap().contains("null"));
        assert!(why[4].unwrap().contains("field 'e'") && why[4].unwrap().contains("symbols"));
        assert!(why[5].unwrap().contains("field 's.x'") && why[5].unwrap().contains("null"));
    }

    #[test]
    fn avro_json_wraps_union_values_and_writes_bytes_as_code_points() {
        let definition = r#"{"type":"record","name":"R","fields":[
            {"name":"a","type":["null","long"]},
            {"name":"b","type":"bytes"},
            {"name":"c","type":{"type":"array","items":["null","string"]}}]}"#;
        let table = Schema::new(vec![
            Field::new("a", DataType::Int32, true),
            Field::new("b", DataType::Binary, true),
            Field::new(
                "c",
                DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
                true,
            ),
        ]);
        let enc = encoder(definition, &table, SchemaEncoding::Json);
        let mut list = arrow::array::ListBuilder::new(arrow::array::StringBuilder::new());
        list.values().append_value("x");
        list.values().append_null();
        list.append(true);
        list.append(true);
        let batch = RecordBatch::try_new(
            Arc::new(table),
            vec![
                Arc::new(arrow::array::Int32Array::from(vec![Some(5), None])),
                Arc::new(arrow::array::BinaryArray::from(vec![
                    &[0x00u8, 0xff][..],
                    &[][..],
                ])),
                Arc::new(list.finish()),
            ],
        )
        .unwrap();
        let out = enc.encode_batch(&batch).unwrap();
        let rows: Vec<Json> = out
            .iter()
            .map(|r| serde_json::from_slice(r.as_ref().unwrap()).unwrap())
            .collect();
        assert_eq!(
            rows[0],
            serde_json::json!({"a": {"long": 5}, "b": "\u{0}\u{ff}", "c": [{"string": "x"}, null]})
        );
        assert_eq!(rows[1], serde_json::json!({"a": null, "b": "", "c": []}));
    }

    #[test]
    fn twos_complement_is_shortest_or_sign_extended() {
        assert_eq!(
            twos_complement(&1234i128.to_be_bytes(), None),
            vec![0x04, 0xD2]
        );
        assert_eq!(twos_complement(&(-50i128).to_be_bytes(), None), vec![0xCE]);
        assert_eq!(
            twos_complement(&128i128.to_be_bytes(), None),
            vec![0x00, 0x80]
        );
        assert_eq!(twos_complement(&0i128.to_be_bytes(), None), vec![0x00]);
        assert_eq!(
            twos_complement(&(-1i128).to_be_bytes(), Some(4)),
            vec![0xff, 0xff, 0xff, 0xff]
        );
    }
}
