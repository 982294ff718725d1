//! One StreamingPull stream: the reading side of a source partition.
//!
//! The stream opens with the subscription, the stream's ack deadline
//! ([`STREAM_ACK_DEADLINE`](super::lease::STREAM_ACK_DEADLINE) by default) and the flow-control bounds
//! (`max_outstanding_messages`, `max_outstanding_bytes`, which the service honours on its side
//! too); an empty request every [`HEARTBEAT`] keeps it open while nothing flows. Each response
//! read is recorded in the partition's [`Outstanding`] set before it is handed on, and no
//! response is read while that set is full.
//!
//! A stream that ends, or fails with a transient status, is opened again after a backoff
//! ([`RECONNECT_INITIAL_BACKOFF`] doubling up to [`RECONNECT_MAX_BACKOFF`], jittered), for as
//! long as the source runs; the backoff restarts once a response arrives. A permanent status
//! ends the partition with an error that names the subscription and the status.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use gcloud_sdk::google::pubsub::v1::subscriber_client::SubscriberClient;
use gcloud_sdk::google::pubsub::v1::{ReceivedMessage, StreamingPullRequest};
use tokio::sync::mpsc::error::SendError;
use tokio::sync::{mpsc, watch};
use tonic::Code;

use super::SourceCounters;
use super::lease::{Outstanding, ack_deadline_seconds};
use super::ticket::AckQueue;
use crate::error::Error;
use crate::google::{GrpcChannel, ROUTING_HEADER, Reachability, nothing_listens, routing_value};

/// How often an empty request keeps an idle stream open (the Go subscriber's ping interval).
pub const HEARTBEAT: Duration = Duration::from_secs(30);
/// First wait before a stream is opened again.
pub const RECONNECT_INITIAL_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait before a stream is opened again.
pub const RECONNECT_MAX_BACKOFF: Duration = Duration::from_secs(10);
/// Largest StreamingPull response decoded: 64 MiB (one message is at most 10 MB; the bound
/// only keeps tonic's 4 MiB default from refusing a full response of large messages).
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// Whether a StreamingPull status is transient: the stream is opened again. These are the
/// codes the official subscribers reconnect on (the Node.js client's pull retry list,
/// `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`, `ABORTED`, `INTERNAL`, `UNAVAILABLE`, and the
/// Python client's `UNKNOWN`), plus `CANCELLED`, which a stream the server closes on its side
/// reports. The first six are the acknowledgement side's list too
/// ([`retryable_ack_status`](super::acks::retryable_ack_status)), so the pull side is that list
/// and `CANCELLED`.
pub fn retryable_pull_status(code: Code) -> bool {
    super::acks::retryable_ack_status(code) || code == Code::Cancelled
}

/// What the puller hands to the partition stream.
#[derive(Debug)]
pub enum Pulled {
    /// Messages of one response, already recorded as outstanding.
    Messages(Vec<ReceivedMessage>),
    /// The stream failed permanently.
    Failed(Error),
}

/// Whether, and how, the source was asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StopKind {
    /// Not asked.
    #[default]
    Running,
    /// Stop pulling; deliver and acknowledge what was read; nack the rest.
    Graceful,
    /// Stop at once; acknowledge nothing more.
    Abort,
}

/// Everything one puller needs.
#[derive(Debug, Clone)]
pub struct Puller {
    /// The channel to the service.
    pub channel: GrpcChannel,
    /// What is known of the address (a refused first connection to an emulator is fatal).
    pub reach: Reachability,
    /// `projects/P/subscriptions/S`.
    pub subscription: String,
    /// A stable id for this partition's stream, kept across reconnects.
    pub client_id: String,
    /// Flow control, sent to the service too.
    pub max_outstanding_messages: u64,
    /// Flow control, sent to the service too.
    pub max_outstanding_bytes: u64,
    /// The stream's ack deadline.
    pub ack_deadline: Duration,
    /// Where what the stream still brings once its reader is gone is nacked, so that it is
    /// not left leased to a closing stream until its deadline lapses.
    pub returns: AckQueue,
}

/// Waits for the next change of `rx`; never returns once its sender is gone (nothing can
/// change any more).
async fn changed<T>(rx: &mut watch::Receiver<T>) {
    if rx.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

fn message_bytes(m: &ReceivedMessage) -> u64 {
    m.message.as_ref().map_or(0, |m| m.data.len() as u64)
}

impl Puller {
    fn permanent(&self, status: &tonic::Status) -> Error {
        let hint = if status.code() == Code::NotFound {
            " (the subscription does not exist: create it on its topic first)"
        } else {
            ""
        };
        Error::Rpc {
            operation: "StreamingPull",
            destination: self.subscription.clone(),
            code: status.code(),
            message: format!("{}{hint}", status.message()),
            attempts: 1,
        }
    }

    /// Pulls until the stream stops (`stop` or `idle` says so), the receiver is gone, or a
    /// permanent status ends it (reported through `out`).
    pub async fn run(
        self,
        out: mpsc::UnboundedSender<Pulled>,
        outstanding: Arc<Outstanding>,
        counters: Arc<SourceCounters>,
        mut stop: watch::Receiver<StopKind>,
        mut idle: watch::Receiver<bool>,
    ) {
        let mut backoff = RECONNECT_INITIAL_BACKOFF;
        let stopped = |stop: &watch::Receiver<StopKind>, idle: &watch::Receiver<bool>| {
            *stop.borrow() != StopKind::Running || *idle.borrow()
        };
        'connect: loop {
            if stopped(&stop, &idle) {
                return;
            }
            let initial = StreamingPullRequest {
                subscription: self.subscription.clone(),
                stream_ack_deadline_seconds: ack_deadline_seconds(self.ack_deadline),
                client_id: self.client_id.clone(),
                max_outstanding_messages: i64::try_from(self.max_outstanding_messages)
                    .unwrap_or(i64::MAX),
                max_outstanding_bytes: i64::try_from(self.max_outstanding_bytes)
                    .unwrap_or(i64::MAX),
                ..Default::default()
            };
            let heartbeats = futures::stream::unfold((), |()| async {
                tokio::time::sleep(HEARTBEAT).await;
                Some((StreamingPullRequest::default(), ()))
            });
            let requests = futures::StreamExt::chain(
                futures::stream::once(async move { initial }),
                heartbeats,
            );
            let mut request = tonic::Request::new(requests);
            if let Ok(value) = routing_value(&[("subscription", &self.subscription)]) {
                request.metadata_mut().insert(ROUTING_HEADER, value);
            }
            let mut client = SubscriberClient::new(self.channel.clone())
                .max_decoding_message_size(MAX_RESPONSE_BYTES);
            let opened = tokio::select! {
                r = client.streaming_pull(request) => self.reach.observe(r),
                _ = changed(&mut stop) => continue 'connect,
                _ = changed(&mut idle) => continue 'connect,
                _ = out.closed() => return,
            };
            let status = match opened {
                Ok(response) => {
                    let mut stream = response.into_inner();
                    loop {
                        tokio::select! {
                            _ = outstanding.wait_for_room() => {}
                            _ = changed(&mut stop) => continue 'connect,
                            _ = changed(&mut idle) => continue 'connect,
                            _ = out.closed() => return,
                        }
                        let next = tokio::select! {
                            // A reader that is gone is seen before another response is taken.
                            biased;
                            _ = out.closed() => return,
                            next = stream.message() => next,
                            _ = changed(&mut stop) => continue 'connect,
                            _ = changed(&mut idle) => continue 'connect,
                        };
                        match next {
                            Ok(Some(response)) => {
                                backoff = RECONNECT_INITIAL_BACKOFF;
                                let messages = response.received_messages;
                                if messages.is_empty() {
                                    continue;
                                }
                                for m in &messages {
                                    outstanding.add(&m.ack_id, message_bytes(m));
                                }
                                counters
                                    .read
                                    .fetch_add(messages.len() as u64, Ordering::Relaxed);
                                if let Err(SendError(Pulled::Messages(messages))) =
                                    out.send(Pulled::Messages(messages))
                                {
                                    // The reader went away meanwhile (its statement ended):
                                    // these go back at once (unless the source was aborted).
                                    let ids: Vec<String> =
                                        messages.into_iter().map(|m| m.ack_id).collect();
                                    outstanding.remove(&ids);
                                    self.returns.nack(ids);
                                    return;
                                }
                            }
                            Ok(None) => break tonic::Status::unavailable("the stream ended"),
                            Err(status) => break status,
                        }
                    }
                }
                Err(status) => status,
            };
            if nothing_listens(&status) || !retryable_pull_status(status.code()) {
                let _ = out.send(Pulled::Failed(self.permanent(&status)));
                return;
            }
            counters.reconnects.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                subscription = %self.subscription,
                code = ?status.code(),
                "StreamingPull stream of {} ended ({}); opening it again in about {:?}",
                self.subscription,
                status.message(),
                backoff
            );
            let wait = backoff.mul_f64(0.5 + fastrand::f64() * 0.5);
            backoff = (backoff * 2).min(RECONNECT_MAX_BACKOFF);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = changed(&mut stop) => {}
                _ = changed(&mut idle) => {}
                _ = out.closed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_and_permanent_statuses() {
        for code in [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::Internal,
            Code::ResourceExhausted,
            Code::Aborted,
            Code::Unknown,
        ] {
            assert!(retryable_pull_status(code), "{code:?}");
        }
        for code in [
            Code::NotFound,
            Code::PermissionDenied,
            Code::Unauthenticated,
            Code::InvalidArgument,
            Code::FailedPrecondition,
        ] {
            assert!(!retryable_pull_status(code), "{code:?}");
        }
    }
}
