//! Schema'd payloads: a row encoded to match an Avro or Protobuf schema.
//!
//! [`PayloadSchema`] is a schema definition with its language and wire encoding, from a table
//! option or from a Pub/Sub topic's schema settings. [`SchemaRowEncoder::new`] checks it against
//! the table's payload columns once (columns map to fields by name; the errors name the column,
//! the field and both types) and [`SchemaRowEncoder::encode_batch`] turns each row into one
//! payload, or into the reason the schema refuses that row (which then follows the failure
//! policy). The format code lives in [`avro`](super::avro) and [`protobuf`](super::protobuf).

use arrow::array::RecordBatch;
use arrow::datatypes::Schema;

use super::avro::AvroRowEncoder;
use super::avro::decode::AvroRowDecoder;
use super::protobuf::ProtoRowEncoder;
use super::protobuf::decode::ProtoRowDecoder;
use super::rows::DecodedRows;
use crate::error::Result;

/// The schema language.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaType {
    /// An Avro schema (JSON text); the top level must be a record.
    Avro,
    /// A Protocol Buffers `.proto` file with one top-level message.
    Protobuf,
}

impl SchemaType {
    /// The `format` word (`avro`, `protobuf`).
    pub fn name(self) -> &'static str {
        match self {
            SchemaType::Avro => "avro",
            SchemaType::Protobuf => "protobuf",
        }
    }
}

/// How a schema'd payload is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SchemaEncoding {
    /// Avro binary (a bare datum: no container file, no single-object header) or the protobuf
    /// wire format.
    #[default]
    Binary,
    /// Avro's JSON encoding, or the proto3 JSON mapping.
    Json,
}

impl SchemaEncoding {
    /// The option word (`binary`, `json`).
    pub fn name(self) -> &'static str {
        match self {
            SchemaEncoding::Binary => "binary",
            SchemaEncoding::Json => "json",
        }
    }
}

/// A schema definition, its language and its encoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadSchema {
    /// The language.
    pub kind: SchemaType,
    /// The definition: Avro JSON, or `.proto` source.
    pub definition: String,
    /// The wire encoding.
    pub encoding: SchemaEncoding,
    /// Where the definition came from, for error messages (`option 'schema'`, a file, a topic's
    /// schema and revision).
    pub origin: String,
}

/// A schema kept in an object store (`gs://`, `s3://`, `http(s)://`, or any store the session
/// registers), read when a statement starts, through the session's object store registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaLocation {
    /// The language.
    pub kind: SchemaType,
    /// The wire encoding.
    pub encoding: SchemaEncoding,
    /// The object's URL.
    pub url: String,
}

impl SchemaLocation {
    /// The error of a batch that reaches a mapping whose schema was never read: the writer
    /// reads it when a statement starts, before the first batch, so this is an internal fault.
    pub fn unread(&self) -> crate::error::Error {
        crate::error::Error::invalid(
            "schema_location",
            self.url.clone(),
            "internal: the schema was not read before the first batch",
        )
    }

    /// Reads the schema from the store registered for the URL in `runtime` (a default runtime,
    /// which knows local files only, when there is none). Errors name `schema_location`.
    pub async fn read(
        &self,
        runtime: Option<&std::sync::Arc<datafusion::execution::runtime_env::RuntimeEnv>>,
    ) -> Result<PayloadSchema> {
        use datafusion::execution::object_store::ObjectStoreUrl;
        use datafusion::object_store::ObjectStoreExt as _;
        use datafusion::object_store::path::Path as StorePath;
        let invalid =
            |rule: String| crate::error::Error::invalid("schema_location", self.url.clone(), rule);
        let url = url::Url::parse(&self.url).map_err(|e| invalid(format!("not a URL: {e}")))?;
        let store_url = ObjectStoreUrl::parse(&url[..url::Position::BeforePath])
            .map_err(|e| invalid(e.to_string()))?;
        let default_runtime;
        let runtime = match runtime {
            Some(r) => r,
            None => {
                default_runtime =
                    std::sync::Arc::new(datafusion::execution::runtime_env::RuntimeEnv::default());
                &default_runtime
            }
        };
        let store = runtime
            .object_store(&store_url)
            .map_err(|e| invalid(format!("no object store is registered for it: {e}")))?;
        let path = StorePath::from_url_path(url.path()).map_err(|e| invalid(e.to_string()))?;
        let bytes = store
            .get(&path)
            .await
            .map_err(|e| invalid(format!("cannot be read: {e}")))?
            .bytes()
            .await
            .map_err(|e| invalid(format!("cannot be read: {e}")))?;
        let definition = String::from_utf8(bytes.to_vec())
            .map_err(|_| invalid("the schema is not UTF-8 text".into()))?;
        Ok(PayloadSchema {
            kind: self.kind,
            definition,
            encoding: self.encoding,
            origin: format!("schema_location '{}'", self.url),
        })
    }
}

/// One row's payload, or the reason the schema refuses the row (naming the field, never a value).
pub type RowPayload = std::result::Result<Vec<u8>, String>;

/// A row encoder for a [`PayloadSchema`], checked against a table's payload columns.
#[derive(Debug, Clone)]
pub enum SchemaRowEncoder {
    /// Avro.
    Avro(AvroRowEncoder),
    /// Protobuf.
    Protobuf(ProtoRowEncoder),
}

impl SchemaRowEncoder {
    /// Compiles `schema` and binds its fields to the `columns` of `table` by name. An
    /// [`Error::Schema`](crate::error::Error::Schema) names the column, the field and both types
    /// (a column the schema lacks, a required field without a column, a type that cannot
    /// convert); an invalid definition is an error naming where it came from.
    pub fn new(schema: &PayloadSchema, table: &Schema, columns: &[usize]) -> Result<Self> {
        Ok(match schema.kind {
            SchemaType::Avro => {
                SchemaRowEncoder::Avro(AvroRowEncoder::new(schema, table, columns)?)
            }
            SchemaType::Protobuf => {
                SchemaRowEncoder::Protobuf(ProtoRowEncoder::new(schema, table, columns)?)
            }
        })
    }

    /// Encodes every row of `batch` (which has the table's schema): one entry per row, in order.
    /// The outer error is returned only when the batch does not match the table.
    pub fn encode_batch(&self, batch: &RecordBatch) -> Result<Vec<RowPayload>> {
        match self {
            SchemaRowEncoder::Avro(a) => a.encode_batch(batch),
            SchemaRowEncoder::Protobuf(p) => p.encode_batch(batch),
        }
    }
}

/// A payload decoder for a [`PayloadSchema`], checked against a table's payload columns: the
/// reading side of [`SchemaRowEncoder`], used by the Pub/Sub source. Payloads decode straight
/// into the columns' Arrow arrays (ADR 0065).
#[derive(Debug, Clone)]
pub enum SchemaRowDecoder {
    /// Avro.
    Avro(AvroRowDecoder),
    /// Protobuf.
    Protobuf(ProtoRowDecoder),
}

impl SchemaRowDecoder {
    /// Compiles `schema` and checks the table's `columns` against its fields by name (a column
    /// the schema lacks, a type that cannot convert: an error naming the column, the field and
    /// both types). Fields without a column are not read.
    pub fn new(schema: &PayloadSchema, table: &Schema, columns: &[usize]) -> Result<Self> {
        if schema.kind == SchemaType::Avro {
            AvroRowDecoder::new(schema, table, columns).map(SchemaRowDecoder::Avro)
        } else {
            ProtoRowDecoder::new(schema, table, columns).map(SchemaRowDecoder::Protobuf)
        }
    }

    /// The names of the schema's top-level fields (an invalid definition is an error naming
    /// where it came from).
    pub fn field_names(schema: &PayloadSchema) -> Result<Vec<String>> {
        match schema.kind {
            SchemaType::Avro => super::avro::record_field_names(schema),
            SchemaType::Protobuf => super::protobuf::message_field_names(schema),
        }
    }

    /// The table columns this decoder fills, in the order it was given them.
    pub fn targets(&self) -> &[arrow::datatypes::FieldRef] {
        match self {
            SchemaRowDecoder::Avro(a) => a.targets(),
            SchemaRowDecoder::Protobuf(p) => p.targets(),
        }
    }

    /// Decodes each payload, in the encoding given for it, into the bound columns: the rows
    /// that decode, and why each other one does not (naming the column or the field, never
    /// the data). The outer error is an internal fault only.
    pub fn decode(&self, datas: &[&[u8]], encodings: &[SchemaEncoding]) -> Result<DecodedRows> {
        match self {
            SchemaRowDecoder::Avro(a) => a.decode(datas, encodings),
            SchemaRowDecoder::Protobuf(p) => p.decode(datas, encodings),
        }
    }
}

/// The type of a table column as errors show it.
pub(crate) fn arrow_type_name(data_type: &arrow::datatypes::DataType) -> String {
    data_type.to_string()
}
