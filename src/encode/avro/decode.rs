//! Avro payloads back to rows (ADR 0065): the reading side of
//! [`AvroRowEncoder`](super::AvroRowEncoder).
//!
//! `binary`: a bare datum per message, decoded straight into Arrow arrays by `arrow-avro`. Its
//! `Decoder` reads framed datums only, so each datum is handed to it behind the single-object
//! header (`C3 01` and the schema's Rabin fingerprint) of the one writer schema registered in
//! its store; the arrays it builds, in the schema's own Arrow types (an enum as a dictionary, a
//! decimal as `Decimal128`, a timestamp in its unit), are then made into the columns' types by
//! [`conform`](crate::encode::conform). `json`: Avro's JSON encoding, which no library here
//! reads, is unwrapped by [`AvroRowDecoder`] itself (union branches, bytes as code points,
//! logical types) into the JSON object Arrow's JSON decoder reads into the columns: timestamps
//! and dates as RFC 3339 text, decimals as their exact digits, bytes as hex.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{FieldRef, Schema};
use arrow_avro::reader::ReaderBuilder;
use arrow_avro::schema::{AvroSchema, Fingerprint, SINGLE_OBJECT_MAGIC, SchemaStore};
use chrono::{DateTime, NaiveTime};
use serde_json::{Map as JsonMap, Value as Json};

use super::{Direction, FieldSlot, Slot, Ty, bind_columns, parse_record};
use crate::encode::json::decode::JsonRowDecoder;
use crate::encode::rows::{DecodedRows, RowFault, conform_rows, null_columns, targets};
use crate::encode::schema::{PayloadSchema, SchemaEncoding};
use crate::error::{Error, Result};

/// One Avro JSON payload as the JSON object Arrow's JSON decoder reads, or why it is not one
/// (naming the field, never data).
type JsonPayload = std::result::Result<Vec<u8>, String>;

/// A checked Avro schema that turns payloads into rows; see the module docs.
#[derive(Debug, Clone)]
pub struct AvroRowDecoder {
    fields: Arc<[FieldSlot]>,
    /// The bound columns, in the order given.
    targets: Arc<[FieldRef]>,
    /// The reader of Avro JSON payloads once unwrapped.
    json: JsonRowDecoder,
    store: SchemaStore,
    fingerprint: Fingerprint,
    prefix: Vec<u8>,
    origin: String,
}

impl AvroRowDecoder {
    /// Parses the schema (a record at the top level) and checks the table's `columns` against
    /// its fields by name: a column the record lacks, or a type that does not convert, is an
    /// error naming the column, the field and both types. Fields without a column are skipped.
    pub fn new(schema: &PayloadSchema, table: &Schema, columns: &[usize]) -> Result<Self> {
        let fields = parse_record(schema)?;
        bind_columns(schema, &fields, table, columns, Direction::Read)?;
        let invalid = |rule: String| Error::invalid("schema", schema.origin.clone(), rule);
        let mut store = SchemaStore::new();
        let fingerprint = store
            .register(AvroSchema::new(schema.definition.clone()))
            .map_err(|e| invalid(format!("the Avro schema cannot be read: {e}")))?;
        let Fingerprint::Rabin(rabin) = fingerprint else {
            return Err(invalid("internal: not a Rabin fingerprint".into()));
        };
        let mut prefix = SINGLE_OBJECT_MAGIC.to_vec();
        prefix.extend_from_slice(&rabin.to_le_bytes());
        let targets = targets(table, columns);
        let decoder = AvroRowDecoder {
            fields,
            json: JsonRowDecoder::new(targets.iter().cloned()),
            targets,
            store,
            fingerprint,
            prefix,
            origin: schema.origin.clone(),
        };
        // Let arrow-avro plan the schema now, so that one it cannot read fails the declaration.
        decoder
            .binary_decoder(1)
            .map_err(|e| invalid(format!("the Avro schema cannot be read: {e}")))?;
        Ok(decoder)
    }

    fn binary_decoder(
        &self,
        rows: usize,
    ) -> std::result::Result<arrow_avro::reader::Decoder, arrow::error::ArrowError> {
        ReaderBuilder::new()
            .with_batch_size(rows.max(1))
            .with_writer_schema_store(self.store.clone())
            .with_active_fingerprint(self.fingerprint)
            .build_decoder()
    }

    /// The columns this decoder fills, in the order it was given them.
    pub fn targets(&self) -> &[FieldRef] {
        &self.targets
    }

    /// Decodes each payload (in `encodings[i]`) into the bound columns: binary datums straight
    /// into Arrow by arrow-avro and then made into the columns' types, Avro JSON through
    /// Arrow's JSON decoder. A payload that is not a datum of the schema, or whose value does
    /// not fit its column, is a fault naming the schema or the column, never the data.
    pub fn decode(&self, datas: &[&[u8]], encodings: &[SchemaEncoding]) -> Result<DecodedRows> {
        let (binary, json): (Vec<usize>, Vec<usize>) =
            (0..datas.len()).partition(|&i| encodings[i] == SchemaEncoding::Binary);
        let mut parts = Vec::with_capacity(2);
        if !binary.is_empty() {
            parts.push(self.decode_binary(binary, datas)?);
        }
        if !json.is_empty() {
            let mut faults = Vec::new();
            let mut objects: Vec<Vec<u8>> = vec![Vec::new(); datas.len()];
            let mut rows = Vec::with_capacity(json.len());
            for i in json {
                match self.avro_json_object(datas[i]) {
                    Ok(object) => {
                        objects[i] = object;
                        rows.push(i);
                    }
                    Err(reason) => faults.push((i, RowFault::Payload(reason))),
                }
            }
            let objects: Vec<&[u8]> = objects.iter().map(Vec::as_slice).collect();
            let mut part = self.json.decode(rows, &objects, "avro field")?;
            part.faults.extend(faults);
            part.faults.sort_by_key(|f| f.0);
            parts.push(part);
        }
        DecodedRows::merge(parts, &self.targets)
    }

    /// Binary datums: one arrow-avro batch for all of them (each datum alone only when that
    /// fails, to single out the ones that are not datums), its columns made into the table's.
    fn decode_binary(&self, rows: Vec<usize>, datas: &[&[u8]]) -> Result<DecodedRows> {
        let picked: Vec<&[u8]> = rows.iter().map(|&i| datas[i]).collect();
        let (rows, batch, faults) = match self.binary_batch(&picked) {
            Ok(batch) => (rows, batch, Vec::new()),
            Err(_) => {
                let mut good = Vec::with_capacity(rows.len());
                let mut faults = Vec::new();
                for i in rows {
                    match self.binary_batch(&[datas[i]]) {
                        Ok(_) => good.push(i),
                        Err(reason) => faults.push((i, RowFault::Payload(reason))),
                    }
                }
                if good.is_empty() {
                    return Ok(DecodedRows {
                        rows: good,
                        columns: null_columns(&self.targets, 0),
                        faults,
                    });
                }
                let picked: Vec<&[u8]> = good.iter().map(|&i| datas[i]).collect();
                let batch = self.binary_batch(&picked).map_err(|reason| {
                    Error::Unsupported(format!(
                        "internal: datums that decode alone do not decode together: {reason}"
                    ))
                })?;
                (good, batch, faults)
            }
        };
        let natural = self
            .targets
            .iter()
            .map(|f| {
                batch.column_by_name(f.name()).cloned().ok_or_else(|| {
                    Error::Unsupported(format!(
                        "internal: arrow-avro gave no column for field '{}'",
                        f.name()
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        conform_rows(rows, natural, &self.targets, faults, "avro field")
    }

    /// Decodes bare datums with arrow-avro into one batch in the schema's own Arrow types.
    fn binary_batch(&self, datas: &[&[u8]]) -> std::result::Result<RecordBatch, String> {
        let refused = |e: &dyn std::fmt::Display| {
            format!(
                "the data is not a datum of the Avro schema ({}): {e}",
                self.origin
            )
        };
        let mut decoder = self.binary_decoder(datas.len()).map_err(|e| refused(&e))?;
        let mut framed = Vec::new();
        for data in datas {
            framed.clear();
            framed.extend_from_slice(&self.prefix);
            framed.extend_from_slice(data);
            let used = decoder.decode(&framed).map_err(|e| refused(&e))?;
            if used != framed.len() {
                return Err(refused(&format!(
                    "{} of its {} bytes left over or missing",
                    framed.len() - used,
                    data.len()
                )));
            }
        }
        let batch = match decoder.flush().map_err(|e| refused(&e))? {
            Some(batch) => batch,
            None => return Err(refused(&"no row")),
        };
        if batch.num_rows() != datas.len() {
            return Err(refused(&format!(
                "{} rows from {} datums",
                batch.num_rows(),
                datas.len()
            )));
        }
        Ok(batch)
    }

    /// One Avro JSON datum as the JSON object the source decodes.
    fn avro_json_object(&self, data: &[u8]) -> JsonPayload {
        let value: Json = serde_json::from_slice(data).map_err(|_| {
            format!(
                "the data is not Avro JSON (not one JSON value) for the schema ({})",
                self.origin
            )
        })?;
        let Json::Object(mut object) = value else {
            return Err("the data is not an Avro JSON record (not a JSON object)".into());
        };
        let mut out = JsonMap::with_capacity(self.fields.len());
        for f in self.fields.iter() {
            let v = object.remove(&f.name).unwrap_or(Json::Null);
            out.insert(f.name.clone(), plain(v, &f.slot, &f.name)?);
        }
        serde_json::to_vec(&Json::Object(out)).map_err(|e| e.to_string())
    }
}

/// An Avro JSON value of `slot` in the form the JSON decoder reads; errors name the field.
fn plain(v: Json, slot: &Slot, at: &str) -> std::result::Result<Json, String> {
    let wrong = |what: &str| format!("field '{at}': {what} for the Avro type {}", slot.describe());
    if v.is_null() {
        return if slot.nullable {
            Ok(Json::Null)
        } else {
            Err(wrong("null (or missing)"))
        };
    }
    let v = if slot.nullable && !matches!(slot.ty, Ty::Null) {
        // A union's non-null value is an object keyed by its branch.
        match v {
            Json::Object(mut o) if o.len() == 1 && o.contains_key(&slot.branch) => {
                o.remove(&slot.branch).unwrap_or(Json::Null)
            }
            _ => return Err(wrong("a union value not wrapped in its branch name")),
        }
    } else {
        v
    };
    let int = |v: &Json| v.as_i64().ok_or_else(|| wrong("not an integer"));
    Ok(match &slot.ty {
        Ty::Null => Json::Null,
        Ty::Boolean | Ty::Int | Ty::Long | Ty::Float | Ty::Double | Ty::Str | Ty::Enum(_) => v,
        Ty::Bytes | Ty::Fixed(_) => Json::String(hex(&code_points(&v)
            .ok_or_else(|| wrong("not a string of code points U+0000 to U+00FF"))?)),
        Ty::Date => {
            let days = int(&v)?;
            let date = chrono::NaiveDate::from_ymd_opt(1970, 1, 1)
                .and_then(|d| d.checked_add_signed(chrono::Duration::try_days(days)?))
                .ok_or_else(|| wrong("a date out of range"))?;
            Json::String(date.format("%Y-%m-%d").to_string())
        }
        Ty::TimeMillis | Ty::TimeMicros => {
            let per_second = if matches!(slot.ty, Ty::TimeMillis) {
                1_000
            } else {
                1_000_000
            };
            let n = int(&v)?;
            let time = NaiveTime::from_num_seconds_from_midnight_opt(
                u32::try_from(n / per_second).map_err(|_| wrong("a time out of range"))?,
                u32::try_from((n % per_second) * (1_000_000_000 / per_second))
                    .map_err(|_| wrong("a time out of range"))?,
            )
            .ok_or_else(|| wrong("a time out of range"))?;
            Json::String(time.format("%H:%M:%S%.f").to_string())
        }
        Ty::Timestamp { unit, utc } => {
            let n = int(&v)?;
            let nanos = match unit {
                arrow::datatypes::TimeUnit::Millisecond => n.checked_mul(1_000_000),
                arrow::datatypes::TimeUnit::Microsecond => n.checked_mul(1_000),
                _ => Some(n),
            }
            .ok_or_else(|| wrong("a timestamp out of range"))?;
            let t = DateTime::from_timestamp_nanos(nanos);
            Json::String(if *utc {
                t.format("%Y-%m-%dT%H:%M:%S%.fZ").to_string()
            } else {
                t.naive_utc().format("%Y-%m-%dT%H:%M:%S%.f").to_string()
            })
        }
        Ty::Decimal { scale, .. } => {
            let bytes = code_points(&v)
                .ok_or_else(|| wrong("not a string of code points U+0000 to U+00FF"))?;
            Json::String(decimal_text(&bytes, *scale).ok_or_else(|| wrong("a decimal too wide"))?)
        }
        Ty::Record(fields) => {
            let Json::Object(mut o) = v else {
                return Err(wrong("not an object"));
            };
            let mut out = JsonMap::with_capacity(fields.len());
            for f in fields.iter() {
                let child = o.remove(&f.name).unwrap_or(Json::Null);
                out.insert(
                    f.name.clone(),
                    plain(child, &f.slot, &format!("{at}.{}", f.name))?,
                );
            }
            Json::Object(out)
        }
        Ty::Array(item) => {
            let Json::Array(items) = v else {
                return Err(wrong("not an array"));
            };
            let at = format!("{at}[]");
            items
                .into_iter()
                .map(|x| plain(x, item, &at))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map(Json::Array)?
        }
        Ty::Map(value) => {
            let Json::Object(o) = v else {
                return Err(wrong("not an object"));
            };
            let at = format!("{at}{{}}");
            let mut out = JsonMap::with_capacity(o.len());
            for (k, x) in o {
                out.insert(k, plain(x, value, &at)?);
            }
            Json::Object(out)
        }
    })
}

/// Avro JSON bytes: one code point U+0000 to U+00FF per byte.
fn code_points(v: &Json) -> Option<Vec<u8>> {
    v.as_str()?.chars().map(|c| u8::try_from(c).ok()).collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A big-endian two's complement unscaled value as decimal text with `scale` digits after the
/// point; `None` past 256 bits.
fn decimal_text(be: &[u8], scale: i8) -> Option<String> {
    if be.len() > 32 {
        return None;
    }
    let fill = if be.first().is_some_and(|b| b & 0x80 != 0) {
        0xff
    } else {
        0
    };
    let mut wide = [fill; 32];
    wide[32 - be.len()..].copy_from_slice(be);
    let value = arrow::datatypes::i256::from_be_bytes(wide);
    let digits = value.wrapping_abs().to_string();
    let scale = usize::try_from(scale).unwrap_or(0);
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (whole, fraction) = padded.split_at(padded.len() - scale);
    let sign = if value.is_negative() { "-" } else { "" };
    Some(if scale == 0 {
        format!("{sign}{whole}")
    } else {
        format!("{sign}{whole}.{fraction}")
    })
}
