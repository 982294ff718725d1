use std::sync::Arc;

use arrow::array::{
    ArrayRef, BinaryArray, DictionaryArray, Int64Array, MapBuilder, StringArray, StringBuilder,
    StringViewArray, TimestampMillisecondArray, TimestampNanosecondArray,
};
use arrow::datatypes::{Field, Int32Type};

use super::*;
use crate::connectors::TableOptions;
use crate::options::RawOptions;

const QUEUE: &str = "projects/demo/locations/us-central1/queues/jobs";

fn options(location: Option<&str>, pairs: &[(&str, &str)]) -> CloudTasksSinkOptions {
    let raw = RawOptions::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
        .expect("pairs");
    CloudTasksSinkOptions::from_raw_with_env(location, &raw, &|_| None).expect("options")
}

fn fixed(pairs: &[(&str, &str)]) -> CloudTasksSinkOptions {
    let mut all = vec![("url", "https://w.example.com/run")];
    all.extend_from_slice(pairs);
    options(Some(QUEUE), &all)
}

fn encode(
    options: &CloudTasksSinkOptions,
    columns: Vec<(&str, ArrayRef)>,
) -> Vec<std::result::Result<Envelope<TaskRecord>, Error>> {
    let schema = Arc::new(Schema::new(
        columns
            .iter()
            .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
            .collect::<Vec<_>>(),
    ));
    let batch = RecordBatch::try_new(
        schema.clone(),
        columns.into_iter().map(|(_, a)| a).collect(),
    )
    .expect("batch");
    let mapping = CloudTasksMapping::new(options, &schema).expect("mapping");
    let mut out = Vec::new();
    mapping.encode_batch(&batch, 10, &mut out).expect("encode");
    out
}

fn task(envelope: &std::result::Result<Envelope<TaskRecord>, Error>) -> proto::Task {
    envelope
        .as_ref()
        .expect("encoded")
        .record
        .to_task()
        .expect("decodes")
}

fn request(envelope: &std::result::Result<Envelope<TaskRecord>, Error>) -> proto::HttpRequest {
    envelope
        .as_ref()
        .expect("encoded")
        .record
        .http_request()
        .expect("decodes")
        .expect("an HTTP task")
}

fn error_text(envelope: &std::result::Result<Envelope<TaskRecord>, Error>) -> String {
    match envelope {
        Ok(e) => panic!("expected a rejected row, got {e:?}"),
        Err(e) => e.to_string(),
    }
}

fn strings(values: &[Option<&str>]) -> ArrayRef {
    Arc::new(StringArray::from(values.to_vec()))
}

#[test]
fn encodes_the_row_as_a_json_body_with_a_json_content_type() {
    let out = encode(
        &fixed(&[]),
        vec![
            ("id", Arc::new(Int64Array::from(vec![1, 2]))),
            ("name", strings(&[Some("a"), None])),
        ],
    );
    let first = request(&out[0]);
    assert_eq!(first.url, "https://w.example.com/run");
    assert_eq!(first.http_method, proto::HttpMethod::Post as i32);
    assert_eq!(first.body, br#"{"id":1,"name":"a"}"#);
    assert_eq!(
        first.headers.get(CONTENT_TYPE).map(String::as_str),
        Some(JSON_MEDIA_TYPE)
    );
    assert_eq!(request(&out[1]).body, br#"{"id":2,"name":null}"#);
    let envelope = out[0].as_ref().unwrap();
    assert_eq!(&*envelope.destination, QUEUE);
    assert_eq!(envelope.bytes as usize, envelope.record.encoded_len());
    assert!(envelope.sequence_key.is_none());
    assert!(!envelope.record.is_named());
}

#[test]
fn an_explicit_content_type_header_replaces_the_json_default() {
    let out = encode(
        &fixed(&[("headers", "content-type: text/plain; X-Source: t")]),
        vec![("id", Arc::new(Int64Array::from(vec![1])))],
    );
    let headers = request(&out[0]).headers;
    assert_eq!(headers.len(), 2, "{headers:?}");
    assert_eq!(headers["content-type"], "text/plain");
    assert_eq!(headers["X-Source"], "t");
}

#[test]
fn body_column_is_sent_as_it_is_without_a_content_type() {
    let body: ArrayRef = Arc::new(BinaryArray::from(vec![Some(&b"\x00\xffraw"[..]), None]));
    let out = encode(
        &fixed(&[("body_column", "payload")]),
        vec![("payload", body)],
    );
    let first = request(&out[0]);
    assert_eq!(first.body, b"\x00\xffraw");
    assert!(first.headers.is_empty(), "{:?}", first.headers);
    assert!(request(&out[1]).body.is_empty(), "a null body is empty");
}

#[test]
fn raw_format_sends_the_one_remaining_column() {
    let out = encode(
        &fixed(&[("format", "raw")]),
        vec![(
            "text",
            Arc::new(StringViewArray::from(vec!["hello"])) as ArrayRef,
        )],
    );
    let first = request(&out[0]);
    assert_eq!(first.body, b"hello");
    assert!(!first.headers.contains_key(CONTENT_TYPE));
}

#[test]
fn a_method_without_a_body_sends_none() {
    let out = encode(
        &fixed(&[("http_method", "GET")]),
        vec![("id", Arc::new(Int64Array::from(vec![1])) as ArrayRef)],
    );
    let first = request(&out[0]);
    assert_eq!(first.http_method, proto::HttpMethod::Get as i32);
    assert!(first.body.is_empty());
    assert!(
        first.headers.is_empty(),
        "no JSON content type without a body"
    );
}

#[test]
fn a_stray_column_beside_the_body_column_is_a_schema_error() {
    let opts = fixed(&[("body_column", "payload")]);
    let schema = Schema::new(vec![
        Field::new("payload", DataType::Utf8, true),
        Field::new("extra", DataType::Int64, true),
    ]);
    let err = CloudTasksMapping::new(&opts, &schema)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("column 'extra'") && err.contains("body_column 'payload'"),
        "{err}"
    );
}

#[test]
fn one_column_with_two_roles_is_a_schema_error() {
    let opts = options(
        None,
        &[
            ("queue_column", "c"),
            ("url_column", "c"),
            ("project", "demo"),
            ("location", "us-central1"),
        ],
    );
    let schema = Schema::new(vec![Field::new("c", DataType::Utf8, true)]);
    let err = CloudTasksMapping::new(&opts, &schema)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("used as both queue_column and url_column"),
        "{err}"
    );
}

#[test]
fn queue_column_resolves_short_ids_and_refuses_nulls_and_bad_ids() {
    let opts = options(
        None,
        &[
            ("queue_column", "q"),
            ("url", "https://w.example.com/"),
            ("project", "demo"),
            ("location", "europe-west1"),
        ],
    );
    let out = encode(
        &opts,
        vec![
            (
                "q",
                strings(&[
                    Some("a"),
                    Some("projects/p2/locations/l2/queues/b"),
                    None,
                    Some("bad id"),
                    Some("a"),
                ]),
            ),
            ("id", Arc::new(Int64Array::from(vec![1, 2, 3, 4, 5]))),
        ],
    );
    let dest = |i: usize| out[i].as_ref().unwrap().destination.to_string();
    assert_eq!(dest(0), "projects/demo/locations/europe-west1/queues/a");
    assert_eq!(dest(1), "projects/p2/locations/l2/queues/b");
    let null = error_text(&out[2]);
    assert!(
        null.starts_with("row 12:") && null.contains("column 'q'"),
        "{null}"
    );
    let bad = error_text(&out[3]);
    assert!(bad.contains("row 13") && bad.contains("queue id"), "{bad}");
    assert_eq!(dest(4), dest(0));
    // The queue column is a role, not part of the body.
    assert_eq!(request(&out[0]).body, br#"{"id":1}"#);
}

#[test]
fn url_column_values_are_checked_per_row() {
    let opts = options(Some(QUEUE), &[("url_column", "target")]);
    let long = format!("https://w.example.com/{}", "a".repeat(MAX_URL_LEN));
    let out = encode(
        &opts,
        vec![(
            "target",
            strings(&[
                Some("http://localhost:8080/x"),
                Some("ftp://h/x"),
                None,
                Some(&long),
            ]),
        )],
    );
    assert_eq!(request(&out[0]).url, "http://localhost:8080/x");
    assert!(
        request(&out[0]).body.is_empty(),
        "no column is left for the body"
    );
    let ftp = error_text(&out[1]);
    assert!(
        ftp.contains("column 'target'") && ftp.contains("http://"),
        "{ftp}"
    );
    assert!(error_text(&out[2]).contains("null or empty"));
    let too_long = error_text(&out[3]);
    assert!(
        too_long.contains("column 'target'") && too_long.contains("2083"),
        "{too_long}"
    );
}

#[test]
fn a_url_at_the_limit_is_accepted_and_one_past_it_refused() {
    let prefix = "https://w.example.com/";
    let at = format!("{prefix}{}", "a".repeat(MAX_URL_LEN - prefix.len()));
    assert!(check_task_url(&at).is_ok());
    let over = format!("{at}a");
    assert!(check_task_url(&over).unwrap_err().contains("2083"));
    // Percent-encoding counts: a non-ASCII letter becomes six characters.
    let spaced = format!(
        "{prefix}{}",
        "é".repeat((MAX_URL_LEN - prefix.len()) / 6 + 1)
    );
    assert!(spaced.len() < MAX_URL_LEN);
    assert!(check_task_url(&spaced).is_err());
}

#[test]
fn row_headers_replace_option_headers_regardless_of_case() {
    let opts = fixed(&[
        ("headers", "X-A: 1; X-B: 2"),
        ("headers_column", "h"),
        ("http_method", "PUT"),
    ]);
    let mut builder = MapBuilder::new(None, StringBuilder::new(), StringBuilder::new());
    builder.keys().append_value("x-a");
    builder.values().append_value("row");
    builder.keys().append_value("X-C");
    builder.values().append_null();
    builder.append(true).unwrap();
    builder.append(false).unwrap();
    builder.keys().append_value("Bad Name");
    builder.values().append_value("v");
    builder.append(true).unwrap();
    builder.keys().append_value("X-D");
    builder.values().append_value("a\r\nInjected: yes");
    builder.append(true).unwrap();
    let out = encode(
        &opts,
        vec![
            ("h", Arc::new(builder.finish()) as ArrayRef),
            ("id", Arc::new(Int64Array::from(vec![1, 2, 3, 4]))),
        ],
    );
    let first = request(&out[0]).headers;
    assert_eq!(first.get("x-a").map(String::as_str), Some("row"));
    assert!(!first.contains_key("X-A"), "{first:?}");
    assert_eq!(first["X-B"], "2");
    assert!(!first.contains_key("X-C"), "a null value is skipped");
    assert_eq!(first[CONTENT_TYPE], JSON_MEDIA_TYPE);
    let second = request(&out[1]).headers;
    assert_eq!(second["X-A"], "1", "a null map adds nothing");
    assert!(error_text(&out[2]).contains("not a valid HTTP header name"));
    assert!(error_text(&out[3]).contains("line break"));
    // A header of a row is a row's value: neither its name nor its value is shown.
    assert!(
        error_text(&out[2]).contains("column 'h' (headers_column), entry 1"),
        "{}",
        error_text(&out[2])
    );
    assert!(!error_text(&out[2]).contains("Bad Name"));
    assert!(!error_text(&out[3]).contains("X-D") && !error_text(&out[3]).contains("Injected"));
}

#[test]
fn a_refused_row_url_or_task_name_is_never_shown_in_the_error() {
    let opts = options(
        Some(QUEUE),
        &[("url_column", "target"), ("task_name_column", "tid")],
    );
    let out = encode(
        &opts,
        vec![
            (
                "target",
                strings(&[
                    Some("ftp://user:password@files.example.com/x?key=SECRET"),
                    Some("http://user:password@bad host/x?key=SECRET"),
                    Some("https://w.example.com/run"),
                ]),
            ),
            (
                "tid",
                strings(&[
                    None,
                    None,
                    Some("projects/demo/locations/us-central1/queues/other/tasks/password-SECRET"),
                ]),
            ),
        ],
    );
    for (row, limit) in [
        (0, "scheme 'ftp'"),
        (1, "not a URL"),
        (2, "does not belong"),
    ] {
        let error = error_text(&out[row]);
        assert!(
            error.starts_with(&format!("row {}:", row + 10)) && error.contains(limit),
            "{error}"
        );
        assert!(
            !error.contains("password") && !error.contains("SECRET") && !error.contains("user"),
            "{error}"
        );
    }
    assert!(error_text(&out[0]).contains("column 'target'"));
    assert!(error_text(&out[2]).contains("column 'tid' (task_name_column)"));
}

#[test]
fn headers_at_the_size_limit_are_refused() {
    let opts = fixed(&[("headers_column", "h"), ("body_column", "b")]);
    let mut builder = MapBuilder::new(None, StringBuilder::new(), StringBuilder::new());
    builder.keys().append_value("X-Big");
    builder.values().append_value("v".repeat(MAX_HEADERS_BYTES));
    builder.append(true).unwrap();
    let out = encode(
        &opts,
        vec![
            ("h", Arc::new(builder.finish()) as ArrayRef),
            ("b", strings(&[Some("x")])),
        ],
    );
    let err = error_text(&out[0]);
    assert!(
        err.contains("column 'h'") && err.contains("less than 80000"),
        "{err}"
    );
}

#[test]
fn schedule_time_is_truncated_to_microseconds() {
    let opts = fixed(&[("schedule_time_column", "at"), ("body_column", "b")]);
    // 2100-01-01T00:00:00.123456789Z, 1969-12-31T23:59:59.999999999Z and null.
    let nanos: ArrayRef = Arc::new(TimestampNanosecondArray::from(vec![
        Some(4_102_444_800_123_456_789),
        Some(-1),
        None,
    ]));
    let out = encode(
        &opts,
        vec![
            ("at", nanos),
            ("b", strings(&[Some("x"), Some("y"), Some("z")])),
        ],
    );
    assert_eq!(
        task(&out[0]).schedule_time,
        Some(prost_types::Timestamp {
            seconds: 4_102_444_800,
            nanos: 123_456_000
        })
    );
    assert_eq!(
        task(&out[1]).schedule_time,
        Some(prost_types::Timestamp {
            seconds: -1,
            nanos: 999_999_000
        })
    );
    assert_eq!(task(&out[2]).schedule_time, None);
}

#[test]
fn schedule_time_with_a_time_zone_is_the_same_instant() {
    let opts = fixed(&[("schedule_time_column", "at"), ("body_column", "b")]);
    let millis: ArrayRef =
        Arc::new(TimestampMillisecondArray::from(vec![1_700_000_000_250]).with_timezone("+02:00"));
    let out = encode(&opts, vec![("at", millis), ("b", strings(&[Some("x")]))]);
    assert_eq!(
        task(&out[0]).schedule_time,
        Some(prost_types::Timestamp {
            seconds: 1_700_000_000,
            nanos: 250_000_000
        })
    );
}

#[test]
fn task_ids_become_names_in_the_row_queue_and_bad_ids_are_refused() {
    let opts = fixed(&[("task_name_column", "tid"), ("body_column", "b")]);
    let full = format!("{QUEUE}/tasks/full-1");
    let other = "projects/demo/locations/us-central1/queues/other/tasks/t";
    let long = "a".repeat(501);
    let out = encode(
        &opts,
        vec![
            (
                "tid",
                strings(&[
                    Some("abc_DEF-9"),
                    Some(&full),
                    Some(other),
                    Some("no spaces"),
                    Some(&long),
                    None,
                    Some(""),
                ]),
            ),
            ("b", strings(&[Some("x"); 7])),
        ],
    );
    assert_eq!(task(&out[0]).name, format!("{QUEUE}/tasks/abc_DEF-9"));
    assert!(out[0].as_ref().unwrap().record.is_named());
    assert_eq!(task(&out[1]).name, full);
    assert!(error_text(&out[2]).contains("does not belong to queue"));
    let spaces = error_text(&out[3]);
    assert!(
        spaces.contains("column 'tid'") && spaces.contains("500"),
        "{spaces}"
    );
    assert!(error_text(&out[4]).contains("500"));
    assert_eq!(task(&out[5]).name, "", "null: unnamed");
    assert_eq!(task(&out[6]).name, "", "empty: unnamed");
}

#[test]
fn tokens_and_dispatch_deadline_are_carried() {
    let oidc = fixed(&[
        (
            "oidc_service_account_email",
            "invoker@demo.iam.gserviceaccount.com",
        ),
        ("dispatch_deadline", "90s"),
        ("body_column", "b"),
    ]);
    let out = encode(&oidc, vec![("b", strings(&[Some("x")]))]);
    let t = task(&out[0]);
    assert_eq!(
        t.dispatch_deadline,
        Some(prost_types::Duration {
            seconds: 90,
            nanos: 0
        })
    );
    match request(&out[0]).authorization_header {
        Some(proto::http_request::AuthorizationHeader::OidcToken(token)) => {
            assert_eq!(
                token.service_account_email,
                "invoker@demo.iam.gserviceaccount.com"
            );
            assert_eq!(
                token.audience, "",
                "the service defaults the audience to the URL"
            );
        }
        other => panic!("expected an OIDC token, got {other:?}"),
    }
    let oauth = fixed(&[
        (
            "oauth_service_account_email",
            "caller@demo.iam.gserviceaccount.com",
        ),
        ("oauth_scope", "https://www.googleapis.com/auth/pubsub"),
        ("body_column", "b"),
    ]);
    let out = encode(&oauth, vec![("b", strings(&[Some("x")]))]);
    assert!(task(&out[0]).dispatch_deadline.is_none());
    match request(&out[0]).authorization_header {
        Some(proto::http_request::AuthorizationHeader::OauthToken(token)) => {
            assert_eq!(token.scope, "https://www.googleapis.com/auth/pubsub");
        }
        other => panic!("expected an OAuth token, got {other:?}"),
    }
}

#[test]
fn an_oversize_task_is_refused_naming_the_row_column_and_limit() {
    let opts = fixed(&[("body_column", "b")]);
    let big = "x".repeat(MAX_TASK_BYTES as usize + 1);
    let near = "x".repeat(MAX_TASK_BYTES as usize - 10);
    let fits = "x".repeat(MAX_TASK_BYTES as usize - 200);
    let out = encode(
        &opts,
        vec![("b", strings(&[Some(&big), Some(&near), Some(&fits)]))],
    );
    let over_body = error_text(&out[0]);
    assert!(
        over_body.starts_with("row 10:")
            && over_body.contains("column 'b'")
            && over_body.contains("102400"),
        "{over_body}"
    );
    // The body alone fits; the serialized task (URL, method, framing) does not.
    let over_task = error_text(&out[1]);
    assert!(
        over_task.contains("row 11")
            && over_task.contains("serialized")
            && over_task.contains("102400"),
        "{over_task}"
    );
    let ok = out[2].as_ref().unwrap();
    assert!(ok.bytes <= MAX_TASK_BYTES);
}

#[test]
fn an_oversize_json_body_is_refused() {
    let opts = fixed(&[]);
    let big = "y".repeat(MAX_TASK_BYTES as usize);
    let out = encode(&opts, vec![("text", strings(&[Some(&big)]))]);
    let err = error_text(&out[0]);
    assert!(
        err.contains("the row encoded as JSON") && err.contains("102400"),
        "{err}"
    );
}

#[test]
fn dictionary_role_columns_are_decoded() {
    let opts = options(
        None,
        &[
            ("queue_column", "q"),
            ("url", "https://w.example.com/"),
            ("project", "demo"),
            ("location", "us-central1"),
            ("body_column", "b"),
        ],
    );
    let queues: DictionaryArray<Int32Type> = vec!["a", "b", "a"].into_iter().collect();
    let out = encode(
        &opts,
        vec![
            ("q", Arc::new(queues) as ArrayRef),
            ("b", strings(&[Some("1"), Some("2"), Some("3")])),
        ],
    );
    let dest: Vec<String> = out
        .iter()
        .map(|e| e.as_ref().unwrap().destination.to_string())
        .collect();
    assert_eq!(
        dest,
        [
            "projects/demo/locations/us-central1/queues/a",
            "projects/demo/locations/us-central1/queues/b",
            "projects/demo/locations/us-central1/queues/a"
        ]
    );
}

#[test]
fn create_task_request_bytes_decode_as_the_generated_type() {
    let task = proto::Task {
        name: format!("{QUEUE}/tasks/t1"),
        message_type: Some(proto::task::MessageType::HttpRequest(proto::HttpRequest {
            url: "https://w.example.com/".into(),
            body: b"hi".to_vec(),
            ..Default::default()
        })),
        ..Default::default()
    };
    let record = TaskRecord::from_task(&task);
    let mut body = Vec::new();
    write_create_task_request(&mut body, QUEUE, record.encoded());
    assert_eq!(
        body.len(),
        create_task_request_len(QUEUE, record.encoded_len())
    );
    let decoded = proto::CreateTaskRequest::decode(&body[..]).unwrap();
    assert_eq!(decoded.parent, QUEUE);
    assert_eq!(decoded.task, Some(task));
    assert!(record.is_named());
}

#[test]
fn methods_map_to_their_protobuf_values() {
    for (method, name) in [
        (HttpMethod::Get, "GET"),
        (HttpMethod::Head, "HEAD"),
        (HttpMethod::Post, "POST"),
        (HttpMethod::Put, "PUT"),
        (HttpMethod::Delete, "DELETE"),
        (HttpMethod::Patch, "PATCH"),
        (HttpMethod::Options, "OPTIONS"),
    ] {
        assert_eq!(proto_method(method).as_str_name(), name);
    }
}

#[test]
fn option_headers_must_be_valid() {
    let opts = fixed(&[("headers", "X-Ok: 1")]);
    let schema = Schema::new(vec![Field::new("id", DataType::Int64, true)]);
    let mapping = CloudTasksMapping::new(&opts, &schema).unwrap();
    assert_eq!(mapping.base_headers().len(), 2);
    assert!(check_header("", "v").is_err());
    assert!(check_header("X(y)", "v").is_err());
    assert!(check_header("X-Y", "ok; fine").is_ok());
}

#[test]
fn dispatch_deadline_keeps_subsecond_precision() {
    let opts = fixed(&[("dispatch_deadline", "15500ms"), ("body_column", "b")]);
    let out = encode(&opts, vec![("b", strings(&[Some("x")]))]);
    assert_eq!(
        task(&out[0]).dispatch_deadline,
        Some(prost_types::Duration {
            seconds: 15,
            nanos: 500_000_000
        })
    );
}

// --- schema'd bodies: format = 'avro' | 'protobuf' ------------------------------------------

const AVRO: &str = r#"{"type":"record","name":"Job","fields":[{"name":"id","type":"long"},{"name":"n","type":"int"}]}"#;
const PROTO: &str = "syntax = \"proto3\";\nmessage Job {\n  int64 id = 1;\n  int32 n = 2;\n}\n";

fn options_err(pairs: &[(&str, &str)]) -> String {
    let mut all = vec![("url", "https://w.example.com/run")];
    all.extend_from_slice(pairs);
    let raw = RawOptions::from_pairs(all.iter().map(|(k, v)| (k.to_string(), v.to_string())))
        .expect("pairs");
    CloudTasksSinkOptions::from_raw_with_env(Some(QUEUE), &raw, &|_| None)
        .unwrap_err()
        .to_string()
}

fn id_and_n(n: Vec<i64>) -> Vec<(&'static str, ArrayRef)> {
    let ids: Vec<i64> = (1..=n.len() as i64).collect();
    vec![
        ("id", Arc::new(Int64Array::from(ids))),
        ("n", Arc::new(Int64Array::from(n))),
    ]
}

#[test]
fn an_avro_body_is_a_bare_binary_datum_with_an_octet_stream_content_type() {
    let out = encode(
        &fixed(&[("format", "avro"), ("schema", AVRO)]),
        id_and_n(vec![2, -1]),
    );
    // Avro longs and ints are zig-zag varints: 1 -> 0x02, 2 -> 0x04, -1 -> 0x01.
    let first = request(&out[0]);
    assert_eq!(first.body, [0x02, 0x04]);
    assert_eq!(request(&out[1]).body, [0x04, 0x01]);
    assert_eq!(first.headers[CONTENT_TYPE], AVRO_BINARY_MEDIA_TYPE);
    assert_eq!(first.headers.len(), 1, "{:?}", first.headers);
}

#[test]
fn a_row_the_schema_refuses_is_rejected_naming_the_field_not_the_value() {
    for (format, schema) in [("avro", AVRO), ("protobuf", PROTO)] {
        let out = encode(
            &fixed(&[("format", format), ("schema", schema)]),
            id_and_n(vec![7, 1 << 40, 8]),
        );
        assert!(
            out[0].is_ok() && out[2].is_ok(),
            "{format}: the others are sent"
        );
        let err = error_text(&out[1]);
        assert!(
            err.contains("row 11") && err.contains("'n'"),
            "{format}: {err}"
        );
        assert!(!err.contains(&(1_i64 << 40).to_string()), "{format}: {err}");
    }
}

/// The body and `Content-Type` of the row (1, 3) under `pairs`.
fn body_and_type(pairs: &[(&str, &str)]) -> (Vec<u8>, String) {
    let request = request(&encode(&fixed(pairs), id_and_n(vec![3]))[0]);
    (request.body, request.headers[CONTENT_TYPE].clone())
}

#[test]
fn a_protobuf_body_gets_the_content_type_of_its_encoding() {
    let (body, content_type) = body_and_type(&[("format", "protobuf"), ("schema", PROTO)]);
    // Field 1 varint 1, field 2 varint 3.
    assert_eq!(body, [0x08, 0x01, 0x10, 0x03]);
    assert_eq!(content_type, PROTOBUF_MEDIA_TYPE);
    let json = [
        ("format", "protobuf"),
        ("schema", PROTO),
        ("schema_encoding", "json"),
    ];
    let (body, content_type) = body_and_type(&json);
    let body: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(body, serde_json::json!({"id": "1", "n": 3}));
    assert_eq!(content_type, JSON_MEDIA_TYPE);
    // An explicit Content-Type wins, as for JSON bodies (the option keeps the name's case).
    let explicit = [
        ("format", "avro"),
        ("schema", AVRO),
        ("headers", "Content-Type: avro/binary"),
    ];
    assert_eq!(body_and_type(&explicit).1, "avro/binary");
}

#[test]
fn role_columns_are_not_part_of_a_schema_body() {
    let out = encode(
        &fixed(&[
            ("format", "avro"),
            ("schema", AVRO),
            ("task_name_column", "task"),
        ]),
        vec![
            ("task", strings(&[Some("t1")])),
            ("id", Arc::new(Int64Array::from(vec![1]))),
            ("n", Arc::new(Int64Array::from(vec![2]))),
        ],
    );
    assert_eq!(request(&out[0]).body, [0x02, 0x04]);
    assert_eq!(task(&out[0]).name, format!("{QUEUE}/tasks/t1"));
}

#[test]
fn schema_options_that_cannot_apply_are_refused_naming_the_options() {
    let err = options_err(&[("format", "avro"), ("schema", AVRO), ("body_column", "b")]);
    assert!(
        err.contains("body_column") && err.contains("format 'avro'"),
        "{err}"
    );
    let err = options_err(&[
        ("format", "protobuf"),
        ("schema", PROTO),
        ("http_method", "GET"),
    ]);
    assert!(
        err.contains("http_method") && err.contains("format 'protobuf'"),
        "{err}"
    );
    let err = options_err(&[("format", "raw"), ("schema", AVRO)]);
    assert!(
        err.contains("'schema'") && err.contains("format is 'raw'"),
        "{err}"
    );
    let err = options_err(&[("schema_encoding", "json")]);
    assert!(
        err.contains("'schema_encoding'") && err.contains("format is 'json'"),
        "{err}"
    );
    let err = options_err(&[("format", "avro")]);
    assert!(err.contains("'schema_location'"), "{err}");
}

/// The error of declaring columns `fields` under `pairs`.
fn mapping_error(pairs: &[(&str, &str)], fields: &[(&str, DataType)]) -> String {
    let fields: Vec<Field> = fields
        .iter()
        .map(|(name, data_type)| Field::new(*name, data_type.clone(), false))
        .collect();
    CloudTasksMapping::new(&fixed(pairs), &Schema::new(fields))
        .unwrap_err()
        .to_string()
}

#[test]
fn a_column_the_schema_lacks_is_a_declaration_error_naming_column_and_types() {
    let avro = [("format", "avro"), ("schema", AVRO)];
    let extra = [
        ("id", DataType::Int64),
        ("n", DataType::Int64),
        ("extra", DataType::Utf8),
    ];
    let err = mapping_error(&avro, &extra);
    assert!(err.contains("'extra'"), "{err}");
    let proto = [("format", "protobuf"), ("schema", PROTO)];
    let err = mapping_error(&proto, &[("id", DataType::Utf8), ("n", DataType::Int64)]);
    assert!(
        err.contains("'id'") && err.contains("Utf8") && err.contains("int64"),
        "{err}"
    );
}
