//! Shared row encodings (JSON, raw, Avro, Protobuf) used by the connectors that send a payload.
//!
//! - [`json`]: one JSON object per row, over a chosen set of columns, with a documented text
//!   form for every Arrow type a table can hold.
//! - [`raw`]: one string or binary column as the payload, byte for byte, and [`BytesColumn`],
//!   the layout-independent reader of string and binary columns.
//! - [`schema`], [`avro`], [`protobuf`]: a row encoded to match an Avro or Protobuf schema
//!   (binary or JSON encoding), checked against the table once.
//! - [`redact`]: what an error or a log event may show of a value (never a row's value; at most
//!   a URL's scheme, host and port).

pub mod avro;
pub mod json;
pub mod protobuf;
pub mod raw;
pub mod redact;
pub mod schema;

pub use json::{ColumnEncoder, JsonRowEncoder, JsonRows, check_json_type, write_json_str};
pub use raw::{BytesColumn, RawEncoder, is_bytes_type, is_string_type};
