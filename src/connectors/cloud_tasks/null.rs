//! The null method of this connector's service (feature `testing`): what
//! `gcp-sql serve-null --service cloud-tasks` answers, written straight from the counted request
//! (see [`crate::bench::null_method`]).

use prost::bytes::BufMut;
use prost::encoding::WireType;

use crate::bench::null_method::{
    CountedRequest, MAX_REQUEST_BYTES, NullAnswer, NullMethod, NullService, WriteOnly, routes,
};

/// The gRPC service of the method.
const SERVICE_NAME: &str = "google.cloud.tasks.v2.CloudTasks";

/// This service's null method, as its descriptor carries it.
pub static NULL_METHOD: NullMethod = NullMethod {
    name: "cloud-tasks",
    method_path: super::client::CREATE_TASK_PATH,
    records_word: "tasks",
    max_request_bytes: MAX_REQUEST_BYTES,
    routes: routes::<NullTask>,
};

impl NullService {
    /// The Cloud Tasks null service.
    #[allow(non_upper_case_globals)]
    pub const CloudTasks: NullService = NullService::of(&NULL_METHOD);
}

/// A `Task` carrying only its name, `QUEUE/tasks/ID`.
#[derive(Debug)]
struct NullTask {
    queue: Vec<u8>,
    id: u64,
}

/// Field number of `Task.name`.
const TASK_NAME_FIELD: u32 = 1;
/// What joins the queue and the task id in a task name.
const TASKS_SEGMENT: &[u8] = b"/tasks/";

impl NullTask {
    fn name_len(&self) -> usize {
        self.queue.len() + TASKS_SEGMENT.len() + itoa::Buffer::new().format(self.id).len()
    }
}

impl WriteOnly for NullTask {
    fn write(&self, buf: &mut impl BufMut) {
        prost::encoding::encode_key(TASK_NAME_FIELD, WireType::LengthDelimited, buf);
        prost::encoding::encode_varint(self.name_len() as u64, buf);
        buf.put_slice(&self.queue);
        buf.put_slice(TASKS_SEGMENT);
        buf.put_slice(itoa::Buffer::new().format(self.id).as_bytes());
    }

    fn written_len(&self) -> usize {
        let name = self.name_len();
        1 + prost::encoding::encoded_len_varint(name as u64) + name
    }
}

impl NullAnswer for NullTask {
    const SERVICE: &'static str = SERVICE_NAME;
    const STREAMING: bool = false;
    fn answer(request: CountedRequest, first_id: u64) -> Self {
        NullTask {
            queue: request.destination,
            id: first_id,
        }
    }
}

#[cfg(test)]
mod tests {
    use gcloud_sdk::google::cloud::tasks::v2::Task;
    use prost::Message as _;

    use super::*;
    use crate::bench::null_method::Answer;

    #[test]
    fn task_response_encodes_as_the_generated_type_named_after_the_queue() {
        let response = Answer(NullTask {
            queue: b"projects/p/locations/l/queues/q".to_vec(),
            id: 1234,
        });
        let bytes = response.encode_to_vec();
        assert_eq!(bytes.len(), response.encoded_len());
        let decoded = Task::decode(bytes.as_slice()).unwrap();
        assert_eq!(decoded.name, "projects/p/locations/l/queues/q/tasks/1234");
    }
}
