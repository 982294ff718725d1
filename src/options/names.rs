//! Resource-name helpers every connector's name rules share: the project id check and the
//! splitting of a full name (`projects/P/things/T`) into its values.
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
}
