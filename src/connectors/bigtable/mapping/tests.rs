use std::sync::Arc;

use arrow::array::{
    ArrayRef, BinaryArray, BooleanArray, Date32Array, Decimal128Array, DictionaryArray,
    Float32Array, Int8Array, Int32Array, Int64Array, ListArray, NullArray, StringArray,
    StructArray, TimestampMillisecondArray, TimestampNanosecondArray, UInt64Array,
};
use arrow::datatypes::{
    DataType, Field, Fields, Int8Type, Int32Type, Schema, TimeUnit, UnionFields, UnionMode,
};
use gcloud_sdk::google::bigtable::v2::mutation::{self, DeleteFromColumn, SetCell};
use gcloud_sdk::google::bigtable::v2::{Mutation, mutate_rows_request::Entry};

use super::*;
use crate::connectors::TableOptions;
use crate::options::RawOptions;
use crate::test_util::struct_field;

const TABLE: &str = "projects/p/instances/i/tables/t";
const NOW: i64 = 1_700_000_000_123_456;

fn options(pairs: &[(&str, &str)]) -> BigtableSinkOptions {
    let raw = RawOptions::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
        .expect("pairs");
    BigtableSinkOptions::from_raw(None, &raw).expect("options")
}

fn mapping(schema: &Schema, pairs: &[(&str, &str)]) -> Result<BigtableMapping> {
    BigtableMapping::new(&options(pairs), schema)
}

fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
    RecordBatch::try_from_iter_with_nullable(
        columns
            .into_iter()
            .map(|(n, a)| (n, a, true))
            .collect::<Vec<_>>(),
    )
    .expect("batch")
}

fn encode(
    m: &BigtableMapping,
    b: &RecordBatch,
) -> Vec<std::result::Result<Envelope<BigtableEntry>, Error>> {
    let mut out = Vec::new();
    m.encode_batch_at(b, 100, NOW, &mut out).expect("encode");
    out
}

fn entries(m: &BigtableMapping, b: &RecordBatch) -> Vec<Entry> {
    encode(m, b)
        .into_iter()
        .map(|r| r.expect("row encodes").record.to_entry().expect("decodes"))
        .collect()
}

fn set_cell(m: &Mutation) -> &SetCell {
    match &m.mutation {
        Some(mutation::Mutation::SetCell(s)) => s,
        other => panic!("expected SetCell, found {other:?}"),
    }
}

fn reason(r: &std::result::Result<Envelope<BigtableEntry>, Error>) -> String {
    match r {
        Err(Error::Encode { reason, .. }) => reason.clone(),
        other => panic!("expected an encode error, found {other:?}"),
    }
}

const NOW_MS_ALIGNED: i64 = 1_700_000_000_123_000;

#[test]
fn hand_written_entry_bytes_match_prost() {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("a", DataType::Utf8, true),
        Field::new("b", DataType::Int64, true),
    ]);
    let m = mapping(
        &schema,
        &[
            ("table", TABLE),
            ("row_key", "id"),
            ("null_handling", "delete"),
        ],
    )
    .unwrap();
    let b = batch(vec![
        ("id", Arc::new(StringArray::from(vec!["k1"])) as ArrayRef),
        ("a", Arc::new(StringArray::from(vec![Some("x")]))),
        ("b", Arc::new(Int64Array::from(vec![None]))),
    ]);
    let out = encode(&m, &b);
    let envelope = out[0].as_ref().unwrap();
    let expected = Entry {
        row_key: b"k1".to_vec(),
        mutations: vec![
            Mutation {
                timestamp_origin: 0,
                mutation: Some(mutation::Mutation::SetCell(SetCell {
                    family_name: "cf".into(),
                    column_qualifier: b"a".to_vec(),
                    timestamp_micros: NOW_MS_ALIGNED,
                    value: b"x".to_vec(),
                })),
            },
            Mutation {
                timestamp_origin: 0,
                mutation: Some(mutation::Mutation::DeleteFromColumn(DeleteFromColumn {
                    family_name: "cf".into(),
                    column_qualifier: b"b".to_vec(),
                    time_range: None,
                })),
            },
        ],
        idempotency: None,
    };
    assert_eq!(
        envelope.record.encoded(),
        expected.encode_to_vec().as_slice()
    );
    assert_eq!(envelope.bytes, expected.encoded_len() as u64);
    assert_eq!(envelope.record.row(), 100);
    assert_eq!(envelope.record.row_key(), b"k1");
    assert_eq!(envelope.record.mutation_count(), 2);
    assert_eq!(&*envelope.destination, TABLE);
}

#[test]
fn request_bytes_match_prost() {
    use gcloud_sdk::google::bigtable::v2::MutateRowsRequest;
    let e1 = Entry {
        row_key: b"a".to_vec(),
        ..Default::default()
    };
    let e2 = Entry {
        row_key: b"bb".to_vec(),
        ..Default::default()
    };
    let (r1, r2) = (
        BigtableEntry::from_entry(0, &e1),
        BigtableEntry::from_entry(1, &e2),
    );
    let mut ours = Vec::new();
    write_mutate_rows_request(
        &mut ours,
        TABLE,
        "prof",
        [r1.encoded(), r2.encoded()].into_iter(),
    );
    let request = MutateRowsRequest {
        table_name: TABLE.into(),
        app_profile_id: "prof".into(),
        entries: vec![e1, e2],
        ..Default::default()
    };
    assert_eq!(MutateRowsRequest::decode(&ours[..]).unwrap(), request);
    let size = request_base_len(TABLE, "prof")
        + request_entry_len(r1.encoded().len() as u64)
        + request_entry_len(r2.encoded().len() as u64);
    assert_eq!(size as usize, ours.len());
}

#[test]
fn values_are_encoded_per_arrow_type() {
    let list =
        ListArray::from_iter_primitive::<Int32Type, _, _>(vec![Some(vec![Some(1), Some(2)])]);
    let dict: DictionaryArray<Int8Type> = vec!["red"].into_iter().collect();
    let schema = Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("i8", DataType::Int8, true),
        Field::new("u64", DataType::UInt64, true),
        Field::new("f32", DataType::Float32, true),
        Field::new("flag", DataType::Boolean, true),
        Field::new("text", DataType::Utf8, true),
        Field::new("bin", DataType::Binary, true),
        Field::new("day", DataType::Date32, true),
        Field::new("at", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        Field::new("price", DataType::Decimal128(10, 2), true),
        Field::new("tags", list.data_type().clone(), true),
        Field::new("color", dict.data_type().clone(), true),
    ]);
    let m = mapping(&schema, &[("table", TABLE), ("row_key", "id")]).unwrap();
    let b = RecordBatch::try_new(
        Arc::new(schema),
        vec![
            Arc::new(StringArray::from(vec!["k"])),
            Arc::new(Int8Array::from(vec![-1])),
            Arc::new(UInt64Array::from(vec![u64::MAX])),
            Arc::new(Float32Array::from(vec![1.5])),
            Arc::new(BooleanArray::from(vec![true])),
            Arc::new(StringArray::from(vec!["héllo"])),
            Arc::new(BinaryArray::from(vec![&[0u8, 255][..]])),
            Arc::new(Date32Array::from(vec![19_000])),
            Arc::new(TimestampMillisecondArray::from(vec![1_234])),
            Arc::new(
                Decimal128Array::from(vec![12_345])
                    .with_precision_and_scale(10, 2)
                    .unwrap(),
            ),
            Arc::new(list),
            Arc::new(dict),
        ],
    )
    .unwrap();
    let entry = entries(&m, &b).remove(0);
    let values: Vec<(String, Vec<u8>)> = entry
        .mutations
        .iter()
        .map(|mu| {
            let s = set_cell(mu);
            assert_eq!(s.family_name, "cf");
            assert_eq!(s.timestamp_micros, NOW_MS_ALIGNED);
            (
                String::from_utf8(s.column_qualifier.clone()).unwrap(),
                s.value.clone(),
            )
        })
        .collect();
    let expect: Vec<(&str, Vec<u8>)> = vec![
        ("i8", (-1i64).to_be_bytes().to_vec()),
        ("u64", u64::MAX.to_be_bytes().to_vec()),
        ("f32", 1.5f64.to_be_bytes().to_vec()),
        ("flag", vec![1]),
        ("text", "héllo".as_bytes().to_vec()),
        ("bin", vec![0, 255]),
        ("day", 19_000i64.to_be_bytes().to_vec()),
        ("at", 1_234i64.to_be_bytes().to_vec()),
        ("price", b"123.45".to_vec()),
        ("tags", b"[1,2]".to_vec()),
        ("color", b"red".to_vec()),
    ];
    let expect: Vec<(String, Vec<u8>)> = expect
        .into_iter()
        .map(|(q, v)| (q.to_string(), v))
        .collect();
    assert_eq!(values, expect);
}

#[test]
fn composite_key_joins_parts_with_the_delimiter_and_integers_as_text() {
    let schema = Schema::new(vec![
        Field::new("user", DataType::Utf8, true),
        Field::new("n", DataType::Int32, true),
        Field::new("v", DataType::Utf8, true),
    ]);
    let m = mapping(
        &schema,
        &[
            ("table", TABLE),
            ("row_key", "user, n"),
            ("row_key_delimiter", "|"),
        ],
    )
    .unwrap();
    let b = batch(vec![
        (
            "user",
            Arc::new(StringArray::from(vec![Some("ann"), None, Some("")])) as ArrayRef,
        ),
        (
            "n",
            Arc::new(Int32Array::from(vec![Some(-7), Some(1), Some(2)])),
        ),
        ("v", Arc::new(StringArray::from(vec!["x", "y", "z"]))),
    ]);
    let out = encode(&m, &b);
    assert_eq!(out[0].as_ref().unwrap().record.row_key(), b"ann|-7");
    assert!(reason(&out[1]).contains("row key column 'user' is null"));
    // An empty part still leaves the delimiter and the other part.
    assert_eq!(out[2].as_ref().unwrap().record.row_key(), b"|2");
    assert!(matches!(out[1], Err(Error::Encode { row: 101, .. })));
}

#[test]
fn empty_and_oversized_row_keys_are_refused_naming_the_limit() {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Utf8, true),
        Field::new("v", DataType::Utf8, true),
    ]);
    let m = mapping(&schema, &[("table", TABLE), ("row_key", "id")]).unwrap();
    let long = "k".repeat(MAX_ROW_KEY_BYTES + 1);
    let fits = "k".repeat(MAX_ROW_KEY_BYTES);
    let b = batch(vec![
        (
            "id",
            Arc::new(StringArray::from(vec!["", long.as_str(), fits.as_str()])) as ArrayRef,
        ),
        ("v", Arc::new(StringArray::from(vec!["x", "y", "z"]))),
    ]);
    let out = encode(&m, &b);
    assert!(reason(&out[0]).contains("empty"));
    let r = reason(&out[1]);
    assert!(r.contains("4097") && r.contains("4096"), "{r}");
    assert!(out[2].is_ok());
}

#[test]
fn oversized_cell_value_is_refused_naming_the_column_and_limit() {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("blob", DataType::Binary, true),
    ]);
    let m = mapping(&schema, &[("table", TABLE), ("row_key", "id")]).unwrap();
    let big = vec![0u8; MAX_CELL_VALUE_BYTES + 1];
    let b = batch(vec![
        ("id", Arc::new(StringArray::from(vec!["k"])) as ArrayRef),
        ("blob", Arc::new(BinaryArray::from(vec![big.as_slice()]))),
    ]);
    let r = reason(&encode(&m, &b)[0]);
    assert!(r.contains("cf.blob") && r.contains("100 MiB"), "{r}");
}

#[test]
fn nulls_are_ignored_or_deleted_and_an_all_null_row_is_refused() {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("a", DataType::Int64, true),
        Field::new("b", DataType::Null, true),
    ]);
    let cols = || {
        vec![
            (
                "id",
                Arc::new(StringArray::from(vec!["k1", "k2"])) as ArrayRef,
            ),
            ("a", Arc::new(Int64Array::from(vec![Some(1), None]))),
            ("b", Arc::new(NullArray::new(2))),
        ]
    };
    let ignore = mapping(&schema, &[("table", TABLE), ("row_key", "id")]).unwrap();
    let out = encode(&ignore, &batch(cols()));
    assert_eq!(out[0].as_ref().unwrap().record.mutation_count(), 1);
    assert!(reason(&out[1]).contains("no cell"), "{}", reason(&out[1]));

    let delete = mapping(
        &schema,
        &[
            ("table", TABLE),
            ("row_key", "id"),
            ("null_handling", "delete"),
        ],
    )
    .unwrap();
    let e = entries(&delete, &batch(cols()));
    let kinds: Vec<bool> = e[1]
        .mutations
        .iter()
        .map(|m| matches!(m.mutation, Some(mutation::Mutation::DeleteFromColumn(_))))
        .collect();
    assert_eq!(kinds, vec![true, true]);
}

#[test]
fn struct_column_is_a_family_of_its_fields() {
    let fields = Fields::from(vec![
        Field::new("n", DataType::Int32, true),
        Field::new("label", DataType::Utf8, true),
    ]);
    let schema = Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("stats", DataType::Struct(fields.clone()), true),
    ]);
    let m = mapping(&schema, &[("table", TABLE), ("row_key", "id")]).unwrap();
    assert_eq!(m.families(), ["stats".to_string()]);
    let s = StructArray::try_new(
        fields,
        vec![
            Arc::new(Int32Array::from(vec![Some(5), Some(6)])),
            Arc::new(StringArray::from(vec![None, Some("z")])),
        ],
        Some(vec![true, false].into()),
    )
    .unwrap();
    let b = batch(vec![
        (
            "id",
            Arc::new(StringArray::from(vec!["k1", "k2"])) as ArrayRef,
        ),
        ("stats", Arc::new(s)),
    ]);
    let out = encode(&m, &b);
    let e = out[0].as_ref().unwrap().record.to_entry().unwrap();
    assert_eq!(e.mutations.len(), 1);
    let c = set_cell(&e.mutations[0]);
    assert_eq!(
        (c.family_name.as_str(), c.column_qualifier.as_slice()),
        ("stats", &b"n"[..])
    );
    assert_eq!(c.value, 5i64.to_be_bytes());
    // A null struct: every field is null, so nothing is left to write.
    assert!(reason(&out[1]).contains("no cell"));
}

#[test]
fn timestamp_column_sets_millisecond_aligned_versions() {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("at", DataType::Timestamp(TimeUnit::Nanosecond, None), true),
        Field::new("v", DataType::Utf8, true),
    ]);
    let m = mapping(
        &schema,
        &[
            ("table", TABLE),
            ("row_key", "id"),
            ("timestamp_column", "at"),
        ],
    )
    .unwrap();
    let b = batch(vec![
        (
            "id",
            Arc::new(StringArray::from(vec!["a", "b", "c"])) as ArrayRef,
        ),
        (
            "at",
            Arc::new(TimestampNanosecondArray::from(vec![
                Some(1_500_123_456_789),
                None,
                Some(-5),
            ])),
        ),
        ("v", Arc::new(StringArray::from(vec!["x", "y", "z"]))),
    ]);
    let out = encode(&m, &b);
    let e = out[0].as_ref().unwrap().record.to_entry().unwrap();
    assert_eq!(set_cell(&e.mutations[0]).timestamp_micros, 1_500_123_000);
    assert!(reason(&out[1]).contains("timestamp column 'at' is null"));
    assert!(reason(&out[2]).contains("before 1970"));

    let int_schema = Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("at", DataType::Int64, true),
        Field::new("v", DataType::Utf8, true),
    ]);
    let m = mapping(
        &int_schema,
        &[
            ("table", TABLE),
            ("row_key", "id"),
            ("timestamp_column", "at"),
        ],
    )
    .unwrap();
    let b = batch(vec![
        ("id", Arc::new(StringArray::from(vec!["a"])) as ArrayRef),
        ("at", Arc::new(Int64Array::from(vec![2_999]))),
        ("v", Arc::new(StringArray::from(vec!["x"]))),
    ]);
    let e = entries(&m, &b).remove(0);
    assert_eq!(set_cell(&e.mutations[0]).timestamp_micros, 2_000);
    assert_eq!(e.mutations.len(), 1, "the timestamp column is not a cell");
}

#[test]
fn client_clock_is_truncated_to_a_millisecond() {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("v", DataType::Utf8, true),
    ]);
    let m = mapping(&schema, &[("table", TABLE), ("row_key", "id")]).unwrap();
    let b = batch(vec![
        ("id", Arc::new(StringArray::from(vec!["a"])) as ArrayRef),
        ("v", Arc::new(StringArray::from(vec!["x"]))),
    ]);
    let mut out = Vec::new();
    m.encode_batch(&b, 0, &mut out).unwrap();
    let e = out.remove(0).unwrap().record.to_entry().unwrap();
    let ts = set_cell(&e.mutations[0]).timestamp_micros;
    assert!(ts > 0 && ts % 1_000 == 0, "{ts}");
}

#[test]
fn per_row_tables_resolve_in_the_row_instance() {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("tbl", DataType::Utf8, true),
        Field::new("inst", DataType::Utf8, true),
        Field::new("v", DataType::Utf8, true),
    ]);
    let m = mapping(
        &schema,
        &[
            ("project", "p"),
            ("row_key", "id"),
            ("table_column", "tbl"),
            ("instance_column", "inst"),
        ],
    )
    .unwrap();
    let b = batch(vec![
        (
            "id",
            Arc::new(StringArray::from(vec!["a", "b", "c", "d"])) as ArrayRef,
        ),
        (
            "tbl",
            Arc::new(StringArray::from(vec![
                Some("t1"),
                Some("projects/q/instances/j/tables/t2"),
                None,
                Some("bad/name"),
            ])),
        ),
        (
            "inst",
            Arc::new(StringArray::from(vec![
                Some("i1"),
                Some("i1"),
                Some("i1"),
                Some("i1"),
            ])),
        ),
        ("v", Arc::new(StringArray::from(vec!["x", "y", "z", "w"]))),
    ]);
    let out = encode(&m, &b);
    assert_eq!(
        &*out[0].as_ref().unwrap().destination,
        "projects/p/instances/i1/tables/t1"
    );
    assert_eq!(
        &*out[1].as_ref().unwrap().destination,
        "projects/q/instances/j/tables/t2"
    );
    assert!(reason(&out[2]).contains("table column 'tbl' is null"));
    // The bad name is a row's value: the reason names the columns and the rule, not the value.
    let bad = reason(&out[3]);
    assert!(
        bad.contains("columns 'tbl' and 'inst'") && bad.contains("short table id"),
        "{bad}"
    );
    assert!(!bad.contains("bad/name"), "{bad}");
    let e = out[0].as_ref().unwrap().record.to_entry().unwrap();
    assert_eq!(
        e.mutations.len(),
        1,
        "table and instance columns are not cells"
    );
}

#[test]
fn schema_problems_are_refused_at_create_naming_the_column() {
    let opts = [("table", TABLE), ("row_key", "id")];
    let bad_family = Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        struct_field("has space", vec![Field::new("n", DataType::Int32, true)]),
    ]);
    let err = mapping(&bad_family, &opts).unwrap_err().to_string();
    assert!(err.contains("has space") && err.contains("family"), "{err}");

    let long = "q".repeat(MAX_QUALIFIER_BYTES + 1);
    let long_qualifier = Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new(long.as_str(), DataType::Utf8, true),
    ]);
    let err = mapping(&long_qualifier, &opts).unwrap_err().to_string();
    assert!(err.contains("16 KiB"), "{err}");

    let union = Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new(
            "u",
            DataType::Union(
                UnionFields::try_new(vec![0], vec![Field::new("a", DataType::Int32, true)])
                    .unwrap(),
                UnionMode::Dense,
            ),
            true,
        ),
    ]);
    let err = mapping(&union, &opts).unwrap_err().to_string();
    assert!(err.contains("column 'u'"), "{err}");

    let collision = Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("n", DataType::Int32, true),
        struct_field("cf", vec![Field::new("n", DataType::Int32, true)]),
    ]);
    let err = mapping(&collision, &opts).unwrap_err().to_string();
    assert!(
        err.contains("same family and qualifier") || err.contains("also written"),
        "{err}"
    );
}

#[test]
fn a_row_key_repeated_in_a_batch_gets_a_later_version_each_time() {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Utf8, true),
        Field::new("v", DataType::Int64, true),
    ]);
    let m = mapping(&schema, &[("table", TABLE), ("row_key", "id")]).unwrap();
    let b = batch(vec![
        (
            "id",
            Arc::new(StringArray::from(vec!["a", "b", "a", "a"])) as ArrayRef,
        ),
        ("v", Arc::new(Int64Array::from(vec![1, 2, 3, 4]))),
    ]);
    let versions: Vec<i64> = entries(&m, &b)
        .iter()
        .map(|e| set_cell(&e.mutations[0]).timestamp_micros)
        .collect();
    let ms = TIMESTAMP_GRANULARITY_MICROS;
    assert_eq!(
        versions,
        [
            NOW_MS_ALIGNED,
            NOW_MS_ALIGNED,
            NOW_MS_ALIGNED + ms,
            NOW_MS_ALIGNED + 2 * ms
        ]
    );
}

#[test]
fn clock_versions_never_go_back_from_one_batch_to_the_next() {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Utf8, true),
        Field::new("v", DataType::Int64, true),
    ]);
    let m = mapping(&schema, &[("table", TABLE), ("row_key", "id")]).unwrap();
    let b = batch(vec![
        (
            "id",
            Arc::new(StringArray::from(vec!["a", "a", "a"])) as ArrayRef,
        ),
        ("v", Arc::new(Int64Array::from(vec![1, 2, 3]))),
    ]);
    let mut previous = i64::MIN;
    // Batches encoded within the same millisecond still get later versions than the last one.
    for _ in 0..5 {
        let mut out = Vec::new();
        m.encode_batch(&b, 0, &mut out).expect("encode");
        for entry in out {
            let entry = entry.expect("row").record.to_entry().expect("decodes");
            let version = set_cell(&entry.mutations[0]).timestamp_micros;
            assert!(version > previous, "{version} after {previous}");
            assert_eq!(version % TIMESTAMP_GRANULARITY_MICROS, 0);
            previous = version;
        }
    }
}

#[test]
fn rows_of_a_key_are_serial_only_where_their_writes_can_overwrite_each_other() {
    // ADR 0031: with data versions, a writer keeps one record of a serial key in flight.
    let schema = Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("at", DataType::Int64, false),
        Field::new("v", DataType::Utf8, true),
    ]);
    // Rows: a@1ms, a@1ms, a@2ms, b@1ms.
    let b = batch(vec![
        (
            "id",
            Arc::new(StringArray::from(vec!["a", "a", "a", "b"])) as ArrayRef,
        ),
        (
            "at",
            Arc::new(Int64Array::from(vec![1_000, 1_000, 2_000, 1_000])),
        ),
        ("v", Arc::new(StringArray::from(vec!["w", "x", "y", "z"]))),
    ]);
    let keys = |pairs: &[(&str, &str)]| -> Vec<Option<Arc<[u8]>>> {
        encode(&mapping(&schema, pairs).unwrap(), &b)
            .into_iter()
            .map(|r| r.expect("row encodes").serial_key)
            .collect()
    };
    let base = [
        ("table", TABLE),
        ("row_key", "id"),
        ("timestamp_column", "at"),
    ];

    // Under 'ignore' only one key at one version conflicts: set cells of different versions
    // never overwrite each other.
    let ignore = keys(&base);
    assert!(ignore.iter().all(Option::is_some));
    assert_eq!(ignore[0], ignore[1], "a@1ms twice");
    assert_ne!(ignore[0], ignore[2], "a@1ms and a@2ms");
    assert_ne!(ignore[0], ignore[3], "a@1ms and b@1ms");

    // Under 'delete' a DeleteFromColumn removes every version: every row of a key conflicts.
    let mut with_delete = base.to_vec();
    with_delete.push(("null_handling", "delete"));
    let delete = keys(&with_delete);
    assert_eq!(delete[0], delete[1]);
    assert_eq!(delete[0], delete[2], "a@1ms and a@2ms under delete");
    assert_ne!(delete[0], delete[3]);

    // Clock versions already order a key's rows: no serial key.
    let clock = keys(&[("table", TABLE), ("row_key", "id")]);
    assert!(clock.iter().all(Option::is_none));
}

// ---- Changelogs and write modes ----

fn changelog_schema() -> Schema {
    Schema::new(vec![
        Field::new("op", DataType::Utf8, true),
        Field::new("id", DataType::Utf8, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("n", DataType::Int64, true),
    ])
}

fn changelog_batch(ops: Vec<Option<&str>>) -> RecordBatch {
    let rows = ops.len();
    batch(vec![
        ("op", Arc::new(StringArray::from(ops)) as ArrayRef),
        (
            "id",
            Arc::new(StringArray::from(
                (0..rows).map(|i| format!("k{i}")).collect::<Vec<_>>(),
            )),
        ),
        ("name", Arc::new(StringArray::from(vec![Some("x"); rows]))),
        ("n", Arc::new(Int64Array::from(vec![Some(7); rows]))),
    ])
}

fn is_delete_from_row(m: &Mutation) -> bool {
    matches!(&m.mutation, Some(mutation::Mutation::DeleteFromRow(_)))
}

#[test]
fn op_column_deletes_rows_and_writes_the_others() {
    let m = mapping(
        &changelog_schema(),
        &[("table", TABLE), ("row_key", "id"), ("op_column", "op")],
    )
    .unwrap();
    let b = changelog_batch(vec![
        Some("insert"),
        Some("delete"),
        Some("U"),
        Some("d"),
        Some(" r "),
        Some("c"),
        Some("upsert"),
        Some("update"),
    ]);
    let out = encode(&m, &b);
    for (i, r) in out.iter().enumerate() {
        let envelope = r.as_ref().expect("every row encodes");
        let entry = envelope.record.to_entry().unwrap();
        assert_eq!(envelope.record.kind(), EntryKind::Mutate);
        // Rows of a key stay in order whatever they do.
        assert_eq!(
            envelope.serial_key.as_deref(),
            Some(format!("k{i}").as_bytes())
        );
        if i == 1 || i == 3 {
            assert_eq!(entry.mutations.len(), 1, "a delete writes no cell");
            assert!(is_delete_from_row(&entry.mutations[0]));
        } else {
            // The op column is not a cell.
            let qualifiers: Vec<&[u8]> = entry
                .mutations
                .iter()
                .map(|m| set_cell(m).column_qualifier.as_slice())
                .collect();
            assert_eq!(qualifiers, [b"name".as_slice(), b"n".as_slice()]);
        }
    }
}

#[test]
fn a_delete_row_needs_only_its_key() {
    let schema = Schema::new(vec![
        Field::new("op", DataType::Utf8, true),
        Field::new("id", DataType::Utf8, false),
        Field::new("v", DataType::Utf8, true),
        Field::new("ts", DataType::Int64, true),
    ]);
    let m = mapping(
        &schema,
        &[
            ("table", TABLE),
            ("row_key", "id"),
            ("op_column", "op"),
            ("timestamp_column", "ts"),
        ],
    )
    .unwrap();
    let b = batch(vec![
        (
            "op",
            Arc::new(StringArray::from(vec!["d", "u"])) as ArrayRef,
        ),
        ("id", Arc::new(StringArray::from(vec!["a", "b"]))),
        ("v", Arc::new(StringArray::from(vec![None::<&str>, None]))),
        ("ts", Arc::new(Int64Array::from(vec![None, None]))),
    ]);
    let out = encode(&m, &b);
    let delete = out[0]
        .as_ref()
        .expect("a delete with null cells and timestamp");
    assert_eq!(delete.record.mutation_count(), 1);
    // A write row still needs its timestamp.
    assert!(reason(&out[1]).contains("timestamp column 'ts' is null"));
}

#[test]
fn an_unknown_or_null_op_refuses_the_row_naming_the_column_not_the_value() {
    let m = mapping(
        &changelog_schema(),
        &[("table", TABLE), ("row_key", "id"), ("op_column", "op")],
    )
    .unwrap();
    let b = changelog_batch(vec![Some("insert"), Some("secret-op-value"), None]);
    let out = encode(&m, &b);
    assert!(out[0].is_ok());
    match &out[1] {
        Err(Error::Encode { row, reason }) => {
            assert_eq!(*row, 101, "the row index within the statement");
            assert!(reason.contains("op_column 'op'"), "{reason}");
            assert!(reason.contains("'delete'"), "{reason}");
            assert!(!reason.contains("secret-op-value"), "{reason}");
        }
        other => panic!("expected an encode error, found {other:?}"),
    }
    assert!(reason(&out[2]).contains("op_column 'op' is null"));
}

#[test]
fn replace_row_deletes_the_row_then_sets_its_cells_in_one_entry() {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("a", DataType::Utf8, true),
        Field::new("b", DataType::Int64, true),
    ]);
    let m = mapping(
        &schema,
        &[
            ("table", TABLE),
            ("row_key", "id"),
            ("write_mode", "replace_row"),
            ("null_handling", "delete"),
        ],
    )
    .unwrap();
    let b = batch(vec![
        (
            "id",
            Arc::new(StringArray::from(vec!["k1", "k2"])) as ArrayRef,
        ),
        ("a", Arc::new(StringArray::from(vec![Some("x"), None]))),
        ("b", Arc::new(Int64Array::from(vec![None, None]))),
    ]);
    let out = encode(&m, &b);
    let first = out[0].as_ref().unwrap();
    let expected = Entry {
        row_key: b"k1".to_vec(),
        mutations: vec![
            Mutation {
                timestamp_origin: 0,
                mutation: Some(mutation::Mutation::DeleteFromRow(
                    mutation::DeleteFromRow {},
                )),
            },
            Mutation {
                timestamp_origin: 0,
                mutation: Some(mutation::Mutation::SetCell(SetCell {
                    family_name: "cf".into(),
                    column_qualifier: b"a".to_vec(),
                    timestamp_micros: NOW_MS_ALIGNED,
                    value: b"x".to_vec(),
                })),
            },
        ],
        idempotency: None,
    };
    // The null `b` needs no DeleteFromColumn after the row's delete.
    assert_eq!(first.record.encoded(), expected.encode_to_vec().as_slice());
    assert_eq!(first.serial_key.as_deref(), Some(b"k1".as_slice()));
    // Every cell null: the row ends empty, which is what replacing it with nothing means.
    let second = out[1].as_ref().unwrap().record.to_entry().unwrap();
    assert_eq!(second.mutations.len(), 1);
    assert!(is_delete_from_row(&second.mutations[0]));
    assert_eq!(m.max_mutations_per_entry(), 3);
}

#[test]
fn insert_if_absent_entries_go_by_check_and_mutate_in_key_order() {
    let m = mapping(
        &changelog_schema(),
        &[
            ("table", TABLE),
            ("row_key", "id"),
            ("write_mode", "insert_if_absent"),
        ],
    )
    .unwrap();
    let out = encode(&m, &changelog_batch(vec![Some("x")]));
    let e = out[0].as_ref().unwrap();
    assert_eq!(e.record.kind(), EntryKind::InsertIfAbsent);
    assert_eq!(e.serial_key.as_deref(), Some(b"k0".as_slice()));
    let entry = e.record.to_entry().unwrap();
    // The op column is a cell here: there is no op_column.
    assert_eq!(entry.mutations.len(), 3);
}

#[test]
fn increment_entries_carry_one_rule_per_integer_cell() {
    use gcloud_sdk::google::bigtable::v2::read_modify_write_rule::Rule;
    let schema = Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("clicks", DataType::Int64, true),
        Field::new("views", DataType::Int32, true),
        struct_field("s", vec![Field::new("n", DataType::Int8, true)]),
    ]);
    let m = mapping(
        &schema,
        &[
            ("table", TABLE),
            ("row_key", "id"),
            ("write_mode", "increment"),
        ],
    )
    .unwrap();
    let s = StructArray::from(vec![(
        Arc::new(Field::new("n", DataType::Int8, true)),
        Arc::new(Int8Array::from(vec![Some(3), None])) as ArrayRef,
    )]);
    let b = batch(vec![
        (
            "id",
            Arc::new(StringArray::from(vec!["a", "b"])) as ArrayRef,
        ),
        ("clicks", Arc::new(Int64Array::from(vec![Some(-5), None]))),
        (
            "views",
            Arc::new(Int32Array::from(vec![Some(i32::MAX), None])),
        ),
        ("s", Arc::new(s)),
    ]);
    let out = encode(&m, &b);
    let e = out[0].as_ref().unwrap();
    assert_eq!(e.record.kind(), EntryKind::Increment);
    // Increments commute: rows of a key need no order.
    assert!(e.serial_key.is_none());
    let row = e.record.to_increment().unwrap();
    assert_eq!(row.row_key, b"a");
    let rules: Vec<(String, Vec<u8>, Option<Rule>)> = row
        .rules
        .iter()
        .map(|r| {
            (
                r.family_name.clone(),
                r.column_qualifier.clone(),
                r.rule.clone(),
            )
        })
        .collect();
    assert_eq!(
        rules,
        vec![
            (
                "cf".into(),
                b"clicks".to_vec(),
                Some(Rule::IncrementAmount(-5))
            ),
            (
                "cf".into(),
                b"views".to_vec(),
                Some(Rule::IncrementAmount(i64::from(i32::MAX)))
            ),
            ("s".into(), b"n".to_vec(), Some(Rule::IncrementAmount(3))),
        ]
    );
    // The hand-written bytes are what prost writes.
    assert_eq!(e.record.encoded(), row.encode_to_vec().as_slice());
    // A row with nothing to add is refused, as a row with no cell is.
    assert!(reason(&out[1]).contains("writes no cell"));
}

#[test]
fn conflicting_write_mode_options_are_refused_naming_both() {
    let raw = |pairs: &[(&str, &str)]| {
        RawOptions::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string()))).unwrap()
    };
    let declare = |pairs: &[(&str, &str)]| BigtableSinkOptions::from_raw(None, &raw(pairs));
    for (extra, names) in [
        (
            vec![("op_column", "op"), ("write_mode", "insert_if_absent")],
            ["op_column", "write_mode"],
        ),
        (
            vec![("op_column", "op"), ("write_mode", "increment")],
            ["op_column", "write_mode"],
        ),
        (
            vec![("timestamp_column", "ts"), ("write_mode", "increment")],
            ["timestamp_column", "write_mode"],
        ),
        (
            vec![("null_handling", "delete"), ("write_mode", "increment")],
            ["null_handling", "write_mode"],
        ),
        (
            vec![("op_column", "op"), ("write_mode", "add_to_cell")],
            ["op_column", "add_to_cell"],
        ),
        (
            vec![("null_handling", "delete"), ("write_mode", "add_to_cell")],
            ["null_handling", "add_to_cell"],
        ),
    ] {
        let mut pairs = vec![("table", TABLE), ("row_key", "id")];
        pairs.extend(extra);
        let err = declare(&pairs).unwrap_err().to_string();
        for name in names {
            assert!(err.contains(name), "{err} should name {name}");
        }
    }
    let err = declare(&[("table", TABLE), ("row_key", "id"), ("write_mode", "merge")])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("write_mode") && err.contains("replace_row"),
        "{err}"
    );
}

#[test]
fn increment_and_op_columns_are_checked_against_the_schema() {
    let err = mapping(
        &changelog_schema(),
        &[
            ("table", TABLE),
            ("row_key", "id"),
            ("write_mode", "increment"),
        ],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("'op'") && err.contains("increment"), "{err}");
    let schema = Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        struct_field("s", vec![Field::new("f", DataType::Float64, true)]),
    ]);
    let err = mapping(
        &schema,
        &[
            ("table", TABLE),
            ("row_key", "id"),
            ("write_mode", "increment"),
        ],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("s.f") && err.contains("Float64"), "{err}");
    let schema = Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("op", DataType::Int32, true),
        Field::new("v", DataType::Utf8, true),
    ]);
    let err = mapping(
        &schema,
        &[("table", TABLE), ("row_key", "id"), ("op_column", "op")],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("op_column") && err.contains("string"), "{err}");
    let err = mapping(
        &schema,
        &[("table", TABLE), ("row_key", "id"), ("op_column", "opp")],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("op_column") && err.contains("'op'"), "{err}");
}

#[test]
fn add_to_cell_entries_add_each_integer_cell_at_the_data_version_or_zero() {
    use gcloud_sdk::google::bigtable::v2::mutation::AddToCell;
    use gcloud_sdk::google::bigtable::v2::{Value, value::Kind};
    let schema = Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("clicks", DataType::Int64, true),
        Field::new("ts", DataType::Int64, true),
    ]);
    let value = |kind| {
        Some(Value {
            kind: Some(kind),
            ..Default::default()
        })
    };
    let add = |amount: i64, version: i64| Mutation {
        timestamp_origin: 0,
        mutation: Some(mutation::Mutation::AddToCell(AddToCell {
            family_name: "cf".into(),
            column_qualifier: value(Kind::RawValue(b"clicks".to_vec())),
            timestamp: value(Kind::RawTimestampMicros(version)),
            input: value(Kind::IntValue(amount)),
        })),
    };
    let b = batch(vec![
        ("id", Arc::new(StringArray::from(vec!["a"])) as ArrayRef),
        ("clicks", Arc::new(Int64Array::from(vec![Some(-3)]))),
        ("ts", Arc::new(Int64Array::from(vec![Some(3_600_000_123)]))),
    ]);
    // Without timestamp_column every add goes to version 0: one cell per counter.
    let plain = mapping(
        &Schema::new(schema.fields()[..2].to_vec()),
        &[
            ("table", TABLE),
            ("row_key", "id"),
            ("write_mode", "add_to_cell"),
        ],
    )
    .unwrap();
    let out = encode(&plain, &b.project(&[0, 1]).unwrap());
    let e = out[0].as_ref().unwrap();
    assert_eq!(e.record.kind(), EntryKind::Mutate);
    assert!(e.serial_key.is_none(), "adds commute");
    assert_eq!(e.record.to_entry().unwrap().mutations, vec![add(-3, 0)]);
    // With it, the version is the row's (in whole milliseconds): one cell per bucket.
    let bucketed = mapping(
        &schema,
        &[
            ("table", TABLE),
            ("row_key", "id"),
            ("write_mode", "add_to_cell"),
            ("timestamp_column", "ts"),
        ],
    )
    .unwrap();
    let out = encode(&bucketed, &b);
    assert_eq!(
        out[0]
            .as_ref()
            .unwrap()
            .record
            .to_entry()
            .unwrap()
            .mutations,
        vec![add(-3, 3_600_000_000)]
    );
}
