//! The payload options of a sink or source that encodes rows with a schema: `schema`,
//! `schema_location` and `schema_encoding`, and [`payload_options`], which reads them together
//! with a connector's `format`.
//!
//! `format` stays with each connector, built by [`format_spec`], since what it says about where
//! the payload goes (a message, a request body) and where a schema may also come from differs.
//! The schema itself, and reading an object-store `schema_location` when a statement starts,
//! are in [`crate::encode::schema`].

use crate::encode::schema::{PayloadSchema, SchemaEncoding, SchemaLocation, SchemaType};
use crate::error::{Error, Result};
use crate::options::{
    Bound, DefaultValue, OptionGroup, OptionKind, OptionSpec, ParsedOptions, PayloadFormat, Redact,
};

/// The `format` words a schema-capable connector accepts.
pub const FORMATS: &[&str] = &["json", "raw", "avro", "protobuf"];

/// The `format` spec of a schema-capable connector: one of [`FORMATS`], `json` by default,
/// with the connector's own rule and description.
pub const fn format_spec(cross_rule: &'static str, description: &'static str) -> OptionSpec {
    OptionSpec {
        name: "format",
        group: OptionGroup::Mapping,
        kind: OptionKind::Enum(FORMATS),
        default: DefaultValue::Text("json"),
        bound: Bound::None,
        cross_rule,
        example: "avro",
        description,
        redact: Redact::None,
    }
}

/// `schema`.
pub static SCHEMA: OptionSpec = OptionSpec {
    name: "schema",
    group: OptionGroup::Mapping,
    kind: OptionKind::Text,
    default: DefaultValue::None,
    bound: Bound::None,
    cross_rule: "needs `format` `avro` or `protobuf`; not with `schema_location`",
    example: "{\"type\":\"record\",\"name\":\"Click\",\"fields\":[{\"name\":\"user_id\",\"type\":\"long\"}]}",
    description: "The schema of `format = 'avro'` (Avro JSON, a record) or `format = 'protobuf'` (a `.proto` file with one top-level message), inline.",
    redact: Redact::None,
};

/// `schema_location`.
pub static SCHEMA_LOCATION: OptionSpec = OptionSpec {
    name: "schema_location",
    group: OptionGroup::Mapping,
    kind: OptionKind::Text,
    default: DefaultValue::None,
    bound: Bound::None,
    cross_rule: "needs `format` `avro` or `protobuf`; not with `schema`",
    example: "gs://my-bucket/schemas/click.avsc",
    description: "Where the schema of `format = 'avro'` or `'protobuf'` is kept: a local file (a path, or a `file://` URL), read when the table is declared, or an object-store URL (`gs://`, `s3://`, `http(s)://`, or any store the session registers), read when a statement starts; the column checks then run at that point.",
    redact: Redact::None,
};

/// `schema_encoding`.
pub static SCHEMA_ENCODING: OptionSpec = OptionSpec {
    name: "schema_encoding",
    group: OptionGroup::Mapping,
    kind: OptionKind::Enum(&["binary", "json"]),
    default: DefaultValue::Text("binary"),
    bound: Bound::None,
    cross_rule: "needs `format` `avro` or `protobuf`",
    example: "json",
    description: "How `format = 'avro'` or `'protobuf'` writes a row (or, in a table that reads, decodes a message): `binary` (a bare Avro datum, or the protobuf wire format) or `json` (Avro's JSON encoding, or the proto3 JSON mapping).",
    redact: Redact::None,
};

/// The `format`, `schema`, `schema_location` and `schema_encoding` options, read.
#[derive(Debug)]
pub(crate) struct PayloadOptions {
    /// `json` or `raw`; `json` also for `avro` and `protobuf`, whose schema is then given.
    pub(crate) format: PayloadFormat,
    /// The schema of `avro` / `protobuf`, when known at declaration.
    pub(crate) schema: Option<PayloadSchema>,
    /// Where the schema is read when a statement starts (an object-store URL).
    pub(crate) schema_at: Option<SchemaLocation>,
    /// Whether `format` was given.
    pub(crate) format_given: bool,
}

/// Reads the `format`, `schema`, `schema_location` and `schema_encoding` options: the payload
/// format, the schema of `avro` and `protobuf` (or where to read it), and whether `format` was
/// given at all.
pub(crate) fn payload_options(
    p: &ParsedOptions,
    format_spec: &'static OptionSpec,
) -> Result<PayloadOptions> {
    let format = p.text(format_spec)?;
    let inline = p.text(&SCHEMA)?;
    let location = p.text(&SCHEMA_LOCATION)?;
    let encoding = p.text(&SCHEMA_ENCODING)?;
    let kind = match format {
        None | Some("json") | Some("raw") => None,
        Some("avro") => Some(SchemaType::Avro),
        Some("protobuf") => Some(SchemaType::Protobuf),
        Some(other) => {
            return Err(format_spec.invalid(other, "expected 'json', 'raw', 'avro' or 'protobuf'"));
        }
    };
    let Some(kind) = kind else {
        for (spec, given) in [
            (&SCHEMA, inline.is_some()),
            (&SCHEMA_LOCATION, location.is_some()),
            (&SCHEMA_ENCODING, encoding.is_some()),
        ] {
            if given {
                return Err(Error::invalid(
                    spec.name,
                    "(given)",
                    format!(
                        "{} (format is '{}')",
                        spec.cross_rule,
                        format.unwrap_or("json")
                    ),
                ));
            }
        }
        let f = if format == Some("raw") {
            PayloadFormat::Raw
        } else {
            PayloadFormat::Json
        };
        return Ok(PayloadOptions {
            format: f,
            schema: None,
            schema_at: None,
            format_given: format.is_some(),
        });
    };
    let encoding = match encoding {
        None | Some("binary") => SchemaEncoding::Binary,
        Some("json") => SchemaEncoding::Json,
        Some(other) => return Err(SCHEMA_ENCODING.invalid(other, "expected 'binary' or 'json'")),
    };
    let (definition, origin) = match (inline, location) {
        (Some(_), Some(_)) => {
            return Err(SCHEMA_LOCATION.invalid(
                "(given)",
                "cannot be combined with 'schema': give the schema one way",
            ));
        }
        (Some(text), None) => (text.to_string(), "option 'schema'".to_string()),
        (None, Some(location)) => match local_path(location)? {
            Some(path) => (
                std::fs::read_to_string(&path).map_err(|e| {
                    SCHEMA_LOCATION.invalid(location, format!("cannot be read: {e}"))
                })?,
                format!("schema_location '{location}'"),
            ),
            None => {
                return Ok(PayloadOptions {
                    format: PayloadFormat::Json,
                    schema: None,
                    schema_at: Some(SchemaLocation {
                        kind,
                        encoding,
                        url: location.to_string(),
                    }),
                    format_given: true,
                });
            }
        },
        (None, None) => {
            return Err(Error::MissingOption {
                option: SCHEMA.name.into(),
                rule: format!(
                    "format '{}' needs its schema: 'schema' (inline) or 'schema_location' (a file or object-store URL)",
                    kind.name()
                ),
            });
        }
    };
    Ok(PayloadOptions {
        format: PayloadFormat::Json,
        schema: Some(PayloadSchema {
            kind,
            definition,
            encoding,
            origin,
        }),
        schema_at: None,
        format_given: true,
    })
}

/// The local file a `schema_location` names (a path or a `file://` URL); `None` for an
/// object-store URL, which is read when a statement starts.
fn local_path(location: &str) -> Result<Option<std::path::PathBuf>> {
    match location.split_once("://") {
        None => Ok(Some(std::path::PathBuf::from(location))),
        Some(("file", _)) => url::Url::parse(location)
            .ok()
            .and_then(|u| u.to_file_path().ok())
            .map(Some)
            .ok_or_else(|| SCHEMA_LOCATION.invalid(location, "not a valid file:// URL")),
        Some(_) => url::Url::parse(location)
            .map(|_| None)
            .map_err(|e| SCHEMA_LOCATION.invalid(location, format!("not a URL: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::RawOptions;

    static SPECS: [&OptionSpec; 4] = [&FORMAT, &SCHEMA, &SCHEMA_LOCATION, &SCHEMA_ENCODING];
    static FORMAT: OptionSpec = format_spec("", "A test format.");

    fn read(pairs: &[(&str, &str)]) -> Result<PayloadOptions> {
        let raw =
            RawOptions::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))?;
        let p = ParsedOptions::parse("test", &SPECS, &raw)?;
        payload_options(&p, &FORMAT)
    }

    #[test]
    fn an_inline_schema_a_file_and_an_object_store_url_are_told_apart() {
        let inline = read(&[("format", "avro"), ("schema", "{}")]).unwrap();
        assert_eq!(inline.schema.unwrap().kind, SchemaType::Avro);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("m.proto");
        std::fs::write(&file, "syntax = \"proto3\";").unwrap();
        let local = read(&[
            ("format", "protobuf"),
            ("schema_location", file.to_str().unwrap()),
            ("schema_encoding", "json"),
        ])
        .unwrap();
        let schema = local.schema.unwrap();
        assert_eq!(schema.definition, "syntax = \"proto3\";");
        assert_eq!(schema.encoding, SchemaEncoding::Json);
        let remote = read(&[("format", "avro"), ("schema_location", "gs://b/s.avsc")]).unwrap();
        assert!(remote.schema.is_none());
        assert_eq!(remote.schema_at.unwrap().url, "gs://b/s.avsc");
    }

    #[test]
    fn a_schema_option_without_a_schema_format_names_both() {
        let err = read(&[("format", "raw"), ("schema", "{}")])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("schema") && err.contains("format is 'raw'"),
            "{err}"
        );
        let err = read(&[("format", "avro")]).unwrap_err().to_string();
        assert!(
            err.contains("'schema'") && err.contains("'schema_location'"),
            "{err}"
        );
    }
}
