//! The one design of the inspection table functions (`pubsub_pull`, `bigtable_read`,
//! `cloud_tasks_list`, ...): emulator and debugging helpers that read back what a sink wrote.
//! This module names no connector; each connector's functions live in its folder
//! (`connectors/<name>/inspect.rs`) and are listed by its `inspection_functions()`.
//!
//! A function checks its arguments (literals only) when the statement is planned, with the
//! helpers here ([`check_arity`], [`string_arg`], [`count_arg`], [`bool_arg`]), and returns a
//! [`LazyTable`]: nothing is contacted until the table is scanned, when its [`Inspection`] runs.
//! The inspection reaches the emulator through [`emulator_channel`]: the crate's one plaintext
//! channel ([`GrpcChannel`]), so a broken connection or a client-side deadline reads as the
//! status Google's clients give it, and a [`Reachability`] that turns a refused first call into
//! "nothing answers at that address". Each RPC carries its own deadline
//! ([`crate::google::with_deadline`]).
//!
//! The functions talk to an emulator only — the address given to the function, else the one the
//! connector's variable names (`PUBSUB_EMULATOR_HOST`, ...; `gcp-sql --emulators` sets them) —
//! and fail otherwise: they are for quickstarts, demos and checks, never for production data.
//! The SQL layer's `register_inspection` installs them; its `register` does not. This module
//! imports neither the connectors nor the SQL layer.

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use datafusion::catalog::{Session, TableFunctionImpl, TableProvider};
use datafusion::common::ScalarValue;
use datafusion::datasource::TableType;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::Result as DFResult;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;

use crate::error::{Error, Result};
use crate::google::{GrpcChannel, Reachability, plaintext_endpoint};
use crate::options::{ConnectionOptions, Service};

/// A connector's inspection table functions, each under the name SQL calls it by.
pub type InspectionFunctions = Vec<(&'static str, Arc<dyn TableFunctionImpl>)>;

/// What an inspection table does when it is scanned: its rows come from the emulator when
/// [`run`](Inspection::run) is called (its schema is given to [`LazyTable::provider`], since the
/// statement is planned before anything is contacted).
#[async_trait]
pub trait Inspection: Debug + Send + Sync + 'static {
    /// Makes the calls and returns the rows, in one batch of the table's schema.
    async fn run(&self) -> Result<RecordBatch>;
}

/// A table whose rows are produced when it is scanned: the [`Inspection`]'s calls run at
/// execution time, never when the statement is planned.
#[derive(Debug)]
pub struct LazyTable {
    schema: SchemaRef,
    inspection: Box<dyn Inspection>,
}

impl LazyTable {
    /// The table of `inspection`, whose rows have `schema`, as a table function returns it.
    pub fn provider(schema: SchemaRef, inspection: impl Inspection) -> Arc<dyn TableProvider> {
        Arc::new(LazyTable {
            schema,
            inspection: Box::new(inspection),
        })
    }
}

#[async_trait]
impl TableProvider for LazyTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let batch = self.inspection.run().await?;
        let schema = batch.schema();
        Ok(MemorySourceConfig::try_new_exec(
            &[vec![batch]],
            schema,
            projection.cloned(),
        )?)
    }
}

/// A plaintext channel to the emulator at `host`, else at the address the service's variable
/// ([`Service::emulator_env_var`]) holds, for the inspection function `function`,
/// with the [`Reachability`] of that address (its setting: "the emulator host given", or the
/// variable). Calls through the channel pass through the crate's status mapping
/// ([`crate::google::transport_status`]); pass each call's result through
/// [`Reachability::observe`] so a refused first call says that nothing answers there.
///
/// Without an address the error is [`Error::Connect`] naming the public endpoint and saying
/// which variable to set: the functions never talk to Google itself.
pub fn emulator_channel(
    function: &str,
    service: Service,
    host: Option<&str>,
) -> Result<(GrpcChannel, Reachability)> {
    let (host, setting) = match host.map(str::trim).filter(|h| !h.is_empty()) {
        Some(h) => (h.to_string(), "the emulator host given".to_string()),
        None => {
            let var = service.emulator_env_var;
            match ConnectionOptions::emulator_from_env(var, &ConnectionOptions::process_env)? {
                Some(emulator) => (emulator.host, var.to_string()),
                None => {
                    return Err(Error::Connect {
                        endpoint: service.public_endpoint.to_string(),
                        message: format!(
                            "{function} talks to an emulator only: set {var} (gcp-sql \
                             --emulators does)"
                        ),
                    });
                }
            }
        }
    };
    let channel = GrpcChannel::Plaintext(plaintext_endpoint(&host)?.connect_lazy());
    Ok((channel, Reachability::emulator(host, setting)))
}

/// An [`Error::Rpc`] for one failed inspection call (one attempt: these functions do not retry).
pub fn rpc_error(operation: &'static str, destination: &str, status: tonic::Status) -> Error {
    Error::rpc(operation, destination, &status, 1)
}

/// Refuses a call with no argument or more than `most`; `usage` is the argument list as the
/// error shows it after the function's name (`(table [, max_rows])`).
pub fn check_arity(function: &str, exprs: &[Expr], most: usize, usage: &str) -> DFResult<()> {
    if exprs.is_empty() || exprs.len() > most {
        return Err(Error::invalid(
            format!("{function} arguments"),
            format!("{} argument(s)", exprs.len()),
            format!("expected {function}{usage}"),
        )
        .into());
    }
    Ok(())
}

/// The string literal at `index` (a full resource name); the error names the function and the
/// argument.
pub fn string_arg(function: &str, exprs: &[Expr], index: usize, name: &str) -> DFResult<String> {
    match exprs.get(index) {
        Some(Expr::Literal(
            ScalarValue::Utf8(Some(s))
            | ScalarValue::Utf8View(Some(s))
            | ScalarValue::LargeUtf8(Some(s)),
            _,
        )) => Ok(s.clone()),
        other => Err(Error::invalid(
            format!("{function} {name}"),
            other.map(|e| e.to_string()).unwrap_or_default(),
            "expected a string literal with the full resource name",
        )
        .into()),
    }
}

/// The resource name at `index`: a string literal ([`string_arg`]) that `resolve` accepts,
/// as it returns it; the error names the function, the argument and the rule broken.
pub fn name_arg(
    function: &str,
    exprs: &[Expr],
    index: usize,
    name: &str,
    resolve: impl FnOnce(&str) -> std::result::Result<String, String>,
) -> DFResult<String> {
    let text = string_arg(function, exprs, index, name)?;
    Ok(resolve(&text)
        .map_err(|rule| Error::invalid(format!("{function} {name}"), text.clone(), rule))?)
}

/// The integer literal at `index`, from 1 to `max`; `default` when the argument is absent.
pub fn count_arg(
    function: &str,
    exprs: &[Expr],
    index: usize,
    name: &str,
    default: i64,
    max: i64,
) -> DFResult<usize> {
    let n = match exprs.get(index) {
        None => default,
        Some(Expr::Literal(ScalarValue::Int64(Some(n)), _)) if (1..=max).contains(n) => *n,
        Some(other) => {
            return Err(Error::invalid(
                format!("{function} {name}"),
                other.to_string(),
                format!("an integer from 1 to {max}"),
            )
            .into());
        }
    };
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}

/// The boolean literal at `index`; `default` when the argument is absent.
pub fn bool_arg(
    function: &str,
    exprs: &[Expr],
    index: usize,
    name: &str,
    default: bool,
) -> DFResult<bool> {
    match exprs.get(index) {
        None => Ok(default),
        Some(Expr::Literal(ScalarValue::Boolean(Some(value)), _)) => Ok(*value),
        Some(other) => Err(Error::invalid(
            format!("{function} {name}"),
            other.to_string(),
            "expected true or false",
        )
        .into()),
    }
}

/// The type of a timestamp column of these functions: microseconds, UTC.
pub fn utc_micros() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

/// A protobuf timestamp as microseconds since the epoch.
pub fn timestamp_micros(seconds: i64, nanos: i32) -> i64 {
    seconds * 1_000_000 + i64::from(nanos) / 1_000
}

/// Key/value pairs as a JSON object with its keys sorted (attributes, headers).
pub fn sorted_json_object<'a>(pairs: impl IntoIterator<Item = (&'a String, &'a String)>) -> String {
    let mut pairs: Vec<(&String, &String)> = pairs.into_iter().collect();
    pairs.sort();
    serde_json::to_string(
        &pairs
            .into_iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect::<serde_json::Map<_, _>>(),
    )
    .unwrap_or_default()
}

/// What the inspection functions' tests share: a closed address, and the error a statement
/// ends with.
#[cfg(test)]
pub(crate) mod test_support {
    use std::sync::Arc;

    use datafusion::catalog::TableFunctionImpl;
    use datafusion::prelude::SessionContext;

    use super::InspectionFunctions;

    /// A loopback address where nothing listens (bound, then released).
    pub(crate) fn closed_address() -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        drop(listener);
        address
    }

    /// A session with `functions` installed.
    fn session_with(functions: InspectionFunctions) -> SessionContext {
        let ctx = SessionContext::new();
        for (name, function) in functions {
            ctx.register_udtf(name, function);
        }
        ctx
    }

    /// The error `sql` is refused with when planned, with `functions` installed.
    pub(crate) async fn plan_error(functions: InspectionFunctions, sql: &str) -> String {
        session_with(functions)
            .sql(sql)
            .await
            .expect_err("the arguments are refused when planned")
            .to_string()
    }

    /// The error `sql` fails with when run, with `functions` installed (it plans).
    pub(crate) async fn run_error(functions: InspectionFunctions, sql: &str) -> String {
        session_with(functions)
            .sql(sql)
            .await
            .unwrap()
            .collect()
            .await
            .unwrap_err()
            .to_string()
    }

    /// Asserts that each statement of `cases`, with the inspection functions `functions` makes
    /// installed, is refused when planned with its part in the error.
    pub(crate) async fn assert_plan_errors(
        functions: fn() -> InspectionFunctions,
        cases: &[(&str, &str)],
    ) {
        for (sql, expected) in cases {
            let error = plan_error(functions(), sql).await;
            assert!(error.contains(expected), "{sql}: {error}");
        }
    }

    /// Asserts that each of `statements` fails without contacting anything where the emulator
    /// variable `var` is unset: the error says the function talks to an emulator only and names
    /// `var`. Checks nothing where `var` is set (the unit tests never set it).
    pub(crate) async fn assert_needs_an_emulator(
        functions: fn() -> InspectionFunctions,
        var: &str,
        statements: &[&str],
    ) {
        if std::env::var_os(var).is_some() {
            return;
        }
        for sql in statements {
            let error = run_error(functions(), sql).await;
            assert!(error.contains("talks to an emulator only"), "{error}");
            assert!(error.contains(var), "{error}");
        }
    }

    /// Asserts that `sql`, run with the function `name` that `function` makes for an emulator
    /// address where nothing listens, fails saying that nothing answers there.
    pub(crate) async fn assert_nothing_answers(
        name: &'static str,
        function: impl FnOnce(&str) -> Arc<dyn TableFunctionImpl>,
        sql: &str,
    ) {
        let address = closed_address();
        let error = run_error(vec![(name, function(&address))], sql).await;
        assert!(
            error.contains(&format!(
                "connection refused at {address} (the emulator host given): nothing answers"
            )),
            "{error}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{assert_contains_all, connect_error};

    const ACME: Service = Service {
        emulator_env_var: "GCP_SQL_TEST_UNSET_ACME_EMULATOR_HOST",
        public_endpoint: "https://acme.googleapis.com",
    };

    #[test]
    fn without_an_address_the_error_names_the_variable_and_the_endpoint() {
        let (endpoint, message) = connect_error(emulator_channel("acme_read", ACME, None));
        assert_eq!(endpoint, "https://acme.googleapis.com");
        assert_contains_all(
            &message,
            &[
                "acme_read talks to an emulator only",
                "GCP_SQL_TEST_UNSET_ACME_EMULATOR_HOST",
            ],
        );
    }

    #[tokio::test]
    async fn an_address_given_is_reached_in_plaintext_and_named_as_given() {
        let (channel, reach) = emulator_channel("acme_read", ACME, Some(" 127.0.0.1:9 ")).unwrap();
        assert!(!channel.is_google());
        assert!(format!("{reach:?}").contains("127.0.0.1:9"), "{reach:?}");
    }

    #[test]
    fn key_value_pairs_become_a_json_object_with_sorted_keys() {
        let pairs = [
            ("b".to_string(), "2".to_string()),
            ("a".to_string(), "1".to_string()),
        ];
        assert_eq!(
            sorted_json_object(pairs.iter().map(|(k, v)| (k, v))),
            r#"{"a":"1","b":"2"}"#
        );
        assert_eq!(timestamp_micros(2, 5_000), 2_000_005);
    }
}
