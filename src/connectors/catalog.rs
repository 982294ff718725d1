//! Every registered connector with the options it accepts.
//!
//! Each connector declares its option specs beside its typed options
//! (`connectors/<connector>/options.rs`) and lists them in its descriptor; this file gathers
//! them from the registry, with the registry's `connector` option first, so that the SQL front
//! end checks a statement's pairs against one list (names with the nearest-name hint, values
//! by type and bound), and so that `docs/options.md` is rendered from the same lists.
//!
//! ```
//! use gcp_sql::connectors::catalog::{parse_options, validate_names};
//! use gcp_sql::options::RawOptions;
//!
//! let raw = RawOptions::from_pairs([
//!     ("format.topic".to_string(), "projects/demo/topics/clicks".to_string()),
//!     ("BATCH_ELEMENT_COUNT_THRESHOLD".to_string(), "500".to_string()),
//! ])?;
//! assert_eq!(raw.get("batch_element_count_threshold"), Some("500"));
//! let pubsub = gcp_sql::connectors::registry::kind_named("pubsub")?;
//! let parsed = parse_options(pubsub, &raw)?;
//! let topic = gcp_sql::connectors::catalog::lookup(pubsub, "topic").expect("a topic option");
//! assert!(parsed.text_as_written(topic).is_some());
//!
//! let err = RawOptions::from_pairs([("topc".to_string(), "x".to_string())])
//!     .and_then(|raw| validate_names(pubsub, &raw))
//!     .unwrap_err();
//! assert!(err.to_string().contains("did you mean 'topic'"));
//! # Ok::<(), gcp_sql::Error>(())
//! ```

use std::sync::LazyLock;

use crate::error::Result;
use crate::options::docs::{Reference, Section, render};
use crate::options::{OptionSpec, ParsedOptions, RawOptions};

use super::descriptor::ConnectorKind;
use super::registry::{self, CONNECTOR, CONNECTORS};

/// Each connector's options with `connector` first, in the order of [`CONNECTORS`].
static FULL_LISTS: LazyLock<Vec<Vec<&'static OptionSpec>>> = LazyLock::new(|| {
    CONNECTORS
        .iter()
        .map(|c| {
            std::iter::once(&CONNECTOR)
                .chain((c.descriptor.options)().iter().copied())
                .collect()
        })
        .collect()
});

/// The options `kind` accepts, `connector` first, in the order the reference lists them.
pub fn options_for(kind: ConnectorKind) -> impl Iterator<Item = &'static OptionSpec> + Clone {
    let index = CONNECTORS
        .iter()
        .position(|c| c.descriptor.name == kind.name())
        .expect("every ConnectorKind is in the registry");
    FULL_LISTS[index].iter().copied()
}

/// The spec of option `name` for connector `kind`, if it has one.
pub fn lookup(kind: ConnectorKind, name: &str) -> Option<&'static OptionSpec> {
    options_for(kind).find(|s| s.name == name).or_else(|| {
        let source = kind.descriptor().source?;
        (source.options)().iter().copied().find(|s| s.name == name)
    })
}

/// Checks the names of `raw` against `kind`'s options ([`crate::Error::UnknownOption`] with the
/// nearest valid name) and parses every value by its type and value-level bound. A `connector`
/// option must be one of the registered names, and name `kind` itself.
///
/// A connector's `*SinkOptions` (`TableOptions::from_raw`) runs the same checks through
/// [`ConnectorKind::parse_options`]; this adds the list of registered names to the message of
/// an unknown `connector` word.
pub fn parse_options(kind: ConnectorKind, raw: &RawOptions) -> Result<ParsedOptions> {
    if let Some(word) = raw.get(CONNECTOR.name) {
        CONNECTOR.parse_checked(word)?;
    }
    kind.parse_options(raw)
}

/// [`parse_options`] without the result: whether `raw` names only options of `kind`, with
/// values of the right type and within their bounds.
///
/// Cross-option rules (a destination is required, `recovery_max_backoff` at least
/// `recovery_initial_backoff`, ...) are checked when the sink options are built.
pub fn validate_names(kind: ConnectorKind, raw: &RawOptions) -> Result<()> {
    parse_options(kind, raw).map(|_| ())
}

/// The text of `docs/options.md`, rendered from the connector list.
pub fn reference_markdown() -> String {
    let sections = registry::kinds()
        .zip(FULL_LISTS.iter())
        .map(|(kind, options)| {
            let c = kind.descriptor();
            Section {
                heading: format!(
                    "{} (`connector = '{}'`, `STORED AS {}`)",
                    c.display_name, c.name, c.stored_as
                ),
                intro: format!(
                    "`LOCATION` carries the {} (an empty `LOCATION ''` means none). The emulator variable is `{}`.",
                    c.destination, c.service.emulator_env_var
                ),
                options: options.as_slice(),
                group_notes: c.group_notes,
                fixed_budgets: c.fixed_budgets,
                writer_title: "Writer",
            }
        })
        .collect();
    render(&Reference {
        generated_by: "Generated from the connector registry (src/connectors/registry.rs) and each \
             connector's options.rs by gcp_sql::connectors::catalog::reference_markdown(). Do not \
             edit by hand: run `GCP_SQL_BLESS=1 cargo test --test options` to regenerate.",
        introduction: "Every option below is accepted by both SQL forms, and by the typed builders of the Rust API \
             (writer options are the builder methods of the same name):\n\n\
             ```sql\n\
             CREATE TABLE clicks (user_id BIGINT, url VARCHAR)\n\
             WITH (connector = 'pubsub', topic = 'projects/demo/topics/clicks', batch_element_count_threshold = 500);\n\n\
             CREATE EXTERNAL TABLE clicks_native (user_id BIGINT, url VARCHAR) STORED AS PUBSUB\n\
             LOCATION 'projects/demo/topics/clicks' OPTIONS ('batch_element_count_threshold' '500');\n\
             ```\n\n\
             Names are case-insensitive; DataFusion's `format.` prefix is ignored, and a name given twice \
             (also as `k` and `format.k`) is an error. An unknown name is an error that suggests the nearest \
             valid one. Every value is checked when the table is declared; declaring a table never contacts \
             the service.\n\n",
        extra_syntax: &[
            "**resource names**: a full name (`projects/P/topics/T`, `projects/P/locations/L/queues/Q`, \
             `projects/P/instances/I/tables/T`) or a short id resolved with `project` (and `location` or \
             `instance`).",
        ],
        common_heading: "Common options (every connector's sink)",
        sections,
        sources: registry::kinds()
            .filter_map(|kind| Some((kind, kind.descriptor().source?)))
            .map(|(kind, source)| {
                let c = kind.descriptor();
                Section {
                    heading: format!(
                        "{} source (`connector = '{}'` with `{}`, `STORED AS {}`)",
                        c.display_name, c.name, source.location, c.stored_as
                    ),
                    intro: format!(
                        "A table that reads: declared with `{0}` (or a `LOCATION` naming a {0}). \
                         Every option a source accepts is listed here; the sinks' writer options \
                         do not apply. The emulator variable is `{1}`.",
                        source.location, c.service.emulator_env_var
                    ),
                    options: (source.options)(),
                    group_notes: &[],
                    fixed_budgets: &[],
                    writer_title: "Failures (a message that does not decode)",
                }
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::options::{DefaultValue, OptionField};
    use crate::test_util::raw_options;

    #[test]
    fn every_registered_connector_lists_the_connector_option_first() {
        let names: Vec<&str> = registry::kinds().map(|k| k.name()).collect();
        assert_eq!(names, ["pubsub", "cloud_tasks", "bigtable"]);
        for kind in registry::kinds() {
            assert!(
                options_for(kind)
                    .next()
                    .is_some_and(|s| std::ptr::eq(s, &CONNECTOR)),
                "{kind} lists the connector option first"
            );
            assert!(
                !(kind.descriptor().options)()
                    .iter()
                    .any(|s| s.name == CONNECTOR.name),
                "{kind}'s own list leaves `connector` to the registry"
            );
        }
    }

    #[test]
    fn no_two_specs_share_a_name_for_one_connector() {
        for kind in registry::kinds() {
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
        for kind in registry::kinds() {
            for spec in options_for(kind) {
                assert!(
                    spec.parse_checked(spec.example).is_ok(),
                    "example of {} is invalid",
                    spec.name
                );
            }
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
        for kind in registry::kinds() {
            for spec in options_for(kind) {
                check(spec, &spec.default);
            }
        }
    }

    #[test]
    fn every_writer_default_fits_its_field() {
        // The typed defaults are read from the specs; a default of the wrong type would panic.
        let _ = crate::connectors::pubsub::sink::options::PubSubPublisherOptions::default();
        let _ = crate::connectors::cloud_tasks::options::CloudTasksWriterOptions::default();
        let _ = crate::connectors::bigtable::options::BigtableWriterOptions::default();
        assert_eq!(
            <Option<i32> as OptionField>::from_default(&DefaultValue::Unset("x")),
            Some(None)
        );
        assert_eq!(
            <i32 as OptionField>::from_default(&DefaultValue::Bool(true)),
            None
        );
    }

    /// The error [`validate_names`] gives for `pairs` in a table of `kind`.
    fn names_error(kind: ConnectorKind, pairs: &[(&str, &str)]) -> Error {
        validate_names(kind, &raw_options(pairs)).unwrap_err()
    }

    #[test]
    fn an_unknown_name_gets_the_nearest_name_of_this_connector_or_no_suggestion() {
        for (kind, name, value, nearest) in [
            (
                crate::connectors::pubsub::KIND,
                "retry_total_timout",
                "1s",
                Some("retry_total_timeout"),
            ),
            // The same knob of another connector: this connector's word for it.
            (
                crate::connectors::bigtable::KIND,
                "max_active_publishers",
                "3",
                Some("max_active_instances"),
            ),
            (crate::connectors::bigtable::KIND, "zzzzzz", "1", None),
        ] {
            let err = names_error(kind, &[(name, value)]);
            match &err {
                Error::UnknownOption { suggestion, .. } => {
                    assert_eq!(suggestion.as_deref(), nearest, "{err}")
                }
                other => panic!("expected an unknown option, got {other:?}"),
            }
            if let Some(nearest) = nearest {
                let text = err.to_string();
                assert!(
                    text.contains(&format!("did you mean '{nearest}'")),
                    "{text}"
                );
            }
        }
    }

    #[test]
    fn rejects_connector_option_that_disagrees_with_the_table() {
        let err = names_error(
            crate::connectors::pubsub::KIND,
            &[("connector", "bigtable")],
        );
        assert!(
            matches!(err, Error::InvalidOption { ref option, .. } if option == "connector"),
            "{err}"
        );
        assert!(
            validate_names(
                crate::connectors::bigtable::KIND,
                &raw_options(&[("connector", "BIGTABLE")])
            )
            .is_ok()
        );
    }
}
