//! The readiness probe of the Cloud Tasks emulator (feature `testing`): one real `ListQueues` call,
//! which answers only once the emulator serves its API. The emulator launcher calls it, with
//! every connector's probe behind this one signature.

use gcloud_sdk::google::cloud::tasks::v2::ListQueuesRequest;
use gcloud_sdk::google::cloud::tasks::v2::cloud_tasks_client::CloudTasksClient;

use crate::connectors::google::GrpcChannel;

/// Makes one `ListQueues` call on `channel`; `Ok` once the emulator answers it.
pub async fn probe(channel: GrpcChannel) -> std::result::Result<(), tonic::Status> {
    CloudTasksClient::new(channel)
        .list_queues(ListQueuesRequest {
            parent: "projects/readiness/locations/readiness".into(),
            ..Default::default()
        })
        .await
        .map(drop)
}
