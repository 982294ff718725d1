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
//!
//! On a subscription with exactly-once delivery (the stream says so in its
//! `subscription_properties`, [`ExactlyOnce`]), the service confirms each acknowledgement: a
//! call that succeeds confirms every id it carried, and a failed one carries a
//! `google.rpc.ErrorInfo` whose reason is [`EXACTLY_ONCE_ACKID_FAILURE`] and whose metadata
//! maps each failed ack id to `TRANSIENT_FAILURE_*` (sent again) or `PERMANENT_FAILURE_*`
//! (refused for good: `PERMANENT_FAILURE_INVALID_ACK_ID` when the lease had lapsed); the ids
//! it does not name were taken ([`ack_failures`], ADR 0076). The stream also confirms the
//! receipt of each response's messages the same way before handing them on (`pull.rs`). This is what Google's Go, Java and
//! Python subscribers do with the same details.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use gcloud_sdk::google::pubsub::v1::subscriber_client::SubscriberClient;
use gcloud_sdk::google::pubsub::v1::{AcknowledgeRequest, ModifyAckDeadlineRequest};
use gcloud_sdk::google::rpc::{ErrorInfo, Status as RpcStatus};
use prost::Message as _;

use super::AckId;
use super::lease::{ack_deadline_seconds, lease_interval};
pub use crate::connectors::pubsub::client::retryable_ack_status;
use crate::core::RetrySettings;
use crate::core::delivery::settler::{Acknowledger, PerId, SettlerConfig};
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

/// The settler of a subscription partition: Google's subscribers' gathering, a call sent as
/// soon as it holds half the stream's `max_outstanding_messages` (at most
/// [`MAX_IDS_PER_CALL`]), leases extended every third of `ack_deadline` up to `max_lease`,
/// calls retried under [`ACK_RETRY`].
///
/// Why half the flow-control bound: the service sends a stream no more than its
/// `max_outstanding_messages` unacknowledged, so a call that waited for the full gathering
/// delay with the stream's whole window in it would stall the stream for that delay every
/// round (about 10,000 messages a second at 1,000 outstanding and 100 ms, whatever the
/// machine). Google's Rust subscriber sends a call at 1,000 ids, its default bound, for the
/// same reason.
pub fn settler_config(
    max_lease: Duration,
    ack_deadline: Duration,
    max_outstanding_messages: u64,
) -> SettlerConfig {
    let half = usize::try_from(max_outstanding_messages / 2).unwrap_or(usize::MAX);
    SettlerConfig {
        gather: ACK_GATHER,
        max_ids_per_call: half.clamp(1, MAX_IDS_PER_CALL),
        lease_every: lease_interval(ack_deadline),
        max_lease,
        retry: ACK_RETRY,
    }
}

/// The `ErrorInfo` reason of an acknowledgement that failed for some ids on a subscription
/// with exactly-once delivery.
pub const EXACTLY_ONCE_ACKID_FAILURE: &str = "EXACTLY_ONCE_ACKID_FAILURE";
/// The prefix of the per-id failures worth sending again.
pub const TRANSIENT_FAILURE_PREFIX: &str = "TRANSIENT_FAILURE_";

/// Whether the subscription delivers exactly once, as its stream last said
/// (`StreamingPullResponse.subscription_properties`); shared by a partition's puller and its
/// settler.
pub type ExactlyOnce = Arc<AtomicBool>;

/// The per-id failures an acknowledgement (or `ModifyAckDeadline`) status carries: the
/// metadata of its `ErrorInfo` whose reason is [`EXACTLY_ONCE_ACKID_FAILURE`], ack id to
/// failure. `None` when the status carries none (the call failed as a whole).
pub fn ack_failures(status: &tonic::Status) -> Option<std::collections::HashMap<String, String>> {
    let details = RpcStatus::decode(status.details()).ok()?;
    details
        .details
        .iter()
        .filter(|any| any.type_url.ends_with("/google.rpc.ErrorInfo"))
        .filter_map(|any| ErrorInfo::decode(any.value.as_slice()).ok())
        .find(|info| info.reason == EXACTLY_ONCE_ACKID_FAILURE)
        .map(|info| info.metadata)
}

/// The RPC side of a settler: one subscription through one channel.
#[derive(Clone, Debug)]
pub struct AckClient {
    channel: GrpcChannel,
    subscription: String,
    /// What a lease extension sets, in seconds.
    lease_seconds: i32,
    /// Whether the service confirms each acknowledgement.
    exactly_once: ExactlyOnce,
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
            exactly_once: ExactlyOnce::default(),
        }
    }

    /// The same client, confirming acknowledgements while `exactly_once` says the subscription
    /// delivers exactly once.
    pub fn with_exactly_once(mut self, exactly_once: ExactlyOnce) -> Self {
        self.exactly_once = exactly_once;
        self
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

    async fn modify(&self, ids: &[AckId], seconds: i32) -> Result<(), tonic::Status> {
        SubscriberClient::new(self.channel.clone())
            .modify_ack_deadline(self.request(ModifyAckDeadlineRequest {
                subscription: self.subscription.clone(),
                ack_ids: request_ids(ids),
                ack_deadline_seconds: seconds,
            }))
            .await
            .map(drop)
    }
}

/// The ack ids of a request. A plain copy of each `str`: `to_string` on an `Arc<str>` goes
/// through the formatting machinery, which showed in the source's profile (docs/benchmarks.md).
fn request_ids(ids: &[AckId]) -> Vec<String> {
    ids.iter().map(|id| String::from(&**id)).collect()
}

#[async_trait]
impl Acknowledger<AckId> for AckClient {
    async fn ack(&self, ids: &[AckId]) -> Result<(), tonic::Status> {
        SubscriberClient::new(self.channel.clone())
            .acknowledge(self.request(AcknowledgeRequest {
                subscription: self.subscription.clone(),
                ack_ids: request_ids(ids),
            }))
            .await
            .map(drop)
    }

    async fn nack(&self, ids: &[AckId]) -> Result<(), tonic::Status> {
        self.modify(ids, 0).await
    }

    async fn extend(&self, ids: &[AckId]) -> Result<(), tonic::Status> {
        self.modify(ids, self.lease_seconds).await
    }

    fn retryable(&self, status: &tonic::Status) -> bool {
        // A status that names ids is answered id by id (`per_id`), not by resending them all.
        retryable_ack_status(status.code()) && ack_failures(status).is_none()
    }

    fn confirms(&self) -> bool {
        self.exactly_once.load(Ordering::Acquire)
    }

    fn per_id(&self, status: &tonic::Status, ids: &[AckId]) -> Option<PerId<AckId>> {
        let failures = ack_failures(status)?;
        let mut split = PerId {
            transient: Vec::new(),
            refused: Vec::new(),
        };
        for id in ids {
            match failures.get(&**id) {
                Some(f) if f.starts_with(TRANSIENT_FAILURE_PREFIX) => {
                    split.transient.push(id.clone())
                }
                Some(_) => split.refused.push(id.clone()),
                None => {}
            }
        }
        Some(split)
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

    /// A status as the service sends it for an exactly-once acknowledgement that failed for
    /// some ids.
    fn exactly_once_failure(failures: &[(&str, &str)]) -> tonic::Status {
        let info = ErrorInfo {
            reason: EXACTLY_ONCE_ACKID_FAILURE.into(),
            domain: "pubsub.googleapis.com".into(),
            metadata: failures
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let details = RpcStatus {
            code: Code::InvalidArgument as i32,
            message: String::new(),
            details: vec![prost_types::Any {
                type_url: "type.googleapis.com/google.rpc.ErrorInfo".into(),
                value: info.encode_to_vec(),
            }],
        };
        tonic::Status::with_details(Code::InvalidArgument, "", details.encode_to_vec().into())
    }

    #[tokio::test]
    async fn per_id_failures_are_split_as_googles_subscribers_split_them() {
        let client = AckClient::new(
            GrpcChannel::Plaintext(
                crate::google::plaintext_endpoint("127.0.0.1:1")
                    .unwrap()
                    .connect_lazy(),
            ),
            "projects/p/subscriptions/s",
            Duration::from_secs(60),
        );
        let ids: Vec<AckId> = ["a", "b", "c", "d"].into_iter().map(AckId::from).collect();
        let status = exactly_once_failure(&[
            ("a", "PERMANENT_FAILURE_INVALID_ACK_ID"),
            ("b", "TRANSIENT_FAILURE_UNORDERED_ACK_ID"),
            ("c", "PERMANENT_FAILURE_OTHER"),
        ]);
        let split = client.per_id(&status, &ids).unwrap();
        let names = |ids: &[AckId]| ids.iter().map(|id| id.to_string()).collect::<Vec<_>>();
        assert_eq!(names(&split.transient), ["b"]);
        assert_eq!(names(&split.refused), ["a", "c"]);
        // Not resent as a whole: the ids are answered one by one.
        assert!(!client.retryable(&status));
        // A status without the details fails as a whole, and is retried by its code.
        let plain = tonic::Status::unavailable("down");
        assert!(client.per_id(&plain, &ids).is_none());
        assert!(client.retryable(&plain));
        assert!(!client.confirms());
        let eod = ExactlyOnce::default();
        let client = client.with_exactly_once(eod.clone());
        eod.store(true, Ordering::Release);
        assert!(client.confirms());
    }

    #[test]
    fn a_partition_settles_as_googles_subscribers_do() {
        let c = settler_config(Duration::from_secs(3600), Duration::from_secs(60), 1000);
        assert_eq!(c.gather, ACK_GATHER);
        assert_eq!(c.max_ids_per_call, 500, "half the stream's window");
        let wide = settler_config(Duration::from_secs(3600), Duration::from_secs(60), 100_000);
        assert_eq!(
            wide.max_ids_per_call, MAX_IDS_PER_CALL,
            "at most the service's call"
        );
        let one = settler_config(Duration::from_secs(3600), Duration::from_secs(60), 1);
        assert_eq!(one.max_ids_per_call, 1);
        assert_eq!(c.lease_every, Duration::from_secs(20));
        assert_eq!(c.retry.max_attempts, 5);
    }
}
