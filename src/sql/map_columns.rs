//! `MAP(VARCHAR, VARCHAR)` columns in a sink's declaration (ADR 0029).
//!
//! DataFusion's SQL planner refuses a `MAP` column type (its `convert_data_type` has no arm
//! for it), although sqlparser reads `MAP(K, V)` and DataFusion evaluates maps (`map(...)`,
//! `make_map(...)`). A sink's `attributes_column` (Pub/Sub) and `headers_column` (Cloud Tasks)
//! read a map of strings, so a sink declared in SQL needs one. Both declaration forms reach this
//! module as a `CREATE EXTERNAL TABLE` (the `WITH` form is rewritten first, ADR 0010):
//!
//! 1. [`take_map_columns`] finds the columns typed `MAP(K, V)` of a statement stored as one of
//!    our connectors, checks that `K` and `V` are string types, and puts a plain `VARCHAR` in
//!    their place, so DataFusion plans the statement as usual;
//! 2. [`restore_map_columns`] gives those columns their map type back in the planned
//!    `CreateExternalTable`, before the table factory sees its schema.
//!
//! The map type is the one DataFusion's `map` and `make_map` functions return: entries named
//! `entries`, a non-null `key` and a nullable `value`, not sorted. The key is always `Utf8`, and
//! the value is the string type a `VARCHAR` column gets in the session (`Utf8`, or `Utf8View`
//! under `datafusion.sql_parser.map_string_types_to_utf8view`, DataFusion 55's default). The key
//! is `Utf8` because a map is looked up by name (`attrs['source']` on a source's
//! `attributes_column`), and DataFusion 55 compares the map's keys with the subscript, a `Utf8`
//! literal, without casting either: `Utf8View` keys fail that lookup with "Invalid comparison
//! operation: Utf8 == Utf8View". `map(['k'], [v])` inserts into it as it is, and an INSERT
//! casts any other string map to it.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Fields, Schema};
use datafusion::common::DFSchema;
use datafusion::logical_expr::{DdlStatement, LogicalPlan};
use datafusion::sql::parser::CreateExternalTable;
use datafusion::sql::sqlparser::ast::DataType as SqlType;

use crate::connectors::registry;
use crate::error::{Error, Result};

/// A column whose declared `MAP` type was replaced before planning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MapColumn {
    /// The column's name, as the planned schema spells it.
    name: String,
}

/// Whether `file_type` (the `STORED AS` word) is one of our connectors.
fn is_ours(file_type: &str) -> bool {
    registry::kinds().any(|k| k.stored_as().eq_ignore_ascii_case(file_type))
}

fn is_sql_string(t: &SqlType) -> bool {
    matches!(
        t,
        SqlType::Varchar(_)
            | SqlType::Nvarchar(_)
            | SqlType::Text
            | SqlType::String(_)
            | SqlType::Char(_)
            | SqlType::Character(_)
            | SqlType::CharacterVarying(_)
            | SqlType::CharVarying(_)
    )
}

/// Replaces the `MAP(K, V)` column types of a sink's `CREATE EXTERNAL TABLE` by `VARCHAR` and
/// returns the columns to give their map type back after planning. A statement stored as
/// anything else is left alone (DataFusion reports what it makes of it). A map whose key or
/// value is not a string type is refused, naming the column.
pub(crate) fn take_map_columns(create: &mut CreateExternalTable) -> Result<Vec<MapColumn>> {
    if !is_ours(&create.file_type) {
        return Ok(Vec::new());
    }
    let mut taken = Vec::new();
    for column in &mut create.columns {
        let SqlType::Map(key, value) = &column.data_type else {
            continue;
        };
        if !is_sql_string(key) || !is_sql_string(value) {
            return Err(Error::schema(
                column.name.value.clone(),
                format!(
                    "a map column of a sink maps strings to strings: declare it MAP(VARCHAR, VARCHAR), not {}",
                    column.data_type
                ),
            ));
        }
        column.data_type = SqlType::Varchar(None);
        taken.push(MapColumn {
            // The planner normalizes unquoted identifiers to lower case.
            name: if column.name.quote_style.is_some() {
                column.name.value.clone()
            } else {
                column.name.value.to_lowercase()
            },
        });
    }
    Ok(taken)
}

/// The map type of a declared `MAP(VARCHAR, VARCHAR)` column whose values are `string`: the
/// keys are `Utf8`, whatever the session's string type, so that a lookup by name works (see
/// the module's docs).
pub fn string_map_type(string: DataType) -> DataType {
    let entries = Fields::from(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("value", string, true),
    ]);
    DataType::Map(
        Arc::new(Field::new("entries", DataType::Struct(entries), false)),
        false,
    )
}

/// Gives the columns [`take_map_columns`] replaced their map type back in the planned
/// statement; `definition` is the statement's text as declared (with its `MAP` types).
pub(crate) fn restore_map_columns(
    plan: LogicalPlan,
    columns: &[MapColumn],
    definition: String,
) -> Result<LogicalPlan> {
    if columns.is_empty() {
        return Ok(plan);
    }
    let LogicalPlan::Ddl(DdlStatement::CreateExternalTable(mut create)) = plan else {
        return Err(Error::Unsupported(
            "internal: a sink declaration did not plan as CREATE EXTERNAL TABLE".into(),
        ));
    };
    let schema = create.schema.as_arrow();
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| {
            if columns.iter().any(|c| &c.name == f.name()) {
                // The placeholder VARCHAR planned as the session's string type.
                f.as_ref()
                    .clone()
                    .with_data_type(string_map_type(f.data_type().clone()))
            } else {
                f.as_ref().clone()
            }
        })
        .collect();
    let schema = Schema::new_with_metadata(fields, schema.metadata().clone());
    create.schema = Arc::new(DFSchema::try_from(schema)?);
    create.definition = Some(definition);
    Ok(LogicalPlan::Ddl(DdlStatement::CreateExternalTable(create)))
}

#[cfg(test)]
mod tests {
    use datafusion::sql::parser::{DFParser, Statement as DFStatement};

    use super::*;

    fn parse(sql: &str) -> CreateExternalTable {
        match DFParser::parse_sql(sql).unwrap().pop_front().unwrap() {
            DFStatement::CreateExternalTable(c) => c,
            other => panic!("not CREATE EXTERNAL TABLE: {other:?}"),
        }
    }

    #[test]
    fn string_maps_of_a_sink_are_taken_and_others_refused() {
        let mut c = parse(
            "CREATE EXTERNAL TABLE t (a MAP(VARCHAR, TEXT), \"B\" MAP(STRING, VARCHAR), n INT) STORED AS PUBSUB LOCATION 'x'",
        );
        let taken = take_map_columns(&mut c).unwrap();
        assert_eq!(
            taken,
            vec![
                MapColumn { name: "a".into() },
                MapColumn { name: "B".into() }
            ]
        );
        assert_eq!(c.columns[0].data_type, SqlType::Varchar(None));
        assert_eq!(c.columns[2].data_type.to_string(), "INT");

        let mut bad = parse(
            "CREATE EXTERNAL TABLE t (h MAP(VARCHAR, INT)) STORED AS CLOUD_TASKS LOCATION 'x'",
        );
        let error = take_map_columns(&mut bad).unwrap_err().to_string();
        assert!(error.contains("column 'h'"), "{error}");
        assert!(error.contains("MAP(VARCHAR, VARCHAR)"), "{error}");

        // Not a sink: left for DataFusion to judge.
        let mut csv =
            parse("CREATE EXTERNAL TABLE t (a MAP(VARCHAR, VARCHAR)) STORED AS CSV LOCATION 'x'");
        assert!(take_map_columns(&mut csv).unwrap().is_empty());
        assert!(matches!(csv.columns[0].data_type, SqlType::Map(..)));
    }

    /// Declares the sink in both forms and plans an INSERT filling the map `how`; returns the
    /// declared column type and the planning error, if any. No service is contacted.
    async fn plan_insert(how: &str) -> Vec<(DataType, std::result::Result<(), String>)> {
        let ctx = crate::sql::new_context();
        let declarations = [
            "CREATE TABLE w (id BIGINT, attrs MAP(VARCHAR, VARCHAR)) WITH (connector = 'pubsub', topic = 'projects/p/topics/clicks', attributes_column = 'attrs', emulator_host = 'localhost:1')",
            "CREATE EXTERNAL TABLE e (id BIGINT, attrs MAP(VARCHAR, VARCHAR)) STORED AS PUBSUB LOCATION 'projects/p/topics/clicks' OPTIONS ('attributes_column' 'attrs', 'emulator_host' 'localhost:1')",
        ];
        let mut out = Vec::new();
        for (table, declaration) in ["w", "e"].into_iter().zip(declarations) {
            crate::sql::statement_to_dataframe(&ctx, declaration)
                .await
                .unwrap_or_else(|e| panic!("{declaration}: {e}"))
                .collect()
                .await
                .unwrap();
            let declared = ctx
                .table_provider(table)
                .await
                .unwrap()
                .schema()
                .field_with_name("attrs")
                .unwrap()
                .data_type()
                .clone();
            let insert =
                format!("INSERT INTO {table} SELECT value, {how} FROM generate_series(1, 3)");
            let planned = match crate::sql::statement_to_dataframe(&ctx, &insert).await {
                Ok(df) => df
                    .create_physical_plan()
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            out.push((declared, planned));
        }
        out
    }

    #[tokio::test]
    async fn both_forms_declare_a_string_map_that_map_and_make_map_fill() {
        for how in [
            "map(['origin', 'seq'], ['sql', CAST(value AS VARCHAR)])",
            "make_map('origin', 'sql', 'seq', CAST(value AS VARCHAR))",
            "MAP {'origin': 'sql', 'seq': CAST(value AS VARCHAR)}",
        ] {
            for (declared, planned) in plan_insert(how).await {
                assert!(
                    matches!(&declared, DataType::Map(entries, false) if entries.name() == "entries"),
                    "{declared}"
                );
                assert_eq!(planned, Ok(()), "{how}");
            }
        }
    }

    #[tokio::test]
    async fn a_json_object_string_does_not_fill_a_map() {
        for (_, planned) in plan_insert("'{\"origin\": \"sql\"}'").await {
            let error = planned.expect_err("a string is not a map");
            eprintln!("{error}");
        }
    }
}
