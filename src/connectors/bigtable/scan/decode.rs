//! Cells back to Arrow values: the inverse of the sink's encodings (see
//! [`mapping`](super::super::mapping)), one column at a time (pure: no I/O).
//!
//! The cells of a batch's rows are first gathered as raw bytes per column
//! ([`RawColumn`]); [`decode_cells`] then turns a whole column into the table's type at once.
//! A cell that is not what the sink writes for the type (an integer of other than 8 bytes,
//! text that is not UTF-8) fails the scan with an error naming the column; no error shows a
//! value or a row key.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float64Array, Int32Array, Int64Array,
    IntervalDayTimeArray, IntervalMonthDayNanoArray, IntervalYearMonthArray, LargeBinaryArray,
    LargeBinaryBuilder, NullArray, StringArray, UInt64Array, make_array,
};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::compute::{CastOptions, cast_with_options};
use datafusion::arrow::datatypes::{
    DataType, Field, IntervalDayTime, IntervalMonthDayNano, IntervalUnit, Schema,
};
use datafusion::arrow::util::display::FormatOptions;

use crate::error::{Error, Result};

/// One column's cells of a batch, as the bytes Bigtable returned (null: no cell).
pub type RawColumn = LargeBinaryBuilder;

fn bad(column: &str, what: impl std::fmt::Display) -> Error {
    Error::schema(column, format!("a cell read back is not {what}"))
}

const CHECKED: CastOptions<'static> = CastOptions {
    safe: false,
    format_options: FormatOptions::new(),
};

fn cast_checked(array: &ArrayRef, to: &DataType, column: &str) -> Result<ArrayRef> {
    if array.data_type() == to {
        return Ok(array.clone());
    }
    cast_with_options(array, to, &CHECKED)
        .map_err(|e| Error::schema(column, format!("a cell read back does not fit {to}: {e}")))
}

/// The 8-byte big-endian words of `raw`.
fn words(raw: &LargeBinaryArray, column: &str) -> Result<Vec<Option<[u8; 8]>>> {
    raw.iter()
        .map(|v| match v {
            None => Ok(None),
            Some(b) => <[u8; 8]>::try_from(b)
                .map(Some)
                .map_err(|_| bad(column, format_args!("8 bytes (it has {})", b.len()))),
        })
        .collect()
}

fn int64(raw: &LargeBinaryArray, column: &str) -> Result<Int64Array> {
    Ok(words(raw, column)?
        .into_iter()
        .map(|w| w.map(i64::from_be_bytes))
        .collect())
}

/// `values` given `to`'s type without conversion (the same native width).
fn reinterpret(values: ArrayRef, to: &DataType) -> Result<ArrayRef> {
    let data = values
        .into_data()
        .into_builder()
        .data_type(to.clone())
        .build()?;
    Ok(make_array(data))
}

fn text(raw: &LargeBinaryArray, column: &str) -> Result<StringArray> {
    raw.iter()
        .map(|v| match v {
            None => Ok(None),
            Some(b) => std::str::from_utf8(b)
                .map(Some)
                .map_err(|_| bad(column, "UTF-8 text")),
        })
        .collect()
}

/// Seconds text as the JSON encoder writes it (`-1.500`) in units of `per_second`.
fn seconds(text: &str, per_second: i64) -> Option<i64> {
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let whole: i64 = whole.parse().ok()?;
    let digits = per_second.ilog10() as usize;
    if fraction.len() > digits || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut frac: i64 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().ok()?
    };
    for _ in fraction.len()..digits {
        frac *= 10;
    }
    let total = whole.checked_mul(per_second)?.checked_add(frac)?;
    Some(if negative { -total } else { total })
}

/// An ISO 8601 interval as the sink writes it: `P{m}M`, `P{d}DT{s}S`, `P{m}M{d}DT{s}S`.
fn interval(raw: &LargeBinaryArray, unit: IntervalUnit, column: &str) -> Result<ArrayRef> {
    let texts = text(raw, column)?;
    let bad_text = || bad(column, "an interval as the sink writes it (P1M2DT3S)");
    fn parse(t: &str) -> Option<(i32, i32, &str)> {
        let t = t.strip_prefix('P')?;
        let (months, rest) = match t.split_once('M') {
            Some((m, rest)) if !m.contains('D') => (m.parse().ok()?, rest),
            _ => (0, t),
        };
        if rest.is_empty() {
            return Some((months, 0, ""));
        }
        let (days, rest) = rest.split_once("DT")?;
        Some((months, days.parse().ok()?, rest.strip_suffix('S')?))
    }
    Ok(match unit {
        IntervalUnit::YearMonth => Arc::new(
            texts
                .iter()
                .map(|t| {
                    t.map(|t| parse(t).map(|(m, _, _)| m).ok_or_else(bad_text))
                        .transpose()
                })
                .collect::<Result<IntervalYearMonthArray>>()?,
        ),
        IntervalUnit::DayTime => Arc::new(
            texts
                .iter()
                .map(|t| {
                    t.map(|t| {
                        let (_, days, s) = parse(t).ok_or_else(bad_text)?;
                        let ms = seconds(s, 1_000)
                            .and_then(|v| i32::try_from(v).ok())
                            .ok_or_else(bad_text)?;
                        Ok(IntervalDayTime::new(days, ms))
                    })
                    .transpose()
                })
                .collect::<Result<IntervalDayTimeArray>>()?,
        ),
        IntervalUnit::MonthDayNano => Arc::new(
            texts
                .iter()
                .map(|t| {
                    t.map(|t| {
                        let (months, days, s) = parse(t).ok_or_else(bad_text)?;
                        let ns = seconds(s, 1_000_000_000).ok_or_else(bad_text)?;
                        Ok(IntervalMonthDayNano::new(months, days, ns))
                    })
                    .transpose()
                })
                .collect::<Result<IntervalMonthDayNanoArray>>()?,
        ),
    })
}

/// JSON text (lists, maps, structs nested in a struct column) through Arrow's JSON decoder.
fn json(raw: &LargeBinaryArray, to: &DataType, column: &str) -> Result<ArrayRef> {
    use datafusion::arrow::json::ReaderBuilder;
    let schema = Arc::new(Schema::new(vec![Field::new("v", to.clone(), true)]));
    let mut decoder = ReaderBuilder::new(schema)
        .with_batch_size(raw.len().max(1))
        .build_decoder()
        .map_err(|e| Error::schema(column, format!("cannot read JSON cells as {to}: {e}")))?;
    let mut line = Vec::new();
    for v in raw.iter() {
        line.clear();
        match v {
            None => line.extend_from_slice(b"{}"),
            Some(b) => {
                line.extend_from_slice(b"{\"v\":");
                line.extend_from_slice(b);
                line.push(b'}');
            }
        }
        decoder
            .decode(&line)
            .map_err(|_| bad(column, format_args!("JSON of a {to}")))?;
    }
    let batch = decoder
        .flush()
        .map_err(|_| bad(column, format_args!("JSON of a {to}")))?;
    match batch {
        Some(b) if b.num_rows() == raw.len() => Ok(b.column(0).clone()),
        None if raw.is_empty() => Ok(datafusion::arrow::array::new_empty_array(to)),
        _ => Err(bad(column, format_args!("one JSON value of a {to}"))),
    }
}

/// Decodes a column of cells into `to`, the column's type.
pub fn decode_cells(raw: &LargeBinaryArray, to: &DataType, column: &str) -> Result<ArrayRef> {
    use DataType::*;
    Ok(match to {
        Null => Arc::new(NullArray::new(raw.len())),
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 => {
            cast_checked(&(Arc::new(int64(raw, column)?) as ArrayRef), to, column)?
        }
        UInt64 => Arc::new(
            words(raw, column)?
                .into_iter()
                .map(|w| w.map(u64::from_be_bytes))
                .collect::<UInt64Array>(),
        ),
        Float16 | Float32 | Float64 => {
            let floats: Float64Array = words(raw, column)?
                .into_iter()
                .map(|w| w.map(f64::from_be_bytes))
                .collect();
            cast_checked(&(Arc::new(floats) as ArrayRef), to, column)?
        }
        Boolean => Arc::new(
            raw.iter()
                .map(|v| match v {
                    None => Ok(None),
                    Some([1]) => Ok(Some(true)),
                    Some([0]) => Ok(Some(false)),
                    Some(_) => Err(bad(column, "one byte 0x00 or 0x01")),
                })
                .collect::<Result<BooleanArray>>()?,
        ),
        Utf8 | LargeUtf8 | Utf8View => {
            cast_checked(&(Arc::new(text(raw, column)?) as ArrayRef), to, column)?
        }
        Binary | LargeBinary | BinaryView | FixedSizeBinary(_) => {
            cast_checked(&(Arc::new(raw.clone()) as ArrayRef), to, column)?
        }
        Date32 | Time32(_) => {
            let narrow: Int32Array = int64(raw, column)?
                .iter()
                .map(|v| {
                    v.map(|v| i32::try_from(v).map_err(|_| bad(column, format_args!("a {to}"))))
                        .transpose()
                })
                .collect::<Result<_>>()?;
            reinterpret(Arc::new(narrow), to)?
        }
        Date64 | Time64(_) | Timestamp(_, _) | Duration(_) => {
            reinterpret(Arc::new(int64(raw, column)?), to)?
        }
        Decimal32(_, _) | Decimal64(_, _) | Decimal128(_, _) | Decimal256(_, _) => {
            cast_checked(&(Arc::new(text(raw, column)?) as ArrayRef), to, column)?
        }
        Interval(unit) => interval(raw, *unit, column)?,
        Dictionary(_, value) => {
            let values = decode_cells(raw, value, column)?;
            cast_checked(&values, to, column)?
        }
        other => json(raw, other, column)?,
    })
}

/// A struct column from its fields' decoded columns: null where the row had none of its cells.
pub fn struct_of(
    fields: &datafusion::arrow::datatypes::Fields,
    children: Vec<ArrayRef>,
    present: Vec<bool>,
) -> Result<ArrayRef> {
    let nulls = NullBuffer::from(present);
    let nulls = (nulls.null_count() > 0).then_some(nulls);
    Ok(Arc::new(datafusion::arrow::array::StructArray::try_new(
        fields.clone(),
        children,
        nulls,
    )?))
}

/// Row-key parts back to a key column of type `to`: a string's UTF-8, binary as is, an
/// integer's decimal text.
pub fn decode_key_part(raw: &LargeBinaryArray, to: &DataType, column: &str) -> Result<ArrayRef> {
    use super::keys::PartKind;
    match PartKind::of(to) {
        Some(PartKind::Text) => {
            cast_checked(&(Arc::new(text(raw, column)?) as ArrayRef), to, column)
        }
        Some(PartKind::Bytes) => cast_checked(&(Arc::new(raw.clone()) as ArrayRef), to, column),
        Some(PartKind::Integer) => {
            let texts = text(raw, column)?;
            let parsed: Vec<Option<i128>> = texts
                .iter()
                .map(|t| {
                    t.map(|t| {
                        t.parse::<i128>()
                            .map_err(|_| bad(column, "the decimal text of an integer key part"))
                    })
                    .transpose()
                })
                .collect::<Result<_>>()?;
            let wide: ArrayRef = if matches!(to, DataType::UInt64) {
                Arc::new(
                    parsed
                        .iter()
                        .map(|v| {
                            v.map(|v| u64::try_from(v).map_err(|_| bad(column, "a UInt64")))
                                .transpose()
                        })
                        .collect::<Result<UInt64Array>>()?,
                )
            } else {
                Arc::new(
                    parsed
                        .iter()
                        .map(|v| {
                            v.map(|v| i64::try_from(v).map_err(|_| bad(column, "an Int64")))
                                .transpose()
                        })
                        .collect::<Result<Int64Array>>()?,
                )
            };
            cast_checked(&wide, to, column)
        }
        None => Err(Error::schema(
            column,
            format!("a row key column cannot be {to}"),
        )),
    }
}

/// Whether `raw` is all null (the column was not read, or no row had the cell).
pub fn all_null(raw: &dyn Array) -> bool {
    raw.null_count() == raw.len()
}

/// The values of an array as `LargeBinary` (for tests).
pub fn as_large_binary(array: &ArrayRef) -> &LargeBinaryArray {
    array.as_binary::<i64>()
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::RecordBatch;
    use datafusion::arrow::datatypes::{Int64Type, TimeUnit};

    use super::*;

    fn raw(values: &[Option<&[u8]>]) -> LargeBinaryArray {
        values.iter().copied().collect()
    }

    #[test]
    fn intervals_and_seconds_read_back_as_the_json_encoder_writes_them() {
        assert_eq!(seconds("3.000000000", 1_000_000_000), Some(3_000_000_000));
        assert_eq!(seconds("-1.500", 1_000), Some(-1_500));
        assert_eq!(seconds("1.5", 1_000), Some(1_500));
        let a = interval(
            &raw(&[Some(b"P1M2DT3.000000005S"), None]),
            IntervalUnit::MonthDayNano,
            "i",
        )
        .unwrap();
        let a = a.as_primitive::<datafusion::arrow::datatypes::IntervalMonthDayNanoType>();
        assert_eq!(a.value(0), IntervalMonthDayNano::new(1, 2, 3_000_000_005));
        assert!(a.is_null(1));
        let ym = interval(&raw(&[Some(b"P-14M")]), IntervalUnit::YearMonth, "i").unwrap();
        assert_eq!(
            ym.as_primitive::<datafusion::arrow::datatypes::IntervalYearMonthType>()
                .value(0),
            -14
        );
        assert!(interval(&raw(&[Some(b"1 day")]), IntervalUnit::DayTime, "i").is_err());
    }

    #[test]
    fn a_cell_of_the_wrong_width_is_an_error_naming_the_column_not_the_value() {
        let e = decode_cells(&raw(&[Some(b"secret")]), &DataType::Int64, "visits")
            .unwrap_err()
            .to_string();
        assert!(e.contains("visits") && e.contains("8 bytes"), "{e}");
        assert!(!e.contains("secret"), "{e}");
        let e = decode_cells(&raw(&[Some(&[2])]), &DataType::Boolean, "b")
            .unwrap_err()
            .to_string();
        assert!(e.contains("0x01"), "{e}");
    }

    #[test]
    fn integer_key_parts_and_timestamps_read_back() {
        let k = decode_key_part(&raw(&[Some(b"-7"), Some(b"42")]), &DataType::Int32, "id").unwrap();
        assert_eq!(
            k.as_primitive::<datafusion::arrow::datatypes::Int32Type>()
                .values()
                .to_vec(),
            vec![-7, 42]
        );
        let ts = decode_cells(
            &raw(&[Some(&1_700_000_000_000_000_000i64.to_be_bytes())]),
            &DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
            "ts",
        )
        .unwrap();
        assert_eq!(
            ts.data_type(),
            &DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into()))
        );
        let back = cast_checked(&ts, &DataType::Int64, "ts").unwrap();
        assert_eq!(
            back.as_primitive::<Int64Type>().value(0),
            1_700_000_000_000_000_000
        );
        let json_list = decode_cells(
            &raw(&[Some(b"[1,2]"), None]),
            &DataType::List(Arc::new(Field::new("item", DataType::Int64, true))),
            "l",
        )
        .unwrap();
        let batch = RecordBatch::try_from_iter([("l", json_list)]).unwrap();
        assert_eq!(batch.column(0).len(), 2);
        assert!(batch.column(0).is_null(1));
    }
}
