//! Three table functions to manage Pub/Sub snapshots, the start points of a replay
//! (`start_at = 'snapshot:...'`, ADR 0072), from SQL:
//!
//! | call | arguments | returns |
//! |---|---|---|
//! | `pubsub_create_snapshot(snapshot, subscription)` | `snapshot`: `projects/P/snapshots/S`; `subscription`: `projects/P/subscriptions/S` | one row: `snapshot`, `topic`, `expire_time` |
//! | `pubsub_snapshots(project)` | `project`: `projects/P` or `P` | one row per snapshot of the project: `snapshot`, `topic`, `expire_time` |
//! | `pubsub_delete_snapshot(snapshot)` | `snapshot`: `projects/P/snapshots/S` | one row: `snapshot`, `deleted` (false when there was none) |
//!
//! A snapshot keeps the subscription's acknowledgement state at the time it is created: the
//! messages unacknowledged then, and every message published after it. Creating one that
//! exists already is an error (`ALREADY_EXISTS`), never a silent reuse of an older state.
//!
//! They follow the design of the other inspection functions ([`super::inspect`],
//! [`crate::plan::inspect`]): arguments checked when the statement is planned, calls made when
//! it runs, and only to the emulator `PUBSUB_EMULATOR_HOST` names (or the host a Rust program
//! gives); on Google's service, manage snapshots with `gcloud pubsub snapshots`.
//!
//! ```sql
//! SELECT * FROM pubsub_create_snapshot('projects/demo/snapshots/before-deploy',
//!                                      'projects/demo/subscriptions/clicks');
//! SELECT snapshot, expire_time FROM pubsub_snapshots('demo');
//! SELECT * FROM pubsub_delete_snapshot('projects/demo/snapshots/before-deploy');
//! ```

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::array::TimestampMicrosecondArray;
use datafusion::arrow::array::{ArrayRef, BooleanArray, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::error::Result as DFResult;
use gcloud_sdk::google::pubsub::v1::subscriber_client::SubscriberClient;
use gcloud_sdk::google::pubsub::v1::{
    CreateSnapshotRequest, DeleteSnapshotRequest, ListSnapshotsRequest, Snapshot,
};
use tonic::Code;

use super::names::{pubsub_snapshot, pubsub_subscription};
use crate::error::Result;
use crate::google::with_deadline;
use crate::options::names::check_project;
use crate::plan::inspect::{
    Inspection, LazyTable, check_arity, emulator_channel, name_arg, rpc_error, timestamp_micros,
    utc_micros,
};

/// Deadline of each snapshot call.
const SNAPSHOT_CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Snapshots asked for per `ListSnapshots` page.
const LIST_PAGE: i32 = 1000;

/// Which snapshot call a [`SnapshotFunction`] makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotCall {
    /// `pubsub_create_snapshot`.
    Create,
    /// `pubsub_snapshots`.
    List,
    /// `pubsub_delete_snapshot`.
    Delete,
}

impl SnapshotCall {
    /// The name SQL calls it by.
    pub fn function(self) -> &'static str {
        match self {
            SnapshotCall::Create => "pubsub_create_snapshot",
            SnapshotCall::List => "pubsub_snapshots",
            SnapshotCall::Delete => "pubsub_delete_snapshot",
        }
    }
}

/// One of the three snapshot table functions.
#[derive(Debug)]
pub struct SnapshotFunction {
    call: SnapshotCall,
    emulator_host: Option<String>,
}

impl SnapshotFunction {
    /// The function `call`, talking to the emulator `PUBSUB_EMULATOR_HOST` names.
    pub fn new(call: SnapshotCall) -> Self {
        SnapshotFunction {
            call,
            emulator_host: None,
        }
    }

    /// The function `call`, talking to the emulator at `host` (`host:port`).
    pub fn with_emulator_host(call: SnapshotCall, host: impl Into<String>) -> Self {
        SnapshotFunction {
            call,
            emulator_host: Some(host.into()),
        }
    }
}

/// `projects/P` or `P`, as `projects/P`.
fn project_name(value: &str) -> std::result::Result<String, String> {
    let v = value.trim();
    let id = match v.strip_prefix("projects/") {
        Some(id) => id,
        None if v.contains('/') => return Err("expected 'projects/PROJECT' or 'PROJECT'".into()),
        None => v,
    };
    check_project(id)?;
    Ok(format!("projects/{id}"))
}

fn full_snapshot(value: &str) -> std::result::Result<String, String> {
    if !value.contains('/') {
        return Err("expected 'projects/PROJECT/snapshots/SNAPSHOT'".into());
    }
    pubsub_snapshot(value, None)
}

impl TableFunctionImpl for SnapshotFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DFResult<Arc<dyn TableProvider>> {
        let exprs = args.exprs();
        let function = self.call.function();
        let request = match self.call {
            SnapshotCall::Create => {
                check_arity(function, exprs, 2, "(snapshot, subscription)")?;
                Request::Create {
                    snapshot: name_arg(function, exprs, 0, "snapshot", full_snapshot)?,
                    subscription: name_arg(
                        function,
                        exprs,
                        1,
                        "subscription",
                        pubsub_subscription,
                    )?,
                }
            }
            SnapshotCall::List => {
                check_arity(function, exprs, 1, "(project)")?;
                Request::List {
                    project: name_arg(function, exprs, 0, "project", project_name)?,
                }
            }
            SnapshotCall::Delete => {
                check_arity(function, exprs, 1, "(snapshot)")?;
                Request::Delete {
                    snapshot: name_arg(function, exprs, 0, "snapshot", full_snapshot)?,
                }
            }
        };
        let schema = match self.call {
            SnapshotCall::Delete => delete_schema(),
            _ => snapshot_schema(),
        };
        Ok(LazyTable::provider(
            schema,
            Call {
                function,
                request,
                emulator_host: self.emulator_host.clone(),
            },
        ))
    }
}

#[derive(Debug)]
enum Request {
    Create {
        snapshot: String,
        subscription: String,
    },
    List {
        project: String,
    },
    Delete {
        snapshot: String,
    },
}

#[derive(Debug)]
struct Call {
    function: &'static str,
    request: Request,
    emulator_host: Option<String>,
}

fn snapshot_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("snapshot", DataType::Utf8, false),
        Field::new("topic", DataType::Utf8, false),
        Field::new("expire_time", utc_micros(), true),
    ]))
}

fn delete_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("snapshot", DataType::Utf8, false),
        Field::new("deleted", DataType::Boolean, false),
    ]))
}

fn timed<M>(message: M) -> tonic::Request<M> {
    with_deadline(
        tonic::Request::new(message),
        Some(SNAPSHOT_CALL_TIMEOUT),
        false,
    )
}

fn snapshot_rows(snapshots: &[Snapshot]) -> Result<RecordBatch> {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(
            snapshots.iter().map(|s| s.name.as_str()),
        )),
        Arc::new(StringArray::from_iter_values(
            snapshots.iter().map(|s| s.topic.as_str()),
        )),
        Arc::new(
            TimestampMicrosecondArray::from_iter(snapshots.iter().map(|s| {
                s.expire_time
                    .as_ref()
                    .map(|t| timestamp_micros(t.seconds, t.nanos))
            }))
            .with_timezone("UTC"),
        ),
    ];
    Ok(RecordBatch::try_new(snapshot_schema(), columns)?)
}

#[async_trait]
impl Inspection for Call {
    async fn run(&self) -> Result<RecordBatch> {
        let (channel, reach) =
            emulator_channel(self.function, super::SERVICE, self.emulator_host.as_deref())?;
        let mut client = SubscriberClient::new(channel);
        match &self.request {
            Request::Create {
                snapshot,
                subscription,
            } => {
                let created = reach
                    .observe(
                        client
                            .create_snapshot(timed(CreateSnapshotRequest {
                                name: snapshot.clone(),
                                subscription: subscription.clone(),
                                ..Default::default()
                            }))
                            .await,
                    )
                    .map_err(|status| rpc_error("CreateSnapshot", snapshot, status))?;
                snapshot_rows(&[created.into_inner()])
            }
            Request::List { project } => {
                let mut snapshots = Vec::new();
                let mut page_token = String::new();
                loop {
                    let page = reach
                        .observe(
                            client
                                .list_snapshots(timed(ListSnapshotsRequest {
                                    project: project.clone(),
                                    page_size: LIST_PAGE,
                                    page_token: page_token.clone(),
                                }))
                                .await,
                        )
                        .map_err(|status| rpc_error("ListSnapshots", project, status))?
                        .into_inner();
                    snapshots.extend(page.snapshots);
                    if page.next_page_token.is_empty() {
                        break;
                    }
                    page_token = page.next_page_token;
                }
                snapshots.sort_by(|a, b| a.name.cmp(&b.name));
                snapshot_rows(&snapshots)
            }
            Request::Delete { snapshot } => {
                let deleted = match reach.observe(
                    client
                        .delete_snapshot(timed(DeleteSnapshotRequest {
                            snapshot: snapshot.clone(),
                        }))
                        .await,
                ) {
                    Ok(_) => true,
                    Err(status) if status.code() == Code::NotFound => false,
                    Err(status) => return Err(rpc_error("DeleteSnapshot", snapshot, status)),
                };
                let columns: Vec<ArrayRef> = vec![
                    Arc::new(StringArray::from(vec![snapshot.clone()])),
                    Arc::new(BooleanArray::from(vec![deleted])),
                ];
                Ok(RecordBatch::try_new(delete_schema(), columns)?)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::{new_context, run};

    /// The error of `sql` with the three functions pointed where nothing listens: arguments
    /// are checked before any call.
    async fn refused(sql: &str) -> String {
        let ctx = new_context();
        for call in [
            SnapshotCall::Create,
            SnapshotCall::List,
            SnapshotCall::Delete,
        ] {
            ctx.register_udtf(
                call.function(),
                Arc::new(SnapshotFunction::with_emulator_host(call, "127.0.0.1:1")),
            );
        }
        run(&ctx, sql).await.unwrap_err().to_string()
    }

    #[tokio::test]
    async fn arguments_are_checked_before_any_call() {
        let short = refused(
            "SELECT * FROM pubsub_create_snapshot('snap', 'projects/demo/subscriptions/clicks')",
        )
        .await;
        assert!(
            short.contains("'pubsub_create_snapshot snapshot'")
                && short.contains("projects/PROJECT/snapshots/SNAPSHOT"),
            "{short}"
        );
        let sub = refused(
            "SELECT * FROM pubsub_create_snapshot('projects/demo/snapshots/snap', 'clicks')",
        )
        .await;
        assert!(
            sub.contains("'pubsub_create_snapshot subscription'"),
            "{sub}"
        );
        let one =
            refused("SELECT * FROM pubsub_create_snapshot('projects/demo/snapshots/snap')").await;
        assert!(
            one.contains("'pubsub_create_snapshot subscription'"),
            "{one}"
        );
        let id =
            refused("SELECT * FROM pubsub_delete_snapshot('projects/demo/snapshots/ab')").await;
        assert!(id.contains("snapshot id has 3 to 255"), "{id}");
        let project = refused("SELECT * FROM pubsub_snapshots('projects/demo/x')").await;
        assert!(project.contains("'pubsub_snapshots project'"), "{project}");
        let many = refused("SELECT * FROM pubsub_snapshots('demo', 'more')").await;
        assert!(many.contains("pubsub_snapshots(project)"), "{many}");
    }

    #[test]
    fn a_project_is_taken_with_or_without_its_prefix() {
        assert_eq!(project_name("demo").unwrap(), "projects/demo");
        assert_eq!(project_name("projects/demo").unwrap(), "projects/demo");
        assert!(project_name("projects/").is_err());
    }
}
