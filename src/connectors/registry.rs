//! The one list of connectors. Every other list the crate keeps (the `STORED AS` factories,
//! the words of the `connector` option, the option reference, the inspection functions, the
//! emulators a session starts) is derived from [`CONNECTORS`].
//!
//! Adding a connector is one folder that exports a `CONNECTOR` descriptor, plus its entries here
//! (see `docs/architecture.md`).
//!
//! ```
//! use gcp_sql::connectors::registry;
//!
//! let words: Vec<&str> = registry::kinds().map(|k| k.stored_as()).collect();
//! assert_eq!(words, ["PUBSUB", "CLOUD_TASKS", "BIGTABLE"]);
//! let err = registry::kind_named("pubsb").unwrap_err().to_string();
//! assert!(err.contains("did you mean 'pubsub'"), "{err}");
//! ```

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;

use super::descriptor::SinkConnector;
#[cfg(any(test, feature = "testing"))]
use super::descriptor::TestingPart;
use super::descriptor::{ConnectorDescriptor, ConnectorKind, Declared};
use super::{bigtable, cloud_tasks, pubsub};
#[cfg(any(test, feature = "testing"))]
use crate::bench::null_method::NullService;
#[cfg(any(test, feature = "testing"))]
use crate::emulators::kind::EmulatorKind;
use crate::error::{Error, Result};
use crate::options::{
    Bound, DefaultValue, EnvLookup, OptionGroup, OptionKind, OptionSpec, RawOptions, nearest_name,
};

/// Every connector, in the order the reference lists them: the one list of the crate.
pub static CONNECTORS: [Registered; 3] = [
    Registered {
        descriptor: &pubsub::CONNECTOR,
        #[cfg(any(test, feature = "testing"))]
        testing: &pubsub::testing::TESTING,
        #[cfg(any(test, feature = "testing"))]
        null_sources: &pubsub::testing::NULL_SOURCES,
    },
    Registered {
        descriptor: &cloud_tasks::CONNECTOR,
        #[cfg(any(test, feature = "testing"))]
        testing: &cloud_tasks::testing::TESTING,
        #[cfg(any(test, feature = "testing"))]
        null_sources: &[],
    },
    Registered {
        descriptor: &bigtable::CONNECTOR,
        #[cfg(any(test, feature = "testing"))]
        testing: &bigtable::testing::TESTING,
        #[cfg(any(test, feature = "testing"))]
        null_sources: &bigtable::testing::NULL_SOURCES,
    },
];

/// The connectors whose tables answer lookup joins (ADR 0078).
pub static LOOKUPS: [&crate::connectors::lookup::LookupPlanner; 1] = [&bigtable::lookup::PLANNER];

/// A join as a lookup node of the connector whose table it reads (see
/// [`crate::connectors::lookup::LookupPlanner::rewrite`]), finding its input's delivery
/// handles through `upstream_of`.
pub fn lookup_join(
    plan: &std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    upstream_of: crate::core::delivery::UpstreamOf,
) -> std::result::Result<Option<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>>, String>
{
    for planner in LOOKUPS {
        if let Some(node) = (planner.rewrite)(plan, upstream_of)? {
            return Ok(Some(node));
        }
    }
    Ok(None)
}

/// One connector as [`CONNECTORS`] lists it: its descriptor (what production code knows of
/// it) and, with the `testing` feature, its testing part (its emulator and null server).
#[derive(Debug)]
pub struct Registered {
    /// What the rest of the crate knows of the connector.
    pub descriptor: &'static ConnectorDescriptor,
    /// What the tests and benchmarks need of it (feature `testing`).
    #[cfg(any(test, feature = "testing"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
    pub testing: &'static TestingPart,
    /// The null servers that stand in for the service's reading side (`pubsub-subscribe`),
    /// listed after its sink's (feature `testing`).
    #[cfg(any(test, feature = "testing"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
    pub null_sources: &'static [NullService],
}

/// The names of [`CONNECTORS`], in their order: the words of the `connector` option.
static NAMES: [&str; CONNECTORS.len()] = {
    let mut names = [""; CONNECTORS.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = CONNECTORS[i].descriptor.name;
        i += 1;
    }
    names
};

/// `connector`: which service a table writes to. Every connector accepts it; its value must
/// name the connector the table is declared for.
pub static CONNECTOR: OptionSpec = OptionSpec {
    name: "connector",
    group: OptionGroup::Connection,
    kind: OptionKind::Enum(&NAMES),
    default: DefaultValue::None,
    bound: Bound::None,
    cross_rule: "required in the `CREATE TABLE ... WITH` form; in `CREATE EXTERNAL TABLE` the `STORED AS` word chooses the connector and this option, if given, must agree",
    example: "pubsub",
    description: "Which service the table writes to.",
    redact: crate::options::Redact::None,
};

/// Every emulator, in the order of [`CONNECTORS`] (the order `gcp-sql --emulators` starts and
/// reports them): the connectors' testing parts that have one.
///
/// ```
/// use gcp_sql::connectors::registry;
///
/// let slugs: Vec<&str> = registry::emulators().map(|k| k.spec().slug).collect();
/// assert_eq!(slugs, ["pubsub", "cloud-tasks", "bigtable"]);
/// ```
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub fn emulators() -> impl Iterator<Item = EmulatorKind> + Clone {
    CONNECTORS.iter().filter_map(|c| c.testing.emulator)
}

/// The emulator of `connector`, if it has one.
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub fn emulator_of(connector: ConnectorKind) -> Option<EmulatorKind> {
    registered(connector).testing.emulator
}

/// Every null service, in the order of [`CONNECTORS`] (the order `gcp-sql serve-null
/// --service` lists them), each connector's sink first and then its sources; the first is the
/// default of `gcp-sql serve-null`.
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub fn null_services() -> impl Iterator<Item = NullService> + Clone {
    CONNECTORS.iter().flat_map(|c| {
        c.testing
            .null_service
            .into_iter()
            .chain(c.null_sources.iter().copied())
    })
}

/// The null service named `name` (as [`NullService::name`] spells it).
///
/// ```
/// use gcp_sql::bench::null_server::NullService;
/// use gcp_sql::connectors::registry;
///
/// assert_eq!(registry::null_service_named("bigtable"), Some(NullService::Bigtable));
/// assert_eq!(registry::null_service_named("pub-sub"), None);
/// ```
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub fn null_service_named(name: &str) -> Option<NullService> {
    null_services().find(|s| s.name() == name)
}

/// How [`CONNECTORS`] lists `connector`.
pub fn registered(connector: ConnectorKind) -> &'static Registered {
    CONNECTORS
        .iter()
        .find(|c| ConnectorKind::of(c.descriptor) == connector)
        .expect("every connector handle is made from a listed descriptor")
}

/// Every connector's handle, in the order of [`CONNECTORS`].
pub fn kinds() -> impl Iterator<Item = ConnectorKind> + Clone {
    CONNECTORS.iter().map(|c| ConnectorKind::of(c.descriptor))
}

/// The connector called `text`, by its name or its `STORED AS` word, case-insensitively
/// (`pubsub`, `PUBSUB`, `cloud_tasks`, ...). An unknown name is an [`Error::InvalidOption`] on
/// `connector`, with the nearest name.
pub fn kind_named(text: &str) -> Result<ConnectorKind> {
    let t = text.trim();
    if let Some(kind) = kinds().find(|k| k.name().eq_ignore_ascii_case(t)) {
        return Ok(kind);
    }
    let lower = t.to_ascii_lowercase();
    let hint = nearest_name(&lower, NAMES.iter().copied())
        .map(|s| format!(" (did you mean '{s}'?)"))
        .unwrap_or_default();
    Err(Error::invalid(
        "connector",
        text,
        format!("expected one of {}{hint}", NAMES.join(", ")),
    ))
}

/// Builds the sink of `kind` from its options, checking them and the schema; reads the
/// emulator variable from the process environment.
pub fn build_sink(
    kind: ConnectorKind,
    schema: SchemaRef,
    location: Option<&str>,
    raw: &RawOptions,
) -> Result<Arc<dyn SinkConnector>> {
    let env: EnvLookup<'_> = &crate::options::ConnectionOptions::process_env;
    Ok(declare(kind, schema, location, raw, env)?.sink)
}

/// Builds the sink of `kind` with the environment read through `env`, and returns the
/// connection its options resolved to beside it.
pub fn declare(
    kind: ConnectorKind,
    schema: SchemaRef,
    location: Option<&str>,
    raw: &RawOptions,
    env: EnvLookup<'_>,
) -> Result<Declared> {
    (kind.descriptor().declare)(schema, location, raw, env)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_testing_part_serves_its_own_connector() {
        for connector in kinds() {
            if let Some(emulator) = emulator_of(connector) {
                assert_eq!(
                    emulator.env_var(),
                    connector.emulator_env_var(),
                    "{connector}"
                );
            }
        }
        let emulators: Vec<EmulatorKind> = emulators().collect();
        let services: Vec<NullService> = null_services().collect();
        for (i, a) in emulators.iter().enumerate() {
            for b in &emulators[i + 1..] {
                assert_ne!(a.spec().slug, b.spec().slug);
                assert_ne!(a.program_override_var(), b.program_override_var());
            }
        }
        for (i, a) in services.iter().enumerate() {
            assert!(!services[i + 1..].contains(a), "{a}");
        }
    }

    #[test]
    fn null_service_names_round_trip() {
        for service in null_services() {
            assert_eq!(null_service_named(service.name()), Some(service));
            assert!(service.method_path().starts_with("/google."));
        }
        assert_eq!(null_service_named("pub-sub"), None);
        assert_eq!(null_services().next(), Some(NullService::PubSub));
    }

    #[test]
    fn the_install_hint_pins_the_version_ci_installs() {
        let ci = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/run")).unwrap();
        let private: Vec<(EmulatorKind, crate::emulators::PipPackage)> = emulators()
            .filter_map(|k| Some((k, k.private_install()?)))
            .collect();
        assert!(!private.is_empty(), "one emulator is installed privately");
        for (kind, package) in private {
            // `gcloud-tasks-emulator` is pinned as `GCLOUD_TASKS_EMULATOR_VERSION=...`.
            let variable = format!(
                "{}_VERSION",
                package.name.to_ascii_uppercase().replace('-', "_")
            );
            assert!(
                ci.contains(&format!("{variable}={}\n", package.version)),
                ".ci/run pins another version than {}",
                package.version
            );
            assert!(
                kind.install_hint()
                    .ends_with(&format!("=={}", package.version))
            );
        }
    }

    #[test]
    fn connector_names_round_trip() {
        for kind in kinds() {
            assert_eq!(kind_named(kind.name()).unwrap(), kind);
            assert_eq!(kind_named(kind.stored_as()).unwrap(), kind);
        }
        let err = kind_named("pubsb").unwrap_err().to_string();
        assert!(err.contains("did you mean 'pubsub'"), "{err}");
    }

    #[test]
    fn the_connector_option_lists_every_connector() {
        let OptionKind::Enum(words) = CONNECTOR.kind else {
            panic!("connector is an enum option");
        };
        let names: Vec<&str> = kinds().map(|k| k.name()).collect();
        assert_eq!(words, names.as_slice());
    }

    #[test]
    fn every_connector_has_its_own_name_and_words() {
        let list: Vec<ConnectorKind> = kinds().collect();
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                assert_ne!(a.name(), b.name());
                assert_ne!(a.stored_as(), b.stored_as());
                assert_ne!(a.emulator_env_var(), b.emulator_env_var());
            }
        }
    }

    /// The Python package's helpers are written by hand (docstrings, type hints, each
    /// connector's destination keyword), so they are checked here rather than generated: the
    /// test fails as soon as a connector is added to, removed from or renamed in the registry
    /// without the package following.
    #[test]
    fn the_python_helpers_and_stubs_follow_the_registry() {
        let read = |file: &str| {
            let path = format!("{}/python/gcp_sql/{file}", env!("CARGO_MANIFEST_DIR"));
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
        };
        let (init, stubs, testing) = (
            read("__init__.py"),
            read("__init__.pyi"),
            read("testing.py"),
        );
        // The public `<name>_sink` functions a file defines, in its order.
        let sink_helpers = |text: &str| -> Vec<String> {
            text.lines()
                .filter_map(|line| line.strip_prefix("def "))
                .filter_map(|rest| rest.split_once('(').map(|(name, _)| name.to_string()))
                .filter(|name| name.ends_with("_sink") && !name.starts_with('_'))
                .collect()
        };
        let expected: Vec<String> = kinds().map(|k| format!("{}_sink", k.name())).collect();
        assert_eq!(sink_helpers(&init), expected, "python/gcp_sql/__init__.py");
        assert_eq!(
            sink_helpers(&stubs),
            expected,
            "python/gcp_sql/__init__.pyi"
        );
        for kind in kinds() {
            let (name, to) = (kind.name(), kind.descriptor().destination);
            for needle in [
                format!("    \"{name}_sink\",\n"),
                format!("def {name}_sink(schema: Any, {to}: str | None = None, **options: Any)"),
                format!("return _sink(\"{name}\", schema, {{\"{to}\": {to}, **options}})"),
            ] {
                assert!(init.contains(&needle), "__init__.py lacks {needle}");
            }
            let def = stubs.find(&format!("def {name}_sink(")).unwrap();
            let signature = &stubs[def..stubs[def..].find("...").map_or(stubs.len(), |e| def + e)];
            assert!(
                signature.contains(&format!("{to}: str | None = None")),
                "{signature}"
            );
        }
        let words: Vec<&str> = kinds().map(|k| k.stored_as()).collect();
        let stored_as = format!("``STORED AS {}``", words.join(" | "));
        assert!(init.contains(&stored_as), "__init__.py lacks {stored_as}");
        let services: Vec<String> = null_services()
            .map(|s| format!("``{}``", s.name()))
            .collect();
        let (last, rest) = services.split_last().unwrap();
        let listed = format!("({} or {last})", rest.join(", "));
        assert!(testing.contains(&listed), "testing.py lacks {listed}");
    }
}
