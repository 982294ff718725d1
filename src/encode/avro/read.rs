//! Avro payloads back to rows: each datum becomes one JSON object whose members the source's
//! JSON decoder reads into the declared columns (ADR 0052).
//!
//! `binary`: a bare datum per message, decoded by `arrow-avro`. Its `Decoder` reads framed
//! datums only, so each datum is handed to it behind the single-object header (`C3 01` and the
//! schema's Rabin fingerprint) of the one writer schema registered in its store; the rows it
//! builds are written out as JSON objects by Arrow's JSON writer. `json`: Avro's JSON encoding,
//! which no library here reads, is unwrapped by [`AvroRowDecoder`] itself (union branches,
//! bytes as code points, logical types). Both give a value the form the JSON decoder takes for
//! the column: timestamps and dates as RFC 3339 text, decimals as their exact digits, bytes as
//! hex.

use std::sync::Arc;

use arrow::datatypes::Schema;
use arrow_avro::reader::ReaderBuilder;
use arrow_avro::schema::{AvroSchema, Fingerprint, SINGLE_OBJECT_MAGIC, SchemaStore};
use chrono::{DateTime, NaiveTime};
use serde_json::{Map as JsonMap, Value as Json};

use super::{Direction, FieldSlot, Slot, Ty, bind_columns, parse_record};
use crate::encode::schema::{PayloadSchema, SchemaEncoding};
use crate::error::{Error, Result};

/// One payload as a JSON object, or why it does not decode (naming the field, never data).
pub type JsonPayload = std::result::Result<Vec<u8>, String>;

/// A checked Avro schema that turns payloads into JSON objects; see the module docs.
#[derive(Debug, Clone)]
pub struct AvroRowDecoder {
    fields: Arc<[FieldSlot]>,
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
        let decoder = AvroRowDecoder {
            fields,
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

    /// Each payload (in `encodings[i]`) as one JSON object, in order.
    pub fn to_json(&self, datas: &[&[u8]], encodings: &[SchemaEncoding]) -> Vec<JsonPayload> {
        let binary: Vec<usize> = (0..datas.len())
            .filter(|&i| encodings[i] == SchemaEncoding::Binary)
            .collect();
        let mut out: Vec<JsonPayload> = datas
            .iter()
            .zip(encodings)
            .map(|(data, encoding)| match encoding {
                SchemaEncoding::Json => self.avro_json_object(data),
                SchemaEncoding::Binary => Ok(Vec::new()),
            })
            .collect();
        let picked: Vec<&[u8]> = binary.iter().map(|&i| datas[i]).collect();
        let decoded = match self.binary_to_json(&picked) {
            Ok(all) => all.into_iter().map(Ok).collect(),
            // One datum spoils a batch: decode each alone to single out the bad ones.
            Err(_) => picked
                .iter()
                .map(|d| {
                    self.binary_to_json(&[d])
                        .map(|mut one| one.pop().unwrap_or_default())
                })
                .collect::<Vec<_>>(),
        };
        for (i, payload) in binary.into_iter().zip(decoded) {
            out[i] = payload;
        }
        out
    }

    /// Decodes bare datums with arrow-avro and writes each row as a JSON object.
    fn binary_to_json(&self, datas: &[&[u8]]) -> std::result::Result<Vec<Vec<u8>>, String> {
        if datas.is_empty() {
            return Ok(Vec::new());
        }
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
        let batch = decoder
            .flush()
            .map_err(|e| refused(&e))?
            .ok_or_else(|| refused(&"no row"))?;
        if batch.num_rows() != datas.len() {
            return Err(refused(&format!(
                "{} rows from {} datums",
                batch.num_rows(),
                datas.len()
            )));
        }
        let mut text = Vec::new();
        let mut writer = arrow::json::LineDelimitedWriter::new(&mut text);
        writer
            .write(&batch)
            .and_then(|()| writer.finish())
            .map_err(|e| refused(&e))?;
        drop(writer);
        let lines: Vec<Vec<u8>> = text
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(<[u8]>::to_vec)
            .collect();
        if lines.len() != datas.len() {
            return Err(refused(&"internal: rows and JSON lines differ"));
        }
        Ok(lines)
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
