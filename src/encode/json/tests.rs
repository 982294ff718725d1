use std::sync::Arc;

use arrow::array::{
    ArrayRef, BinaryArray, BinaryViewArray, BooleanArray, Date32Array, Date64Array, Decimal32Array,
    Decimal64Array, Decimal128Array, Decimal256Array, DictionaryArray, DurationMicrosecondArray,
    DurationMillisecondArray, DurationSecondArray, FixedSizeBinaryArray, FixedSizeListArray,
    Float32Array, Float64Array, Int8Array, Int16Array, Int32Array, Int64Array,
    IntervalDayTimeArray, IntervalMonthDayNanoArray, IntervalYearMonthArray, LargeBinaryArray,
    LargeListArray, LargeStringArray, ListArray, ListViewArray, MapArray, NullArray, StringArray,
    StringViewArray, StructArray, Time32MillisecondArray, Time32SecondArray,
    Time64MicrosecondArray, Time64NanosecondArray, TimestampMillisecondArray,
    TimestampNanosecondArray, TimestampSecondArray, UInt8Array, UInt16Array, UInt32Array,
    UInt64Array,
};
use arrow::buffer::{OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{
    Field, Int8Type, Int32Type, IntervalDayTime, IntervalMonthDayNano, UnionFields,
};

use super::*;

/// Encodes every row of a one-column batch and returns the JSON value of the column per row.
fn json_values(array: ArrayRef) -> Vec<String> {
    let schema = Arc::new(Schema::new(vec![Field::new(
        "c",
        array.data_type().clone(),
        true,
    )]));
    let batch = RecordBatch::try_new(schema.clone(), vec![array]).unwrap();
    let encoder = JsonRowEncoder::new(&schema, &[0]).unwrap();
    let mut rows = encoder.bind(&batch).unwrap();
    (0..batch.num_rows())
        .map(|row| {
            let mut out = Vec::new();
            rows.write_row(row, &mut out);
            let text = String::from_utf8(out).unwrap();
            // Every row must be a valid JSON object with the one key.
            let parsed: serde_json::Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert!(parsed.get("c").is_some(), "{text}");
            text.strip_prefix("{\"c\":")
                .and_then(|t| t.strip_suffix('}'))
                .unwrap()
                .to_string()
        })
        .collect()
}

fn text_values(array: ArrayRef) -> Vec<Option<String>> {
    let mut encoder = ColumnEncoder::new("c", array.as_ref()).unwrap();
    (0..array.len())
        .map(|row| {
            let mut out = Vec::new();
            encoder
                .write_text(row, &mut out)
                .then(|| String::from_utf8_lossy(&out).into_owned())
        })
        .collect()
}

fn decimal_schema_value(array: ArrayRef) -> Vec<String> {
    json_values(array)
}

#[test]
fn writes_booleans_and_nulls() {
    assert_eq!(
        json_values(Arc::new(BooleanArray::from(vec![
            Some(true),
            Some(false),
            None
        ]))),
        ["true", "false", "null"]
    );
    assert_eq!(json_values(Arc::new(NullArray::new(2))), ["null", "null"]);
}

#[test]
fn writes_integer_extremes_exactly() {
    assert_eq!(
        json_values(Arc::new(Int8Array::from(vec![i8::MIN, i8::MAX]))),
        ["-128", "127"]
    );
    assert_eq!(
        json_values(Arc::new(Int16Array::from(vec![i16::MIN]))),
        ["-32768"]
    );
    assert_eq!(
        json_values(Arc::new(Int32Array::from(vec![Some(i32::MIN), None]))),
        ["-2147483648", "null"]
    );
    assert_eq!(
        json_values(Arc::new(Int64Array::from(vec![i64::MIN, i64::MAX]))),
        ["-9223372036854775808", "9223372036854775807"]
    );
    assert_eq!(
        json_values(Arc::new(UInt8Array::from(vec![u8::MAX]))),
        ["255"]
    );
    assert_eq!(
        json_values(Arc::new(UInt16Array::from(vec![u16::MAX]))),
        ["65535"]
    );
    assert_eq!(
        json_values(Arc::new(UInt32Array::from(vec![u32::MAX]))),
        ["4294967295"]
    );
    assert_eq!(
        json_values(Arc::new(UInt64Array::from(vec![u64::MAX]))),
        ["18446744073709551615"]
    );
}

#[test]
fn writes_shortest_floats_and_non_finite_as_null() {
    assert_eq!(
        json_values(Arc::new(Float64Array::from(vec![
            0.1,
            -2.5,
            1e300,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY
        ]))),
        ["0.1", "-2.5", "1e300", "null", "null", "null"]
    );
    assert_eq!(
        json_values(Arc::new(Float32Array::from(vec![0.1f32, f32::NAN]))),
        ["0.1", "null"]
    );
    let halves = arrow::compute::cast(
        &Float32Array::from(vec![1.5f32, f32::INFINITY]),
        &DataType::Float16,
    )
    .unwrap();
    assert_eq!(halves.data_type(), &DataType::Float16);
    assert_eq!(json_values(halves), ["1.5", "null"]);
    assert_eq!(
        text_values(Arc::new(Float64Array::from(vec![
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            2.0
        ]))),
        [
            Some("NaN".into()),
            Some("Infinity".into()),
            Some("-Infinity".into()),
            Some("2.0".into())
        ]
    );
}

#[test]
fn writes_decimals_as_exact_strings() {
    let d128 = Decimal128Array::from(vec![Some(12345), Some(-5), Some(0), Some(-12345), None])
        .with_precision_and_scale(10, 3)
        .unwrap();
    assert_eq!(
        decimal_schema_value(Arc::new(d128)),
        [
            "\"12.345\"",
            "\"-0.005\"",
            "\"0.000\"",
            "\"-12.345\"",
            "null"
        ]
    );
    let negative_scale = Decimal128Array::from(vec![123, 0])
        .with_precision_and_scale(10, -2)
        .unwrap();
    assert_eq!(
        json_values(Arc::new(negative_scale)),
        ["\"12300\"", "\"0\""]
    );
    let zero_scale = Decimal64Array::from(vec![-42])
        .with_precision_and_scale(10, 0)
        .unwrap();
    assert_eq!(json_values(Arc::new(zero_scale)), ["\"-42\""]);
    let d32 = Decimal32Array::from(vec![105])
        .with_precision_and_scale(5, 2)
        .unwrap();
    assert_eq!(json_values(Arc::new(d32)), ["\"1.05\""]);
    let max38 = i128::MAX / 10;
    let d128 = Decimal128Array::from(vec![max38])
        .with_precision_and_scale(38, 10)
        .unwrap();
    let digits = max38.to_string();
    assert_eq!(
        json_values(Arc::new(d128)),
        [format!(
            "\"{}.{}\"",
            &digits[..digits.len() - 10],
            &digits[digits.len() - 10..]
        )]
    );
}

#[test]
fn writes_decimal256_beyond_i128() {
    let big = i256::from_i128(i128::MAX)
        .wrapping_mul(i256::from_i128(1000))
        .wrapping_add(i256::from_i128(7));
    let small = i256::from_i128(-250);
    let array = Decimal256Array::from(vec![big, small, big.wrapping_neg()])
        .with_precision_and_scale(76, 2)
        .unwrap();
    let expected_digits = big.to_string();
    let (int, frac) = expected_digits.split_at(expected_digits.len() - 2);
    assert_eq!(
        json_values(Arc::new(array)),
        [
            format!("\"{int}.{frac}\""),
            "\"-2.50\"".to_string(),
            format!("\"-{int}.{frac}\"")
        ]
    );
}

#[test]
fn escapes_strings_and_passes_utf8_through() {
    let tricky = "q\"b\\s/\n\r\t\u{8}\u{c}\u{1}\u{1f}\u{7f} é 😀";
    for array in [
        Arc::new(StringArray::from(vec![Some(tricky), None])) as ArrayRef,
        Arc::new(LargeStringArray::from(vec![Some(tricky), None])),
        Arc::new(StringViewArray::from(vec![Some(tricky), None])),
    ] {
        let values = json_values(array.clone());
        assert_eq!(
            values[0],
            r#""q\"b\\s/\n\r\t\b\f\u0001\u001f"#.to_string() + "\u{7f} é 😀\""
        );
        assert_eq!(serde_json::from_str::<String>(&values[0]).unwrap(), tricky);
        assert_eq!(values[1], "null");
        assert_eq!(text_values(array)[0].as_deref(), Some(tricky));
    }
}

#[test]
fn writes_binary_as_padded_base64() {
    let bytes: Vec<Option<&[u8]>> = vec![Some(&[0, 1, 2, 255]), Some(b""), None, Some(b"ab")];
    let expected = ["\"AAEC/w==\"", "\"\"", "null", "\"YWI=\""];
    assert_eq!(
        json_values(Arc::new(BinaryArray::from(bytes.clone()))),
        expected
    );
    assert_eq!(
        json_values(Arc::new(LargeBinaryArray::from(bytes.clone()))),
        expected
    );
    assert_eq!(
        json_values(Arc::new(BinaryViewArray::from(bytes))),
        expected
    );
    let fixed = FixedSizeBinaryArray::try_from_sparse_iter_with_size(
        vec![Some([1u8, 2, 3]), None].into_iter(),
        3,
    )
    .unwrap();
    assert_eq!(json_values(Arc::new(fixed)), ["\"AQID\"", "null"]);
    let binary: ArrayRef = Arc::new(BinaryArray::from(vec![Some(&b"raw"[..])]));
    assert!(
        ColumnEncoder::new("c", binary.as_ref())
            .unwrap()
            .text_may_be_binary()
    );
    assert_eq!(text_values(binary), [Some("raw".into())]);
    let text: ArrayRef = Arc::new(StringArray::from(vec!["x"]));
    assert!(
        !ColumnEncoder::new("c", text.as_ref())
            .unwrap()
            .text_may_be_binary()
    );
}

#[test]
fn civil_dates_match_chrono_over_a_wide_range() {
    use chrono::Datelike as _;
    let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).unwrap();
    // Every 997th day from year -220 to 10183: each four-digit year is checked against chrono.
    let mut checked = 0;
    for day in (-800_000i64..3_000_000).step_by(997) {
        let date = epoch + chrono::Duration::days(day);
        let mut out = Vec::new();
        write_date(&mut out, day);
        let got = String::from_utf8(out).unwrap();
        if (0..=9999).contains(&date.year()) {
            assert_eq!(got, date.format("%Y-%m-%d").to_string(), "day {day}");
            checked += 1;
        } else {
            assert!(
                got.starts_with(if date.year() < 0 { '-' } else { '+' }),
                "day {day}: {got}"
            );
        }
    }
    assert!(checked > 3_000);
}

#[test]
fn writes_dates() {
    assert_eq!(
        json_values(Arc::new(Date32Array::from(vec![
            Some(0),
            Some(-1),
            Some(19_844),
            None
        ]))),
        ["\"1970-01-01\"", "\"1969-12-31\"", "\"2024-05-01\"", "null"]
    );
    assert_eq!(
        json_values(Arc::new(Date64Array::from(vec![19_844 * 86_400_000, -1]))),
        ["\"2024-05-01\"", "\"1969-12-31\""]
    );
    // Years outside 0000..=9999 take a sign (ISO 8601 expanded form).
    assert_eq!(
        json_values(Arc::new(Date32Array::from(vec![2_932_897, -719_529]))),
        ["\"+10000-01-01\"", "\"-0001-12-31\""]
    );
}

#[test]
fn writes_times_with_the_units_fraction_width() {
    assert_eq!(
        json_values(Arc::new(Time32SecondArray::from(vec![0, 45_296]))),
        ["\"00:00:00\"", "\"12:34:56\""]
    );
    assert_eq!(
        json_values(Arc::new(Time32MillisecondArray::from(vec![45_296_007]))),
        ["\"12:34:56.007\""]
    );
    assert_eq!(
        json_values(Arc::new(Time64MicrosecondArray::from(vec![86_399_999_999]))),
        ["\"23:59:59.999999\""]
    );
    assert_eq!(
        json_values(Arc::new(Time64NanosecondArray::from(vec![1]))),
        ["\"00:00:00.000000001\""]
    );
}

#[test]
fn writes_naive_timestamps_as_utc_rfc3339() {
    let values = json_values(Arc::new(TimestampNanosecondArray::from(vec![
        Some(1_714_564_800_123_456_789),
        Some(-1),
        None,
    ])));
    assert_eq!(
        values,
        [
            "\"2024-05-01T12:00:00.123456789Z\"",
            "\"1969-12-31T23:59:59.999999999Z\"",
            "null"
        ]
    );
    assert_eq!(
        json_values(Arc::new(TimestampSecondArray::from(vec![0]))),
        ["\"1970-01-01T00:00:00Z\""]
    );
    // Each rendering parses back as RFC 3339 to the same instant.
    for v in [
        -62_135_596_800_000i64,
        -1,
        0,
        1,
        951_782_400_000,
        4_102_444_800_999,
    ] {
        let text = json_values(Arc::new(TimestampMillisecondArray::from(vec![v])))[0].clone();
        let parsed = chrono::DateTime::parse_from_rfc3339(text.trim_matches('"')).unwrap();
        assert_eq!(parsed.timestamp_millis(), v, "{text}");
    }
}

#[test]
fn writes_zoned_timestamps_with_their_offset() {
    let summer = 1_719_835_200_000i64; // 2024-07-01T12:00:00Z
    let winter = 1_704_110_400_000i64; // 2024-01-01T12:00:00Z
    let paris = TimestampMillisecondArray::from(vec![summer, winter]).with_timezone("Europe/Paris");
    assert_eq!(
        json_values(Arc::new(paris)),
        [
            "\"2024-07-01T14:00:00.000+02:00\"",
            "\"2024-01-01T13:00:00.000+01:00\""
        ]
    );
    let fixed = TimestampSecondArray::from(vec![summer / 1000]).with_timezone("-05:30");
    assert_eq!(
        json_values(Arc::new(fixed)),
        ["\"2024-07-01T06:30:00-05:30\""]
    );
    let utc = TimestampSecondArray::from(vec![summer / 1000]).with_timezone("UTC");
    assert_eq!(json_values(Arc::new(utc)), ["\"2024-07-01T12:00:00Z\""]);
    let text = json_values(Arc::new(
        TimestampMillisecondArray::from(vec![summer]).with_timezone("America/New_York"),
    ));
    let parsed = chrono::DateTime::parse_from_rfc3339(text[0].trim_matches('"')).unwrap();
    assert_eq!(parsed.timestamp_millis(), summer);
}

#[test]
fn refuses_an_unknown_time_zone_once_per_schema() {
    let schema = Schema::new(vec![Field::new(
        "ts",
        DataType::Timestamp(TimeUnit::Second, Some("Mars/Olympus".into())),
        true,
    )]);
    let err = JsonRowEncoder::new(&schema, &[0]).unwrap_err().to_string();
    assert!(
        err.contains("'ts'") && err.contains("Mars/Olympus"),
        "{err}"
    );
}

#[test]
fn writes_durations_and_intervals_as_iso_8601() {
    assert_eq!(
        json_values(Arc::new(DurationSecondArray::from(vec![90, -5]))),
        ["\"PT90S\"", "\"-PT5S\""]
    );
    assert_eq!(
        json_values(Arc::new(DurationMillisecondArray::from(vec![1_500]))),
        ["\"PT1.500S\""]
    );
    assert_eq!(
        json_values(Arc::new(DurationMicrosecondArray::from(vec![-1]))),
        ["\"-PT0.000001S\""]
    );
    assert_eq!(
        json_values(Arc::new(IntervalYearMonthArray::from(vec![14, -3]))),
        ["\"P14M\"", "\"P-3M\""]
    );
    assert_eq!(
        json_values(Arc::new(IntervalDayTimeArray::from(vec![
            IntervalDayTime::new(2, -1_500)
        ]))),
        ["\"P2DT-1.500S\""]
    );
    assert_eq!(
        json_values(Arc::new(IntervalMonthDayNanoArray::from(vec![
            IntervalMonthDayNano::new(1, 2, 3_000_000_001)
        ]))),
        ["\"P1M2DT3.000000001S\""]
    );
}

#[test]
fn writes_lists_of_every_layout() {
    let list = ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
        Some(vec![Some(1), None, Some(3)]),
        None,
        Some(vec![]),
    ]);
    assert_eq!(
        json_values(Arc::new(list.clone())),
        ["[1,null,3]", "null", "[]"]
    );
    // A slice reads its own rows only.
    assert_eq!(json_values(Arc::new(list.slice(2, 1))), ["[]"]);
    let large = LargeListArray::from_iter_primitive::<Int32Type, _, _>(vec![Some(vec![Some(7)])]);
    assert_eq!(json_values(Arc::new(large)), ["[7]"]);
    let item = Arc::new(Field::new_list_field(DataType::Int32, true));
    let view = ListViewArray::new(
        item.clone(),
        ScalarBuffer::from(vec![2, 0]),
        ScalarBuffer::from(vec![2, 1]),
        Arc::new(Int32Array::from(vec![10, 20, 30, 40])),
        None,
    );
    assert_eq!(json_values(Arc::new(view)), ["[30,40]", "[10]"]);
    let fixed = FixedSizeListArray::new(
        item,
        2,
        Arc::new(Int32Array::from(vec![1, 2, 3, 4, 5, 6])),
        None,
    );
    assert_eq!(
        json_values(Arc::new(fixed.clone())),
        ["[1,2]", "[3,4]", "[5,6]"]
    );
    assert_eq!(json_values(Arc::new(fixed.slice(1, 2))), ["[3,4]", "[5,6]"]);
}

#[test]
fn writes_structs_as_objects() {
    let inner = StructArray::from(vec![
        (
            Arc::new(Field::new("x", DataType::Int32, true)),
            Arc::new(Int32Array::from(vec![Some(1), None])) as ArrayRef,
        ),
        (
            Arc::new(Field::new("na\"me", DataType::Utf8, true)),
            Arc::new(StringArray::from(vec!["a", "b"])) as ArrayRef,
        ),
    ]);
    let fields = inner.fields().clone();
    let outer = StructArray::new(
        fields,
        inner.columns().to_vec(),
        Some(arrow::buffer::NullBuffer::from(vec![true, false])),
    );
    assert_eq!(
        json_values(Arc::new(outer)),
        [r#"{"x":1,"na\"me":"a"}"#, "null"]
    );
}

fn string_map() -> MapArray {
    let values = Int32Array::from(vec![Some(1), None, Some(3)]);
    MapArray::new_from_strings(["a", "b", "c"].into_iter(), &values, &[0, 2, 2, 3]).unwrap()
}

#[test]
fn writes_maps_with_string_keys_as_objects_and_others_as_pairs() {
    assert_eq!(
        json_values(Arc::new(string_map())),
        [r#"{"a":1,"b":null}"#, "{}", r#"{"c":3}"#]
    );
    let entries = StructArray::from(vec![
        (
            Arc::new(Field::new("key", DataType::Int32, false)),
            Arc::new(Int32Array::from(vec![1, 2])) as ArrayRef,
        ),
        (
            Arc::new(Field::new("value", DataType::Utf8, true)),
            Arc::new(StringArray::from(vec!["x", "y"])) as ArrayRef,
        ),
    ]);
    let map = MapArray::new(
        Arc::new(Field::new("entries", entries.data_type().clone(), false)),
        OffsetBuffer::new(ScalarBuffer::from(vec![0, 2])),
        entries,
        None,
        false,
    );
    assert_eq!(json_values(Arc::new(map)), [r#"[[1,"x"],[2,"y"]]"#]);
}

#[test]
fn writes_dictionaries_as_their_values() {
    let dict: DictionaryArray<Int8Type> = vec![Some("red"), None, Some("blue"), Some("red")]
        .into_iter()
        .collect();
    assert_eq!(
        json_values(Arc::new(dict.clone())),
        ["\"red\"", "null", "\"blue\"", "\"red\""]
    );
    assert_eq!(
        text_values(Arc::new(dict)),
        [
            Some("red".into()),
            None,
            Some("blue".into()),
            Some("red".into())
        ]
    );
}

#[test]
fn refuses_unions_and_run_end_arrays_naming_the_column() {
    let union = DataType::Union(
        UnionFields::try_new(vec![0], vec![Field::new("i", DataType::Int32, true)]).unwrap(),
        arrow::datatypes::UnionMode::Dense,
    );
    let nested = DataType::Struct(vec![Field::new("u", union.clone(), true)].into());
    let schema = Schema::new(vec![
        Field::new("ok", DataType::Int32, true),
        Field::new("s", nested, true),
        Field::new(
            "r",
            DataType::RunEndEncoded(
                Arc::new(Field::new("run_ends", DataType::Int32, false)),
                Arc::new(Field::new("values", DataType::Utf8, true)),
            ),
            true,
        ),
    ]);
    assert!(JsonRowEncoder::new(&schema, &[0]).is_ok());
    let err = JsonRowEncoder::new(&schema, &[0, 1])
        .unwrap_err()
        .to_string();
    assert!(err.contains("'s.u'") && err.contains("Union"), "{err}");
    let err = JsonRowEncoder::new(&schema, &[2]).unwrap_err().to_string();
    assert!(
        err.contains("'r'") && err.contains("RunEndEncoded"),
        "{err}"
    );
}

#[test]
fn text_form_is_the_json_value_without_quotes() {
    assert_eq!(
        text_values(Arc::new(Int64Array::from(vec![Some(-7), None]))),
        [Some("-7".into()), None]
    );
    assert_eq!(
        text_values(Arc::new(BooleanArray::from(vec![true]))),
        [Some("true".into())]
    );
    assert_eq!(
        text_values(Arc::new(TimestampSecondArray::from(vec![0]))),
        [Some("1970-01-01T00:00:00Z".into())]
    );
    let d = Decimal128Array::from(vec![150])
        .with_precision_and_scale(5, 2)
        .unwrap();
    assert_eq!(text_values(Arc::new(d)), [Some("1.50".into())]);
    let list =
        ListArray::from_iter_primitive::<Int32Type, _, _>(vec![Some(vec![Some(1), Some(2)])]);
    assert_eq!(text_values(Arc::new(list)), [Some("[1,2]".into())]);
}

/// Every supported type in one batch: each row is valid JSON and reads back to the values.
#[test]
fn every_type_round_trips_through_serde_json() {
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("null", Arc::new(NullArray::new(2))),
        ("bool", Arc::new(BooleanArray::from(vec![Some(true), None]))),
        ("i8", Arc::new(Int8Array::from(vec![Some(-1), None]))),
        (
            "i64",
            Arc::new(Int64Array::from(vec![Some(i64::MIN), None])),
        ),
        (
            "u64",
            Arc::new(UInt64Array::from(vec![Some(u64::MAX), None])),
        ),
        (
            "f64",
            Arc::new(Float64Array::from(vec![Some(1.25), Some(f64::NAN)])),
        ),
        (
            "f32",
            Arc::new(Float32Array::from(vec![Some(0.5f32), None])),
        ),
        (
            "dec",
            Arc::new(
                Decimal128Array::from(vec![Some(-1234), None])
                    .with_precision_and_scale(8, 2)
                    .unwrap(),
            ),
        ),
        (
            "s",
            Arc::new(StringViewArray::from(vec![Some("tab\there \u{0}"), None])),
        ),
        (
            "b",
            Arc::new(BinaryArray::from(vec![Some(&[9u8, 8, 7][..]), None])),
        ),
        ("d", Arc::new(Date32Array::from(vec![Some(19_844), None]))),
        (
            "t",
            Arc::new(Time64MicrosecondArray::from(vec![Some(1), None])),
        ),
        (
            "ts",
            Arc::new(TimestampMillisecondArray::from(vec![Some(1), None]).with_timezone("+01:00")),
        ),
        (
            "dur",
            Arc::new(DurationSecondArray::from(vec![Some(3), None])),
        ),
        (
            "ym",
            Arc::new(IntervalYearMonthArray::from(vec![Some(2), None])),
        ),
        (
            "l",
            Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
                Some(vec![Some(1), None]),
                None,
            ])),
        ),
        ("m", Arc::new(string_map().slice(0, 2))),
        (
            "dict",
            Arc::new(
                vec![Some("x"), None]
                    .into_iter()
                    .collect::<DictionaryArray<Int8Type>>(),
            ),
        ),
    ];
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(
        schema.clone(),
        columns.iter().map(|(_, a)| a.clone()).collect(),
    )
    .unwrap();
    let all: Vec<usize> = (0..columns.len()).collect();
    let encoder = JsonRowEncoder::new(&schema, &all).unwrap();
    let mut rows = encoder.bind(&batch).unwrap();
    let mut out = Vec::new();
    rows.write_row(0, &mut out);
    let row0: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let expected = serde_json::json!({
        "null": null, "bool": true, "i8": -1, "i64": i64::MIN, "u64": u64::MAX, "f64": 1.25, "f32": 0.5,
        "dec": "-12.34", "s": "tab\there \u{0}", "b": "CQgH", "d": "2024-05-01", "t": "00:00:00.000001",
        "ts": "1970-01-01T01:00:00.001+01:00", "dur": "PT3S", "ym": "P2M", "l": [1, null],
        "m": {"a": 1, "b": null}, "dict": "x"
    });
    assert_eq!(row0, expected);
    out.clear();
    rows.write_row(1, &mut out);
    let row1: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let object = row1.as_object().unwrap();
    assert_eq!(object.len(), columns.len());
    // Row 1 is null everywhere except the map (an empty object).
    for (name, value) in object {
        if name == "m" {
            assert_eq!(value, &serde_json::json!({}));
        } else {
            assert!(value.is_null(), "{name}: {value}");
        }
    }
}

#[test]
fn bind_reuses_the_buffer_without_clearing_it() {
    let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int32, false)]));
    let batch =
        RecordBatch::try_new(schema.clone(), vec![Arc::new(Int32Array::from(vec![1, 2]))]).unwrap();
    let encoder = JsonRowEncoder::new(&schema, &[0]).unwrap();
    let mut rows = encoder.bind(&batch).unwrap();
    let mut out = b"prefix ".to_vec();
    rows.write_row(0, &mut out);
    rows.write_row(1, &mut out);
    assert_eq!(out, br#"prefix {"n":1}{"n":2}"#);
}

/// The escape rule written out byte by byte, to check the table-driven writer against.
fn escaped_one_byte_at_a_time(bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![b'"'];
    for &b in bytes {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x09 => out.extend_from_slice(b"\\t"),
            0x0a => out.extend_from_slice(b"\\n"),
            0x0c => out.extend_from_slice(b"\\f"),
            0x0d => out.extend_from_slice(b"\\r"),
            0x00..=0x1f => out.extend_from_slice(format!("\\u{b:04x}").as_bytes()),
            _ => out.push(b),
        }
    }
    out.push(b'"');
    out
}

#[test]
fn escapes_every_byte_at_every_position_like_the_byte_rule() {
    // Every byte value at every offset of texts 1 to 24 bytes long (so within a word, across a
    // word boundary and in the tail), among clean ASCII and multi-byte UTF-8 neighbours.
    for filler in [b'a', 0xc3] {
        for len in 1..=24usize {
            for at in 0..len {
                for b in 0..=255u8 {
                    let mut text = vec![filler; len];
                    text[at] = b;
                    let mut ours = Vec::new();
                    write_json_str(&mut ours, &text);
                    assert_eq!(
                        ours,
                        escaped_one_byte_at_a_time(&text),
                        "byte {b:#04x} at {at} of {len}"
                    );
                }
            }
        }
    }
}

#[test]
fn escapes_side_by_side_and_text_without_any() {
    let mut out = Vec::new();
    write_json_str(&mut out, b"\"\"\\\\\n\n\x01\x1f");
    assert_eq!(out, br#""\"\"\\\\\n\n\u0001\u001f""#);
    out.clear();
    let clean = "https://example.com/catalog/item/123?ref=bench-\u{e9}\u{4e2d}".repeat(3);
    write_json_str(&mut out, clean.as_bytes());
    assert_eq!(out, format!("\"{clean}\"").as_bytes());
    out.clear();
    write_json_str(&mut out, b"");
    assert_eq!(out, b"\"\"");
}
