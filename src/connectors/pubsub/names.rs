//! Pub/Sub resource names: `projects/P/topics/T`, or a short topic id resolved in the
//! `project` option. The id rules are the service's own resource-name rules, checked early so
//! that a typo fails the `CREATE` rather than the first publish.
//!
//! A broken rule never repeats the value (the option error that wraps it shows an option's
//! value; a row's value is never shown).
//!
//! ```
//! use gcp_sql::connectors::pubsub::names::pubsub_topic;
//!
//! assert_eq!(pubsub_topic("clicks", Some("demo")).unwrap(), "projects/demo/topics/clicks");
//! assert_eq!(pubsub_topic("projects/demo/topics/clicks", None).unwrap(), "projects/demo/topics/clicks");
//! assert!(pubsub_topic("clicks", None).is_err()); // a short id needs a project
//! ```

pub use crate::options::names::NameResult;
use crate::options::names::{check_project, split_full};

/// Longest Pub/Sub topic id (Pub/Sub resource-name rules).
pub const PUBSUB_TOPIC_ID_MAX: usize = 255;
/// Shortest Pub/Sub topic id (Pub/Sub resource-name rules; the emulator enforces it too).
pub const PUBSUB_TOPIC_ID_MIN: usize = 3;

/// Checks a Pub/Sub topic id: 3 to 255 characters, starting with a letter, of letters, digits
/// and `-_.~+%`, and not starting with `goog`.
pub fn check_topic_id(t: &str) -> NameResult<()> {
    let ok_len = (PUBSUB_TOPIC_ID_MIN..=PUBSUB_TOPIC_ID_MAX).contains(&t.len());
    let starts = t.chars().next().is_some_and(|c| c.is_ascii_alphabetic());
    let chars = t
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.~+%".contains(c));
    if !(ok_len && starts && chars) || t.to_ascii_lowercase().starts_with("goog") {
        return Err(format!(
            "a topic id has {PUBSUB_TOPIC_ID_MIN} to {PUBSUB_TOPIC_ID_MAX} characters, starts with a letter, \
             uses letters, digits and '-_.~+%', and does not start with 'goog'"
        ));
    }
    Ok(())
}

/// Resolves a topic: `projects/P/topics/T`, or a short id `T` in `project`.
pub fn pubsub_topic(value: &str, project: Option<&str>) -> NameResult<String> {
    let v = value.trim();
    if v.contains('/') {
        let parts = split_full(v, &["projects", "topics"])
            .ok_or("expected 'projects/PROJECT/topics/TOPIC' or a short topic id")?;
        check_project(parts[0])?;
        check_topic_id(parts[1])?;
        return Ok(v.to_string());
    }
    check_topic_id(v)?;
    let p = project.ok_or(
        "a short topic id needs the 'project' option (or write 'projects/PROJECT/topics/TOPIC')",
    )?;
    Ok(format!("projects/{p}/topics/{v}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_short_topic_ids_the_service_refuses() {
        assert!(check_topic_id("ab").is_err());
        assert!(check_topic_id("1abc").is_err());
        assert!(check_topic_id("google-x").is_err());
        assert!(check_topic_id("abc").is_ok());
    }

    #[test]
    fn rejects_malformed_full_names() {
        assert!(pubsub_topic("projects/p/topic/abc", None).is_err());
        assert!(pubsub_topic("projects//topics/abc", None).is_err());
    }
}
