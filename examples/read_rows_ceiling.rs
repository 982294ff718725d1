//! The reading ceiling of a Bigtable scan: how fast a `ReadRows` server's responses arrive when
//! the client does nothing with them. docs/benchmarks.md sets `SELECT` against it.
//!
//! ```text
//! gcp-sql serve-null --service bigtable-read --rows 1000000 &     # prints its port
//! cargo run --release --example read_rows_ceiling -- 127.0.0.1:PORT projects/p/instances/i/tables/big 2 bytes
//! ```
//!
//! Arguments: the server's `host:port` (plaintext, as at an emulator), the table, how many
//! streams to read in parallel (default 2, as a scan on two cores splits), and what to do with
//! each response:
//!
//! - `bytes` (the default): nothing; it is taken as the bytes received (the scan's own codec,
//!   which does no more than that) and dropped. This is the ceiling: what the server and the
//!   transport deliver.
//! - `generated`: decode it into the generated `ReadRowsResponse` (prost) and count the rows
//!   committed, the least a client built on the generated types does.
//!
//! The table is split at the server's `SampleRowKeys` answer into that many key ranges of about
//! equal bytes, each read with one `ReadRows` on one shared HTTP/2 connection, as the scan
//! does. Prints the responses, bytes, rows (`generated` only), seconds and this process's CPU
//! seconds.

use std::time::Instant;

use gcp_sql::connectors::bigtable::scan::chunks::ReadRowsCodec;

use gcloud_sdk::google::bigtable::v2::bigtable_client::BigtableClient;
use gcloud_sdk::google::bigtable::v2::read_rows_response::cell_chunk::RowStatus;
use gcloud_sdk::google::bigtable::v2::row_range::{EndKey, StartKey};
use gcloud_sdk::google::bigtable::v2::{ReadRowsRequest, RowRange, RowSet, SampleRowKeysRequest};

type Client = BigtableClient<tonic::transport::Channel>;

/// CPU seconds this process used so far (user and system).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command's closing parenthesis: utime is the 12th, stime the 13th.
    let after = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields
        .get(11..13)
        .map(|f| f.iter().filter_map(|v| v.parse::<f64>().ok()).sum())
        .unwrap_or(0.0);
    ticks / 100.0
}

/// What one stream received: responses, bytes, rows committed (counted with `generated`).
#[derive(Default)]
struct Received {
    responses: u64,
    bytes: u64,
    rows: u64,
}

/// One range, read as `mode` says.
async fn read(
    client: Client,
    channel: tonic::transport::Channel,
    table: String,
    range: RowRange,
    generated: bool,
) -> Received {
    let request = ReadRowsRequest {
        table_name: table,
        rows: Some(RowSet {
            row_keys: Vec::new(),
            row_ranges: vec![range],
        }),
        ..Default::default()
    };
    let mut got = Received::default();
    if generated {
        let mut stream = client
            .clone()
            .read_rows(request)
            .await
            .expect("ReadRows opens")
            .into_inner();
        while let Some(response) = stream.message().await.expect("ReadRows streams") {
            got.responses += 1;
            got.bytes += prost::Message::encoded_len(&response) as u64;
            got.rows += response
                .chunks
                .iter()
                .filter(|c| matches!(c.row_status, Some(RowStatus::CommitRow(true))))
                .count() as u64;
        }
        return got;
    }
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(256 << 20);
    grpc.ready().await.expect("the channel is ready");
    let mut stream = grpc
        .server_streaming(
            tonic::Request::new(request),
            tonic::codegen::http::uri::PathAndQuery::from_static(
                "/google.bigtable.v2.Bigtable/ReadRows",
            ),
            ReadRowsCodec,
        )
        .await
        .expect("ReadRows opens")
        .into_inner();
    while let Some(response) = stream.message().await.expect("ReadRows streams") {
        got.responses += 1;
        got.bytes += response.len() as u64;
    }
    got
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(host), Some(table)) = (args.first(), args.get(1)) else {
        eprintln!("usage: read_rows_ceiling HOST:PORT projects/P/instances/I/tables/T [STREAMS]");
        std::process::exit(2);
    };
    let streams: usize = args
        .get(2)
        .map_or(2, |s| s.parse().expect("STREAMS is a number"));
    let generated = match args.get(3).map_or("bytes", String::as_str) {
        "bytes" => false,
        "generated" => true,
        other => {
            eprintln!("MODE is bytes or generated, not {other}");
            std::process::exit(2);
        }
    };
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{host}"))
        .expect("a host:port")
        .connect()
        .await
        .expect("the server answers");
    let client = BigtableClient::new(channel.clone()).max_decoding_message_size(256 * 1024 * 1024);
    let start = Instant::now();
    let cpu = cpu_seconds();
    // The boundaries: every k-th sample, so that each stream has about the same bytes.
    let mut samples = Vec::new();
    let mut sampled = client
        .clone()
        .sample_row_keys(SampleRowKeysRequest {
            table_name: table.clone(),
            ..Default::default()
        })
        .await
        .expect("SampleRowKeys opens")
        .into_inner();
    while let Some(s) = sampled.message().await.expect("SampleRowKeys streams") {
        if !s.row_key.is_empty() {
            samples.push(s.row_key);
        }
    }
    let mut bounds: Vec<Vec<u8>> = (1..streams)
        .filter_map(|i| samples.get(i * samples.len() / streams).cloned())
        .collect();
    bounds.dedup();
    let mut tasks = Vec::new();
    let mut from: Option<Vec<u8>> = None;
    for to in bounds.into_iter().map(Some).chain(std::iter::once(None)) {
        let range = RowRange {
            start_key: from.clone().map(StartKey::StartKeyClosed),
            end_key: to.clone().map(EndKey::EndKeyOpen),
        };
        tasks.push(tokio::spawn(read(
            client.clone(),
            channel.clone(),
            table.clone(),
            range,
            generated,
        )));
        from = to;
    }
    let mut all = Received::default();
    let parts = tasks.len();
    for task in tasks {
        let got = task.await.expect("a stream's task");
        all.responses += got.responses;
        all.bytes += got.bytes;
        all.rows += got.rows;
    }
    let seconds = start.elapsed().as_secs_f64();
    let rows = if generated {
        format!(
            " rows={} rows_per_s={:.0}",
            all.rows,
            all.rows as f64 / seconds
        )
    } else {
        String::new()
    };
    println!(
        "ceiling: mode={} streams={parts} responses={} bytes={} seconds={seconds:.3} mib_per_s={:.1}{rows} cpu_seconds={:.2}",
        if generated { "generated" } else { "bytes" },
        all.responses,
        all.bytes,
        all.bytes as f64 / seconds / 1048576.0,
        cpu_seconds() - cpu
    );
}
