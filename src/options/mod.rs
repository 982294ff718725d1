//! The option registry: one table of every option drives parsing, validation and docs.
//!
//! Both SQL forms reach the same parser:
//!
//! ```sql
//! CREATE TABLE clicks (user_id BIGINT, url VARCHAR)
//! WITH (connector = 'pubsub', topic = 'projects/demo/topics/clicks', batch_element_count_threshold = 500);
//!
//! CREATE EXTERNAL TABLE clicks (user_id BIGINT, url VARCHAR) STORED AS PUBSUB
//! LOCATION 'projects/demo/topics/clicks' OPTIONS ('batch_element_count_threshold' '500');
//! ```
//!
//! The SQL layer collects the pairs into [`RawOptions`] (names normalised, duplicates refused),
//! [`validate_names`] refuses unknown names with the nearest valid one, and each connector's
//! `*SinkOptions::from_raw` turns the pairs into typed options through the same builders a Rust
//! program uses. Every option is an [`OptionSpec`] in [`registry::REGISTRY`]; the builders
//! check values against those specs, and [`reference_markdown`] renders them into
//! `docs/options.md`.
//!
//! ```
//! use gcp_sql::options::{ConnectorKind, RawOptions, validate_names};
//!
//! let raw = RawOptions::from_pairs([
//!     ("format.topic".to_string(), "projects/demo/topics/clicks".to_string()),
//!     ("BATCH_ELEMENT_COUNT_THRESHOLD".to_string(), "500".to_string()),
//! ])?;
//! assert_eq!(raw.get("batch_element_count_threshold"), Some("500"));
//! validate_names(ConnectorKind::PubSub, &raw)?;
//!
//! let err = RawOptions::from_pairs([("topc".to_string(), "x".to_string())])
//!     .and_then(|raw| validate_names(ConnectorKind::PubSub, &raw))
//!     .unwrap_err();
//! assert!(err.to_string().contains("did you mean 'topic'"));
//! # Ok::<(), gcp_sql::Error>(())
//! ```

mod connection;
mod docs;
pub mod names;
pub mod registry;
pub mod schema_types;
pub mod spec;

use std::time::Duration;

pub use connection::{ConnectionOptions, EmulatorHost, EmulatorSource, EnvLookup};
pub use spec::{Bound, DefaultValue, OptionGroup, OptionKind, OptionSpec, Value};

use crate::core::FailurePolicy;
use crate::error::{Error, Result};

/// The options of one `CREATE` statement, as written: ordered `(name, value)` pairs with
/// normalised names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawOptions {
    pairs: Vec<(String, String)>,
}

/// Normalises an option name: trimmed, lower-cased, without the `format.` prefix DataFusion
/// adds to `OPTIONS` keys that have no dot.
pub fn normalize_name(name: &str) -> String {
    let lower = name.trim().to_ascii_lowercase();
    match lower.strip_prefix("format.") {
        Some(rest) => rest.to_string(),
        None => lower,
    }
}

impl RawOptions {
    /// Collects pairs, normalising names: lower-case, and a leading `format.` is stripped
    /// (DataFusion adds it to `OPTIONS` keys without a dot). Two entries that normalise to the
    /// same name are an [`Error::DuplicateOption`].
    pub fn from_pairs(pairs: impl IntoIterator<Item = (String, String)>) -> Result<Self> {
        let mut out: Vec<(String, String)> = Vec::new();
        for (name, value) in pairs {
            let name = normalize_name(&name);
            if out.iter().any(|(n, _)| *n == name) {
                return Err(Error::DuplicateOption { option: name });
            }
            out.push((name, value));
        }
        Ok(RawOptions { pairs: out })
    }

    /// The value given for `name` (a normalised name).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The pairs in the order they were written.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.pairs.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// Whether no option was given.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// How many options were given.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }
}

/// The connectors this crate knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConnectorKind {
    /// Google Cloud Pub/Sub: rows become published messages.
    PubSub,
    /// Google Cloud Tasks: rows become HTTP tasks.
    CloudTasks,
    /// Google Cloud Bigtable: rows become row mutations.
    Bigtable,
}

impl ConnectorKind {
    /// Every connector, in the order the reference lists them.
    pub const ALL: [ConnectorKind; 3] = [
        ConnectorKind::PubSub,
        ConnectorKind::CloudTasks,
        ConnectorKind::Bigtable,
    ];

    /// The name used in `connector = '...'` (`pubsub`, `cloud_tasks`, `bigtable`).
    pub fn name(self) -> &'static str {
        match self {
            ConnectorKind::PubSub => "pubsub",
            ConnectorKind::CloudTasks => "cloud_tasks",
            ConnectorKind::Bigtable => "bigtable",
        }
    }

    /// The word after `STORED AS` (`PUBSUB`, `CLOUD_TASKS`, `BIGTABLE`); DataFusion upper-cases it
    /// before looking up the table factory.
    pub fn stored_as(self) -> &'static str {
        match self {
            ConnectorKind::PubSub => "PUBSUB",
            ConnectorKind::CloudTasks => "CLOUD_TASKS",
            ConnectorKind::Bigtable => "BIGTABLE",
        }
    }

    /// The product name, for prose.
    pub fn display_name(self) -> &'static str {
        match self {
            ConnectorKind::PubSub => "Pub/Sub",
            ConnectorKind::CloudTasks => "Cloud Tasks",
            ConnectorKind::Bigtable => "Bigtable",
        }
    }

    /// The environment variable that points the connector at an emulator when the
    /// `emulator_host` option is absent.
    pub fn emulator_env_var(self) -> &'static str {
        match self {
            ConnectorKind::PubSub => "PUBSUB_EMULATOR_HOST",
            ConnectorKind::CloudTasks => "CLOUD_TASKS_EMULATOR_HOST",
            ConnectorKind::Bigtable => "BIGTABLE_EMULATOR_HOST",
        }
    }

    /// Parses a connector name, case-insensitively (`pubsub`, `PUBSUB`, `cloud_tasks`, ...).
    /// An unknown name is an [`Error::InvalidOption`] on `connector`, with the nearest name.
    pub fn parse(text: &str) -> Result<Self> {
        let t = text.trim();
        if let Some(kind) = Self::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(t))
        {
            return Ok(kind);
        }
        let names: Vec<&str> = Self::ALL.iter().map(|k| k.name()).collect();
        let lower = t.to_ascii_lowercase();
        let hint = nearest(&lower, names.iter().copied())
            .map(|s| format!(" (did you mean '{s}'?)"))
            .unwrap_or_default();
        Err(Error::invalid(
            "connector",
            text,
            format!("expected one of {}{hint}", names.join(", ")),
        ))
    }
}

impl std::fmt::Display for ConnectorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The spec of option `name` for connector `kind`, if it has one.
pub fn lookup(kind: ConnectorKind, name: &str) -> Option<&'static OptionSpec> {
    registry::REGISTRY
        .iter()
        .copied()
        .find(|s| s.name == name && s.applies_to(kind))
}

/// The options `kind` accepts, in registry order.
pub fn options_for(kind: ConnectorKind) -> impl Iterator<Item = &'static OptionSpec> + Clone {
    registry::REGISTRY
        .iter()
        .copied()
        .filter(move |s| s.applies_to(kind))
}

/// Whether two snake_case names of at least three words differ in exactly one word
/// (`max_active_publishers` / `max_active_instances`): the same knob of another connector.
fn differ_in_one_word(a: &str, b: &str) -> bool {
    let (wa, wb): (Vec<&str>, Vec<&str>) = (a.split('_').collect(), b.split('_').collect());
    wa.len() >= 3 && wa.len() == wb.len() && wa.iter().zip(&wb).filter(|(x, y)| x != y).count() == 1
}

/// The candidate closest to `name`, if it is close enough to be a likely misspelling, or else
/// the one candidate that differs from it in a single word.
fn nearest<'a>(name: &str, candidates: impl Iterator<Item = &'a str> + Clone) -> Option<&'a str> {
    let close = nearest_spelling(name, candidates.clone());
    if close.is_some() {
        return close;
    }
    let mut one_word = candidates.filter(|c| differ_in_one_word(name, c));
    match (one_word.next(), one_word.next()) {
        (Some(c), None) => Some(c),
        _ => None,
    }
}

fn nearest_spelling<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let mut best: Option<(&str, usize, f64)> = None;
    for c in candidates {
        let d = strsim::levenshtein(name, c);
        let jw = strsim::jaro_winkler(name, c);
        let better = match best {
            None => true,
            Some((_, bd, bjw)) => d < bd || (d == bd && jw > bjw),
        };
        if better {
            best = Some((c, d, jw));
        }
    }
    best.and_then(|(c, d, jw)| {
        let close = d <= 2 || d * 3 <= name.len() || jw >= 0.9;
        close.then_some(c)
    })
}

/// Refuses option names `kind` does not know ([`Error::UnknownOption`] with the nearest valid
/// name), then parses every value by its type and checks its value-level bound.
///
/// Cross-option rules (a destination is required, `recovery_max_backoff` at least
/// `recovery_initial_backoff`, ...) are checked when the sink options are built.
pub fn validate_names(kind: ConnectorKind, raw: &RawOptions) -> Result<()> {
    ParsedOptions::parse(kind, raw).map(|_| ())
}

/// The text of `docs/options.md`, rendered from the registry.
pub fn reference_markdown() -> String {
    docs::render()
}

/// One parsed option: its spec, the text as written and the typed value.
#[derive(Debug, Clone)]
struct Parsed {
    spec: &'static OptionSpec,
    text: String,
    value: Value,
}

/// The options of one statement, checked by name and parsed by type for one connector.
///
/// Reading a value goes through its spec, so a connector cannot read an option under a name
/// the registry does not have.
#[derive(Debug, Clone)]
pub struct ParsedOptions {
    kind: ConnectorKind,
    values: Vec<Parsed>,
}

impl ParsedOptions {
    /// Checks the names of `raw` against `kind`'s options and parses each value.
    ///
    /// A `connector` option must name `kind` itself.
    pub fn parse(kind: ConnectorKind, raw: &RawOptions) -> Result<Self> {
        let mut values = Vec::with_capacity(raw.len());
        for (name, text) in raw.iter() {
            let Some(spec) = lookup(kind, name) else {
                return Err(Error::UnknownOption {
                    connector: kind.name().to_string(),
                    option: name.to_string(),
                    suggestion: nearest(name, options_for(kind).map(|s| s.name))
                        .map(str::to_string),
                });
            };
            let value = spec.parse_checked(text)?;
            if spec.name == registry::common::CONNECTOR.name
                && value != Value::Text(kind.name().to_string())
            {
                return Err(spec.invalid(
                    text,
                    format!("the table is declared for connector '{}' (STORED AS {}); the two must agree", kind.name(), kind.stored_as()),
                ));
            }
            values.push(Parsed {
                spec,
                text: text.to_string(),
                value,
            });
        }
        Ok(ParsedOptions { kind, values })
    }

    /// The connector these options were parsed for.
    pub fn kind(&self) -> ConnectorKind {
        self.kind
    }

    fn find(&self, spec: &OptionSpec) -> Option<&Parsed> {
        self.values.iter().find(|p| p.spec.name == spec.name)
    }

    /// Whether the option was given.
    pub fn has(&self, spec: &OptionSpec) -> bool {
        self.find(spec).is_some()
    }

    /// The text the user wrote for the option.
    pub fn text_as_written(&self, spec: &OptionSpec) -> Option<&str> {
        self.find(spec).map(|p| p.text.as_str())
    }

    /// The typed value of the option.
    pub fn value(&self, spec: &OptionSpec) -> Option<&Value> {
        self.find(spec).map(|p| &p.value)
    }

    fn wrong_type(spec: &OptionSpec, wanted: &str) -> Error {
        Error::invalid(
            spec.name,
            "",
            format!("internal: the registry does not declare this option as {wanted}"),
        )
    }

    /// A duration option.
    pub fn duration(&self, spec: &OptionSpec) -> Result<Option<Duration>> {
        match self.value(spec) {
            None => Ok(None),
            Some(Value::Duration(d)) => Ok(Some(*d)),
            Some(_) => Err(Self::wrong_type(spec, "a duration")),
        }
    }

    /// An integer option.
    pub fn int(&self, spec: &OptionSpec) -> Result<Option<i64>> {
        match self.value(spec) {
            None => Ok(None),
            Some(Value::Int(v)) => Ok(Some(*v)),
            Some(_) => Err(Self::wrong_type(spec, "an integer")),
        }
    }

    /// An integer option held in 32 bits (the seeds' `int` parameters).
    pub fn int32(&self, spec: &OptionSpec) -> Result<Option<i32>> {
        match self.int(spec)? {
            None => Ok(None),
            Some(v) => i32::try_from(v).map(Some).map_err(|_| {
                spec.invalid(
                    v.to_string(),
                    format!(
                        "out of range: at most {}",
                        spec::group_digits(i32::MAX.into())
                    ),
                )
            }),
        }
    }

    /// A number option.
    pub fn float(&self, spec: &OptionSpec) -> Result<Option<f64>> {
        match self.value(spec) {
            None => Ok(None),
            Some(Value::Float(v)) => Ok(Some(*v)),
            Some(_) => Err(Self::wrong_type(spec, "a number")),
        }
    }

    /// A boolean option.
    pub fn bool(&self, spec: &OptionSpec) -> Result<Option<bool>> {
        match self.value(spec) {
            None => Ok(None),
            Some(Value::Bool(v)) => Ok(Some(*v)),
            Some(_) => Err(Self::wrong_type(spec, "a boolean")),
        }
    }

    /// A text, column or enum option (enum words come back in their registry spelling).
    pub fn text(&self, spec: &OptionSpec) -> Result<Option<&str>> {
        match self.value(spec) {
            None => Ok(None),
            Some(Value::Text(t)) => Ok(Some(t.as_str())),
            Some(_) => Err(Self::wrong_type(spec, "text")),
        }
    }

    /// A text option where an empty value means "not given".
    pub fn non_empty_text(&self, spec: &OptionSpec) -> Result<Option<&str>> {
        Ok(self.text(spec)?.filter(|t| !t.is_empty()))
    }

    /// A column-list option.
    pub fn list(&self, spec: &OptionSpec) -> Result<Option<&[String]>> {
        match self.value(spec) {
            None => Ok(None),
            Some(Value::List(v)) => Ok(Some(v.as_slice())),
            Some(_) => Err(Self::wrong_type(spec, "a column list")),
        }
    }

    /// A headers option.
    pub fn headers(&self, spec: &OptionSpec) -> Result<Option<&[(String, String)]>> {
        match self.value(spec) {
            None => Ok(None),
            Some(Value::Headers(v)) => Ok(Some(v.as_slice())),
            Some(_) => Err(Self::wrong_type(spec, "headers")),
        }
    }

    /// The `failure_policy` option, `fail` when absent.
    pub fn failure_policy(&self) -> Result<FailurePolicy> {
        match self.text(&registry::common::FAILURE_POLICY)? {
            None | Some("fail") => Ok(FailurePolicy::Fail),
            Some("drop") => Ok(FailurePolicy::Drop),
            Some(other) => {
                Err(registry::common::FAILURE_POLICY.invalid(other, "expected 'fail' or 'drop'"))
            }
        }
    }

    /// The `format` option, `json` when absent.
    pub fn payload_format(&self) -> Result<PayloadFormat> {
        match self.text(&registry::common::FORMAT)? {
            None | Some("json") => Ok(PayloadFormat::Json),
            Some("raw") => Ok(PayloadFormat::Raw),
            Some(other) => Err(registry::common::FORMAT.invalid(other, "expected 'json' or 'raw'")),
        }
    }

    /// A column option with a default name: the given name (explicit) or the default.
    pub fn column_ref(&self, spec: &OptionSpec, default: &str) -> Result<ColumnRef> {
        Ok(match self.text(spec)? {
            Some(name) => ColumnRef::explicit(name),
            None => ColumnRef::by_default(default),
        })
    }
}

/// How a row becomes a payload when no column carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PayloadFormat {
    /// The row as a JSON object, one key per column (the default).
    #[default]
    Json,
    /// The bytes of a single binary or string column, as they are.
    Raw,
}

impl PayloadFormat {
    /// The option word (`json`, `raw`).
    pub fn name(self) -> &'static str {
        match self {
            PayloadFormat::Json => "json",
            PayloadFormat::Raw => "raw",
        }
    }
}

/// A column named by an option, and whether the user named it.
///
/// An explicit column must exist in the table; a column known only by its default name (like
/// Pub/Sub's `data`) is used when the table has it and ignored otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnRef {
    /// The column name.
    pub name: String,
    /// Whether the name came from an option rather than a default.
    pub explicit: bool,
}

impl ColumnRef {
    /// A column the user named.
    pub fn explicit(name: impl Into<String>) -> Self {
        ColumnRef {
            name: name.into(),
            explicit: true,
        }
    }

    /// A column known by its default name.
    pub fn by_default(name: impl Into<String>) -> Self {
        ColumnRef {
            name: name.into(),
            explicit: false,
        }
    }
}

/// Checks that a fixed destination given both as `LOCATION` and as an option is the same one.
pub(crate) fn merge_location(
    spec: &OptionSpec,
    from_location: Option<(String, &str)>,
    from_option: Option<(String, &str)>,
) -> Result<Option<String>> {
    match (from_location, from_option) {
        (Some((loc, loc_text)), Some((opt, opt_text))) if loc != opt => Err(spec.invalid(
            opt_text,
            format!("conflicts with LOCATION '{loc_text}': give the {} in one place, or the same one in both", spec.name),
        )),
        (Some((loc, _)), _) => Ok(Some(loc)),
        (None, opt) => Ok(opt.map(|(o, _)| o)),
    }
}

/// `LOCATION` as given: `None` when absent or empty.
pub(crate) fn location_text(location: Option<&str>) -> Option<&str> {
    location.map(str::trim).filter(|l| !l.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_format_prefix_and_lower_cases() {
        let raw = RawOptions::from_pairs([("Format.Topic".to_string(), "t".to_string())]).unwrap();
        assert_eq!(raw.get("topic"), Some("t"));
    }

    #[test]
    fn rejects_prefixed_and_plain_duplicate() {
        let err = RawOptions::from_pairs([
            ("topic".to_string(), "a".to_string()),
            ("format.topic".to_string(), "b".to_string()),
        ])
        .unwrap_err();
        assert!(
            matches!(err, Error::DuplicateOption { ref option } if option == "topic"),
            "{err}"
        );
    }

    #[test]
    fn no_two_specs_share_a_name_for_one_connector() {
        for kind in ConnectorKind::ALL {
            let names: Vec<&str> = options_for(kind).map(|s| s.name).collect();
            for (i, n) in names.iter().enumerate() {
                assert!(
                    !names[i + 1..].contains(n),
                    "{n} is registered twice for {kind}"
                );
            }
        }
    }

    #[test]
    fn every_example_passes_its_own_checks() {
        for spec in registry::REGISTRY {
            assert!(
                spec.parse_checked(spec.example).is_ok(),
                "example of {} is invalid",
                spec.name
            );
        }
    }

    #[test]
    fn every_typed_default_passes_its_own_checks() {
        fn check(spec: &OptionSpec, d: &DefaultValue) {
            match d {
                DefaultValue::Int(v) | DefaultValue::Bytes(v) => {
                    assert!(spec.check_int(*v).is_ok(), "{}", spec.name)
                }
                DefaultValue::Float(v) => assert!(spec.check_float(*v).is_ok(), "{}", spec.name),
                DefaultValue::Duration(v) => {
                    assert!(spec.check_duration(*v).is_ok(), "{}", spec.name)
                }
                DefaultValue::Text(t) => assert!(spec.parse_checked(t).is_ok(), "{}", spec.name),
                DefaultValue::JavaSdk(inner) => check(spec, inner),
                DefaultValue::None | DefaultValue::Unset(_) | DefaultValue::Bool(_) => {}
            }
        }
        for spec in registry::REGISTRY {
            check(spec, &spec.default);
        }
    }

    #[test]
    fn suggests_nearest_name_for_a_misspelling() {
        let raw =
            RawOptions::from_pairs([("retry_total_timout".to_string(), "1s".to_string())]).unwrap();
        let err = validate_names(ConnectorKind::PubSub, &raw).unwrap_err();
        assert!(
            matches!(err, Error::UnknownOption { ref suggestion, .. } if suggestion.as_deref() == Some("retry_total_timeout")),
            "{err}"
        );
    }

    #[test]
    fn suggests_the_same_knob_of_this_connector() {
        let raw = RawOptions::from_pairs([("max_active_publishers".to_string(), "3".to_string())])
            .unwrap();
        let err = validate_names(ConnectorKind::Bigtable, &raw).unwrap_err();
        assert!(
            err.to_string()
                .contains("did you mean 'max_active_instances'"),
            "{err}"
        );
    }

    #[test]
    fn gives_no_suggestion_for_a_far_name() {
        let raw = RawOptions::from_pairs([("zzzzzz".to_string(), "1".to_string())]).unwrap();
        let err = validate_names(ConnectorKind::Bigtable, &raw).unwrap_err();
        assert!(
            matches!(
                err,
                Error::UnknownOption {
                    suggestion: None,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn connector_names_round_trip() {
        for kind in ConnectorKind::ALL {
            assert_eq!(ConnectorKind::parse(kind.name()).unwrap(), kind);
            assert_eq!(ConnectorKind::parse(kind.stored_as()).unwrap(), kind);
        }
        let err = ConnectorKind::parse("pubsb").unwrap_err().to_string();
        assert!(err.contains("did you mean 'pubsub'"), "{err}");
    }

    #[test]
    fn rejects_connector_option_that_disagrees_with_the_table() {
        let raw =
            RawOptions::from_pairs([("connector".to_string(), "bigtable".to_string())]).unwrap();
        let err = validate_names(ConnectorKind::PubSub, &raw).unwrap_err();
        assert!(
            matches!(err, Error::InvalidOption { ref option, .. } if option == "connector"),
            "{err}"
        );
    }
}
