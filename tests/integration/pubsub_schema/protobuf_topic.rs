//! A topic with a **Protocol Buffer** schema, on a fake Pub/Sub server: the emulator refuses
//! Protocol Buffer schemas (`the_emulator_refuses_protocol_buffer_schemas`), so the only way to
//! show the sink reading such a topic's schema is a server that answers `GetTopic` and
//! `SchemaService.GetSchema` as googleapis `pubsub.proto` and `schema.proto` describe them, and
//! records every `Publish`. The sink calls nothing else here (any other method would answer
//! UNIMPLEMENTED).
//!
//! The table has no `format` option: the sink asks the topic for its schema when the statement
//! starts, compiles the `.proto` text it gets and encodes each row in the topic's encoding
//! (`JSON`: the proto3 JSON mapping; `BINARY`: the wire format). Every recorded message is
//! then decoded by Python's `google.protobuf` with a descriptor built by hand with
//! `descriptor_pb2` (not from our compiler) and compared to the values inserted: timestamps and
//! decimals (as `string` fields, since a topic schema cannot import
//! `google/protobuf/timestamp.proto`), nulls, an `optional` field, a nested message, a repeated
//! scalar, a repeated message, an enum, `bytes`. A row whose `count` is past `int32` is
//! dead-lettered (to a dead-letter topic on the same fake) with a reason naming the field.
//!
//! Run: `cargo test --test integration pubsub_schema::protobuf_topic::`.

use super::*;

use arrow::json::ReaderBuilder;
use gcloud_sdk::google::pubsub::v1::{
    GetSchemaRequest, GetTopicRequest, PublishRequest, PublishResponse,
};
use gcp_sql::testing::{FakeServer, Reply, Script};

const TOPIC: &str = "projects/fake-proto/topics/shipments";
const DEAD_TOPIC: &str = "projects/fake-proto/topics/shipments-dead";
const SCHEMA_NAME: &str = "projects/fake-proto/schemas/shipment";
/// The topic's `last_revision_id`: the sink must read this revision (`name@revision`).
const REVISION: &str = "rev-2";

/// What a Pub/Sub topic schema may hold: one top-level message, nested types inside it, no
/// imports. Timestamps, dates and decimals travel as `string` fields (docs/pubsub.md,
/// "Protobuf"); field names in snake_case, to show which spelling the JSON mapping writes.
const SHIPMENT_PROTO: &str = r#"syntax = "proto3";
message Shipment {
  message Parcel {
    string sku = 1;
    int32 weight_grams = 2;
  }
  enum Status {
    STATUS_UNSPECIFIED = 0;
    SENT = 1;
    LOST = 2;
  }
  int64 id = 1;
  optional string note = 2;  // presence: NULL leaves it unset, '' sets it
  Status status = 3;         // the value's name from a VARCHAR column
  string shipped_at = 4;     // a TIMESTAMP as RFC 3339 text (no Timestamp import here)
  string ship_date = 5;      // a DATE as YYYY-MM-DD
  string total_price = 6;    // a DECIMAL as its exact text
  Parcel parcel = 7;
  repeated Parcel items = 8;
  repeated string tags = 9;
  bytes label = 10;
  int32 count = 11;
}
"#;

/// The same message built with `descriptor_pb2` from a table of its fields (the `optional`
/// field with its synthetic oneof, as protoc describes it). Each payload is parsed by
/// `json_format.Parse` (`json`: it refuses unknown fields, wrong types and values out of range)
/// or `FromString` (`binary`, the wire format), then printed by `MessageToDict` with the
/// declared field names; with `printer`, parsed as JSON and printed again by `MessageToJson`
/// with its default options (what Google's Pub/Sub samples publish to a JSON topic).
const SHIPMENT_DECODER: &str = r#"
import base64, json, sys
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
F = descriptor_pb2.FieldDescriptorProto
KIND = {"string": F.TYPE_STRING, "int32": F.TYPE_INT32, "int64": F.TYPE_INT64,
        "bytes": F.TYPE_BYTES, ".Shipment.Parcel": F.TYPE_MESSAGE,
        ".Shipment.Status": F.TYPE_ENUM}
def fields(message, spec):
    # (name, kind, repeated), numbered from 1 in order, as in the .proto text.
    for number, (name, kind, repeated) in enumerate(spec, start=1):
        f = message.field.add(name=name, number=number, type=KIND[kind],
                              label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
        if kind.startswith("."):
            f.type_name = kind
        if name == "note":
            # proto3 `optional`: a synthetic oneof, as protoc describes it.
            message.oneof_decl.add(name="_note")
            f.oneof_index = 0
            f.proto3_optional = True
fd = descriptor_pb2.FileDescriptorProto(name="shipment.proto", syntax="proto3")
shipment = fd.message_type.add(name="Shipment")
fields(shipment.nested_type.add(name="Parcel"),
       [("sku", "string", False), ("weight_grams", "int32", False)])
status = shipment.enum_type.add(name="Status")
for number, name in enumerate(["STATUS_UNSPECIFIED", "SENT", "LOST"]):
    status.value.add(name=name, number=number)
fields(shipment, [
    ("id", "int64", False), ("note", "string", False), ("status", ".Shipment.Status", False),
    ("shipped_at", "string", False), ("ship_date", "string", False),
    ("total_price", "string", False),
    ("parcel", ".Shipment.Parcel", False), ("items", ".Shipment.Parcel", True),
    ("tags", "string", True), ("label", "bytes", False), ("count", "int32", False)])
pool = descriptor_pool.DescriptorPool()
pool.Add(fd)
Shipment = message_factory.GetMessageClass(pool.FindMessageTypeByName("Shipment"))
mode = sys.argv[1]
for line in sys.stdin:
    data = base64.b64decode(line)
    msg = Shipment.FromString(data) if mode == "binary" else json_format.Parse(data, Shipment())
    if mode == "printer":
        out = json.loads(json_format.MessageToJson(msg))
    else:
        out = json_format.MessageToDict(msg, preserving_proto_field_name=True)
    print(json.dumps(out, sort_keys=True))
"#;

/// The table's columns: what a user would declare for that schema.
fn shipment_schema() -> SchemaRef {
    let parcel = Fields::from(vec![
        Field::new("sku", DataType::Utf8, true),
        Field::new("weight_grams", DataType::Int32, true),
    ]);
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new(
            "shipped_at",
            DataType::Timestamp(TimeUnit::Nanosecond, None),
            true,
        ),
        Field::new("total_price", DataType::Decimal128(12, 3), true),
        Field::new("note", DataType::Utf8, true),
        Field::new("parcel", DataType::Struct(parcel.clone()), true),
        Field::new(
            "tags",
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
            true,
        ),
        Field::new(
            "items",
            DataType::List(Arc::new(Field::new("item", DataType::Struct(parcel), true))),
            true,
        ),
        Field::new("status", DataType::Utf8, true),
        Field::new("label", DataType::Binary, true),
        Field::new("ship_date", DataType::Date32, true),
        Field::new("count", DataType::Int64, true),
    ]))
}

/// Four rows, read from JSON lines by Arrow's JSON reader (binary as hex). Row 2 is all nulls
/// but its id and an empty (set) note; row 3 carries the extremes (a time before the epoch, a
/// negative decimal, `int32` bounds); row 4's `count` is past `int32`, so the schema refuses it.
fn shipment_rows(schema: &SchemaRef) -> RecordBatch {
    let lines = [
        json!({"id": 1, "shipped_at": "2024-05-06T07:08:09.123456Z", "total_price": "12.345",
               "note": "a", "parcel": {"sku": "p-1", "weight_grams": 250}, "tags": ["x", "y"],
               "items": [{"sku": "i-1", "weight_grams": 1}, {"sku": "i-2", "weight_grams": null}],
               "status": "SENT", "label": "0102ff", "ship_date": "2024-05-06", "count": 7}),
        json!({"id": 2, "note": ""}),
        json!({"id": 3, "shipped_at": "1969-12-31T23:59:59.999999Z", "total_price": "-0.500",
               "note": "c", "parcel": {"sku": "", "weight_grams": -5}, "tags": [],
               "items": [{"sku": "i-3", "weight_grams": 2_147_483_647}], "status": "LOST",
               "label": "", "ship_date": "1969-12-31", "count": -2_147_483_648_i64}),
        json!({"id": 4, "note": "d", "count": 1_099_511_627_776_i64}),
    ]
    .iter()
    .map(|l| l.to_string())
    .collect::<Vec<_>>()
    .join("\n");
    ReaderBuilder::new(schema.clone())
        .build(std::io::Cursor::new(lines))
        .expect("a JSON reader")
        .next()
        .expect("one batch")
        .expect("the rows decode")
}

/// What `MessageToDict` prints for the three rows that fit (proto3 leaves out fields at their
/// default, an `optional` one only when unset; int64 as strings, bytes as base64).
fn expected_messages() -> Vec<Value> {
    vec![
        json!({"id": "1", "shipped_at": "2024-05-06T07:08:09.123456Z", "total_price": "12.345",
               "note": "a", "parcel": {"sku": "p-1", "weight_grams": 250}, "tags": ["x", "y"],
               "items": [{"sku": "i-1", "weight_grams": 1}, {"sku": "i-2"}],
               "status": "SENT", "label": "AQL/", "ship_date": "2024-05-06", "count": 7}),
        json!({"id": "2", "note": ""}),
        json!({"id": "3", "shipped_at": "1969-12-31T23:59:59.999999Z", "total_price": "-0.500",
               "note": "c", "parcel": {"weight_grams": -5},
               "items": [{"sku": "i-3", "weight_grams": 2_147_483_647}], "status": "LOST",
               "ship_date": "1969-12-31", "count": -2_147_483_648_i64}),
    ]
}

/// The fake Pub/Sub service and the scripts it answers from.
struct FakePubSub {
    server: FakeServer,
    get_topic: Script<GetTopicRequest, Topic>,
    get_schema: Script<GetSchemaRequest, PubSubSchema>,
    publish: Script<PublishRequest, PublishResponse>,
}

impl FakePubSub {
    /// `GetTopic` answers `topic` (with the schema settings it is given), `GetSchema` the
    /// Protocol Buffer schema, `Publish` accepts every request with one id per message. Any
    /// other method answers UNIMPLEMENTED (the fake mounts nothing else).
    async fn start(topic: Topic) -> Self {
        let get_topic: Script<GetTopicRequest, Topic> = Script::new();
        get_topic.fallback(move |_| Reply::Ok(topic.clone()));
        let get_schema: Script<GetSchemaRequest, PubSubSchema> = Script::new();
        get_schema.fallback(|_| {
            Reply::Ok(PubSubSchema {
                name: SCHEMA_NAME.into(),
                r#type: schema::Type::ProtocolBuffer as i32,
                definition: SHIPMENT_PROTO.into(),
                revision_id: REVISION.into(),
                ..Default::default()
            })
        });
        let publish: Script<PublishRequest, PublishResponse> = Script::new();
        publish.fallback(|r: &PublishRequest| {
            Reply::Ok(PublishResponse {
                message_ids: (0..r.messages.len()).map(|i| format!("m{i}")).collect(),
            })
        });
        let server = FakeServer::builder()
            .unary("/google.pubsub.v1.Publisher/GetTopic", get_topic.clone())
            .unary(
                "/google.pubsub.v1.SchemaService/GetSchema",
                get_schema.clone(),
            )
            .unary("/google.pubsub.v1.Publisher/Publish", publish.clone())
            .start()
            .await
            .expect("start the fake Pub/Sub server");
        FakePubSub {
            server,
            get_topic,
            get_schema,
            publish,
        }
    }

    /// The messages published to `topic`, in the order they were received.
    fn published_to(&self, topic: &str) -> Vec<PubsubMessage> {
        self.publish
            .requests()
            .into_iter()
            .filter(|r| r.topic == topic)
            .flat_map(|r| r.messages)
            .collect()
    }
}

/// A topic whose schema settings name the Protocol Buffer schema in `encoding`.
fn topic_with_schema(encoding: Encoding) -> Topic {
    Topic {
        name: TOPIC.into(),
        schema_settings: Some(SchemaSettings {
            schema: SCHEMA_NAME.into(),
            encoding: encoding as i32,
            last_revision_id: REVISION.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Inserts the four rows through SQL into a table with no `format` option on the fake, under
/// `failure_policy = 'dead_letter'`. Returns the fake (its scripts) after the statement, having
/// checked what every `INSERT` of these rows must do: three rows delivered, one dead-lettered.
async fn insert_shipments(topic: Topic) -> FakePubSub {
    let fake = FakePubSub::start(topic).await;
    let host = fake.server.addr().to_string();
    let ctx = gcp_sql::sql::new_context();
    let schema = shipment_schema();
    register_pubsub_table(
        &ctx,
        "shipments",
        schema.clone(),
        &[
            ("emulator_host", host.as_str()),
            ("topic", TOPIC),
            ("failure_policy", "dead_letter"),
            ("dead_letter_topic", DEAD_TOPIC),
        ],
    );
    let source = MemTable::try_new(schema.clone(), vec![vec![shipment_rows(&schema)]]).unwrap();
    ctx.register_table("src", Arc::new(source)).unwrap();
    let done = insert(&ctx, "INSERT INTO shipments SELECT * FROM src").await;
    assert_eq!(done.count(), 3, "three rows fit the schema");
    assert_eq!(done.metric(names::RECORDS_DEAD_LETTERED), 1);
    // The schema was read once, at the revision the topic names.
    let asked = (fake.get_topic.requests(), fake.get_schema.requests());
    assert_eq!(asked.0.len(), 1);
    assert_eq!(asked.0[0].topic, TOPIC);
    assert_eq!(asked.1.len(), 1);
    assert_eq!(asked.1[0].name, format!("{SCHEMA_NAME}@{REVISION}"));
    fake
}

/// The refused row's dead letter: one message on the dead-letter topic whose reason names the
/// field and the limit, never the value.
fn check_dead_letter(fake: &FakePubSub) {
    let dead = fake.published_to(DEAD_TOPIC);
    assert_eq!(dead.len(), 1, "one dead letter");
    let why = dead[0]
        .attributes
        .get("error_message")
        .expect("an error message");
    assert!(why.contains("'count'") && why.contains("int32"), "{why}");
    assert!(
        !why.contains("1099511627776"),
        "the reason shows the value: {why}"
    );
    assert_eq!(
        dead[0].attributes.get("error_class").map(String::as_str),
        Some("encoding")
    );
}

/// Inserts the rows into a topic whose schema has `encoding`, checks the dead letter, and
/// checks that Python decodes every message that landed (`mode`: `json` or `binary`) to the
/// values inserted. Returns the messages that landed.
async fn landed_and_decoded(encoding: Encoding, mode: &str) -> Vec<PubsubMessage> {
    let fake = insert_shipments(topic_with_schema(encoding)).await;
    check_dead_letter(&fake);
    let landed = fake.published_to(TOPIC);
    let decoded = sorted_by_id(decode_with_python(SHIPMENT_DECODER, &[mode], &landed));
    assert_eq!(decoded, expected_messages());
    landed
}

/// JSON encoding: every message is proto3 JSON that `json_format.Parse` accepts and that holds
/// the values inserted. The JSON itself is what proto3 JSON printers write by default (and
/// Google's Pub/Sub samples publish, with `MessageToJson`): field names in lowerCamelCase
/// (`shippedAt` for `shipped_at`; a proto3 JSON parser accepts either spelling), int64 as a
/// string, the enum by name, bytes in base64, fields at their default left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_with_a_protobuf_schema_and_json_encoding_gets_proto3_json_google_protobuf_parses()
{
    let landed = landed_and_decoded(Encoding::Json, "json").await;
    let raw: Vec<Value> = landed
        .iter()
        .map(|m| serde_json::from_slice(&m.data).expect("JSON text"))
        .collect();
    // Exactly what google.protobuf's own printer writes for the same messages.
    assert_eq!(
        decode_with_python(SHIPMENT_DECODER, &["printer"], &landed),
        raw
    );
    let first = &raw[0];
    assert_eq!(first["id"], json!("1"), "{first}");
    assert_eq!(first["status"], json!("SENT"), "{first}");
    assert_eq!(first["label"], json!("AQL/"), "{first}");
    assert_eq!(first["parcel"]["weightGrams"], json!(250), "{first}");
    assert!(
        first.get("shippedAt").is_some() && first.get("shipped_at").is_none(),
        "{first}"
    );
    // A row of nulls: only its id and its set `optional` note are written.
    assert!(raw.contains(&json!({"id": "2", "note": ""})), "{raw:?}");
}

/// BINARY encoding: every message is the wire format, which `FromString` reads to the values
/// inserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_with_a_protobuf_schema_and_binary_encoding_gets_the_wire_format_google_protobuf_parses()
 {
    landed_and_decoded(Encoding::Binary, "binary").await;
}
