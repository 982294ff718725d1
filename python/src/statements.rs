//! The `WITH (...)` form for a host that plans SQL itself: each statement as DataFusion's own
//! SQL, through the crate's rewrite (`gcp_sql::sql::rewrite_with_form`).

use datafusion::sql::parser::{CreateExternalTable, DFParser, Statement};
use datafusion::sql::sqlparser::ast::Value;
use pyo3::prelude::*;

/// The statements of `sql`, each as the text the host plans: unchanged, except a
/// `CREATE TABLE ... WITH (connector = ...)`, which becomes `CREATE EXTERNAL TABLE ... STORED
/// AS ...` (or fails as it does in Rust).
#[pyfunction]
pub fn native_statements(py: Python<'_>, sql: &str) -> PyResult<Vec<String>> {
    let to_py = |e: gcp_sql::Error| crate::to_py(py, &e);
    let mut out = Vec::new();
    for text in gcp_sql::sql::split_statements(sql).map_err(to_py)? {
        let mut parsed =
            DFParser::parse_sql(&text).map_err(|e| to_py(gcp_sql::Error::DataFusion(e)))?;
        let stmt = match (parsed.pop_front(), parsed.is_empty()) {
            (Some(stmt), true) => stmt,
            _ => {
                out.push(text);
                continue;
            }
        };
        let written_native = matches!(stmt, Statement::CreateExternalTable(_));
        let stmt = gcp_sql::sql::rewrite_with_form(stmt).map_err(to_py)?;
        if let Statement::CreateExternalTable(create) = &stmt {
            check_duplicates(create).map_err(to_py)?;
        }
        match stmt {
            Statement::CreateExternalTable(create) if !written_native => {
                out.push(render(&create).map_err(to_py)?);
            }
            _ => out.push(text),
        }
    }
    Ok(out)
}

/// An option given twice (`k` and `format.k` included) in a declaration of ours, which
/// DataFusion's option map would collapse into one before the factory sees it.
fn check_duplicates(c: &CreateExternalTable) -> Result<(), gcp_sql::Error> {
    if gcp_sql::connectors::registry::kind_named(&c.file_type).is_err() {
        return Ok(()); // not one of ours
    }
    raw_options(c).map(drop)
}

/// The options of `c` as the crate reads them (an option given twice is an error).
fn raw_options(c: &CreateExternalTable) -> Result<gcp_sql::options::RawOptions, gcp_sql::Error> {
    let pairs = c.options.iter().map(|(k, v)| {
        let text = match v {
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s.clone(),
            other => other.to_string(),
        };
        (k.clone(), text)
    });
    gcp_sql::options::RawOptions::from_pairs(pairs)
}

/// A `CREATE EXTERNAL TABLE` of the `WITH` rewrite as SQL text with its columns and options
/// (the parser's own `Display` leaves both out).
///
/// The rewrite leaves `LOCATION` empty and the destination in its option; DataFusion's FFI
/// cannot carry an empty `LOCATION` to the factory (its plan encoding refuses one), so the
/// fixed destination is repeated there (the sink accepts both when they agree), and a source's
/// resource likewise (`subscription`). A table with no fixed destination (`topic_column`, ...)
/// cannot cross that way: the error says what does.
fn render(c: &CreateExternalTable) -> Result<String, gcp_sql::Error> {
    let mut sql = String::from("CREATE ");
    if c.or_replace {
        sql.push_str("OR REPLACE ");
    }
    if c.unbounded {
        sql.push_str("UNBOUNDED ");
    }
    sql.push_str("EXTERNAL TABLE ");
    if c.if_not_exists {
        sql.push_str("IF NOT EXISTS ");
    }
    let columns: Vec<String> = c.columns.iter().map(ToString::to_string).collect();
    sql.push_str(&format!("{} ({})", c.name, columns.join(", ")));
    sql.push_str(&format!(" STORED AS {}", c.file_type));
    let mut location = c.locations.first().cloned().unwrap_or_default();
    if location.is_empty() {
        let kind = gcp_sql::connectors::registry::kind_named(&c.file_type)?;
        // What LOCATION names: a source's resource (a subscription) or the sink's destination.
        let source = kind.source_declared(None, &raw_options(c)?);
        let destination = source.map_or(kind.descriptor().destination, |s| s.location);
        let fixed = c.options.iter().find_map(|(k, v)| match v {
            Value::SingleQuotedString(v) if k == destination => Some(v.clone()),
            _ => None,
        });
        let instead = match source {
            Some(_) => String::new(),
            None => format!(
                ", or declare a per-row {destination} with gcp_sql.{}_sink(schema, ...) and \
                 ctx.register_table",
                kind.name()
            ),
        };
        location = fixed.ok_or_else(|| {
            gcp_sql::Error::Unsupported(format!(
                "table '{}' names no {destination}: in a datafusion-python session DataFusion's \
                 FFI cannot carry a declaration without one (an empty LOCATION); give \
                 {destination} = '...'{instead}",
                c.name
            ))
        })?;
    }
    sql.push_str(&format!(
        " LOCATION {}",
        Value::SingleQuotedString(location)
    ));
    if !c.options.is_empty() {
        let options: Vec<String> = c
            .options
            .iter()
            .map(|(k, v)| format!("{} {v}", Value::SingleQuotedString(k.clone())))
            .collect();
        sql.push_str(&format!(" OPTIONS ({})", options.join(", ")));
    }
    Ok(sql)
}
