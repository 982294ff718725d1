//! `STORED AS PUBSUB | CLOUD_TASKS | BIGTABLE`: the [`TableProviderFactory`] of each connector.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider, TableProviderFactory};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::logical_expr::CreateExternalTable;
use datafusion::sql::sqlparser::ast::Value;

use crate::connectors;
use crate::connectors::ConnectorKind;
use crate::error::{Error, Result};
use crate::options::RawOptions;

use super::table::SinkTable;

/// Creates sink tables of one connector from `CREATE EXTERNAL TABLE` statements.
///
/// Constructing the table checks every option and the schema, and contacts no service.
#[derive(Debug, Clone, Copy)]
pub struct SinkTableFactory {
    kind: ConnectorKind,
}

impl SinkTableFactory {
    /// A factory for `kind`.
    pub fn new(kind: ConnectorKind) -> Self {
        Self { kind }
    }

    /// The connector this factory creates tables for.
    pub fn kind(&self) -> ConnectorKind {
        self.kind
    }

    fn create_table(&self, cmd: &CreateExternalTable) -> Result<SinkTable> {
        // DataFusion hands the options over as a map, in which `k` and `format.k` may already
        // have collapsed into one entry (the last one wins). Statements that go through
        // `crate::sql` are checked for that before planning (`check_raw_option_names`); the
        // statement text in `cmd.definition` does not carry the options, so it cannot help here.
        // The names, types and bounds are checked once, by the connector's `from_raw` that
        // `build_sink` calls.
        let pairs: Vec<(String, String)> = cmd
            .options
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let raw = RawOptions::from_pairs(pairs)?;
        let location = cmd
            .locations
            .first()
            .map(String::as_str)
            .filter(|l| !l.is_empty());
        let schema = Arc::new(cmd.schema.as_arrow().clone());
        let sink = connectors::build_sink(self.kind, schema, location, &raw)?;
        Ok(SinkTable::new(cmd.name.to_string(), sink))
    }
}

#[async_trait]
impl TableProviderFactory for SinkTableFactory {
    async fn create(
        &self,
        _state: &dyn Session,
        cmd: &CreateExternalTable,
    ) -> DFResult<Arc<dyn TableProvider>> {
        Ok(Arc::new(self.create_table(cmd)?))
    }
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
    let Ok(kind) = ConnectorKind::parse(file_type) else {
        return Ok(()); // not one of ours
    };
    let raw = RawOptions::from_pairs(options.iter().map(|(k, v)| (k.clone(), value_text(v))))?;
    if factory_skipped {
        connectors::catalog::parse_options(kind, &raw)?;
    }
    Ok(())
}

/// The error of a statement DataFusion ran: a sink's own error (an option or schema check of
/// the table factory) as itself, rather than wrapped as DataFusion's "External error".
///
/// The factory is the one place the options of a `CREATE` are parsed and checked, so its
/// errors reach the caller the way the SQL layer's own checks do.
pub(crate) fn statement_error(e: DataFusionError) -> Error {
    match e {
        DataFusionError::External(inner) => match inner.downcast::<Error>() {
            Ok(own) => *own,
            Err(other) => Error::DataFusion(DataFusionError::External(other)),
        },
        other => Error::DataFusion(other),
    }
}
