//! The Arroyo-style `CREATE TABLE ... WITH (connector = '...', ...)` form.
//!
//! DataFusion's planner refuses `WITH` on `CREATE TABLE`; this module turns such a statement
//! into the equivalent `CREATE EXTERNAL TABLE ... STORED AS <CONNECTOR>`, so both forms reach
//! the same factory and the same option parser.

use datafusion::sql::parser::{CreateExternalTable, Statement as DFStatement};
use datafusion::sql::sqlparser::ast::{
    CreateTableOptions, Expr, SqlOption, Statement, UnaryOperator, Value,
};

use crate::connectors::ConnectorKind;
use crate::error::{Error, Result};

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
        // Not ours: let DataFusion report what it makes of it.
        return Ok(stmt);
    };
    let kind = ConnectorKind::parse(&connector)?;
    if create.query.is_some() {
        return Err(Error::Unsupported(
            "CREATE TABLE ... WITH (connector = ...) AS SELECT is not supported: declare the sink, then INSERT INTO it"
                .into(),
        ));
    }
    if create.columns.is_empty() {
        return Err(Error::schema(
            create.name.to_string(),
            "a sink table needs its columns declared".to_string(),
        ));
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
