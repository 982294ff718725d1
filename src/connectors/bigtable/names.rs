//! Bigtable resource names: instances (`projects/P/instances/I`, or a short id in `project`),
//! tables (`projects/P/instances/I/tables/T`, or a short id in an instance) and column family
//! ids. The id rules are the admin API's own, checked early so that a typo fails the `CREATE`
//! rather than the first write.
//!
//! A broken rule never repeats the value: a table or instance name can come from a row, whose
//! values errors do not show. An option's value is shown by the option error that wraps it.
//!
//! ```
//! use gcp_sql::connectors::bigtable::names::{bigtable_instance, bigtable_table};
//!
//! let instance = bigtable_instance("main", Some("demo")).unwrap();
//! assert_eq!(bigtable_table("events", Some(&instance)).unwrap(), "projects/demo/instances/main/tables/events");
//! assert!(bigtable_table("events", None).is_err()); // a short id needs an instance
//! ```

pub use crate::options::names::NameResult;
use crate::options::names::{NameLevel, PROJECTS, check_word_id, full_or_short_name};

/// Longest Bigtable table id (admin API `CreateTable`: at most 50 characters).
pub const BIGTABLE_TABLE_ID_MAX: usize = 50;
/// Longest Bigtable column family id (admin API `ModifyColumnFamilies`: at most 64 characters).
pub const BIGTABLE_FAMILY_ID_MAX: usize = 64;
/// Longest Bigtable instance id (admin API `CreateInstance`: at most 33 characters).
pub const BIGTABLE_INSTANCE_ID_MAX: usize = 33;

/// Checks a Bigtable instance id: 1 to 33 letters, digits, hyphens or underscores.
pub fn check_instance_id(i: &str) -> NameResult<()> {
    check_word_id(i, "an instance", BIGTABLE_INSTANCE_ID_MAX)
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

/// The `instances/INSTANCE` level of a name.
const INSTANCES: NameLevel = NameLevel::new("instances", "INSTANCE", check_instance_id);

/// The `tables/TABLE` level of a name.
const TABLES: NameLevel = NameLevel::new("tables", "TABLE", check_table_id);

/// Resolves an instance: `projects/P/instances/I`, or a short id `I` in `project`.
pub fn bigtable_instance(value: &str, project: Option<&str>) -> NameResult<String> {
    full_or_short_name(value, &[PROJECTS, INSTANCES], "instance", |i| {
        let p = project.ok_or("a short instance id needs the 'project' option")?;
        Ok(format!("projects/{p}/instances/{i}"))
    })
}

/// Resolves a table: `projects/P/instances/I/tables/T`, or a short id `T` in `instance` (a full
/// instance name, see [`bigtable_instance`]).
pub fn bigtable_table(value: &str, instance: Option<&str>) -> NameResult<String> {
    let levels = [PROJECTS, INSTANCES, TABLES];
    full_or_short_name(value, &levels, "table", |t| {
        let i = instance.ok_or("a short table id needs the 'instance' option (and 'project'), or write 'projects/PROJECT/instances/INSTANCE/tables/TABLE'")?;
        Ok(format!("{i}/tables/{t}"))
    })
}

/// The instance part (`projects/P/instances/I`) of a full table name.
pub fn instance_of_table(table: &str) -> Option<&str> {
    table.rsplit_once("/tables/").map(|(instance, _)| instance)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_malformed_full_names() {
        assert!(bigtable_table("projects/p/instances/i/tables/", None).is_err());
    }

    #[test]
    fn resolves_short_ids() {
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
}
