//! The `raw` payload format: one string or binary column whose bytes are the payload as they
//! are, and the byte access every connector uses for string and binary columns.
//!
//! [`BytesColumn`] reads any of Arrow's seven string and binary layouts (`Utf8`, `LargeUtf8`,
//! `Utf8View`, `Binary`, `LargeBinary`, `BinaryView`, `FixedSizeBinary`) through one type, so a
//! mapping accepts `VARCHAR` (which DataFusion hands over as `Utf8View`) and `BYTEA` alike.
//!
//! ```
//! use std::sync::Arc;
//! use arrow::array::{RecordBatch, StringViewArray};
//! use arrow::datatypes::{DataType, Field, Schema};
//! use gcp_sql::encode::raw::RawEncoder;
//!
//! let schema = Arc::new(Schema::new(vec![Field::new("body", DataType::Utf8View, true)]));
//! let batch = RecordBatch::try_new(
//!     schema.clone(),
//!     vec![Arc::new(StringViewArray::from(vec![Some("hello"), None]))],
//! )?;
//! let raw = RawEncoder::new(&schema, &[0])?;
//! let column = raw.bind(&batch)?;
//! assert_eq!(column.value(0), Some(&b"hello"[..]));
//! assert_eq!(column.value(1), None);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use arrow::array::{
    Array, AsArray, BinaryArray, BinaryViewArray, FixedSizeBinaryArray, LargeBinaryArray,
    LargeStringArray, RecordBatch, StringArray, StringViewArray,
};
use arrow::datatypes::{DataType, Schema};

use crate::error::{Error, Result};

/// Whether `data_type` is one of Arrow's string layouts (`Utf8`, `LargeUtf8`, `Utf8View`).
pub fn is_string_type(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    )
}

/// Whether `data_type` is a string or binary layout that [`BytesColumn`] can read.
pub fn is_bytes_type(data_type: &DataType) -> bool {
    is_string_type(data_type)
        || matches!(
            data_type,
            DataType::Binary
                | DataType::LargeBinary
                | DataType::BinaryView
                | DataType::FixedSizeBinary(_)
        )
}

/// Byte access to one string or binary column of a batch, whatever its layout.
#[derive(Debug, Clone, Copy)]
pub enum BytesColumn<'a> {
    /// `Utf8`.
    Utf8(&'a StringArray),
    /// `LargeUtf8`.
    LargeUtf8(&'a LargeStringArray),
    /// `Utf8View`.
    Utf8View(&'a StringViewArray),
    /// `Binary`.
    Binary(&'a BinaryArray),
    /// `LargeBinary`.
    LargeBinary(&'a LargeBinaryArray),
    /// `BinaryView`.
    BinaryView(&'a BinaryViewArray),
    /// `FixedSizeBinary`.
    FixedSizeBinary(&'a FixedSizeBinaryArray),
}

impl<'a> BytesColumn<'a> {
    /// Views `array` as bytes. Fails with [`Error::Schema`] naming `column` when the array is
    /// not a string or binary layout.
    pub fn new(column: &str, array: &'a dyn Array) -> Result<Self> {
        let mismatch = || {
            Error::schema(
                column,
                format!("type {} is not a string or binary type", array.data_type()),
            )
        };
        Ok(match array.data_type() {
            DataType::Utf8 => BytesColumn::Utf8(array.as_string_opt::<i32>().ok_or_else(mismatch)?),
            DataType::LargeUtf8 => {
                BytesColumn::LargeUtf8(array.as_string_opt::<i64>().ok_or_else(mismatch)?)
            }
            DataType::Utf8View => {
                BytesColumn::Utf8View(array.as_string_view_opt().ok_or_else(mismatch)?)
            }
            DataType::Binary => {
                BytesColumn::Binary(array.as_binary_opt::<i32>().ok_or_else(mismatch)?)
            }
            DataType::LargeBinary => {
                BytesColumn::LargeBinary(array.as_binary_opt::<i64>().ok_or_else(mismatch)?)
            }
            DataType::BinaryView => {
                BytesColumn::BinaryView(array.as_binary_view_opt().ok_or_else(mismatch)?)
            }
            DataType::FixedSizeBinary(_) => {
                BytesColumn::FixedSizeBinary(array.as_fixed_size_binary_opt().ok_or_else(mismatch)?)
            }
            _ => return Err(mismatch()),
        })
    }

    /// Whether the column is a string layout, whose values Arrow guarantees to be UTF-8.
    pub fn is_text(&self) -> bool {
        matches!(
            self,
            BytesColumn::Utf8(_) | BytesColumn::LargeUtf8(_) | BytesColumn::Utf8View(_)
        )
    }

    /// The bytes of `row`, or `None` when it is null.
    #[inline]
    pub fn value(&self, row: usize) -> Option<&'a [u8]> {
        match *self {
            BytesColumn::Utf8(a) => a.is_valid(row).then(|| a.value(row).as_bytes()),
            BytesColumn::LargeUtf8(a) => a.is_valid(row).then(|| a.value(row).as_bytes()),
            BytesColumn::Utf8View(a) => a.is_valid(row).then(|| a.value(row).as_bytes()),
            BytesColumn::Binary(a) => a.is_valid(row).then(|| a.value(row)),
            BytesColumn::LargeBinary(a) => a.is_valid(row).then(|| a.value(row)),
            BytesColumn::BinaryView(a) => a.is_valid(row).then(|| a.value(row)),
            BytesColumn::FixedSizeBinary(a) => a.is_valid(row).then(|| a.value(row)),
        }
    }

    /// The text of `row` for a string layout, or `None` when it is null or the column is binary.
    #[inline]
    pub fn str_value(&self, row: usize) -> Option<&'a str> {
        match *self {
            BytesColumn::Utf8(a) => a.is_valid(row).then(|| a.value(row)),
            BytesColumn::LargeUtf8(a) => a.is_valid(row).then(|| a.value(row)),
            BytesColumn::Utf8View(a) => a.is_valid(row).then(|| a.value(row)),
            _ => None,
        }
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        match *self {
            BytesColumn::Utf8(a) => a.len(),
            BytesColumn::LargeUtf8(a) => a.len(),
            BytesColumn::Utf8View(a) => a.len(),
            BytesColumn::Binary(a) => a.len(),
            BytesColumn::LargeBinary(a) => a.len(),
            BytesColumn::BinaryView(a) => a.len(),
            BytesColumn::FixedSizeBinary(a) => a.len(),
        }
    }

    /// Whether the column has no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The `raw` format: exactly one string or binary column is the payload, byte for byte.
///
/// A null value is an empty payload; strings are sent as their UTF-8 bytes.
#[derive(Debug, Clone)]
pub struct RawEncoder {
    column: usize,
    name: String,
}

impl RawEncoder {
    /// Checks, once per schema, that `columns` (indices into `schema`) is exactly one string or
    /// binary column. Errors are [`Error::Schema`] naming the column(s) and the rule.
    pub fn new(schema: &Schema, columns: &[usize]) -> Result<Self> {
        let [column] = columns else {
            let names: Vec<&str> = columns
                .iter()
                .filter_map(|&i| schema.fields().get(i))
                .map(|f| f.name().as_str())
                .collect();
            let shown = if names.is_empty() {
                "(none)".to_string()
            } else {
                names.join(", ")
            };
            return Err(Error::schema(
                shown,
                format!(
                    "format 'raw' sends exactly one column as the payload, but {} are left",
                    columns.len()
                ),
            ));
        };
        let field = schema.fields().get(*column).ok_or_else(|| {
            Error::schema(format!("#{column}"), "no such column in the table schema")
        })?;
        if !is_bytes_type(field.data_type()) {
            return Err(Error::schema(
                field.name(),
                format!(
                    "format 'raw' needs a string or binary payload column, but its type is {}",
                    field.data_type()
                ),
            ));
        }
        Ok(RawEncoder {
            column: *column,
            name: field.name().clone(),
        })
    }

    /// The payload column's index in the schema.
    pub fn column(&self) -> usize {
        self.column
    }

    /// Reads the payload column of `batch` (which must have the schema given to [`new`](Self::new)).
    pub fn bind<'a>(&self, batch: &'a RecordBatch) -> Result<BytesColumn<'a>> {
        let array = batch.columns().get(self.column).ok_or_else(|| {
            Error::schema(
                &self.name,
                "the batch has fewer columns than the table schema",
            )
        })?;
        BytesColumn::new(&self.name, array.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Int32Array};
    use arrow::datatypes::Field;

    use super::*;

    #[test]
    fn reads_every_string_and_binary_layout() {
        let arrays: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(vec![Some("ab"), None])),
            Arc::new(LargeStringArray::from(vec![Some("ab"), None])),
            Arc::new(StringViewArray::from(vec![Some("ab"), None])),
            Arc::new(BinaryArray::from(vec![Some(&b"ab"[..]), None])),
            Arc::new(LargeBinaryArray::from(vec![Some(&b"ab"[..]), None])),
            Arc::new(BinaryViewArray::from(vec![Some(&b"ab"[..]), None])),
            Arc::new(
                FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                    vec![Some(b"ab"), None].into_iter(),
                    2,
                )
                .unwrap(),
            ),
        ];
        for array in &arrays {
            let column = BytesColumn::new("c", array.as_ref()).unwrap();
            assert_eq!(column.value(0), Some(&b"ab"[..]), "{}", array.data_type());
            assert_eq!(column.value(1), None, "{}", array.data_type());
            assert_eq!(column.is_text(), is_string_type(array.data_type()));
        }
    }

    #[test]
    fn rejects_a_non_bytes_column_by_name() {
        let array = Int32Array::from(vec![1]);
        let err = BytesColumn::new("n", &array).unwrap_err().to_string();
        assert!(err.contains("'n'") && err.contains("Int32"), "{err}");
    }

    #[test]
    fn raw_encoder_requires_exactly_one_bytes_column() {
        let schema = Schema::new(vec![
            Field::new("a", DataType::Utf8, true),
            Field::new("b", DataType::Binary, true),
            Field::new("n", DataType::Int64, true),
        ]);
        assert!(RawEncoder::new(&schema, &[1]).is_ok());
        let two = RawEncoder::new(&schema, &[0, 1]).unwrap_err().to_string();
        assert!(two.contains("a, b") && two.contains("exactly one"), "{two}");
        let none = RawEncoder::new(&schema, &[]).unwrap_err().to_string();
        assert!(none.contains("exactly one"), "{none}");
        let int = RawEncoder::new(&schema, &[2]).unwrap_err().to_string();
        assert!(int.contains("'n'") && int.contains("Int64"), "{int}");
    }
}
