//! `gcp-sql scheduler`, `gcp-sql executor` and `gcp-sql --cluster` (feature `ballista`): a
//! Ballista cluster of this crate's own processes, whose codecs carry the sink tables and nodes
//! (docs/cluster.md).

use std::process::ExitCode;
use std::sync::Arc;

use clap::Args as ClapArgs;
use datafusion::error::DataFusionError;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use datafusion_proto::bytes::logical_plan_to_bytes_with_extension_codec;

use super::progress::SinkCounters;
use crate::cluster::{
    ClusterAddress, ExecutorSettings, SINK_OPERATOR, SchedulerSettings, SinkLogicalCodec,
    cancel_job, job_id, job_metrics, operator_metrics,
};
use crate::core::StopKind;
use crate::error::Result;
use crate::sql::StatementControl;

/// `gcp-sql scheduler`: Ballista's scheduler with this crate's codecs.
#[derive(Debug, Clone, PartialEq, Eq, ClapArgs)]
pub struct SchedulerArgs {
    /// The address to listen on
    #[arg(long, default_value = "127.0.0.1")]
    pub bind_host: String,
    /// The port to listen on
    #[arg(long, default_value_t = 50050)]
    pub bind_port: u16,
}

/// `gcp-sql executor`: Ballista's executor with this crate's codecs, which runs the sink's
/// tasks.
#[derive(Debug, Clone, PartialEq, Eq, ClapArgs)]
pub struct ExecutorArgs {
    /// The scheduler's host
    #[arg(long, default_value = "localhost")]
    pub scheduler_host: String,
    /// The scheduler's port
    #[arg(long, default_value_t = 50050)]
    pub scheduler_port: u16,
    /// The address to listen on, and to be reached at by the scheduler, the other executors
    /// and clients
    #[arg(long, default_value = "127.0.0.1")]
    pub bind_host: String,
    /// The Arrow Flight port (shuffle data, results)
    #[arg(long, default_value_t = 50051)]
    pub bind_port: u16,
    /// The executor's gRPC port
    #[arg(long, default_value_t = 50052)]
    pub grpc_port: u16,
    /// How many tasks run at once (default: the number of cores)
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrent_tasks: Option<u16>,
    /// Where shuffle files are kept (default: a temporary directory)
    #[arg(long)]
    pub work_dir: Option<String>,
}

fn serve(name: &str, run: impl std::future::Future<Output = Result<()>>) -> ExitCode {
    // The log filter of a scheduler or an executor: `RUST_LOG`, else info (each sink task an
    // executor runs is an info line).
    super::init_tracing("info");
    crate::connectors::install_crypto_provider();
    let Some(runtime) = super::new_runtime() else {
        return ExitCode::FAILURE;
    };
    match runtime.block_on(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: the {name}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `gcp-sql scheduler` until it is stopped.
pub fn run_scheduler(args: &SchedulerArgs) -> ExitCode {
    let settings = SchedulerSettings {
        bind_host: args.bind_host.clone(),
        bind_port: args.bind_port,
    };
    serve("scheduler", async move {
        tokio::select! {
            result = settings.run() => result,
            _ = tokio::signal::ctrl_c() => Ok(()),
        }
    })
}

/// Runs `gcp-sql executor` until it is stopped (Ctrl-C or SIGTERM).
pub fn run_executor(args: &ExecutorArgs) -> ExitCode {
    let settings = ExecutorSettings {
        scheduler_host: args.scheduler_host.clone(),
        scheduler_port: args.scheduler_port,
        bind_host: args.bind_host.clone(),
        bind_port: args.bind_port,
        grpc_port: args.grpc_port,
        concurrent_tasks: args.concurrent_tasks.map(usize::from),
        work_dir: args.work_dir.clone(),
    };
    serve("executor", async move { settings.run().await })
}

/// The tool's session on a cluster: [`super::new_session_with_control`]'s state (sinks,
/// `information_schema`, object stores, direct file queries) whose queries the cluster at
/// `url` runs. The emulator inspection functions are not in it: their rows are a table in
/// the client's memory, which a plan sent to the cluster cannot carry (run them without
/// `--cluster`).
pub async fn new_cluster_session(url: &str, control: &StatementControl) -> Result<SessionContext> {
    let state = super::session_state(control)?;
    Ok(crate::cluster::remote_context(url, state)
        .await?
        .enable_url_table())
}

/// Refuses, before anything is sent, a statement whose plan this crate's codec cannot carry to
/// the cluster at `ctx` (a source only the local engine can run, such as `generate_series`; a
/// sink declared in Rust), with the codec's own reason. Ballista's client would report it as an
/// internal error that calls itself a DataFusion bug. Any other encoding failure is left for
/// Ballista to report, and a local session is not checked.
pub(super) fn refuse_unsendable(ctx: &SessionContext, plan: &LogicalPlan) -> Result<()> {
    if ctx
        .state()
        .config()
        .get_extension::<ClusterAddress>()
        .is_none()
    {
        return Ok(());
    }
    match logical_plan_to_bytes_with_extension_codec(plan, &SinkLogicalCodec::default()) {
        Err(e) => match e.find_root() {
            DataFusionError::Plan(reason) if reason.contains("cannot be sent to a cluster") => {
                Err(DataFusionError::Plan(reason.clone()).into())
            }
            _ => Ok(()),
        },
        Ok(_) => Ok(()),
    }
}

/// The sink counters of a statement the cluster ran: its job's metrics of the sink stage, as
/// the scheduler collected them from the executors. `None` for a local plan, a job without a
/// sink, or a scheduler that has no metrics for it (a warning says why).
pub(super) async fn job_counters(
    ctx: &SessionContext,
    plan: &Arc<dyn ExecutionPlan>,
) -> Option<SinkCounters> {
    let address = ctx.state().config().get_extension::<ClusterAddress>()?;
    let job = job_id(plan)?;
    match job_metrics(&address.scheduler_url, &job).await {
        Ok(metrics) => SinkCounters::from_metrics(&operator_metrics(&metrics, SINK_OPERATOR)),
        Err(e) => {
            tracing::warn!(job = %job, error = %e, "no sink summary: the job's metrics are not available");
            None
        }
    }
}

/// A statement running as a cluster job, watched for the tool's stop requests: while it runs it
/// counts as a running sink statement (so the first Ctrl-C / SIGTERM is a graceful stop, not an
/// exit), and a stop cancels the job through the scheduler. Dropped when the statement ended.
pub(super) struct JobWatch {
    _running: crate::sql::control::WriterRunning,
    watcher: tokio::task::JoinHandle<()>,
    cancelled: Arc<std::sync::Mutex<Option<String>>>,
}

impl JobWatch {
    /// Watches `plan` if it runs on a cluster (the session has a [`ClusterAddress`] and a
    /// [`StatementControl`]); `None` otherwise.
    pub(super) fn start(ctx: &SessionContext, plan: &Arc<dyn ExecutionPlan>) -> Option<Self> {
        if !crate::cluster::runs_as_job(plan) {
            return None;
        }
        let config = ctx.state().config().clone();
        let address = config.get_extension::<ClusterAddress>()?;
        let control = config.get_extension::<StatementControl>()?;
        let cancelled: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
        let (plan, signal, noted) = (plan.clone(), control.signal(), cancelled.clone());
        let watcher = tokio::spawn(async move {
            tracing::debug!("watching the cluster job for a stop request");
            signal.reaches(StopKind::Drain).await;
            tracing::debug!("stop requested: cancelling the cluster job");
            // The job id is known once the scheduler accepted the job.
            let job = loop {
                if let Some(job) = job_id(&plan) {
                    break job;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            };
            eprintln!(
                "Cancelling job {job} on the cluster: its sink tasks read no more input and \
                 deliver what they read (within shutdown_timeout); each logs its counts on its \
                 executor."
            );
            // Noted before the call: the client's poll can see the job end before this task
            // sees the scheduler's answer, and the statement must then still report the stop.
            *noted.lock().unwrap_or_else(|p| p.into_inner()) = Some(job.clone());
            if let Err(e) = cancel_job(&address.scheduler_url, &job).await {
                *noted.lock().unwrap_or_else(|p| p.into_inner()) = None;
                eprintln!("Error: cannot cancel job {job}: {e}");
            }
        });
        Some(JobWatch {
            _running: control.writer_running(),
            watcher,
            cancelled,
        })
    }

    /// The job this watch cancelled on a stop request, if it did.
    pub(super) fn cancelled(&self) -> Option<String> {
        self.cancelled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for JobWatch {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

/// The error of a statement whose cluster job `job` was cancelled on a stop request: what the
/// sink tasks that had finished acknowledged (from the job's metrics), and where the cancelled
/// tasks' own counts are (Ballista reports no metrics of a cancelled task).
pub(super) async fn cancelled_job_error(
    ctx: &SessionContext,
    plan: &Arc<dyn ExecutionPlan>,
    job: &str,
) -> crate::Error {
    let reason = ctx
        .state()
        .config()
        .get_extension::<StatementControl>()
        .and_then(|c| c.reason())
        .unwrap_or_else(|| "stop requested".into());
    let finished = job_counters(ctx, plan).await.map_or(0, |c| c.acked);
    crate::Error::Stopped {
        reason: format!(
            "{reason}: job {job} was cancelled on the cluster; the sink tasks that had finished \
         acknowledged {finished} row(s); each cancelled sink task logged on its executor the \
         rows it acknowledged ('sink task cancelled'), and rows it had not read were not sent"
        ),
    }
}
