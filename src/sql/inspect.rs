//! Emulator inspection table functions for Bigtable and Cloud Tasks, the counterparts of
//! `pubsub_subscribe` and `pubsub_pull` ([`crate::connectors::pubsub::inspect`]):
//!
//! * `bigtable_read(table [, max_rows])` reads up to `max_rows` rows (default 100) of a table
//!   and returns one row per cell: `row_key`, `family`, `qualifier`, `value` (the bytes as text
//!   when they are UTF-8, else null), `value_bytes` (the bytes as they are) and `timestamp`
//!   (the cell's version). Every version of a cell is listed, newest first.
//! * `cloud_tasks_create_queue(queue [, paused])` creates a queue (`projects/P/locations/L/
//!   queues/Q`) when it does not exist and sets its state: paused unless `paused` is `false`.
//!   It returns one row: `queue`, `created`, `state`.
//! * `cloud_tasks_list(queue [, max_tasks])` lists up to `max_tasks` tasks (default 100) of a
//!   queue: `task`, `http_method`, `url`, `headers` (a JSON object), `body` (text when UTF-8,
//!   else null), `body_bytes`, `schedule_time`, `dispatch_count`.
//!
//! Why a paused queue: `gcloud-tasks-emulator` (0.6) calls each task's URL as soon as its queue
//! runs, forgets a task once its URL answered 2xx, and calls a failing one again and again. In a
//! paused queue every task stays listed, which is what a quickstart or a check wants to see.
//! The emulator starts with no queue at all (and `gcloud tasks queues create` does not work
//! against it), so `cloud_tasks_create_queue` is how a session gets one.
//!
//! Each function talks only to the emulator its variable names (`BIGTABLE_EMULATOR_HOST`,
//! `CLOUD_TASKS_EMULATOR_HOST`; `gcp-sql --emulators` sets both), and fails otherwise: they are
//! for quickstarts, demos and checks, never for a production table or queue. Their arguments
//! (literals only) are checked when the statement is planned, before anything is contacted.
//! [`crate::sql::register_inspection`] installs them; [`crate::sql::register`] does not.
//!
//! ```sql
//! SELECT * FROM cloud_tasks_create_queue('projects/demo/locations/local/queues/jobs');
//! INSERT INTO jobs SELECT * FROM 'jobs.csv';
//! SELECT url, body FROM cloud_tasks_list('projects/demo/locations/local/queues/jobs');
//! SELECT row_key, qualifier, value FROM bigtable_read('projects/demo/instances/i/tables/t', 10);
//! ```

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::array::{
    ArrayRef, BinaryArray, BooleanArray, Int32Array, RecordBatch, StringArray,
    TimestampMicrosecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::ScalarValue;
use datafusion::datasource::TableType;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::Result as DFResult;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use gcloud_sdk::google::bigtable::v2::ReadRowsRequest;
use gcloud_sdk::google::bigtable::v2::bigtable_client::BigtableClient;
use gcloud_sdk::google::bigtable::v2::read_rows_response::CellChunk;
use gcloud_sdk::google::bigtable::v2::read_rows_response::cell_chunk::RowStatus;
use gcloud_sdk::google::cloud::tasks::v2::cloud_tasks_client::CloudTasksClient;
use gcloud_sdk::google::cloud::tasks::v2::{
    CreateQueueRequest, HttpMethod, ListQueuesRequest, ListTasksRequest, PauseQueueRequest, Queue,
    ResumeQueueRequest, Task, queue, task,
};
use tonic::transport::Channel;

use crate::connectors::ConnectorKind;
use crate::connectors::bigtable::names::bigtable_table;
use crate::connectors::cloud_tasks::names::cloud_tasks_queue;
use crate::error::{Error, Result};

/// Rows `bigtable_read` reads when `max_rows` is not given.
pub const DEFAULT_READ_ROWS: i64 = 100;
/// Most rows one `bigtable_read` call reads.
pub const MAX_READ_ROWS: i64 = 100_000;
/// Tasks `cloud_tasks_list` lists when `max_tasks` is not given.
pub const DEFAULT_LIST_TASKS: i64 = 100;
/// Most tasks one `cloud_tasks_list` call lists.
pub const MAX_LIST_TASKS: i64 = 100_000;
/// Tasks asked for per `ListTasks` page (the service's largest page).
const LIST_PAGE_SIZE: i32 = 1000;
/// Largest `ListTasks` answer `cloud_tasks_list` decodes. The emulator ignores `page_size` and
/// answers with every task of the queue in one message (about 1.5 KiB a task with a short body),
/// far past tonic's default 4 MiB once a queue holds a few thousand tasks: this bound lets a
/// listing of [`MAX_LIST_TASKS`] tasks with bodies of several KiB through.
const MAX_LIST_RESPONSE_BYTES: usize = 1 << 30;
/// Largest `ReadRows` answer `bigtable_read` decodes: one message may carry a whole row, and a
/// Bigtable row may hold up to 256 MiB.
const MAX_READ_RESPONSE_BYTES: usize = 264 << 20;
/// Deadline of each RPC of these functions: an emulator on this machine answers at once.
const RPC_TIMEOUT: Duration = Duration::from_secs(30);

/// The `bigtable_read(table [, max_rows])` table function.
#[derive(Debug, Default)]
pub struct BigtableReadFunction;

/// The `cloud_tasks_create_queue(queue [, paused])` table function.
#[derive(Debug, Default)]
pub struct CloudTasksCreateQueueFunction;

/// The `cloud_tasks_list(queue [, max_tasks])` table function.
#[derive(Debug, Default)]
pub struct CloudTasksListFunction;

impl TableFunctionImpl for BigtableReadFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DFResult<Arc<dyn TableProvider>> {
        let exprs = args.exprs();
        let function = "bigtable_read";
        check_arity(function, exprs, 2, "(table [, max_rows])")?;
        let text = string_arg(function, exprs, 0, "table")?;
        let table = bigtable_table(&text, None)
            .map_err(|rule| Error::invalid(format!("{function} table"), text.clone(), rule))?;
        let max = count_arg(
            function,
            exprs,
            1,
            "max_rows",
            DEFAULT_READ_ROWS,
            MAX_READ_ROWS,
        )?;
        Ok(Arc::new(Inspection {
            action: Action::Read { table, max },
        }))
    }
}

impl TableFunctionImpl for CloudTasksCreateQueueFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DFResult<Arc<dyn TableProvider>> {
        let exprs = args.exprs();
        let function = "cloud_tasks_create_queue";
        check_arity(function, exprs, 2, "(queue [, paused])")?;
        let queue = queue_arg(function, exprs)?;
        let paused = match exprs.get(1) {
            None => true,
            Some(Expr::Literal(ScalarValue::Boolean(Some(paused)), _)) => *paused,
            Some(other) => {
                return Err(Error::invalid(
                    format!("{function} paused"),
                    other.to_string(),
                    "expected true or false",
                )
                .into());
            }
        };
        Ok(Arc::new(Inspection {
            action: Action::CreateQueue { queue, paused },
        }))
    }
}

impl TableFunctionImpl for CloudTasksListFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DFResult<Arc<dyn TableProvider>> {
        let exprs = args.exprs();
        let function = "cloud_tasks_list";
        check_arity(function, exprs, 2, "(queue [, max_tasks])")?;
        let queue = queue_arg(function, exprs)?;
        let max = count_arg(
            function,
            exprs,
            1,
            "max_tasks",
            DEFAULT_LIST_TASKS,
            MAX_LIST_TASKS,
        )?;
        Ok(Arc::new(Inspection {
            action: Action::List { queue, max },
        }))
    }
}

fn check_arity(function: &str, exprs: &[Expr], most: usize, usage: &str) -> DFResult<()> {
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

fn string_arg(function: &str, exprs: &[Expr], index: usize, name: &str) -> DFResult<String> {
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

fn queue_arg(function: &str, exprs: &[Expr]) -> DFResult<String> {
    let text = string_arg(function, exprs, 0, "queue")?;
    Ok(cloud_tasks_queue(&text, None, None)
        .map_err(|rule| Error::invalid(format!("{function} queue"), text.clone(), rule))?)
}

fn count_arg(
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

#[derive(Debug, Clone)]
enum Action {
    Read { table: String, max: usize },
    CreateQueue { queue: String, paused: bool },
    List { queue: String, max: usize },
}

/// A table whose rows come from the emulator when it is scanned.
#[derive(Debug)]
struct Inspection {
    action: Action,
}

fn utc_micros() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

fn read_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("row_key", DataType::Utf8, false),
        Field::new("family", DataType::Utf8, false),
        Field::new("qualifier", DataType::Utf8, false),
        Field::new("value", DataType::Utf8, true),
        Field::new("value_bytes", DataType::Binary, false),
        Field::new("timestamp", utc_micros(), false),
    ]))
}

fn create_queue_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("queue", DataType::Utf8, false),
        Field::new("created", DataType::Boolean, false),
        Field::new("state", DataType::Utf8, false),
    ]))
}

fn list_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("task", DataType::Utf8, false),
        Field::new("http_method", DataType::Utf8, true),
        Field::new("url", DataType::Utf8, true),
        Field::new("headers", DataType::Utf8, false),
        Field::new("body", DataType::Utf8, true),
        Field::new("body_bytes", DataType::Binary, false),
        Field::new("schedule_time", utc_micros(), true),
        Field::new("dispatch_count", DataType::Int32, false),
    ]))
}

#[async_trait]
impl TableProvider for Inspection {
    fn schema(&self) -> SchemaRef {
        match self.action {
            Action::Read { .. } => read_schema(),
            Action::CreateQueue { .. } => create_queue_schema(),
            Action::List { .. } => list_schema(),
        }
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
        let batch = match &self.action {
            Action::Read { table, max } => read_rows(table, *max).await?,
            Action::CreateQueue { queue, paused } => create_queue(queue, *paused).await?,
            Action::List { queue, max } => list_tasks(queue, *max).await?,
        };
        let schema = batch.schema();
        Ok(MemorySourceConfig::try_new_exec(
            &[vec![batch]],
            schema,
            projection.cloned(),
        )?)
    }
}

/// A channel to the emulator of `kind`, named by its variable; an error when it is not set.
fn emulator_channel(kind: ConnectorKind, function: &str) -> Result<Channel> {
    let var = kind.emulator_env_var();
    match std::env::var(var).ok().filter(|h| !h.trim().is_empty()) {
        Some(host) => Ok(crate::emulators::plaintext_endpoint(host.trim())?.connect_lazy()),
        None => Err(Error::Connect {
            endpoint: kind.public_endpoint().to_string(),
            message: format!(
                "{function} talks to an emulator only: set {var} (gcp-sql --emulators does)"
            ),
        }),
    }
}

fn request<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(RPC_TIMEOUT);
    request
}

fn rpc_error(operation: &'static str, destination: &str, status: tonic::Status) -> Error {
    Error::rpc(operation, destination, &status, 1)
}

/// One cell read back: row key, family, qualifier, timestamp (µs), value.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Cell {
    row_key: Vec<u8>,
    family: String,
    qualifier: Vec<u8>,
    timestamp_micros: i64,
    value: Vec<u8>,
}

/// Rebuilds cells from `ReadRows` chunks (the protocol of the `ReadRowsResponse.CellChunk`
/// reference): a chunk names its row key, family and qualifier only when they change, a value
/// may be split over several chunks (`value_size` is set on all but the last), and the cells of
/// a row count only once a chunk commits the row (a reset drops them).
#[derive(Debug, Default)]
struct CellMerger {
    done: Vec<Cell>,
    row: Vec<Cell>,
    row_key: Vec<u8>,
    family: String,
    qualifier: Vec<u8>,
    /// A cell whose value continues in the next chunk.
    partial: Option<Cell>,
}

impl CellMerger {
    fn push(&mut self, chunk: CellChunk) -> Result<()> {
        if let Some(partial) = &mut self.partial {
            partial.value.extend_from_slice(&chunk.value);
            if chunk.value_size == 0 {
                let cell = self.partial.take().expect("a partial cell");
                self.row.push(cell);
            }
        } else if chunk.row_status != Some(RowStatus::ResetRow(true)) {
            if !chunk.row_key.is_empty() {
                if chunk.row_key != self.row_key && !self.row.is_empty() {
                    return Err(protocol_error(
                        "a new row began before the last was committed",
                    ));
                }
                self.row_key = chunk.row_key;
            }
            if let Some(family) = chunk.family_name {
                self.family = family;
                if chunk.qualifier.is_none() {
                    return Err(protocol_error("a new family came without a qualifier"));
                }
            }
            if let Some(qualifier) = chunk.qualifier {
                self.qualifier = qualifier;
            }
            let cell = Cell {
                row_key: self.row_key.clone(),
                family: self.family.clone(),
                qualifier: self.qualifier.clone(),
                timestamp_micros: chunk.timestamp_micros,
                value: chunk.value,
            };
            if chunk.value_size > 0 {
                self.partial = Some(cell);
            } else {
                self.row.push(cell);
            }
        }
        match chunk.row_status {
            Some(RowStatus::ResetRow(true)) => {
                self.row.clear();
                self.partial = None;
                self.end_row();
            }
            Some(RowStatus::CommitRow(true)) => {
                if self.partial.is_some() {
                    return Err(protocol_error(
                        "a row was committed in the middle of a value",
                    ));
                }
                self.done.append(&mut self.row);
                self.end_row();
            }
            _ => {}
        }
        Ok(())
    }

    fn end_row(&mut self) {
        self.row_key.clear();
        self.family.clear();
        self.qualifier.clear();
    }

    fn finish(self) -> Result<Vec<Cell>> {
        if !self.row.is_empty() || self.partial.is_some() {
            return Err(protocol_error("the stream ended inside a row"));
        }
        Ok(self.done)
    }
}

fn protocol_error(what: &str) -> Error {
    Error::Unsupported(format!(
        "bigtable_read: ReadRows answered out of order: {what}"
    ))
}

async fn read_rows(table: &str, max: usize) -> Result<RecordBatch> {
    let mut client = BigtableClient::new(emulator_channel(
        crate::connectors::bigtable::KIND,
        "bigtable_read",
    )?)
    .max_decoding_message_size(MAX_READ_RESPONSE_BYTES);
    let mut stream = client
        .read_rows(request(ReadRowsRequest {
            table_name: table.to_string(),
            rows_limit: i64::try_from(max).unwrap_or(MAX_READ_ROWS),
            ..Default::default()
        }))
        .await
        .map_err(|status| rpc_error("ReadRows", table, status))?
        .into_inner();
    let mut merger = CellMerger::default();
    while let Some(response) = stream
        .message()
        .await
        .map_err(|status| rpc_error("ReadRows", table, status))?
    {
        for chunk in response.chunks {
            merger.push(chunk)?;
        }
    }
    cells_batch(&merger.finish()?)
}

fn cells_batch(cells: &[Cell]) -> Result<RecordBatch> {
    let lossy = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(
            cells.iter().map(|c| lossy(&c.row_key)),
        )),
        Arc::new(StringArray::from_iter_values(
            cells.iter().map(|c| c.family.as_str()),
        )),
        Arc::new(StringArray::from_iter_values(
            cells.iter().map(|c| lossy(&c.qualifier)),
        )),
        Arc::new(StringArray::from_iter(
            cells.iter().map(|c| std::str::from_utf8(&c.value).ok()),
        )),
        Arc::new(BinaryArray::from_iter_values(
            cells.iter().map(|c| c.value.as_slice()),
        )),
        Arc::new(
            TimestampMicrosecondArray::from_iter_values(cells.iter().map(|c| c.timestamp_micros))
                .with_timezone("UTC"),
        ),
    ];
    Ok(RecordBatch::try_new(read_schema(), columns)?)
}

fn tasks_client(function: &str) -> Result<CloudTasksClient<Channel>> {
    Ok(CloudTasksClient::new(emulator_channel(
        crate::connectors::cloud_tasks::KIND,
        function,
    )?)
    .max_decoding_message_size(MAX_LIST_RESPONSE_BYTES))
}

/// The `projects/P/locations/L` part of a full queue name.
fn queue_parent(queue: &str) -> &str {
    queue
        .rsplit_once("/queues/")
        .map_or(queue, |(parent, _)| parent)
}

/// Whether `queue` exists on the emulator (its `GetQueue` of a missing queue is an internal
/// error, so the queues of its location are listed instead).
async fn queue_exists(client: &mut CloudTasksClient<Channel>, queue: &str) -> Result<bool> {
    let parent = queue_parent(queue);
    let mut page_token = String::new();
    loop {
        let page = client
            .list_queues(request(ListQueuesRequest {
                parent: parent.to_string(),
                page_token: page_token.clone(),
                ..Default::default()
            }))
            .await
            .map_err(|status| rpc_error("ListQueues", parent, status))?
            .into_inner();
        if page.queues.iter().any(|q| q.name == queue) {
            return Ok(true);
        }
        if page.next_page_token.is_empty() {
            return Ok(false);
        }
        page_token = page.next_page_token;
    }
}

fn state_name(queue: &Queue) -> String {
    queue::State::try_from(queue.state)
        .map(|s| s.as_str_name().to_string())
        .unwrap_or_else(|_| queue.state.to_string())
}

async fn create_queue(queue: &str, paused: bool) -> Result<RecordBatch> {
    let mut client = tasks_client("cloud_tasks_create_queue")?;
    let created = !queue_exists(&mut client, queue).await?;
    if created {
        client
            .create_queue(request(CreateQueueRequest {
                parent: queue_parent(queue).to_string(),
                queue: Some(Queue {
                    name: queue.to_string(),
                    ..Default::default()
                }),
            }))
            .await
            .map_err(|status| rpc_error("CreateQueue", queue, status))?;
    }
    let now = if paused {
        client
            .pause_queue(request(PauseQueueRequest {
                name: queue.to_string(),
            }))
            .await
            .map_err(|status| rpc_error("PauseQueue", queue, status))?
    } else {
        client
            .resume_queue(request(ResumeQueueRequest {
                name: queue.to_string(),
            }))
            .await
            .map_err(|status| rpc_error("ResumeQueue", queue, status))?
    }
    .into_inner();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(vec![queue.to_string()])),
        Arc::new(BooleanArray::from(vec![created])),
        Arc::new(StringArray::from(vec![state_name(&now)])),
    ];
    Ok(RecordBatch::try_new(create_queue_schema(), columns)?)
}

async fn list_tasks(queue: &str, max: usize) -> Result<RecordBatch> {
    let function = "cloud_tasks_list";
    let mut client = tasks_client(function)?;
    if !queue_exists(&mut client, queue).await? {
        return Err(Error::Unsupported(format!(
            "{function}: queue '{queue}' does not exist on the emulator; create it with \
             SELECT * FROM cloud_tasks_create_queue('{queue}')"
        )));
    }
    let mut tasks: Vec<Task> = Vec::new();
    let mut page_token = String::new();
    while tasks.len() < max {
        let page = client
            .list_tasks(request(ListTasksRequest {
                parent: queue.to_string(),
                response_view: task::View::Full as i32,
                page_size: LIST_PAGE_SIZE,
                page_token: page_token.clone(),
            }))
            .await
            .map_err(|status| rpc_error("ListTasks", queue, status))?
            .into_inner();
        tasks.extend(page.tasks);
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    tasks.truncate(max);
    tasks_batch(&tasks)
}

/// The HTTP request of a task, if it has one.
fn http_request(task: &Task) -> Option<&gcloud_sdk::google::cloud::tasks::v2::HttpRequest> {
    match &task.message_type {
        Some(task::MessageType::HttpRequest(http)) => Some(http),
        _ => None,
    }
}

fn tasks_batch(tasks: &[Task]) -> Result<RecordBatch> {
    let empty: &[u8] = &[];
    let headers = |task: &Task| {
        let mut pairs: Vec<(&String, &String)> = http_request(task)
            .map(|h| h.headers.iter().collect())
            .unwrap_or_default();
        pairs.sort();
        serde_json::to_string(
            &pairs
                .into_iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect::<serde_json::Map<_, _>>(),
        )
        .unwrap_or_default()
    };
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(
            tasks.iter().map(|t| t.name.as_str()),
        )),
        Arc::new(StringArray::from_iter(tasks.iter().map(|t| {
            http_request(t).map(|h| {
                HttpMethod::try_from(h.http_method)
                    .map(|m| m.as_str_name())
                    .unwrap_or("HTTP_METHOD_UNSPECIFIED")
            })
        }))),
        Arc::new(StringArray::from_iter(
            tasks
                .iter()
                .map(|t| http_request(t).map(|h| h.url.as_str())),
        )),
        Arc::new(StringArray::from_iter_values(tasks.iter().map(headers))),
        Arc::new(StringArray::from_iter(tasks.iter().map(|t| {
            http_request(t).and_then(|h| std::str::from_utf8(&h.body).ok())
        }))),
        Arc::new(BinaryArray::from_iter_values(
            tasks
                .iter()
                .map(|t| http_request(t).map_or(empty, |h| h.body.as_slice())),
        )),
        Arc::new(
            TimestampMicrosecondArray::from_iter(tasks.iter().map(|t| {
                t.schedule_time
                    .as_ref()
                    .map(|s| s.seconds * 1_000_000 + i64::from(s.nanos) / 1_000)
            }))
            .with_timezone("UTC"),
        ),
        Arc::new(Int32Array::from_iter_values(
            tasks.iter().map(|t| t.dispatch_count),
        )),
    ];
    Ok(RecordBatch::try_new(list_schema(), columns)?)
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::Array;
    use datafusion::prelude::SessionContext;

    use super::*;

    fn chunk(
        key: &str,
        family: Option<&str>,
        qualifier: Option<&str>,
        ts: i64,
        value: &str,
        value_size: i32,
        status: Option<RowStatus>,
    ) -> CellChunk {
        CellChunk {
            row_key: key.as_bytes().to_vec(),
            family_name: family.map(str::to_string),
            qualifier: qualifier.map(|q| q.as_bytes().to_vec()),
            timestamp_micros: ts,
            labels: Vec::new(),
            value: value.as_bytes().to_vec(),
            value_size,
            row_status: status,
        }
    }

    fn cell(key: &str, family: &str, qualifier: &str, ts: i64, value: &str) -> Cell {
        Cell {
            row_key: key.into(),
            family: family.into(),
            qualifier: qualifier.into(),
            timestamp_micros: ts,
            value: value.into(),
        }
    }

    #[test]
    fn chunks_become_cells_with_split_values_and_inherited_names() {
        let mut merger = CellMerger::default();
        for c in [
            chunk("r1", Some("c"), Some("url"), 2000, "/bl", 5, None),
            chunk("", None, None, 0, "og", 0, None),
            // Same family and qualifier, an older version.
            chunk("", None, None, 1000, "/", 0, None),
            chunk(
                "",
                None,
                Some("n"),
                1000,
                "x",
                0,
                Some(RowStatus::CommitRow(true)),
            ),
            chunk(
                "r2",
                Some("d"),
                Some("q"),
                5,
                "v",
                0,
                Some(RowStatus::CommitRow(true)),
            ),
        ] {
            merger.push(c).unwrap();
        }
        assert_eq!(
            merger.finish().unwrap(),
            vec![
                cell("r1", "c", "url", 2000, "/blog"),
                cell("r1", "c", "url", 1000, "/"),
                cell("r1", "c", "n", 1000, "x"),
                cell("r2", "d", "q", 5, "v"),
            ]
        );
    }

    #[test]
    fn a_reset_row_drops_its_cells_and_an_unfinished_row_is_an_error() {
        let mut merger = CellMerger::default();
        merger
            .push(chunk("r1", Some("c"), Some("a"), 1, "old", 0, None))
            .unwrap();
        merger
            .push(chunk(
                "",
                None,
                None,
                0,
                "",
                0,
                Some(RowStatus::ResetRow(true)),
            ))
            .unwrap();
        merger
            .push(chunk(
                "r1",
                Some("c"),
                Some("a"),
                1,
                "new",
                0,
                Some(RowStatus::CommitRow(true)),
            ))
            .unwrap();
        assert_eq!(
            merger.finish().unwrap(),
            vec![cell("r1", "c", "a", 1, "new")]
        );

        let mut open = CellMerger::default();
        open.push(chunk("r1", Some("c"), Some("a"), 1, "v", 0, None))
            .unwrap();
        assert!(open.finish().is_err());
    }

    #[test]
    fn values_are_text_only_when_utf8() {
        let mut binary = cell("k", "c", "n", 7, "");
        binary.value = vec![0xff, 0x00];
        let batch = cells_batch(&[cell("k", "c", "url", 7, "/a"), binary]).unwrap();
        let value = batch
            .column(3)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        assert_eq!(value.value(0), "/a");
        assert!(value.is_null(1));
        let bytes = batch
            .column(4)
            .as_any()
            .downcast_ref::<BinaryArray>()
            .unwrap();
        assert_eq!(bytes.value(1), &[0xff, 0x00]);
    }

    async fn plan_error(sql: &str) -> String {
        let ctx = SessionContext::new();
        crate::sql::register_inspection(&ctx);
        ctx.sql(sql)
            .await
            .expect_err("the arguments are refused when planned")
            .to_string()
    }

    #[tokio::test]
    async fn arguments_are_checked_when_the_statement_is_planned() {
        for (sql, expected) in [
            (
                "SELECT * FROM bigtable_read('tables/t')",
                "expected 'projects/PROJECT/instances/INSTANCE/tables/TABLE'",
            ),
            (
                "SELECT * FROM bigtable_read('t')",
                "a short table id needs the 'instance' option",
            ),
            (
                "SELECT * FROM bigtable_read('projects/p/instances/i/tables/t', 0)",
                "an integer from 1 to 100000",
            ),
            (
                "SELECT * FROM bigtable_read('projects/p/instances/i/tables/t', 'ten')",
                "bigtable_read max_rows",
            ),
            (
                "SELECT * FROM bigtable_read()",
                "expected bigtable_read(table [, max_rows])",
            ),
            (
                "SELECT * FROM cloud_tasks_create_queue('projects/p/locations/l/queues/bad_id')",
                "a queue id has 1 to 100 letters, digits or hyphens",
            ),
            (
                "SELECT * FROM cloud_tasks_create_queue('projects/p/locations/l/queues/q', 'yes')",
                "expected true or false",
            ),
            (
                "SELECT * FROM cloud_tasks_list('q')",
                "a short queue id needs the 'project' and 'location' options",
            ),
            (
                "SELECT * FROM cloud_tasks_list('projects/p/locations/l/queues/q', 1, 2)",
                "expected cloud_tasks_list(queue [, max_tasks])",
            ),
            (
                "SELECT * FROM cloud_tasks_list(42)",
                "expected a string literal",
            ),
        ] {
            let error = plan_error(sql).await;
            assert!(error.contains(expected), "{sql}: {error}");
        }
    }

    /// Runs only where the emulator variables are unset (the unit tests never set them).
    #[tokio::test]
    async fn without_an_emulator_variable_nothing_is_contacted() {
        for (sql, var) in [
            (
                "SELECT * FROM bigtable_read('projects/p/instances/i/tables/t')",
                "BIGTABLE_EMULATOR_HOST",
            ),
            (
                "SELECT * FROM cloud_tasks_list('projects/p/locations/l/queues/q')",
                "CLOUD_TASKS_EMULATOR_HOST",
            ),
            (
                "SELECT * FROM cloud_tasks_create_queue('projects/p/locations/l/queues/q')",
                "CLOUD_TASKS_EMULATOR_HOST",
            ),
        ] {
            if std::env::var_os(var).is_some() {
                continue;
            }
            let ctx = SessionContext::new();
            crate::sql::register_inspection(&ctx);
            let error = ctx
                .sql(sql)
                .await
                .unwrap()
                .collect()
                .await
                .unwrap_err()
                .to_string();
            assert!(error.contains("talks to an emulator only"), "{error}");
            assert!(error.contains(var), "{error}");
        }
    }
}
