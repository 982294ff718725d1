//! JSON objects back to rows: the reading side of [`JsonRowEncoder`](super::JsonRowEncoder).
//!
//! Each payload is one JSON object; every column is decoded from the member of the same name by
//! Arrow's JSON decoder (a missing member is NULL; numbers and booleans are accepted into string
//! columns; a timestamp column takes RFC 3339 text or a number). The whole set decodes in one
//! pass; only when that pass fails is each payload decoded alone to single out the bad ones,
//! and for each of those the first column that fails alone is named.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, FieldRef, Schema, SchemaRef};
use arrow::json::ReaderBuilder;
use arrow::json::reader::Decoder;

use crate::encode::rows::{DecodedRows, RowFault, column_fault};
use crate::error::{Error, Result};

/// Decodes JSON objects into a set of columns; see the module docs.
#[derive(Debug, Clone)]
pub struct JsonRowDecoder {
    schema: SchemaRef,
}

fn decoder(
    schema: SchemaRef,
    rows: usize,
) -> std::result::Result<Decoder, arrow::error::ArrowError> {
    ReaderBuilder::new(schema)
        .with_batch_size(rows + 1)
        .with_coerce_primitive(true)
        .build_decoder()
}

/// Decodes `datas` (one JSON object each) into one batch; `Err` when any does not decode or
/// is not exactly one value. The error carries no data.
fn decode_all(schema: &SchemaRef, datas: &[&[u8]]) -> std::result::Result<RecordBatch, ()> {
    let mut decoder = decoder(schema.clone(), datas.len()).map_err(drop)?;
    for data in datas {
        let before = decoder.len();
        let used = decoder.decode(data).map_err(drop)?;
        if used != data.len() || decoder.has_partial_record() || decoder.len() != before + 1 {
            return Err(());
        }
    }
    match decoder.flush().map_err(drop)? {
        Some(batch) if batch.num_rows() == datas.len() => Ok(batch),
        None if datas.is_empty() => Ok(RecordBatch::new_empty(schema.clone())),
        _ => Err(()),
    }
}

impl JsonRowDecoder {
    /// A decoder of the columns `fields`.
    pub fn new(fields: impl IntoIterator<Item = FieldRef>) -> Self {
        JsonRowDecoder {
            schema: Arc::new(Schema::new(fields.into_iter().collect::<Vec<_>>())),
        }
    }

    /// Whether Arrow's JSON decoder reads a column like `field` (the error says why not).
    pub fn check(field: &Field) -> std::result::Result<(), arrow::error::ArrowError> {
        decoder(Arc::new(Schema::new(vec![field.clone()])), 1).map(drop)
    }

    /// The columns decoded.
    pub fn fields(&self) -> &[FieldRef] {
        self.schema.fields()
    }

    /// Decodes `datas[i]` for each `i` of `rows`; `member` says what a column's value is in
    /// the reasons (`JSON member`, `avro field`).
    pub fn decode(&self, rows: Vec<usize>, datas: &[&[u8]], member: &str) -> Result<DecodedRows> {
        let mut rows = rows;
        let mut faults = Vec::new();
        let picked: Vec<&[u8]> = rows.iter().map(|&i| datas[i]).collect();
        let batch = match decode_all(&self.schema, &picked) {
            Ok(batch) => batch,
            Err(()) => {
                rows.retain(|&i| {
                    if decode_all(&self.schema, &[datas[i]]).is_ok() {
                        true
                    } else {
                        faults.push((i, self.diagnose(datas[i], member)));
                        false
                    }
                });
                let picked: Vec<&[u8]> = rows.iter().map(|&i| datas[i]).collect();
                decode_all(&self.schema, &picked).map_err(|()| {
                    Error::Unsupported(
                        "internal: payloads that decode alone do not decode together".into(),
                    )
                })?
            }
        };
        Ok(DecodedRows {
            rows,
            columns: batch.columns().to_vec(),
            faults,
        })
    }

    /// Why one payload does not decode: the first column that fails alone, else the whole
    /// object.
    fn diagnose(&self, data: &[u8], member: &str) -> RowFault {
        let probe = Arc::new(Schema::new(vec![Field::new(
            "\u{0}gcp_sql_probe",
            DataType::Utf8,
            true,
        )]));
        if decode_all(&probe, &[data]).is_err() {
            return RowFault::Payload("the data is not one JSON object".into());
        }
        let column = self.schema.fields().iter().find(|f| {
            let single = Arc::new(Schema::new(vec![f.as_ref().clone()]));
            decode_all(&single, &[data]).is_err()
        });
        match column {
            Some(f) => column_fault(f, member),
            None => RowFault::Payload(
                "the JSON object does not decode into the declared columns".into(),
            ),
        }
    }
}
