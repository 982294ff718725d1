//! The scan node: one `ReadRows` stream per partition, rows merged from their cell chunks and
//! decoded into the table's columns, a broken stream resumed after the last row seen.
//!
//! # Resuming
//!
//! A stream that fails with `UNAVAILABLE`, `DEADLINE_EXCEEDED` or `ABORTED` (a broken
//! connection counts as `UNAVAILABLE`), or that sends nothing for [`IDLE_TIMEOUT`], is opened
//! again for the keys after the last row committed (or the last key the server said it
//! scanned), with the rows limit lowered by the rows already read. A row is counted only once
//! a chunk commits it, so no row is read twice and none is missed. Up to [`MAX_ATTEMPTS`]
//! attempts in a row without a committed row, with a doubling delay from 10 ms to 2 s; then the
//! scan fails naming `ReadRows`, the table and the last status.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{
    Array, ArrayRef, Int64Array, LargeBinaryArray, RecordBatch, RecordBatchOptions,
};
use datafusion::arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use gcloud_sdk::google::bigtable::v2::bigtable_client::BigtableClient;
use gcloud_sdk::google::bigtable::v2::{ReadRowsRequest, RowFilter};
use prost::bytes::Bytes;
use tonic::Code;
use tonic::codegen::http;

use super::chunks::{ChunkRef, ReadRowsCodec, for_each_chunk};
use super::decode::{RawColumn, decode_cells, decode_key_part, struct_of};
use super::keys::{KeySet, show_key};
use crate::connectors::bigtable::client::{ClientSettings, READ_ROWS_PATH};
use crate::error::{Error, Result};
use crate::google::{Connection, GrpcChannel, ROUTING_HEADER, routing_value, with_deadline};
use crate::plan::node::{name_and_properties, no_expressions};

/// Largest `ReadRows` response decoded: one message may carry a whole row (up to 256 MiB).
const MAX_RESPONSE_BYTES: usize = 264 << 20;
/// How long a stream may send nothing before it is treated as broken and resumed (the Java
/// client's `ReadRows` watchdog waits 5 minutes; the service sends a progress message at
/// least every few seconds of a long scan, so a minute without one means a stuck stream).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Attempts in a row without a committed row before a scan fails.
pub const MAX_ATTEMPTS: u32 = 10;
const FIRST_DELAY: Duration = Duration::from_millis(10);
const MAX_DELAY: Duration = Duration::from_secs(2);

/// Where an output column's values come from.
#[derive(Debug, Clone)]
pub enum Source {
    /// Part `n` of the row key.
    KeyPart(usize),
    /// The row's latest cell version (the `timestamp_column`).
    Timestamp,
    /// Cell `n` of the cells read.
    Cell(usize),
    /// A struct column: its fields' cells, in field order.
    Struct(Vec<usize>),
    /// The whole row key, as read (a `LargeBinary` column; what `DELETE`/`UPDATE` write back).
    RowKey,
}

/// What every partition of a scan shares.
pub struct ScanSpec {
    /// The table read (`projects/P/instances/I/tables/T`).
    pub table: String,
    /// The application profile (empty: the instance's default).
    pub app_profile_id: String,
    /// Where to connect.
    pub settings: ClientSettings,
    /// The output schema (the projected columns).
    pub schema: SchemaRef,
    /// Per output column, where its values come from.
    pub sources: Vec<Source>,
    /// The cells read, `(family, qualifier)`, by their index in [`Source::Cell`].
    pub cells: Vec<(String, Vec<u8>)>,
    /// The key columns' count and delimiter.
    pub key_parts: usize,
    /// The delimiter between key parts.
    pub delimiter: Vec<u8>,
    /// The row filter sent, and how EXPLAIN shows it.
    pub filter: RowFilter,
    /// The filter, for EXPLAIN.
    pub filter_text: String,
    /// The rows limit pushed down (`None`: none).
    pub limit: Option<u64>,
    /// The channel, opened by the first partition that needs it.
    pub(crate) connection: tokio::sync::OnceCell<Connection>,
}

impl fmt::Debug for ScanSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScanSpec")
            .field("table", &self.table)
            .field("schema", &self.schema)
            .field("sources", &self.sources)
            .field("filter", &self.filter_text)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl ScanSpec {
    async fn channel(&self) -> Result<GrpcChannel> {
        let connection = self
            .connection
            .get_or_try_init(|| async {
                let endpoint = self.settings.endpoint.clone().unwrap_or_else(|| {
                    crate::connectors::bigtable::client::DEFAULT_ENDPOINT.into()
                });
                Connection::open(
                    self.settings.effective_emulator_host().as_deref(),
                    &endpoint,
                    self.settings.credentials_file.as_deref(),
                )
                .await
            })
            .await?;
        Ok(connection.channel())
    }

    /// A request for this table with the routing header.
    pub(crate) fn request<M>(
        &self,
        message: M,
        google: bool,
        timeout: Option<Duration>,
    ) -> Result<tonic::Request<M>> {
        let mut request = with_deadline(tonic::Request::new(message), timeout, google);
        let mut pairs = vec![("table_name", self.table.as_str())];
        if !self.app_profile_id.is_empty() {
            pairs.push(("app_profile_id", self.app_profile_id.as_str()));
        }
        let value =
            routing_value(&pairs).map_err(|e| Error::invalid("table", self.table.clone(), e))?;
        request.metadata_mut().insert(ROUTING_HEADER, value);
        Ok(request)
    }

    /// A client on the scan's channel.
    pub(crate) async fn client(&self) -> Result<(BigtableClient<GrpcChannel>, bool)> {
        let channel = self.channel().await?;
        let google = channel.is_google();
        Ok((
            BigtableClient::new(channel).max_decoding_message_size(MAX_RESPONSE_BYTES),
            google,
        ))
    }
}

/// The scan node: one partition per key set.
#[derive(Debug)]
pub struct BigtableScanExec {
    spec: Arc<ScanSpec>,
    keys: KeySet,
    partitions: Vec<KeySet>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    lookup_cache: Option<crate::connectors::bigtable::lookup::CacheSettings>,
}

impl BigtableScanExec {
    /// This scan, with the cache a lookup join reading its table keeps (ADR 0078).
    pub fn with_lookup_cache(
        mut self,
        cache: Option<crate::connectors::bigtable::lookup::CacheSettings>,
    ) -> Self {
        self.lookup_cache = cache;
        self
    }

    /// The cache a lookup join reading this table keeps (`None`: none).
    pub fn lookup_cache(&self) -> Option<crate::connectors::bigtable::lookup::CacheSettings> {
        self.lookup_cache
    }

    /// A scan of `keys` split into `partitions` (their union is `keys`).
    pub fn new(spec: Arc<ScanSpec>, keys: KeySet, partitions: Vec<KeySet>) -> Self {
        let partitions = if partitions.is_empty() {
            vec![KeySet::none()]
        } else {
            partitions
        };
        let properties = PlanProperties::new(
            EquivalenceProperties::new(spec.schema.clone()),
            Partitioning::UnknownPartitioning(partitions.len()),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        BigtableScanExec {
            spec,
            keys,
            partitions,
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
            lookup_cache: None,
        }
    }

    /// The key set the scan reads (the union of its partitions).
    pub fn keys(&self) -> &KeySet {
        &self.keys
    }

    /// The key set of each partition.
    pub fn partitions(&self) -> &[KeySet] {
        &self.partitions
    }

    /// What every partition shares.
    pub fn spec(&self) -> &Arc<ScanSpec> {
        &self.spec
    }
}

impl DisplayAs for BigtableScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "BigtableScanExec: table={}, keys={}, filter={}",
            self.spec.table, self.keys, self.spec.filter_text
        )?;
        if let Some(limit) = self.spec.limit {
            write!(f, ", rows_limit={limit}")?;
        }
        write!(f, ", partitions={}", self.partitions.len())?;
        if self.partitions.len() > 1 {
            let starts: Vec<String> = self.partitions[1..]
                .iter()
                .filter_map(|p| p.ranges().first())
                .map(|r| format!("'{}'", show_key(&r.start)))
                .collect();
            write!(f, " split at [{}]", starts.join(", "))?;
        }
        Ok(())
    }
}

impl ExecutionPlan for BigtableScanExec {
    name_and_properties!("BigtableScanExec");

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    no_expressions!();

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal(
                "BigtableScanExec has no children".into(),
            ))
        }
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        let Some(keys) = self.partitions.get(partition).cloned() else {
            return Err(DataFusionError::Internal(format!(
                "BigtableScanExec has {} partition(s), asked for {partition}",
                self.partitions.len()
            )));
        };
        let counter =
            |name: &'static str| MetricBuilder::new(&self.metrics).counter(name, partition);
        let reader = PartitionReader {
            spec: self.spec.clone(),
            keys,
            limit: self.spec.limit,
            batch_size: context.session_config().batch_size().max(1),
            client: None,
            stream: None,
            rows: Rows::new(&self.spec),
            last_key: None,
            failures: 0,
            done: false,
            calls: counter("read_rows_calls"),
            rows_read: counter("rows_read"),
            resumes: counter("resumes"),
        };
        let stream = futures::stream::try_unfold(reader, |mut reader| async move {
            match reader.next_batch().await {
                Ok(Some(batch)) => Ok(Some((batch, reader))),
                Ok(None) => Ok(None),
                Err(e) => Err(DataFusionError::from(e)),
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.spec.schema.clone(),
            stream,
        )))
    }
}

/// A family read, with its qualifiers read and their cell indexes.
type FamilyCells = (Vec<u8>, Vec<(Vec<u8>, usize)>);

/// The rows of the batch being built, and the row being merged from chunks.
struct Rows {
    /// Per family read, its qualifiers read (sorted) with their cell index: the family is
    /// looked up when a chunk names one (once a row per family), the qualifier by a binary
    /// search, with no hashing of every chunk's names.
    cells: Vec<FamilyCells>,
    keys: RawColumn,
    raw: Vec<RawColumn>,
    timestamps: Vec<i64>,
    count: usize,
    // The row being merged.
    row_key: Vec<u8>,
    /// The key of the row committed last.
    committed: Vec<u8>,
    /// The current chunk's family, and its index in `cells` when it is read.
    family: Vec<u8>,
    family_index: Option<usize>,
    /// The cell the current chunks belong to, when it is read.
    cell: Option<usize>,
    timestamp: i64,
    /// A value split over chunks, gathered.
    value: Vec<u8>,
    in_value: bool,
    /// The row's cell values, one after another; `row[i]` is cell `i`'s start and length.
    arena: Vec<u8>,
    row: Vec<Option<(usize, usize)>>,
    row_timestamp: i64,
    row_open: bool,
}

impl Rows {
    fn new(spec: &ScanSpec) -> Self {
        let mut cells: Vec<FamilyCells> = Vec::new();
        for (i, (family, qualifier)) in spec.cells.iter().enumerate() {
            let family = family.as_bytes();
            match cells.iter_mut().find(|(f, _)| f == family) {
                Some((_, qualifiers)) => qualifiers.push((qualifier.clone(), i)),
                None => cells.push((family.to_vec(), vec![(qualifier.clone(), i)])),
            }
        }
        for (_, qualifiers) in &mut cells {
            qualifiers.sort();
        }
        Rows {
            cells,
            keys: RawColumn::new(),
            raw: (0..spec.cells.len()).map(|_| RawColumn::new()).collect(),
            timestamps: Vec::new(),
            count: 0,
            row_key: Vec::new(),
            committed: Vec::new(),
            family: Vec::new(),
            family_index: None,
            cell: None,
            timestamp: 0,
            value: Vec::new(),
            in_value: false,
            arena: Vec::new(),
            row: vec![None; spec.cells.len()],
            row_timestamp: i64::MIN,
            row_open: false,
        }
    }

    fn protocol(what: &str) -> Error {
        Error::Unsupported(format!("ReadRows answered out of protocol: {what}"))
    }

    fn reset_row(&mut self) {
        self.row_open = false;
        self.in_value = false;
        self.value.clear();
        self.arena.clear();
        self.row.iter_mut().for_each(|c| *c = None);
        self.row_timestamp = i64::MIN;
    }

    /// Takes one chunk; returns whether it committed a row (whose key is then
    /// [`committed`](Self::committed)).
    fn push(&mut self, chunk: ChunkRef<'_>) -> Result<bool> {
        if !self.in_value {
            if !chunk.row_key.is_empty() {
                if self.row_open && chunk.row_key != self.row_key.as_slice() {
                    return Err(Self::protocol(
                        "a new row began before the last was committed",
                    ));
                }
                if !self.row_open {
                    self.row_key.clear();
                    self.row_key.extend_from_slice(chunk.row_key);
                    self.row_open = true;
                }
            } else if !self.row_open {
                return Err(Self::protocol("a row's first chunk has no row key"));
            }
            if let Some(family) = chunk.family {
                if family != self.family.as_slice() {
                    self.family.clear();
                    self.family.extend_from_slice(family);
                    self.family_index = self.cells.iter().position(|(f, _)| f == family);
                }
                if chunk.qualifier.is_none() {
                    return Err(Self::protocol("a new family came without a qualifier"));
                }
            }
            if let Some(qualifier) = chunk.qualifier {
                self.cell = self.family_index.and_then(|f| {
                    let qualifiers = &self.cells[f].1;
                    qualifiers
                        .binary_search_by(|(q, _)| q.as_slice().cmp(qualifier))
                        .ok()
                        .map(|at| qualifiers[at].1)
                });
            }
            self.timestamp = chunk.timestamp_micros;
            self.value.clear();
        }
        // A value in one chunk (the usual case) goes straight from the response to the row.
        let split = self.in_value || chunk.value_size > 0;
        if split {
            self.value.extend_from_slice(chunk.value);
        }
        self.in_value = chunk.value_size > 0;
        if !self.in_value && !chunk.reset_row {
            self.row_timestamp = self.row_timestamp.max(self.timestamp);
            if let Some(i) = self.cell {
                // The row marker (an empty copy of a row's first cell) never replaces a value.
                if self.row[i].is_none_or(|(_, len)| len == 0) {
                    let start = self.arena.len();
                    if split {
                        self.arena.extend_from_slice(&self.value);
                    } else {
                        self.arena.extend_from_slice(chunk.value);
                    }
                    self.row[i] = Some((start, self.arena.len() - start));
                }
            }
        }
        if chunk.reset_row {
            self.reset_row();
            return Ok(false);
        }
        if !chunk.commit_row {
            return Ok(false);
        }
        if self.in_value {
            return Err(Self::protocol(
                "a row was committed in the middle of a value",
            ));
        }
        self.keys.append_value(&self.row_key);
        for (raw, cell) in self.raw.iter_mut().zip(self.row.iter_mut()) {
            match cell.take() {
                Some((start, len)) => raw.append_value(&self.arena[start..start + len]),
                None => raw.append_null(),
            }
        }
        self.timestamps.push(self.row_timestamp);
        self.count += 1;
        std::mem::swap(&mut self.committed, &mut self.row_key);
        self.reset_row();
        Ok(true)
    }

    /// The key of the row committed last.
    fn committed(&self) -> &[u8] {
        &self.committed
    }

    /// Drops a row left open by a broken stream.
    fn abandon_row(&mut self) {
        self.reset_row();
        self.row_key.clear();
    }

    fn finish(&mut self, spec: &ScanSpec) -> Result<RecordBatch> {
        let count = std::mem::take(&mut self.count);
        let keys: LargeBinaryArray = self.keys.finish();
        let raw: Vec<LargeBinaryArray> = self.raw.iter_mut().map(|r| r.finish()).collect();
        let timestamps = std::mem::take(&mut self.timestamps);
        let parts = if spec.sources.iter().any(|s| matches!(s, Source::KeyPart(_))) {
            split_keys(&keys, spec.key_parts, &spec.delimiter, spec)?
        } else {
            Vec::new()
        };
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(spec.sources.len());
        for (field, source) in spec.schema.fields().iter().zip(&spec.sources) {
            let name = field.name();
            columns.push(match source {
                Source::KeyPart(n) => decode_key_part(&parts[*n], field.data_type(), name)?,
                Source::Timestamp => timestamp_column(&timestamps, field.data_type(), name)?,
                Source::RowKey => Arc::new(keys.clone()),
                Source::Cell(i) => decode_cells(&raw[*i], field.data_type(), name)?,
                Source::Struct(cells) => {
                    let DataType::Struct(fields) = field.data_type() else {
                        return Err(Error::schema(name, "expected a struct column"));
                    };
                    let mut children = Vec::with_capacity(cells.len());
                    let mut present = vec![false; count];
                    for (child, i) in fields.iter().zip(cells) {
                        let r = &raw[*i];
                        for (row, p) in present.iter_mut().enumerate() {
                            *p |= r.is_valid(row);
                        }
                        children.push(decode_cells(
                            r,
                            child.data_type(),
                            &format!("{name}.{}", child.name()),
                        )?);
                    }
                    struct_of(fields, children, present)?
                }
            });
        }
        Ok(RecordBatch::try_new_with_options(
            spec.schema.clone(),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(count)),
        )?)
    }
}

/// The key parts of each row key: split at the first `parts - 1` delimiters.
fn split_keys(
    keys: &LargeBinaryArray,
    parts: usize,
    delimiter: &[u8],
    spec: &ScanSpec,
) -> Result<Vec<LargeBinaryArray>> {
    let mut out: Vec<RawColumn> = (0..parts).map(|_| RawColumn::new()).collect();
    for key in keys.iter().flatten() {
        let mut rest = key;
        for (n, column) in out.iter_mut().enumerate() {
            if n + 1 == parts {
                column.append_value(rest);
                break;
            }
            match find(rest, delimiter) {
                Some(at) => {
                    column.append_value(&rest[..at]);
                    rest = &rest[at + delimiter.len()..];
                }
                None => {
                    return Err(Error::schema(
                        spec.table.clone(),
                        format!(
                            "a row key has fewer than the {parts} parts row_key names (joined by row_key_delimiter): it was not written by this table's sink"
                        ),
                    ));
                }
            }
        }
    }
    Ok(out.iter_mut().map(|c| c.finish()).collect())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return None;
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The row versions (µs) as the timestamp column's type: a `TIMESTAMP` of its unit, or
/// `BIGINT` microseconds (what the sink's `timestamp_column` accepts).
fn timestamp_column(micros: &[i64], to: &DataType, column: &str) -> Result<ArrayRef> {
    let values = Int64Array::from_iter_values(micros.iter().map(|m| match to {
        DataType::Timestamp(TimeUnit::Second, _) => m.div_euclid(1_000_000),
        DataType::Timestamp(TimeUnit::Millisecond, _) => m.div_euclid(1_000),
        DataType::Timestamp(TimeUnit::Nanosecond, _) => m.saturating_mul(1_000),
        _ => *m,
    }));
    match to {
        DataType::Int64 => Ok(Arc::new(values)),
        DataType::Timestamp(_, _) => {
            let data = values
                .into_data()
                .into_builder()
                .data_type(to.clone())
                .build()?;
            Ok(datafusion::arrow::array::make_array(data))
        }
        other => Err(Error::schema(
            column,
            format!(
                "timestamp_column is {other}; it reads back as a TIMESTAMP or a BIGINT of microseconds"
            ),
        )),
    }
}

/// One partition's reading.
struct PartitionReader {
    spec: Arc<ScanSpec>,
    keys: KeySet,
    limit: Option<u64>,
    batch_size: usize,
    client: Option<(GrpcChannel, bool)>,
    stream: Option<tonic::Streaming<Bytes>>,
    rows: Rows,
    last_key: Option<Vec<u8>>,
    failures: u32,
    done: bool,
    calls: Count,
    rows_read: Count,
    resumes: Count,
}

/// Opens one `ReadRows` stream on `channel`, its responses kept as the bytes received and read
/// in place ([`super::chunks`]).
async fn read_rows(
    channel: GrpcChannel,
    request: tonic::Request<ReadRowsRequest>,
) -> std::result::Result<tonic::Streaming<Bytes>, tonic::Status> {
    let mut grpc = crate::google::ready(channel)
        .await?
        .max_decoding_message_size(MAX_RESPONSE_BYTES);
    let response = grpc
        .server_streaming(
            request,
            http::uri::PathAndQuery::from_static(READ_ROWS_PATH),
            ReadRowsCodec,
        )
        .await?;
    Ok(response.into_inner())
}

fn retryable(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::DeadlineExceeded | Code::Aborted
    )
}

impl PartitionReader {
    /// The keys still to read: after the last key seen.
    fn remaining(&self) -> KeySet {
        match &self.last_key {
            Some(k) => self.keys.after(k),
            None => self.keys.clone(),
        }
    }

    /// A failure of the stream: `Ok` after the delay when it is worth another attempt.
    async fn failed(&mut self, status: tonic::Status) -> Result<()> {
        self.stream = None;
        self.rows.abandon_row();
        self.failures += 1;
        if !retryable(&status) || self.failures >= MAX_ATTEMPTS {
            return Err(Error::rpc(
                "ReadRows",
                &self.spec.table,
                &status,
                self.failures,
            ));
        }
        let delay = FIRST_DELAY
            .saturating_mul(1 << (self.failures - 1).min(16))
            .min(MAX_DELAY);
        tracing::warn!(
            table = %self.spec.table,
            code = ?status.code(),
            attempt = self.failures,
            "ReadRows stream broke; resuming after the last row read"
        );
        self.resumes.add(1);
        tokio::time::sleep(delay).await;
        Ok(())
    }

    async fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        loop {
            if self.rows.count >= self.batch_size {
                return self.rows.finish(&self.spec).map(Some);
            }
            if self.done {
                return if self.rows.count > 0 {
                    self.rows.finish(&self.spec).map(Some)
                } else {
                    Ok(None)
                };
            }
            if self.stream.is_none() {
                match self.open_or_retry().await? {
                    Some(stream) => self.stream = Some(stream),
                    None => {
                        self.done = true;
                        continue;
                    }
                }
            }
            let stream = self.stream.as_mut().expect("an open stream");
            let message = match tokio::time::timeout(IDLE_TIMEOUT, stream.message()).await {
                Ok(m) => m,
                Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                    "no ReadRows message for {IDLE_TIMEOUT:?}"
                ))),
            };
            match message {
                Ok(Some(response)) => {
                    let rows = &mut self.rows;
                    let mut committed = 0u64;
                    let last_scanned = for_each_chunk(&response, |chunk| {
                        committed += u64::from(rows.push(chunk)?);
                        Ok(())
                    })?;
                    if committed > 0 {
                        self.failures = 0;
                        self.rows_read.add(committed as usize);
                        if let Some(l) = self.limit.as_mut() {
                            *l = l.saturating_sub(committed);
                        }
                        self.last_key = Some(self.rows.committed().to_vec());
                    }
                    if !last_scanned.is_empty()
                        && self.last_key.as_deref().is_none_or(|k| last_scanned > k)
                    {
                        self.last_key = Some(last_scanned.to_vec());
                    }
                    if self.limit == Some(0) {
                        self.stream = None;
                        self.done = true;
                    }
                }
                Ok(None) => {
                    if self.rows.row_open || self.rows.in_value {
                        return Err(Rows::protocol("the stream ended inside a row"));
                    }
                    self.stream = None;
                    self.done = true;
                }
                Err(status) => self.failed(status).await?,
            }
        }
    }

    /// Opens the stream, retrying a failed open like a broken stream.
    async fn open_or_retry(&mut self) -> Result<Option<tonic::Streaming<Bytes>>> {
        loop {
            let keys = self.remaining();
            if keys.is_empty() || self.limit == Some(0) {
                return Ok(None);
            }
            if self.client.is_none() {
                let channel = self.spec.channel().await?;
                let google = channel.is_google();
                self.client = Some((channel, google));
            }
            let (client, google) = self.client.as_mut().expect("a client");
            let request = ReadRowsRequest {
                table_name: self.spec.table.clone(),
                app_profile_id: self.spec.app_profile_id.clone(),
                rows: Some(keys.to_row_set()),
                filter: Some(self.spec.filter.clone()),
                rows_limit: self
                    .limit
                    .map_or(0, |l| i64::try_from(l).unwrap_or(i64::MAX)),
                ..Default::default()
            };
            let request = self.spec.request(request, *google, None)?;
            self.calls.add(1);
            match read_rows(client.clone(), request).await {
                Ok(response) => return Ok(Some(response)),
                Err(status) => self.failed(status).await?,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::{Field, Int64Type, Schema};
    use gcloud_sdk::google::bigtable::v2::ReadRowsResponse;
    use gcloud_sdk::google::bigtable::v2::read_rows_response::CellChunk;
    use gcloud_sdk::google::bigtable::v2::read_rows_response::cell_chunk::RowStatus;
    use prost::Message as _;

    use super::*;

    /// Feeds `chunk` to `rows` as the scan does: serialized in a response and read in place.
    /// Returns the key of the row it committed, if any.
    fn push(rows: &mut Rows, chunk: CellChunk) -> Result<Option<Vec<u8>>> {
        let bytes = ReadRowsResponse {
            chunks: vec![chunk],
            ..Default::default()
        }
        .encode_to_vec();
        let mut committed = false;
        for_each_chunk(&bytes, |c| {
            committed |= rows.push(c)?;
            Ok(())
        })?;
        Ok(committed.then(|| rows.committed().to_vec()))
    }

    fn spec() -> ScanSpec {
        ScanSpec {
            table: "projects/p/instances/i/tables/t".into(),
            app_profile_id: String::new(),
            settings: ClientSettings::default(),
            schema: Arc::new(Schema::new(vec![
                Field::new("k", DataType::Utf8, false),
                Field::new("id", DataType::Int64, false),
                Field::new("name", DataType::Utf8, true),
                Field::new("ts", DataType::Int64, false),
            ])),
            sources: vec![
                Source::KeyPart(0),
                Source::KeyPart(1),
                Source::Cell(0),
                Source::Timestamp,
            ],
            cells: vec![("cf".into(), b"name".to_vec())],
            key_parts: 2,
            delimiter: b"#".to_vec(),
            filter: RowFilter::default(),
            filter_text: String::new(),
            limit: None,
            connection: tokio::sync::OnceCell::new(),
        }
    }

    fn chunk(
        key: &str,
        cell: Option<(&str, &str)>,
        ts: i64,
        value: &str,
        value_size: i32,
        status: Option<RowStatus>,
    ) -> CellChunk {
        CellChunk {
            row_key: key.as_bytes().to_vec(),
            family_name: cell.map(|(f, _)| f.to_string()),
            qualifier: cell.map(|(_, q)| q.as_bytes().to_vec()),
            timestamp_micros: ts,
            labels: Vec::new(),
            value: value.as_bytes().to_vec(),
            value_size,
            row_status: status,
        }
    }

    #[test]
    fn chunks_merge_into_rows_with_split_values_resets_and_a_marker_that_never_overwrites() {
        let spec = spec();
        let mut rows = Rows::new(&spec);
        let commit = Some(RowStatus::CommitRow(true));
        // A row whose value is split over two chunks, then its marker (an empty copy).
        assert_eq!(
            push(
                &mut rows,
                chunk("a#1", Some(("cf", "name")), 2_000, "An", 3, None)
            )
            .unwrap(),
            None
        );
        assert_eq!(
            push(&mut rows, chunk("", None, 0, "n", 0, None)).unwrap(),
            None
        );
        let key = push(
            &mut rows,
            chunk("", Some(("cf", "name")), 2_000, "", 0, commit),
        );
        assert_eq!(key.unwrap(), Some(b"a#1".to_vec()));
        // A reset row is dropped; the next row has only a foreign cell: the row counts, its
        // cell is null, its version is the cell's.
        push(
            &mut rows,
            chunk("b#2", Some(("cf", "name")), 1, "lost", 0, None),
        )
        .unwrap();
        push(
            &mut rows,
            chunk("", None, 0, "", 0, Some(RowStatus::ResetRow(true))),
        )
        .unwrap();
        push(
            &mut rows,
            chunk("c#3", Some(("other", "q")), 5_000, "", 0, commit),
        )
        .unwrap();
        let batch = rows.finish(&spec).unwrap();
        assert_eq!(batch.num_rows(), 2);
        let k: Vec<_> = batch.column(0).as_string::<i32>().iter().collect();
        assert_eq!(k, [Some("a"), Some("c")]);
        let ids = batch.column(1).as_primitive::<Int64Type>();
        assert_eq!((ids.value(0), ids.value(1)), (1, 3));
        let names: Vec<_> = batch.column(2).as_string::<i32>().iter().collect();
        assert_eq!(names, [Some("Ann"), None]);
        let ts = batch.column(3).as_primitive::<Int64Type>();
        assert_eq!((ts.value(0), ts.value(1)), (2_000, 5_000));
    }

    #[test]
    fn cells_declared_in_any_order_are_found_by_family_and_qualifier() {
        // Three cells, declared out of the qualifiers' order and over two families.
        let spec = ScanSpec {
            schema: Arc::new(Schema::new(vec![
                Field::new("z", DataType::Utf8, true),
                Field::new("a", DataType::Utf8, true),
                Field::new("m", DataType::Utf8, true),
            ])),
            sources: vec![Source::Cell(0), Source::Cell(1), Source::Cell(2)],
            cells: vec![
                ("cf".into(), b"z".to_vec()),
                ("cf".into(), b"a".to_vec()),
                ("other".into(), b"m".to_vec()),
            ],
            key_parts: 1,
            ..spec()
        };
        let mut rows = Rows::new(&spec);
        let commit = Some(RowStatus::CommitRow(true));
        // The service sends families and qualifiers in order; a cell not read ("cf:b") is
        // skipped.
        push(&mut rows, chunk("r1", Some(("cf", "a")), 1, "A", 0, None)).unwrap();
        push(&mut rows, chunk("", Some(("cf", "b")), 1, "B", 0, None)).unwrap();
        push(&mut rows, chunk("", Some(("cf", "z")), 1, "Z", 0, None)).unwrap();
        push(
            &mut rows,
            chunk("", Some(("other", "m")), 1, "M", 0, commit),
        )
        .unwrap();
        push(
            &mut rows,
            chunk("r2", Some(("other", "m")), 1, "M2", 0, commit),
        )
        .unwrap();
        let batch = rows.finish(&spec).unwrap();
        let column = |i: usize| -> Vec<Option<String>> {
            batch
                .column(i)
                .as_string::<i32>()
                .iter()
                .map(|v| v.map(str::to_string))
                .collect()
        };
        assert_eq!(column(0), [Some("Z".to_string()), None]);
        assert_eq!(column(1), [Some("A".to_string()), None]);
        assert_eq!(column(2), [Some("M".to_string()), Some("M2".to_string())]);
    }

    #[test]
    fn a_key_with_fewer_parts_than_row_key_is_an_error_without_the_key() {
        let spec = spec();
        let mut rows = Rows::new(&spec);
        push(
            &mut rows,
            chunk(
                "secretkey",
                Some(("cf", "name")),
                1,
                "v",
                0,
                Some(RowStatus::CommitRow(true)),
            ),
        )
        .unwrap();
        let e = rows.finish(&spec).unwrap_err().to_string();
        assert!(e.contains("fewer than the 2 parts"), "{e}");
        assert!(!e.contains("secretkey"), "{e}");
    }

    #[test]
    fn a_new_row_before_a_commit_is_a_protocol_error() {
        let spec = spec();
        let mut rows = Rows::new(&spec);
        push(
            &mut rows,
            chunk("a#1", Some(("cf", "name")), 1, "v", 0, None),
        )
        .unwrap();
        let e = push(
            &mut rows,
            chunk("b#2", Some(("cf", "name")), 1, "v", 0, None),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("before the last was committed"), "{e}");
    }
}
