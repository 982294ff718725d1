//! The backslash commands (`\?`, `\q`, `\d`, `\d NAME`, `\format`), read before SQL in the
//! shell and in `-f` / `-c` sources.
//!
//! A line is a command when it starts with `\` where a statement may start: no SQL is pending,
//! or what is pending is complete (ends with `;`) or only comments. A `\` inside a statement
//! that is still open (a multi-line string, say) stays part of it.

use std::io::Write;
use std::sync::Arc;

use clap::ValueEnum;
use datafusion::arrow::array::{ArrayRef, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::TableProvider;
use datafusion::catalog::information_schema::INFORMATION_SCHEMA;
use datafusion::datasource::TableType;
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

use super::OutputFormat;
use super::exec::{PrintOptions, write_batches};
use crate::options::nearest_name;
use crate::sql::SinkTable;

/// What `\?` prints: every command of the shell and of `-f` / `-c` sources.
pub(crate) const HELP: &str = "\
Enter SQL statements ended by ';' (they may span lines). Commands (one per line):
  \\d               list the tables: name and kind (the connector of a sink, else the table type)
  \\d NAME          describe table NAME: its columns; for a sink, its connector, its destination
                   and every option in force (the value given, or the default)
  \\format [FORMAT] show or set the format of results: table, automatic (as table), csv, tsv,
                   json or ndjson (nd-json too); \\pset format [FORMAT] is the same
  \\?               this text (help in the shell, too)
  \\q               stop (in the shell: quit, exit or Ctrl-D, too)
In the shell, Ctrl-C cancels the running statement or clears the line being typed.";

/// The command names, for the nearest-name hint of an unknown one.
const NAMES: [&str; 5] = ["\\d", "\\format", "\\pset", "\\?", "\\q"];

/// A command read from one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BackslashCommand {
    /// `\q`: stop reading.
    Quit,
    /// `\?`: print [`HELP`].
    Help,
    /// `\d`: list the tables.
    ListTables,
    /// `\d NAME`: describe one table.
    Describe(String),
    /// `\format [FORMAT]`: show (`None`) or set the result format.
    Format(Option<OutputFormat>),
}

/// Whether to go on after a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Read the next line.
    Continue,
    /// Stop reading (`\q`).
    Quit,
}

/// Whether `line` is written as a command (its first character that is not a blank is `\`).
pub(crate) fn is_command_line(line: &str) -> bool {
    line.trim_start().starts_with('\\')
}

/// Whether `pending` SQL text ends where a new statement may start: it holds nothing but
/// blanks and comments after its last `;`, and no string or comment is left open.
pub(crate) fn at_statement_boundary(pending: &str) -> bool {
    let Ok(tokens) = Tokenizer::new(&GenericDialect {}, pending)
        .with_unescape(false)
        .tokenize()
    else {
        return false;
    };
    tokens
        .iter()
        .rev()
        .find(|t| !matches!(t, Token::Whitespace(_) | Token::EOF))
        .is_none_or(|t| *t == Token::SemiColon)
}

/// Parses a command line (see [`is_command_line`]). A `;` after the command is ignored.
pub(crate) fn parse_command(line: &str) -> Result<BackslashCommand, String> {
    let line = line.trim().trim_end_matches(';').trim_end();
    let mut words = line.split_whitespace();
    let name = words.next().unwrap_or_default();
    let args: Vec<&str> = words.collect();
    let no_args = |command: BackslashCommand| {
        if args.is_empty() {
            Ok(command)
        } else {
            Err(format!("{name} takes no argument"))
        }
    };
    match name {
        "\\q" => no_args(BackslashCommand::Quit),
        "\\?" => no_args(BackslashCommand::Help),
        "\\d" => match args.as_slice() {
            [] => Ok(BackslashCommand::ListTables),
            [table] => Ok(BackslashCommand::Describe((*table).to_string())),
            _ => Err("\\d takes at most one table name".to_string()),
        },
        "\\format" => match args.as_slice() {
            [] => Ok(BackslashCommand::Format(None)),
            [format] => format_command(format),
            _ => Err("\\format takes one format name".to_string()),
        },
        // datafusion-cli's spelling (and psql's): `\pset format csv`.
        "\\pset" => match args.as_slice() {
            ["format"] => Ok(BackslashCommand::Format(None)),
            ["format", format] => format_command(format),
            _ => Err("\\pset takes 'format' and a format name (\\pset format csv)".to_string()),
        },
        other => {
            let hint = match nearest_name(other, NAMES.iter().copied()) {
                Some(near) => format!("; did you mean '{near}'?"),
                None => String::new(),
            };
            Err(format!(
                "unknown command '{other}'{hint} (\\? lists the commands)"
            ))
        }
    }
}

/// `\format FORMAT`: one of [`OutputFormat`]'s names or aliases, any case; an unknown one is
/// refused with every name and the nearest one.
fn format_command(format: &str) -> Result<BackslashCommand, String> {
    OutputFormat::from_str(format, true)
        .map(|f| BackslashCommand::Format(Some(f)))
        .map_err(|_| {
            let names: Vec<String> = OutputFormat::value_variants()
                .iter()
                .filter_map(|f| f.to_possible_value().map(|v| v.get_name().to_string()))
                .collect();
            let hint = nearest_name(
                &format.to_ascii_lowercase(),
                names.iter().map(String::as_str),
            )
            .map(|n| format!(" (did you mean '{n}'?)"))
            .unwrap_or_default();
            format!(
                "unknown format '{format}'{hint}: expected {}",
                names.join(", ")
            )
        })
}

/// Runs `command`, printing what it shows on stdout in `options.format`.
pub(crate) async fn run_command(
    ctx: &SessionContext,
    command: &BackslashCommand,
    options: &mut PrintOptions,
) -> Result<Flow, String> {
    let mut out = std::io::stdout().lock();
    let shown = match command {
        BackslashCommand::Quit => return Ok(Flow::Quit),
        BackslashCommand::Help => writeln!(out, "{HELP}").map_err(|e| e.to_string()),
        BackslashCommand::ListTables => {
            let tables = tables(ctx).await?;
            list_tables(&mut out, &tables, options.format)
        }
        BackslashCommand::Describe(name) => describe(ctx, &mut out, name, options.format).await,
        BackslashCommand::Format(None) => {
            let current = options
                .format
                .to_possible_value()
                .map(|v| v.get_name().to_string())
                .unwrap_or_default();
            writeln!(out, "{current}").map_err(|e| e.to_string())
        }
        BackslashCommand::Format(Some(format)) => {
            options.format = *format;
            Ok(())
        }
    };
    shown?;
    out.flush().map_err(|e| e.to_string())?;
    Ok(Flow::Continue)
}

/// Every table of the session outside `information_schema`, sorted by the name shown: bare in
/// the default schema, `catalog.schema.table` elsewhere.
async fn tables(ctx: &SessionContext) -> Result<Vec<(String, Arc<dyn TableProvider>)>, String> {
    let (default_catalog, default_schema) = {
        let state = ctx.state();
        let catalog = &state.config_options().catalog;
        (
            catalog.default_catalog.clone(),
            catalog.default_schema.clone(),
        )
    };
    let mut found = Vec::new();
    for catalog_name in ctx.catalog_names() {
        let Some(catalog) = ctx.catalog(&catalog_name) else {
            continue;
        };
        for schema_name in catalog.schema_names() {
            if schema_name == INFORMATION_SCHEMA {
                continue;
            }
            let Some(schema) = catalog.schema(&schema_name) else {
                continue;
            };
            for table_name in schema.table_names() {
                let Some(provider) = schema.table(&table_name).await.map_err(|e| e.to_string())?
                else {
                    continue;
                };
                let shown = if catalog_name == default_catalog && schema_name == default_schema {
                    table_name
                } else {
                    format!("{catalog_name}.{schema_name}.{table_name}")
                };
                found.push((shown, provider));
            }
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(found)
}

/// The kind `\d` shows: `<connector> sink` for a sink table, else the table type.
fn kind_of(provider: &dyn TableProvider) -> String {
    if let Some(sink) = provider.downcast_ref::<SinkTable>() {
        return format!("{} sink", sink.sink().kind().name());
    }
    match provider.table_type() {
        TableType::Base => "table",
        TableType::View => "view",
        TableType::Temporary => "temporary",
    }
    .to_string()
}

/// A batch of string columns.
fn text_batch(
    columns: &[&str],
    rows: Vec<Vec<String>>,
) -> Result<(SchemaRef, RecordBatch), String> {
    let schema: SchemaRef = Arc::new(Schema::new(
        columns
            .iter()
            .map(|c| Field::new(*c, DataType::Utf8, false))
            .collect::<Vec<_>>(),
    ));
    let arrays: Vec<ArrayRef> = (0..columns.len())
        .map(|i| {
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|row| row[i].as_str()),
            )) as ArrayRef
        })
        .collect();
    let batch = RecordBatch::try_new(Arc::clone(&schema), arrays).map_err(|e| e.to_string())?;
    Ok((schema, batch))
}

fn write(
    out: &mut dyn Write,
    (schema, batch): (SchemaRef, RecordBatch),
    format: OutputFormat,
) -> Result<(), String> {
    write_batches(out, &schema, &[batch], format).map_err(|e| e.to_string())
}

/// `\d`: one row per table, its name and kind.
fn list_tables(
    out: &mut dyn Write,
    tables: &[(String, Arc<dyn TableProvider>)],
    format: OutputFormat,
) -> Result<(), String> {
    let rows = tables
        .iter()
        .map(|(name, provider)| vec![name.clone(), kind_of(provider.as_ref())])
        .collect();
    write(out, text_batch(&["table_name", "kind"], rows)?, format)
}

/// `\d NAME`: the columns of the table; for a sink, its connector, destination and options.
async fn describe(
    ctx: &SessionContext,
    out: &mut dyn Write,
    name: &str,
    format: OutputFormat,
) -> Result<(), String> {
    let exists = ctx.table_exist(name).map_err(|e| e.to_string())?;
    if !exists {
        let known = tables(ctx).await?;
        let hint = match nearest_name(name, known.iter().map(|(n, _)| n.as_str())) {
            Some(near) => format!("; did you mean '{near}'?"),
            None if known.is_empty() => "; no table is declared".to_string(),
            None => " (\\d lists the tables)".to_string(),
        };
        return Err(format!("no table '{name}'{hint}"));
    }
    let provider = ctx.table_provider(name).await.map_err(|e| e.to_string())?;
    let sink = provider.downcast_ref::<SinkTable>();
    let table_format = matches!(format, OutputFormat::Table | OutputFormat::Automatic);
    if table_format {
        let heading = match sink {
            Some(sink) => {
                let kind = sink.sink().kind();
                let destination = sink
                    .declaration()
                    .and_then(|d| d.destination())
                    .map(|d| format!(", {d}"))
                    .unwrap_or_default();
                format!("Table {name}: {} sink{destination}", kind.name())
            }
            None => format!("Table {name}: {}", kind_of(provider.as_ref())),
        };
        writeln!(out, "{heading}").map_err(|e| e.to_string())?;
    }
    let schema = provider.schema();
    let columns = schema
        .fields()
        .iter()
        .map(|f| {
            vec![
                f.name().clone(),
                f.data_type().to_string(),
                if f.is_nullable() { "YES" } else { "NO" }.to_string(),
            ]
        })
        .collect();
    write(
        out,
        text_batch(&["column_name", "data_type", "is_nullable"], columns)?,
        format,
    )?;
    let Some(sink) = sink else {
        return Ok(());
    };
    let Some(declaration) = sink.declaration() else {
        if table_format {
            writeln!(
                out,
                "Options: not recorded (the table was built from typed options, not SQL)"
            )
            .map_err(|e| e.to_string())?;
        }
        return Ok(());
    };
    if table_format {
        writeln!(out, "Options in force (given, or the default):").map_err(|e| e.to_string())?;
    }
    let rows = declaration
        .in_force()
        .into_iter()
        .map(|o| vec![o.name.to_string(), o.value])
        .collect();
    write(out, text_batch(&["option", "value"], rows)?, format)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_command() {
        assert_eq!(parse_command("\\q"), Ok(BackslashCommand::Quit));
        assert_eq!(parse_command("  \\?  "), Ok(BackslashCommand::Help));
        assert_eq!(parse_command("\\d"), Ok(BackslashCommand::ListTables));
        assert_eq!(
            parse_command("\\d clicks;"),
            Ok(BackslashCommand::Describe("clicks".into()))
        );
        assert_eq!(
            parse_command("\\format"),
            Ok(BackslashCommand::Format(None))
        );
        assert_eq!(
            parse_command("\\format NDJSON"),
            Ok(BackslashCommand::Format(Some(OutputFormat::Ndjson)))
        );
    }

    #[test]
    fn datafusion_cli_format_names_and_pset_are_accepted() {
        for (word, format) in [
            ("tsv", OutputFormat::Tsv),
            ("automatic", OutputFormat::Automatic),
            ("nd-json", OutputFormat::Ndjson),
        ] {
            assert_eq!(
                parse_command(&format!("\\format {word}")),
                Ok(BackslashCommand::Format(Some(format)))
            );
            assert_eq!(
                parse_command(&format!("\\pset format {word}")),
                Ok(BackslashCommand::Format(Some(format)))
            );
        }
        assert_eq!(
            parse_command("\\pset format"),
            Ok(BackslashCommand::Format(None))
        );
        let bad = parse_command("\\format ndjsn").unwrap_err();
        assert!(bad.contains("did you mean 'ndjson'?"), "{bad}");
        assert!(parse_command("\\pset border 2").is_err());
    }

    #[test]
    fn refuses_bad_commands_with_a_hint() {
        let unknown = parse_command("\\dd").unwrap_err();
        assert!(unknown.contains("did you mean '\\d'"), "{unknown}");
        assert!(unknown.contains("\\?"), "{unknown}");
        assert!(parse_command("\\d a b").is_err());
        assert!(parse_command("\\q now").is_err());
        let format = parse_command("\\format xml").unwrap_err();
        assert!(format.contains("ndjson"), "{format}");
    }

    #[test]
    fn help_lists_every_command() {
        for name in NAMES {
            assert!(HELP.contains(name), "{name}");
        }
    }

    #[test]
    fn a_command_starts_only_where_a_statement_may() {
        assert!(at_statement_boundary(""));
        assert!(at_statement_boundary("SELECT 1;\n-- done\n"));
        assert!(at_statement_boundary("/* a */ -- b\n"));
        assert!(!at_statement_boundary("SELECT 1\n"));
        assert!(!at_statement_boundary("SELECT 'open\n"));
        assert!(is_command_line("  \\d\n"));
        assert!(!is_command_line("SELECT '\\d'"));
    }
}
