//! The subscription's side of a partition's settler: the
//! [`Acknowledger`](crate::core::delivery::settler::Acknowledger) that sends what the core's
//! settler ([`crate::core::delivery::settler`]) asks for as Pub/Sub calls.
//!
//! Acknowledgements travel as `Acknowledge`; nacks as `ModifyAckDeadline` with a deadline of 0
//! (the service delivers the messages again); lease extensions as `ModifyAckDeadline` with the
//! stream's ack deadline. At most [`MAX_IDS_PER_CALL`] ack ids a call, gathered for at most
//! [`ACK_GATHER`] ([`settler_config`]). A transient failure ([`retryable_ack_status`]) is
//! retried under [`ACK_RETRY`] through the core's retry loop ([`crate::core::retry::retry`]);
//! a call that still fails is logged and left: an acknowledgement that did not take means the
//! service delivers the message again (a duplicate, never a loss).

use std::time::Duration;

use async_trait::async_trait;
use gcloud_sdk::google::pubsub::v1::subscriber_client::SubscriberClient;
use gcloud_sdk::google::pubsub::v1::{AcknowledgeRequest, ModifyAckDeadlineRequest};

use super::lease::{ack_deadline_seconds, lease_interval};
pub use crate::connectors::pubsub::client::retryable_ack_status;
use crate::core::RetrySettings;
use crate::core::delivery::settler::{Acknowledger, SettlerConfig};
use crate::google::{GrpcChannel, ROUTING_HEADER, routing_value, with_deadline};

/// Most ack ids in one `Acknowledge` or `ModifyAckDeadline` call: 2,500, the batch limit of
/// Google's subscribers (a request must also stay under the service's 512 KiB request size,
/// which 2,500 ack ids of the usual length do).
pub const MAX_IDS_PER_CALL: usize = 2500;
/// How long a settler gathers acknowledgements and nacks before it sends them: 100 ms, the
/// acknowledgement batching delay of Google's subscribers.
pub const ACK_GATHER: Duration = Duration::from_millis(100);
/// Deadline of one acknowledgement, nack or lease call.
pub const ACK_CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// The retry of one acknowledgement, nack or lease call: 5 attempts, waiting 100 ms before
/// the first retry and doubling (100, 200, 400, 800 ms), each attempt with its own
/// [`ACK_CALL_TIMEOUT`] (set on the request).
pub const ACK_RETRY: RetrySettings =
    RetrySettings::doubling(5, Duration::from_millis(100), Duration::ZERO);

/// The settler of a subscription partition: Google's subscribers' gathering and call size,
/// leases extended every third of `ack_deadline` up to `max_lease`, calls retried under
/// [`ACK_RETRY`].
pub fn settler_config(max_lease: Duration, ack_deadline: Duration) -> SettlerConfig {
    SettlerConfig {
        gather: ACK_GATHER,
        max_ids_per_call: MAX_IDS_PER_CALL,
        lease_every: lease_interval(ack_deadline),
        max_lease,
        retry: ACK_RETRY,
    }
}

/// The RPC side of a settler: one subscription through one channel.
#[derive(Clone, Debug)]
pub struct AckClient {
    channel: GrpcChannel,
    subscription: String,
    /// What a lease extension sets, in seconds.
    lease_seconds: i32,
}

impl AckClient {
    /// A client for `subscription` over `channel`, extending leases by `ack_deadline`.
    pub fn new(
        channel: GrpcChannel,
        subscription: impl Into<String>,
        ack_deadline: Duration,
    ) -> Self {
        AckClient {
            channel,
            subscription: subscription.into(),
            lease_seconds: ack_deadline_seconds(ack_deadline),
        }
    }

    fn request<M>(&self, message: M) -> tonic::Request<M> {
        let mut request = with_deadline(
            tonic::Request::new(message),
            Some(ACK_CALL_TIMEOUT),
            self.channel.is_google(),
        );
        if let Ok(value) = routing_value(&[("subscription", &self.subscription)]) {
            request.metadata_mut().insert(ROUTING_HEADER, value);
        }
        request
    }

    async fn modify(&self, ids: &[String], seconds: i32) -> Result<(), tonic::Status> {
        SubscriberClient::new(self.channel.clone())
            .modify_ack_deadline(self.request(ModifyAckDeadlineRequest {
                subscription: self.subscription.clone(),
                ack_ids: ids.to_vec(),
                ack_deadline_seconds: seconds,
            }))
            .await
            .map(drop)
    }
}

#[async_trait]
impl Acknowledger<String> for AckClient {
    async fn ack(&self, ids: &[String]) -> Result<(), tonic::Status> {
        SubscriberClient::new(self.channel.clone())
            .acknowledge(self.request(AcknowledgeRequest {
                subscription: self.subscription.clone(),
                ack_ids: ids.to_vec(),
            }))
            .await
            .map(drop)
    }

    async fn nack(&self, ids: &[String]) -> Result<(), tonic::Status> {
        self.modify(ids, 0).await
    }

    async fn extend(&self, ids: &[String]) -> Result<(), tonic::Status> {
        self.modify(ids, self.lease_seconds).await
    }

    fn retryable(&self, status: &tonic::Status) -> bool {
        retryable_ack_status(status.code())
    }

    fn describe(&self) -> String {
        format!("subscription {}", self.subscription)
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;

    /// The pull side's list (tested in `pull.rs`) without `CANCELLED`.
    #[test]
    fn the_ack_side_retries_what_the_official_clients_retry() {
        use crate::connectors::pubsub::client::retryable_pull_status;
        for n in 0..=16 {
            let code = Code::from(n);
            let expected = code != Code::Cancelled && retryable_pull_status(code);
            assert_eq!(retryable_ack_status(code), expected, "{code:?}");
        }
        assert!(retryable_ack_status(Code::Unknown));
        assert!(!retryable_ack_status(Code::Cancelled));
    }

    #[test]
    fn a_partition_settles_as_googles_subscribers_do() {
        let c = settler_config(Duration::from_secs(3600), Duration::from_secs(60));
        assert_eq!(c.gather, ACK_GATHER);
        assert_eq!(c.max_ids_per_call, MAX_IDS_PER_CALL);
        assert_eq!(c.lease_every, Duration::from_secs(20));
        assert_eq!(c.retry.max_attempts, 5);
    }
}
