//! Arrow rows to Bigtable row mutations (pure: no I/O).
//!
//! # Which column becomes what
//!
//! | Part of the entry | Source |
//! |---|---|
//! | row key | the `row_key` column, or several joined by `row_key_delimiter` (default `#`): a string as its UTF-8 bytes, a binary value as it is, an integer as its decimal text (`42`, `-7`) so that a composite key stays readable. A null part, or a key that ends up empty or over 4 KiB, refuses the row |
//! | cells | every other column: family `column_family` (default `cf`), qualifier the column name |
//! | cells of a struct column | family = the column's name, one cell per field, qualifier = the field name |
//! | cell timestamp | `timestamp_column` (a `TIMESTAMP` of any unit, or `BIGINT` microseconds), else the writer's clock read once per input batch, never below a version given before (see `ClockVersions`); either way truncated down to a whole millisecond |
//! | table | the fixed table, or per row the `table_column` value (a full name, or a short id in the fixed instance or in the row's `instance_column` value) |
//!
//! The key, timestamp, table and instance columns are not written as cells.
//!
//! # Value encodings
//!
//! | Arrow type | cell value |
//! |---|---|
//! | `Int8`..`Int64`, `UInt8`..`UInt32` | 8 bytes, big-endian two's complement of the value as an `i64` (the format Bigtable's `ReadModifyWriteRow` increment reads) |
//! | `UInt64` | 8 bytes, big-endian unsigned |
//! | `Float16`, `Float32`, `Float64` | 8 bytes, big-endian IEEE 754 double (narrower floats are widened exactly) |
//! | `Boolean` | 1 byte: `0x01` true, `0x00` false |
//! | `Utf8`, `LargeUtf8`, `Utf8View` | the UTF-8 bytes |
//! | `Binary`, `LargeBinary`, `BinaryView`, `FixedSizeBinary` | the bytes as they are |
//! | `Date32` | 8 bytes, big-endian days since 1970-01-01 |
//! | `Date64` | 8 bytes, big-endian milliseconds since 1970-01-01 |
//! | `Time32`, `Time64` | 8 bytes, big-endian count of the column's unit since midnight |
//! | `Timestamp` | 8 bytes, big-endian count of the column's unit since the epoch (UTC; the time zone, if any, is not stored) |
//! | `Duration` | 8 bytes, big-endian count of the column's unit |
//! | `Decimal*`, `Interval` | UTF-8 text: the exact decimal (`123.45`) or the ISO 8601 interval, as [`crate::encode::json`] writes them, without quotes |
//! | `List`, `Map`, a struct nested in a struct column | UTF-8 JSON text ([`crate::encode::json`]) |
//! | `Dictionary` | the encoding of its value type |
//!
//! Union and run-end encoded columns are refused when the table is declared, naming the column.
//!
//! # Nulls
//!
//! `null_handling = 'ignore'` (default) writes nothing for a null value; `'delete'` writes a
//! `DeleteFromColumn` for that family and qualifier (every version of the cell is deleted). A null
//! struct counts as null in each of its fields. A row left with no mutation at all (every cell
//! null under `ignore`) is refused as a serializer rejection: the service refuses an entry
//! without mutations.
//!
//! # Limits
//!
//! Checked before anything is sent; a row that breaks one is an [`Error::Encode`] naming the
//! row, the column and the limit, handled by the failure policy like any serializer rejection.
//! Qualifiers and the number of mutations per entry depend only on the schema, so they are
//! checked once, when the table is declared ([`Error::Schema`]). See the `MAX_*` constants.
//!
//! ```
//! use gcp_sql::connectors::TableOptions;
//! use std::sync::Arc;
//! use arrow::array::{Int64Array, RecordBatch, StringArray};
//! use arrow::datatypes::{DataType, Field, Schema};
//! use gcp_sql::connectors::bigtable::mapping::BigtableMapping;
//! use gcp_sql::connectors::bigtable::options::BigtableSinkOptions;
//! use gcp_sql::options::RawOptions;
//!
//! let raw = RawOptions::from_pairs([
//!     ("table".to_string(), "projects/demo/instances/main/tables/users".to_string()),
//!     ("row_key".to_string(), "id".to_string()),
//! ])?;
//! let options = BigtableSinkOptions::from_raw(None, &raw)?;
//! let schema = Arc::new(Schema::new(vec![
//!     Field::new("id", DataType::Utf8, false),
//!     Field::new("visits", DataType::Int64, true),
//! ]));
//! let mapping = BigtableMapping::new(&options, &schema)?;
//! let batch = RecordBatch::try_new(
//!     schema.clone(),
//!     vec![Arc::new(StringArray::from(vec!["u1"])), Arc::new(Int64Array::from(vec![Some(3)]))],
//! )?;
//! let mut out = Vec::new();
//! mapping.encode_batch_at(&batch, 0, 1_700_000_000_123_456, &mut out)?;
//! let envelope = out.remove(0)?;
//! let entry = envelope.record.to_entry()?;
//! assert_eq!(entry.row_key, b"u1");
//! assert_eq!(entry.mutations.len(), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::buffer::NullBuffer;
use arrow::compute::{can_cast_types, cast};
use arrow::datatypes::{DataType, Int64Type, Schema, TimeUnit, UInt64Type};
use gcloud_sdk::google::bigtable::v2::ReadModifyWriteRule;
use gcloud_sdk::google::bigtable::v2::mutate_rows_request::Entry;
use prost::Message as _;
use prost::encoding::{encode_varint, encoded_len_varint};

use super::names;
use super::options::{
    BigtableSinkOptions, NullHandling, OP_DELETE_VALUES, OP_WRITE_VALUES, WriteMode,
};
use crate::core::{Destination, Envelope};
use crate::encode::json::{ColumnEncoder, check_json_type};
use crate::encode::raw::BytesColumn;
use crate::error::{Error, Result};
use crate::options::names::unknown_column;

/// Longest row key, in bytes. Source: Bigtable quotas and limits ("Row key: 4 KiB").
pub const MAX_ROW_KEY_BYTES: usize = 4 * 1024;
/// Longest column qualifier, in bytes. Source: Bigtable limits ("Column qualifier: 16 KiB").
pub const MAX_QUALIFIER_BYTES: usize = 16 * 1024;
/// Largest cell value, in bytes. Source: Bigtable limits ("Cell value: 100 MiB").
pub const MAX_CELL_VALUE_BYTES: usize = 100 * 1024 * 1024;
/// Largest row written by one entry, in bytes. Source: Bigtable limits ("Row: 256 MiB"); the writer
/// option contract bounds `batch_request_byte_threshold` by it too.
pub const MAX_ENTRY_BYTES: usize = 256 * 1024 * 1024;
/// Most mutations in one `MutateRows` request, all entries together. Source: the
/// `MutateRowsRequest.entries` documentation ("in total the entries can contain at most 100000
/// mutations").
pub const MAX_MUTATIONS_PER_REQUEST: usize = 100_000;
/// Timestamps are written as whole milliseconds: tables default to millisecond granularity,
/// where the service (and the emulator) refuse other values. Source: Bigtable
/// table granularity (`Table.granularity`, MILLIS by default) in the googleapis admin protos;
/// see docs/service_facts.md.
pub const TIMESTAMP_GRANULARITY_MICROS: i64 = 1_000;

// Protobuf field keys (field number << 3 | wire type) of the messages written by hand.
/// `Entry.row_key` (1, length-delimited); also `SetCell.family_name`, `DeleteFromColumn.family_name`
/// and `Mutation.set_cell`.
const KEY_FIELD_1_LEN: u8 = 0x0a;
/// `Entry.mutations` (2, length-delimited); also the qualifier fields and `Mutation.delete_from_column`.
const KEY_FIELD_2_LEN: u8 = 0x12;
/// `SetCell.timestamp_micros` (3, varint).
const KEY_FIELD_3_VARINT: u8 = 0x18;
/// `SetCell.value` (4, length-delimited).
const KEY_FIELD_4_LEN: u8 = 0x22;
/// `MutateRowsRequest.app_profile_id` (3, length-delimited).
const KEY_FIELD_3_LEN: u8 = 0x1a;
/// `ReadModifyWriteRule.increment_amount` (4, varint).
const KEY_FIELD_4_VARINT: u8 = 0x20;
/// One `Entry.mutations` element holding an empty `Mutation.delete_from_row` (field 4).
const DELETE_FROM_ROW_MUTATION: [u8; 4] = [KEY_FIELD_2_LEN, 0x02, KEY_FIELD_4_LEN, 0x00];

/// Which call applies an entry: every kind starts with the row key as field 1, so
/// [`BigtableEntry::row_key`] reads any of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EntryKind {
    /// A `MutateRowsRequest.Entry`, sent in a batched `MutateRows` (upsert, replace, delete).
    #[default]
    Mutate,
    /// A `MutateRowsRequest.Entry` whose mutations are applied by `CheckAndMutateRow` only when
    /// the row has no cell (`write_mode = 'insert_if_absent'`), one call per entry.
    InsertIfAbsent,
    /// The row key (field 1) and `ReadModifyWriteRule`s (field 2, increments), applied by
    /// `ReadModifyWriteRow` (`write_mode = 'increment'`), one call per entry.
    Increment,
}

/// The serialized form of an [`EntryKind::Increment`] entry: the fields of a
/// `ReadModifyWriteRowRequest` that differ per row.
#[derive(Clone, PartialEq, prost::Message)]
pub struct IncrementRow {
    /// The row key.
    #[prost(bytes = "vec", tag = "1")]
    pub row_key: Vec<u8>,
    /// One increment per cell column.
    #[prost(message, repeated, tag = "2")]
    pub rules: Vec<ReadModifyWriteRule>,
}

/// One encoded entry: the serialized `google.bigtable.v2.MutateRowsRequest.Entry` (or
/// [`IncrementRow`]), which call applies it and the input row it came from.
#[derive(Clone, PartialEq, Eq)]
pub struct BigtableEntry {
    row: u64,
    mutations: u32,
    kind: EntryKind,
    encoded: Box<[u8]>,
}

impl std::fmt::Debug for BigtableEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BigtableEntry")
            .field("row", &self.row)
            .field("row_key", &String::from_utf8_lossy(self.row_key()))
            .field("mutations", &self.mutations)
            .field("kind", &self.kind)
            .field("encoded_len", &self.encoded.len())
            .finish()
    }
}

impl BigtableEntry {
    /// Serializes `entry` (for tests and callers that build entries themselves).
    pub fn from_entry(row: u64, entry: &Entry) -> Self {
        BigtableEntry {
            row,
            mutations: u32::try_from(entry.mutations.len()).unwrap_or(u32::MAX),
            kind: EntryKind::Mutate,
            encoded: entry.encode_to_vec().into_boxed_slice(),
        }
    }

    /// The same entry, applied by another call (for tests and callers that build entries).
    pub fn with_kind(mut self, kind: EntryKind) -> Self {
        self.kind = kind;
        self
    }

    /// Which call applies the entry.
    pub fn kind(&self) -> EntryKind {
        self.kind
    }

    /// Decodes an [`EntryKind::Increment`] entry back.
    pub fn to_increment(&self) -> std::result::Result<IncrementRow, prost::DecodeError> {
        IncrementRow::decode(&self.encoded[..])
    }

    /// The input row (counted from 0 within the statement) this entry was encoded from.
    pub fn row(&self) -> u64 {
        self.row
    }

    /// How many mutations the entry carries.
    pub fn mutation_count(&self) -> usize {
        self.mutations as usize
    }

    /// The serialized `Entry`.
    pub fn encoded(&self) -> &[u8] {
        &self.encoded
    }

    /// The row key (read back from the serialized bytes, where it is the first field).
    pub fn row_key(&self) -> &[u8] {
        let bytes = &self.encoded[..];
        if bytes.first() != Some(&KEY_FIELD_1_LEN) {
            return &[];
        }
        let mut rest = &bytes[1..];
        let Ok(len) = prost::encoding::decode_varint(&mut rest) else {
            return &[];
        };
        rest.get(..usize::try_from(len).unwrap_or(usize::MAX))
            .unwrap_or(&[])
    }

    /// The row key as text (UTF-8 when it is, else escaped bytes), for tests and debugging:
    /// a row key is a row's value, so no error or log event shows it.
    pub fn row_key_text(&self) -> String {
        let key = self.row_key();
        match std::str::from_utf8(key) {
            Ok(s) => s.to_string(),
            Err(_) => key.escape_ascii().to_string(),
        }
    }

    /// Decodes the entry back (for tests, logs and the failure policy); for an
    /// [`EntryKind::Increment`] entry see [`to_increment`](Self::to_increment).
    pub fn to_entry(&self) -> std::result::Result<Entry, prost::DecodeError> {
        Entry::decode(&self.encoded[..])
    }
}

/// Bytes an entry of `entry_len` serialized bytes adds to a `MutateRowsRequest` (field key,
/// length prefix and the entry).
pub fn request_entry_len(entry_len: u64) -> u64 {
    1 + encoded_len_varint(entry_len) as u64 + entry_len
}

/// Bytes of a `MutateRowsRequest` for `table` (and `app_profile_id`) with no entries.
pub fn request_base_len(table: &str, app_profile_id: &str) -> u64 {
    let field = |len: usize| {
        if len == 0 {
            0
        } else {
            1 + encoded_len_varint(len as u64) as u64 + len as u64
        }
    };
    field(table.len()) + field(app_profile_id.len())
}

/// Writes a serialized `MutateRowsRequest`: `table_name`, `app_profile_id` and the entries
/// (already serialized) by concatenation.
pub fn write_mutate_rows_request<'a>(
    out: &mut Vec<u8>,
    table: &str,
    app_profile_id: &str,
    entries: impl Iterator<Item = &'a [u8]>,
) {
    put_len_field(out, KEY_FIELD_1_LEN, table.as_bytes());
    for entry in entries {
        put_len_field(out, KEY_FIELD_2_LEN, entry);
    }
    put_len_field(out, KEY_FIELD_3_LEN, app_profile_id.as_bytes());
}

/// A length-delimited field, left out when empty (as proto3 does for default values).
fn put_len_field(out: &mut Vec<u8>, key: u8, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    out.push(key);
    encode_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

fn len_field_size(len: usize) -> usize {
    if len == 0 {
        0
    } else {
        1 + encoded_len_varint(len as u64) + len
    }
}

/// How a value is turned into cell bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Cast to `Int64`; 8 bytes big-endian.
    Int,
    /// `UInt64`; 8 bytes big-endian.
    UInt,
    /// Cast to `Float64`; 8 bytes big-endian IEEE.
    Float,
    /// One byte.
    Bool,
    /// String or binary bytes as they are.
    Bytes,
    /// Text through the JSON encoder.
    Text,
    /// Always null.
    Null,
}

/// The encoding of `dt`, and the type to cast it to first.
fn kind_of(column: &str, dt: &DataType) -> Result<(Kind, Option<DataType>)> {
    use DataType::*;
    Ok(match dt {
        Null => (Kind::Null, None),
        Int64 => (Kind::Int, None),
        Int8 | Int16 | Int32 | UInt8 | UInt16 | UInt32 => (Kind::Int, Some(Int64)),
        UInt64 => (Kind::UInt, None),
        Float64 => (Kind::Float, None),
        Float16 | Float32 => (Kind::Float, Some(Float64)),
        Boolean => (Kind::Bool, None),
        Utf8 | LargeUtf8 | Utf8View | Binary | LargeBinary | BinaryView | FixedSizeBinary(_) => {
            (Kind::Bytes, None)
        }
        Date32 | Date64 | Time32(_) | Time64(_) | Timestamp(_, _) | Duration(_)
            if can_cast_types(dt, &Int64) =>
        {
            (Kind::Int, Some(Int64))
        }
        Dictionary(key, value) if key.is_dictionary_key_type() => {
            let (kind, _) = kind_of(column, value)?;
            (kind, Some(value.as_ref().clone()))
        }
        other => {
            check_json_type(column, other)?;
            (Kind::Text, None)
        }
    })
}

/// One cell the mapping writes per row.
#[derive(Debug, Clone)]
struct CellPlan {
    /// The top-level column.
    column: usize,
    /// The field of a struct column.
    field: Option<usize>,
    /// `family.qualifier`, for messages.
    label: String,
    kind: Kind,
    cast: Option<DataType>,
    /// The serialized `family_name` and `column_qualifier` fields, shared by `SetCell` and
    /// `DeleteFromColumn`.
    prefix: Box<[u8]>,
    /// The family and qualifier, for `AddToCell`.
    family: String,
    qualifier: String,
}

/// Per batch: the table of each (table value, instance value) pair seen, or why it has none.
type TableCache<'a> =
    HashMap<(Option<&'a str>, Option<&'a str>), std::result::Result<Destination, String>>;

/// Where rows go.
#[derive(Debug, Clone)]
enum TablePlan {
    Fixed(Destination),
    PerRow {
        table: (usize, String),
        instance: Option<(usize, String)>,
    },
}

/// A validated mapping from a table schema to Bigtable entries.
#[derive(Debug, Clone)]
pub struct BigtableMapping {
    options: BigtableSinkOptions,
    key: Vec<(usize, String)>,
    delimiter: Vec<u8>,
    cells: Vec<CellPlan>,
    timestamp: Option<(usize, String, Option<TimeUnit>)>,
    tables: TablePlan,
    null_handling: NullHandling,
    families: Vec<String>,
    /// The operation column (`op_column`): its index and name.
    op: Option<(usize, String)>,
    /// How rows are applied (`write_mode`).
    write_mode: WriteMode,
    /// The highest clock version given to a cell so far (microseconds), shared by the
    /// statement's writers: see [`ClockVersions`].
    last_clock: Arc<AtomicI64>,
}

/// The cell versions of one batch without a timestamp column.
///
/// Bigtable keeps the cell with the highest version, not the last one written, and two
/// requests in flight at once may apply in either order. So that the last row of a key in
/// input order is the one a read returns, versions only grow: a batch starts one millisecond
/// after the highest version given before (or at the clock, if later), and a row key seen
/// again within the batch gets the next millisecond after its previous row's.
struct ClockVersions {
    base: i64,
    seen: HashMap<u64, i64>,
    highest: i64,
}

impl ClockVersions {
    fn new(base: i64) -> Self {
        ClockVersions {
            base,
            seen: HashMap::new(),
            highest: base,
        }
    }

    /// The version of the next row with row key `key`.
    fn version_of(&mut self, key: &[u8]) -> i64 {
        use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
        // Two keys with one hash share a counter: they only get later versions, never an
        // earlier one than a row before them of the same key.
        let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one(key);
        let repeats = self.seen.entry(hash).or_insert(0);
        let version = self.base + *repeats * TIMESTAMP_GRANULARITY_MICROS;
        *repeats += 1;
        self.highest = self.highest.max(version);
        version
    }
}

fn index_of(schema: &Schema, name: &str, option: &str) -> Result<usize> {
    schema
        .index_of(name)
        .map_err(|_| unknown_column(schema, name, option))
}

fn check_qualifier(label: &str, qualifier: &str) -> Result<()> {
    if qualifier.len() > MAX_QUALIFIER_BYTES {
        return Err(Error::schema(
            label,
            format!(
                "the qualifier is {} bytes; Bigtable allows at most {MAX_QUALIFIER_BYTES} (16 KiB)",
                qualifier.len()
            ),
        ));
    }
    Ok(())
}

fn cell_prefix(family: &str, qualifier: &str) -> Box<[u8]> {
    let mut prefix = Vec::with_capacity(family.len() + qualifier.len() + 8);
    put_len_field(&mut prefix, KEY_FIELD_1_LEN, family.as_bytes());
    put_len_field(&mut prefix, KEY_FIELD_2_LEN, qualifier.as_bytes());
    prefix.into_boxed_slice()
}

impl BigtableMapping {
    /// The columns that identify a row: the instance and table columns (when the table is per
    /// row) and the row key columns. Rows equal in these write the same Bigtable row.
    pub fn row_identity_columns(&self) -> Vec<String> {
        let mut columns = Vec::new();
        if let TablePlan::PerRow { table, instance } = &self.tables {
            columns.extend(instance.iter().map(|(_, name)| name.clone()));
            columns.push(table.1.clone());
        }
        columns.extend(self.key.iter().map(|(_, name)| name.clone()));
        columns
    }

    /// Validates the mapping options against the table `schema`, once. Errors name the column
    /// and the rule ([`Error::Schema`]).
    pub fn new(options: &BigtableSinkOptions, schema: &Schema) -> Result<Self> {
        options.validate_schema(schema)?;
        let m = &options.mapping;
        let mut key = Vec::with_capacity(m.row_key.len());
        for c in &m.row_key {
            key.push((index_of(schema, c, "row_key")?, c.clone()));
        }
        let timestamp = match &m.timestamp_column {
            Some(c) => {
                let i = index_of(schema, c, "timestamp_column")?;
                let unit = match schema.field(i).data_type() {
                    DataType::Timestamp(unit, _) => Some(*unit),
                    _ => None,
                };
                Some((i, c.clone(), unit))
            }
            None => None,
        };
        let tables = match (&options.table, &m.table_column) {
            (Some(t), _) => TablePlan::Fixed(Destination::from(t.as_str())),
            (None, Some(c)) => TablePlan::PerRow {
                table: (index_of(schema, c, "table_column")?, c.clone()),
                instance: match &m.instance_column {
                    Some(ic) => Some((index_of(schema, ic, "instance_column")?, ic.clone())),
                    None => None,
                },
            },
            (None, None) => {
                return Err(Error::MissingOption {
                    option: "table".into(),
                    rule: "a Bigtable sink needs a table or a 'table_column'".into(),
                });
            }
        };
        let skip = m.non_cell_columns();
        let mut cells = Vec::new();
        let mut families: Vec<String> = Vec::new();
        let mut seen: HashSet<(String, String)> = HashSet::new();
        let add_family = |f: &str, families: &mut Vec<String>| {
            if !families.iter().any(|x| x == f) {
                families.push(f.to_string());
            }
        };
        for (i, field) in schema.fields().iter().enumerate() {
            let name = field.name();
            if skip.contains(&name.as_str()) {
                continue;
            }
            if let DataType::Struct(children) = field.data_type() {
                names::check_family_id(name).map_err(|rule| {
                    Error::schema(
                        name,
                        format!("a struct column becomes a column family of its name: {rule}"),
                    )
                })?;
                if children.is_empty() {
                    return Err(Error::schema(
                        name,
                        "a struct column with no fields writes no cell",
                    ));
                }
                add_family(name, &mut families);
                for (j, child) in children.iter().enumerate() {
                    let label = format!("{name}.{}", child.name());
                    check_qualifier(&label, child.name())?;
                    let (kind, cast) = kind_of(&label, child.data_type())?;
                    if !seen.insert((name.clone(), child.name().clone())) {
                        return Err(Error::schema(
                            &label,
                            "two columns write the same family and qualifier",
                        ));
                    }
                    cells.push(CellPlan {
                        column: i,
                        field: Some(j),
                        prefix: cell_prefix(name, child.name()),
                        family: name.clone(),
                        qualifier: child.name().clone(),
                        label,
                        kind,
                        cast,
                    });
                }
            } else {
                let family = &m.column_family;
                let label = format!("{family}.{name}");
                check_qualifier(name, name)?;
                let (kind, cast) = kind_of(name, field.data_type())?;
                if !seen.insert((family.clone(), name.clone())) {
                    return Err(Error::schema(
                        name,
                        format!(
                            "family '{family}' and qualifier '{name}' are also written by a struct column named '{family}'"
                        ),
                    ));
                }
                add_family(family, &mut families);
                cells.push(CellPlan {
                    column: i,
                    field: None,
                    prefix: cell_prefix(family, name),
                    family: family.clone(),
                    qualifier: name.clone(),
                    label,
                    kind,
                    cast,
                });
            }
        }
        if cells.len() > MAX_MUTATIONS_PER_REQUEST {
            return Err(Error::schema(
                m.row_key.join(","),
                format!(
                    "a row would write {} cells; a MutateRows request holds at most {MAX_MUTATIONS_PER_REQUEST} mutations",
                    cells.len()
                ),
            ));
        }
        Ok(BigtableMapping {
            options: options.clone(),
            key,
            delimiter: m.row_key_delimiter.as_bytes().to_vec(),
            cells,
            timestamp,
            tables,
            null_handling: m.null_handling,
            families,
            op: match &m.op_column {
                Some(c) => Some((index_of(schema, c, "op_column")?, c.clone())),
                None => None,
            },
            write_mode: m.write_mode,
            last_clock: Arc::new(AtomicI64::new(0)),
        })
    }

    /// The column families the mapping writes to (what an auto-created table gets), in schema
    /// order.
    pub fn families(&self) -> &[String] {
        &self.families
    }

    /// The most mutations one entry can carry: one per cell column (struct fields included),
    /// plus the `DeleteFromRow` of `replace_row`.
    pub fn max_mutations_per_entry(&self) -> usize {
        let delete = usize::from(self.write_mode == WriteMode::ReplaceRow);
        (self.cells.len() + delete).max(1)
    }

    /// Whether the rows of a key must be applied one at a time, in input order, whatever
    /// their versions: a whole-row delete, a replacement or a check removes or reads cells of
    /// every version, so two such rows of a key in flight at once could land in either order.
    fn rows_of_a_key_in_order(&self) -> bool {
        self.op.is_some()
            || matches!(
                self.write_mode,
                WriteMode::ReplaceRow | WriteMode::InsertIfAbsent
            )
    }

    /// The fixed table, when the sink has one.
    pub fn fixed_table(&self) -> Option<&Destination> {
        match &self.tables {
            TablePlan::Fixed(t) => Some(t),
            TablePlan::PerRow { .. } => None,
        }
    }

    /// Encodes every row of `batch` into `out`, with cell timestamps from the timestamp column
    /// or, without one, from the system clock read once now. See
    /// [`encode_batch_at`](Self::encode_batch_at).
    pub fn encode_batch(
        &self,
        batch: &RecordBatch,
        first_row_index: u64,
        out: &mut Vec<std::result::Result<Envelope<BigtableEntry>, Error>>,
    ) -> Result<()> {
        if self.timestamp.is_some() {
            return self.encode_batch_at(batch, first_row_index, clock_micros(), out);
        }
        let now =
            clock_micros().div_euclid(TIMESTAMP_GRANULARITY_MICROS) * TIMESTAMP_GRANULARITY_MICROS;
        let last = self.last_clock.load(Ordering::Acquire);
        let base = now.max(last.saturating_add(TIMESTAMP_GRANULARITY_MICROS));
        let highest = self.encode_versions(batch, first_row_index, base, out)?;
        self.last_clock.fetch_max(highest, Ordering::AcqRel);
        Ok(())
    }

    /// Encodes every row of `batch` into `out`, one result per row in row order: the envelope,
    /// or an [`Error::Encode`] whose `row` is `first_row_index` plus the row's index in the batch.
    /// `now_micros` is the client clock used when there is no timestamp column (it is truncated
    /// to a whole millisecond).
    ///
    /// A bad row never affects the others. The outer error is returned only when `batch` does
    /// not have the schema the mapping was built for.
    pub fn encode_batch_at(
        &self,
        batch: &RecordBatch,
        first_row_index: u64,
        now_micros: i64,
        out: &mut Vec<std::result::Result<Envelope<BigtableEntry>, Error>>,
    ) -> Result<()> {
        let clock =
            now_micros.div_euclid(TIMESTAMP_GRANULARITY_MICROS) * TIMESTAMP_GRANULARITY_MICROS;
        self.encode_versions(batch, first_row_index, clock, out)
            .map(|_| ())
    }

    /// [`encode_batch_at`](Self::encode_batch_at) from clock version `clock` (a whole
    /// millisecond), a row key repeated in the batch getting the next millisecond each time
    /// (see [`ClockVersions`]); returns the highest clock version given.
    fn encode_versions(
        &self,
        batch: &RecordBatch,
        first_row_index: u64,
        clock: i64,
        out: &mut Vec<std::result::Result<Envelope<BigtableEntry>, Error>>,
    ) -> Result<i64> {
        let prepared = self.prepare(batch)?;
        let bound = Bound::new(self, &prepared)?;
        let mut versions = self.timestamp.is_none().then(|| ClockVersions::new(clock));
        let mut scratch = Scratch::default();
        let mut destinations: TableCache<'_> = HashMap::new();
        out.reserve(batch.num_rows());
        for row in 0..batch.num_rows() {
            let row_index = first_row_index + row as u64;
            let encoded = self
                .row_destination(&bound, row, &mut destinations)
                .and_then(|destination| {
                    // A delete row needs only its key: a null timestamp does not refuse it.
                    let ts =
                        self.row_timestamp(&bound, row, clock).or_else(|reason| {
                            match &bound.op {
                                Some(op) if self.row_deletes(op, row) == Ok(true) => Ok(clock),
                                _ => Err(reason),
                            }
                        })?;
                    let (record, bytes) = self.encode_row(
                        &bound,
                        row,
                        row_index,
                        ts,
                        versions.as_mut(),
                        &mut scratch,
                    )?;
                    // With data versions, two rows of a key may write the same cells at the
                    // same version: only one of them in flight at a time keeps the last row
                    // the one a read sees (ADR 0031). Clock versions already order them.
                    let serial_key = if self.rows_of_a_key_in_order() {
                        Some(Arc::from(record.row_key()))
                    } else {
                        self.timestamp
                            .is_some()
                            .then(|| self.serial_key(record.row_key(), ts))
                    };
                    Ok(Envelope {
                        record,
                        bytes,
                        destination,
                        sequence_key: None,
                        serial_key,
                        handle: None,
                    })
                });
            out.push(encoded.map_err(|reason| Error::Encode {
                row: row_index,
                reason,
            }));
        }
        Ok(versions.map_or(clock, |v| v.highest))
    }

    /// Casts the columns that need it (owned arrays the bound views borrow from).
    fn prepare(&self, batch: &RecordBatch) -> Result<Prepared> {
        let column = |i: usize, name: &str| -> Result<ArrayRef> {
            batch.columns().get(i).cloned().ok_or_else(|| {
                Error::schema(name, "the batch has fewer columns than the table schema")
            })
        };
        // Dictionary-encoded strings are decoded for byte access.
        let decoded = |array: ArrayRef| -> Result<ArrayRef> {
            match array.data_type() {
                DataType::Dictionary(_, value) => Ok(cast(&array, value)?),
                _ => Ok(array),
            }
        };
        let mut key = Vec::with_capacity(self.key.len());
        for (i, name) in &self.key {
            let array = decoded(column(*i, name)?)?;
            // Integer parts are written as decimal text from an i64 (or u64) view.
            let array = match array.data_type() {
                DataType::Int64 | DataType::UInt64 => array,
                dt if dt.is_integer() => cast(&array, &DataType::Int64)?,
                _ => array,
            };
            key.push(array);
        }
        let mut cells = Vec::with_capacity(self.cells.len());
        for plan in &self.cells {
            let top = column(plan.column, &plan.label)?;
            let (array, parent_nulls) = match plan.field {
                Some(j) => {
                    let s = top
                        .as_struct_opt()
                        .ok_or_else(|| Error::schema(&plan.label, "the column is not a struct"))?;
                    let child = s.columns().get(j).cloned().ok_or_else(|| {
                        Error::schema(&plan.label, "the struct has fewer fields than the schema")
                    })?;
                    (child, s.logical_nulls())
                }
                None => (top, None),
            };
            let array = match &plan.cast {
                Some(to) => cast(&array, to)?,
                None => array,
            };
            cells.push((array, parent_nulls));
        }
        let timestamp = match &self.timestamp {
            Some((i, name, _)) => Some(cast(&column(*i, name)?, &DataType::Int64)?),
            None => None,
        };
        let (table, instance) = match &self.tables {
            TablePlan::Fixed(_) => (None, None),
            TablePlan::PerRow { table, instance } => (
                Some(decoded(column(table.0, &table.1)?)?),
                match instance {
                    Some((i, name)) => Some(decoded(column(*i, name)?)?),
                    None => None,
                },
            ),
        };
        let op = match &self.op {
            Some((i, name)) => Some(decoded(column(*i, name)?)?),
            None => None,
        };
        Ok(Prepared {
            op,
            key,
            cells,
            timestamp,
            table,
            instance,
        })
    }

    fn row_destination<'a>(
        &self,
        bound: &Bound<'a>,
        row: usize,
        cache: &mut TableCache<'a>,
    ) -> std::result::Result<Destination, String> {
        let (table_column, instance_column) = match &self.tables {
            TablePlan::Fixed(t) => return Ok(t.clone()),
            TablePlan::PerRow { table, instance } => (&table.1, instance.as_ref().map(|i| &i.1)),
        };
        let table = bound.table.as_ref().and_then(|c| c.str_value(row));
        let instance = bound.instance.as_ref().and_then(|c| c.str_value(row));
        cache
            .entry((table, instance))
            .or_insert_with(|| {
                // The rule never repeats the row's values: a name that breaks it is not a
                // destination yet, and may be anything.
                self.options
                    .resolve_table(table, instance)
                    .map(|t| Destination::from(t.as_str()))
                    .map_err(|rule| {
                        let columns = match instance_column {
                            Some(i) => format!("columns '{table_column}' and '{i}'"),
                            None => format!("column '{table_column}'"),
                        };
                        format!("the table named by {columns}: {rule}")
                    })
            })
            .clone()
    }

    /// The key under which a writer keeps one record in flight when the data gives the
    /// versions (ADR 0031). Set cells of different versions never overwrite each other, so
    /// under `null_handling = 'ignore'` only rows of a key at one timestamp conflict: the key is
    /// the row key followed by the 8 bytes of the version (the version has a fixed length, so
    /// two pairs never make the same key). A `DeleteFromColumn` removes every version of a
    /// cell, so under `'delete'` any two rows of a key conflict and the key is the row key.
    fn serial_key(&self, row_key: &[u8], version_micros: i64) -> Arc<[u8]> {
        if self.null_handling == NullHandling::Delete {
            return Arc::from(row_key);
        }
        let mut key = Vec::with_capacity(row_key.len() + 8);
        key.extend_from_slice(row_key);
        key.extend_from_slice(&version_micros.to_be_bytes());
        Arc::from(key)
    }

    /// Whether the row's `op_column` value deletes it; an error (naming the column, never the
    /// value) when the value is null or names no operation.
    fn row_deletes(&self, op: &BytesColumn<'_>, row: usize) -> std::result::Result<bool, String> {
        let name = self.op.as_ref().map_or("op_column", |(_, n)| n.as_str());
        let Some(value) = op.value(row) else {
            return Err(format!(
                "op_column '{name}' is null; expected one of {}",
                op_values_text()
            ));
        };
        let value = value.trim_ascii();
        let is = |list: &[&str]| {
            list.iter()
                .any(|v| value.eq_ignore_ascii_case(v.as_bytes()))
        };
        if is(OP_DELETE_VALUES) {
            Ok(true)
        } else if is(OP_WRITE_VALUES) {
            Ok(false)
        } else {
            Err(format!(
                "op_column '{name}' holds a value that names no operation; expected one of {}",
                op_values_text()
            ))
        }
    }

    fn row_timestamp(
        &self,
        bound: &Bound<'_>,
        row: usize,
        clock: i64,
    ) -> std::result::Result<i64, String> {
        let (Some((_, name, unit)), Some(values)) = (&self.timestamp, bound.timestamp) else {
            return Ok(clock);
        };
        if values.is_null(row) {
            return Err(format!(
                "timestamp column '{name}' is null; every cell needs an explicit version"
            ));
        }
        let v = values.value(row);
        let micros = match unit {
            Some(TimeUnit::Second) => v.checked_mul(1_000_000),
            Some(TimeUnit::Millisecond) => v.checked_mul(1_000),
            Some(TimeUnit::Microsecond) | None => Some(v),
            Some(TimeUnit::Nanosecond) => Some(v.div_euclid(1_000)),
        };
        match micros {
            Some(m) if m >= 0 => {
                Ok(m.div_euclid(TIMESTAMP_GRANULARITY_MICROS) * TIMESTAMP_GRANULARITY_MICROS)
            }
            Some(_) => Err(format!(
                "timestamp column '{name}' is before 1970-01-01; Bigtable cell versions cannot be negative"
            )),
            None => Err(format!(
                "timestamp column '{name}' does not fit in microseconds since the epoch"
            )),
        }
    }

    fn encode_row(
        &self,
        bound: &Bound<'_>,
        row: usize,
        row_index: u64,
        timestamp: i64,
        versions: Option<&mut ClockVersions>,
        scratch: &mut Scratch,
    ) -> std::result::Result<(BigtableEntry, u64), String> {
        // Row key.
        scratch.key.clear();
        for (n, (part, (_, name))) in bound.key.iter().zip(&self.key).enumerate() {
            if n > 0 {
                scratch.key.extend_from_slice(&self.delimiter);
            }
            if !part.append(row, &mut scratch.key) {
                return Err(format!("row key column '{name}' is null"));
            }
        }
        if scratch.key.is_empty() {
            return Err("the row key is empty; Bigtable refuses empty row keys".into());
        }
        if scratch.key.len() > MAX_ROW_KEY_BYTES {
            return Err(format!(
                "the row key is {} bytes; Bigtable allows at most {MAX_ROW_KEY_BYTES} (4 KiB)",
                scratch.key.len()
            ));
        }
        let timestamp = versions.map_or(timestamp, |v| v.version_of(&scratch.key));

        // Mutations.
        scratch.body.clear();
        let mut mutations = 0u32;
        let delete = match &bound.op {
            Some(op) => self.row_deletes(op, row)?,
            None => false,
        };
        if delete || self.write_mode == WriteMode::ReplaceRow {
            scratch.body.extend_from_slice(&DELETE_FROM_ROW_MUTATION);
            mutations += 1;
        }
        let kind = match self.write_mode {
            WriteMode::Upsert | WriteMode::ReplaceRow | WriteMode::AddToCell => EntryKind::Mutate,
            WriteMode::InsertIfAbsent => EntryKind::InsertIfAbsent,
            WriteMode::Increment => EntryKind::Increment,
        };
        // A delete row writes no cell: only its key matters.
        let cells = if delete { &[][..] } else { &bound.cells[..] };
        for (cell, plan) in cells.iter().zip(&self.cells) {
            scratch.value.clear();
            let present = cell.append(row, &mut scratch.value);
            // After a replacement's DeleteFromRow a null cell is already gone.
            let delete = !present
                && self.null_handling == NullHandling::Delete
                && self.write_mode != WriteMode::ReplaceRow;
            if !present && !delete {
                continue;
            }
            if scratch.value.len() > MAX_CELL_VALUE_BYTES {
                return Err(format!(
                    "column '{}': the value is {} bytes; a Bigtable cell holds at most {MAX_CELL_VALUE_BYTES} (100 MiB)",
                    plan.label,
                    scratch.value.len()
                ));
            }
            if kind == EntryKind::Increment {
                write_increment(&mut scratch.body, plan, &scratch.value);
            } else if self.write_mode == WriteMode::AddToCell {
                // Adds of one version merge into one cell: the data's version, else 0.
                let version = if self.timestamp.is_some() {
                    timestamp
                } else {
                    0
                };
                write_add_to_cell(&mut scratch.body, plan, version, &scratch.value);
            } else {
                write_mutation(&mut scratch.body, plan, delete, timestamp, &scratch.value);
            }
            mutations += 1;
        }
        if mutations == 0 {
            return Err(
                "the row writes no cell (every cell column is null and null_handling is 'ignore'); \
                 Bigtable refuses an entry without mutations"
                    .into(),
            );
        }
        let size = len_field_size(scratch.key.len()) + scratch.body.len();
        if size > MAX_ENTRY_BYTES {
            return Err(format!(
                "the row's mutations take {size} bytes; a Bigtable row holds at most {MAX_ENTRY_BYTES} (256 MiB)"
            ));
        }
        let mut encoded = Vec::with_capacity(size);
        put_len_field(&mut encoded, KEY_FIELD_1_LEN, &scratch.key);
        encoded.extend_from_slice(&scratch.body);
        let record = BigtableEntry {
            row: row_index,
            mutations,
            // A delete row is a plain mutation in every mode that allows `op_column`.
            kind: if delete { EntryKind::Mutate } else { kind },
            encoded: encoded.into_boxed_slice(),
        };
        let bytes = record.encoded.len() as u64;
        Ok((record, bytes))
    }
}

/// Appends one `ReadModifyWriteRule` (field 2 of an [`IncrementRow`]) adding the 8-byte
/// big-endian integer `value` to the cell of `plan`.
fn write_increment(out: &mut Vec<u8>, plan: &CellPlan, value: &[u8]) {
    let amount = value.try_into().map(i64::from_be_bytes).unwrap_or_default();
    // ReadModifyWriteRule { family (1), qualifier (2), increment_amount (4) }
    let inner = plan.prefix.len() + 1 + encoded_len_varint(amount as u64);
    out.push(KEY_FIELD_2_LEN);
    encode_varint(inner as u64, out);
    out.extend_from_slice(&plan.prefix);
    out.push(KEY_FIELD_4_VARINT);
    encode_varint(amount as u64, out);
}

/// Appends one `Entry.mutations` element: an `AddToCell` adding the 8-byte big-endian integer
/// `value` to the cell of `plan` at version `timestamp`.
fn write_add_to_cell(out: &mut Vec<u8>, plan: &CellPlan, timestamp: i64, value: &[u8]) {
    use gcloud_sdk::google::bigtable::v2::mutation::{self, AddToCell};
    use gcloud_sdk::google::bigtable::v2::{Mutation, Value, value::Kind};
    let amount = value.try_into().map(i64::from_be_bytes).unwrap_or_default();
    let value = |kind| {
        Some(Value {
            kind: Some(kind),
            ..Default::default()
        })
    };
    let m = Mutation {
        mutation: Some(mutation::Mutation::AddToCell(AddToCell {
            family_name: plan.family.clone(),
            column_qualifier: value(Kind::RawValue(plan.qualifier.as_bytes().to_vec())),
            timestamp: value(Kind::RawTimestampMicros(timestamp)),
            input: value(Kind::IntValue(amount)),
        })),
        ..Default::default()
    };
    put_len_field(out, KEY_FIELD_2_LEN, &m.encode_to_vec());
}

/// Appends one `Entry.mutations` element: a `SetCell` or a `DeleteFromColumn`.
fn write_mutation(out: &mut Vec<u8>, plan: &CellPlan, delete: bool, timestamp: i64, value: &[u8]) {
    if delete {
        // Mutation { delete_from_column (2): DeleteFromColumn { family (1), qualifier (2) } }
        write_mutation_head(out, KEY_FIELD_2_LEN, plan.prefix.len(), &plan.prefix);
        return;
    }
    // Mutation { set_cell (1): SetCell { family (1), qualifier (2), timestamp_micros (3), value (4) } }
    let ts_len = if timestamp == 0 {
        0
    } else {
        1 + encoded_len_varint(timestamp as u64)
    };
    let inner = plan.prefix.len() + ts_len + len_field_size(value.len());
    write_mutation_head(out, KEY_FIELD_1_LEN, inner, &plan.prefix);
    if timestamp != 0 {
        out.push(KEY_FIELD_3_VARINT);
        encode_varint(timestamp as u64, out);
    }
    put_len_field(out, KEY_FIELD_4_LEN, value);
}

/// Appends the start of one `Entry.mutations` element: the `Mutation` around a `kind` field
/// (the key of `set_cell` or `delete_from_column`) of `inner` bytes, and the first of them, the
/// cell's family and qualifier fields (`prefix`).
fn write_mutation_head(out: &mut Vec<u8>, kind: u8, inner: usize, prefix: &[u8]) {
    let mutation = 1 + encoded_len_varint(inner as u64) + inner;
    out.push(KEY_FIELD_2_LEN);
    encode_varint(mutation as u64, out);
    out.push(kind);
    encode_varint(inner as u64, out);
    out.extend_from_slice(prefix);
}

/// The accepted `op_column` values, for messages.
fn op_values_text() -> String {
    OP_WRITE_VALUES
        .iter()
        .chain(OP_DELETE_VALUES)
        .map(|v| format!("'{v}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Microseconds since the epoch by the system clock.
fn clock_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[derive(Default)]
struct Scratch {
    key: Vec<u8>,
    body: Vec<u8>,
    value: Vec<u8>,
}

/// The owned (cast) arrays of one batch.
struct Prepared {
    op: Option<ArrayRef>,
    key: Vec<ArrayRef>,
    cells: Vec<(ArrayRef, Option<NullBuffer>)>,
    timestamp: Option<ArrayRef>,
    table: Option<ArrayRef>,
    instance: Option<ArrayRef>,
}

/// One row-key part of one batch.
enum KeyPart<'a> {
    Bytes(BytesColumn<'a>),
    Int(&'a arrow::array::Int64Array),
    UInt(&'a arrow::array::UInt64Array),
}

impl KeyPart<'_> {
    /// Appends the part's bytes; `false` when it is null.
    fn append(&self, row: usize, out: &mut Vec<u8>) -> bool {
        match self {
            KeyPart::Bytes(c) => match c.value(row) {
                Some(v) => {
                    out.extend_from_slice(v);
                    true
                }
                None => false,
            },
            KeyPart::Int(a) => append_decimal(a, row, out),
            KeyPart::UInt(a) => append_decimal(a, row, out),
        }
    }
}

/// One cell column of one batch.
struct Cell<'a> {
    parent_nulls: Option<&'a NullBuffer>,
    values: CellValues<'a>,
}

enum CellValues<'a> {
    Int(&'a arrow::array::Int64Array),
    UInt(&'a arrow::array::UInt64Array),
    Float(&'a arrow::array::Float64Array),
    Bool(&'a arrow::array::BooleanArray),
    Bytes(BytesColumn<'a>),
    /// The JSON encoder needs `&mut self`; a cell is encoded by one thread at a time.
    Text(std::cell::RefCell<ColumnEncoder<'a>>),
    Null,
}

impl Cell<'_> {
    /// Appends the cell value; `false` when it is null.
    fn append(&self, row: usize, out: &mut Vec<u8>) -> bool {
        if self.parent_nulls.is_some_and(|n| n.is_null(row)) {
            return false;
        }
        match &self.values {
            CellValues::Int(a) => append_be_bytes(a, row, out, i64::to_be_bytes),
            CellValues::UInt(a) => append_be_bytes(a, row, out, u64::to_be_bytes),
            CellValues::Float(a) => append_be_bytes(a, row, out, f64::to_be_bytes),
            CellValues::Bool(a) => {
                if a.is_null(row) {
                    return false;
                }
                out.push(u8::from(a.value(row)));
                true
            }
            CellValues::Bytes(c) => match c.value(row) {
                Some(v) => {
                    out.extend_from_slice(v);
                    true
                }
                None => false,
            },
            CellValues::Text(e) => e.borrow_mut().write_text(row, out),
            CellValues::Null => false,
        }
    }
}

/// `array` as the primitive array of `T`; else an error naming `column` and saying it expected
/// `what` (`an Int64`) array.
fn primitive<'a, T: arrow::datatypes::ArrowPrimitiveType>(
    array: &'a ArrayRef,
    column: &str,
    what: &str,
) -> Result<&'a arrow::array::PrimitiveArray<T>> {
    array
        .as_primitive_opt::<T>()
        .ok_or_else(|| Error::schema(column, format!("expected {what} array")))
}

/// Appends the value of `a` at `row` in decimal digits; `false` when it is null.
fn append_decimal<T: arrow::datatypes::ArrowPrimitiveType>(
    a: &arrow::array::PrimitiveArray<T>,
    row: usize,
    out: &mut Vec<u8>,
) -> bool
where
    T::Native: itoa::Integer,
{
    if a.is_null(row) {
        return false;
    }
    out.extend_from_slice(itoa::Buffer::new().format(a.value(row)).as_bytes());
    true
}

/// Appends the value of `a` at `row` as the 8 bytes `be_bytes` gives (big-endian); `false`
/// when it is null.
fn append_be_bytes<T: arrow::datatypes::ArrowPrimitiveType>(
    a: &arrow::array::PrimitiveArray<T>,
    row: usize,
    out: &mut Vec<u8>,
    be_bytes: fn(T::Native) -> [u8; 8],
) -> bool {
    if a.is_null(row) {
        return false;
    }
    out.extend_from_slice(&be_bytes(a.value(row)));
    true
}

/// The views of one batch the rows are encoded from.
struct Bound<'a> {
    op: Option<BytesColumn<'a>>,
    key: Vec<KeyPart<'a>>,
    cells: Vec<Cell<'a>>,
    timestamp: Option<&'a arrow::array::Int64Array>,
    table: Option<BytesColumn<'a>>,
    instance: Option<BytesColumn<'a>>,
}

impl<'a> Bound<'a> {
    fn new(mapping: &BigtableMapping, p: &'a Prepared) -> Result<Self> {
        let mut key = Vec::with_capacity(p.key.len());
        for (array, (_, name)) in p.key.iter().zip(&mapping.key) {
            key.push(match array.data_type() {
                DataType::Int64 => KeyPart::Int(array.as_primitive::<Int64Type>()),
                DataType::UInt64 => KeyPart::UInt(array.as_primitive::<UInt64Type>()),
                _ => KeyPart::Bytes(BytesColumn::new(name, array.as_ref())?),
            });
        }
        let mut cells = Vec::with_capacity(p.cells.len());
        for ((array, parent), plan) in p.cells.iter().zip(&mapping.cells) {
            let values = match plan.kind {
                Kind::Int => CellValues::Int(primitive(array, &plan.label, "an Int64")?),
                Kind::UInt => CellValues::UInt(primitive(array, &plan.label, "a UInt64")?),
                Kind::Float => CellValues::Float(primitive(array, &plan.label, "a Float64")?),
                Kind::Bool => CellValues::Bool(
                    array
                        .as_boolean_opt()
                        .ok_or_else(|| Error::schema(&plan.label, "expected a Boolean array"))?,
                ),
                Kind::Bytes => CellValues::Bytes(BytesColumn::new(&plan.label, array.as_ref())?),
                Kind::Text => CellValues::Text(std::cell::RefCell::new(ColumnEncoder::new(
                    &plan.label,
                    array.as_ref(),
                )?)),
                Kind::Null => CellValues::Null,
            };
            cells.push(Cell {
                parent_nulls: parent.as_ref(),
                values,
            });
        }
        let timestamp = match &p.timestamp {
            Some(a) => Some(primitive(a, "timestamp_column", "an Int64")?),
            None => None,
        };
        let strings = |a: &'a Option<ArrayRef>, option: &str| -> Result<Option<BytesColumn<'a>>> {
            a.as_ref()
                .map(|a| BytesColumn::new(option, a.as_ref()))
                .transpose()
        };
        Ok(Bound {
            op: strings(&p.op, "op_column")?,
            key,
            cells,
            timestamp,
            table: strings(&p.table, "table_column")?,
            instance: strings(&p.instance, "instance_column")?,
        })
    }
}

#[cfg(test)]
mod tests;
