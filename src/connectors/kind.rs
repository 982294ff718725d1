//! The connectors this crate knows, by name, and the `connector` option that names one.

use crate::error::{Error, Result};
use crate::options::{
    Bound, DefaultValue, OptionGroup, OptionKind, OptionSpec, Service, nearest_name,
};

/// The connectors this crate knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConnectorKind {
    /// Google Cloud Pub/Sub: rows become published messages.
    PubSub,
    /// Google Cloud Tasks: rows become HTTP tasks.
    CloudTasks,
    /// Google Cloud Bigtable: rows become row mutations.
    Bigtable,
}

/// `connector`: which service a table writes to. Every connector lists it; its value must
/// name the connector the table is declared for.
pub static CONNECTOR: OptionSpec = OptionSpec {
    name: "connector",
    group: OptionGroup::Connection,
    kind: OptionKind::Enum(&["pubsub", "cloud_tasks", "bigtable"]),
    default: DefaultValue::None,
    bound: Bound::None,
    cross_rule: "required in the `CREATE TABLE ... WITH` form; in `CREATE EXTERNAL TABLE` the `STORED AS` word chooses the connector and this option, if given, must agree",
    example: "pubsub",
    description: "Which service the table writes to.",
    redact: crate::options::Redact::None,
};

impl ConnectorKind {
    /// Every connector, in the order the reference lists them.
    pub const ALL: [ConnectorKind; 3] = [
        ConnectorKind::PubSub,
        ConnectorKind::CloudTasks,
        ConnectorKind::Bigtable,
    ];

    /// The name used in `connector = '...'` (`pubsub`, `cloud_tasks`, `bigtable`).
    pub fn name(self) -> &'static str {
        match self {
            ConnectorKind::PubSub => "pubsub",
            ConnectorKind::CloudTasks => "cloud_tasks",
            ConnectorKind::Bigtable => "bigtable",
        }
    }

    /// The word after `STORED AS` (`PUBSUB`, `CLOUD_TASKS`, `BIGTABLE`); DataFusion upper-cases it
    /// before looking up the table factory.
    pub fn stored_as(self) -> &'static str {
        match self {
            ConnectorKind::PubSub => "PUBSUB",
            ConnectorKind::CloudTasks => "CLOUD_TASKS",
            ConnectorKind::Bigtable => "BIGTABLE",
        }
    }

    /// The product name, for prose.
    pub fn display_name(self) -> &'static str {
        match self {
            ConnectorKind::PubSub => "Pub/Sub",
            ConnectorKind::CloudTasks => "Cloud Tasks",
            ConnectorKind::Bigtable => "Bigtable",
        }
    }

    /// The environment variable that points the connector at an emulator when the
    /// `emulator_host` option is absent.
    pub fn emulator_env_var(self) -> &'static str {
        match self {
            ConnectorKind::PubSub => "PUBSUB_EMULATOR_HOST",
            ConnectorKind::CloudTasks => "CLOUD_TASKS_EMULATOR_HOST",
            ConnectorKind::Bigtable => "BIGTABLE_EMULATOR_HOST",
        }
    }

    /// The service's public endpoint.
    pub fn public_endpoint(self) -> &'static str {
        match self {
            ConnectorKind::PubSub => "https://pubsub.googleapis.com",
            ConnectorKind::CloudTasks => "https://cloudtasks.googleapis.com",
            ConnectorKind::Bigtable => "https://bigtable.googleapis.com",
        }
    }

    /// What the connection options need to know of the connector's service.
    pub fn service(self) -> Service {
        Service {
            emulator_env_var: self.emulator_env_var(),
            public_endpoint: self.public_endpoint(),
        }
    }

    /// Parses a connector name, case-insensitively (`pubsub`, `PUBSUB`, `cloud_tasks`, ...).
    /// An unknown name is an [`Error::InvalidOption`] on `connector`, with the nearest name.
    pub fn parse(text: &str) -> Result<Self> {
        let t = text.trim();
        if let Some(kind) = Self::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(t))
        {
            return Ok(kind);
        }
        let names: Vec<&str> = Self::ALL.iter().map(|k| k.name()).collect();
        let lower = t.to_ascii_lowercase();
        let hint = nearest_name(&lower, names.iter().copied())
            .map(|s| format!(" (did you mean '{s}'?)"))
            .unwrap_or_default();
        Err(Error::invalid(
            "connector",
            text,
            format!("expected one of {}{hint}", names.join(", ")),
        ))
    }
}

impl std::fmt::Display for ConnectorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connector_names_round_trip() {
        for kind in ConnectorKind::ALL {
            assert_eq!(ConnectorKind::parse(kind.name()).unwrap(), kind);
            assert_eq!(ConnectorKind::parse(kind.stored_as()).unwrap(), kind);
        }
        let err = ConnectorKind::parse("pubsb").unwrap_err().to_string();
        assert!(err.contains("did you mean 'pubsub'"), "{err}");
    }

    #[test]
    fn the_connector_option_lists_every_connector() {
        let OptionKind::Enum(words) = CONNECTOR.kind else {
            panic!("connector is an enum option");
        };
        let names: Vec<&str> = ConnectorKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(words, names.as_slice());
    }
}
