//! An array a format decoder built in the schema's own Arrow types, made into a table column's
//! type: the reading side's last step for Avro and Protobuf payloads (ADR 0065).
//!
//! Structs are matched by field name (a field the source lacks reads NULL, a source field the
//! column lacks is dropped), lists and maps are rebuilt around their conformed values, and any
//! other type is cast by Arrow with overflow and parse failures as errors (never a silent NULL).
//! A NULL where the column's field is NOT NULL is an error too.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, ListArray, MapArray, StructArray, new_null_array};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{DataType, FieldRef};
use arrow::error::ArrowError;

/// `array` in the type `target`; see the module docs. The error names no value.
pub fn conform(array: &ArrayRef, target: &DataType) -> Result<ArrayRef, ArrowError> {
    if array.data_type() == target {
        return Ok(array.clone());
    }
    match (array.data_type(), target) {
        (DataType::Struct(_), DataType::Struct(fields)) => {
            let source = array.as_struct();
            let columns = fields
                .iter()
                .map(|f| child(source, f))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Arc::new(StructArray::try_new(
                fields.clone(),
                columns,
                source.nulls().cloned(),
            )?))
        }
        (DataType::List(_), DataType::List(item)) => {
            let source = array.as_list::<i32>();
            let values = conform(source.values(), item.data_type())?;
            Ok(Arc::new(ListArray::try_new(
                item.clone(),
                source.offsets().clone(),
                values,
                source.nulls().cloned(),
            )?))
        }
        (DataType::List(_), DataType::LargeList(item) | DataType::FixedSizeList(item, _)) => {
            let as_list = DataType::List(item.clone());
            cast_strict(&conform(array, &as_list)?, target)
        }
        (DataType::Map(_, _), DataType::Map(entries, sorted)) => {
            let source = array.as_map();
            let entries_array: ArrayRef = Arc::new(source.entries().clone());
            let conformed = conform(&entries_array, entries.data_type())?;
            Ok(Arc::new(MapArray::try_new(
                entries.clone(),
                source.offsets().clone(),
                conformed.as_struct().clone(),
                source.nulls().cloned(),
                *sorted,
            )?))
        }
        _ => cast_strict(array, target),
    }
}

/// The child of `source` named like `field`, conformed to it; NULL when `source` lacks it.
fn child(source: &StructArray, field: &FieldRef) -> Result<ArrayRef, ArrowError> {
    match source.column_by_name(field.name()) {
        Some(c) => conform(c, field.data_type()),
        None => Ok(new_null_array(field.data_type(), source.len())),
    }
}

/// Arrow's cast, with a value that does not convert (overflow, unparsable text) an error.
fn cast_strict(array: &ArrayRef, target: &DataType) -> Result<ArrayRef, ArrowError> {
    cast_with_options(
        array,
        target,
        &CastOptions {
            safe: false,
            ..Default::default()
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int32Array, Int64Array, StringArray};
    use arrow::datatypes::{Field, Fields};

    #[test]
    fn structs_conform_by_field_name_and_a_missing_field_is_null() {
        let source: ArrayRef = Arc::new(StructArray::new(
            Fields::from(vec![
                Field::new("b", DataType::Int64, true),
                Field::new("a", DataType::Utf8, true),
            ]),
            vec![
                Arc::new(Int64Array::from(vec![7])) as ArrayRef,
                Arc::new(StringArray::from(vec!["x"])),
            ],
            None,
        ));
        let target = DataType::Struct(Fields::from(vec![
            Field::new("a", DataType::Utf8, true),
            Field::new("b", DataType::Int32, true),
            Field::new("c", DataType::Boolean, true),
        ]));
        let out = conform(&source, &target).unwrap();
        let out = out.as_struct();
        assert_eq!(out.column(0).as_string::<i32>().value(0), "x");
        assert_eq!(
            out.column(1)
                .as_primitive::<arrow::datatypes::Int32Type>()
                .value(0),
            7
        );
        assert!(out.column(2).is_null(0));
    }

    #[test]
    fn a_value_that_does_not_convert_is_an_error_not_a_null() {
        let wide: ArrayRef = Arc::new(Int64Array::from(vec![i64::MAX]));
        assert!(conform(&wide, &DataType::Int32).is_err());
        let text: ArrayRef = Arc::new(StringArray::from(vec!["not a time"]));
        assert!(
            conform(
                &text,
                &DataType::Timestamp(arrow::datatypes::TimeUnit::Microsecond, None)
            )
            .is_err()
        );
        let small: ArrayRef = Arc::new(Int32Array::from(vec![5]));
        assert_eq!(
            conform(&small, &DataType::Int64)
                .unwrap()
                .as_primitive::<arrow::datatypes::Int64Type>()
                .value(0),
            5
        );
    }

    #[test]
    fn a_null_in_a_not_null_struct_field_is_an_error() {
        let source: ArrayRef = Arc::new(StructArray::new(
            Fields::from(vec![Field::new("a", DataType::Utf8, true)]),
            vec![Arc::new(StringArray::from(vec![None::<&str>])) as ArrayRef],
            None,
        ));
        let target = DataType::Struct(Fields::from(vec![Field::new("a", DataType::Utf8, false)]));
        assert!(conform(&source, &target).is_err());
    }
}
