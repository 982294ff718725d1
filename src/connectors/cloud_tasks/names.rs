//! Cloud Tasks resource names: queues (`projects/P/locations/L/queues/Q`, or a short queue id
//! resolved in the `project` and `location` options) and task names (`<queue>/tasks/T`). The
//! id rules are the service's own (`CreateQueue` and `Task.name` references), checked early so
//! that a typo fails the `CREATE` rather than the first creation.
//!
//! A broken rule never repeats the value: a queue or task name can come from a row, whose
//! values errors do not show. An option's value is shown by the option error that wraps it.
//!
//! ```
//! use gcp_sql::connectors::cloud_tasks::names::cloud_tasks_queue;
//!
//! assert_eq!(
//!     cloud_tasks_queue("jobs", Some("demo"), Some("us-central1")).unwrap(),
//!     "projects/demo/locations/us-central1/queues/jobs"
//! );
//! assert!(cloud_tasks_queue("jobs", Some("demo"), None).is_err()); // a short id needs a location
//! ```

pub use crate::options::names::NameResult;
use crate::options::names::{NameLevel, PROJECTS, check_word_id, full_or_short_name, split_full};

/// Longest Cloud Tasks queue id (`CreateQueue` reference: 1 to 100 characters).
pub const CLOUD_TASKS_QUEUE_ID_MAX: usize = 100;
/// Longest Cloud Tasks task id (`Task.name` reference: at most 500 characters).
pub const CLOUD_TASKS_TASK_ID_MAX: usize = 500;

fn check_location(l: &str) -> NameResult<()> {
    if l.is_empty() || !l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err("a location is a region id like 'us-central1'".into());
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
    check_word_id(t, "a task", CLOUD_TASKS_TASK_ID_MAX)
}

/// The `locations/LOCATION` level of a name.
const LOCATIONS: NameLevel = NameLevel::new("locations", "LOCATION", check_location);

/// The `queues/QUEUE` level of a name.
const QUEUES: NameLevel = NameLevel::new("queues", "QUEUE", check_queue_id);

/// Resolves a queue: `projects/P/locations/L/queues/Q`, or a short id `Q` in `project` and
/// `location`.
pub fn cloud_tasks_queue(
    value: &str,
    project: Option<&str>,
    location: Option<&str>,
) -> NameResult<String> {
    let levels = [PROJECTS, LOCATIONS, QUEUES];
    full_or_short_name(value, &levels, "queue", |q| {
        let p = project.ok_or("a short queue id needs the 'project' and 'location' options")?;
        let l = location
            .ok_or("a short queue id needs the 'location' option (for example 'us-central1')")?;
        Ok(format!("projects/{p}/locations/{l}/queues/{q}"))
    })
}

/// Resolves a task name: `<queue>/tasks/T`, or a short id `T` in `queue`.
pub fn cloud_tasks_task(value: &str, queue: &str) -> NameResult<String> {
    let v = value.trim();
    if v.contains('/') {
        let parts = split_full(v, &["projects", "locations", "queues", "tasks"])
            .ok_or("expected 'projects/P/locations/L/queues/Q/tasks/TASK' or a short task id")?;
        check_task_id(parts[3])?;
        let prefix = format!("{queue}/tasks/");
        if !v.starts_with(&prefix) {
            // The queue is a destination and may be named; the task name is a row's value.
            return Err(format!("the task name does not belong to queue '{queue}'"));
        }
        return Ok(v.to_string());
    }
    check_task_id(v)?;
    Ok(format!("{queue}/tasks/{v}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_malformed_full_names() {
        assert!(cloud_tasks_queue("projects/p/queues/q", None, None).is_err());
    }

    #[test]
    fn resolves_short_ids() {
        assert_eq!(
            cloud_tasks_queue("q1", Some("p"), Some("us-central1")).unwrap(),
            "projects/p/locations/us-central1/queues/q1"
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
