//! SQL-level cases: every `tests/slt/*.slt` file runs through `gcp_sql::sql::run` on a fresh
//! context from `gcp_sql::sql::new_context`, as DataFusion's own sqllogictest suite does.
//!
//! The files only declare tables and provoke planning errors (bad options, `INSERT OVERWRITE`,
//! reading a sink): declaring a sink contacts no service, so no emulator is needed.
//!
//! Run: `cargo test --test sqllogictests`. One file: `SLT_FILTER=pubsub cargo test --test sqllogictests`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use arrow::record_batch::RecordBatch;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use async_trait::async_trait;
use datafusion::prelude::SessionContext;
use sqllogictest::{AsyncDB, DBOutput, DefaultColumnType, Runner};

/// One connection of the runner: a session with the three sinks registered.
struct GcpSql {
    ctx: SessionContext,
}

/// Whether a statement returns rows (as opposed to DDL and DML, which report a count).
fn returns_rows(sql: &str) -> bool {
    let first = sql
        .trim_start()
        .split(|c: char| c.is_whitespace() || c == '(')
        .next()
        .unwrap_or("");
    ["select", "with", "values", "describe", "show", "explain"]
        .iter()
        .any(|k| first.eq_ignore_ascii_case(k))
}

fn rows_of(batches: &[RecordBatch]) -> Result<Vec<Vec<String>>, arrow::error::ArrowError> {
    let options = FormatOptions::default().with_null("NULL");
    let mut rows = Vec::new();
    for batch in batches {
        let formatters = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<Result<Vec<_>, _>>()?;
        for row in 0..batch.num_rows() {
            rows.push(
                formatters
                    .iter()
                    .map(|f| f.value(row).to_string())
                    .collect(),
            );
        }
    }
    Ok(rows)
}

#[async_trait]
impl AsyncDB for GcpSql {
    type Error = gcp_sql::Error;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, gcp_sql::Error> {
        let batches = gcp_sql::sql::run(&self.ctx, sql).await?;
        if returns_rows(sql) {
            let rows = rows_of(&batches).map_err(|e| gcp_sql::Error::DataFusion(e.into()))?;
            let width = batches.first().map_or(0, RecordBatch::num_columns);
            Ok(DBOutput::Rows {
                types: vec![DefaultColumnType::Any; width],
                rows,
            })
        } else {
            // An INSERT reports its row count in a single `count` column; DDL returns nothing.
            let count = batches
                .first()
                .filter(|b| b.num_rows() == 1 && b.num_columns() == 1)
                .and_then(|b| {
                    b.column(0)
                        .as_any()
                        .downcast_ref::<arrow::array::UInt64Array>()
                        .map(|a| a.value(0))
                })
                .unwrap_or(0);
            Ok(DBOutput::StatementComplete(count))
        }
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "gcp-sql"
    }

    async fn sleep(dur: Duration) {
        tokio::time::sleep(dur).await;
    }
}

fn slt_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/slt");
    let filter = std::env::var("SLT_FILTER").ok();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "slt"))
        .filter(|p| {
            filter
                .as_deref()
                .is_none_or(|f| p.to_string_lossy().contains(f))
        })
        .collect();
    files.sort();
    files
}

#[test]
fn sql_logic_tests() {
    // The .slt files describe what the options do on their own, whatever the developer's shell
    // exports; an emulator variable would change the channel_pool_size cases. This runs before
    // the runtime starts any thread, and no other test lives in this binary.
    for var in [
        "PUBSUB_EMULATOR_HOST",
        "CLOUD_TASKS_EMULATOR_HOST",
        "BIGTABLE_EMULATOR_HOST",
    ] {
        // SAFETY: single-threaded at this point (no runtime yet; the only test of the binary).
        unsafe { std::env::remove_var(var) };
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let files = slt_files();
    assert!(!files.is_empty(), "no .slt file found under tests/slt");
    let mut failures = Vec::new();
    for file in &files {
        let mut runner = Runner::new(|| async {
            Ok(GcpSql {
                ctx: gcp_sql::sql::new_context(),
            })
        });
        if let Err(e) = runtime.block_on(runner.run_file_async(file)) {
            failures.push(format!("{}:\n{e}", file.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} .slt files failed:\n\n{}",
        failures.len(),
        files.len(),
        failures.join("\n\n")
    );
}
