//! The Pub/Sub row mapping: schema rules, per-row encoding and the Pub/Sub limits (the limits'
//! sources are on the constants in `connectors::pubsub::sink::mapping`).

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BinaryArray, Int32Array, Int64Array, LargeStringArray, MapBuilder,
    RecordBatch, StringArray, StringBuilder, StringViewArray, TimestampMillisecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use gcloud_sdk::google::pubsub::v1::PubsubMessage;
use gcp_sql::Error;
use gcp_sql::connectors::pubsub::sink::mapping::{
    MAX_ATTRIBUTE_KEY_BYTES, MAX_ATTRIBUTE_VALUE_BYTES, MAX_ATTRIBUTES, MAX_MESSAGE_BYTES,
    MAX_ORDERING_KEY_BYTES, MappingSpec, PayloadFormat, PubSubMapping, PubsubRecord,
};
use gcp_sql::core::Envelope;
use prost::Message as _;

type Encoded = Vec<Result<Envelope<PubsubRecord>, Error>>;
/// One map row: entries of (key, value), or `None` for a null map.
type MapRow<'a> = Option<&'a [(&'a str, Option<&'a str>)]>;

fn batch(columns: Vec<(&str, ArrayRef)>) -> (SchemaRef, RecordBatch) {
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(
        schema.clone(),
        columns.into_iter().map(|(_, a)| a).collect(),
    )
    .unwrap();
    (schema, batch)
}

fn string_map(rows: &[MapRow<'_>]) -> ArrayRef {
    let mut builder = MapBuilder::new(None, StringBuilder::new(), StringBuilder::new());
    for row in rows {
        match row {
            Some(entries) => {
                for (k, v) in *entries {
                    builder.keys().append_value(k);
                    builder.values().append_option(*v);
                }
                builder.append(true).unwrap();
            }
            None => builder.append(false).unwrap(),
        }
    }
    Arc::new(builder.finish())
}

fn mapping(spec: &MappingSpec, schema: &Schema) -> PubSubMapping {
    PubSubMapping::new(spec, schema, Some("events"), Some("demo")).unwrap()
}

fn encode(mapping: &PubSubMapping, batch: &RecordBatch) -> Encoded {
    let mut out = Vec::new();
    mapping.encode_batch(batch, 0, &mut out).unwrap();
    assert_eq!(out.len(), batch.num_rows());
    out
}

fn message(result: &Result<Envelope<PubsubRecord>, Error>) -> PubsubMessage {
    match result {
        Ok(envelope) => {
            let message = envelope.record.to_message().unwrap();
            // The byte count is the serialized size of exactly that message.
            assert_eq!(envelope.bytes as usize, message.encoded_len());
            assert_eq!(envelope.bytes as usize, envelope.record.encoded_len());
            message
        }
        Err(e) => panic!("row failed: {e}"),
    }
}

fn row_error(result: &Result<Envelope<PubsubRecord>, Error>) -> (u64, String) {
    match result {
        Err(Error::Encode { row, reason }) => (*row, reason.clone()),
        Err(other) => panic!("expected an encode error, got {other}"),
        Ok(_) => panic!("expected an encode error, the row was encoded"),
    }
}

fn schema_error(result: gcp_sql::Result<PubSubMapping>) -> (String, String) {
    match result {
        Err(Error::Schema { column, rule }) => (column, rule),
        Err(other) => panic!("expected a schema error, got {other}"),
        Ok(_) => panic!("expected a schema error, the mapping was accepted"),
    }
}

fn attrs(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

// --- payload ----------------------------------------------------------------------------------

#[test]
fn encodes_the_other_columns_as_json_when_there_is_no_data_column() {
    let (schema, batch) = batch(vec![
        ("id", Arc::new(Int64Array::from(vec![1, 2]))),
        (
            "name",
            Arc::new(StringViewArray::from(vec![Some("a"), None])),
        ),
        (
            "ordering_key",
            Arc::new(StringArray::from(vec![Some("k1"), None])),
        ),
        (
            "attributes",
            string_map(&[Some(&[("src", Some("web"))]), None]),
        ),
    ]);
    let out = encode(&mapping(&MappingSpec::default(), &schema), &batch);
    let first = message(&out[0]);
    assert_eq!(first.data, br#"{"id":1,"name":"a"}"#);
    assert_eq!(first.attributes, attrs(&[("src", "web")]));
    assert_eq!(first.ordering_key, "k1");
    let second = message(&out[1]);
    assert_eq!(second.data, br#"{"id":2,"name":null}"#);
    assert!(second.attributes.is_empty());
    assert_eq!(second.ordering_key, "");
    assert_eq!(out[1].as_ref().unwrap().sequence_key, None);
}

#[test]
fn sends_a_binary_or_string_data_column_as_it_is() {
    for data in [
        Arc::new(BinaryArray::from(vec![Some(&[0u8, 255, 1][..])])) as ArrayRef,
        Arc::new(StringViewArray::from(vec![Some("\u{0}\u{ff}")])),
        Arc::new(LargeStringArray::from(vec![Some("plain")])),
    ] {
        let expected: Vec<u8> = match data.data_type() {
            DataType::Binary => vec![0, 255, 1],
            DataType::Utf8View => "\u{0}\u{ff}".as_bytes().to_vec(),
            _ => b"plain".to_vec(),
        };
        let (schema, batch) = batch(vec![("data", data)]);
        let out = encode(&mapping(&MappingSpec::default(), &schema), &batch);
        assert_eq!(message(&out[0]).data, expected);
    }
}

#[test]
fn uses_a_renamed_data_column() {
    let (schema, batch) = batch(vec![("body", Arc::new(StringArray::from(vec!["x"])))]);
    let spec = MappingSpec {
        data_column: Some("body".into()),
        ..Default::default()
    };
    let out = encode(&mapping(&spec, &schema), &batch);
    assert_eq!(message(&out[0]).data, b"x");
}

#[test]
fn a_null_data_value_is_empty_data_and_needs_attributes() {
    let (schema, batch) = batch(vec![
        ("data", Arc::new(BinaryArray::from(vec![None, None]))),
        (
            "attributes",
            string_map(&[Some(&[("a", Some("1"))]), Some(&[])]),
        ),
    ]);
    let out = encode(&mapping(&MappingSpec::default(), &schema), &batch);
    let first = message(&out[0]);
    assert!(first.data.is_empty());
    assert_eq!(first.attributes, attrs(&[("a", "1")]));
    let (row, reason) = row_error(&out[1]);
    assert_eq!(row, 1);
    assert!(reason.contains("neither data nor attributes"), "{reason}");
}

#[test]
fn raw_format_sends_the_single_payload_column() {
    let (schema, batch) = batch(vec![
        (
            "payload",
            Arc::new(BinaryArray::from(vec![Some(&b"\x01\x02"[..])])),
        ),
        ("ordering_key", Arc::new(StringArray::from(vec!["k"]))),
    ]);
    let spec = MappingSpec {
        format: PayloadFormat::Raw,
        ..Default::default()
    };
    let out = encode(&mapping(&spec, &schema), &batch);
    let m = message(&out[0]);
    assert_eq!(m.data, b"\x01\x02");
    assert_eq!(m.ordering_key, "k");
}

#[test]
fn raw_format_refuses_more_than_one_payload_column() {
    let (schema, _) = batch(vec![
        ("a", Arc::new(StringArray::from(vec!["x"]))),
        ("b", Arc::new(StringArray::from(vec!["y"]))),
    ]);
    let spec = MappingSpec {
        format: PayloadFormat::Raw,
        ..Default::default()
    };
    let (column, rule) = schema_error(PubSubMapping::new(
        &spec,
        &schema,
        Some("events"),
        Some("demo"),
    ));
    assert_eq!(column, "a, b");
    assert!(
        rule.contains("'raw'") && rule.contains("exactly one"),
        "{rule}"
    );
}

#[test]
fn raw_format_refuses_a_non_bytes_payload_column() {
    let (schema, _) = batch(vec![("n", Arc::new(Int64Array::from(vec![1])))]);
    let spec = MappingSpec {
        format: PayloadFormat::Raw,
        ..Default::default()
    };
    let (column, rule) = schema_error(PubSubMapping::new(
        &spec,
        &schema,
        Some("events"),
        Some("demo"),
    ));
    assert_eq!(column, "n");
    assert!(rule.contains("Int64"), "{rule}");
}

#[test]
fn refuses_a_data_column_that_is_not_string_or_binary() {
    let (schema, _) = batch(vec![("data", Arc::new(Int64Array::from(vec![1])))]);
    let (column, rule) = schema_error(PubSubMapping::new(
        &MappingSpec::default(),
        &schema,
        Some("events"),
        Some("demo"),
    ));
    assert_eq!(column, "data");
    assert!(
        rule.contains("string or binary") && rule.contains("Int64"),
        "{rule}"
    );
}

#[test]
fn refuses_a_named_data_column_that_does_not_exist() {
    let (schema, _) = batch(vec![("x", Arc::new(StringArray::from(vec!["x"])))]);
    let spec = MappingSpec {
        data_column: Some("body".into()),
        ..Default::default()
    };
    let (column, rule) = schema_error(PubSubMapping::new(
        &spec,
        &schema,
        Some("events"),
        Some("demo"),
    ));
    assert_eq!(column, "body");
    assert!(rule.contains("data_column"), "{rule}");
}

#[test]
fn refuses_a_column_that_would_go_nowhere_beside_a_data_column() {
    let (schema, _) = batch(vec![
        ("data", Arc::new(StringArray::from(vec!["x"]))),
        ("stray", Arc::new(Int64Array::from(vec![1]))),
    ]);
    let (column, rule) = schema_error(PubSubMapping::new(
        &MappingSpec::default(),
        &schema,
        Some("events"),
        Some("demo"),
    ));
    assert_eq!(column, "stray");
    assert!(rule.contains("attribute_columns"), "{rule}");
}

#[test]
fn refuses_one_column_in_two_roles() {
    let (schema, _) = batch(vec![("k", Arc::new(StringArray::from(vec!["x"])))]);
    let spec = MappingSpec {
        data_column: Some("k".into()),
        ordering_key_column: Some("k".into()),
        ..Default::default()
    };
    let (column, rule) = schema_error(PubSubMapping::new(
        &spec,
        &schema,
        Some("events"),
        Some("demo"),
    ));
    assert_eq!(column, "k");
    assert!(
        rule.contains("data_column") && rule.contains("ordering_key_column"),
        "{rule}"
    );
}

// --- attributes -------------------------------------------------------------------------------

#[test]
fn merges_map_attributes_and_listed_columns_as_text_skipping_nulls() {
    let (schema, batch) = batch(vec![
        ("data", Arc::new(StringArray::from(vec!["d", "d"]))),
        (
            "attributes",
            string_map(&[Some(&[("a", Some("1")), ("skip", None)]), None]),
        ),
        ("user", Arc::new(Int64Array::from(vec![Some(42), None]))),
        (
            "at",
            Arc::new(TimestampMillisecondArray::from(vec![Some(0), Some(1_500)])),
        ),
    ]);
    let spec = MappingSpec {
        attribute_columns: vec!["user".into(), "at".into()],
        ..Default::default()
    };
    let out = encode(&mapping(&spec, &schema), &batch);
    assert_eq!(
        message(&out[0]).attributes,
        attrs(&[
            ("a", "1"),
            ("user", "42"),
            ("at", "1970-01-01T00:00:00.000Z")
        ])
    );
    assert_eq!(
        message(&out[1]).attributes,
        attrs(&[("at", "1970-01-01T00:00:01.500Z")])
    );
}

#[test]
fn listed_attribute_columns_leave_the_json_payload() {
    let (schema, batch) = batch(vec![
        ("id", Arc::new(Int64Array::from(vec![1]))),
        ("region", Arc::new(StringArray::from(vec!["eu"]))),
    ]);
    let spec = MappingSpec {
        attribute_columns: vec!["region".into()],
        ..Default::default()
    };
    let m = message(&encode(&mapping(&spec, &schema), &batch)[0]);
    assert_eq!(m.data, br#"{"id":1}"#);
    assert_eq!(m.attributes, attrs(&[("region", "eu")]));
}

#[test]
fn accepts_any_string_layout_in_the_attributes_map() {
    let keys = Arc::new(LargeStringArray::from(vec!["k"])) as ArrayRef;
    let values = Arc::new(StringViewArray::from(vec!["v"])) as ArrayRef;
    let entries = arrow::array::StructArray::from(vec![
        (
            Arc::new(Field::new("key", DataType::LargeUtf8, false)),
            keys,
        ),
        (
            Arc::new(Field::new("value", DataType::Utf8View, true)),
            values,
        ),
    ]);
    let map = arrow::array::MapArray::new(
        Arc::new(Field::new("entries", entries.data_type().clone(), false)),
        arrow::buffer::OffsetBuffer::new(vec![0, 1].into()),
        entries,
        None,
        false,
    );
    let (schema, batch) = batch(vec![
        ("data", Arc::new(StringArray::from(vec!["d"]))),
        ("attributes", Arc::new(map)),
    ]);
    let m = message(&encode(&mapping(&MappingSpec::default(), &schema), &batch)[0]);
    assert_eq!(m.attributes, attrs(&[("k", "v")]));
}

#[test]
fn refuses_an_attributes_column_that_is_not_a_string_map() {
    let (schema, _) = batch(vec![
        ("data", Arc::new(StringArray::from(vec!["d"]))),
        ("attributes", Arc::new(StringArray::from(vec!["a=b"]))),
    ]);
    let (column, rule) = schema_error(PubSubMapping::new(
        &MappingSpec::default(),
        &schema,
        Some("events"),
        Some("demo"),
    ));
    assert_eq!(column, "attributes");
    assert!(rule.contains("MAP"), "{rule}");

    let mut builder = MapBuilder::new(
        None,
        StringBuilder::new(),
        arrow::array::Int32Builder::new(),
    );
    builder.keys().append_value("k");
    builder.values().append_value(1);
    builder.append(true).unwrap();
    let (schema, _) = batch(vec![
        ("data", Arc::new(StringArray::from(vec!["d"]))),
        ("attributes", Arc::new(builder.finish())),
    ]);
    let (column, _) = schema_error(PubSubMapping::new(
        &MappingSpec::default(),
        &schema,
        Some("events"),
        Some("demo"),
    ));
    assert_eq!(column, "attributes");
}

#[test]
fn refuses_attribute_columns_naming_a_missing_column() {
    let (schema, _) = batch(vec![("id", Arc::new(Int64Array::from(vec![1])))]);
    let spec = MappingSpec {
        attribute_columns: vec!["nope".into()],
        ..Default::default()
    };
    let (column, rule) = schema_error(PubSubMapping::new(
        &spec,
        &schema,
        Some("events"),
        Some("demo"),
    ));
    assert_eq!(column, "nope");
    assert!(rule.contains("attribute_columns"), "{rule}");
}

#[test]
fn refuses_an_attribute_column_with_a_reserved_name() {
    let (schema, _) = batch(vec![("googx", Arc::new(StringArray::from(vec!["v"])))]);
    let spec = MappingSpec {
        attribute_columns: vec!["googx".into()],
        ..Default::default()
    };
    let (column, rule) = schema_error(PubSubMapping::new(
        &spec,
        &schema,
        Some("events"),
        Some("demo"),
    ));
    assert_eq!(column, "googx");
    assert!(rule.contains("goog"), "{rule}");
}

#[test]
fn enforces_the_attribute_limits_per_row() {
    let long_key = "k".repeat(MAX_ATTRIBUTE_KEY_BYTES + 1);
    let ok_key = "k".repeat(MAX_ATTRIBUTE_KEY_BYTES);
    let long_value = "v".repeat(MAX_ATTRIBUTE_VALUE_BYTES + 1);
    let ok_value = "v".repeat(MAX_ATTRIBUTE_VALUE_BYTES);
    let many: Vec<(String, Option<&str>)> = (0..=MAX_ATTRIBUTES)
        .map(|i| (format!("a{i}"), Some("x")))
        .collect();
    let many: Vec<(&str, Option<&str>)> = many.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    let exactly: Vec<(&str, Option<&str>)> = many[..MAX_ATTRIBUTES].to_vec();
    let long_key_row = [(long_key.as_str(), Some("v"))];
    let ok_row = [(ok_key.as_str(), Some(ok_value.as_str()))];
    let long_value_row = [("k", Some(long_value.as_str()))];
    let rows: Vec<MapRow<'_>> = vec![
        Some(&long_key_row),
        Some(&ok_row),
        Some(&long_value_row),
        Some(&many),
        Some(&exactly),
        Some(&[("goog-thing", Some("v"))]),
        Some(&[("dup", Some("1")), ("dup", Some("2"))]),
    ];
    let (schema, batch) = batch(vec![
        ("data", Arc::new(StringArray::from(vec!["d"; rows.len()]))),
        ("attributes", string_map(&rows)),
    ]);
    let out = encode(&mapping(&MappingSpec::default(), &schema), &batch);
    assert!(
        row_error(&out[0])
            .1
            .contains(&format!("limit of {MAX_ATTRIBUTE_KEY_BYTES} bytes"))
    );
    assert_eq!(message(&out[1]).attributes.len(), 1);
    assert!(
        row_error(&out[2])
            .1
            .contains(&format!("limit of {MAX_ATTRIBUTE_VALUE_BYTES} bytes"))
    );
    assert!(
        row_error(&out[3])
            .1
            .contains(&format!("limit of {MAX_ATTRIBUTES}"))
    );
    assert_eq!(message(&out[4]).attributes.len(), MAX_ATTRIBUTES);
    assert!(row_error(&out[5]).1.contains("reserves"));
    // The repeated key is a row's value: the error names its position in the map column, not
    // the key.
    let dup = row_error(&out[6]).1;
    assert!(
        dup.contains("attribute 2 of column 'attributes'")
            && dup.contains("attribute 1 of column 'attributes'")
            && dup.contains("given more than once"),
        "{dup}"
    );
    assert!(!dup.contains("dup"), "{dup}");
    let long_key = row_error(&out[0]).1;
    assert!(!long_key.contains(&long_key_row[0].0[..20]), "{long_key}");
    assert!(!row_error(&out[5]).1.contains("goog-thing"));
}

#[test]
fn refuses_binary_attribute_text_that_is_not_utf8() {
    let (schema, batch) = batch(vec![
        ("data", Arc::new(StringArray::from(vec!["d", "d"]))),
        (
            "tag",
            Arc::new(BinaryArray::from(vec![
                Some(&b"ok"[..]),
                Some(&[0xff, 0xfe][..]),
            ])),
        ),
    ]);
    let spec = MappingSpec {
        attribute_columns: vec!["tag".into()],
        ..Default::default()
    };
    let out = encode(&mapping(&spec, &schema), &batch);
    assert_eq!(message(&out[0]).attributes, attrs(&[("tag", "ok")]));
    let (row, reason) = row_error(&out[1]);
    assert_eq!(row, 1);
    assert!(
        reason.contains("'tag'") && reason.contains("UTF-8"),
        "{reason}"
    );
}

// --- ordering key -----------------------------------------------------------------------------

#[test]
fn null_or_empty_ordering_keys_mean_no_key_and_long_ones_are_refused() {
    let long = "o".repeat(MAX_ORDERING_KEY_BYTES + 1);
    let max = "o".repeat(MAX_ORDERING_KEY_BYTES);
    let (schema, batch) = batch(vec![
        ("data", Arc::new(StringArray::from(vec!["d"; 4]))),
        (
            "ordering_key",
            Arc::new(StringArray::from(vec![
                None,
                Some(""),
                Some(long.as_str()),
                Some(max.as_str()),
            ])),
        ),
    ]);
    let out = encode(&mapping(&MappingSpec::default(), &schema), &batch);
    assert_eq!(out[0].as_ref().unwrap().sequence_key, None);
    assert_eq!(out[1].as_ref().unwrap().sequence_key, None);
    assert!(
        row_error(&out[2])
            .1
            .contains(&format!("limit of {MAX_ORDERING_KEY_BYTES} bytes"))
    );
    assert_eq!(
        out[3].as_ref().unwrap().sequence_key.as_deref(),
        Some(max.as_str())
    );
    assert_eq!(message(&out[3]).ordering_key, max);
}

#[test]
fn refuses_an_ordering_key_column_that_is_not_a_string() {
    let (schema, _) = batch(vec![
        ("data", Arc::new(StringArray::from(vec!["d"]))),
        ("ordering_key", Arc::new(Int32Array::from(vec![1]))),
    ]);
    let (column, rule) = schema_error(PubSubMapping::new(
        &MappingSpec::default(),
        &schema,
        Some("events"),
        Some("demo"),
    ));
    assert_eq!(column, "ordering_key");
    assert!(rule.contains("string"), "{rule}");
}

// --- topics -----------------------------------------------------------------------------------

#[test]
fn resolves_per_record_topics_and_falls_back_to_the_table_topic() {
    let (schema, batch) = batch(vec![
        ("data", Arc::new(StringArray::from(vec!["d"; 5]))),
        (
            "dest",
            Arc::new(StringArray::from(vec![
                Some("projects/other/topics/alpha"),
                Some("beta"),
                None,
                Some("9bad"),
                Some("beta"),
            ])),
        ),
    ]);
    let spec = MappingSpec {
        topic_column: Some("dest".into()),
        ..Default::default()
    };
    let out = encode(&mapping(&spec, &schema), &batch);
    let topic = |i: usize| out[i].as_ref().unwrap().destination.clone();
    assert_eq!(&*topic(0), "projects/other/topics/alpha");
    assert_eq!(&*topic(1), "projects/demo/topics/beta");
    assert_eq!(&*topic(2), "projects/demo/topics/events");
    let (row, reason) = row_error(&out[3]);
    assert_eq!(row, 3);
    assert!(reason.contains("start with a letter"), "{reason}");
    // The same topic within a batch shares one allocation.
    assert!(Arc::ptr_eq(&topic(1), &topic(4)));
}

#[test]
fn the_fixed_topic_is_shared_by_every_record() {
    let (schema, batch) = batch(vec![("data", Arc::new(StringArray::from(vec!["a", "b"])))]);
    let mapping = mapping(&MappingSpec::default(), &schema);
    let out = encode(&mapping, &batch);
    let fixed = mapping.default_topic().unwrap();
    assert_eq!(&**fixed, "projects/demo/topics/events");
    for r in &out {
        assert!(Arc::ptr_eq(&r.as_ref().unwrap().destination, fixed));
    }
}

#[test]
fn a_row_without_any_topic_is_refused() {
    let (schema, batch) = batch(vec![
        ("data", Arc::new(StringArray::from(vec!["d", "d"]))),
        (
            "dest",
            Arc::new(StringArray::from(vec![
                Some("projects/p/topics/good"),
                None,
            ])),
        ),
    ]);
    let spec = MappingSpec {
        topic_column: Some("dest".into()),
        ..Default::default()
    };
    let mapping = PubSubMapping::new(&spec, &schema, None, None).unwrap();
    let out = encode(&mapping, &batch);
    assert_eq!(
        &*out[0].as_ref().unwrap().destination,
        "projects/p/topics/good"
    );
    let (_, reason) = row_error(&out[1]);
    assert!(
        reason.contains("'dest'") && reason.contains("no default topic"),
        "{reason}"
    );
}

#[test]
fn a_short_topic_id_without_a_project_is_refused() {
    let (schema, batch) = batch(vec![
        ("data", Arc::new(StringArray::from(vec!["d"]))),
        ("dest", Arc::new(StringArray::from(vec!["short"]))),
    ]);
    let spec = MappingSpec {
        topic_column: Some("dest".into()),
        ..Default::default()
    };
    let mapping = PubSubMapping::new(&spec, &schema, None, None).unwrap();
    assert!(
        row_error(&encode(&mapping, &batch)[0])
            .1
            .contains("no project")
    );
    let err = PubSubMapping::new(
        &MappingSpec::default(),
        &schema_only_data(),
        Some("short"),
        None,
    )
    .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidOption { option, .. } if option == "topic"),
        "{err}"
    );
}

fn schema_only_data() -> Schema {
    Schema::new(vec![Field::new("data", DataType::Utf8, true)])
}

#[test]
fn refuses_a_table_without_topic_or_topic_column() {
    let err = PubSubMapping::new(
        &MappingSpec::default(),
        &schema_only_data(),
        None,
        Some("demo"),
    )
    .unwrap_err();
    assert!(
        matches!(&err, Error::MissingOption { option, .. } if option == "topic"),
        "{err}"
    );
}

#[test]
fn refuses_a_topic_column_that_is_not_a_string() {
    let (schema, _) = batch(vec![
        ("data", Arc::new(StringArray::from(vec!["d"]))),
        ("dest", Arc::new(Int64Array::from(vec![1]))),
    ]);
    let spec = MappingSpec {
        topic_column: Some("dest".into()),
        ..Default::default()
    };
    let (column, rule) = schema_error(PubSubMapping::new(
        &spec,
        &schema,
        Some("events"),
        Some("demo"),
    ));
    assert_eq!(column, "dest");
    assert!(rule.contains("topic_column"), "{rule}");
}

#[test]
fn refuses_an_invalid_table_topic() {
    for bad in ["projects/demo/topics/goog-x", "projects/demo/subs/x", "ab"] {
        let err = PubSubMapping::new(
            &MappingSpec::default(),
            &schema_only_data(),
            Some(bad),
            Some("demo"),
        )
        .unwrap_err();
        assert!(
            matches!(&err, Error::InvalidOption { option, value, .. } if option == "topic" && value == bad),
            "{err}"
        );
    }
}

// --- size and isolation -----------------------------------------------------------------------

#[test]
fn refuses_an_oversized_message_but_encodes_its_neighbours() {
    let big = vec![b'x'; MAX_MESSAGE_BYTES as usize];
    let rows: Vec<Option<&[u8]>> = vec![Some(b"before"), Some(&big), Some(b"after")];
    let (schema, batch) = batch(vec![("data", Arc::new(BinaryArray::from(rows)))]);
    let mut out = Vec::new();
    mapping(&MappingSpec::default(), &schema)
        .encode_batch(&batch, 100, &mut out)
        .unwrap();
    assert_eq!(message(&out[0]).data, b"before");
    let (row, reason) = row_error(&out[1]);
    assert_eq!(row, 101);
    assert!(reason.contains(&MAX_MESSAGE_BYTES.to_string()), "{reason}");
    assert_eq!(message(&out[2]).data, b"after");
}

#[test]
fn a_bad_row_in_the_middle_leaves_every_other_row_encoded() {
    let keys: Vec<Option<String>> = (0..9)
        .map(|i| {
            Some(if i == 4 {
                "o".repeat(MAX_ORDERING_KEY_BYTES + 1)
            } else {
                format!("key{i}")
            })
        })
        .collect();
    let (schema, batch) = batch(vec![
        (
            "n",
            Arc::new(Int64Array::from((0..9).collect::<Vec<i64>>())),
        ),
        ("ordering_key", Arc::new(StringArray::from(keys))),
    ]);
    let mut out = Vec::new();
    mapping(&MappingSpec::default(), &schema)
        .encode_batch(&batch, 1_000, &mut out)
        .unwrap();
    for (i, result) in out.iter().enumerate() {
        if i == 4 {
            assert_eq!(row_error(result).0, 1_004);
        } else {
            let m = message(result);
            assert_eq!(m.data, format!("{{\"n\":{i}}}").into_bytes());
            assert_eq!(m.ordering_key, format!("key{i}"));
        }
    }
}

#[test]
fn appends_to_the_output_and_counts_rows_from_the_given_index() {
    let (schema, batch) = batch(vec![(
        "data",
        Arc::new(StringArray::from(vec![Some("a"), None])),
    )]);
    let mapping = mapping(&MappingSpec::default(), &schema);
    let mut out = Vec::new();
    mapping.encode_batch(&batch, 0, &mut out).unwrap();
    mapping.encode_batch(&batch, 2, &mut out).unwrap();
    assert_eq!(out.len(), 4);
    assert_eq!(row_error(&out[1]).0, 1);
    assert_eq!(row_error(&out[3]).0, 3);
}

#[test]
fn refuses_a_batch_with_another_schema() {
    let (schema, _) = batch(vec![("data", Arc::new(StringArray::from(vec!["a"])))]);
    let (_, other) = batch(vec![("data", Arc::new(Int64Array::from(vec![1])))]);
    let mut out = Vec::new();
    assert!(
        mapping(&MappingSpec::default(), &schema)
            .encode_batch(&other, 0, &mut out)
            .is_err()
    );
}

// --- micro-benchmark --------------------------------------------------------------------------

/// Compares the two record representations over the same rows (run in release for numbers:
/// `cargo test --release --test integration pubsub_mapping:: -- --ignored --nocapture`).
#[test]
#[ignore = "micro-benchmark; prints timings"]
fn mapping_throughput_benchmark() {
    bench::run(200_000);
}

pub mod bench {
    //! Shared with a standalone release harness; see `mapping_throughput_benchmark`.
    use std::time::Instant;

    use super::*;
    use arrow::array::AsArray;
    use gcloud_sdk::google::pubsub::v1::PublishRequest;

    /// Encodes `rows` rows both ways and prints rows/s.
    pub fn run(rows: usize) {
        let ids: Vec<i64> = (0..rows as i64).collect();
        let names: Vec<String> = (0..rows).map(|i| format!("user-{i} \"quoted\"")).collect();
        let keys: Vec<String> = (0..rows).map(|i| format!("key-{}", i % 64)).collect();
        let mut attributes = MapBuilder::new(None, StringBuilder::new(), StringBuilder::new());
        for i in 0..rows {
            attributes.keys().append_value("source");
            attributes.values().append_value("bench");
            attributes.keys().append_value("shard");
            attributes.values().append_value((i % 16).to_string());
            attributes.append(true).unwrap();
        }
        let (schema, batch) = batch(vec![
            ("id", Arc::new(Int64Array::from(ids))),
            (
                "name",
                Arc::new(StringViewArray::from_iter_values(names.iter())),
            ),
            (
                "ts",
                Arc::new(TimestampMillisecondArray::from_iter_values(
                    (0..rows as i64).map(|i| i * 1_000),
                )),
            ),
            (
                "ordering_key",
                Arc::new(StringArray::from_iter_values(keys.iter())),
            ),
            ("attributes", Arc::new(attributes.finish())),
        ]);
        let mapping = PubSubMapping::new(
            &MappingSpec::default(),
            &schema,
            Some("bench-topic"),
            Some("demo"),
        )
        .unwrap();

        // A: pre-encoded bytes, then PublishRequest bodies by concatenation.
        let start = Instant::now();
        let mut out = Vec::with_capacity(rows);
        mapping.encode_batch(&batch, 0, &mut out).unwrap();
        let encoded = start.elapsed();
        let records: Vec<&PubsubRecord> = out.iter().map(|r| &r.as_ref().unwrap().record).collect();
        let start = Instant::now();
        let mut request_bytes = 0usize;
        for chunk in records.chunks(1_000) {
            let mut body = Vec::new();
            gcp_sql::connectors::pubsub::sink::mapping::write_publish_request(
                &mut body,
                "projects/demo/topics/bench-topic",
                chunk.iter().map(|r| r.encoded()),
            );
            request_bytes += body.len();
        }
        let requests = start.elapsed();
        println!(
            "pre-encoded: encode {:.0} rows/s, request build {:.0} rows/s ({request_bytes} bytes)",
            rows as f64 / encoded.as_secs_f64(),
            rows as f64 / requests.as_secs_f64()
        );

        // B: PubsubMessage structs built from the same columns (JSON data Vec, attribute
        // HashMap, ordering key String), sized with encoded_len and prost-encoded per request
        // (cloned into it, as a retrying sender must keep its copy).
        let start = Instant::now();
        let json = gcp_sql::encode::JsonRowEncoder::new(&schema, &[0, 1, 2]).unwrap();
        let mut json_rows = json.bind(&batch).unwrap();
        let map = batch.column(4).as_map();
        let (map_keys, map_values) = (
            map.keys().as_string::<i32>(),
            map.values().as_string::<i32>(),
        );
        let ordering = batch.column(3).as_string::<i32>();
        let messages: Vec<PubsubMessage> = (0..rows)
            .map(|row| {
                let mut data = Vec::new();
                json_rows.write_row(row, &mut data);
                let offsets = map.value_offsets();
                let attributes = (offsets[row] as usize..offsets[row + 1] as usize)
                    .map(|e| {
                        (
                            map_keys.value(e).to_string(),
                            map_values.value(e).to_string(),
                        )
                    })
                    .collect();
                PubsubMessage {
                    data,
                    attributes,
                    ordering_key: ordering.value(row).to_string(),
                    ..Default::default()
                }
            })
            .collect();
        let built = start.elapsed();
        let start = Instant::now();
        let sizes: usize = messages.iter().map(|m| m.encoded_len()).sum();
        let sized = start.elapsed();
        let start = Instant::now();
        let mut request_bytes_b = 0usize;
        for chunk in messages.chunks(1_000) {
            let request = PublishRequest {
                topic: "projects/demo/topics/bench-topic".into(),
                messages: chunk.to_vec(),
            };
            request_bytes_b += request.encode_to_vec().len();
        }
        let requests_b = start.elapsed();
        println!(
            "structs: build {:.0} rows/s, encoded_len {:.0} rows/s \
             ({sizes} bytes), request encode {:.0} rows/s ({request_bytes_b} bytes)",
            rows as f64 / built.as_secs_f64(),
            rows as f64 / sized.as_secs_f64(),
            rows as f64 / requests_b.as_secs_f64()
        );
        assert_eq!(request_bytes, request_bytes_b);
    }
}
