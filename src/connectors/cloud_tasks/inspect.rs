//! The Cloud Tasks connector's inspection functions, for the emulator:
//!
//! * `cloud_tasks_create_queue(queue [, paused])` creates a queue (`projects/P/locations/L/
//!   queues/Q`) when it does not exist and sets its state: paused unless `paused` is `false`.
//!   It returns one row: `queue`, `created`, `state`.
//! * `cloud_tasks_list(queue [, max_tasks])` lists up to `max_tasks` tasks (default
//!   [`DEFAULT_LIST_TASKS`]) of a queue: `task`, `http_method`, `url`, `headers` (a JSON object),
//!   `body` (text when UTF-8, else null), `body_bytes`, `schedule_time`, `dispatch_count`.
//!
//! Why a paused queue: `gcloud-tasks-emulator` (0.6) calls each task's URL as soon as its queue
//! runs, forgets a task once its URL answered 2xx, and calls a failing one again and again. In a
//! paused queue every task stays listed, which is what a quickstart or a check wants to see.
//! The emulator starts with no queue at all (and `gcloud tasks queues create` does not work
//! against it), so `cloud_tasks_create_queue` is how a session gets one.
//!
//! Both talk only to the emulator `CLOUD_TASKS_EMULATOR_HOST` names (`gcp-sql --emulators` sets
//! it), through the crate's channel and status mapping ([`crate::plan::inspect`] has the one
//! design every inspection function follows).
//!
//! ```sql
//! SELECT * FROM cloud_tasks_create_queue('projects/demo/locations/local/queues/jobs');
//! INSERT INTO jobs SELECT * FROM 'jobs.csv';
//! SELECT url, body FROM cloud_tasks_list('projects/demo/locations/local/queues/jobs');
//! ```

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::array::{
    ArrayRef, BinaryArray, BooleanArray, Int32Array, RecordBatch, StringArray,
    TimestampMicrosecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::error::Result as DFResult;
use datafusion::logical_expr::Expr;
use gcloud_sdk::google::cloud::tasks::v2::cloud_tasks_client::CloudTasksClient;
use gcloud_sdk::google::cloud::tasks::v2::{
    CreateQueueRequest, HttpMethod, ListQueuesRequest, ListTasksRequest, PauseQueueRequest, Queue,
    ResumeQueueRequest, Task, queue, task,
};

use super::names::cloud_tasks_queue;
use crate::error::{Error, Result};
use crate::google::{GrpcChannel, Reachability, with_deadline};
use crate::plan::inspect::{
    Inspection, InspectionFunctions, LazyTable, bool_arg, check_arity, count_arg, emulator_channel,
    name_arg, rpc_error, sorted_json_object, timestamp_micros, utc_micros,
};

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
/// Deadline of each RPC of these functions: an emulator on this machine answers at once.
const RPC_TIMEOUT: Duration = Duration::from_secs(30);

/// The Cloud Tasks connector's inspection functions: `cloud_tasks_create_queue` and
/// `cloud_tasks_list`.
pub fn inspection_functions() -> InspectionFunctions {
    vec![
        (
            "cloud_tasks_create_queue",
            Arc::new(CloudTasksCreateQueueFunction),
        ),
        (
            "cloud_tasks_list",
            Arc::new(CloudTasksListFunction::default()),
        ),
    ]
}

/// The `cloud_tasks_create_queue(queue [, paused])` table function.
#[derive(Debug, Default)]
pub struct CloudTasksCreateQueueFunction;

/// The `cloud_tasks_list(queue [, max_tasks])` table function.
#[derive(Debug, Default)]
pub struct CloudTasksListFunction {
    emulator_host: Option<String>,
}

impl CloudTasksListFunction {
    /// A `cloud_tasks_list` that talks to the emulator at `host` (`host:port`) rather than the
    /// one `CLOUD_TASKS_EMULATOR_HOST` names.
    pub fn with_emulator_host(host: impl Into<String>) -> Self {
        CloudTasksListFunction {
            emulator_host: Some(host.into()),
        }
    }
}

impl TableFunctionImpl for CloudTasksCreateQueueFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DFResult<Arc<dyn TableProvider>> {
        let exprs = args.exprs();
        let function = "cloud_tasks_create_queue";
        check_arity(function, exprs, 2, "(queue [, paused])")?;
        let queue = queue_arg(function, exprs)?;
        let paused = bool_arg(function, exprs, 1, "paused", true)?;
        Ok(LazyTable::provider(
            create_queue_schema(),
            CreateQueue { queue, paused },
        ))
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
        Ok(LazyTable::provider(
            list_schema(),
            ListTasks {
                queue,
                max,
                emulator_host: self.emulator_host.clone(),
            },
        ))
    }
}

fn queue_arg(function: &str, exprs: &[Expr]) -> DFResult<String> {
    name_arg(function, exprs, 0, "queue", |q| {
        cloud_tasks_queue(q, None, None)
    })
}

/// A `cloud_tasks_create_queue` call, on the emulator `CLOUD_TASKS_EMULATOR_HOST` names.
#[derive(Debug)]
struct CreateQueue {
    queue: String,
    paused: bool,
}

/// A `cloud_tasks_list` call (`emulator_host`: `None` is the one `CLOUD_TASKS_EMULATOR_HOST`
/// names).
#[derive(Debug)]
struct ListTasks {
    queue: String,
    max: usize,
    emulator_host: Option<String>,
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
impl Inspection for CreateQueue {
    async fn run(&self) -> Result<RecordBatch> {
        create_queue(&self.queue, self.paused).await
    }
}

#[async_trait]
impl Inspection for ListTasks {
    async fn run(&self) -> Result<RecordBatch> {
        list_tasks(&self.queue, self.max, self.emulator_host.as_deref()).await
    }
}

/// A client of the emulator, with the [`Reachability`] its calls pass through.
struct Tasks {
    client: CloudTasksClient<GrpcChannel>,
    reach: Reachability,
}

impl Tasks {
    fn connect(function: &str, host: Option<&str>) -> Result<Self> {
        let (channel, reach) = emulator_channel(function, super::SERVICE, host)?;
        Ok(Tasks {
            client: CloudTasksClient::new(channel)
                .max_decoding_message_size(MAX_LIST_RESPONSE_BYTES),
            reach,
        })
    }
}

fn request<T>(message: T) -> tonic::Request<T> {
    with_deadline(tonic::Request::new(message), Some(RPC_TIMEOUT), false)
}

/// The `projects/P/locations/L` part of a full queue name.
fn queue_parent(queue: &str) -> &str {
    queue
        .rsplit_once("/queues/")
        .map_or(queue, |(parent, _)| parent)
}

/// Whether `queue` exists on the emulator (its `GetQueue` of a missing queue is an internal
/// error, so the queues of its location are listed instead).
async fn queue_exists(tasks: &mut Tasks, queue: &str) -> Result<bool> {
    let parent = queue_parent(queue);
    let mut page_token = String::new();
    loop {
        let answer = tasks
            .client
            .list_queues(request(ListQueuesRequest {
                parent: parent.to_string(),
                page_token: page_token.clone(),
                ..Default::default()
            }))
            .await;
        let page = tasks
            .reach
            .observe(answer)
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
    let mut tasks = Tasks::connect("cloud_tasks_create_queue", None)?;
    let created = !queue_exists(&mut tasks, queue).await?;
    if created {
        let answer = tasks
            .client
            .create_queue(request(CreateQueueRequest {
                parent: queue_parent(queue).to_string(),
                queue: Some(Queue {
                    name: queue.to_string(),
                    ..Default::default()
                }),
            }))
            .await;
        tasks
            .reach
            .observe(answer)
            .map_err(|status| rpc_error("CreateQueue", queue, status))?;
    }
    let name = queue.to_string();
    let (operation, answer) = if paused {
        let answer = tasks
            .client
            .pause_queue(request(PauseQueueRequest { name }))
            .await;
        ("PauseQueue", answer)
    } else {
        let answer = tasks
            .client
            .resume_queue(request(ResumeQueueRequest { name }))
            .await;
        ("ResumeQueue", answer)
    };
    let now = tasks
        .reach
        .observe(answer)
        .map_err(|status| rpc_error(operation, queue, status))?
        .into_inner();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(vec![queue.to_string()])),
        Arc::new(BooleanArray::from(vec![created])),
        Arc::new(StringArray::from(vec![state_name(&now)])),
    ];
    Ok(RecordBatch::try_new(create_queue_schema(), columns)?)
}

async fn list_tasks(queue: &str, max: usize, host: Option<&str>) -> Result<RecordBatch> {
    let function = "cloud_tasks_list";
    let mut client = Tasks::connect(function, host)?;
    if !queue_exists(&mut client, queue).await? {
        return Err(Error::Unsupported(format!(
            "{function}: queue '{queue}' does not exist on the emulator; create it with \
             SELECT * FROM cloud_tasks_create_queue('{queue}')"
        )));
    }
    let mut tasks: Vec<Task> = Vec::new();
    let mut page_token = String::new();
    while tasks.len() < max {
        let answer = client
            .client
            .list_tasks(request(ListTasksRequest {
                parent: queue.to_string(),
                response_view: task::View::Full as i32,
                page_size: LIST_PAGE_SIZE,
                page_token: page_token.clone(),
            }))
            .await;
        let page = client
            .reach
            .observe(answer)
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
        sorted_json_object(
            http_request(task)
                .into_iter()
                .flat_map(|h| h.headers.iter()),
        )
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
                    .map(|s| timestamp_micros(s.seconds, s.nanos))
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
    use super::*;
    use crate::plan::inspect::test_support::{
        assert_needs_an_emulator, assert_nothing_answers, assert_plan_errors,
    };

    #[tokio::test]
    async fn arguments_are_checked_when_the_statement_is_planned() {
        assert_plan_errors(inspection_functions, &[
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
        ])
        .await;
    }

    /// Runs only where the emulator variable is unset (the unit tests never set it).
    #[tokio::test]
    async fn without_an_emulator_variable_nothing_is_contacted() {
        assert_needs_an_emulator(
            inspection_functions,
            "CLOUD_TASKS_EMULATOR_HOST",
            &[
                "SELECT * FROM cloud_tasks_list('projects/p/locations/l/queues/q')",
                "SELECT * FROM cloud_tasks_create_queue('projects/p/locations/l/queues/q')",
            ],
        )
        .await;
    }

    #[tokio::test]
    async fn a_call_to_an_address_where_nothing_listens_says_so() {
        assert_nothing_answers(
            "cloud_tasks_list",
            |address| Arc::new(CloudTasksListFunction::with_emulator_host(address)),
            "SELECT * FROM cloud_tasks_list('projects/p/locations/l/queues/q')",
        )
        .await;
    }
}
