//! Times the Pub/Sub source's decode of Avro and Protobuf payloads alone, per message.
//!
//! It builds `N` rows of a ten-field schema (strings, integers, a double, a boolean, a
//! timestamp, an enum, a nested record, a list of strings), encodes each row as one payload
//! with the crate's own schema encoders (binary encoding, as Pub/Sub publishes it), wraps each
//! in a received message, and times `MessageDecoder::decode` over all of them, in batches of
//! the size a pull returns. No network, no emulator.
//!
//! ```sh
//! cargo run --release --example decode_bench            # N = 100000, 3 runs
//! cargo run --release --example decode_bench -- 20000 5  # N, runs
//! ```

use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Float64Array, Int32Array, Int64Array, ListArray, RecordBatch,
    StringArray, StructArray, TimestampMicrosecondArray,
};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use gcloud_sdk::google::pubsub::v1::{PubsubMessage, ReceivedMessage};
use gcp_sql::connectors::pubsub::source::decode::MessageDecoder;
use gcp_sql::connectors::pubsub::source::options::SourceColumns;
use gcp_sql::encode::schema::{PayloadSchema, SchemaEncoding, SchemaRowEncoder, SchemaType};
use gcp_sql::options::PayloadFormat;

/// This process's CPU time (user and system), in nanoseconds: the figure to compare on a
/// machine whose other work moves the wall clock.
fn cpu_nanos() -> u128 {
    // SAFETY: getrusage writes the struct it is given and reads nothing else.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let nanos = |t: libc::timeval| t.tv_sec as u128 * 1_000_000_000 + t.tv_usec as u128 * 1_000;
    nanos(usage.ru_utime) + nanos(usage.ru_stime)
}

/// Messages per decode call: a pull's largest response.
const BATCH: usize = 1000;

const AVRO: &str = r#"{"type": "record", "name": "Order", "fields": [
  {"name": "order_id", "type": "string"},
  {"name": "customer", "type": "string"},
  {"name": "quantity", "type": "int"},
  {"name": "amount_cents", "type": "long"},
  {"name": "price", "type": "double"},
  {"name": "paid", "type": "boolean"},
  {"name": "created", "type": {"type": "long", "logicalType": "timestamp-micros"}},
  {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
  {"name": "address", "type": {"type": "record", "name": "Address", "fields": [
    {"name": "street", "type": "string"},
    {"name": "city", "type": "string"},
    {"name": "zip", "type": ["null", "string"]}]}},
  {"name": "tags", "type": {"type": "array", "items": "string"}}
]}"#;

const PROTO: &str = r#"syntax = "proto3";
import "google/protobuf/timestamp.proto";
message Order {
  enum Status { NEW = 0; PAID = 1; SHIPPED = 2; }
  message Address { string street = 1; string city = 2; optional string zip = 3; }
  string order_id = 1;
  string customer = 2;
  int32 quantity = 3;
  int64 amount_cents = 4;
  double price = 5;
  bool paid = 6;
  google.protobuf.Timestamp created = 7;
  Status status = 8;
  Address address = 9;
  repeated string tags = 10;
}"#;

fn table() -> SchemaRef {
    let address = Fields::from(vec![
        Field::new("street", DataType::Utf8, false),
        Field::new("city", DataType::Utf8, false),
        Field::new("zip", DataType::Utf8, true),
    ]);
    Arc::new(Schema::new(vec![
        Field::new("order_id", DataType::Utf8, false),
        Field::new("customer", DataType::Utf8, false),
        Field::new("quantity", DataType::Int32, false),
        Field::new("amount_cents", DataType::Int64, false),
        Field::new("price", DataType::Float64, false),
        Field::new("paid", DataType::Boolean, false),
        Field::new(
            "created",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
        Field::new("status", DataType::Utf8, false),
        Field::new("address", DataType::Struct(address), true),
        Field::new(
            "tags",
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
            true,
        ),
    ]))
}

fn rows(schema: &SchemaRef, n: usize) -> RecordBatch {
    let statuses = ["NEW", "PAID", "SHIPPED"];
    let i32s = |f: fn(usize) -> i32| Int32Array::from_iter_values((0..n).map(f));
    let text = |f: &dyn Fn(usize) -> String| StringArray::from_iter_values((0..n).map(f));
    let address = StructArray::new(
        match schema.field_with_name("address").map(|f| f.data_type()) {
            Ok(DataType::Struct(fields)) => fields.clone(),
            _ => unreachable!("the table declares address as a struct"),
        },
        vec![
            Arc::new(text(&|i| format!("{} Market Street", i % 997))) as ArrayRef,
            Arc::new(text(&|i| ["Lisbon", "Porto", "Braga"][i % 3].to_string())),
            Arc::new(StringArray::from_iter(
                (0..n).map(|i| (i % 4 != 0).then(|| format!("{:05}", i % 99_999))),
            )),
        ],
        None,
    );
    let tag_counts = (0..n).map(|i| i % 4);
    let tags: Vec<String> = (0..n)
        .flat_map(|i| (0..i % 4).map(move |t| format!("tag-{}", (i + t) % 50)))
        .collect();
    let tags = ListArray::new(
        Arc::new(Field::new("item", DataType::Utf8, true)),
        OffsetBuffer::from_lengths(tag_counts),
        Arc::new(StringArray::from_iter_values(tags)),
        None,
    );
    let columns: Vec<ArrayRef> = vec![
        Arc::new(text(&|i| format!("order-{i:08}"))),
        Arc::new(text(&|i| format!("customer-{}@example.com", i % 5000))),
        Arc::new(i32s(|i| (i % 20) as i32 + 1)),
        Arc::new(Int64Array::from_iter_values(
            (0..n).map(|i| (i as i64) * 137 % 1_000_000),
        )),
        Arc::new(Float64Array::from_iter_values(
            (0..n).map(|i| (i % 10_000) as f64 / 100.0),
        )),
        Arc::new(BooleanArray::from_iter((0..n).map(|i| Some(i % 3 == 0)))),
        Arc::new(
            TimestampMicrosecondArray::from_iter_values(
                (0..n).map(|i| 1_700_000_000_000_000 + i as i64 * 1_000_003),
            )
            .with_timezone("UTC"),
        ),
        Arc::new(text(&|i| statuses[i % 3].to_string())),
        Arc::new(address),
        Arc::new(tags),
    ];
    RecordBatch::try_new(schema.clone(), columns).expect("the rows match the table")
}

fn messages(payloads: Vec<Vec<u8>>) -> Vec<ReceivedMessage> {
    payloads
        .into_iter()
        .enumerate()
        .map(|(i, data)| ReceivedMessage {
            ack_id: format!("ack-{i}"),
            message: Some(PubsubMessage {
                data,
                message_id: i.to_string(),
                publish_time: Some(prost_types::Timestamp {
                    seconds: 1_700_000_000,
                    nanos: 0,
                }),
                ..Default::default()
            }),
            delivery_attempt: 0,
        })
        .collect()
}

fn main() -> gcp_sql::Result<()> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let runs: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    let table = table();
    let columns: Vec<usize> = (0..table.fields().len()).collect();
    let batch = rows(&table, n);
    println!("| format | run | messages | ns/message | messages/s | CPU ns/message |");
    println!("|---|---|---|---|---|---|");
    for (kind, definition) in [(SchemaType::Avro, AVRO), (SchemaType::Protobuf, PROTO)] {
        let schema = PayloadSchema {
            kind,
            definition: definition.to_string(),
            encoding: SchemaEncoding::Binary,
            origin: "decode_bench".into(),
        };
        let payloads = SchemaRowEncoder::new(&schema, &table, &columns)?
            .encode_batch(&batch)?
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(gcp_sql::Error::Unsupported)?;
        let messages = messages(payloads);
        let decoder = MessageDecoder::new(
            table.clone(),
            PayloadFormat::Json,
            &SourceColumns::default(),
        )?
        .with_schema(&schema)?;
        for run in 1..=runs {
            let cpu = cpu_nanos();
            let start = Instant::now();
            let mut decoded = 0;
            for chunk in messages.chunks(BATCH) {
                let out = decoder.decode(chunk)?;
                assert!(
                    out.bad.is_empty(),
                    "a message did not decode: {:?}",
                    out.bad.first()
                );
                decoded += out.batch.num_rows();
            }
            let elapsed = start.elapsed();
            let cpu = (cpu_nanos() - cpu) as f64 / n as f64;
            assert_eq!(decoded, n);
            let per = elapsed.as_nanos() as f64 / n as f64;
            println!(
                "| {} | {run} | {n} | {per:.0} | {:.0} | {cpu:.0} |",
                kind.name(),
                1e9 / per
            );
        }
    }
    Ok(())
}
