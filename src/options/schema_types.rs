//! Arrow type checks shared by every connector's schema validation.

use arrow::datatypes::{DataType, Schema};

use crate::error::Result;

/// The type of column `name`, or an [`Error::Schema`](crate::Error::Schema) saying which option
/// named the missing column and the nearest column the table has
/// ([`super::names::unknown_column`]).
pub fn column_type<'a>(schema: &'a Schema, name: &str, option: &str) -> Result<&'a DataType> {
    schema
        .field_with_name(name)
        .map(|f| f.data_type())
        .map_err(|_| super::names::unknown_column(schema, name, option))
}

/// Any string type, including views and string dictionaries.
pub fn is_string(dt: &DataType) -> bool {
    match dt {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => true,
        DataType::Dictionary(_, v) => is_string(v),
        _ => false,
    }
}

/// Any binary type, including views and binary dictionaries.
pub fn is_binary(dt: &DataType) -> bool {
    match dt {
        DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_) => true,
        DataType::Dictionary(_, v) => is_binary(v),
        _ => false,
    }
}

/// Any signed or unsigned integer type.
pub fn is_integer(dt: &DataType) -> bool {
    dt.is_integer()
}

/// A map whose keys and values are strings.
pub fn is_string_map(dt: &DataType) -> bool {
    is_map_of(dt, is_string)
}

/// A map whose keys and values are both of a type `entry` accepts.
pub fn is_map_of(dt: &DataType, entry: fn(&DataType) -> bool) -> bool {
    match dt {
        DataType::Map(entries, _) => match entries.data_type() {
            DataType::Struct(fields) if fields.len() == 2 => {
                entry(fields[0].data_type()) && entry(fields[1].data_type())
            }
            _ => false,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{Field, Fields};
    use std::sync::Arc;

    #[test]
    fn recognises_string_maps_only() {
        let entries = Field::new(
            "entries",
            DataType::Struct(Fields::from(vec![
                Field::new("key", DataType::Utf8, false),
                Field::new("value", DataType::Utf8View, true),
            ])),
            false,
        );
        assert!(is_string_map(&DataType::Map(Arc::new(entries), false)));
        assert!(!is_string_map(&DataType::Utf8));
    }
}
