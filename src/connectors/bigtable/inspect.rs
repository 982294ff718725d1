//! `bigtable_read(table [, max_rows])`: reads up to `max_rows` rows (default
//! [`DEFAULT_READ_ROWS`]) of a table on the Bigtable emulator and returns one row per cell:
//! `row_key`, `family`, `qualifier`, `value` (the bytes as text when they are UTF-8, else null),
//! `value_bytes` (the bytes as they are) and `timestamp` (the cell's version). Every version of
//! a cell is listed, newest first.
//!
//! It talks only to the emulator `BIGTABLE_EMULATOR_HOST` names (`gcp-sql --emulators` sets
//! it), through the crate's channel and status mapping ([`crate::plan::inspect`] has the one
//! design every inspection function follows).
//!
//! ```sql
//! SELECT row_key, qualifier, value FROM bigtable_read('projects/demo/instances/i/tables/t', 10);
//! ```

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::array::{
    ArrayRef, BinaryArray, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::error::Result as DFResult;
use gcloud_sdk::google::bigtable::v2::ReadRowsRequest;
use gcloud_sdk::google::bigtable::v2::bigtable_client::BigtableClient;
use gcloud_sdk::google::bigtable::v2::read_rows_response::CellChunk;
use gcloud_sdk::google::bigtable::v2::read_rows_response::cell_chunk::RowStatus;

use super::names::bigtable_table;
use crate::error::{Error, Result};
use crate::google::with_deadline;
use crate::plan::inspect::{
    Inspection, InspectionFunctions, LazyTable, check_arity, count_arg, emulator_channel, name_arg,
    rpc_error, utc_micros,
};

/// Rows `bigtable_read` reads when `max_rows` is not given.
pub const DEFAULT_READ_ROWS: i64 = 100;
/// Most rows one `bigtable_read` call reads.
pub const MAX_READ_ROWS: i64 = 100_000;
/// Largest `ReadRows` answer `bigtable_read` decodes: one message may carry a whole row, and a
/// Bigtable row may hold up to 256 MiB.
const MAX_READ_RESPONSE_BYTES: usize = 264 << 20;
/// Deadline of the `ReadRows` call: an emulator on this machine answers at once.
const RPC_TIMEOUT: Duration = Duration::from_secs(30);

/// The Bigtable connector's inspection functions: `bigtable_read`.
pub fn inspection_functions() -> InspectionFunctions {
    vec![("bigtable_read", Arc::new(BigtableReadFunction::default()))]
}

/// The `bigtable_read(table [, max_rows])` table function.
#[derive(Debug, Default)]
pub struct BigtableReadFunction {
    emulator_host: Option<String>,
}

impl BigtableReadFunction {
    /// A `bigtable_read` that talks to the emulator at `host` (`host:port`) rather than the one
    /// `BIGTABLE_EMULATOR_HOST` names.
    pub fn with_emulator_host(host: impl Into<String>) -> Self {
        BigtableReadFunction {
            emulator_host: Some(host.into()),
        }
    }
}

impl TableFunctionImpl for BigtableReadFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DFResult<Arc<dyn TableProvider>> {
        let exprs = args.exprs();
        let function = "bigtable_read";
        check_arity(function, exprs, 2, "(table [, max_rows])")?;
        let table = name_arg(function, exprs, 0, "table", |t| bigtable_table(t, None))?;
        let max = count_arg(
            function,
            exprs,
            1,
            "max_rows",
            DEFAULT_READ_ROWS,
            MAX_READ_ROWS,
        )?;
        Ok(LazyTable::provider(
            read_schema(),
            ReadRows {
                table,
                max,
                emulator_host: self.emulator_host.clone(),
            },
        ))
    }
}

/// A `bigtable_read` call: the table, how many rows, and the emulator (`None`: the one
/// `BIGTABLE_EMULATOR_HOST` names).
#[derive(Debug)]
struct ReadRows {
    table: String,
    max: usize,
    emulator_host: Option<String>,
}

fn read_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("row_key", DataType::Utf8, false),
        Field::new("family", DataType::Utf8, false),
        Field::new("qualifier", DataType::Utf8, false),
        Field::new("value", DataType::Utf8, true),
        Field::new("value_bytes", DataType::Binary, false),
        Field::new("timestamp", utc_micros(), false),
    ]))
}

#[async_trait]
impl Inspection for ReadRows {
    async fn run(&self) -> Result<RecordBatch> {
        read_rows(&self.table, self.max, self.emulator_host.as_deref()).await
    }
}

/// One cell read back: row key, family, qualifier, timestamp (µs), value.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Cell {
    row_key: Vec<u8>,
    family: String,
    qualifier: Vec<u8>,
    timestamp_micros: i64,
    value: Vec<u8>,
}

/// Rebuilds cells from `ReadRows` chunks (the protocol of the `ReadRowsResponse.CellChunk`
/// reference): a chunk names its row key, family and qualifier only when they change, a value
/// may be split over several chunks (`value_size` is set on all but the last), and the cells of
/// a row count only once a chunk commits the row (a reset drops them).
#[derive(Debug, Default)]
struct CellMerger {
    done: Vec<Cell>,
    row: Vec<Cell>,
    row_key: Vec<u8>,
    family: String,
    qualifier: Vec<u8>,
    /// A cell whose value continues in the next chunk.
    partial: Option<Cell>,
}

impl CellMerger {
    fn push(&mut self, chunk: CellChunk) -> Result<()> {
        if let Some(partial) = &mut self.partial {
            partial.value.extend_from_slice(&chunk.value);
            if chunk.value_size == 0 {
                let cell = self.partial.take().expect("a partial cell");
                self.row.push(cell);
            }
        } else if chunk.row_status != Some(RowStatus::ResetRow(true)) {
            if !chunk.row_key.is_empty() {
                if chunk.row_key != self.row_key && !self.row.is_empty() {
                    return Err(protocol_error(
                        "a new row began before the last was committed",
                    ));
                }
                self.row_key = chunk.row_key;
            }
            if let Some(family) = chunk.family_name {
                self.family = family;
                if chunk.qualifier.is_none() {
                    return Err(protocol_error("a new family came without a qualifier"));
                }
            }
            if let Some(qualifier) = chunk.qualifier {
                self.qualifier = qualifier;
            }
            let cell = Cell {
                row_key: self.row_key.clone(),
                family: self.family.clone(),
                qualifier: self.qualifier.clone(),
                timestamp_micros: chunk.timestamp_micros,
                value: chunk.value,
            };
            if chunk.value_size > 0 {
                self.partial = Some(cell);
            } else {
                self.row.push(cell);
            }
        }
        match chunk.row_status {
            Some(RowStatus::ResetRow(true)) => {
                self.row.clear();
                self.partial = None;
                self.end_row();
            }
            Some(RowStatus::CommitRow(true)) => {
                if self.partial.is_some() {
                    return Err(protocol_error(
                        "a row was committed in the middle of a value",
                    ));
                }
                self.done.append(&mut self.row);
                self.end_row();
            }
            _ => {}
        }
        Ok(())
    }

    fn end_row(&mut self) {
        self.row_key.clear();
        self.family.clear();
        self.qualifier.clear();
    }

    fn finish(self) -> Result<Vec<Cell>> {
        if !self.row.is_empty() || self.partial.is_some() {
            return Err(protocol_error("the stream ended inside a row"));
        }
        Ok(self.done)
    }
}

fn protocol_error(what: &str) -> Error {
    Error::Unsupported(format!(
        "bigtable_read: ReadRows answered out of order: {what}"
    ))
}

async fn read_rows(table: &str, max: usize, host: Option<&str>) -> Result<RecordBatch> {
    let (channel, reach) = emulator_channel("bigtable_read", super::SERVICE, host)?;
    let mut client =
        BigtableClient::new(channel).max_decoding_message_size(MAX_READ_RESPONSE_BYTES);
    let request = ReadRowsRequest {
        table_name: table.to_string(),
        rows_limit: i64::try_from(max).unwrap_or(MAX_READ_ROWS),
        ..Default::default()
    };
    let mut stream = reach
        .observe(
            client
                .read_rows(with_deadline(
                    tonic::Request::new(request),
                    Some(RPC_TIMEOUT),
                    false,
                ))
                .await,
        )
        .map_err(|status| rpc_error("ReadRows", table, status))?
        .into_inner();
    let mut merger = CellMerger::default();
    while let Some(response) = stream
        .message()
        .await
        .map_err(|status| rpc_error("ReadRows", table, status))?
    {
        for chunk in response.chunks {
            merger.push(chunk)?;
        }
    }
    cells_batch(&merger.finish()?)
}

fn cells_batch(cells: &[Cell]) -> Result<RecordBatch> {
    let lossy = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(
            cells.iter().map(|c| lossy(&c.row_key)),
        )),
        Arc::new(StringArray::from_iter_values(
            cells.iter().map(|c| c.family.as_str()),
        )),
        Arc::new(StringArray::from_iter_values(
            cells.iter().map(|c| lossy(&c.qualifier)),
        )),
        Arc::new(StringArray::from_iter(
            cells.iter().map(|c| std::str::from_utf8(&c.value).ok()),
        )),
        Arc::new(BinaryArray::from_iter_values(
            cells.iter().map(|c| c.value.as_slice()),
        )),
        Arc::new(
            TimestampMicrosecondArray::from_iter_values(cells.iter().map(|c| c.timestamp_micros))
                .with_timezone("UTC"),
        ),
    ];
    Ok(RecordBatch::try_new(read_schema(), columns)?)
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::Array;

    use super::*;
    use crate::plan::inspect::test_support::{
        assert_needs_an_emulator, assert_nothing_answers, assert_plan_errors,
    };

    fn chunk(
        key: &str,
        family: Option<&str>,
        qualifier: Option<&str>,
        ts: i64,
        value: &str,
        value_size: i32,
        status: Option<RowStatus>,
    ) -> CellChunk {
        CellChunk {
            row_key: key.as_bytes().to_vec(),
            family_name: family.map(str::to_string),
            qualifier: qualifier.map(|q| q.as_bytes().to_vec()),
            timestamp_micros: ts,
            labels: Vec::new(),
            value: value.as_bytes().to_vec(),
            value_size,
            row_status: status,
        }
    }

    fn cell(key: &str, family: &str, qualifier: &str, ts: i64, value: &str) -> Cell {
        Cell {
            row_key: key.into(),
            family: family.into(),
            qualifier: qualifier.into(),
            timestamp_micros: ts,
            value: value.into(),
        }
    }

    #[test]
    fn chunks_become_cells_with_split_values_and_inherited_names() {
        let mut merger = CellMerger::default();
        for c in [
            chunk("r1", Some("c"), Some("url"), 2000, "/bl", 5, None),
            chunk("", None, None, 0, "og", 0, None),
            // Same family and qualifier, an older version.
            chunk("", None, None, 1000, "/", 0, None),
            chunk(
                "",
                None,
                Some("n"),
                1000,
                "x",
                0,
                Some(RowStatus::CommitRow(true)),
            ),
            chunk(
                "r2",
                Some("d"),
                Some("q"),
                5,
                "v",
                0,
                Some(RowStatus::CommitRow(true)),
            ),
        ] {
            merger.push(c).unwrap();
        }
        assert_eq!(
            merger.finish().unwrap(),
            vec![
                cell("r1", "c", "url", 2000, "/blog"),
                cell("r1", "c", "url", 1000, "/"),
                cell("r1", "c", "n", 1000, "x"),
                cell("r2", "d", "q", 5, "v"),
            ]
        );
    }

    #[test]
    fn a_reset_row_drops_its_cells_and_an_unfinished_row_is_an_error() {
        let mut merger = CellMerger::default();
        merger
            .push(chunk("r1", Some("c"), Some("a"), 1, "old", 0, None))
            .unwrap();
        merger
            .push(chunk(
                "",
                None,
                None,
                0,
                "",
                0,
                Some(RowStatus::ResetRow(true)),
            ))
            .unwrap();
        merger
            .push(chunk(
                "r1",
                Some("c"),
                Some("a"),
                1,
                "new",
                0,
                Some(RowStatus::CommitRow(true)),
            ))
            .unwrap();
        assert_eq!(
            merger.finish().unwrap(),
            vec![cell("r1", "c", "a", 1, "new")]
        );

        let mut open = CellMerger::default();
        open.push(chunk("r1", Some("c"), Some("a"), 1, "v", 0, None))
            .unwrap();
        assert!(open.finish().is_err());
    }

    #[test]
    fn values_are_text_only_when_utf8() {
        let mut binary = cell("k", "c", "n", 7, "");
        binary.value = vec![0xff, 0x00];
        let batch = cells_batch(&[cell("k", "c", "url", 7, "/a"), binary]).unwrap();
        let value = batch
            .column(3)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        assert_eq!(value.value(0), "/a");
        assert!(value.is_null(1));
        let bytes = batch
            .column(4)
            .as_any()
            .downcast_ref::<BinaryArray>()
            .unwrap();
        assert_eq!(bytes.value(1), &[0xff, 0x00]);
    }

    #[tokio::test]
    async fn arguments_are_checked_when_the_statement_is_planned() {
        assert_plan_errors(
            inspection_functions,
            &[
                (
                    "SELECT * FROM bigtable_read('tables/t')",
                    "expected 'projects/PROJECT/instances/INSTANCE/tables/TABLE'",
                ),
                (
                    "SELECT * FROM bigtable_read('t')",
                    "a short table id needs the 'instance' option",
                ),
                (
                    "SELECT * FROM bigtable_read('projects/p/instances/i/tables/t', 0)",
                    "an integer from 1 to 100000",
                ),
                (
                    "SELECT * FROM bigtable_read('projects/p/instances/i/tables/t', 'ten')",
                    "bigtable_read max_rows",
                ),
                (
                    "SELECT * FROM bigtable_read()",
                    "expected bigtable_read(table [, max_rows])",
                ),
            ],
        )
        .await;
    }

    /// Runs only where the emulator variable is unset (the unit tests never set it).
    #[tokio::test]
    async fn without_an_emulator_variable_nothing_is_contacted() {
        assert_needs_an_emulator(
            inspection_functions,
            "BIGTABLE_EMULATOR_HOST",
            &["SELECT * FROM bigtable_read('projects/p/instances/i/tables/t')"],
        )
        .await;
    }

    #[tokio::test]
    async fn a_call_to_an_address_where_nothing_listens_says_so() {
        assert_nothing_answers(
            "bigtable_read",
            |address| Arc::new(BigtableReadFunction::with_emulator_host(address)),
            "SELECT * FROM bigtable_read('projects/p/instances/i/tables/t')",
        )
        .await;
    }
}
