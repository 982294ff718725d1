//! The Bigtable emulator through the generated clients, independent of the sink: creating
//! tables, and reading every cell back with `ReadRows`.

use std::collections::BTreeMap;

use gcloud_sdk::google::bigtable::admin::v2::bigtable_table_admin_client::BigtableTableAdminClient;
use gcloud_sdk::google::bigtable::admin::v2::{ColumnFamily, CreateTableRequest, Table};
use gcloud_sdk::google::bigtable::v2::bigtable_client::BigtableClient;
use gcloud_sdk::google::bigtable::v2::{ReadRowsRequest, RowRange, RowSet, row_range};
use tonic::transport::Channel;

use super::unique;

/// Rows a page of [`Bigtable::read`] asks for.
const READ_PAGE_ROWS: i64 = 1_000;

/// The instance every test table is created in.
pub const INSTANCE: &str = "projects/sinktest/instances/main";

/// One cell as `ReadRows` returns it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cell {
    /// The column family.
    pub family: String,
    /// The column qualifier.
    pub qualifier: Vec<u8>,
    /// The version, in microseconds.
    pub timestamp: i64,
    /// The value bytes.
    pub value: Vec<u8>,
}

/// A cell from text.
pub fn cell(family: &str, qualifier: &str, timestamp: i64, value: impl Into<Vec<u8>>) -> Cell {
    Cell {
        family: family.into(),
        qualifier: qualifier.as_bytes().to_vec(),
        timestamp,
        value: value.into(),
    }
}

/// Every row of a table by key, each with its cells sorted.
pub type Rows = BTreeMap<Vec<u8>, Vec<Cell>>;

/// Reads the table named by its first argument with Google's Python client (from
/// `BIGTABLE_EMULATOR_HOST`) and prints one line per cell version: row key, family, qualifier,
/// timestamp in microseconds and value, bytes in hex.
const PYTHON_READ_TABLE: &str = r#"
import sys
from datetime import datetime, timedelta, timezone
from google.cloud import bigtable

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_, project, _, instance, _, table_id = sys.argv[1].split("/")
table = bigtable.Client(project=project, admin=False).instance(instance).table(table_id)
for row in table.read_rows():
    for family, columns in row.cells.items():
        for qualifier, versions in columns.items():
            for cell in versions:
                micros = (cell.timestamp - EPOCH) // timedelta(microseconds=1)
                print(row.row_key.hex(), family, qualifier.hex(), micros, cell.value.hex())
"#;

/// The emulator through the generated clients.
pub struct Bigtable {
    /// The emulator address, for `emulator_host`.
    pub host: String,
    /// A channel to the emulator.
    pub channel: Channel,
}

impl Bigtable {
    /// Connects to the emulator shared by this test binary (started on first use).
    pub async fn connect() -> Self {
        let emulator = gcp_sql::emulators::shared(gcp_sql::emulators::EmulatorKind::Bigtable).await;
        let host = emulator.host().to_string();
        let channel = gcp_sql::emulators::plaintext_channel(&host)
            .await
            .expect("channel to the Bigtable emulator");
        Bigtable { host, channel }
    }

    /// A fresh table name (not created).
    pub fn table_name(prefix: &str) -> String {
        format!("{INSTANCE}/tables/{}", unique(prefix))
    }

    pub async fn create_table(&self, name: &str, families: &[&str]) {
        let (parent, id) = name.split_once("/tables/").expect("full table name");
        BigtableTableAdminClient::new(self.channel.clone())
            .create_table(CreateTableRequest {
                parent: parent.into(),
                table_id: id.into(),
                table: Some(Table {
                    column_families: families
                        .iter()
                        .map(|f| (f.to_string(), ColumnFamily::default()))
                        .collect(),
                    ..Default::default()
                }),
                initial_splits: vec![],
            })
            .await
            .unwrap_or_else(|s| panic!("CreateTable {name}: {s}"));
    }

    /// Every cell of every row (all versions), assembled from the `ReadRows` chunks; cells of a
    /// row sorted. Read in pages of [`READ_PAGE_ROWS`] rows (`rows_limit`, each page starting
    /// after the last key of the one before): one stream of a whole large table, sent by the
    /// emulator in many small frames to a test process slowed by a loaded machine, can leave
    /// enough of them unread to trip the client's HTTP/2 flood protection (a GOAWAY with
    /// `too_many_data_frames`, which failed a CI run).
    pub async fn read(&self, table: &str) -> Rows {
        let mut all = Rows::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let rows = after.take().map(|last| RowSet {
                row_keys: vec![],
                row_ranges: vec![RowRange {
                    start_key: Some(row_range::StartKey::StartKeyOpen(last)),
                    end_key: None,
                }],
            });
            let page = self.read_rows_limited(table, rows, READ_PAGE_ROWS).await;
            let full = page.len() as i64 >= READ_PAGE_ROWS;
            after = page.keys().next_back().cloned();
            all.extend(page);
            if !full || after.is_none() {
                return all;
            }
        }
    }

    /// The rows whose keys are in `[start, end)`, as [`Bigtable::read`] reads them: for tables
    /// large enough that one `ReadRows` stream of them all is a risk (the emulator's many
    /// small frames can trip the client's HTTP/2 flood protection).
    pub async fn read_range(&self, table: &str, start: &[u8], end: &[u8]) -> Rows {
        let range = RowRange {
            start_key: Some(row_range::StartKey::StartKeyClosed(start.to_vec())),
            end_key: Some(row_range::EndKey::EndKeyOpen(end.to_vec())),
        };
        let rows = RowSet {
            row_keys: vec![],
            row_ranges: vec![range],
        };
        self.read_rows(table, Some(rows)).await
    }

    async fn read_rows(&self, table: &str, rows: Option<RowSet>) -> Rows {
        self.read_rows_limited(table, rows, 0).await
    }

    /// At most `limit` rows (0: all) of `rows`.
    async fn read_rows_limited(&self, table: &str, rows: Option<RowSet>, limit: i64) -> Rows {
        let mut stream = BigtableClient::new(self.channel.clone())
            .read_rows(ReadRowsRequest {
                table_name: table.into(),
                rows,
                rows_limit: limit,
                ..Default::default()
            })
            .await
            .unwrap_or_else(|s| panic!("ReadRows {table}: {s}"))
            .into_inner();
        let mut rows = Rows::new();
        let (mut key, mut family, mut qualifier) = (Vec::new(), String::new(), Vec::new());
        let mut partial: Option<Cell> = None;
        while let Some(response) = stream.message().await.expect("ReadRows message") {
            for chunk in response.chunks {
                if !chunk.row_key.is_empty() {
                    key = chunk.row_key.clone();
                }
                if let Some(f) = chunk.family_name {
                    family = f;
                }
                if let Some(q) = chunk.qualifier {
                    qualifier = q;
                }
                let c = partial.get_or_insert_with(|| Cell {
                    family: family.clone(),
                    qualifier: qualifier.clone(),
                    timestamp: chunk.timestamp_micros,
                    value: Vec::new(),
                });
                c.value.extend_from_slice(&chunk.value);
                if chunk.value_size == 0
                    && let Some(done) = partial.take()
                {
                    rows.entry(key.clone()).or_default().push(done);
                }
            }
        }
        for cells in rows.values_mut() {
            cells.sort();
        }
        rows
    }

    /// The whole table as Google's Python Bigtable client reads it (every version of every
    /// cell), in [`Bigtable::read`]'s shape: an independent reader of what landed. The client
    /// is installed once into the tests' own Python environment ([`super::python`]).
    pub fn read_with_python(&self, table: &str) -> Rows {
        let python = super::python::python_with(super::python::BIGTABLE_CLIENT);
        let out = std::process::Command::new(&python)
            .arg("-c")
            .arg(PYTHON_READ_TABLE)
            .arg(table)
            .env("BIGTABLE_EMULATOR_HOST", &self.host)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{} runs: {e}", python.display()));
        assert!(
            out.status.success(),
            "Google's Python Bigtable client ({}) could not read {table}:\n{}",
            python.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let hex = |s: &str| -> Vec<u8> {
            (0..s.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
                .collect()
        };
        let mut rows = Rows::new();
        for line in String::from_utf8(out.stdout).expect("UTF-8").lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            let [key, family, qualifier, timestamp, value] = fields[..] else {
                panic!("a line of the Python reader: {line}");
            };
            rows.entry(hex(key)).or_default().push(Cell {
                family: family.to_string(),
                qualifier: hex(qualifier),
                timestamp: timestamp.parse().expect("timestamp"),
                value: hex(value),
            });
        }
        for cells in rows.values_mut() {
            cells.sort();
        }
        rows
    }

    pub fn create_sql(
        &self,
        name: &str,
        columns: &str,
        table: &str,
        options: &[(&str, &str)],
    ) -> String {
        let mut with = format!(
            "connector = 'bigtable', emulator_host = '{}', table = '{table}'",
            self.host
        );
        for (k, v) in options {
            with.push_str(&format!(", {k} = '{v}'"));
        }
        format!("CREATE TABLE {name} ({columns}) WITH ({with})")
    }
}
