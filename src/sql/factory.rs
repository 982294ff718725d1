//! `STORED AS PUBSUB | CLOUD_TASKS | BIGTABLE`: the [`TableProviderFactory`] of each connector,
//! which makes its sink tables and, for a connector with a source, its source tables.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider, TableProviderFactory};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::logical_expr::CreateExternalTable;
use datafusion::sql::sqlparser::ast::Value;

use crate::connectors;
use crate::connectors::ConnectorKind;
use crate::connectors::{catalog, registry};
use crate::error::{Error, Result};
use crate::options::expand::{Expanded, expand_options};
use crate::options::{ConnectionOptions, DefaultValue, EnvLookup, OptionSpec, RawOptions, common};

use super::spec::SinkSpec;
use super::table::SinkTable;

/// Creates the tables of one connector from `CREATE EXTERNAL TABLE` statements (and the
/// `WITH` form rewritten into one): a [`SinkTable`], or, when the connector has a source and
/// the declaration names one ([`ConnectorKind::source_declared`]: a subscription), the table
/// its [`SourceDescriptor`](crate::connectors::SourceDescriptor) declares.
///
/// Constructing the table checks every option and the schema, and contacts no service.
///
/// ```
/// use gcp_sql::connectors::registry;
/// use gcp_sql::options::RawOptions;
/// use gcp_sql::sql::ConnectorTableFactory;
///
/// let pubsub = ConnectorTableFactory::new(registry::kind_named("pubsub")?);
/// let raw = RawOptions::from_pairs(Vec::<(String, String)>::new())?;
/// assert!(pubsub.kind().source_declared(Some("projects/p/subscriptions/s"), &raw).is_some());
/// assert!(pubsub.kind().source_declared(Some("projects/p/topics/t"), &raw).is_none());
/// # Ok::<(), gcp_sql::Error>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct ConnectorTableFactory {
    kind: ConnectorKind,
}

impl ConnectorTableFactory {
    /// A factory for `kind`.
    pub fn new(kind: ConnectorKind) -> Self {
        Self { kind }
    }

    /// The connector this factory creates tables for.
    pub fn kind(&self) -> ConnectorKind {
        self.kind
    }

    /// The table `cmd` declares: the connector's source table when the declaration names a
    /// source, else its sink table.
    ///
    /// `${NAME}` in an option value is expanded from the process environment first
    /// ([`crate::options::expand`]); the declaration a sink keeps for display holds the values
    /// as written, and an error about an expanded value names its variable instead.
    pub fn create_table(&self, cmd: &CreateExternalTable) -> Result<Arc<dyn TableProvider>> {
        let declared = declared(cmd, &ConnectionOptions::process_env)?;
        let (location, raw) = (declared.location, &declared.expanded);
        match self.kind.source_declared(location, raw) {
            Some(source) => {
                let schema = Arc::new(cmd.schema.as_arrow().clone());
                (source.declare)(&cmd.name.to_string(), schema, location, raw)
                    .map_err(|e| declared.substituted.scrub(e))
            }
            None => Ok(Arc::new(
                self.create_sink(cmd, &declared)
                    .map_err(|e| declared.substituted.scrub(e))?,
            )),
        }
    }

    fn create_sink(&self, cmd: &CreateExternalTable, declared: &Declared<'_>) -> Result<SinkTable> {
        // DataFusion hands the options over as a map, in which `k` and `format.k` may already
        // have collapsed into one entry (the last one wins). Statements that go through
        // `crate::sql` are checked for that before planning (`check_raw_option_names`); the
        // statement text in `cmd.definition` does not carry the options, so it cannot help here.
        // The names, types and bounds are checked once, by the connector's `from_raw` that
        // `build_sink` calls.
        let location = declared.location;
        let schema = Arc::new(cmd.schema.as_arrow().clone());
        // The spec keeps what the declaration resolved (the emulator variable included), so
        // that a cluster's executors rebuild the same sink (`crate::cluster`).
        let (sink, spec) = SinkSpec::declare(
            cmd.name.to_string(),
            self.kind,
            schema,
            location,
            &declared.expanded,
            &ConnectionOptions::process_env,
        )?;
        Ok(SinkTable::new(cmd.name.to_string(), sink)
            .with_declaration(SinkDeclaration::new(self.kind, location, &declared.written))
            .with_spec(spec))
    }
}

/// What a `CREATE` statement declared for a sink table: the connector, the `LOCATION` and the
/// options as given (names normalised), with the values that may carry a secret redacted as
/// their option spec says ([`OptionSpec::redact`]).
///
/// For example, a Cloud Tasks `url` keeps only its origin (scheme, host and port: a URL may carry a user
/// name, a password or an API key in its query) and `headers` keeps only the header names (a
/// header may carry a token). `credentials_file` is a path and is kept.
///
/// ```
/// use gcp_sql::connectors::ConnectorKind;
/// use gcp_sql::options::RawOptions;
/// use gcp_sql::sql::SinkDeclaration;
///
/// let raw = RawOptions::from_pairs([
///     ("url".to_string(), "https://user:pw@worker.example.com/run?key=SECRET".to_string()),
///     ("headers".to_string(), "Authorization: Bearer SECRET; X-Source: demo".to_string()),
/// ])?;
/// let cloud_tasks = gcp_sql::connectors::registry::kind_named("cloud_tasks")?;
/// let d = SinkDeclaration::new(cloud_tasks, Some("projects/p/locations/l/queues/q"), &raw);
/// assert_eq!(d.given("url"), Some("https://worker.example.com/... (rest hidden)"));
/// assert_eq!(d.given("headers"), Some("Authorization, X-Source (values hidden)"));
/// let queue = d.in_force().into_iter().find(|o| o.name == "queue").unwrap();
/// assert_eq!(queue.value, "projects/p/locations/l/queues/q");
/// assert!(!format!("{d:?}").contains("SECRET"));
/// # Ok::<(), gcp_sql::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkDeclaration {
    kind: ConnectorKind,
    location: Option<String>,
    options: Vec<(String, String)>,
}

/// One option of a declared sink table as it is in force: the value given, or the default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionInForce {
    /// The option name.
    pub name: &'static str,
    /// The value given (redacted where it may carry a secret), or `(default: X)`.
    pub value: String,
    /// Whether the user gave the value (in `OPTIONS`, `WITH` or as `LOCATION`).
    pub given: bool,
}

impl SinkDeclaration {
    /// Records a declaration of `kind` from its `LOCATION` (empty means none) and options,
    /// redacting the values that may carry a secret.
    pub fn new(kind: ConnectorKind, location: Option<&str>, raw: &RawOptions) -> Self {
        let options = raw
            .iter()
            .map(|(name, value)| {
                let shown = match catalog::lookup(kind, name) {
                    Some(spec) => shown_value(spec, value),
                    None => value.to_string(),
                };
                (name.to_string(), shown)
            })
            .collect();
        Self {
            kind,
            location: location.filter(|l| !l.is_empty()).map(str::to_string),
            options,
        }
    }

    /// The connector of the table.
    pub fn kind(&self) -> ConnectorKind {
        self.kind
    }

    /// The `LOCATION` given, if any.
    pub fn location(&self) -> Option<&str> {
        self.location.as_deref()
    }

    /// The options as given (normalised names, redacted values), in the order written.
    pub fn options(&self) -> impl Iterator<Item = (&str, &str)> {
        self.options.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// The (redacted) value given for option `name`, if any.
    pub fn given(&self, name: &str) -> Option<&str> {
        self.options
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Where the rows go, as declared: the fixed destination (`topic projects/p/topics/t`),
    /// the column that names one per row (`topic from column 'name' per row`), or `None`
    /// when neither was given (the declaration would have been refused).
    pub fn destination(&self) -> Option<String> {
        let word = self.kind.descriptor().destination;
        if let Some(fixed) = self.location().or_else(|| self.given(word)) {
            return Some(format!("{word} {fixed}"));
        }
        let column = format!("{word}_column");
        self.given(&column)
            .map(|c| format!("{word} from column '{c}' per row"))
    }

    /// Every option of the connector in the order the reference lists them, each with the
    /// value given or its default. `connector` shows the table's connector; the destination
    /// option (`topic`, `queue`, `table`) shows the `LOCATION` when that was given instead.
    pub fn in_force(&self) -> Vec<OptionInForce> {
        let destination = self.kind.descriptor().destination;
        catalog::options_for(self.kind)
            .map(|spec| {
                let given = if std::ptr::eq(spec, &registry::CONNECTOR) {
                    Some(self.kind.name())
                } else if spec.name == destination {
                    self.given(spec.name).or(self.location())
                } else {
                    self.given(spec.name)
                };
                match given {
                    Some(value) => OptionInForce {
                        name: spec.name,
                        value: value.to_string(),
                        given: true,
                    },
                    None => OptionInForce {
                        name: spec.name,
                        value: format!("(default: {})", self.default_text(spec)),
                        given: false,
                    },
                }
            })
            .collect()
    }
}

impl SinkDeclaration {
    /// The default of `spec` in words: the reference's text without its Markdown; for an
    /// unset option, what happens then; for `emulator_host`, the variable of this connector.
    fn default_text(&self, spec: &OptionSpec) -> String {
        if std::ptr::eq(spec, &common::EMULATOR_HOST) {
            // The address in force, not the rule: what the variable says now (the tool sets it
            // once, before any statement, with --emulators).
            let var = self.kind.emulator_env_var();
            return match std::env::var(var).ok().filter(|v| !v.trim().is_empty()) {
                Some(host) => format!("{}, from ${var}", host.trim()),
                None => format!("none, ${var} is unset: the service's own endpoint"),
            };
        }
        let text = match spec.default {
            DefaultValue::Unset(what) => what.to_string(),
            other => other.text(),
        };
        text.replace('`', "")
    }
}

/// The value of `spec` as a declaration keeps it: redacted where its spec says it may carry a
/// secret ([`OptionSpec::redact`]).
fn shown_value(spec: &'static OptionSpec, value: &str) -> String {
    spec.redact.shown(value)
}

#[async_trait]
impl TableProviderFactory for ConnectorTableFactory {
    async fn create(
        &self,
        _state: &dyn Session,
        cmd: &CreateExternalTable,
    ) -> DFResult<Arc<dyn TableProvider>> {
        Ok(self.create_table(cmd)?)
    }
}

/// What a `CREATE EXTERNAL TABLE` declares: its `LOCATION` (`None` when empty) and its
/// options, as written and with `${NAME}` expanded.
struct Declared<'a> {
    location: Option<&'a str>,
    /// The options as written (`${NAME}` kept): what a declaration shows.
    written: RawOptions,
    /// The options the connector reads.
    expanded: RawOptions,
    /// What came from the environment, to keep it out of errors.
    substituted: Expanded,
}

/// The `LOCATION` and the options of a `CREATE EXTERNAL TABLE`, expanded through `env`.
fn declared<'a>(cmd: &'a CreateExternalTable, env: EnvLookup<'_>) -> Result<Declared<'a>> {
    let pairs: Vec<(String, String)> = cmd
        .options
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let written = RawOptions::from_pairs(pairs)?;
    // Expanded under the normalised names, so that an error names the option as written in
    // `WITH` (DataFusion prefixes `OPTIONS` keys with `format.`).
    let pairs = written
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let (pairs, substituted) = expand_options(pairs, env)?;
    let expanded = RawOptions::from_pairs(pairs)?;
    let location = cmd
        .locations
        .first()
        .map(String::as_str)
        .filter(|l| !l.is_empty());
    Ok(Declared {
        location,
        written,
        expanded,
        substituted,
    })
}

fn value_text(v: &Value) -> String {
    match v {
        Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Checks the option names of a parsed `CREATE EXTERNAL TABLE` of one of our connectors for
/// duplicates before DataFusion plans it, so that a name written as `k` and `format.k` is
/// caught whichever comes first: DataFusion's option map would keep only the last.
///
/// Everything else (unknown names with the nearest valid one, types, bounds, cross-option
/// rules) is checked once, when the table factory builds the connector's options. When
/// DataFusion will not call the factory (`IF NOT EXISTS` naming a table that exists,
/// `factory_skipped`), the names, types and bounds are checked here instead, so that a
/// misspelt option is an error whether or not the table was declared before.
pub(crate) fn check_raw_option_names(
    file_type: &str,
    options: &[(String, Value)],
    factory_skipped: bool,
) -> Result<()> {
    let Ok(kind) = registry::kind_named(file_type) else {
        return Ok(()); // not one of ours
    };
    let raw = RawOptions::from_pairs(options.iter().map(|(k, v)| (k.clone(), value_text(v))))?;
    if factory_skipped {
        let pairs: Vec<(String, String)> = raw
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let (pairs, substituted) = expand_options(pairs, &ConnectionOptions::process_env)?;
        let raw = RawOptions::from_pairs(pairs)?;
        let checked = match kind.source_declared(None, &raw) {
            Some(source) => kind.parse_options_of((source.options)(), &raw).map(|_| ()),
            None => connectors::catalog::parse_options(kind, &raw).map(|_| ()),
        };
        checked.map_err(|e| substituted.scrub(e))?;
    }
    Ok(())
}

/// The error of a statement DataFusion ran: a sink's own error (an option or schema check of
/// the table factory) as itself, rather than wrapped as DataFusion's "External error".
///
/// The factory is the one place the options of a `CREATE` are parsed and checked, so its
/// errors reach the caller the way the SQL layer's own checks do.
/// `STORED AS <file_type>` naming no registered table factory: an error naming the type, the
/// nearest registered one (`PUB_SUB` -> `PUBSUB`) and every one there is, where DataFusion says
/// only `Unable to find factory for PUB_SUB`. `known` are the registered names (upper case, as
/// DataFusion keys them).
pub(crate) fn check_file_type<'a>(
    file_type: &str,
    known: impl Iterator<Item = &'a str> + Clone,
) -> Result<()> {
    let wanted = file_type.to_ascii_uppercase();
    if known.clone().any(|k| k == wanted) {
        return Ok(());
    }
    let squashed = |name: &str| name.replace(['_', '-', ' '], "");
    // `PUB_SUB`, `CLOUD-TASKS`, `Big_Table`: the same letters with other separators.
    let suggestion = known
        .clone()
        .find(|k| squashed(k) == squashed(&wanted))
        .or_else(|| crate::options::nearest_name(&wanted, known.clone()));
    let mut names: Vec<&str> = known.collect();
    names.sort_unstable();
    Err(Error::Unsupported(format!(
        "unknown STORED AS type '{file_type}'{}; the types are {}",
        suggestion
            .map(|s| format!(" (did you mean '{s}'?)"))
            .unwrap_or_default(),
        names.join(", ")
    )))
}

pub(crate) fn statement_error(e: DataFusionError) -> Error {
    match e {
        DataFusionError::External(inner) => match inner.downcast::<Error>() {
            Ok(own) => *own,
            Err(other) => Error::DataFusion(DataFusionError::External(other)),
        },
        other => Error::DataFusion(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{assert_contains_all, error_text};

    async fn declaration_of(sql: &str, table: &str) -> Option<SinkDeclaration> {
        let ctx = crate::sql::new_context();
        crate::sql::run(&ctx, sql).await.unwrap();
        let provider = ctx.table_provider(table).await.unwrap();
        provider
            .downcast_ref::<SinkTable>()
            .unwrap()
            .declaration()
            .cloned()
    }

    #[tokio::test]
    async fn an_unknown_stored_as_type_names_the_nearest_one() {
        let ctx = crate::sql::new_context();
        for (sql, parts) in [
            (
                "CREATE EXTERNAL TABLE t (a VARCHAR) STORED AS PUB_SUB LOCATION 'projects/p/topics/t'",
                &[
                    "unknown STORED AS type 'PUB_SUB' (did you mean 'PUBSUB'?)",
                    "CLOUD_TASKS",
                ][..],
            ),
            (
                "CREATE EXTERNAL TABLE t (a VARCHAR) STORED AS BIGTABEL LOCATION 'projects/p/instances/i/tables/t'",
                &["(did you mean 'BIGTABLE'?)"],
            ),
        ] {
            assert_contains_all(&error_text(crate::sql::run(&ctx, sql).await), parts);
        }
        // Known types, any case, still plan.
        crate::sql::run(
            &ctx,
            "CREATE EXTERNAL TABLE ok (a VARCHAR) STORED AS pubsub LOCATION 'projects/p/topics/clicks'",
        )
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn both_sql_forms_keep_their_declaration() {
        let with = declaration_of(
            "CREATE TABLE t (topic VARCHAR, data VARCHAR) WITH (connector = 'pubsub', \
             topic_column = 'topic', MAX_IN_FLIGHT_MESSAGES = 10)",
            "t",
        )
        .await
        .unwrap();
        assert_eq!(with.kind(), crate::connectors::pubsub::KIND);
        assert_eq!(with.location(), None);
        assert_eq!(with.given("max_in_flight_messages"), Some("10"));
        assert_eq!(
            with.destination().as_deref(),
            Some("topic from column 'topic' per row")
        );
        let native = declaration_of(
            "CREATE EXTERNAL TABLE b (k VARCHAR, v VARCHAR) STORED AS BIGTABLE \
             LOCATION 'projects/p/instances/i/tables/t' OPTIONS ('row_key' 'k', 'column_family' 'c')",
            "b",
        )
        .await
        .unwrap();
        assert_eq!(native.location(), Some("projects/p/instances/i/tables/t"));
        assert_eq!(native.given("row_key"), Some("k"));
        assert_eq!(
            native.destination().as_deref(),
            Some("table projects/p/instances/i/tables/t")
        );
    }

    #[tokio::test]
    async fn one_factory_makes_a_connectors_sinks_and_its_sources() {
        let ctx = crate::sql::new_context();
        crate::sql::run(
            &ctx,
            "CREATE UNBOUNDED EXTERNAL TABLE src (data VARCHAR) STORED AS PUBSUB \
             LOCATION 'projects/p/subscriptions/clicks';
             CREATE TABLE src2 (data VARCHAR) WITH (connector = 'pubsub', \
             subscription = 'projects/p/subscriptions/clicks');
             CREATE EXTERNAL TABLE out (data VARCHAR) STORED AS PUBSUB \
             LOCATION 'projects/p/topics/clicks'",
        )
        .await
        .unwrap();
        let pubsub = crate::connectors::pubsub::KIND;
        let source = pubsub.descriptor().source.unwrap();
        for name in ["src", "src2"] {
            let table = ctx.table_provider(name).await.unwrap();
            assert!((source.is_table)(table.as_ref()), "{name}");
        }
        let sink = ctx.table_provider("out").await.unwrap();
        assert!(sink.downcast_ref::<SinkTable>().is_some());
        assert!(!(source.is_table)(sink.as_ref()));

        // The one question every caller asks: is this declaration a source's?
        let none = RawOptions::from_pairs(Vec::<(String, String)>::new()).unwrap();
        let typed = RawOptions::from_pairs([("type".to_string(), "source".to_string())]).unwrap();
        assert!(pubsub.source_declared(None, &typed).is_some());
        assert!(pubsub.source_declared(None, &none).is_none());
        let bigtable = crate::connectors::bigtable::KIND;
        let table = Some("projects/p/instances/i/tables/subscriptions");
        assert!(bigtable.source_declared(table, &typed).is_none());
    }

    #[test]
    fn every_option_is_in_force_once_with_a_value_or_its_default() {
        let raw =
            RawOptions::from_pairs([("format.max_in_flight_tasks".to_string(), "7".to_string())])
                .unwrap();
        let declaration = SinkDeclaration::new(crate::connectors::cloud_tasks::KIND, None, &raw);
        let in_force = declaration.in_force();
        let names: Vec<&str> = in_force.iter().map(|o| o.name).collect();
        let expected: Vec<&str> = catalog::options_for(crate::connectors::cloud_tasks::KIND)
            .map(|s| s.name)
            .collect();
        assert_eq!(names, expected);
        for option in &in_force {
            match option.name {
                "connector" => assert_eq!(option.value, "cloud_tasks"),
                "max_in_flight_tasks" => assert_eq!(option.value, "7"),
                "http_method" => assert_eq!(option.value, "(default: POST)"),
                "emulator_host" => {
                    assert_eq!(
                        option.value,
                        "(default: none, $CLOUD_TASKS_EMULATOR_HOST is unset: the service's own endpoint)"
                    )
                }
                _ => assert!(option.value.starts_with("(default: "), "{option:?}"),
            }
            assert_eq!(
                option.given,
                matches!(option.name, "connector" | "max_in_flight_tasks")
            );
            assert!(!option.value.contains('`'), "{option:?}");
        }
    }
}
