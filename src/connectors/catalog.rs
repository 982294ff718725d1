//! The connector list: every connector with the options it accepts.
//!
//! Each connector declares its option specs beside its typed options
//! (`connectors/<connector>/options.rs`); this list gathers them, so that one path turns the
//! pairs of a statement into parsed options (names checked with the nearest-name hint, values
//! by type and bound), and so that `docs/options.md` is rendered from the same lists.
//!
//! ```
//! use gcp_sql::connectors::ConnectorKind;
//! use gcp_sql::connectors::catalog::{parse_options, validate_names};
//! use gcp_sql::options::RawOptions;
//!
//! let raw = RawOptions::from_pairs([
//!     ("format.topic".to_string(), "projects/demo/topics/clicks".to_string()),
//!     ("BATCH_ELEMENT_COUNT_THRESHOLD".to_string(), "500".to_string()),
//! ])?;
//! assert_eq!(raw.get("batch_element_count_threshold"), Some("500"));
//! let parsed = parse_options(ConnectorKind::PubSub, &raw)?;
//! assert!(parsed.text_as_written(&gcp_sql::connectors::pubsub::options::TOPIC).is_some());
//!
//! let err = RawOptions::from_pairs([("topc".to_string(), "x".to_string())])
//!     .and_then(|raw| validate_names(ConnectorKind::PubSub, &raw))
//!     .unwrap_err();
//! assert!(err.to_string().contains("did you mean 'topic'"));
//! # Ok::<(), gcp_sql::Error>(())
//! ```

use crate::error::Result;
use crate::options::docs::{FixedBudget, Reference, Section, render};
use crate::options::{OptionGroup, OptionSpec, ParsedOptions, RawOptions, Value, common};

use super::kind::{CONNECTOR, ConnectorKind};
use super::{bigtable, cloud_tasks, pubsub};

/// The options every connector accepts, first in each connector's list: which connector, the
/// connection, the failure policy, and how a statement runs (writers, flush points).
pub static SHARED_OPTIONS: [&OptionSpec; 12] = [
    &CONNECTOR,
    &common::PROJECT,
    &common::ENDPOINT,
    &common::EMULATOR_HOST,
    &common::ALLOW_REMOTE_EMULATOR,
    &common::CREDENTIALS_FILE,
    &common::FAILURE_POLICY,
    &common::DEAD_LETTER_TOPIC,
    &common::DEAD_LETTER_PATH,
    &common::SINK_PARALLELISM,
    &common::FLUSH_INTERVAL,
    &common::FLUSH_ROWS,
];

/// One connector as the option layer sees it.
#[derive(Debug)]
pub struct Connector {
    /// Which connector.
    pub kind: ConnectorKind,
    /// What `LOCATION` names (`topic`, `queue`, `table`).
    pub destination: &'static str,
    /// Every option it accepts, in the order the reference lists them.
    pub options: fn() -> &'static [&'static OptionSpec],
    /// Paragraphs the reference shows above a group's table.
    pub group_notes: &'static [(OptionGroup, &'static str)],
    /// Settings that are not options, documented beside them.
    pub fixed_budgets: &'static [FixedBudget],
}

static CONNECTORS: [Connector; 3] = [
    Connector {
        kind: ConnectorKind::PubSub,
        destination: "topic",
        options: pubsub::options::options,
        group_notes: &[(
            OptionGroup::Writer,
            "Where a default says *Java SDK default*, it is the default of the official Java client's \
             publisher settings, which this connector takes over so that a pipeline moved from Java \
             behaves the same.",
        )],
        fixed_budgets: &[],
    },
    Connector {
        kind: ConnectorKind::CloudTasks,
        destination: "queue",
        options: cloud_tasks::options::options,
        group_notes: &[],
        fixed_budgets: cloud_tasks::options::FIXED_BUDGETS,
    },
    Connector {
        kind: ConnectorKind::Bigtable,
        destination: "table",
        options: bigtable::options::options,
        group_notes: &[],
        fixed_budgets: bigtable::options::FIXED_BUDGETS,
    },
];

/// Every connector, in the order of [`ConnectorKind::ALL`].
pub fn connectors() -> &'static [Connector] {
    &CONNECTORS
}

/// The entry of `kind`.
pub fn connector(kind: ConnectorKind) -> &'static Connector {
    match kind {
        ConnectorKind::PubSub => &CONNECTORS[0],
        ConnectorKind::CloudTasks => &CONNECTORS[1],
        ConnectorKind::Bigtable => &CONNECTORS[2],
    }
}

/// The options `kind` accepts, in the order the reference lists them.
pub fn options_for(kind: ConnectorKind) -> impl Iterator<Item = &'static OptionSpec> + Clone {
    (connector(kind).options)().iter().copied()
}

/// The spec of option `name` for connector `kind`, if it has one.
pub fn lookup(kind: ConnectorKind, name: &str) -> Option<&'static OptionSpec> {
    options_for(kind).find(|s| s.name == name)
}

/// Checks the names of `raw` against `kind`'s options ([`crate::Error::UnknownOption`] with the
/// nearest valid name) and parses every value by its type and value-level bound. A `connector`
/// option must name `kind` itself.
///
/// This is the one path from a statement's pairs to parsed options: each connector's
/// `*SinkOptions::from_raw` starts here and builds its typed options from the result.
pub fn parse_options(kind: ConnectorKind, raw: &RawOptions) -> Result<ParsedOptions> {
    let parsed = ParsedOptions::parse(kind.name(), (connector(kind).options)(), raw)?;
    if let Some(value) = parsed.value(&CONNECTOR)
        && *value != Value::Text(kind.name().to_string())
    {
        return Err(CONNECTOR.invalid(
            parsed.text_as_written(&CONNECTOR).unwrap_or_default(),
            format!(
                "the table is declared for connector '{}' (STORED AS {}); the two must agree",
                kind.name(),
                kind.stored_as()
            ),
        ));
    }
    Ok(parsed)
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
    let sections = CONNECTORS
        .iter()
        .map(|c| Section {
            heading: format!(
                "{} (`connector = '{}'`, `STORED AS {}`)",
                c.kind.display_name(),
                c.kind.name(),
                c.kind.stored_as()
            ),
            intro: format!(
                "`LOCATION` carries the {} (an empty `LOCATION ''` means none). The emulator variable is `{}`.",
                c.destination,
                c.kind.emulator_env_var()
            ),
            options: (c.options)(),
            group_notes: c.group_notes,
            fixed_budgets: c.fixed_budgets,
        })
        .collect();
    render(&Reference {
        generated_by: "Generated from the connector list (src/connectors/catalog.rs) and each \
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
        common_heading: "Common options (every connector)",
        sections,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::options::{DefaultValue, OptionField};

    fn raw(pairs: &[(&str, &str)]) -> RawOptions {
        RawOptions::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string()))).unwrap()
    }

    #[test]
    fn the_list_follows_connector_kind_all() {
        let kinds: Vec<ConnectorKind> = connectors().iter().map(|c| c.kind).collect();
        assert_eq!(kinds, ConnectorKind::ALL);
        for kind in ConnectorKind::ALL {
            assert_eq!(connector(kind).kind, kind);
            assert!(
                options_for(kind).any(|s| std::ptr::eq(s, &CONNECTOR)),
                "{kind} lists the connector option"
            );
        }
    }

    #[test]
    fn no_two_specs_share_a_name_for_one_connector() {
        for kind in ConnectorKind::ALL {
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
        for kind in ConnectorKind::ALL {
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
        for kind in ConnectorKind::ALL {
            for spec in options_for(kind) {
                check(spec, &spec.default);
            }
        }
    }

    #[test]
    fn every_writer_default_fits_its_field() {
        // The typed defaults are read from the specs; a default of the wrong type would panic.
        let _ = pubsub::options::PubSubPublisherOptions::default();
        let _ = cloud_tasks::options::CloudTasksWriterOptions::default();
        let _ = bigtable::options::BigtableWriterOptions::default();
        assert_eq!(
            <Option<i32> as OptionField>::from_default(&DefaultValue::Unset("x")),
            Some(None)
        );
        assert_eq!(
            <i32 as OptionField>::from_default(&DefaultValue::Bool(true)),
            None
        );
    }

    #[test]
    fn suggests_nearest_name_for_a_misspelling() {
        let err = validate_names(ConnectorKind::PubSub, &raw(&[("retry_total_timout", "1s")]))
            .unwrap_err();
        assert!(
            matches!(err, Error::UnknownOption { ref suggestion, .. } if suggestion.as_deref() == Some("retry_total_timeout")),
            "{err}"
        );
    }

    #[test]
    fn suggests_the_same_knob_of_this_connector() {
        let err = validate_names(
            ConnectorKind::Bigtable,
            &raw(&[("max_active_publishers", "3")]),
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("did you mean 'max_active_instances'"),
            "{err}"
        );
    }

    #[test]
    fn gives_no_suggestion_for_a_far_name() {
        let err = validate_names(ConnectorKind::Bigtable, &raw(&[("zzzzzz", "1")])).unwrap_err();
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

    #[test]
    fn rejects_connector_option_that_disagrees_with_the_table() {
        let err =
            validate_names(ConnectorKind::PubSub, &raw(&[("connector", "bigtable")])).unwrap_err();
        assert!(
            matches!(err, Error::InvalidOption { ref option, .. } if option == "connector"),
            "{err}"
        );
        assert!(
            validate_names(ConnectorKind::Bigtable, &raw(&[("connector", "BIGTABLE")])).is_ok()
        );
    }
}
