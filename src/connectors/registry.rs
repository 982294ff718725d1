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

/// Every connector, in the order the reference lists them.
pub static CONNECTORS: [&ConnectorDescriptor; 3] = [
    &pubsub::CONNECTOR,
    &cloud_tasks::CONNECTOR,
    &bigtable::CONNECTOR,
];

/// The names of [`CONNECTORS`], the words of the `connector` option.
static NAMES: [&str; 3] = [
    pubsub::CONNECTOR.name,
    cloud_tasks::CONNECTOR.name,
    bigtable::CONNECTOR.name,
];

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

#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
impl EmulatorKind {
    /// Every emulator, in the order `gcp-sql --emulators` starts and reports them.
    pub const ALL: [EmulatorKind; 3] = [
        EmulatorKind::PubSub,
        EmulatorKind::Bigtable,
        EmulatorKind::CloudTasks,
    ];
}

#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
impl NullService {
    /// Every null service, in the order `gcp-sql serve-null --service` lists them.
    pub const ALL: [NullService; 3] = [
        NullService::PubSub,
        NullService::Bigtable,
        NullService::CloudTasks,
    ];

    /// The service named `name` (as [`name`](Self::name) spells it).
    pub fn from_name(name: &str) -> Option<NullService> {
        NullService::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// The first of [`NullService::ALL`] (Pub/Sub), the default of `gcp-sql serve-null`.
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
impl Default for NullService {
    fn default() -> Self {
        NullService::ALL[0]
    }
}

/// Every connector's handle, in the order of [`CONNECTORS`].
pub fn kinds() -> impl Iterator<Item = ConnectorKind> + Clone {
    CONNECTORS.iter().map(|d| ConnectorKind::of(d))
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
    fn every_null_service_is_listed_once() {
        for connector in kinds() {
            let listed = NullService::ALL
                .iter()
                .filter(|s| connector.descriptor().null_service.map(|m| m.name) == Some(s.name()))
                .count();
            let has = usize::from(connector.descriptor().null_service.is_some());
            assert_eq!(listed, has, "{connector}");
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
}
