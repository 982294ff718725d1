//! What a payload decoder gives back: the columns of the payloads that became rows, and why
//! the others did not (naming the column or the field, never the data).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, new_null_array};
use arrow::compute::{filter, interleave};
use arrow::datatypes::FieldRef;

use super::conform::conform;
use crate::error::{Error, Result};

/// Why one payload is not a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowFault {
    /// The payload is not a value of the schema or format at all (the reason names the schema
    /// and, where one is to blame, the field).
    Payload(String),
    /// The payload decoded, but one column's value does not fit the column's type.
    Column {
        /// The column.
        column: String,
        /// Why, naming the column's type.
        reason: String,
    },
}

/// Payloads decoded into a table's columns.
#[derive(Debug, Clone)]
pub struct DecodedRows {
    /// The payloads that became rows, by position, ascending.
    pub rows: Vec<usize>,
    /// One array per column the decoder was bound to (in the order it was given them), one
    /// value per entry of `rows`.
    pub columns: Vec<ArrayRef>,
    /// The payloads that did not, by position, ascending.
    pub faults: Vec<(usize, RowFault)>,
}

impl DecodedRows {
    /// No payload decoded: columns of `targets` with no rows.
    pub(crate) fn empty(targets: &[FieldRef]) -> Self {
        DecodedRows {
            rows: Vec::new(),
            columns: targets
                .iter()
                .map(|f| new_null_array(f.data_type(), 0))
                .collect(),
            faults: Vec::new(),
        }
    }

    /// Puts parts decoded from disjoint sets of the same payloads (each with columns of
    /// `targets`) back into one, rows in payload order.
    pub(crate) fn merge(mut parts: Vec<DecodedRows>, targets: &[FieldRef]) -> Result<DecodedRows> {
        if parts.len() <= 1 {
            return Ok(parts.pop().unwrap_or_else(|| DecodedRows::empty(targets)));
        }
        let mut order: Vec<(usize, usize, usize)> = parts
            .iter()
            .enumerate()
            .flat_map(|(p, part)| {
                part.rows
                    .iter()
                    .enumerate()
                    .map(move |(r, &row)| (row, p, r))
            })
            .collect();
        order.sort_unstable();
        let indices: Vec<(usize, usize)> = order.iter().map(|&(_, p, r)| (p, r)).collect();
        let width = parts[0].columns.len();
        let columns = (0..width)
            .map(|c| {
                let arrays: Vec<&dyn Array> = parts.iter().map(|p| p.columns[c].as_ref()).collect();
                interleave(&arrays, &indices)
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let mut faults: Vec<(usize, RowFault)> =
            parts.iter_mut().flat_map(|p| p.faults.drain(..)).collect();
        faults.sort_by_key(|f| f.0);
        Ok(DecodedRows {
            rows: order.into_iter().map(|(row, _, _)| row).collect(),
            columns,
            faults,
        })
    }
}

/// Makes `natural` (one array per target, one value per entry of `rows`, in the format's own
/// Arrow types) into the `targets`' types. A row whose value does not convert in some column,
/// or is NULL where the column is NOT NULL, joins `faults` naming that column (`field` says
/// whose value it was, e.g. `avro field`); the rows already in `faults` are dropped.
pub(crate) fn conform_rows(
    rows: Vec<usize>,
    mut natural: Vec<ArrayRef>,
    targets: &[FieldRef],
    mut faults: Vec<(usize, RowFault)>,
    field: &str,
) -> Result<DecodedRows> {
    let mut rows = rows;
    loop {
        // Drop the rows found faulty so far.
        let keep: Vec<bool> = rows
            .iter()
            .map(|r| !faults.iter().any(|(f, _)| f == r))
            .collect();
        if keep.iter().any(|k| !k) {
            let mask = BooleanArray::from(keep.clone());
            natural = natural
                .iter()
                .map(|a| filter(a.as_ref(), &mask))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            rows = rows
                .into_iter()
                .zip(keep)
                .filter_map(|(r, k)| k.then_some(r))
                .collect();
        }
        let mut columns = Vec::with_capacity(targets.len());
        let mut found = false;
        for (array, target) in natural.iter().zip(targets) {
            match conform(array, target.data_type()) {
                Ok(c) if target.is_nullable() || c.null_count() == 0 => columns.push(c),
                _ => {
                    // Single out the rows whose value spoils the column.
                    for (i, &row) in rows.iter().enumerate() {
                        let ok = conform(&array.slice(i, 1), target.data_type())
                            .is_ok_and(|c| target.is_nullable() || c.null_count() == 0);
                        if !ok {
                            faults.push((row, column_fault(target, field)));
                            found = true;
                        }
                    }
                    if !found {
                        return Err(Error::Unsupported(format!(
                            "internal: column '{}' does not convert as a whole but each row does",
                            target.name()
                        )));
                    }
                    break;
                }
            }
        }
        if !found {
            faults.sort_by_key(|f| f.0);
            return Ok(DecodedRows {
                rows,
                columns,
                faults,
            });
        }
    }
}

/// The fault of a row whose value (`field` says whose: `avro field`, `JSON member`) does not
/// fit the column `target`.
pub(crate) fn column_fault(target: &FieldRef, field: &str) -> RowFault {
    RowFault::Column {
        column: target.name().clone(),
        reason: format!(
            "its {field} does not decode as {}{} (a value of another type, out of range, or missing)",
            target.data_type(),
            if target.is_nullable() {
                ""
            } else {
                " NOT NULL"
            }
        ),
    }
}

/// A column of `n` NULLs for each target.
pub(crate) fn null_columns(targets: &[FieldRef], n: usize) -> Vec<ArrayRef> {
    targets
        .iter()
        .map(|f| new_null_array(f.data_type(), n))
        .collect()
}

/// Shared by the decoders: a field reference list from a table and column indices.
pub(crate) fn targets(table: &arrow::datatypes::Schema, columns: &[usize]) -> Arc<[FieldRef]> {
    columns
        .iter()
        .map(|&c| Arc::new(table.field(c).clone()))
        .collect()
}
