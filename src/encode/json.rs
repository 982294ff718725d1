//! The JSON row encoding: one JSON object per row, keyed by column name.
//!
//! Used for a Pub/Sub message body when the table has no `data` column, for Cloud Tasks bodies
//! built from the row, and (in text mode) for attribute values taken from non-string columns.
//!
//! # How each Arrow type is written
//!
//! | Arrow type | JSON |
//! |---|---|
//! | null (any type) | `null`; the key is kept (`{"a":null}`) |
//! | `Boolean` | `true` / `false` |
//! | `Int8`..`Int64`, `UInt8`..`UInt64` | number, exact (no rounding: 64-bit values stay exact in the text, whatever a reader does with them) |
//! | `Float16`/`32`/`64` | shortest number that reads back to the same float (`0.1`, `1e300`); NaN and ±infinity, which JSON cannot express, become `null` |
//! | `Decimal32`/`64`/`128`/`256` | **string** with the exact decimal text (`"123.45"`, `"-0.005"`; a negative scale writes the zeros: `"12300"`), so no reader rounds it through a double |
//! | `Utf8`, `LargeUtf8`, `Utf8View` | string; `"` `\` and control characters escaped, all other UTF-8 passed through |
//! | `Binary`, `LargeBinary`, `BinaryView`, `FixedSizeBinary` | string, standard base64 with padding (RFC 4648 §4) |
//! | `Date32`, `Date64` | `"YYYY-MM-DD"` (a `Date64` is cut to its day) |
//! | `Time32`, `Time64` | `"HH:MM:SS"` plus as many fraction digits as the unit has (ms: 3, µs: 6, ns: 9) |
//! | `Timestamp` without a time zone | RFC 3339 in UTC: `"2024-05-01T12:00:00.000000Z"` (the value is read as UTC) |
//! | `Timestamp` with a time zone | RFC 3339 local time of that zone with its offset: `"2024-05-01T14:00:00+02:00"`; an offset of zero is written `Z` |
//! | `Duration` | ISO 8601 duration in seconds: `"PT90S"`, `"PT1.500S"`, `"-PT0.000001S"` |
//! | `Interval(YearMonth)` | `"P{months}M"` |
//! | `Interval(DayTime)` | `"P{days}DT{seconds}S"` (seconds with 3 fraction digits) |
//! | `Interval(MonthDayNano)` | `"P{months}M{days}DT{seconds}S"` (seconds with 9 fraction digits) |
//! | `List`, `LargeList`, `ListView`, `LargeListView`, `FixedSizeList` | array |
//! | `Struct` | object keyed by field name |
//! | `Map` with string keys | object (entries in order; duplicate keys are written as they are) |
//! | `Map` with other keys | array of `[key, value]` pairs |
//! | `Dictionary` | the decoded value |
//!
//! Time fields carry the unit's full fraction width even when it is zero, so a consumer sees one
//! shape per column. Years outside 0000..=9999 are written with a sign (`"+10000-01-01"`,
//! `"-0001-01-01"`), as ISO 8601's expanded form does. Unions and run-end encoded arrays are not
//! supported: the encoder refuses them once, when it is built for a schema, naming the column.
//!
//! # Cost
//!
//! An encoder is checked once per schema ([`JsonRowEncoder::new`]) and bound once per batch
//! ([`JsonRowEncoder::bind`]): every array is downcast at bind time, so writing a row is a walk
//! over pre-resolved column encoders that appends to a caller-owned `Vec<u8>` — numbers through
//! `itoa`/`ryu`, dates by integer arithmetic — with no allocation besides growing that buffer.
//! (A `Decimal256` beyond the `i128` range is the one value formatted through an allocation.)
//!
//! ```
//! use std::sync::Arc;
//! use arrow::array::{Int64Array, RecordBatch, StringArray};
//! use arrow::datatypes::{DataType, Field, Schema};
//! use gcp_sql::encode::json::JsonRowEncoder;
//!
//! let schema = Arc::new(Schema::new(vec![
//!     Field::new("id", DataType::Int64, false),
//!     Field::new("name", DataType::Utf8, true),
//! ]));
//! let batch = RecordBatch::try_new(
//!     schema.clone(),
//!     vec![
//!         Arc::new(Int64Array::from(vec![1, 2])),
//!         Arc::new(StringArray::from(vec![Some("a \"b\""), None])),
//!     ],
//! )?;
//! let encoder = JsonRowEncoder::new(&schema, &[0, 1])?;
//! let mut rows = encoder.bind(&batch)?;
//! let mut out = Vec::new();
//! rows.write_row(0, &mut out);
//! assert_eq!(out, br#"{"id":1,"name":"a \"b\""}"#);
//! out.clear();
//! rows.write_row(1, &mut out);
//! assert_eq!(out, br#"{"id":2,"name":null}"#);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::str::FromStr;

use arrow::array::timezone::Tz;
use arrow::array::{Array, AsArray, BooleanArray, OffsetSizeTrait, RecordBatch};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{
    DataType, Date32Type, Date64Type, Decimal32Type, Decimal64Type, Decimal128Type, Decimal256Type,
    DurationMicrosecondType, DurationMillisecondType, DurationNanosecondType, DurationSecondType,
    Float16Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type,
    IntervalDayTimeType, IntervalMonthDayNanoType, IntervalUnit, IntervalYearMonthType, Schema,
    Time32MillisecondType, Time32SecondType, Time64MicrosecondType, Time64NanosecondType, TimeUnit,
    TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType, UInt8Type, UInt16Type, UInt32Type, UInt64Type, i256,
};
use base64::Engine as _;
use chrono::{Offset as _, TimeZone as _};

use crate::encode::raw::BytesColumn;
use crate::error::{Error, Result};

/// Checks, once per schema, that a value of `data_type` can be written as JSON. `column` names
/// the column in the error (nested fields are reported as `column.field`).
pub fn check_json_type(column: &str, data_type: &DataType) -> Result<()> {
    match data_type {
        DataType::Null
        | DataType::Boolean
        | DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64
        | DataType::Float16
        | DataType::Float32
        | DataType::Float64
        | DataType::Decimal32(..)
        | DataType::Decimal64(..)
        | DataType::Decimal128(..)
        | DataType::Decimal256(..)
        | DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Utf8View
        | DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_)
        | DataType::Date32
        | DataType::Date64
        | DataType::Time32(TimeUnit::Second | TimeUnit::Millisecond)
        | DataType::Time64(TimeUnit::Microsecond | TimeUnit::Nanosecond)
        | DataType::Duration(_)
        | DataType::Interval(_) => Ok(()),
        DataType::Timestamp(_, None) => Ok(()),
        DataType::Timestamp(_, Some(tz)) => Tz::from_str(tz)
            .map(|_| ())
            .map_err(|e| Error::schema(column, format!("time zone '{tz}' is not recognised: {e}"))),
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::ListView(f)
        | DataType::LargeListView(f)
        | DataType::FixedSizeList(f, _) => check_json_type(&format!("{column}[]"), f.data_type()),
        DataType::Struct(fields) => {
            for f in fields {
                check_json_type(&format!("{column}.{}", f.name()), f.data_type())?;
            }
            Ok(())
        }
        DataType::Map(entries, _) => match entries.data_type() {
            DataType::Struct(kv) if kv.len() == 2 => {
                check_json_type(&format!("{column}.{}", kv[0].name()), kv[0].data_type())?;
                check_json_type(&format!("{column}.{}", kv[1].name()), kv[1].data_type())
            }
            other => Err(Error::schema(
                column,
                format!("map entries of type {other} are not a key/value struct"),
            )),
        },
        DataType::Dictionary(key, value) if key.is_dictionary_key_type() => {
            check_json_type(column, value)
        }
        other => Err(Error::schema(
            column,
            format!("type {other} cannot be encoded as JSON"),
        )),
    }
}

/// Encodes the values of one column of a batch, as JSON or as plain text.
///
/// Built per batch with [`ColumnEncoder::new`], after [`check_json_type`] accepted the type.
pub struct ColumnEncoder<'a> {
    nulls: Option<NullBuffer>,
    all_null: bool,
    binary: bool,
    inner: Box<dyn ValueEncoder + 'a>,
}

impl std::fmt::Debug for ColumnEncoder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ColumnEncoder")
            .field("all_null", &self.all_null)
            .field("binary", &self.binary)
            .finish()
    }
}

impl<'a> ColumnEncoder<'a> {
    /// Downcasts `array` once and prepares its encoder. `column` names it in errors.
    pub fn new(column: &str, array: &'a dyn Array) -> Result<Self> {
        let all_null = matches!(array.data_type(), DataType::Null);
        // Logical nulls: a dictionary's null values count as nulls of the column.
        let nulls = if all_null {
            None
        } else {
            array.logical_nulls()
        };
        let binary = matches!(
            array.data_type(),
            DataType::Binary
                | DataType::LargeBinary
                | DataType::BinaryView
                | DataType::FixedSizeBinary(_)
        );
        Ok(ColumnEncoder {
            nulls,
            all_null,
            binary,
            inner: make_encoder(column, array)?,
        })
    }

    /// Whether `row` is null.
    #[inline]
    pub fn is_null(&self, row: usize) -> bool {
        self.all_null || self.nulls.as_ref().is_some_and(|n| n.is_null(row))
    }

    /// Appends the JSON of `row` (`null` when it is null).
    #[inline]
    pub fn write_json(&mut self, row: usize, out: &mut Vec<u8>) {
        if self.is_null(row) {
            out.extend_from_slice(b"null");
        } else {
            self.inner.json(row, out);
        }
    }

    /// Appends the plain text of `row` and returns `true`, or returns `false` when it is null.
    ///
    /// Text is the JSON value without its quotes and escapes: a string as it is, a number or
    /// boolean as written in JSON (a non-finite float as `NaN`, `Infinity`, `-Infinity`), a
    /// temporal or decimal value as its ISO/decimal text. A binary value is written as its raw
    /// bytes (see [`text_may_be_binary`](Self::text_may_be_binary)); lists, structs and maps are
    /// written as JSON.
    #[inline]
    pub fn write_text(&mut self, row: usize, out: &mut Vec<u8>) -> bool {
        if self.is_null(row) {
            return false;
        }
        self.inner.text(row, out);
        true
    }

    /// Whether [`write_text`](Self::write_text) may append bytes that are not UTF-8 (a binary
    /// column, whose text is its raw bytes): the caller checks them where text must be UTF-8.
    pub fn text_may_be_binary(&self) -> bool {
        self.binary
    }
}

/// The JSON object encoder for a chosen set of columns of one schema.
#[derive(Debug, Clone)]
pub struct JsonRowEncoder {
    /// Column index and the pre-rendered `"name":` prefix (with the leading comma for all but
    /// the first column).
    columns: Vec<(usize, Vec<u8>)>,
}

impl JsonRowEncoder {
    /// Checks, once per schema, that every column in `columns` (indices into `schema`) can be
    /// encoded. Fails with [`Error::Schema`] naming the first column (or nested field) that
    /// cannot.
    pub fn new(schema: &Schema, columns: &[usize]) -> Result<Self> {
        let mut prepared = Vec::with_capacity(columns.len());
        for (n, &index) in columns.iter().enumerate() {
            let field = schema.fields().get(index).ok_or_else(|| {
                Error::schema(format!("#{index}"), "no such column in the table schema")
            })?;
            check_json_type(field.name(), field.data_type())?;
            let mut prefix = Vec::with_capacity(field.name().len() + 4);
            if n > 0 {
                prefix.push(b',');
            }
            write_json_str(&mut prefix, field.name().as_bytes());
            prefix.push(b':');
            prepared.push((index, prefix));
        }
        Ok(JsonRowEncoder { columns: prepared })
    }

    /// The encoded columns' indices.
    pub fn columns(&self) -> impl Iterator<Item = usize> + '_ {
        self.columns.iter().map(|(i, _)| *i)
    }

    /// Downcasts the columns of `batch` (which must have the schema given to [`new`](Self::new)).
    pub fn bind<'a>(&'a self, batch: &'a RecordBatch) -> Result<JsonRows<'a>> {
        let schema = batch.schema_ref();
        let mut columns = Vec::with_capacity(self.columns.len());
        for (index, prefix) in &self.columns {
            let (Some(array), Some(field)) =
                (batch.columns().get(*index), schema.fields().get(*index))
            else {
                return Err(Error::schema(
                    format!("#{index}"),
                    "the batch has fewer columns than the table schema",
                ));
            };
            columns.push((
                prefix.as_slice(),
                ColumnEncoder::new(field.name(), array.as_ref())?,
            ));
        }
        Ok(JsonRows { columns })
    }
}

/// A [`JsonRowEncoder`] bound to one batch.
#[derive(Debug)]
pub struct JsonRows<'a> {
    columns: Vec<(&'a [u8], ColumnEncoder<'a>)>,
}

impl JsonRows<'_> {
    /// Appends the JSON object of `row` to `out`.
    #[inline]
    pub fn write_row(&mut self, row: usize, out: &mut Vec<u8>) {
        out.push(b'{');
        for (prefix, encoder) in &mut self.columns {
            out.extend_from_slice(prefix);
            encoder.write_json(row, out);
        }
        out.push(b'}');
    }
}

/// Appends `bytes` (UTF-8) as a JSON string literal: quotes, backslashes and control characters
/// are escaped; every other character is copied as it is.
pub fn write_json_str(out: &mut Vec<u8>, bytes: &[u8]) {
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape = ESCAPES[b as usize];
        if escape == 0 {
            continue;
        }
        out.extend_from_slice(&bytes[start..i]);
        if escape == b'u' {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[(b >> 4) as usize],
                HEX[(b & 0xf) as usize],
            ]);
        } else {
            out.extend_from_slice(&[b'\\', escape]);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// For each byte: 0 when it is copied as is, else the character after the backslash (`u` for
/// the `\u00XX` form).
const ESCAPES: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = b'u';
        b += 1;
    }
    table[0x08] = b'b';
    table[0x09] = b't';
    table[0x0a] = b'n';
    table[0x0c] = b'f';
    table[0x0d] = b'r';
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    table
};

// ---------------------------------------------------------------------------------------------
// Value encoders. Each is called only for non-null rows; nulls are handled by ColumnEncoder.

trait ValueEncoder {
    /// Appends the JSON of a non-null value.
    fn json(&mut self, row: usize, out: &mut Vec<u8>);
    /// Appends the plain text of a non-null value (see [`ColumnEncoder::write_text`]).
    fn text(&mut self, row: usize, out: &mut Vec<u8>) {
        self.json(row, out);
    }
}

fn downcast_error(column: &str, data_type: &DataType) -> Error {
    Error::schema(
        column,
        format!("internal: the array does not match its type {data_type}"),
    )
}

fn make_encoder<'a>(column: &str, array: &'a dyn Array) -> Result<Box<dyn ValueEncoder + 'a>> {
    let data_type = array.data_type();
    let bad = || downcast_error(column, data_type);
    macro_rules! prim {
        ($t:ty) => {
            array
                .as_primitive_opt::<$t>()
                .ok_or_else(bad)?
                .values()
                .as_ref()
        };
    }
    Ok(match data_type {
        DataType::Null => Box::new(NullEncoder),
        DataType::Boolean => Box::new(BoolEncoder(array.as_boolean_opt().ok_or_else(bad)?)),
        DataType::Int8 => Box::new(IntEncoder(prim!(Int8Type))),
        DataType::Int16 => Box::new(IntEncoder(prim!(Int16Type))),
        DataType::Int32 => Box::new(IntEncoder(prim!(Int32Type))),
        DataType::Int64 => Box::new(IntEncoder(prim!(Int64Type))),
        DataType::UInt8 => Box::new(IntEncoder(prim!(UInt8Type))),
        DataType::UInt16 => Box::new(IntEncoder(prim!(UInt16Type))),
        DataType::UInt32 => Box::new(IntEncoder(prim!(UInt32Type))),
        DataType::UInt64 => Box::new(IntEncoder(prim!(UInt64Type))),
        DataType::Float16 => Box::new(HalfEncoder(
            array.as_primitive_opt::<Float16Type>().ok_or_else(bad)?,
        )),
        DataType::Float32 => Box::new(FloatEncoder(prim!(Float32Type))),
        DataType::Float64 => Box::new(FloatEncoder(prim!(Float64Type))),
        DataType::Decimal32(_, scale) => Box::new(DecimalEncoder {
            values: prim!(Decimal32Type),
            scale: *scale,
        }),
        DataType::Decimal64(_, scale) => Box::new(DecimalEncoder {
            values: prim!(Decimal64Type),
            scale: *scale,
        }),
        DataType::Decimal128(_, scale) => Box::new(DecimalEncoder {
            values: prim!(Decimal128Type),
            scale: *scale,
        }),
        DataType::Decimal256(_, scale) => Box::new(DecimalEncoder {
            values: prim!(Decimal256Type),
            scale: *scale,
        }),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            Box::new(StringEncoder(BytesColumn::new(column, array)?))
        }
        DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_) => Box::new(Base64Encoder(BytesColumn::new(column, array)?)),
        DataType::Date32 => Box::new(DateEncoder {
            values: prim!(Date32Type),
            per_day: 1,
        }),
        DataType::Date64 => Box::new(DateEncoder {
            values: prim!(Date64Type),
            per_day: MILLIS_PER_DAY,
        }),
        DataType::Time32(TimeUnit::Second) => Box::new(TimeEncoder {
            values: prim!(Time32SecondType),
            unit: Unit::S,
        }),
        DataType::Time32(TimeUnit::Millisecond) => Box::new(TimeEncoder {
            values: prim!(Time32MillisecondType),
            unit: Unit::MS,
        }),
        DataType::Time64(TimeUnit::Microsecond) => Box::new(TimeEncoder {
            values: prim!(Time64MicrosecondType),
            unit: Unit::US,
        }),
        DataType::Time64(TimeUnit::Nanosecond) => Box::new(TimeEncoder {
            values: prim!(Time64NanosecondType),
            unit: Unit::NS,
        }),
        DataType::Timestamp(unit, tz) => {
            let zone = match tz {
                None => Zone::Utc,
                Some(tz) => {
                    let parsed = Tz::from_str(tz).map_err(|e| {
                        Error::schema(column, format!("time zone '{tz}' is not recognised: {e}"))
                    })?;
                    Zone::Named(parsed)
                }
            };
            let (values, unit) = match unit {
                TimeUnit::Second => (prim!(TimestampSecondType), Unit::S),
                TimeUnit::Millisecond => (prim!(TimestampMillisecondType), Unit::MS),
                TimeUnit::Microsecond => (prim!(TimestampMicrosecondType), Unit::US),
                TimeUnit::Nanosecond => (prim!(TimestampNanosecondType), Unit::NS),
            };
            Box::new(TimestampEncoder { values, unit, zone })
        }
        DataType::Duration(unit) => {
            let (values, unit) = match unit {
                TimeUnit::Second => (prim!(DurationSecondType), Unit::S),
                TimeUnit::Millisecond => (prim!(DurationMillisecondType), Unit::MS),
                TimeUnit::Microsecond => (prim!(DurationMicrosecondType), Unit::US),
                TimeUnit::Nanosecond => (prim!(DurationNanosecondType), Unit::NS),
            };
            Box::new(DurationEncoder { values, unit })
        }
        DataType::Interval(IntervalUnit::YearMonth) => {
            Box::new(YearMonthEncoder(prim!(IntervalYearMonthType)))
        }
        DataType::Interval(IntervalUnit::DayTime) => {
            Box::new(DayTimeEncoder(prim!(IntervalDayTimeType)))
        }
        DataType::Interval(IntervalUnit::MonthDayNano) => {
            Box::new(MonthDayNanoEncoder(prim!(IntervalMonthDayNanoType)))
        }
        DataType::List(_) => list_encoder::<i32>(column, array)?,
        DataType::LargeList(_) => list_encoder::<i64>(column, array)?,
        DataType::ListView(_) => list_view_encoder::<i32>(column, array)?,
        DataType::LargeListView(_) => list_view_encoder::<i64>(column, array)?,
        DataType::FixedSizeList(_, size) => {
            let list = array.as_fixed_size_list_opt().ok_or_else(bad)?;
            let size = usize::try_from(*size).map_err(|_| bad())?;
            let child = ColumnEncoder::new(&format!("{column}[]"), list.values().as_ref())?;
            // Slicing a FixedSizeList slices its values too, so row i starts at i * size.
            Box::new(FixedSizeListEncoder { size, child })
        }
        DataType::Struct(fields) => {
            let strukt = array.as_struct_opt().ok_or_else(bad)?;
            let mut children = Vec::with_capacity(fields.len());
            for (n, (field, child)) in fields.iter().zip(strukt.columns()).enumerate() {
                let mut prefix = Vec::with_capacity(field.name().len() + 4);
                if n > 0 {
                    prefix.push(b',');
                }
                write_json_str(&mut prefix, field.name().as_bytes());
                prefix.push(b':');
                children.push((
                    prefix,
                    ColumnEncoder::new(&format!("{column}.{}", field.name()), child.as_ref())?,
                ));
            }
            Box::new(StructEncoder { children })
        }
        DataType::Map(..) => {
            let map = array.as_map_opt().ok_or_else(bad)?;
            let (key_field, _) = map.entries_fields();
            let string_keys = matches!(
                key_field.data_type(),
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
            );
            let keys = ColumnEncoder::new(
                &format!("{column}.{}", key_field.name()),
                map.keys().as_ref(),
            )?;
            let values = ColumnEncoder::new(&format!("{column}.value"), map.values().as_ref())?;
            Box::new(MapEncoder {
                offsets: map.value_offsets(),
                keys,
                values,
                string_keys,
            })
        }
        DataType::Dictionary(..) => {
            let dict = array.as_any_dictionary_opt().ok_or_else(bad)?;
            let values = ColumnEncoder::new(column, dict.values().as_ref())?;
            Box::new(DictionaryEncoder {
                keys: dict.normalized_keys(),
                values,
            })
        }
        other => {
            return Err(Error::schema(
                column,
                format!("type {other} cannot be encoded as JSON"),
            ));
        }
    })
}

struct NullEncoder;
impl ValueEncoder for NullEncoder {
    fn json(&mut self, _: usize, out: &mut Vec<u8>) {
        out.extend_from_slice(b"null");
    }
}

struct BoolEncoder<'a>(&'a BooleanArray);
impl ValueEncoder for BoolEncoder<'_> {
    fn json(&mut self, row: usize, out: &mut Vec<u8>) {
        out.extend_from_slice(if self.0.value(row) { b"true" } else { b"false" });
    }
}

struct IntEncoder<'a, T>(&'a [T]);
impl<T: itoa::Integer + Copy> ValueEncoder for IntEncoder<'_, T> {
    fn json(&mut self, row: usize, out: &mut Vec<u8>) {
        out.extend_from_slice(itoa::Buffer::new().format(self.0[row]).as_bytes());
    }
}

/// A float type written through `ryu`.
trait JsonFloat: Copy {
    /// Appends the JSON number, or `null` for NaN and infinities.
    fn write_json(self, out: &mut Vec<u8>);
    /// Appends the text (`NaN`, `Infinity`, `-Infinity` for the non-finite values).
    fn write_text(self, out: &mut Vec<u8>);
}

macro_rules! json_float {
    ($t:ty, $widen:expr) => {
        impl JsonFloat for $t {
            fn write_json(self, out: &mut Vec<u8>) {
                let v = $widen(self);
                if v.is_finite() {
                    out.extend_from_slice(ryu::Buffer::new().format_finite(v).as_bytes());
                } else {
                    out.extend_from_slice(b"null");
                }
            }
            fn write_text(self, out: &mut Vec<u8>) {
                let v = $widen(self);
                if v.is_finite() {
                    out.extend_from_slice(ryu::Buffer::new().format_finite(v).as_bytes());
                } else if v.is_nan() {
                    out.extend_from_slice(b"NaN");
                } else if v > 0.0 {
                    out.extend_from_slice(b"Infinity");
                } else {
                    out.extend_from_slice(b"-Infinity");
                }
            }
        }
    };
}
json_float!(f32, |v: f32| v);
json_float!(f64, |v: f64| v);

struct FloatEncoder<'a, T>(&'a [T]);
impl<T: JsonFloat> ValueEncoder for FloatEncoder<'_, T> {
    fn json(&mut self, row: usize, out: &mut Vec<u8>) {
        self.0[row].write_json(out);
    }
    fn text(&mut self, row: usize, out: &mut Vec<u8>) {
        self.0[row].write_text(out);
    }
}

/// `Float16`, widened to `f32` (exactly) before it is written.
struct HalfEncoder<'a>(&'a arrow::array::PrimitiveArray<Float16Type>);
impl ValueEncoder for HalfEncoder<'_> {
    fn json(&mut self, row: usize, out: &mut Vec<u8>) {
        self.0.value(row).to_f32().write_json(out);
    }
    fn text(&mut self, row: usize, out: &mut Vec<u8>) {
        self.0.value(row).to_f32().write_text(out);
    }
}

/// A decimal's unscaled integer.
trait Unscaled: Copy {
    /// Appends the absolute value's digits and returns whether the value is negative.
    fn write_abs_digits(self, digits: &mut Vec<u8>) -> bool;
}

macro_rules! unscaled_via_i128 {
    ($($t:ty),*) => {$(
        impl Unscaled for $t {
            fn write_abs_digits(self, digits: &mut Vec<u8>) -> bool {
                let v = i128::from(self);
                digits.extend_from_slice(itoa::Buffer::new().format(v.unsigned_abs()).as_bytes());
                v < 0
            }
        }
    )*};
}
unscaled_via_i128!(i32, i64, i128);

impl Unscaled for i256 {
    fn write_abs_digits(self, digits: &mut Vec<u8>) -> bool {
        let (low, high) = self.to_parts();
        let fits_i128 =
            (high == 0 && low <= i128::MAX as u128) || (high == -1 && low > i128::MAX as u128);
        if fits_i128 {
            return (low as i128).write_abs_digits(digits);
        }
        // Beyond 38 digits: rare enough to go through arrow's (allocating) formatter.
        let text = self.to_string();
        let negative = text.starts_with('-');
        digits.extend_from_slice(text.trim_start_matches('-').as_bytes());
        negative
    }
}

struct DecimalEncoder<'a, T> {
    values: &'a [T],
    scale: i8,
}
impl<T: Unscaled> ValueEncoder for DecimalEncoder<'_, T> {
    fn json(&mut self, row: usize, out: &mut Vec<u8>) {
        out.push(b'"');
        self.text(row, out);
        out.push(b'"');
    }
    fn text(&mut self, row: usize, out: &mut Vec<u8>) {
        write_decimal(out, self.values[row], self.scale);
    }
}

fn write_decimal<T: Unscaled>(out: &mut Vec<u8>, value: T, scale: i8) {
    // Digits go straight into `out` after the sign position, then get the point inserted.
    let sign_at = out.len();
    let negative = value.write_abs_digits(out);
    if negative {
        out.insert(sign_at, b'-');
    }
    let digits_start = sign_at + usize::from(negative);
    if scale <= 0 {
        if out[digits_start..] != *b"0" {
            out.resize(out.len() + usize::from(scale.unsigned_abs()), b'0');
        }
        return;
    }
    let scale = usize::from(scale.unsigned_abs());
    let digits = out.len() - digits_start;
    if digits <= scale {
        // 0.00ddd: pad with zeros up to the scale, then "0." in front.
        let zeros = scale - digits;
        out.splice(
            digits_start..digits_start,
            std::iter::repeat_n(b'0', zeros + 1),
        );
        out.insert(digits_start + 1, b'.');
    } else {
        out.insert(out.len() - scale, b'.');
    }
}

struct StringEncoder<'a>(BytesColumn<'a>);
impl ValueEncoder for StringEncoder<'_> {
    fn json(&mut self, row: usize, out: &mut Vec<u8>) {
        write_json_str(out, self.0.value(row).unwrap_or_default());
    }
    fn text(&mut self, row: usize, out: &mut Vec<u8>) {
        out.extend_from_slice(self.0.value(row).unwrap_or_default());
    }
}

struct Base64Encoder<'a>(BytesColumn<'a>);
impl ValueEncoder for Base64Encoder<'_> {
    fn json(&mut self, row: usize, out: &mut Vec<u8>) {
        let bytes = self.0.value(row).unwrap_or_default();
        out.push(b'"');
        let start = out.len();
        let encoded_len = bytes.len().div_ceil(3) * 4;
        out.resize(start + encoded_len, 0);
        // The buffer is sized for padded base64 of `bytes`, so the encoder cannot run short.
        let written = base64::engine::general_purpose::STANDARD
            .encode_slice(bytes, &mut out[start..])
            .unwrap_or(0);
        out.truncate(start + written);
        out.push(b'"');
    }
    fn text(&mut self, row: usize, out: &mut Vec<u8>) {
        out.extend_from_slice(self.0.value(row).unwrap_or_default());
    }
}

// --- temporal ---------------------------------------------------------------------------------

const SECONDS_PER_DAY: i64 = 86_400;
const MILLIS_PER_DAY: i64 = 86_400_000;

/// A time unit: ticks per second and the fraction digits written for it.
#[derive(Clone, Copy)]
struct Unit {
    per_second: i64,
    digits: usize,
}
impl Unit {
    const S: Unit = Unit {
        per_second: 1,
        digits: 0,
    };
    const MS: Unit = Unit {
        per_second: 1_000,
        digits: 3,
    };
    const US: Unit = Unit {
        per_second: 1_000_000,
        digits: 6,
    };
    const NS: Unit = Unit {
        per_second: 1_000_000_000,
        digits: 9,
    };
}

/// Converts days since 1970-01-01 to a proleptic Gregorian (year, month, day), using the
/// era-based day-count algorithm (400-year eras of 146,097 days).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March-based
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Appends `value` zero-padded to `width` digits.
#[inline]
fn write_padded(out: &mut Vec<u8>, value: u64, width: usize) {
    let mut buffer = itoa::Buffer::new();
    let text = buffer.format(value);
    out.resize(out.len() + width.saturating_sub(text.len()), b'0');
    out.extend_from_slice(text.as_bytes());
}

fn write_date(out: &mut Vec<u8>, days: i64) {
    let (year, month, day) = civil_from_days(days);
    if (0..=9999).contains(&year) {
        write_padded(out, year as u64, 4);
    } else {
        out.push(if year < 0 { b'-' } else { b'+' });
        write_padded(out, year.unsigned_abs(), 4);
    }
    out.push(b'-');
    write_padded(out, u64::from(month), 2);
    out.push(b'-');
    write_padded(out, u64::from(day), 2);
}

/// Appends `HH:MM:SS` for a second of the day.
fn write_clock(out: &mut Vec<u8>, second_of_day: u64) {
    write_padded(out, second_of_day / 3_600, 2);
    out.push(b':');
    write_padded(out, second_of_day / 60 % 60, 2);
    out.push(b':');
    write_padded(out, second_of_day % 60, 2);
}

fn write_fraction(out: &mut Vec<u8>, ticks: u64, unit: Unit) {
    if unit.digits > 0 {
        out.push(b'.');
        write_padded(out, ticks, unit.digits);
    }
}

/// Appends a signed number of seconds given in `unit` ticks: `-1.500`.
fn write_seconds(out: &mut Vec<u8>, ticks: i64, unit: Unit) {
    if ticks < 0 {
        out.push(b'-');
    }
    let abs = ticks.unsigned_abs();
    let per = unit.per_second as u64;
    out.extend_from_slice(itoa::Buffer::new().format(abs / per).as_bytes());
    write_fraction(out, abs % per, unit);
}

struct DateEncoder<'a, T> {
    values: &'a [T],
    per_day: i64,
}
impl<T: Copy + Into<i64>> ValueEncoder for DateEncoder<'_, T> {
    fn json(&mut self, row: usize, out: &mut Vec<u8>) {
        out.push(b'"');
        self.text(row, out);
        out.push(b'"');
    }
    fn text(&mut self, row: usize, out: &mut Vec<u8>) {
        write_date(out, self.values[row].into().div_euclid(self.per_day));
    }
}

struct TimeEncoder<'a, T> {
    values: &'a [T],
    unit: Unit,
}
impl<T: Copy + Into<i64>> ValueEncoder for TimeEncoder<'_, T> {
    fn json(&mut self, row: usize, out: &mut Vec<u8>) {
        out.push(b'"');
        self.text(row, out);
        out.push(b'"');
    }
    fn text(&mut self, row: usize, out: &mut Vec<u8>) {
        let ticks: i64 = self.values[row].into();
        if ticks < 0 {
            // Out of a time-of-day's range; written signed rather than wrapped.
            out.push(b'-');
        }
        let abs = ticks.unsigned_abs();
        let per = self.unit.per_second as u64;
        write_clock(out, abs / per);
        write_fraction(out, abs % per, self.unit);
    }
}

enum Zone {
    Utc,
    Named(Tz),
}

struct TimestampEncoder<'a> {
    values: &'a [i64],
    unit: Unit,
    zone: Zone,
}
impl ValueEncoder for TimestampEncoder<'_> {
    fn json(&mut self, row: usize, out: &mut Vec<u8>) {
        out.push(b'"');
        self.text(row, out);
        out.push(b'"');
    }
    fn text(&mut self, row: usize, out: &mut Vec<u8>) {
        let ticks = self.values[row];
        let seconds = ticks.div_euclid(self.unit.per_second);
        let fraction = ticks.rem_euclid(self.unit.per_second) as u64;
        let offset = match &self.zone {
            Zone::Utc => 0,
            Zone::Named(tz) => chrono::DateTime::from_timestamp(seconds, 0)
                .map(|utc| {
                    i64::from(
                        tz.offset_from_utc_datetime(&utc.naive_utc())
                            .fix()
                            .local_minus_utc(),
                    )
                })
                .unwrap_or(0),
        };
        let local = seconds + offset;
        write_date(out, local.div_euclid(SECONDS_PER_DAY));
        out.push(b'T');
        write_clock(out, local.rem_euclid(SECONDS_PER_DAY) as u64);
        write_fraction(out, fraction, self.unit);
        if offset == 0 {
            out.push(b'Z');
        } else {
            out.push(if offset < 0 { b'-' } else { b'+' });
            let minutes = offset.unsigned_abs() / 60;
            write_padded(out, minutes / 60, 2);
            out.push(b':');
            write_padded(out, minutes % 60, 2);
        }
    }
}

struct DurationEncoder<'a> {
    values: &'a [i64],
    unit: Unit,
}
impl ValueEncoder for DurationEncoder<'_> {
    fn json(&mut self, row: usize, out: &mut Vec<u8>) {
        out.push(b'"');
        self.text(row, out);
        out.push(b'"');
    }
    fn text(&mut self, row: usize, out: &mut Vec<u8>) {
        let ticks = self.values[row];
        if ticks < 0 {
            out.push(b'-');
        }
        out.extend_from_slice(b"PT");
        let abs = ticks.unsigned_abs();
        let per = self.unit.per_second as u64;
        out.extend_from_slice(itoa::Buffer::new().format(abs / per).as_bytes());
        write_fraction(out, abs % per, self.unit);
        out.push(b'S');
    }
}

struct YearMonthEncoder<'a>(&'a [i32]);
impl ValueEncoder for YearMonthEncoder<'_> {
    fn json(&mut self, row: usize, out: &mut Vec<u8>) {
        out.push(b'"');
        self.text(row, out);
        out.push(b'"');
    }
    fn text(&mut self, row: usize, out: &mut Vec<u8>) {
        out.push(b'P');
        out.extend_from_slice(itoa::Buffer::new().format(self.0[row]).as_bytes());
        out.push(b'M');
    }
}

struct DayTimeEncoder<'a>(&'a [arrow::datatypes::IntervalDayTime]);
impl ValueEncoder for DayTimeEncoder<'_> {
    fn json(&mut self, row: usize, out: &mut Vec<u8>) {
        out.push(b'"');
        self.text(row, out);
        out.push(b'"');
    }
    fn text(&mut self, row: usize, out: &mut Vec<u8>) {
        let v = self.0[row];
        out.push(b'P');
        out.extend_from_slice(itoa::Buffer::new().format(v.days).as_bytes());
        out.extend_from_slice(b"DT");
        write_seconds(out, i64::from(v.milliseconds), Unit::MS);
        out.push(b'S');
    }
}

struct MonthDayNanoEncoder<'a>(&'a [arrow::datatypes::IntervalMonthDayNano]);
impl ValueEncoder for MonthDayNanoEncoder<'_> {
    fn json(&mut self, row: usize, out: &mut Vec<u8>) {
        out.push(b'"');
        self.text(row, out);
        out.push(b'"');
    }
    fn text(&mut self, row: usize, out: &mut Vec<u8>) {
        let v = self.0[row];
        out.push(b'P');
        out.extend_from_slice(itoa::Buffer::new().format(v.months).as_bytes());
        out.push(b'M');
        out.extend_from_slice(itoa::Buffer::new().format(v.days).as_bytes());
        out.extend_from_slice(b"DT");
        write_seconds(out, v.nanoseconds, Unit::NS);
        out.push(b'S');
    }
}

// --- nested -----------------------------------------------------------------------------------

fn write_items(child: &mut ColumnEncoder<'_>, range: std::ops::Range<usize>, out: &mut Vec<u8>) {
    out.push(b'[');
    for (n, item) in range.enumerate() {
        if n > 0 {
            out.push(b',');
        }
        child.write_json(item, out);
    }
    out.push(b']');
}

struct ListEncoder<'a, O> {
    offsets: &'a [O],
    child: ColumnEncoder<'a>,
}
impl<O: OffsetSizeTrait> ValueEncoder for ListEncoder<'_, O> {
    fn json(&mut self, row: usize, out: &mut Vec<u8>) {
        let (start, end) = (
            self.offsets[row].as_usize(),
            self.offsets[row + 1].as_usize(),
        );
        write_items(&mut self.child, start..end, out);
    }
}

fn list_encoder<'a, O: OffsetSizeTrait>(
    column: &str,
    array: &'a dyn Array,
) -> Result<Box<dyn ValueEncoder + 'a>> {
    let list = array
        .as_list_opt::<O>()
        .ok_or_else(|| downcast_error(column, array.data_type()))?;
    let child = ColumnEncoder::new(&format!("{column}[]"), list.values().as_ref())?;
    Ok(Box::new(ListEncoder {
        offsets: list.value_offsets(),
        child,
    }))
}

struct ListViewEncoder<'a, O> {
    offsets: &'a [O],
    sizes: &'a [O],
    child: ColumnEncoder<'a>,
}
impl<O: OffsetSizeTrait> ValueEncoder for ListViewEncoder<'_, O> {
    fn json(&mut self, row: usize, out: &mut Vec<u8>) {
        let start = self.offsets[row].as_usize();
        write_items(
            &mut self.child,
            start..start + self.sizes[row].as_usize(),
            out,
        );
    }
}

fn list_view_encoder<'a, O: OffsetSizeTrait>(
    column: &str,
    array: &'a dyn Array,
) -> Result<Box<dyn ValueEncoder + 'a>> {
    let list = array
        .as_list_view_opt::<O>()
        .ok_or_else(|| downcast_error(column, array.data_type()))?;
    let child = ColumnEncoder::new(&format!("{column}[]"), list.values().as_ref())?;
    Ok(Box::new(ListViewEncoder {
        offsets: list.value_offsets(),
        sizes: list.value_sizes(),
        child,
    }))
}

struct FixedSizeListEncoder<'a> {
    size: usize,
    child: ColumnEncoder<'a>,
}
impl ValueEncoder for FixedSizeListEncoder<'_> {
    fn json(&mut self, row: usize, out: &mut Vec<u8>) {
        let start = row * self.size;
        write_items(&mut self.child, start..start + self.size, out);
    }
}

struct StructEncoder<'a> {
    children: Vec<(Vec<u8>, ColumnEncoder<'a>)>,
}
impl ValueEncoder for StructEncoder<'_> {
    fn json(&mut self, row: usize, out: &mut Vec<u8>) {
        out.push(b'{');
        for (prefix, child) in &mut self.children {
            out.extend_from_slice(prefix);
            child.write_json(row, out);
        }
        out.push(b'}');
    }
}

struct MapEncoder<'a> {
    offsets: &'a [i32],
    keys: ColumnEncoder<'a>,
    values: ColumnEncoder<'a>,
    string_keys: bool,
}
impl ValueEncoder for MapEncoder<'_> {
    fn json(&mut self, row: usize, out: &mut Vec<u8>) {
        let (start, end) = (self.offsets[row] as usize, self.offsets[row + 1] as usize);
        out.push(if self.string_keys { b'{' } else { b'[' });
        for (n, entry) in (start..end).enumerate() {
            if n > 0 {
                out.push(b',');
            }
            if self.string_keys {
                self.keys.write_json(entry, out);
                out.push(b':');
                self.values.write_json(entry, out);
            } else {
                out.push(b'[');
                self.keys.write_json(entry, out);
                out.push(b',');
                self.values.write_json(entry, out);
                out.push(b']');
            }
        }
        out.push(if self.string_keys { b'}' } else { b']' });
    }
}

struct DictionaryEncoder<'a> {
    keys: Vec<usize>,
    values: ColumnEncoder<'a>,
}
impl ValueEncoder for DictionaryEncoder<'_> {
    fn json(&mut self, row: usize, out: &mut Vec<u8>) {
        self.values.write_json(self.keys[row], out);
    }
    fn text(&mut self, row: usize, out: &mut Vec<u8>) {
        self.values.write_text(self.keys[row], out);
    }
}

pub mod decode;

#[cfg(test)]
mod tests;
