//! What a declared sink table is made from, in a form that can be sent to another process and
//! rebuilt there into the same sink: [`SinkSpec`].
//!
//! A Ballista cluster (feature `ballista`, `crate::cluster`) plans an `INSERT` on its scheduler
//! and runs the writers on its executors, so the table travels in the plan. It travels as its
//! declaration (connector, `LOCATION`, the options as checked when it was declared, the table
//! schema) plus the one thing the declaration read from the environment: the emulator address
//! of the connector's variable (`PUBSUB_EMULATOR_HOST`, ...). The process that rebuilds it reads
//! no emulator variable of its own, so an executor writes where the client's declaration said,
//! whatever its own environment holds. Credentials never travel: the rebuilt sink reads
//! Application Default Credentials (or the `credentials_file` path it names) where it runs.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;

use crate::connectors::registry;
use crate::connectors::{ConnectorKind, SinkConnector};
use crate::error::{Error, Result};
use crate::options::{ConnectionOptions, EmulatorSource, EnvLookup, RawOptions};

use super::factory::SinkDeclaration;

/// A sink table's declaration as it was resolved when the table was declared, enough to
/// rebuild the same sink in another process ([`SinkSpec::build`]).
///
/// Its `Debug` form names the options but shows none of their values (a Cloud Tasks `url` or
/// `headers` value may carry a secret).
#[derive(Clone, PartialEq, Eq)]
pub struct SinkSpec {
    table: String,
    kind: ConnectorKind,
    location: Option<String>,
    options: Vec<(String, String)>,
    schema: SchemaRef,
    emulator_from_env: Option<String>,
    emulator_host: Option<String>,
    endpoint: Option<String>,
}

/// The sink a declaration builds, and the connection its options resolve to.
fn resolve(
    kind: ConnectorKind,
    schema: &SchemaRef,
    location: Option<&str>,
    raw: &RawOptions,
    env: EnvLookup<'_>,
) -> Result<(Arc<dyn SinkConnector>, ConnectionOptions)> {
    let declared = registry::declare(kind, schema.clone(), location, raw, env)?;
    Ok((declared.sink, declared.connection))
}

impl SinkSpec {
    /// Declares table `table` of `kind`: checks the options and the schema as the table
    /// factory does (the emulator variable read through `env`), and returns the sink with
    /// the spec that rebuilds it.
    pub fn declare(
        table: impl Into<String>,
        kind: ConnectorKind,
        schema: SchemaRef,
        location: Option<&str>,
        raw: &RawOptions,
        env: EnvLookup<'_>,
    ) -> Result<(Arc<dyn SinkConnector>, SinkSpec)> {
        let location = location.filter(|l| !l.is_empty());
        let (sink, connection) = resolve(kind, &schema, location, raw, env)?;
        let emulator_from_env = connection
            .emulator
            .as_ref()
            .filter(|e| matches!(e.source, EmulatorSource::EnvVar(_)))
            .map(|e| e.host.clone());
        let spec = SinkSpec {
            table: table.into(),
            kind,
            location: location.map(str::to_string),
            options: raw
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            schema,
            emulator_from_env,
            emulator_host: connection.emulator.map(|e| e.host),
            endpoint: connection.endpoint,
        };
        Ok((sink, spec))
    }

    /// A spec from its parts, as a codec decodes them; [`SinkSpec::build`] checks them.
    #[allow(clippy::too_many_arguments)]
    pub fn from_parts(
        table: String,
        kind: ConnectorKind,
        location: Option<String>,
        options: Vec<(String, String)>,
        schema: SchemaRef,
        emulator_from_env: Option<String>,
        emulator_host: Option<String>,
        endpoint: Option<String>,
    ) -> SinkSpec {
        SinkSpec {
            table,
            kind,
            location,
            options,
            schema,
            emulator_from_env,
            emulator_host,
            endpoint,
        }
    }

    /// Rebuilds the sink: the options are checked again, with the emulator variable answered
    /// by the value the declaring process read (no variable of this process is consulted), and
    /// the connection they resolve to must be the one resolved at declaration.
    pub fn build(&self) -> Result<Arc<dyn SinkConnector>> {
        let raw = RawOptions::from_pairs(self.options.iter().cloned())?;
        let var = self.kind.emulator_env_var();
        let from_declaration = self.emulator_from_env.clone();
        let env = move |name: &str| {
            if name == var {
                from_declaration.clone()
            } else {
                None
            }
        };
        let (sink, connection) = resolve(self.kind, &self.schema, self.location(), &raw, &env)?;
        let emulator = connection.emulator.map(|e| e.host);
        if emulator != self.emulator_host || connection.endpoint != self.endpoint {
            return Err(Error::Unsupported(format!(
                "table '{}': the connection rebuilt from its declaration ({}) is not the one \
                 resolved when it was declared ({})",
                self.table,
                describe(emulator.as_deref(), connection.endpoint.as_deref()),
                describe(self.emulator_host.as_deref(), self.endpoint.as_deref()),
            )));
        }
        Ok(sink)
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The connector.
    pub fn kind(&self) -> ConnectorKind {
        self.kind
    }

    /// The `LOCATION` given, if any.
    pub fn location(&self) -> Option<&str> {
        self.location.as_deref()
    }

    /// The options as given (normalised names, values as written).
    pub fn options(&self) -> &[(String, String)] {
        &self.options
    }

    /// The table schema.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The value of the connector's emulator variable that the declaration used, when the
    /// emulator address came from it.
    pub fn emulator_from_env(&self) -> Option<&str> {
        self.emulator_from_env.as_deref()
    }

    /// The emulator address resolved at declaration (from the option or the variable).
    pub fn emulator_host(&self) -> Option<&str> {
        self.emulator_host.as_deref()
    }

    /// The service endpoint resolved at declaration (the `endpoint` option), if any.
    pub fn endpoint(&self) -> Option<&str> {
        self.endpoint.as_deref()
    }

    /// Where the rows go, as the declaration says it, with secret-bearing values redacted
    /// (see [`SinkDeclaration::destination`]).
    pub fn destination(&self) -> String {
        let raw = RawOptions::from_pairs(self.options.iter().cloned());
        raw.ok()
            .and_then(|raw| SinkDeclaration::new(self.kind, self.location(), &raw).destination())
            .unwrap_or_else(|| "(destination not declared)".to_string())
    }
}

fn describe(emulator: Option<&str>, endpoint: Option<&str>) -> String {
    match (emulator, endpoint) {
        (Some(host), _) => format!("emulator {host}"),
        (None, Some(endpoint)) => format!("endpoint {endpoint}"),
        (None, None) => "the public endpoint".to_string(),
    }
}

impl fmt::Debug for SinkSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.options.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("SinkSpec")
            .field("table", &self.table)
            .field("kind", &self.kind)
            .field("location", &self.location)
            .field("options", &names)
            .field("columns", &self.schema.fields().len())
            .field("emulator_host", &self.emulator_host)
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::raw_options;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new("data", DataType::Utf8, false)]))
    }

    #[test]
    fn the_emulator_of_the_declaring_environment_is_kept_and_the_rebuilding_one_ignored() {
        let declared_env =
            |name: &str| (name == "PUBSUB_EMULATOR_HOST").then(|| "localhost:8681".to_string());
        let (_, spec) = SinkSpec::declare(
            "t",
            crate::connectors::pubsub::KIND,
            schema(),
            Some("projects/demo/topics/events"),
            &raw_options(&[]),
            &declared_env,
        )
        .unwrap();
        assert_eq!(spec.emulator_from_env(), Some("localhost:8681"));
        assert_eq!(spec.emulator_host(), Some("localhost:8681"));
        // Rebuilding consults no variable of this process, and resolves the same emulator.
        spec.build().unwrap();

        let (_, public) = SinkSpec::declare(
            "t",
            crate::connectors::pubsub::KIND,
            schema(),
            Some("projects/demo/topics/events"),
            &raw_options(&[]),
            &|_| None,
        )
        .unwrap();
        assert_eq!(public.emulator_host(), None);
        public.build().unwrap();
    }

    #[test]
    fn a_spec_whose_connection_does_not_resolve_as_declared_is_refused() {
        let (_, spec) = SinkSpec::declare(
            "t",
            crate::connectors::pubsub::KIND,
            schema(),
            Some("projects/demo/topics/events"),
            &raw_options(&[("emulator_host", "localhost:8085")]),
            &|_| None,
        )
        .unwrap();
        let tampered = SinkSpec {
            emulator_host: Some("localhost:9999".into()),
            ..spec
        };
        let err = tampered.build().unwrap_err().to_string();
        assert!(
            err.contains("emulator localhost:8085") && err.contains("emulator localhost:9999"),
            "{err}"
        );
    }

    #[test]
    fn debug_shows_option_names_and_no_values() {
        let (_, spec) = SinkSpec::declare(
            "jobs",
            crate::connectors::cloud_tasks::KIND,
            Arc::new(Schema::new(vec![Field::new("body", DataType::Utf8, false)])),
            Some("projects/demo/locations/us-central1/queues/jobs"),
            &raw_options(&[
                ("url", "https://worker.example.com/run?key=SECRET"),
                ("headers", "Authorization: Bearer SECRET"),
            ]),
            &|_| None,
        )
        .unwrap();
        let shown = format!("{spec:?}");
        assert!(
            shown.contains("url") && shown.contains("headers"),
            "{shown}"
        );
        assert!(!shown.contains("SECRET"), "{shown}");
        assert_eq!(
            spec.destination(),
            "queue projects/demo/locations/us-central1/queues/jobs"
        );
    }
}
