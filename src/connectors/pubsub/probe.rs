//! The readiness probe of the Pub/Sub emulator (feature `testing`): one real `ListTopics` call,
//! which answers only once the emulator serves its API. The emulator launcher calls it, with
//! every connector's probe behind this one signature.

use gcloud_sdk::google::pubsub::v1::ListTopicsRequest;
use gcloud_sdk::google::pubsub::v1::publisher_client::PublisherClient;

use crate::connectors::google::GrpcChannel;

/// Makes one `ListTopics` call on `channel`; `Ok` once the emulator answers it.
pub async fn probe(channel: GrpcChannel) -> std::result::Result<(), tonic::Status> {
    PublisherClient::new(channel)
        .list_topics(ListTopicsRequest {
            project: "projects/readiness".into(),
            ..Default::default()
        })
        .await
        .map(drop)
}
