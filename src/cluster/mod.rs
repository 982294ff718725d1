//! Scale-out on a Ballista cluster (feature `ballista`; docs/cluster.md).
//!
//! Ballista plans an `INSERT INTO` on its scheduler, cuts it into stages at its repartitions
//! and runs one task per partition on its executors. For that to carry this crate's sink
//! tables and nodes, every process of the cluster (the client, the scheduler, each executor)
//! needs the two codecs of [`codec`]: [`configure`] installs them, with the three table
//! factories, into a session for programs that embed a Ballista client, scheduler or
//! executor; [`SchedulerSettings`] and [`ExecutorSettings`] start this crate's own scheduler
//! and executor (what `gcp-sql scheduler` and `gcp-sql executor` run), and
//! [`remote_context`] is the client (`gcp-sql --cluster df://HOST:PORT`).
//!
//! Ballista retries a failed task and re-runs the tasks of an executor it lost, so on a
//! cluster a sink's delivery is at least once: see docs/cluster.md for what keeps a replay
//! idempotent.

pub mod codec;

use std::net::SocketAddr;
use std::sync::Arc;

use ballista::prelude::SessionContextExt;
use ballista_core::extension::SessionConfigExt;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use ballista_core::serde::protobuf::{
    GetJobMetricsParams, GetJobMetricsResult, OperatorMetricsSet,
};
use ballista_executor::executor_process::{ExecutorProcessConfig, start_executor_process};
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;
use ballista_scheduler::scheduler_process::{create_scheduler, start_grpc_service_with_listener};
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::session_state::SessionState;
use datafusion::physical_plan::metrics::MetricsSet;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_proto::protobuf::{LogicalPlanNode, PhysicalPlanNode};

use crate::error::{Error, Result};

pub use codec::{SinkLogicalCodec, SinkPhysicalCodec};

/// The name of the sink node, as the job's stage metrics list its operators.
pub const SINK_OPERATOR: &str = "SinkWriterExec";

/// Installs both codecs ([`SinkLogicalCodec`], [`SinkPhysicalCodec`], each wrapping Ballista's
/// own) into a session configuration.
///
/// ```
/// use ballista_core::extension::SessionConfigExt;
/// let config = gcp_sql::cluster::configure_config(datafusion::prelude::SessionConfig::new());
/// assert!(format!("{:?}", config.ballista_logical_extension_codec()).contains("SinkLogicalCodec"));
/// ```
pub fn configure_config(config: SessionConfig) -> SessionConfig {
    config
        .with_ballista_logical_extension_codec(Arc::new(SinkLogicalCodec::default()))
        .with_ballista_physical_extension_codec(Arc::new(SinkPhysicalCodec::default()))
}

/// Configures a session for a Ballista client, scheduler or executor: both codecs in its
/// configuration ([`configure_config`]) and the three sink factories
/// ([`crate::sql::with_gcp_sinks`]).
///
/// ```
/// use datafusion::execution::SessionStateBuilder;
/// let state = gcp_sql::cluster::configure(SessionStateBuilder::new().with_default_features()).build();
/// assert!(state.table_factories().contains_key("BIGTABLE"));
/// ```
pub fn configure(mut builder: SessionStateBuilder) -> SessionStateBuilder {
    let config = builder.config().take().unwrap_or_default();
    crate::sql::with_gcp_sinks(builder).with_config(configure_config(config))
}

/// Where the client's cluster is, kept in its session configuration so that the tool can read
/// a finished job's metrics.
#[derive(Debug, Clone)]
pub struct ClusterAddress {
    /// `http://HOST:PORT` of the scheduler.
    pub scheduler_url: String,
}

/// A client session on the cluster whose scheduler is at `url` (`df://HOST:PORT`): `state`
/// (sinks, functions, settings) with both codecs installed, its queries planned and run by
/// the cluster. DDL (`CREATE EXTERNAL TABLE`) takes effect in this session; each `INSERT` is
/// sent to the scheduler with its tables' declarations.
pub async fn remote_context(url: &str, state: SessionState) -> Result<SessionContext> {
    let scheduler_url = scheduler_url(url)?;
    let config =
        configure_config(state.config().clone()).with_extension(Arc::new(ClusterAddress {
            scheduler_url: scheduler_url.clone(),
        }));
    // The client polls the job's status (Ballista's pull mode) rather than waiting for the
    // scheduler to push it: in push mode the job id reaches the client only with the job's
    // end, and a stop request needs it while the job runs (to cancel it).
    let config = if config
        .options()
        .extensions
        .get::<ballista_core::config::BallistaConfig>()
        .is_some()
    {
        config
    } else {
        config.with_option_extension(ballista_core::config::BallistaConfig::default())
    }
    .set_str(ballista_core::config::BALLISTA_CLIENT_PULL, "true");
    let state = SessionStateBuilder::new_from_existing(state)
        .with_config(config)
        .build();
    Ok(SessionContext::remote_with_state(url, state).await?)
}

/// `http://HOST:PORT` from `df://HOST:PORT` (or `http://`), as Ballista's client reads it.
pub fn scheduler_url(url: &str) -> Result<String> {
    let parsed = url::Url::parse(url).map_err(|e| {
        Error::Unsupported(format!(
            "cluster address '{url}' is not a URL ({e}); write df://HOST:PORT"
        ))
    })?;
    let host = parsed.host_str().filter(|h| !h.is_empty()).ok_or_else(|| {
        Error::Unsupported(format!(
            "cluster address '{url}' names no host; write df://HOST:PORT"
        ))
    })?;
    let port = parsed.port().ok_or_else(|| {
        Error::Unsupported(format!(
            "cluster address '{url}' names no port; write df://HOST:PORT"
        ))
    })?;
    Ok(format!("http://{host}:{port}"))
}

fn ballista_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Unsupported(format!("{what}: {e}"))
}

/// A scheduler of this crate: Ballista's scheduler with both codecs (the executors must be
/// this crate's too).
#[derive(Debug, Clone)]
pub struct SchedulerSettings {
    /// The address to listen on (`--bind-host`).
    pub bind_host: String,
    /// The port to listen on (`--bind-port`).
    pub bind_port: u16,
}

impl SchedulerSettings {
    fn config(&self) -> SchedulerConfig {
        SchedulerConfig {
            bind_host: self.bind_host.clone(),
            bind_port: self.bind_port,
            external_host: self.bind_host.clone(),
            override_logical_codec: Some(Arc::new(SinkLogicalCodec::default())),
            override_physical_codec: Some(Arc::new(SinkPhysicalCodec::default())),
            ..SchedulerConfig::default()
        }
    }

    /// Runs the scheduler until the process stops.
    pub async fn run(&self) -> Result<()> {
        let listener = tokio::net::TcpListener::bind((self.bind_host.as_str(), self.bind_port))
            .await
            .map_err(|e| {
                ballista_error(
                    &format!(
                        "cannot listen on {}:{} for the scheduler",
                        self.bind_host, self.bind_port
                    ),
                    e,
                )
            })?;
        self.serve(listener).await
    }

    /// Starts the scheduler on a listener bound already (port 0 in tests) and returns its
    /// address; it runs in a task of the current runtime.
    pub async fn spawn(&self) -> Result<SocketAddr> {
        let listener =
            tokio::net::TcpListener::bind((self.bind_host.as_str(), self.bind_port)).await?;
        let address = listener.local_addr()?;
        let settings = SchedulerSettings {
            bind_port: address.port(),
            ..self.clone()
        };
        let scheduler = settings.create().await?;
        tokio::spawn(async move {
            if let Err(e) = start_grpc_service_with_listener(listener, scheduler).await {
                tracing::error!(error = %e, "the scheduler stopped");
            }
        });
        Ok(address)
    }

    async fn create(
        &self,
    ) -> Result<
        ballista_scheduler::scheduler_server::SchedulerServer<LogicalPlanNode, PhysicalPlanNode>,
    > {
        let config = self.config();
        config
            .validate()
            .map_err(|e| ballista_error("scheduler settings", e))?;
        let cluster = BallistaCluster::new_from_config(&config)
            .await
            .map_err(|e| ballista_error("cannot set up the scheduler's state", e))?;
        create_scheduler(cluster, Arc::new(config))
            .await
            .map_err(|e| ballista_error("cannot start the scheduler", e))
    }

    async fn serve(&self, listener: tokio::net::TcpListener) -> Result<()> {
        let scheduler = self.create().await?;
        tracing::info!(
            bind = %format!("{}:{}", self.bind_host, self.bind_port),
            "gcp-sql scheduler listening (Ballista {})",
            ballista_core::BALLISTA_VERSION
        );
        start_grpc_service_with_listener(listener, scheduler)
            .await
            .map_err(|e| ballista_error("the scheduler stopped", e))
    }
}

/// An executor of this crate: Ballista's executor with both codecs, so it runs the sink's
/// tasks.
#[derive(Debug, Clone)]
pub struct ExecutorSettings {
    /// The scheduler's host (`--scheduler-host`).
    pub scheduler_host: String,
    /// The scheduler's port (`--scheduler-port`).
    pub scheduler_port: u16,
    /// The address to listen on (`--bind-host`); also the address the scheduler and the
    /// other executors are told to reach it at.
    pub bind_host: String,
    /// The Arrow Flight port other executors and clients fetch shuffle data from
    /// (`--bind-port`).
    pub bind_port: u16,
    /// The executor's gRPC port (`--grpc-port`).
    pub grpc_port: u16,
    /// How many tasks it runs at once (`--concurrent-tasks`); default: the cores.
    pub concurrent_tasks: Option<usize>,
    /// Where it keeps shuffle files; default: a temporary directory.
    pub work_dir: Option<String>,
}

impl ExecutorSettings {
    fn config(&self) -> ExecutorProcessConfig {
        let mut config = ExecutorProcessConfig {
            bind_host: self.bind_host.clone(),
            external_host: Some(self.bind_host.clone()),
            port: self.bind_port,
            grpc_port: self.grpc_port,
            scheduler_host: self.scheduler_host.clone(),
            scheduler_port: self.scheduler_port,
            work_dir: self.work_dir.clone(),
            print_thread_info: false,
            override_logical_codec: Some(Arc::new(SinkLogicalCodec::default())),
            override_physical_codec: Some(Arc::new(SinkPhysicalCodec::default())),
            ..ExecutorProcessConfig::default()
        };
        if let Some(tasks) = self.concurrent_tasks {
            config.vcores = tasks;
        }
        config
    }

    /// Runs the executor until the process stops (a Ctrl-C or SIGTERM ends it, after telling
    /// the scheduler).
    pub async fn run(&self) -> Result<()> {
        crate::connectors::install_crypto_provider();
        tracing::info!(
            scheduler = %format!("{}:{}", self.scheduler_host, self.scheduler_port),
            flight = %format!("{}:{}", self.bind_host, self.bind_port),
            grpc_port = self.grpc_port,
            "gcp-sql executor starting (Ballista {})",
            ballista_core::BALLISTA_VERSION
        );
        let scheduler_url = format!("http://{}:{}", self.scheduler_host, self.scheduler_port);
        crate::core::statement::install_job_end_watch(Arc::new(move |job| {
            let url = scheduler_url.clone();
            Box::pin(async move { wait_for_job_end(&url, &job).await })
        }));
        start_executor_process(Arc::new(self.config()))
            .await
            .map_err(|e| ballista_error("the executor stopped", e))
    }
}

/// The metrics of a finished job, per stage and operator, as the scheduler has them.
pub async fn job_metrics(scheduler_url: &str, job_id: &str) -> Result<GetJobMetricsResult> {
    let mut client = SchedulerGrpcClient::connect(scheduler_url.to_string())
        .await
        .map_err(|e| {
            ballista_error(&format!("cannot reach the scheduler at {scheduler_url}"), e)
        })?;
    Ok(client
        .get_job_metrics(GetJobMetricsParams {
            job_id: job_id.to_string(),
        })
        .await
        .map_err(|e| ballista_error(&format!("job {job_id}: no metrics"), e))?
        .into_inner())
}

/// How many partitions (writers) the stage that ran the sink had, if the job had one. Ballista
/// may run several of them in one task: each sink task logs its own line (see docs/cluster.md).
pub fn sink_stage_partitions(metrics: &GetJobMetricsResult) -> Option<u32> {
    metrics
        .stages
        .iter()
        .find(|stage| {
            stage
                .operators
                .iter()
                .any(|o| o.operator_type == SINK_OPERATOR)
        })
        .map(|stage| stage.partitions)
}

/// The metrics of every operator named `operator` over the job's stages (each summed over
/// its tasks by the scheduler).
pub fn operator_metrics(metrics: &GetJobMetricsResult, operator: &str) -> Vec<MetricsSet> {
    metrics
        .stages
        .iter()
        .flat_map(|stage| stage.operators.iter())
        .filter(|o| o.operator_type == operator)
        .filter_map(|o| {
            let set: std::result::Result<MetricsSet, _> = OperatorMetricsSet {
                metrics: o.metrics.clone(),
            }
            .try_into();
            set.ok()
        })
        .collect()
}

/// Asks the scheduler at `scheduler_url` to cancel job `job_id`. Ballista's scheduler marks the
/// job failed and has the executors cancel its running tasks; a cancelled sink task drains (it
/// reads no more input, delivers what it read within `shutdown_timeout`) and logs its counts on
/// its executor (docs/cluster.md).
pub async fn cancel_job(scheduler_url: &str, job_id: &str) -> Result<()> {
    let mut client = SchedulerGrpcClient::connect(scheduler_url.to_string())
        .await
        .map_err(|e| {
            ballista_error(&format!("cannot reach the scheduler at {scheduler_url}"), e)
        })?;
    let result = client
        .cancel_job(ballista_core::serde::protobuf::CancelJobParams {
            job_id: job_id.to_string(),
        })
        .await
        .map_err(|e| ballista_error(&format!("job {job_id}: cannot cancel it"), e))?
        .into_inner();
    if !result.cancelled {
        tracing::warn!(job = %job_id, "the scheduler did not cancel the job (it may have ended)");
    }
    Ok(())
}

/// Returns once the scheduler at `scheduler_url` reports job `job_id` ended (failed, which a
/// cancel is, or successful), asking every half second; an unreachable scheduler is asked
/// again.
async fn wait_for_job_end(scheduler_url: &str, job_id: &str) {
    use ballista_core::serde::protobuf::{GetJobStatusParams, job_status};
    let mut client = None;
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        if client.is_none() {
            client = SchedulerGrpcClient::connect(scheduler_url.to_string())
                .await
                .ok();
        }
        let Some(c) = client.as_mut() else { continue };
        match c
            .get_job_status(GetJobStatusParams {
                job_id: job_id.to_string(),
            })
            .await
        {
            Ok(reply) => {
                let status = reply.into_inner().status.and_then(|s| s.status);
                if matches!(
                    status,
                    Some(job_status::Status::Failed(_) | job_status::Status::Successful(_))
                ) {
                    return;
                }
            }
            Err(_) => client = None,
        }
    }
}

/// Whether `plan` runs as a cluster job (its root is Ballista's distributed query node).
pub fn runs_as_job(plan: &Arc<dyn datafusion::physical_plan::ExecutionPlan>) -> bool {
    plan.downcast_ref::<ballista_core::execution_plans::DistributedQueryExec<LogicalPlanNode>>()
        .is_some()
}

/// The job id of a plan the cluster ran (its root is Ballista's distributed query node).
pub fn job_id(plan: &Arc<dyn datafusion::physical_plan::ExecutionPlan>) -> Option<String> {
    plan.downcast_ref::<ballista_core::execution_plans::DistributedQueryExec<LogicalPlanNode>>()
        .and_then(|exec| exec.job_id())
        .map(|id| id.to_string())
}

#[cfg(test)]
mod tests;
