//! Resource names: full names (`projects/P/topics/T`) and short ids resolved against the
//! `project` / `location` / `instance` options.
//!
//! The id rules are the services' own (Pub/Sub resource-name rules, Cloud Tasks queue and task
//! ids, Bigtable table and column-family ids), checked early so that a typo fails the `CREATE`
//! rather than the first send. The functions return the rule a value breaks as text, so that the
//! caller can name the option (or the column and row) it came from.
//!
//! ```
//! use gcp_sql::options::names::pubsub_topic;
//!
//! assert_eq!(pubsub_topic("clicks", Some("demo")).unwrap(), "projects/demo/topics/clicks");
//! assert_eq!(pubsub_topic("projects/demo/topics/clicks", None).unwrap(), "projects/demo/topics/clicks");
//! assert!(pubsub_topic("clicks", None).is_err()); // a short id needs a project
//! ```

/// A rule a name breaks.
pub type NameResult<T> = std::result::Result<T, String>;

/// Longest Pub/Sub topic id (Pub/Sub resource-name rules).
pub const PUBSUB_TOPIC_ID_MAX: usize = 255;
/// Shortest Pub/Sub topic id (Pub/Sub resource-name rules; the emulator enforces it too).
pub const PUBSUB_TOPIC_ID_MIN: usize = 3;
/// Longest Cloud Tasks queue id (`CreateQueue` reference: 1 to 100 characters).
pub const CLOUD_TASKS_QUEUE_ID_MAX: usize = 100;
/// Longest Cloud Tasks task id (`Task.name` reference: at most 500 characters).
pub const CLOUD_TASKS_TASK_ID_MAX: usize = 500;
/// Longest Bigtable table id (admin API `CreateTable`: at most 50 characters).
pub const BIGTABLE_TABLE_ID_MAX: usize = 50;
/// Longest Bigtable column family id (admin API `ModifyColumnFamilies`: at most 64 characters).
pub const BIGTABLE_FAMILY_ID_MAX: usize = 64;
/// Longest Bigtable instance id (admin API `CreateInstance`: at most 33 characters).
pub const BIGTABLE_INSTANCE_ID_MAX: usize = 33;

/// Checks a project id: not empty, no `/` or whitespace. (The service's stricter rule — 6 to 30
/// lower-case characters — is not enforced, because emulators accept any project.)
pub fn check_project(p: &str) -> NameResult<()> {
    if p.is_empty() || p.contains('/') || p.chars().any(char::is_whitespace) {
        return Err("a project id must be non-empty, without '/' or spaces".into());
    }
    Ok(())
}

fn check_location(l: &str) -> NameResult<()> {
    if l.is_empty() || !l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err("a location is a region id like 'us-central1'".into());
    }
    Ok(())
}

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

/// Checks a Cloud Tasks queue id: 1 to 100 letters, digits or hyphens.
pub fn check_queue_id(q: &str) -> NameResult<()> {
    if q.is_empty()
        || q.len() > CLOUD_TASKS_QUEUE_ID_MAX
        || !q.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    {
        return Err(format!(
            "a queue id has 1 to {CLOUD_TASKS_QUEUE_ID_MAX} letters, digits or hyphens"
        ));
    }
    Ok(())
}

/// Checks a Cloud Tasks task id: 1 to 500 letters, digits, hyphens or underscores.
pub fn check_task_id(t: &str) -> NameResult<()> {
    if t.is_empty()
        || t.len() > CLOUD_TASKS_TASK_ID_MAX
        || !t
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(format!(
            "a task id has 1 to {CLOUD_TASKS_TASK_ID_MAX} letters, digits, hyphens or underscores"
        ));
    }
    Ok(())
}

/// Checks a Bigtable instance id: 1 to 33 letters, digits, hyphens or underscores.
pub fn check_instance_id(i: &str) -> NameResult<()> {
    if i.is_empty()
        || i.len() > BIGTABLE_INSTANCE_ID_MAX
        || !i
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(format!(
            "an instance id has 1 to {BIGTABLE_INSTANCE_ID_MAX} letters, digits, hyphens or underscores"
        ));
    }
    Ok(())
}

/// Checks an id of the Bigtable form `[_a-zA-Z0-9][-_.a-zA-Z0-9]*` of at most `max` characters.
fn check_bigtable_id(id: &str, what: &str, max: usize) -> NameResult<()> {
    let first_ok = id
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    let rest_ok = id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if !first_ok || !rest_ok || id.len() > max {
        return Err(format!(
            "a {what} id has 1 to {max} characters of letters, digits, '-', '_' or '.', and starts with a letter, digit or '_'"
        ));
    }
    Ok(())
}

/// Checks a Bigtable table id.
pub fn check_table_id(t: &str) -> NameResult<()> {
    check_bigtable_id(t, "table", BIGTABLE_TABLE_ID_MAX)
}

/// Checks a Bigtable column family id.
pub fn check_family_id(f: &str) -> NameResult<()> {
    check_bigtable_id(f, "column family", BIGTABLE_FAMILY_ID_MAX)
}

/// Splits `projects/A/b/B/...` into its values, checking the collection words.
fn split_full<'a>(name: &'a str, words: &[&str]) -> Option<Vec<&'a str>> {
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

/// Resolves a topic: `projects/P/topics/T`, or a short id `T` in `project`.
pub fn pubsub_topic(value: &str, project: Option<&str>) -> NameResult<String> {
    let v = value.trim();
    if v.contains('/') {
        let parts = split_full(v, &["projects", "topics"]).ok_or_else(|| {
            format!("expected 'projects/PROJECT/topics/TOPIC' or a short topic id, found '{v}'")
        })?;
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

/// Resolves a queue: `projects/P/locations/L/queues/Q`, or a short id `Q` in `project` and
/// `location`.
pub fn cloud_tasks_queue(
    value: &str,
    project: Option<&str>,
    location: Option<&str>,
) -> NameResult<String> {
    let v = value.trim();
    if v.contains('/') {
        let parts = split_full(v, &["projects", "locations", "queues"]).ok_or_else(|| {
            format!("expected 'projects/PROJECT/locations/LOCATION/queues/QUEUE' or a short queue id, found '{v}'")
        })?;
        check_project(parts[0])?;
        check_location(parts[1])?;
        check_queue_id(parts[2])?;
        return Ok(v.to_string());
    }
    check_queue_id(v)?;
    let p = project.ok_or("a short queue id needs the 'project' and 'location' options")?;
    let l = location
        .ok_or("a short queue id needs the 'location' option (for example 'us-central1')")?;
    Ok(format!("projects/{p}/locations/{l}/queues/{v}"))
}

/// Resolves a task name: `<queue>/tasks/T`, or a short id `T` in `queue`.
pub fn cloud_tasks_task(value: &str, queue: &str) -> NameResult<String> {
    let v = value.trim();
    if v.contains('/') {
        let parts = split_full(v, &["projects", "locations", "queues", "tasks"]).ok_or_else(|| {
            format!("expected 'projects/P/locations/L/queues/Q/tasks/TASK' or a short task id, found '{v}'")
        })?;
        check_task_id(parts[3])?;
        let prefix = format!("{queue}/tasks/");
        if !v.starts_with(&prefix) {
            return Err(format!("task '{v}' does not belong to queue '{queue}'"));
        }
        return Ok(v.to_string());
    }
    check_task_id(v)?;
    Ok(format!("{queue}/tasks/{v}"))
}

/// Resolves an instance: `projects/P/instances/I`, or a short id `I` in `project`.
pub fn bigtable_instance(value: &str, project: Option<&str>) -> NameResult<String> {
    let v = value.trim();
    if v.contains('/') {
        let parts = split_full(v, &["projects", "instances"]).ok_or_else(|| {
            format!(
                "expected 'projects/PROJECT/instances/INSTANCE' or a short instance id, found '{v}'"
            )
        })?;
        check_project(parts[0])?;
        check_instance_id(parts[1])?;
        return Ok(v.to_string());
    }
    check_instance_id(v)?;
    let p = project.ok_or("a short instance id needs the 'project' option")?;
    Ok(format!("projects/{p}/instances/{v}"))
}

/// Resolves a table: `projects/P/instances/I/tables/T`, or a short id `T` in `instance` (a full
/// instance name, see [`bigtable_instance`]).
pub fn bigtable_table(value: &str, instance: Option<&str>) -> NameResult<String> {
    let v = value.trim();
    if v.contains('/') {
        let parts = split_full(v, &["projects", "instances", "tables"]).ok_or_else(|| {
            format!("expected 'projects/PROJECT/instances/INSTANCE/tables/TABLE' or a short table id, found '{v}'")
        })?;
        check_project(parts[0])?;
        check_instance_id(parts[1])?;
        check_table_id(parts[2])?;
        return Ok(v.to_string());
    }
    check_table_id(v)?;
    let i = instance.ok_or("a short table id needs the 'instance' option (and 'project'), or write 'projects/PROJECT/instances/INSTANCE/tables/TABLE'")?;
    Ok(format!("{i}/tables/{v}"))
}

/// The instance part (`projects/P/instances/I`) of a full table name.
pub fn instance_of_table(table: &str) -> Option<&str> {
    table.rsplit_once("/tables/").map(|(instance, _)| instance)
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
        assert!(cloud_tasks_queue("projects/p/queues/q", None, None).is_err());
        assert!(bigtable_table("projects/p/instances/i/tables/", None).is_err());
    }

    #[test]
    fn resolves_short_ids() {
        assert_eq!(
            cloud_tasks_queue("q1", Some("p"), Some("us-central1")).unwrap(),
            "projects/p/locations/us-central1/queues/q1"
        );
        let inst = bigtable_instance("inst", Some("p")).unwrap();
        assert_eq!(
            bigtable_table("events", Some(&inst)).unwrap(),
            "projects/p/instances/inst/tables/events"
        );
        assert_eq!(
            instance_of_table("projects/p/instances/inst/tables/events"),
            Some("projects/p/instances/inst")
        );
    }

    #[test]
    fn task_names_must_belong_to_their_queue() {
        let q = "projects/p/locations/l/queues/q";
        assert_eq!(
            cloud_tasks_task("t-1", q).unwrap(),
            format!("{q}/tasks/t-1")
        );
        assert!(cloud_tasks_task("projects/p/locations/l/queues/other/tasks/t", q).is_err());
        assert!(cloud_tasks_task("bad name", q).is_err());
    }
}
