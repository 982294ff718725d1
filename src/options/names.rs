//! Name helpers every connector shares: the project id check, the splitting of a full name
//! (`projects/P/things/T`) into its values, and the error for a column option that names a
//! column the table does not have (with the nearest column of the table).
//!
//! Each connector resolves its own names (full names, and short ids resolved against options
//! such as `project`); the functions return the rule a value breaks as text, so that the caller
//! can name the option (or the column and row) it came from.
//!
//! ```
//! use gcp_sql::options::names::{check_project, split_full};
//!
//! assert_eq!(split_full("projects/demo/widgets/w1", &["projects", "widgets"]), Some(vec!["demo", "w1"]));
//! assert_eq!(split_full("projects/demo/widget/w1", &["projects", "widgets"]), None);
//! assert!(check_project("my project").is_err());
//! ```

use arrow::datatypes::Schema;

use crate::error::Error;

/// How many of the table's columns an unknown-column error lists when none is close.
const LISTED_COLUMNS: usize = 12;

/// The rule broken by a column option (`data_column`, `row_key`, `attribute_columns`, ...) that
/// names a column the table does not have: it names the option and the nearest column of the
/// table ([`nearest_name`](crate::options::nearest_name), the hint unknown option names get),
/// or, when none is close, lists the table's columns.
///
/// ```
/// use gcp_sql::options::names::unknown_column_rule;
///
/// let rule = unknown_column_rule("data_column", "payloda", ["id", "payload"]);
/// assert_eq!(
///     rule,
///     "no such column in the table (named by option 'data_column'); did you mean 'payload'?"
/// );
/// let far = unknown_column_rule("row_key", "zzz", ["id", "name"]);
/// assert!(far.ends_with("the table's columns are 'id', 'name'"), "{far}");
/// ```
pub fn unknown_column_rule<'a>(
    option: &str,
    column: &str,
    columns: impl IntoIterator<Item = &'a str>,
) -> String {
    let columns: Vec<&str> = columns.into_iter().collect();
    let head = format!("no such column in the table (named by option '{option}')");
    // DataFusion folds unquoted column names to lower case; compare as the user may have meant.
    let exact_but_case = columns
        .iter()
        .find(|c| c.eq_ignore_ascii_case(column))
        .copied();
    let near = exact_but_case.or_else(|| {
        crate::options::nearest_name(column, columns.iter().copied()).or_else(|| {
            crate::options::nearest_name(&column.to_lowercase(), columns.iter().copied())
        })
    });
    match near {
        Some(near) => format!("{head}; did you mean '{near}'?"),
        None if columns.is_empty() => head,
        None => {
            let mut listed: Vec<String> = columns
                .iter()
                .take(LISTED_COLUMNS)
                .map(|c| format!("'{c}'"))
                .collect();
            if columns.len() > LISTED_COLUMNS {
                listed.push(format!("and {} more", columns.len() - LISTED_COLUMNS));
            }
            format!("{head}; the table's columns are {}", listed.join(", "))
        }
    }
}

/// An [`Error::Schema`] on `column`, named by `option` but not in `schema`, with the rule of
/// [`unknown_column_rule`].
pub fn unknown_column(schema: &Schema, column: &str, option: &str) -> Error {
    Error::schema(
        column,
        unknown_column_rule(
            option,
            column,
            schema.fields().iter().map(|f| f.name().as_str()),
        ),
    )
}

/// A rule a name breaks.
pub type NameResult<T> = std::result::Result<T, String>;

/// Checks a project id: not empty, no `/` or whitespace. (The service's stricter rule — 6 to 30
/// lower-case characters — is not enforced, because emulators accept any project.)
pub fn check_project(p: &str) -> NameResult<()> {
    if p.is_empty() || p.contains('/') || p.chars().any(char::is_whitespace) {
        return Err("a project id must be non-empty, without '/' or spaces".into());
    }
    Ok(())
}

/// Checks an id of 1 to `max` letters, digits, hyphens or underscores; the message calls it
/// `what` with its article (`an instance`).
pub fn check_word_id(id: &str, what: &str, max: usize) -> NameResult<()> {
    if id.is_empty()
        || id.len() > max
        || !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(format!(
            "{what} id has 1 to {max} letters, digits, hyphens or underscores"
        ));
    }
    Ok(())
}

/// Splits `projects/A/b/B/...` into its values, checking the collection words: `None` when the
/// name has another shape or an empty value.
pub fn split_full<'a>(name: &'a str, words: &[&str]) -> Option<Vec<&'a str>> {
    let parts: Vec<&str> = name.split('/').collect();
    if parts.len() != words.len() * 2 {
        return None;
    }
    let mut values = Vec::with_capacity(words.len());
    for (i, w) in words.iter().enumerate() {
        if parts[2 * i] != *w || parts[2 * i + 1].is_empty() {
            return None;
        }
        values.push(parts[2 * i + 1]);
    }
    Some(values)
}

/// One level of a resource name: its collection word (`topics`), the placeholder messages
/// show for its id (`TOPIC`) and the check of the id.
#[derive(Debug, Clone, Copy)]
pub struct NameLevel {
    /// The collection word before the id.
    pub collection: &'static str,
    /// The id's placeholder in messages.
    pub placeholder: &'static str,
    /// The rule of the id.
    pub check: fn(&str) -> NameResult<()>,
}

impl NameLevel {
    /// The level `collection/PLACEHOLDER`, its ids checked by `check`.
    pub const fn new(
        collection: &'static str,
        placeholder: &'static str,
        check: fn(&str) -> NameResult<()>,
    ) -> Self {
        NameLevel {
            collection,
            placeholder,
            check,
        }
    }
}

/// The `projects/PROJECT` level every resource name starts with.
pub const PROJECTS: NameLevel = NameLevel::new("projects", "PROJECT", check_project);

/// Resolves `value` (trimmed): a full name of `levels` (`projects/P/topics/T`), each id checked
/// by its level, or a short id of the last level (a `what` id), checked, that `short` places
/// in its parent; `short`'s error says what a short id needs.
pub fn full_or_short_name(
    value: &str,
    levels: &[NameLevel],
    what: &str,
    short: impl FnOnce(&str) -> NameResult<String>,
) -> NameResult<String> {
    let v = value.trim();
    if v.contains('/') {
        let words: Vec<&str> = levels.iter().map(|l| l.collection).collect();
        let parts = split_full(v, &words).ok_or_else(|| {
            let shape: Vec<String> = levels
                .iter()
                .map(|l| format!("{}/{}", l.collection, l.placeholder))
                .collect();
            format!("expected '{}' or a short {what} id", shape.join("/"))
        })?;
        for (level, id) in levels.iter().zip(parts) {
            (level.check)(id)?;
        }
        return Ok(v.to_string());
    }
    if let Some(last) = levels.last() {
        (last.check)(v)?;
    }
    short(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_full_names_by_their_collection_words() {
        assert_eq!(
            split_full("projects/p/things/t", &["projects", "things"]),
            Some(vec!["p", "t"])
        );
        assert_eq!(
            split_full("projects//things/t", &["projects", "things"]),
            None
        );
        assert_eq!(
            split_full("projects/p/things/", &["projects", "things"]),
            None
        );
        assert_eq!(
            split_full("projects/p/thing/t", &["projects", "things"]),
            None
        );
        assert!(check_project("p").is_ok());
        assert!(check_project("a/b").is_err());
    }

    #[test]
    fn an_unknown_column_gets_the_nearest_column_of_the_table() {
        let columns = ["user_id", "url", "region"];
        let rule = unknown_column_rule("ordering_key_column", "usr_id", columns);
        assert!(
            rule.starts_with("no such column in the table (named by option 'ordering_key_column')"),
            "{rule}"
        );
        assert!(rule.ends_with("did you mean 'user_id'?"), "{rule}");
        // A column that differs in case only (DataFusion folds unquoted names).
        let case = unknown_column_rule("data_column", "Region", columns);
        assert!(case.ends_with("did you mean 'region'?"), "{case}");
        let far = unknown_column_rule("data_column", "payload_bytes", columns);
        assert!(
            far.ends_with("the table's columns are 'user_id', 'url', 'region'"),
            "{far}"
        );
        let many: Vec<String> = (0..20).map(|i| format!("column_number_{i}")).collect();
        let rule = unknown_column_rule("row_key", "zz", many.iter().map(String::as_str));
        assert!(rule.ends_with("and 8 more"), "{rule}");
        let none = unknown_column_rule("row_key", "zz", std::iter::empty());
        assert_eq!(
            none,
            "no such column in the table (named by option 'row_key')"
        );
    }
}
