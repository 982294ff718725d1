//! What an option is: its name, type, default, bounds and meaning, and the checks those imply.
//!
//! An [`OptionSpec`] is data, and the same data serves three readers: the SQL parser (which
//! turns the text a user wrote into a typed [`Value`]), the typed builders (whose `build()`
//! checks each value against the spec's [`Bound`]) and the generated reference in
//! `docs/options.md`. The bound text a user reads in the docs is the rule text an error shows.

use std::fmt::Write as _;
use std::time::Duration;

use crate::error::{Error, Result};

/// Which part of a sink an option configures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OptionGroup {
    /// Where and how to connect: project, endpoint, emulator, credentials.
    Connection,
    /// How rows become records and where each record goes.
    Mapping,
    /// How the writer batches, bounds, retries and releases (the typed builder's options).
    Writer,
    /// How a source reads: flow control, streams, leases, when it stops.
    Reader,
}

impl OptionGroup {
    /// The group's name as the reference shows it (`"connection"`, `"mapping"`, `"writer"`,
    /// `"reader"`).
    pub fn name(self) -> &'static str {
        match self {
            OptionGroup::Connection => "connection",
            OptionGroup::Mapping => "mapping",
            OptionGroup::Writer => "writer",
            OptionGroup::Reader => "reader",
        }
    }
}

/// The value type of an option, which decides how its text is parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionKind {
    /// A duration with a unit: `'500ms'`, `'10s'`, `'1m'`, `'250us'`, `'0s'`.
    Duration,
    /// A decimal integer (`-1` where the bound allows "unbounded").
    Int,
    /// A decimal number.
    Float,
    /// `true` or `false`.
    Bool,
    /// Free text (a resource name, an e-mail address, a URL, ...).
    Text,
    /// One of a fixed set of words, matched case-insensitively.
    Enum(&'static [&'static str]),
    /// The name of one column of the table.
    Column,
    /// One column name or several separated by commas.
    ColumnList,
    /// HTTP headers, `'Name: value; Other-Name: value'`.
    Headers,
}

impl OptionKind {
    /// The type as the reference shows it.
    pub fn type_text(self) -> String {
        match self {
            OptionKind::Duration => "duration".into(),
            OptionKind::Int => "integer".into(),
            OptionKind::Float => "number".into(),
            OptionKind::Bool => "boolean".into(),
            OptionKind::Text => "string".into(),
            OptionKind::Enum(words) => {
                let quoted: Vec<String> = words.iter().map(|w| format!("`{w}`")).collect();
                format!("one of {}", quoted.join(", "))
            }
            OptionKind::Column => "column".into(),
            OptionKind::ColumnList => "column list".into(),
            OptionKind::Headers => "header list".into(),
        }
    }
}

/// The largest duration a "positive and at most `Duration.ofNanos(Long.MAX_VALUE)`" option accepts:
/// `i64::MAX` nanoseconds, about 292 years — what a signed 64-bit nanosecond clock can express.
pub const MAX_NANOS_DURATION: Duration = Duration::from_nanos(i64::MAX as u64);

/// The value-level rule of an option. Cross-option rules live in [`OptionSpec::cross_rule`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bound {
    /// No rule beyond the type.
    None,
    /// An integer of at least 1.
    Positive,
    /// An integer of at least 0.
    NonNegative,
    /// An integer of at least 1, or `-1` for "unbounded".
    PositiveOrUnbounded,
    /// An integer in `min..=max`.
    IntRange {
        /// Smallest accepted value.
        min: i64,
        /// Largest accepted value.
        max: i64,
    },
    /// A finite number of at least 1.0.
    AtLeastOne,
    /// A finite number greater than zero.
    PositiveNumber,
    /// A duration of exactly zero or at least 1 ms. A positive sub-millisecond value is refused
    /// because the SDK reads these settings in whole milliseconds and would turn it into zero.
    ZeroOrAtLeastMillis,
    /// A duration of at least 1 ms.
    AtLeastMillis,
    /// A duration greater than zero.
    PositiveDuration,
    /// A positive duration of at most [`MAX_NANOS_DURATION`].
    PositiveNanos,
    /// A duration in `min..=max`.
    DurationRange {
        /// Shortest accepted duration.
        min: Duration,
        /// Longest accepted duration.
        max: Duration,
    },
    /// Text that must not be empty.
    NotEmpty,
}

impl Bound {
    /// The rule as a sentence fragment, shown in the reference and in errors.
    pub fn rule_text(self) -> String {
        match self {
            Bound::None => "any value of the type".into(),
            Bound::Positive => "positive (at least 1)".into(),
            Bound::NonNegative => "zero or more".into(),
            Bound::PositiveOrUnbounded => "positive, or -1 for unbounded".into(),
            Bound::IntRange { min, max } => format!("between {} and {} inclusive", group_digits(min), group_digits(max)),
            Bound::AtLeastOne => "a finite number of at least 1.0".into(),
            Bound::PositiveNumber => "a finite number greater than 0".into(),
            Bound::ZeroOrAtLeastMillis => {
                "exactly 0s or at least 1ms (a positive sub-millisecond value would be truncated to zero)".into()
            }
            Bound::AtLeastMillis => "at least 1ms".into(),
            Bound::PositiveDuration => "greater than 0s".into(),
            Bound::PositiveNanos => {
                format!("positive and at most {}ns (about 292 years)", group_digits(i64::MAX))
            }
            Bound::DurationRange { min, max } => {
                format!("between {} and {} inclusive", format_duration(min), format_duration(max))
            }
            Bound::NotEmpty => "not empty".into(),
        }
    }
}

/// An option's default, typed so that its display text comes from the same constant the
/// builder uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DefaultValue {
    /// No default: the option is absent unless given.
    None,
    /// No value is set; the text says what happens then.
    Unset(&'static str),
    /// An integer.
    Int(i64),
    /// A byte count, shown with its binary-unit form.
    Bytes(i64),
    /// A number.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// A duration.
    Duration(Duration),
    /// A word or text.
    Text(&'static str),
    /// A default taken over from the Java client library's publisher settings.
    JavaSdk(&'static DefaultValue),
}

impl DefaultValue {
    /// The default as the reference shows it.
    pub fn text(&self) -> String {
        match self {
            DefaultValue::None => "none".into(),
            DefaultValue::Unset(why) => format!("unset ({why})"),
            DefaultValue::Int(v) => group_digits(*v),
            DefaultValue::Bytes(v) => format!("{} ({})", group_digits(*v), binary_size(*v)),
            DefaultValue::Float(v) => format!("{v:?}"),
            DefaultValue::Bool(v) => v.to_string(),
            DefaultValue::Duration(d) => format_duration(*d),
            DefaultValue::Text(t) => format!("`{t}`"),
            DefaultValue::JavaSdk(inner) => format!("{} (Java SDK default)", inner.text()),
        }
    }
}

/// One option: everything the parser, the builders and the reference know about it.
#[derive(Debug)]
pub struct OptionSpec {
    /// The option name (snake_case; the typed builder method's name for writer options).
    pub name: &'static str,
    /// The part of the sink it configures.
    pub group: OptionGroup,
    /// Its value type.
    pub kind: OptionKind,
    /// Its default.
    pub default: DefaultValue,
    /// Its value-level rule.
    pub bound: Bound,
    /// A rule that involves other options, as shown in the reference and in errors; empty when
    /// there is none.
    pub cross_rule: &'static str,
    /// A valid value, shown in the reference (and used by the tests to exercise every option).
    pub example: &'static str,
    /// What it does.
    pub description: &'static str,
    /// How a value given for it is shown back (a table's declaration, `\\d`): as it is, or
    /// with the part that may carry a secret hidden.
    pub redact: Redact,
}

/// How an option's value is shown back to the user (its declaration, `SHOW`-like listings),
/// for an option whose value may carry a secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redact {
    /// Shown as it is.
    None,
    /// A URL: only its origin (scheme, host and port) is shown, since the rest may carry a
    /// user name, a password or an API key in its query; a value without a host is shown by its
    /// length only.
    UrlOrigin,
    /// Headers (`Name: value; ...`): only the header names are shown, since a value may be a
    /// token; a value that does not parse is shown by its length only.
    HeaderNames,
}

impl Redact {
    /// `value` as it may be shown back.
    ///
    /// ```
    /// use gcp_sql::options::Redact;
    ///
    /// assert_eq!(Redact::None.shown("5s"), "5s");
    /// assert_eq!(
    ///     Redact::UrlOrigin.shown("https://u:p@w.example.com/run?key=S"),
    ///     "https://w.example.com/... (rest hidden)"
    /// );
    /// assert_eq!(
    ///     Redact::HeaderNames.shown("Authorization: Bearer S; X-Source: demo"),
    ///     "Authorization, X-Source (values hidden)"
    /// );
    /// ```
    pub fn shown(self, value: &str) -> String {
        let hidden = || format!("<{} characters hidden>", value.chars().count());
        match self {
            Redact::None => value.to_string(),
            Redact::UrlOrigin => match crate::encode::redact::url_origin(value) {
                Some(origin) if value.trim().trim_end_matches('/') == origin => origin,
                Some(origin) => format!("{origin}/... (rest hidden)"),
                None => hidden(),
            },
            Redact::HeaderNames => match parse_headers(value) {
                Ok(headers) => {
                    let names: Vec<&str> = headers.iter().map(|(n, _)| n.as_str()).collect();
                    format!("{} (values hidden)", names.join(", "))
                }
                Err(_) => hidden(),
            },
        }
    }
}

/// A parsed option value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A [`OptionKind::Duration`].
    Duration(Duration),
    /// An [`OptionKind::Int`].
    Int(i64),
    /// An [`OptionKind::Float`].
    Float(f64),
    /// An [`OptionKind::Bool`].
    Bool(bool),
    /// Text, a column or an [`OptionKind::Enum`] word (enum words are lower-cased, except
    /// upper-case enums such as HTTP methods, which are upper-cased).
    Text(String),
    /// A column list.
    List(Vec<String>),
    /// Headers as ordered `(name, value)` pairs.
    Headers(Vec<(String, String)>),
}

impl OptionSpec {
    /// The bounds column of the reference: the value rule and the cross-option rule.
    pub fn bounds_text(&self) -> String {
        let base = match self.bound {
            Bound::None => String::new(),
            b => b.rule_text(),
        };
        match (base.is_empty(), self.cross_rule.is_empty()) {
            (true, true) => "—".into(),
            (false, true) => base,
            (true, false) => self.cross_rule.into(),
            (false, false) => format!("{base}; {}", self.cross_rule),
        }
    }

    /// Parses the text a user wrote into a typed value (syntax only; see [`OptionSpec::check`]).
    pub fn parse(&self, text: &str) -> Result<Value> {
        let t = text.trim();
        match self.kind {
            OptionKind::Duration => parse_duration(t)
                .map(Value::Duration)
                .map_err(|rule| self.invalid(text, rule)),
            OptionKind::Int => t
                .parse::<i64>()
                .map(Value::Int)
                .map_err(|_| self.invalid(text, "expected a decimal integer")),
            OptionKind::Float => match t.parse::<f64>() {
                Ok(v) if v.is_finite() => Ok(Value::Float(v)),
                _ => Err(self.invalid(text, "expected a finite decimal number")),
            },
            OptionKind::Bool => match t.to_ascii_lowercase().as_str() {
                "true" => Ok(Value::Bool(true)),
                "false" => Ok(Value::Bool(false)),
                _ => Err(self.invalid(text, "expected 'true' or 'false'")),
            },
            OptionKind::Text => Ok(Value::Text(t.to_string())),
            OptionKind::Enum(words) => words
                .iter()
                .find(|w| w.eq_ignore_ascii_case(t))
                .map(|w| Value::Text((*w).to_string()))
                .ok_or_else(|| {
                    self.invalid(
                        text,
                        format!("expected {}", self.kind.type_text().replace('`', "'")),
                    )
                }),
            OptionKind::Column => {
                if t.is_empty() {
                    Err(self.invalid(text, "expected a column name"))
                } else {
                    Ok(Value::Text(t.to_string()))
                }
            }
            OptionKind::ColumnList => parse_column_list(t)
                .map(Value::List)
                .map_err(|rule| self.invalid(text, rule)),
            OptionKind::Headers => parse_headers(t)
                .map(Value::Headers)
                .map_err(|rule| self.invalid(text, rule)),
        }
    }

    /// Parses and checks the value-level rule.
    pub fn parse_checked(&self, text: &str) -> Result<Value> {
        let v = self.parse(text)?;
        self.check(&v)?;
        Ok(v)
    }

    /// Checks a typed value against the value-level rule.
    pub fn check(&self, value: &Value) -> Result<()> {
        match value {
            Value::Int(v) => self.check_int(*v),
            Value::Float(v) => self.check_float(*v),
            Value::Duration(d) => self.check_duration(*d),
            Value::Text(t) if self.bound == Bound::NotEmpty && t.is_empty() => {
                Err(self.invalid(t, self.bound.rule_text()))
            }
            _ => Ok(()),
        }
    }

    /// Checks an integer against the value-level rule; the error names the option and the rule.
    pub fn check_int(&self, v: i64) -> Result<()> {
        let ok = match self.bound {
            Bound::Positive => v >= 1,
            Bound::NonNegative => v >= 0,
            Bound::PositiveOrUnbounded => v >= 1 || v == -1,
            Bound::IntRange { min, max } => (min..=max).contains(&v),
            _ => true,
        };
        if ok {
            Ok(())
        } else {
            Err(self.invalid(v.to_string(), self.bound.rule_text()))
        }
    }

    /// Checks a number against the value-level rule.
    pub fn check_float(&self, v: f64) -> Result<()> {
        let ok = match self.bound {
            Bound::AtLeastOne => v.is_finite() && v >= 1.0,
            Bound::PositiveNumber => v.is_finite() && v > 0.0,
            _ => v.is_finite(),
        };
        if ok {
            Ok(())
        } else {
            Err(self.invalid(format!("{v:?}"), self.bound.rule_text()))
        }
    }

    /// Checks a duration against the value-level rule.
    pub fn check_duration(&self, d: Duration) -> Result<()> {
        const MS: Duration = Duration::from_millis(1);
        let ok = match self.bound {
            Bound::ZeroOrAtLeastMillis => d.is_zero() || d >= MS,
            Bound::AtLeastMillis => d >= MS,
            Bound::PositiveDuration => !d.is_zero(),
            Bound::PositiveNanos => !d.is_zero() && d <= MAX_NANOS_DURATION,
            Bound::DurationRange { min, max } => d >= min && d <= max,
            _ => true,
        };
        if ok {
            Ok(())
        } else {
            Err(self.invalid(format_duration(d), self.bound.rule_text()))
        }
    }

    /// An [`Error::InvalidOption`] naming this option.
    pub fn invalid(&self, value: impl Into<String>, rule: impl Into<String>) -> Error {
        Error::invalid(self.name, value, rule)
    }

    /// An [`Error::InvalidOption`] naming this option and its cross-option rule.
    pub fn cross_invalid(&self, value: impl Into<String>) -> Error {
        Error::invalid(self.name, value, self.cross_rule)
    }
}

/// Parses a duration with a unit (`'500ms'`, `'10s'`, `'1m 30s'`, `'250us'`, `'0s'`); a bare
/// `'0'` is zero. A bare non-zero number is refused: its unit would be a guess.
pub fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("expected a duration with a unit, like '500ms' or '10s'".into());
    }
    if t.chars().all(|c| c.is_ascii_digit() || c == '.') && t.chars().any(|c| c != '0' && c != '.')
    {
        return Err(format!("a duration needs a unit, like '{t}ms' or '{t}s'"));
    }
    humantime::parse_duration(t)
        .map_err(|e| format!("expected a duration with a unit, like '500ms' or '10s' ({e})"))
}

/// Formats a duration the way [`parse_duration`] reads it back (`500ms`, `10s`, `10m`).
pub fn format_duration(d: Duration) -> String {
    if d.is_zero() {
        "0s".into()
    } else {
        humantime::format_duration(d).to_string()
    }
}

/// Splits a comma-separated column list, trimming each name. Empty names and repeated names
/// are refused.
pub fn parse_column_list(text: &str) -> std::result::Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for part in text.split(',') {
        let name = part.trim();
        if name.is_empty() {
            return Err(
                "expected one column name or several separated by commas, with no empty entry"
                    .into(),
            );
        }
        if out.iter().any(|n| n == name) {
            return Err(format!("column '{name}' is listed twice"));
        }
        out.push(name.to_string());
    }
    Ok(out)
}

/// Whether `c` may appear in an HTTP header name (an RFC 9110 `tchar`).
fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}

/// Whether `segment` starts a new header: optional spaces, a token, optional spaces, a colon.
fn starts_header(segment: &str) -> bool {
    match segment.split_once(':') {
        Some((name, _)) => {
            let name = name.trim();
            !name.is_empty() && name.chars().all(is_token_char)
        }
        None => false,
    }
}

/// Parses headers written as `'Name: value; Other-Name: value'`.
///
/// A `;` followed by `Name:` starts the next header; any other `;` belongs to the value, so
/// `'Content-Type: text/plain; charset=utf-8'` is one header. Names are matched
/// case-insensitively for duplicates, and keep the case they were written in.
pub fn parse_headers(text: &str) -> std::result::Result<Vec<(String, String)>, String> {
    let mut out: Vec<(String, String)> = Vec::new();
    if text.trim().is_empty() {
        return Ok(out);
    }
    for segment in text.split(';') {
        if starts_header(segment) {
            let (name, value) = segment.split_once(':').unwrap_or((segment, ""));
            let name = name.trim();
            if out.iter().any(|(n, _)| n.eq_ignore_ascii_case(name)) {
                return Err(format!("header '{name}' is given twice"));
            }
            out.push((name.to_string(), value.trim().to_string()));
        } else {
            match out.last_mut() {
                Some((_, value)) => {
                    value.push(';');
                    value.push_str(segment.trim_end());
                }
                None => {
                    return Err(format!(
                        "expected 'Name: value' entries separated by ';', found '{}'",
                        segment.trim()
                    ));
                }
            }
        }
    }
    Ok(out)
}

/// `1234567` -> `1,234,567`.
pub fn group_digits(v: i64) -> String {
    let digits = v.unsigned_abs().to_string();
    let mut out = String::new();
    if v < 0 {
        out.push('-');
    }
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `67108864` -> `64 MiB`; a count that is no whole binary unit stays in bytes.
pub fn binary_size(v: i64) -> String {
    const UNITS: [(&str, i64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in UNITS {
        if v >= size && v % size == 0 {
            return format!("{} {unit}", v / size);
        }
    }
    let mut s = String::new();
    let _ = write!(s, "{v} B");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_without_a_host_is_shown_by_its_length_only() {
        assert_eq!(
            Redact::UrlOrigin.shown("not a url?key=x"),
            "<15 characters hidden>"
        );
        assert_eq!(
            Redact::UrlOrigin.shown("https://worker.example.com/"),
            "https://worker.example.com"
        );
    }

    #[test]
    fn unparsable_headers_are_shown_by_their_length_only() {
        assert_eq!(
            Redact::HeaderNames.shown("no colon"),
            "<8 characters hidden>"
        );
        assert_eq!(Redact::None.shown("no colon"), "no colon");
    }

    #[test]
    fn parses_durations_with_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
    }

    #[test]
    fn rejects_duration_without_unit() {
        let err = parse_duration("500").unwrap_err();
        assert!(err.contains("needs a unit"), "{err}");
        assert!(parse_duration("").is_err());
        assert!(parse_duration("ten seconds").is_err());
    }

    #[test]
    fn headers_keep_semicolons_inside_values() {
        let h = parse_headers("Content-Type: text/plain; charset=utf-8; X-A: b").unwrap();
        assert_eq!(
            h,
            vec![
                ("Content-Type".into(), "text/plain; charset=utf-8".into()),
                ("X-A".into(), "b".into())
            ]
        );
    }

    #[test]
    fn rejects_duplicate_and_malformed_headers() {
        assert!(
            parse_headers("X-A: 1; x-a: 2")
                .unwrap_err()
                .contains("twice")
        );
        assert!(parse_headers("no colon here").is_err());
    }

    #[test]
    fn rejects_empty_and_repeated_columns() {
        assert!(parse_column_list("a,,b").is_err());
        assert!(parse_column_list("a, b, a").unwrap_err().contains("twice"));
        assert_eq!(
            parse_column_list(" a , b ").unwrap(),
            vec!["a".to_string(), "b".to_string()]
        );
    }

    #[test]
    fn formats_numbers_for_the_reference() {
        assert_eq!(group_digits(19_999), "19,999");
        assert_eq!(group_digits(-1), "-1");
        assert_eq!(binary_size(64 << 20), "64 MiB");
        assert_eq!(binary_size(1000), "1000 B");
    }
}
