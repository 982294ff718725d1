//! Pub/Sub resource names: `projects/P/topics/T`, or a short topic id resolved in the
//! `project` option; and `projects/P/subscriptions/S`, which the inspection functions take. The id rules are the service's own resource-name rules, checked early so
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
use crate::options::names::{NameLevel, PROJECTS, check_project, full_or_short_name, split_full};

/// Longest Pub/Sub topic id (Pub/Sub resource-name rules).
pub const PUBSUB_TOPIC_ID_MAX: usize = 255;
/// Shortest Pub/Sub topic id (Pub/Sub resource-name rules; the emulator enforces it too).
pub const PUBSUB_TOPIC_ID_MIN: usize = 3;

/// Longest Pub/Sub subscription id (Pub/Sub resource-name rules, the same as a topic id's).
pub const PUBSUB_SUBSCRIPTION_ID_MAX: usize = PUBSUB_TOPIC_ID_MAX;
/// Shortest Pub/Sub subscription id (Pub/Sub resource-name rules, the same as a topic id's).
pub const PUBSUB_SUBSCRIPTION_ID_MIN: usize = PUBSUB_TOPIC_ID_MIN;

/// Whether `id` follows the Pub/Sub resource-id rule topics and subscriptions share.
fn is_resource_id(id: &str) -> bool {
    let ok_len = (PUBSUB_TOPIC_ID_MIN..=PUBSUB_TOPIC_ID_MAX).contains(&id.len());
    let starts = id.chars().next().is_some_and(|c| c.is_ascii_alphabetic());
    let chars = id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.~+%".contains(c));
    ok_len && starts && chars && !id.to_ascii_lowercase().starts_with("goog")
}

/// Checks a Pub/Sub topic id: 3 to 255 characters, starting with a letter, of letters, digits
/// and `-_.~+%`, and not starting with `goog`.
pub fn check_topic_id(t: &str) -> NameResult<()> {
    if !is_resource_id(t) {
        return Err(format!(
            "a topic id has {PUBSUB_TOPIC_ID_MIN} to {PUBSUB_TOPIC_ID_MAX} characters, starts with a letter, \
             uses letters, digits and '-_.~+%', and does not start with 'goog'"
        ));
    }
    Ok(())
}

/// Checks a Pub/Sub subscription id, by the rule of a topic id: 3 to 255 characters, starting
/// with a letter, of letters, digits and `-_.~+%`, and not starting with `goog`.
pub fn check_subscription_id(s: &str) -> NameResult<()> {
    if !is_resource_id(s) {
        return Err(format!(
            "a subscription id has {PUBSUB_SUBSCRIPTION_ID_MIN} to {PUBSUB_SUBSCRIPTION_ID_MAX} characters, \
             starts with a letter, uses letters, digits and '-_.~+%', and does not start with 'goog'"
        ));
    }
    Ok(())
}

/// Checks a full subscription name, `projects/P/subscriptions/S`, and returns it trimmed.
///
/// ```
/// use gcp_sql::connectors::pubsub::names::pubsub_subscription;
///
/// assert!(pubsub_subscription("projects/demo/subscriptions/look").is_ok());
/// assert!(pubsub_subscription("look").is_err()); // a full name is needed
/// assert!(pubsub_subscription("projects/demo/subscriptions/x").is_err()); // id too short
/// ```
pub fn pubsub_subscription(value: &str) -> NameResult<String> {
    let v = value.trim();
    let parts = split_full(v, &["projects", "subscriptions"])
        .ok_or("expected 'projects/PROJECT/subscriptions/SUBSCRIPTION'")?;
    check_project(parts[0])?;
    check_subscription_id(parts[1])?;
    Ok(v.to_string())
}

/// Checks a snapshot id, by the rule of a topic id: 3 to 255 characters, starting with a
/// letter, of letters, digits and `-_.~+%`, and not starting with `goog`.
pub fn check_snapshot_id(s: &str) -> NameResult<()> {
    if !is_resource_id(s) {
        return Err(format!(
            "a snapshot id has {PUBSUB_TOPIC_ID_MIN} to {PUBSUB_TOPIC_ID_MAX} characters, starts \
             with a letter, uses letters, digits and '-_.~+%', and does not start with 'goog'"
        ));
    }
    Ok(())
}

/// Resolves a snapshot: `projects/P/snapshots/S`, or a short id `S` in `project`.
///
/// ```
/// use gcp_sql::connectors::pubsub::names::pubsub_snapshot;
///
/// assert_eq!(pubsub_snapshot("before", Some("demo")).unwrap(), "projects/demo/snapshots/before");
/// assert!(pubsub_snapshot("projects/demo/snapshots/x", None).is_err()); // id too short
/// ```
pub fn pubsub_snapshot(value: &str, project: Option<&str>) -> NameResult<String> {
    let snapshots = NameLevel::new("snapshots", "SNAPSHOT", check_snapshot_id);
    full_or_short_name(value, &[PROJECTS, snapshots], "snapshot", |s| {
        let p = project.ok_or(
            "a short snapshot id needs a project (or write 'projects/PROJECT/snapshots/SNAPSHOT')",
        )?;
        Ok(format!("projects/{p}/snapshots/{s}"))
    })
}

/// Resolves a topic: `projects/P/topics/T`, or a short id `T` in `project`.
pub fn pubsub_topic(value: &str, project: Option<&str>) -> NameResult<String> {
    let topics = NameLevel::new("topics", "TOPIC", check_topic_id);
    full_or_short_name(value, &[PROJECTS, topics], "topic", |t| {
        let p = project.ok_or(
            "a short topic id needs the 'project' option (or write 'projects/PROJECT/topics/TOPIC')",
        )?;
        Ok(format!("projects/{p}/topics/{t}"))
    })
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
    fn checks_subscription_names_by_the_resource_id_rule() {
        assert!(pubsub_subscription("projects/p/subscriptions/look").is_ok());
        for bad in [
            "look",
            "projects/p/subscription/look",
            "projects/p/topics/look",
            "projects//subscriptions/look",
            "projects/p/subscriptions/ab",
            "projects/p/subscriptions/1look",
            "projects/p/subscriptions/goog-look",
            "projects/p/subscriptions/lo ok",
        ] {
            assert!(pubsub_subscription(bad).is_err(), "{bad}");
        }
        let rule = pubsub_subscription("projects/p/subscriptions/ab").unwrap_err();
        assert!(rule.contains("subscription id has 3 to 255"), "{rule}");
    }

    #[test]
    fn rejects_malformed_full_names() {
        assert!(pubsub_topic("projects/p/topic/abc", None).is_err());
        assert!(pubsub_topic("projects//topics/abc", None).is_err());
    }
}
