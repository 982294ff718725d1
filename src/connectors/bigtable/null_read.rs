//! The null `ReadRows` server (feature `testing`): what `gcp-sql serve-null --service
//! bigtable-read` answers. It stands in for the reading side of the Bigtable data API: every
//! table name it is asked for holds the same canned rows ([`NullTable`]), streamed as fast as
//! HTTP/2 flow control lets the client take them, so that a scan's rows per second can be set
//! against what the server can send (the scan's ceiling, docs/benchmarks.md) and against any
//! other client reading the same rows.
//!
//! | method | answer |
//! |---|---|
//! | `Bigtable/ReadRows` | the rows of the request's row keys and ranges (the whole table when it names none), in key order, each once, at most `rows_limit`; responses of up to [`MAX_RESPONSE_BYTES`] |
//! | `Bigtable/SampleRowKeys` | a key every 1/[`SAMPLES`] of the table, with the bytes before it, then the table's end |
//!
//! Every other method answers `UNIMPLEMENTED`, and so does a reversed read. The request's
//! `filter` is **not** applied: every row is sent with both of its cells, one version each. A
//! reader asking for the latest version of every cell (what a scan of every column asks) gets
//! exactly what it asked for; one asking for fewer cells gets more than it asked for and must
//! drop the rest itself, so benchmarks read every column.
//!
//! Row `n` (from 0) of every table has the key `user-` followed by `n` zero-padded to seven
//! digits (more when the table has more than ten million rows), and two cells in family `cf`
//! with the server's start (whole milliseconds) as their version: `name`, the UTF-8 text
//! `name-n`, and `visits`, `n * 10` as an 8-byte big-endian integer: the shape of the emulator
//! benchmark's table (`SELECT k, visits, name` over `k VARCHAR, visits BIGINT, name VARCHAR`),
//! and the encoding the sink writes.
//!
//! The server's totals count calls: `requests` are the `ReadRows` calls that ended,
//! `records` the rows they sent and `record_bytes` those rows' cell values;
//! [`Reads::report`](crate::bench::null_server::NullDetails::report) adds the calls and rows so
//! far and the `SampleRowKeys` calls.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use gcloud_sdk::google::bigtable::v2::row_range::{EndKey, StartKey};
use gcloud_sdk::google::bigtable::v2::{
    ReadRowsRequest, RowSet, SampleRowKeysRequest, SampleRowKeysResponse,
};
use prost::bytes::BufMut;
use prost::encoding::WireType;
use tonic::Status;

use crate::bench::null_method::{
    Answer, GrpcRequest, GrpcResponse, MAX_REQUEST_BYTES, NullDetails, NullMethod, NullRoutes,
    NullService, NullState, Routed, WriteOnly, grpc,
};

/// Most bytes in one `ReadRows` response (beyond one row): a quarter of the 4 MiB a gRPC
/// client accepts by default. The service does not document its own response sizes.
pub const MAX_RESPONSE_BYTES: usize = 1024 * 1024;
/// How many samples `SampleRowKeys` answers for a table of at least that many rows.
pub const SAMPLES: u64 = 64;
/// The one column family of the canned table.
pub const FAMILY: &str = "cf";
/// The shortest number of digits after `user-` in a row key.
const MIN_DIGITS: usize = 7;

/// This service's null method, as its descriptor carries it.
pub static NULL_METHOD: NullMethod = NullMethod {
    name: "bigtable-read",
    method_path: super::client::READ_ROWS_PATH,
    records_word: "rows sent",
    max_request_bytes: MAX_REQUEST_BYTES,
    routes,
};

impl NullService {
    /// The Bigtable reading null service (`ReadRows`, `SampleRowKeys`).
    #[allow(non_upper_case_globals)]
    pub const BigtableRead: NullService = NullService::of(&NULL_METHOD);
}

/// The routes of the server: the Bigtable data service.
fn routes(state: Arc<NullState>) -> tonic::service::Routes {
    let micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64 * 1000);
    let reads = Arc::new(Reads {
        table: NullTable::new(state.feed().messages, micros),
        state: state.clone(),
        calls: AtomicU64::new(0),
        rows: AtomicU64::new(0),
        samples: AtomicU64::new(0),
    });
    state.set_details(reads.clone());
    tonic::service::Routes::new(Routed(BigtableGrpc { reads }))
}

/// The rows every table of the server holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NullTable {
    rows: u64,
    digits: usize,
    micros: i64,
}

impl NullTable {
    /// A table of `rows` rows whose cells have version `micros`.
    pub fn new(rows: u64, micros: i64) -> NullTable {
        let digits = rows.saturating_sub(1).max(1).ilog10() as usize + 1;
        NullTable {
            rows,
            digits: digits.max(MIN_DIGITS),
            micros,
        }
    }

    /// How many rows it holds.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// The key of row `n`.
    pub fn key(&self, n: u64) -> Vec<u8> {
        let mut key = Vec::with_capacity(5 + self.digits);
        self.write_key(n, &mut key);
        key
    }

    fn write_key(&self, n: u64, out: &mut Vec<u8>) {
        out.extend_from_slice(b"user-");
        let start = out.len();
        out.resize(start + self.digits, b'0');
        let mut rest = n;
        for digit in out[start..].iter_mut().rev() {
            *digit = b'0' + (rest % 10) as u8;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
    }

    /// The `name` cell of row `n`.
    pub fn name(n: u64) -> String {
        format!("name-{n}")
    }

    /// The `visits` cell of row `n`, as the sink writes a `BIGINT`.
    pub fn visits(n: u64) -> [u8; 8] {
        (n as i64).wrapping_mul(10).to_be_bytes()
    }

    /// The first row whose key is at least `key` (`rows` when none is).
    fn lower_bound(&self, key: &[u8]) -> u64 {
        let (mut lo, mut hi) = (0, self.rows);
        let mut probe = Vec::with_capacity(5 + self.digits);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            probe.clear();
            self.write_key(mid, &mut probe);
            if probe.as_slice() < key {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// The first row whose key is at least `key`, or (`skip_key`) greater than `key`.
    fn past(&self, key: &[u8], skip_key: bool) -> u64 {
        let at = self.lower_bound(key);
        if skip_key && at < self.rows && self.key(at) == key {
            at + 1
        } else {
            at
        }
    }

    /// The rows a row set names, as sorted disjoint ranges of row numbers (the whole table
    /// for no set or an empty one).
    pub fn ranges(&self, set: Option<&RowSet>) -> Vec<Range<u64>> {
        let set = match set {
            Some(s) if !s.row_keys.is_empty() || !s.row_ranges.is_empty() => s,
            _ => return std::iter::once(0..self.rows).collect(),
        };
        let mut ranges: Vec<Range<u64>> = Vec::new();
        for key in &set.row_keys {
            let at = self.lower_bound(key);
            if at < self.rows && self.key(at) == *key {
                ranges.push(at..at + 1);
            }
        }
        for range in &set.row_ranges {
            let start = match &range.start_key {
                None => 0,
                Some(StartKey::StartKeyClosed(k)) => self.past(k, false),
                Some(StartKey::StartKeyOpen(k)) => self.past(k, true),
            };
            let end = match &range.end_key {
                None => self.rows,
                Some(EndKey::EndKeyOpen(k) | EndKey::EndKeyClosed(k)) if k.is_empty() => self.rows,
                Some(EndKey::EndKeyOpen(k)) => self.past(k, false),
                Some(EndKey::EndKeyClosed(k)) => self.past(k, true),
            };
            if start < end {
                ranges.push(start..end);
            }
        }
        ranges.sort_by_key(|r| r.start);
        let mut merged: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
        for r in ranges {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        merged
    }

    /// Writes row `n` as its two chunks (`name`, then `visits` with the commit) into `out`, a
    /// `ReadRowsResponse` being built; returns the bytes of its cell values.
    fn write_row(&self, n: u64, out: &mut Vec<u8>, scratch: &mut Vec<u8>) -> u64 {
        let name = Self::name(n);
        let visits = Self::visits(n);
        // The first chunk: key, family, qualifier, version, value.
        scratch.clear();
        let mut key = Vec::with_capacity(5 + self.digits);
        self.write_key(n, &mut key);
        put_bytes(CHUNK_ROW_KEY, &key, scratch);
        encode_wrapped(CHUNK_FAMILY, FAMILY.as_bytes(), scratch);
        encode_wrapped(CHUNK_QUALIFIER, b"name", scratch);
        prost::encoding::int64::encode(CHUNK_TIMESTAMP, &self.micros, scratch);
        put_bytes(CHUNK_VALUE, name.as_bytes(), scratch);
        put_bytes(RESPONSE_CHUNKS, scratch, out);
        // The second: the same row and family, a new qualifier, and the commit.
        scratch.clear();
        encode_wrapped(CHUNK_QUALIFIER, b"visits", scratch);
        prost::encoding::int64::encode(CHUNK_TIMESTAMP, &self.micros, scratch);
        put_bytes(CHUNK_VALUE, &visits, scratch);
        prost::encoding::bool::encode(CHUNK_COMMIT_ROW, &true, scratch);
        put_bytes(RESPONSE_CHUNKS, scratch, out);
        (name.len() + visits.len()) as u64
    }

    /// The samples `SampleRowKeys` answers: a key every 1/[`SAMPLES`] of the rows with the
    /// bytes before it, then the empty key (the table's end) with all of them.
    pub fn samples(&self) -> Vec<SampleRowKeysResponse> {
        let mut out: Vec<SampleRowKeysResponse> = Vec::new();
        for i in 1..SAMPLES {
            let n = self.rows * i / SAMPLES;
            if n == 0 || out.last().is_some_and(|s| s.row_key == self.key(n)) {
                continue;
            }
            out.push(SampleRowKeysResponse {
                row_key: self.key(n),
                offset_bytes: (n * ROW_BYTES) as i64,
            });
        }
        out.push(SampleRowKeysResponse {
            row_key: Vec::new(),
            offset_bytes: (self.rows * ROW_BYTES) as i64,
        });
        out
    }
}

/// About what a row takes in storage, for the sample offsets.
const ROW_BYTES: u64 = 64;

/// Field numbers of `ReadRowsResponse.chunks` and of `CellChunk`'s fields.
const RESPONSE_CHUNKS: u32 = 1;
const CHUNK_ROW_KEY: u32 = 1;
const CHUNK_FAMILY: u32 = 2;
const CHUNK_QUALIFIER: u32 = 3;
const CHUNK_TIMESTAMP: u32 = 4;
const CHUNK_VALUE: u32 = 6;
const CHUNK_COMMIT_ROW: u32 = 9;

/// `value` as length-delimited field `tag`.
fn put_bytes(tag: u32, value: &[u8], buf: &mut Vec<u8>) {
    prost::encoding::encode_key(tag, WireType::LengthDelimited, buf);
    prost::encoding::encode_varint(value.len() as u64, buf);
    buf.extend_from_slice(value);
}

/// A `google.protobuf.StringValue` / `BytesValue` of `value` as field `tag`.
fn encode_wrapped(tag: u32, value: &[u8], buf: &mut Vec<u8>) {
    prost::encoding::encode_key(tag, WireType::LengthDelimited, buf);
    prost::encoding::encode_varint(
        (1 + prost::encoding::encoded_len_varint(value.len() as u64) + value.len()) as u64,
        buf,
    );
    put_bytes(1, value, buf);
}

/// One `ReadRowsResponse`, already serialized.
#[derive(Debug)]
struct Encoded(Vec<u8>);

impl WriteOnly for Encoded {
    fn write(&self, buf: &mut impl BufMut) {
        buf.put_slice(&self.0);
    }

    fn written_len(&self) -> usize {
        self.0.len()
    }
}

/// The server's table and its counts.
#[derive(Debug)]
pub struct Reads {
    table: NullTable,
    state: Arc<NullState>,
    calls: AtomicU64,
    rows: AtomicU64,
    samples: AtomicU64,
}

impl Reads {
    /// `ReadRows` calls so far (begun, whether or not they ended).
    pub fn read_rows_calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Rows sent so far, over every call.
    pub fn rows_sent(&self) -> u64 {
        self.rows.load(Ordering::Relaxed)
    }

    /// `SampleRowKeys` calls so far.
    pub fn sample_row_keys_calls(&self) -> u64 {
        self.samples.load(Ordering::Relaxed)
    }

    /// The table every name holds.
    pub fn table(&self) -> &NullTable {
        &self.table
    }
}

impl NullDetails for Reads {
    fn report(&self) -> String {
        format!(
            "read_rows_calls={} rows_sent={} sample_row_keys_calls={}",
            self.read_rows_calls(),
            self.rows_sent(),
            self.sample_row_keys_calls()
        )
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Refuses a request whose table (or the table of its authorized view) is not named
/// `projects/P/instances/I/tables/T`.
fn check_table(table_name: &str, authorized_view_name: &str) -> Result<(), Status> {
    let name = if authorized_view_name.is_empty() {
        table_name
    } else {
        authorized_view_name
            .split("/authorizedViews/")
            .next()
            .unwrap_or_default()
    };
    let parts: Vec<&str> = name.split('/').collect();
    match parts.as_slice() {
        ["projects", p, "instances", i, "tables", t]
            if !p.is_empty() && !i.is_empty() && !t.is_empty() =>
        {
            Ok(())
        }
        _ => Err(Status::invalid_argument(format!(
            "invalid table name '{name}': expected projects/P/instances/I/tables/T"
        ))),
    }
}

/// One call's progress through its rows; counts what it sent when it ends or is dropped.
struct ReadCall {
    reads: Arc<Reads>,
    ranges: std::vec::IntoIter<Range<u64>>,
    current: Range<u64>,
    left: u64,
    sent: u64,
    value_bytes: u64,
    request_bytes: u64,
    scratch: Vec<u8>,
}

impl ReadCall {
    /// The next response, `None` once every row was sent.
    fn next_response(&mut self) -> Option<Encoded> {
        let mut out = Vec::with_capacity(64 * 1024);
        let mut rows = 0;
        while self.left > 0 && out.len() < MAX_RESPONSE_BYTES {
            if self.current.is_empty() {
                match self.ranges.next() {
                    Some(r) => self.current = r,
                    None => break,
                }
                continue;
            }
            let n = self.current.start;
            self.current.start += 1;
            self.value_bytes += self.reads.table.write_row(n, &mut out, &mut self.scratch);
            self.left -= 1;
            rows += 1;
        }
        if rows == 0 {
            return None;
        }
        self.sent += rows;
        self.reads.rows.fetch_add(rows, Ordering::Relaxed);
        Some(Encoded(out))
    }
}

impl Drop for ReadCall {
    fn drop(&mut self) {
        self.reads
            .state
            .count_settled(self.sent, self.value_bytes, self.request_bytes);
    }
}

/// `ReadRows`: the rows of the request, in responses of up to [`MAX_RESPONSE_BYTES`].
#[derive(Clone)]
struct ReadRows {
    reads: Arc<Reads>,
}

impl tonic::server::ServerStreamingService<ReadRowsRequest> for ReadRows {
    type Response = Answer<Encoded>;
    type ResponseStream = BoxStream<'static, Result<Answer<Encoded>, Status>>;
    type Future = BoxFuture<'static, Result<tonic::Response<Self::ResponseStream>, Status>>;

    fn call(&mut self, request: tonic::Request<ReadRowsRequest>) -> Self::Future {
        let reads = self.reads.clone();
        Box::pin(async move {
            let request = request.into_inner();
            check_table(&request.table_name, &request.authorized_view_name)?;
            if request.reversed {
                return Err(Status::unimplemented(
                    "the null ReadRows server does not read in reverse",
                ));
            }
            if request.rows_limit < 0 {
                return Err(Status::invalid_argument(format!(
                    "rows_limit must be positive, given {}",
                    request.rows_limit
                )));
            }
            let latency = reads.state.latency();
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            reads.calls.fetch_add(1, Ordering::Relaxed);
            let call = ReadCall {
                ranges: reads.table.ranges(request.rows.as_ref()).into_iter(),
                reads: reads.clone(),
                current: 0..0,
                left: if request.rows_limit == 0 {
                    u64::MAX
                } else {
                    request.rows_limit as u64
                },
                sent: 0,
                value_bytes: 0,
                request_bytes: prost::Message::encoded_len(&request) as u64,
                scratch: Vec::with_capacity(128),
            };
            let stream = futures::stream::unfold(call, |mut call| async move {
                let response = call.next_response()?;
                Some((Ok(Answer(response)), call))
            });
            Ok(tonic::Response::new(
                Box::pin(stream) as Self::ResponseStream
            ))
        })
    }
}

/// `SampleRowKeys`: [`NullTable::samples`].
#[derive(Clone)]
struct SampleRowKeys {
    reads: Arc<Reads>,
}

impl tonic::server::ServerStreamingService<SampleRowKeysRequest> for SampleRowKeys {
    type Response = SampleRowKeysResponse;
    type ResponseStream = BoxStream<'static, Result<SampleRowKeysResponse, Status>>;
    type Future = BoxFuture<'static, Result<tonic::Response<Self::ResponseStream>, Status>>;

    fn call(&mut self, request: tonic::Request<SampleRowKeysRequest>) -> Self::Future {
        let reads = self.reads.clone();
        Box::pin(async move {
            let request = request.into_inner();
            check_table(&request.table_name, &request.authorized_view_name)?;
            reads.samples.fetch_add(1, Ordering::Relaxed);
            let samples = reads.table.samples().into_iter().map(Ok);
            Ok(tonic::Response::new(
                Box::pin(futures::stream::iter(samples)) as Self::ResponseStream,
            ))
        })
    }
}

/// The Bigtable data service: `ReadRows` and `SampleRowKeys`.
#[derive(Clone)]
struct BigtableGrpc {
    reads: Arc<Reads>,
}

impl NullRoutes for BigtableGrpc {
    const NAME: &'static str = "google.bigtable.v2.Bigtable";
    const SERVER: &'static str = "null ReadRows server";

    fn route(
        &self,
        method: &str,
        request: GrpcRequest,
    ) -> Option<BoxFuture<'static, GrpcResponse>> {
        let reads = self.reads.clone();
        Some(match method {
            "ReadRows" => Box::pin(async move {
                grpc::<Answer<Encoded>, ReadRowsRequest>(MAX_REQUEST_BYTES)
                    .server_streaming(ReadRows { reads }, request)
                    .await
            }),
            "SampleRowKeys" => Box::pin(async move {
                grpc::<SampleRowKeysResponse, SampleRowKeysRequest>(MAX_REQUEST_BYTES)
                    .server_streaming(SampleRowKeys { reads }, request)
                    .await
            }),
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use gcloud_sdk::google::bigtable::v2::read_rows_response::CellChunk;
    use gcloud_sdk::google::bigtable::v2::read_rows_response::cell_chunk::RowStatus;
    use gcloud_sdk::google::bigtable::v2::{ReadRowsResponse, RowRange};
    use prost::Message as _;

    use super::*;

    fn table(rows: u64) -> NullTable {
        NullTable::new(rows, 1_700_000_000_000_000)
    }

    #[test]
    fn keys_are_zero_padded_so_their_order_is_the_rows_order() {
        let t = table(1000);
        assert_eq!(t.key(0), b"user-0000000");
        assert_eq!(t.key(999), b"user-0000999");
        let wide = table(123_456_789);
        assert_eq!(wide.key(42), b"user-000000042");
        assert_eq!(wide.key(123_456_788), b"user-123456788");
    }

    #[test]
    fn a_row_encodes_as_the_generated_type_reads_it() {
        let t = table(100);
        let mut out = Vec::new();
        let bytes = t.write_row(17, &mut out, &mut Vec::new());
        assert_eq!(bytes, ("name-17".len() + 8) as u64);
        let response = ReadRowsResponse::decode(out.as_slice()).unwrap();
        let expected = vec![
            CellChunk {
                row_key: b"user-0000017".to_vec(),
                family_name: Some("cf".into()),
                qualifier: Some(b"name".to_vec()),
                timestamp_micros: 1_700_000_000_000_000,
                value: b"name-17".to_vec(),
                ..Default::default()
            },
            CellChunk {
                qualifier: Some(b"visits".to_vec()),
                timestamp_micros: 1_700_000_000_000_000,
                value: 170i64.to_be_bytes().to_vec(),
                row_status: Some(RowStatus::CommitRow(true)),
                ..Default::default()
            },
        ];
        assert_eq!(response.chunks, expected);
    }

    fn range(start: Option<StartKey>, end: Option<EndKey>) -> RowRange {
        RowRange {
            start_key: start,
            end_key: end,
        }
    }

    #[test]
    fn row_sets_become_sorted_disjoint_row_ranges() {
        let t = table(1000);
        assert_eq!(t.ranges(None), vec![0..1000]);
        assert_eq!(t.ranges(Some(&RowSet::default())), vec![0..1000]);
        let set = RowSet {
            row_keys: vec![
                t.key(5),
                b"user-00000050".to_vec(), // not a key of the table
                t.key(999),
            ],
            row_ranges: vec![
                // [10, 20] and (19, 30): merged into 10..30.
                range(
                    Some(StartKey::StartKeyClosed(t.key(10))),
                    Some(EndKey::EndKeyClosed(t.key(20))),
                ),
                range(
                    Some(StartKey::StartKeyOpen(t.key(19))),
                    Some(EndKey::EndKeyOpen(t.key(30))),
                ),
                // A prefix, as a scan asks for one: [user-00001, user-00002).
                range(
                    Some(StartKey::StartKeyClosed(b"user-00001".to_vec())),
                    Some(EndKey::EndKeyOpen(b"user-00002".to_vec())),
                ),
                // Past the table, and empty.
                range(Some(StartKey::StartKeyClosed(b"zzz".to_vec())), None),
                range(
                    Some(StartKey::StartKeyOpen(t.key(40))),
                    Some(EndKey::EndKeyOpen(t.key(41))),
                ),
            ],
        };
        assert_eq!(
            t.ranges(Some(&set)),
            vec![5..6, 10..30, 100..200, 999..1000]
        );
        // An empty end key is the table's end.
        let tail = RowSet {
            row_ranges: vec![range(
                Some(StartKey::StartKeyOpen(t.key(997))),
                Some(EndKey::EndKeyOpen(Vec::new())),
            )],
            ..Default::default()
        };
        assert_eq!(t.ranges(Some(&tail)), vec![998..1000]);
    }

    #[test]
    fn samples_split_the_table_evenly_and_end_with_the_empty_key() {
        let t = table(6400);
        let samples = t.samples();
        assert_eq!(samples.len(), SAMPLES as usize);
        assert_eq!(samples[0].row_key, t.key(100));
        assert_eq!(samples[0].offset_bytes, 100 * ROW_BYTES as i64);
        let last = samples.last().unwrap();
        assert!(last.row_key.is_empty());
        assert_eq!(last.offset_bytes, 6400 * ROW_BYTES as i64);
        // A table smaller than the samples: each key once, none at row 0.
        let small = table(3).samples();
        let keys: Vec<Vec<u8>> = small.iter().map(|s| s.row_key.clone()).collect();
        assert_eq!(
            keys,
            vec![b"user-0000001".to_vec(), b"user-0000002".to_vec(), vec![]]
        );
    }
}
