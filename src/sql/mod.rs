//! The SQL surface.
//!
//! Two ways to declare a sink reach one option parser:
//!
//! * the Arroyo-style `CREATE TABLE t (...) WITH (connector = 'pubsub', ...)`, which DataFusion
//!   rejects natively, so [`statement_to_dataframe`] rewrites it into the native form; and
//! * DataFusion's own `CREATE EXTERNAL TABLE t (...) STORED AS PUBSUB LOCATION '...'
//!   OPTIONS (...)`, served by the [`ConnectorTableFactory`] that [`register`] installs.
//!
//! Both declare a source as well (a Pub/Sub subscription): the factory makes the connector's
//! source table when the declaration names one.
//!
//! ```no_run
//! # async fn demo() -> gcp_sql::Result<()> {
//! let ctx = gcp_sql::sql::new_context();
//! gcp_sql::sql::run(
//!     &ctx,
//!     "CREATE TABLE clicks (user_id BIGINT, url VARCHAR)
//!        WITH (connector = 'pubsub', topic = 'projects/demo/topics/clicks');
//!      INSERT INTO clicks VALUES (1, 'https://example.com');",
//! )
//! .await?;
//! # Ok(()) }
//! ```

pub(crate) mod control;
pub mod exec;
mod factory;
pub mod lineage;
pub mod lookup;
pub mod map_columns;
pub mod order;
mod spec;
mod table;
pub mod window;
mod with;

use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::dataframe::DataFrame;
use datafusion::error::DataFusionError;
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::{DFParser, Statement as DFStatement};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

use crate::connectors::registry;
use crate::error::{Error, Result};

pub use control::StatementControl;
pub use exec::{SinkCountExec, SinkWriterExec};
pub use factory::{ConnectorTableFactory, OptionInForce, SinkDeclaration};
pub use spec::SinkSpec;
pub use table::SinkTable;

/// Installs the three connector table factories (`STORED AS PUBSUB | CLOUD_TASKS | BIGTABLE`:
/// sinks, and the Pub/Sub source) into an
/// existing context. Nothing else of the session changes: the emulator helpers of
/// [`register_inspection`] are not installed.
///
/// ```
/// let ctx = datafusion::prelude::SessionContext::new();
/// gcp_sql::sql::register(&ctx);
/// ```
pub fn register(ctx: &SessionContext) {
    {
        let state = ctx.state_ref();
        let mut state = state.write();
        for kind in registry::kinds() {
            state.table_factories_mut().insert(
                kind.stored_as().to_string(),
                Arc::new(ConnectorTableFactory::new(kind)),
            );
        }
    }
    ctx.register_udf(window::udf::tumble());
    ctx.register_udf(window::udf::hop());
    ctx.add_analyzer_rule(Arc::new(window::udf::EventTimeArgument));
}

/// Installs the inspection table functions: `pubsub_subscribe(topic, subscription)` and
/// `pubsub_pull(subscription [, max_messages])` (their arguments are full resource names,
/// checked before any call, and a message count from 1 to 10 000, default 100, pulled in
/// pages), the snapshots of a replay (`pubsub_create_snapshot(snapshot, subscription)`,
/// `pubsub_snapshots(project)`, `pubsub_delete_snapshot(snapshot)`),
/// `bigtable_read(table [, max_rows])`, `cloud_tasks_create_queue(queue [, paused])`
/// and `cloud_tasks_list(queue [, max_tasks])`: each connector's `inspect` module documents its
/// own, and [`crate::plan::inspect`] has the design they share.
///
/// They are emulator and debugging helpers: they create a subscription and pull (and
/// acknowledge) what a sink published to it, read a Bigtable table back, create a Cloud Tasks
/// queue and list its tasks, and they talk only to the emulator named by
/// `PUBSUB_EMULATOR_HOST`, `BIGTABLE_EMULATOR_HOST` or `CLOUD_TASKS_EMULATOR_HOST`. Neither
/// [`register`] nor [`with_gcp_sinks`] installs them; the `gcp-sql` tool does, for its
/// quickstart.
///
/// ```
/// let ctx = datafusion::prelude::SessionContext::new();
/// gcp_sql::sql::register(&ctx);
/// gcp_sql::sql::register_inspection(&ctx);
/// assert!(ctx.state().table_functions().contains_key("pubsub_pull"));
/// ```
pub fn register_inspection(ctx: &SessionContext) {
    for (name, function) in inspection_functions() {
        ctx.register_udtf(name, function);
    }
}

/// The inspection table functions, see [`register_inspection`]: each connector's list, from
/// the registry.
fn inspection_functions() -> crate::plan::inspect::InspectionFunctions {
    registry::kinds()
        .flat_map(|kind| (kind.descriptor().inspection)())
        .collect()
}

/// Adds the three connector table factories to a [`SessionStateBuilder`] (as [`register`] does; the
/// inspection functions are not added, see [`register_inspection`]).
///
/// ```
/// use datafusion::execution::SessionStateBuilder;
/// let state = gcp_sql::sql::with_gcp_sinks(SessionStateBuilder::new().with_default_features()).build();
/// assert!(state.table_factories().contains_key("PUBSUB"));
/// ```
pub fn with_gcp_sinks(mut builder: SessionStateBuilder) -> SessionStateBuilder {
    for kind in registry::kinds() {
        builder = builder.with_table_factory(
            kind.stored_as().to_string(),
            Arc::new(ConnectorTableFactory::new(kind)),
        );
    }
    builder
        .scalar_functions()
        .get_or_insert_with(Vec::new)
        .extend([
            Arc::new(window::udf::tumble()),
            Arc::new(window::udf::hop()),
        ]);
    builder
        .with_analyzer_rule(Arc::new(window::udf::EventTimeArgument))
        .with_physical_optimizer_rule(Arc::new(lookup::LookupJoinRule))
}

/// A state builder with DataFusion's defaults and the three sinks (no inspection functions).
pub fn new_state_builder() -> SessionStateBuilder {
    with_gcp_sinks(SessionStateBuilder::new().with_default_features())
}

/// A context like [`new_context`] whose sink statements obey `control`: its stop requests and
/// its flush-point observer (see [`StatementControl`]).
pub fn new_context_with_control(control: &StatementControl) -> SessionContext {
    let config = control.install(datafusion::prelude::SessionConfig::new());
    SessionContext::new_with_state(new_state_builder().with_config(config).build())
}

/// A context with DataFusion's defaults and the three sinks registered (no inspection
/// functions: add them with [`register_inspection`]).
pub fn new_context() -> SessionContext {
    SessionContext::new_with_state(new_state_builder().build())
}

/// `stmt` with the `CREATE TABLE ... WITH (connector = ...)` form rewritten into DataFusion's
/// `CREATE EXTERNAL TABLE ... STORED AS ...` (any other statement unchanged), with the same
/// checks and errors as [`run`], for a host that plans the statement itself (the Python
/// package's `gcp_sql.sql`).
///
/// ```
/// use datafusion::sql::parser::{DFParser, Statement};
/// let mut parsed = DFParser::parse_sql(
///     "CREATE TABLE t (data VARCHAR) WITH (connector = 'pubsub', topic = 'projects/p/topics/t')",
/// )?;
/// let stmt = gcp_sql::sql::rewrite_with_form(parsed.pop_front().unwrap())?;
/// assert!(matches!(stmt, Statement::CreateExternalTable(c) if c.file_type == "PUBSUB"));
/// # Ok::<(), gcp_sql::Error>(())
/// ```
pub fn rewrite_with_form(stmt: DFStatement) -> Result<DFStatement> {
    with::rewrite_with_form(stmt)
}

/// Splits SQL text into its statements, each as the text the user wrote (comments and
/// quoting kept), without the separating semicolons. Empty statements are skipped.
///
/// ```
/// let parts = gcp_sql::sql::split_statements("SELECT 1; SELECT ';' -- a comment;\n;").unwrap();
/// assert_eq!(parts, vec!["SELECT 1".to_string(), "SELECT ';' -- a comment;".to_string()]);
/// ```
pub fn split_statements(sql: &str) -> Result<Vec<String>> {
    let dialect = GenericDialect {};
    let tokens = Tokenizer::new(&dialect, sql)
        .with_unescape(false)
        .tokenize()
        .map_err(|e| Error::DataFusion(DataFusionError::SQL(Box::new(e.into()), None)))?;
    let mut statements = Vec::new();
    let mut current = String::new();
    let mut has_code = false;
    for token in tokens {
        match token {
            Token::SemiColon => {
                if has_code {
                    statements.push(current.trim().to_string());
                }
                current.clear();
                has_code = false;
            }
            Token::Whitespace(_) => current.push_str(&token.to_string()),
            Token::EOF => {}
            other => {
                has_code = true;
                current.push_str(&other.to_string());
            }
        }
    }
    if has_code {
        statements.push(current.trim().to_string());
    }
    Ok(statements)
}

/// Plans one statement (either SQL surface, or any DataFusion SQL) and returns its
/// [`DataFrame`]. DDL runs right away, as with [`SessionContext::sql`].
pub async fn statement_to_dataframe(ctx: &SessionContext, statement: &str) -> Result<DataFrame> {
    let mut statements = DFParser::parse_sql(statement)?;
    let stmt = match (statements.pop_front(), statements.is_empty()) {
        (Some(stmt), true) => stmt,
        (None, _) => return Err(Error::Unsupported("no SQL statement given".into())),
        (Some(_), false) => {
            return Err(Error::Unsupported(
                "statement_to_dataframe takes one statement; use run() for several".into(),
            ));
        }
    };
    let mut stmt = with::rewrite_with_form(stmt)?;
    // A sink's MAP(VARCHAR, VARCHAR) columns, which DataFusion's planner refuses (ADR 0029).
    let mut maps = (Vec::new(), String::new());
    if let DFStatement::CreateExternalTable(create) = &mut stmt {
        let factories = ctx.state().table_factories().clone();
        factory::check_file_type(&create.file_type, factories.keys().map(String::as_str))?;
        let factory_skipped =
            create.if_not_exists && ctx.table_exist(create.name.to_string().as_str())?;
        factory::check_raw_option_names(&create.file_type, &create.options, factory_skipped)?;
        let definition = create.to_string();
        maps = (map_columns::take_map_columns(create)?, definition);
    }
    let state = ctx.state();
    let plan = state.statement_to_plan(stmt).await?;
    let plan = map_columns::restore_map_columns(plan, &maps.0, maps.1)?;
    ctx.execute_logical_plan(plan)
        .await
        .map_err(factory::statement_error)
}

/// Runs every statement of `sql` in order and returns the batches of the last one.
pub async fn run(ctx: &SessionContext, sql: &str) -> Result<Vec<RecordBatch>> {
    let mut last = Vec::new();
    for statement in split_statements(sql)? {
        let df = statement_to_dataframe(ctx, &statement).await?;
        last = df.collect().await?;
    }
    Ok(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{assert_contains_all, error_text};

    #[test]
    fn splits_on_top_level_semicolons_only() {
        let parts = split_statements(
            "CREATE TABLE t (a INT) WITH (connector = 'pubsub', topic = 'a;b');\n-- x; y\nSELECT 1 ;;",
        )
        .unwrap();
        assert_eq!(parts.len(), 2);
        assert!(parts[0].ends_with("topic = 'a;b')"), "{parts:?}");
        assert!(parts[1].starts_with("-- x; y"), "{parts:?}");
    }

    #[test]
    fn keeps_statement_text_as_written() {
        let sql = "CREATE EXTERNAL TABLE t (a INT) STORED AS PUBSUB LOCATION 'projects/p/topics/t' OPTIONS ('auto_create_topic' 'true')";
        assert_eq!(split_statements(sql).unwrap(), vec![sql.to_string()]);
    }

    #[test]
    fn reports_an_unterminated_string() {
        assert!(split_statements("SELECT 'abc").is_err());
    }

    #[tokio::test]
    async fn refuses_several_statements_in_statement_to_dataframe() {
        let ctx = new_context();
        let err = statement_to_dataframe(&ctx, "SELECT 1; SELECT 2")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("one statement"), "{err}");
    }

    #[tokio::test]
    async fn with_form_without_connector_is_left_to_datafusion() {
        let ctx = new_context();
        let err = error_text(run(&ctx, "CREATE TABLE t (a INT) WITH (foo = 'bar')").await);
        assert!(!err.contains("connector"), "{err}");
    }

    #[tokio::test]
    async fn with_form_of_our_options_without_connector_says_it_is_missing() {
        let ctx = new_context();
        let sql = "CREATE TABLE t (a INT) WITH (topic = 'projects/p/topics/t')";
        let err = error_text(run(&ctx, sql).await);
        assert!(err.starts_with("missing option 'connector'"), "{err}");
        assert_contains_all(
            &err,
            &[
                "'pubsub', 'cloud_tasks', 'bigtable'",
                "add connector = 'pubsub'",
            ],
        );

        // Options several connectors accept: the list, without a guess.
        let sql = "CREATE TABLE t (a INT) WITH (project = 'p')";
        let shared = error_text(run(&ctx, sql).await);
        assert!(shared.starts_with("missing option 'connector'"), "{shared}");
        assert!(!shared.contains("add connector"), "{shared}");

        let sql = "CREATE TABLE t (a INT) WITH (conector = 'bigtabel', table = 't')";
        assert_contains_all(
            &error_text(run(&ctx, sql).await),
            &[
                "'conector' is not an option",
                "did you mean connector = 'bigtable'",
            ],
        );
        let sql = "CREATE TABLE t (a INT) WITH (connecter = 'PUBSUB', topic = 't')";
        assert_contains_all(
            &error_text(run(&ctx, sql).await),
            &["did you mean connector = 'pubsub'?"],
        );
    }

    #[tokio::test]
    async fn unknown_connector_names_the_known_ones() {
        let ctx = new_context();
        let sql = "CREATE TABLE t (a INT) WITH (connector = 'kafka')";
        assert_contains_all(&error_text(run(&ctx, sql).await), &["kafka"]);
    }

    #[tokio::test]
    async fn ordinary_sql_still_runs() {
        let ctx = new_context();
        let batches = run(&ctx, "SELECT 40 + 2 AS answer").await.unwrap();
        assert_eq!(batches[0].num_rows(), 1);
    }

    #[tokio::test]
    async fn with_gcp_sinks_keeps_the_default_table_functions() {
        let state = with_gcp_sinks(SessionStateBuilder::new().with_default_features()).build();
        assert!(state.table_functions().contains_key("generate_series"));
        assert!(state.table_factories().contains_key("PUBSUB"));
    }

    const INSPECTION: [&str; 8] = [
        "pubsub_subscribe",
        "pubsub_pull",
        "pubsub_create_snapshot",
        "pubsub_snapshots",
        "pubsub_delete_snapshot",
        "bigtable_read",
        "cloud_tasks_create_queue",
        "cloud_tasks_list",
    ];

    #[tokio::test]
    async fn if_not_exists_on_a_declared_table_still_checks_the_options() {
        let ctx = new_context();
        let declare = |opts: &str| {
            format!(
                "CREATE EXTERNAL TABLE IF NOT EXISTS clicks (data VARCHAR) STORED AS PUBSUB \
                 LOCATION 'projects/demo/topics/clicks' OPTIONS ({opts})"
            )
        };
        run(&ctx, &declare("'max_in_flight_messages' '10'"))
            .await
            .unwrap();
        // DataFusion skips the factory for a table that exists; the options are checked anyway.
        run(&ctx, &declare("'max_in_flight_messages' '20'"))
            .await
            .unwrap();
        for (options, part) in [
            (
                "'max_in_flight_mesages' '20'",
                "did you mean 'max_in_flight_messages'",
            ),
            ("'max_in_flight_messages' '0'", "max_in_flight_messages"),
        ] {
            let err = error_text(run(&ctx, &declare(options)).await);
            assert_contains_all(&err, &[part]);
        }
    }

    #[tokio::test]
    async fn register_installs_the_sinks_but_not_the_inspection_functions() {
        let ctx = SessionContext::new();
        register(&ctx);
        let state = ctx.state();
        // Written out, not taken from the list `register` loops over, so a connector missing
        // from that list fails here.
        let words = ["PUBSUB", "CLOUD_TASKS", "BIGTABLE"];
        for word in words {
            assert!(state.table_factories().contains_key(word), "{word}");
        }
        for name in INSPECTION {
            assert!(!state.table_functions().contains_key(name), "{name}");
        }
        let err = run(
            &ctx,
            "SELECT * FROM pubsub_pull('projects/p/subscriptions/s')",
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("pubsub_pull"), "{err}");

        let built = new_state_builder().build();
        for word in words {
            assert!(built.table_factories().contains_key(word), "{word}");
        }
        for name in INSPECTION {
            assert!(!built.table_functions().contains_key(name), "{name}");
        }
    }

    #[tokio::test]
    async fn register_inspection_installs_the_inspection_functions() {
        let ctx = new_context();
        register_inspection(&ctx);
        let state = ctx.state();
        for name in INSPECTION {
            assert!(state.table_functions().contains_key(name), "{name}");
        }
        assert!(state.table_functions().contains_key("generate_series"));
        assert!(state.table_factories().contains_key("PUBSUB"));
    }
}
