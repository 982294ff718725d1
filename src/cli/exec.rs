//! Runs SQL text statement by statement and prints the results.

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::util::pretty::pretty_format_batches_with_schema;
use datafusion::physical_plan::collect;
use datafusion::prelude::SessionContext;

use super::OutputFormat;
use super::commands::{Flow, at_statement_boundary, is_command_line, parse_command, run_command};
use super::progress::{LiveProgress, SinkCounters};
use crate::error::{Error, Result};
use crate::sql::StatementControl;

/// How statements print their results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrintOptions {
    /// The format of result rows on stdout.
    pub format: OutputFormat,
    /// No timing line, no sink summary and no live progress.
    pub quiet: bool,
    /// How many rows the table format prints per statement.
    pub maxrows: super::MaxRows,
}

/// Splits `sql` into statements and runs them in order, printing each result; stops at the
/// first statement that fails and returns its error.
///
/// After a stop request of the session's [`StatementControl`] (a Ctrl-C while a sink
/// statement ran), the statements after the stopped one are not run (and that is said).
pub async fn run_sql(ctx: &SessionContext, sql: &str, options: PrintOptions) -> Result<()> {
    let control = ctx.state().config().get_extension::<StatementControl>();
    for statement in crate::sql::split_statements(sql)? {
        if let Some(reason) = control.as_ref().and_then(|c| c.reason()) {
            eprintln!("{reason}: the statements after the stopped one are not run.");
            return Ok(());
        }
        run_statement(ctx, &statement, options).await?;
    }
    Ok(())
}

/// Runs a source (a `-f` file or a `-c` argument): its SQL statements and its backslash
/// commands (`\d`, `\q`, ...) in order. A line that starts with `\` where a statement may
/// start is a command; everything else is SQL, run as [`run_sql`] does. Stops at the first
/// statement or command that fails and returns its error; returns [`Flow::Quit`] after `\q`.
/// `\format` changes `options` for what follows.
pub(crate) async fn run_script(
    ctx: &SessionContext,
    text: &str,
    options: &mut PrintOptions,
) -> std::result::Result<Flow, String> {
    let mut start = 0;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let line_start = offset;
        offset += line.len();
        if is_command_line(line) && at_statement_boundary(&text[start..line_start]) {
            run_sql(ctx, &text[start..line_start], *options)
                .await
                .map_err(|e| e.to_string())?;
            start = offset;
            let command = parse_command(line)?;
            if run_command(ctx, &command, options).await? == Flow::Quit {
                return Ok(Flow::Quit);
            }
        }
    }
    run_sql(ctx, &text[start..], *options)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Flow::Continue)
}

/// Runs one statement: plans it (DDL takes effect here), executes it while showing live sink
/// progress on a terminal, then prints its rows on stdout and, unless quiet, the sink summary
/// and a `N row(s) fetched. Elapsed ...` line on stderr.
pub async fn run_statement(
    ctx: &SessionContext,
    statement: &str,
    options: PrintOptions,
) -> Result<()> {
    let started = Instant::now();
    let frame = crate::sql::statement_to_dataframe(ctx, statement).await?;
    #[cfg(feature = "ballista")]
    super::cluster::refuse_unsendable(ctx, frame.logical_plan())?;
    let plan = frame.create_physical_plan().await?;
    let schema = plan.schema();
    let progress = LiveProgress::start(&plan, !options.quiet);
    #[cfg(feature = "ballista")]
    let watch = super::cluster::JobWatch::start(ctx, &plan);
    let outcome = collect(Arc::clone(&plan), ctx.task_ctx()).await;
    if let Some(progress) = progress {
        progress.finish().await;
    }
    #[cfg(feature = "ballista")]
    if let Some(job) = watch.as_ref().and_then(|w| w.cancelled())
        && outcome.is_err()
    {
        return Err(super::cluster::cancelled_job_error(ctx, &plan, &job).await);
    }
    let batches = outcome?;
    let elapsed = started.elapsed();
    let shown = print_batches(&schema, &batches, options)?;
    if !options.quiet {
        let counters = SinkCounters::read(&plan);
        #[cfg(feature = "ballista")]
        let counters = match counters {
            None => super::cluster::job_counters(ctx, &plan).await,
            local => local,
        };
        if let Some(counters) = counters {
            eprintln!("{}", counters.summary(elapsed));
        }
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        let displayed = if shown < rows {
            format!(" (First {shown} displayed. Use --maxrows to adjust)")
        } else {
            String::new()
        };
        eprintln!(
            "{rows} row(s) fetched.{displayed} Elapsed {:.3} seconds.\n",
            elapsed.as_secs_f64()
        );
    }
    Ok(())
}

/// Writes `batches` to stdout in `options.format` and returns how many rows it printed. A
/// statement without columns (DDL) prints nothing. The table formats print at most
/// `options.maxrows` rows, then a row of `.` under each column when some were left out.
fn print_batches(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    options: PrintOptions,
) -> Result<usize> {
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    if schema.fields().is_empty() {
        return Ok(rows);
    }
    let table = matches!(
        options.format,
        OutputFormat::Table | OutputFormat::Automatic
    );
    let limit = match options.maxrows {
        super::MaxRows::Limited(n) if table && n < rows => n,
        _ => rows,
    };
    let mut out = std::io::stdout().lock();
    if limit < rows {
        let mut kept = Vec::new();
        let mut left = limit;
        for batch in batches {
            if left == 0 {
                break;
            }
            let take = left.min(batch.num_rows());
            kept.push(batch.slice(0, take));
            left -= take;
        }
        // The grid, then its last border line replaced by a row of dots and the border again.
        let grid = pretty_format_batches_with_schema(Arc::clone(schema), &kept)
            .map_err(|e| Error::DataFusion(e.into()))?
            .to_string();
        let lines: Vec<&str> = grid.lines().collect();
        let border = lines.last().copied().unwrap_or_default();
        let dots: String = border
            .split('+')
            .map(|cell| {
                if cell.is_empty() {
                    String::new()
                } else {
                    format!(" {:<width$}", ".", width = cell.len() - 1)
                }
            })
            .collect::<Vec<_>>()
            .join("|");
        for line in &lines[..lines.len().saturating_sub(1)] {
            writeln!(out, "{line}")?;
        }
        writeln!(out, "{dots}")?;
        writeln!(out, "{border}")?;
    } else {
        write_batches(&mut out, schema, batches, options.format)?;
    }
    out.flush()?;
    Ok(limit)
}

/// Writes `batches` in `format` to `out`.
///
/// `table` draws a grid, `csv` writes a header line and one line per row, `json` one array of
/// objects, `ndjson` one object per line (nothing for no rows). Null values are left out of
/// JSON objects, as arrow's JSON writers do.
pub(crate) fn write_batches(
    out: &mut dyn Write,
    schema: &SchemaRef,
    batches: &[RecordBatch],
    format: OutputFormat,
) -> Result<()> {
    let arrow_error = |e: arrow::error::ArrowError| Error::DataFusion(e.into());
    match format {
        OutputFormat::Table | OutputFormat::Automatic => {
            writeln!(
                out,
                "{}",
                pretty_format_batches_with_schema(Arc::clone(schema), batches)
                    .map_err(arrow_error)?
            )?;
        }
        OutputFormat::Csv | OutputFormat::Tsv => {
            let delimiter = if format == OutputFormat::Tsv {
                b'\t'
            } else {
                b','
            };
            let mut writer = arrow::csv::WriterBuilder::new()
                .with_header(true)
                .with_delimiter(delimiter)
                .build(&mut *out);
            if batches.is_empty() {
                writer
                    .write(&RecordBatch::new_empty(Arc::clone(schema)))
                    .map_err(arrow_error)?;
            }
            for batch in batches {
                writer.write(batch).map_err(arrow_error)?;
            }
        }
        OutputFormat::Json => {
            let mut writer = arrow::json::ArrayWriter::new(&mut *out);
            for batch in batches {
                writer.write(batch).map_err(arrow_error)?;
            }
            // For no rows at all the writer still prints `[]`.
            writer.finish().map_err(arrow_error)?;
            writeln!(out)?;
        }
        OutputFormat::Ndjson => {
            let mut writer = arrow::json::LineDelimitedWriter::new(&mut *out);
            for batch in batches {
                writer.write(batch).map_err(arrow_error)?;
            }
            writer.finish().map_err(arrow_error)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn sample() -> (SchemaRef, Vec<RecordBatch>) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("url", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec![Some("/a"), None])),
            ],
        )
        .unwrap();
        (schema, vec![batch])
    }

    fn render(format: OutputFormat, empty: bool) -> String {
        let (schema, batches) = sample();
        let batches = if empty { Vec::new() } else { batches };
        let mut out = Vec::new();
        write_batches(&mut out, &schema, &batches, format).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn table_format_draws_a_grid() {
        let text = render(OutputFormat::Table, false);
        assert!(text.contains("| id | url |"), "{text}");
        assert!(text.contains("| 2  |     |"), "{text}");
    }

    #[test]
    fn table_format_of_no_rows_keeps_the_header() {
        let text = render(OutputFormat::Table, true);
        assert!(text.contains("| id | url |"), "{text}");
    }

    #[test]
    fn csv_format_has_a_header_and_one_line_per_row() {
        assert_eq!(render(OutputFormat::Csv, false), "id,url\n1,/a\n2,\n");
        assert_eq!(render(OutputFormat::Csv, true), "id,url\n");
        assert_eq!(render(OutputFormat::Tsv, false), "id\turl\n1\t/a\n2\t\n");
        assert_eq!(
            render(OutputFormat::Automatic, false),
            render(OutputFormat::Table, false)
        );
    }

    #[test]
    fn json_is_one_array_and_ndjson_one_object_per_line() {
        for (format, rows, no_rows) in [
            (
                OutputFormat::Json,
                "[{\"id\":1,\"url\":\"/a\"},{\"id\":2}]\n",
                "[]\n",
            ),
            (
                OutputFormat::Ndjson,
                "{\"id\":1,\"url\":\"/a\"}\n{\"id\":2}\n",
                "",
            ),
        ] {
            assert_eq!(render(format, false), rows, "{format:?}");
            assert_eq!(render(format, true), no_rows, "{format:?}");
        }
    }
}
