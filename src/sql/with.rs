//! The Arroyo-style `CREATE TABLE ... WITH (connector = '...', ...)` form.
//!
//! DataFusion's planner refuses `WITH` on `CREATE TABLE`; this module turns such a statement
//! into the equivalent `CREATE EXTERNAL TABLE ... STORED AS <CONNECTOR>`, so both forms reach
//! the same factory and the same option parser.

use datafusion::sql::parser::{CreateExternalTable, Statement as DFStatement};
use datafusion::sql::sqlparser::ast::{
    CreateTableOptions, Expr, SqlOption, Statement, UnaryOperator, Value,
};

use crate::connectors::{ConnectorKind, catalog, registry};
use crate::error::{Error, Result};
use crate::options::nearest_name;

/// Rewrites a `CREATE TABLE ... WITH (connector = ...)` statement; returns any other statement
/// unchanged.
pub(crate) fn rewrite_with_form(stmt: DFStatement) -> Result<DFStatement> {
    let DFStatement::Statement(inner) = &stmt else {
        return Ok(stmt);
    };
    let Statement::CreateTable(create) = inner.as_ref() else {
        return Ok(stmt);
    };
    let CreateTableOptions::With(with) = &create.table_options else {
        return Ok(stmt);
    };
    let mut options = Vec::with_capacity(with.len());
    for option in with {
        let SqlOption::KeyValue { key, value } = option else {
            return Err(Error::Unsupported(format!(
                "unsupported WITH option '{option}': options are written key = 'value'"
            )));
        };
        options.push((key.value.to_lowercase(), option_value(&key.value, value)?));
    }
    let Some(connector) = options
        .iter()
        .find(|(k, _)| k == "connector")
        .map(|(_, v)| v.clone())
    else {
        return match missing_connector(&options) {
            Some(error) => Err(error),
            // Not ours: let DataFusion report what it makes of it.
            None => Ok(stmt),
        };
    };
    let kind = registry::kind_named(&connector)?;
    if create.query.is_some() {
        return Err(Error::Unsupported(
            "CREATE TABLE ... WITH (connector = ...) AS SELECT is not supported: declare the sink, then INSERT INTO it"
                .into(),
        ));
    }
    if create.columns.is_empty() {
        let name = create.name.to_string();
        return Err(Error::Unsupported(format!(
            "table '{name}' declares no columns: a sink table needs them, e.g. \
             CREATE TABLE {name} (data VARCHAR) WITH (connector = '{}', ...)",
            kind.name()
        )));
    }
    let options = options
        .into_iter()
        .filter(|(k, _)| k != "connector")
        .map(|(k, v)| (k, Value::SingleQuotedString(v)))
        .collect();
    Ok(DFStatement::CreateExternalTable(CreateExternalTable {
        name: create.name.clone(),
        columns: create.columns.clone(),
        file_type: kind.stored_as().to_string(),
        // The resource travels as an option in this form; an empty location means "none".
        locations: vec![String::new()],
        table_partition_cols: vec![],
        order_exprs: vec![],
        if_not_exists: create.if_not_exists,
        or_replace: create.or_replace,
        temporary: create.temporary,
        unbounded: false,
        options,
        constraints: create.constraints.clone(),
    }))
}

/// The error for a `WITH` list that has no `connector` but is meant for one of ours: it names
/// an option some connector accepts (`topic`, `queue`, `row_key`, ...), or an option spelt
/// close to `connector`. `None` when nothing in it is ours (DataFusion reports that statement).
///
/// The error lists the valid connector names and, when it can tell, the one meant: the value
/// of a misspelt `connector` key (or its nearest valid name), else the one connector that
/// accepts every option given.
fn missing_connector(options: &[(String, String)]) -> Option<Error> {
    let names: Vec<&str> = registry::kinds().map(|k| k.name()).collect();
    let listed = names
        .iter()
        .map(|n| format!("'{n}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let key = |k: &str| k.strip_prefix("format.").unwrap_or(k).to_string();
    let misspelt = options
        .iter()
        .find(|(k, _)| nearest_name(&key(k), std::iter::once("connector")).is_some());
    if let Some((written, value)) = misspelt {
        let meant = match registry::kind_named(value) {
            Ok(kind) => format!(" = '{}'", kind.name()),
            Err(_) => match nearest_name(&value.trim().to_ascii_lowercase(), names.iter().copied())
            {
                Some(near) => format!(" = '{near}' ('{value}' is not a connector)"),
                None => String::new(),
            },
        };
        return Some(Error::MissingOption {
            option: "connector".into(),
            rule: format!(
                "the WITH form names its service with connector = one of {listed}; \
                 '{written}' is not an option (did you mean connector{meant}?)"
            ),
        });
    }
    let ours = |kind: ConnectorKind, k: &str| catalog::lookup(kind, &key(k)).is_some();
    if !options
        .iter()
        .any(|(k, _)| registry::kinds().any(|kind| ours(kind, k)))
    {
        return None;
    }
    let fitting: Vec<ConnectorKind> = registry::kinds()
        .filter(|kind| options.iter().all(|(k, _)| ours(*kind, k)))
        .collect();
    let hint = match fitting.as_slice() {
        [kind] => format!(
            "; the options given are {}'s: add connector = '{}'",
            kind.display_name(),
            kind.name()
        ),
        _ => String::new(),
    };
    Some(Error::MissingOption {
        option: "connector".into(),
        rule: format!("the WITH form names its service with connector = one of {listed}{hint}"),
    })
}

/// Renders an option value: strings, numbers, booleans, bare identifiers and negative numbers.
fn option_value(key: &str, value: &Expr) -> Result<String> {
    match value {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => Ok(s.clone()),
            Value::Number(n, _) => Ok(n.to_string()),
            Value::Boolean(b) => Ok(b.to_string()),
            other => Err(Error::invalid(
                key,
                other.to_string(),
                "expected a quoted string, a number or a boolean",
            )),
        },
        Expr::Identifier(ident) => Ok(ident.value.clone()),
        Expr::UnaryOp {
            op: UnaryOperator::Minus,
            expr,
        } => Ok(format!("-{}", option_value(key, expr)?)),
        other => Err(Error::invalid(
            key,
            other.to_string(),
            "expected a quoted string, a number or a boolean",
        )),
    }
}
