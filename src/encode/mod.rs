//! The formats layer: rows to payloads and payloads to rows, in JSON, raw, Avro and Protobuf,
//! for the connectors that send or read a payload (ADR 0065).
//!
//! Each format holds both directions: the encoder in the format's module and the decoder in
//! its `decode` submodule (`raw` holds both in one file). The decoders give
//! [`rows::DecodedRows`]: the columns of the payloads that decoded, and for each other payload
//! a [`rows::RowFault`] naming the column or the schema, never the data.
//!
//! - [`json`]: one JSON object per row, over a chosen set of columns, with a documented text
//!   form for every Arrow type a table can hold; [`json::decode`] reads such objects back.
//! - [`raw`]: one string or binary column as the payload, byte for byte, and [`BytesColumn`],
//!   the layout-independent reader of string and binary columns.
//! - [`schema`], [`avro`], [`protobuf`]: a row encoded to match an Avro or Protobuf schema
//!   (binary or JSON encoding), checked against the table once; and back: Avro binary datums
//!   are read by `arrow-avro` and Protobuf messages walked by `prost-reflect`, straight into
//!   Arrow arrays that [`conform`] makes into the columns' types.
//! - [`redact`]: what an error or a log event may show of a value (never a row's value; at most
//!   a URL's scheme, host and port).

pub mod avro;
pub mod conform;
pub mod json;
pub mod protobuf;
pub mod raw;
pub mod redact;
pub mod rows;
pub mod schema;

pub use json::{ColumnEncoder, JsonRowEncoder, JsonRows, check_json_type, write_json_str};
pub use raw::{BytesColumn, RawEncoder, is_bytes_type, is_string_type};
