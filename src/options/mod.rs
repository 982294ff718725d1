//! The generic option machinery: what an option is ([`OptionSpec`]), how the pairs of a
//! statement are collected ([`RawOptions`]), parsed and checked by type and bound
//! ([`ParsedOptions`]), how a misspelt name gets the nearest valid one, how typed options and
//! their builders are declared once per option ([`OptionField`] and the crate's
//! `writer_options!` macro), the connection options every connector shares, the options several
//! connector types share with one meaning ([`common`]) and the reference renderer ([`docs`]).
//!
//! Nothing here knows a connector: each connector lists the specs it accepts, and the crate's
//! connector list gathers them for name validation and for `docs/options.md`.
//!
//! ```
//! use gcp_sql::options::{Bound, DefaultValue, OptionGroup, OptionKind, OptionSpec, ParsedOptions, RawOptions, Redact};
//!
//! static BATCH_SIZE: OptionSpec = OptionSpec {
//!     name: "batch_size",
//!     group: OptionGroup::Writer,
//!     kind: OptionKind::Int,
//!     default: DefaultValue::Int(100),
//!     bound: Bound::Positive,
//!     cross_rule: "",
//!     example: "500",
//!     description: "Records gathered into one request.",
//!     redact: Redact::None,
//! };
//! static ACME: &[&OptionSpec] = &[&BATCH_SIZE];
//!
//! let raw = RawOptions::from_pairs([("format.BATCH_SIZE".to_string(), "500".to_string())])?;
//! assert_eq!(raw.get("batch_size"), Some("500"));
//! let parsed = ParsedOptions::parse("acme", ACME, &raw)?;
//! assert_eq!(parsed.int(&BATCH_SIZE)?, Some(500));
//!
//! let err = RawOptions::from_pairs([("batch_sise".to_string(), "5".to_string())])
//!     .and_then(|raw| ParsedOptions::parse("acme", ACME, &raw))
//!     .unwrap_err();
//! assert!(err.to_string().contains("did you mean 'batch_size'"));
//! # Ok::<(), gcp_sql::Error>(())
//! ```

pub mod common;
mod connection;
pub mod docs;
pub mod event_time;
pub mod expand;
pub mod names;
pub mod payload;
pub mod schema_types;
pub mod spec;
mod typed;

use std::time::Duration;

pub use connection::{
    ClientCore, ConnectionOptions, EmulatorHost, EmulatorSource, EnvLookup, Service,
    is_loopback_host,
};
pub use spec::{Bound, DefaultValue, OptionGroup, OptionKind, OptionSpec, Redact, Value};
pub(crate) use typed::writer_options;
pub use typed::{OptionField, default_of};

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

/// Whether two snake_case names of at least three words differ in exactly one word
/// (`max_active_publishers` / `max_active_instances`): the same knob of another connector.
fn differ_in_one_word(a: &str, b: &str) -> bool {
    let (wa, wb): (Vec<&str>, Vec<&str>) = (a.split('_').collect(), b.split('_').collect());
    wa.len() >= 3 && wa.len() == wb.len() && wa.iter().zip(&wb).filter(|(x, y)| x != y).count() == 1
}

/// The candidate closest to `name`, if it is close enough to be a likely misspelling, or else
/// the one candidate that differs from it in a single word.
pub fn nearest_name<'a>(
    name: &str,
    candidates: impl Iterator<Item = &'a str> + Clone,
) -> Option<&'a str> {
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

/// One parsed option: its spec, the text as written and the typed value.
#[derive(Debug, Clone)]
struct Parsed {
    spec: &'static OptionSpec,
    text: String,
    value: Value,
}

/// The options of one statement, checked by name against one connector's specs and parsed by
/// type.
///
/// Reading a value goes through its spec, so a connector cannot read an option under a name
/// it does not declare.
#[derive(Debug, Clone)]
pub struct ParsedOptions {
    values: Vec<Parsed>,
}

/// A [`ParsedOptions`] getter of an option whose value is `Copy`: `None` when the statement does
/// not give it, an internal error naming `$wanted` when its spec declares another type.
macro_rules! copy_getter {
    ($(#[$doc:meta])* $name:ident -> $ty:ty, $variant:ident, $wanted:literal) => {
        $(#[$doc])*
        pub fn $name(&self, spec: &OptionSpec) -> Result<Option<$ty>> {
            match self.value(spec) {
                None => Ok(None),
                Some(Value::$variant(v)) => Ok(Some(*v)),
                Some(_) => Err(Self::wrong_type(spec, $wanted)),
            }
        }
    };
}

impl ParsedOptions {
    /// Checks the names of `raw` against `specs` (the options of the connector called
    /// `connector`) and parses each value by its type, checking its value-level bound.
    ///
    /// An unknown name is an [`Error::UnknownOption`] with the nearest valid name. Cross-option
    /// rules (a destination is required, a maximum backoff at least the initial one, ...) are
    /// checked when the typed options are built.
    pub fn parse(
        connector: &str,
        specs: &'static [&'static OptionSpec],
        raw: &RawOptions,
    ) -> Result<Self> {
        let mut values = Vec::with_capacity(raw.len());
        for (name, text) in raw.iter() {
            let Some(spec) = specs.iter().copied().find(|s| s.name == name) else {
                return Err(Error::UnknownOption {
                    connector: connector.to_string(),
                    option: name.to_string(),
                    suggestion: nearest_name(name, specs.iter().map(|s| s.name))
                        .map(str::to_string),
                });
            };
            let value = spec.parse_checked(text)?;
            values.push(Parsed {
                spec,
                text: text.to_string(),
                value,
            });
        }
        Ok(ParsedOptions { values })
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
            format!("internal: the spec does not declare this option as {wanted}"),
        )
    }

    copy_getter!(
        /// A duration option.
        duration -> Duration, Duration, "a duration"
    );

    copy_getter!(
        /// An integer option.
        int -> i64, Int, "an integer"
    );

    /// An integer option held in 32 bits (the builders' `i32` parameters).
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

    copy_getter!(
        /// A number option.
        float -> f64, Float, "a number"
    );

    copy_getter!(
        /// A boolean option.
        bool -> bool, Bool, "a boolean"
    );

    /// A text, column or enum option (enum words come back in their spec's spelling).
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

    /// `sink_parallelism`, `flush_interval` and `flush_rows` (already checked against their
    /// bounds).
    pub fn run_options(&self) -> Result<common::RunOptions> {
        Ok(common::RunOptions {
            sink_parallelism: self
                .int(&common::SINK_PARALLELISM)?
                .map(|v| usize::try_from(v).unwrap_or(1)),
            flush_interval: self.duration(&common::FLUSH_INTERVAL)?,
            flush_rows: self
                .int(&common::FLUSH_ROWS)?
                .map(|v| u64::try_from(v).unwrap_or(1)),
        })
    }

    /// The `failure_policy` option, `fail` when absent.
    pub fn failure_policy(&self) -> Result<FailurePolicy> {
        match self.text(&common::FAILURE_POLICY)? {
            None | Some("fail") => Ok(FailurePolicy::Fail),
            Some("drop") => Ok(FailurePolicy::Drop),
            Some("dead_letter") => Ok(FailurePolicy::DeadLetter),
            Some(other) => {
                Err(common::FAILURE_POLICY
                    .invalid(other, "expected 'fail', 'drop' or 'dead_letter'"))
            }
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

/// A table's destination, given as `LOCATION` or as the `spec` option (or both, then they must
/// agree), each resolved to a full name by `resolve`; an error names where the bad value was.
pub(crate) fn destination(
    spec: &OptionSpec,
    location: Option<&str>,
    parsed: &ParsedOptions,
    resolve: impl Fn(&str) -> std::result::Result<String, String>,
) -> Result<Option<String>> {
    let from_location = match location_text(location) {
        Some(l) => Some((
            resolve(l).map_err(|rule| Error::invalid("LOCATION", l, rule))?,
            l,
        )),
        None => None,
    };
    let from_option = match parsed.non_empty_text(spec)? {
        Some(t) => Some((resolve(t).map_err(|rule| spec.invalid(t, rule))?, t)),
        None => None,
    };
    merge_location(spec, from_location, from_option)
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

    static BATCH_SIZE: OptionSpec = OptionSpec {
        name: "batch_size",
        group: OptionGroup::Writer,
        kind: OptionKind::Int,
        default: DefaultValue::Int(100),
        bound: Bound::Positive,
        cross_rule: "",
        example: "500",
        description: "Records per request.",
        redact: Redact::None,
    };
    static MAX_ACTIVE_WIDGETS: OptionSpec = OptionSpec {
        name: "max_active_widgets",
        group: OptionGroup::Writer,
        kind: OptionKind::Int,
        default: DefaultValue::Int(4),
        bound: Bound::Positive,
        cross_rule: "",
        example: "8",
        description: "Widgets open at once.",
        redact: Redact::None,
    };
    static ACME: &[&OptionSpec] = &[&BATCH_SIZE, &MAX_ACTIVE_WIDGETS];

    fn parse(pairs: &[(&str, &str)]) -> Result<ParsedOptions> {
        let raw =
            RawOptions::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))?;
        ParsedOptions::parse("acme", ACME, &raw)
    }

    #[test]
    fn parses_known_names_and_checks_their_bounds() {
        let p = parse(&[("batch_size", "7")]).unwrap();
        assert_eq!(p.int(&BATCH_SIZE).unwrap(), Some(7));
        assert!(p.has(&BATCH_SIZE) && !p.has(&MAX_ACTIVE_WIDGETS));
        assert_eq!(p.text_as_written(&BATCH_SIZE), Some("7"));
        let err = parse(&[("batch_size", "0")]).unwrap_err();
        assert!(
            matches!(err, Error::InvalidOption { ref option, .. } if option == "batch_size"),
            "{err}"
        );
    }

    #[test]
    fn unknown_names_carry_the_connector_and_the_nearest_name() {
        let err = parse(&[("batch_sise", "1")]).unwrap_err();
        assert!(
            matches!(err, Error::UnknownOption { ref connector, ref suggestion, .. }
                if connector == "acme" && suggestion.as_deref() == Some("batch_size")),
            "{err}"
        );
        // The same knob of another connector differs in one word.
        let err = parse(&[("max_active_gadgets", "1")]).unwrap_err();
        assert!(
            err.to_string()
                .contains("did you mean 'max_active_widgets'"),
            "{err}"
        );
        let err = parse(&[("zzzzzz", "1")]).unwrap_err();
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
}
