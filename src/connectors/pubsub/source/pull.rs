//! One StreamingPull stream: the reading side of a source partition.
//!
//! The stream opens with the subscription, the stream's ack deadline
//! ([`STREAM_ACK_DEADLINE`](super::lease::STREAM_ACK_DEADLINE) by default) and the flow-control bounds
//! (`max_outstanding_messages`, `max_outstanding_bytes`, which the service honours on its side
//! too); an empty request every [`HEARTBEAT`] keeps it open while nothing flows. Each response
//! read is recorded in the partition's [`Outstanding`] set before it is handed on, and no
//! response is read while that set is full.
//!
//! A stream the puller leaves (the source stops or goes idle, or the stream is opened again)
//! has its request side ended, so that the client resets it: otherwise it would stay open at
//! the service, which would go on sending it messages.
//!
//! A stream that ends, or fails with a transient status ([`retryable_pull_status`]), is opened
//! again after the core's backoff ([`RECONNECT`], [`Backoff::jittered`]: 100 ms doubling up to
//! 10 s, each wait between half of that and all of it), for as long as the source runs; the
//! backoff restarts once a response arrives. A permanent status
//! ends the partition with an error that names the subscription and the status.

use std::sync::Arc;
use std::time::Duration;

use gcloud_sdk::google::pubsub::v1::subscriber_client::SubscriberClient;
use gcloud_sdk::google::pubsub::v1::{ReceivedMessage, StreamingPullRequest};
use tokio::sync::mpsc::error::SendError;
use tokio::sync::{mpsc, watch};
use tonic::Code;

use super::acks::{ACK_RETRY, AckClient};
use super::lease::ack_deadline_seconds;
use super::{AckId, AckQueue};
pub use crate::connectors::pubsub::client::retryable_pull_status;
use crate::core::delivery::DeliveryCounters;
use crate::core::delivery::lease::Outstanding;
use crate::core::delivery::settler::Acknowledger as _;
use crate::core::retry::retry;
use crate::core::{Backoff, StopKind};
use crate::error::Error;
use crate::google::{GrpcChannel, ROUTING_HEADER, Reachability, nothing_listens, routing_value};

/// How often an empty request keeps an idle stream open (the Go subscriber's ping interval).
pub const HEARTBEAT: Duration = Duration::from_secs(30);
/// The wait before a stream is opened again: 100 ms, doubling per failure in a row up to 10 s,
/// jittered ([`Backoff::jittered`]).
pub const RECONNECT: Backoff = Backoff {
    initial: Duration::from_millis(100),
    max: Duration::from_secs(10),
    multiplier: 2.0,
};
/// Largest StreamingPull response decoded: 64 MiB (one message is at most 10 MB; the bound
/// only keeps tonic's 4 MiB default from refusing a full response of large messages).
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// A message read from the stream: its ack id, shared with the partition's lease table, and
/// the rest of the message (whose own `ack_id` is left empty).
#[derive(Debug)]
pub struct Received {
    /// The message's ack id.
    pub id: AckId,
    /// The message as the service sent it, without its ack id.
    pub message: ReceivedMessage,
}

impl From<ReceivedMessage> for Received {
    fn from(mut message: ReceivedMessage) -> Self {
        let id = AckId::from(std::mem::take(&mut message.ack_id));
        Received { id, message }
    }
}

/// What the puller hands to the partition stream.
#[derive(Debug)]
pub enum Pulled {
    /// Messages of one response, already recorded as outstanding.
    Messages(Vec<Received>),
    /// The stream failed permanently.
    Failed(Error),
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
    /// Messages a consumer may hold until windows close, beyond the flow control: the service
    /// is asked for as many more messages, and for no bound on bytes (held messages keep their
    /// leases but not their data). Zero when nothing holds.
    pub held_capacity: u64,
    /// The stream's ack deadline.
    pub ack_deadline: Duration,
    /// Where what the stream still brings once its reader is gone is nacked, so that it is
    /// not left leased to a closing stream until its deadline lapses.
    pub returns: AckQueue,
    /// Set from each response's `subscription_properties`: whether the subscription delivers
    /// exactly once (the settler then confirms each acknowledgement, ADR 0076).
    pub exactly_once: super::acks::ExactlyOnce,
}

/// Waits for the next change of `rx`; never returns once its sender is gone (nothing can
/// change any more).
async fn changed<T>(rx: &mut watch::Receiver<T>) {
    if rx.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// When the service says `m` was published.
fn published(m: &ReceivedMessage) -> Option<std::time::SystemTime> {
    let at = m.message.as_ref()?.publish_time?;
    std::time::SystemTime::try_from(at).ok()
}

fn message_bytes(m: &ReceivedMessage) -> u64 {
    m.message.as_ref().map_or(0, |m| m.data.len() as u64)
}

impl Puller {
    /// On a subscription with exactly-once delivery, what Google's subscribers do when messages
    /// arrive: a `ModifyAckDeadline` of their ack ids (retried on transient codes), and the
    /// messages whose lease the service refuses for good are not handed on (their lease is
    /// already gone: the message is being delivered again). They count as read and as refused.
    /// A call that fails as a whole, or ids failing for now, keep the messages: their
    /// acknowledgement will say.
    async fn confirm_receipt(
        &self,
        messages: Vec<Received>,
        counters: &DeliveryCounters,
    ) -> Vec<Received> {
        let client = AckClient::new(
            self.channel.clone(),
            self.subscription.clone(),
            self.ack_deadline,
        );
        let ids: Vec<AckId> = messages.iter().map(|m| m.id.clone()).collect();
        let (result, _) = retry(
            &ACK_RETRY,
            |status: &tonic::Status| client.retryable(status),
            |_deadline| client.extend(&ids),
        )
        .await;
        let Err(status) = result else {
            return messages;
        };
        let refused = match client.per_id(&status, &ids) {
            Some(split) if !split.refused.is_empty() => split.refused,
            _ => return messages,
        };
        tracing::warn!(
            subscription = %self.subscription,
            messages = refused.len(),
            "{} message(s) of {} arrived with a lease the service no longer honours (exactly-once \
             delivery); not read now, the service delivers them again",
            refused.len(),
            self.subscription
        );
        DeliveryCounters::add(&counters.read, refused.len() as u64);
        DeliveryCounters::add(&counters.ack_refused, refused.len() as u64);
        let refused: std::collections::HashSet<&str> = refused.iter().map(|id| &**id).collect();
        messages
            .into_iter()
            .filter(|m| !refused.contains(&*m.id))
            .collect()
    }

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
        outstanding: Arc<Outstanding<AckId>>,
        counters: Arc<DeliveryCounters>,
        mut stop: watch::Receiver<Option<StopKind>>,
        mut idle: watch::Receiver<bool>,
    ) {
        // Counted as a running stream until it returns (readiness, `core::telemetry`).
        let _running = counters.stream_running();
        // Failures in a row: the backoff restarts once a response arrives.
        let mut failures = 0u32;
        let stopped = |stop: &watch::Receiver<Option<StopKind>>, idle: &watch::Receiver<bool>| {
            stop.borrow().is_some() || *idle.borrow()
        };
        'connect: loop {
            if stopped(&stop, &idle) {
                return;
            }
            let initial = StreamingPullRequest {
                subscription: self.subscription.clone(),
                stream_ack_deadline_seconds: ack_deadline_seconds(self.ack_deadline),
                client_id: self.client_id.clone(),
                max_outstanding_messages: i64::try_from(
                    self.max_outstanding_messages
                        .saturating_add(self.held_capacity),
                )
                .unwrap_or(i64::MAX),
                // Zero is "no bound" to the service.
                max_outstanding_bytes: if self.held_capacity > 0 {
                    0
                } else {
                    i64::try_from(self.max_outstanding_bytes).unwrap_or(i64::MAX)
                },
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
            // The request side ends when this attempt is left, whatever the way: only then
            // does the client reset the stream. A stream whose requests never end stays open
            // at the service after its responses are dropped, and the service keeps sending it
            // messages that nobody reads until their lease lapses.
            let (requests, end_requests) = futures::stream::abortable(requests);
            let _end_requests = EndOnDrop(end_requests);
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
                    // Counted as connected while it is read (readiness, `core::telemetry`).
                    let _connected = counters.stream_connected();
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
                                failures = 0;
                                if let Some(p) = response.subscription_properties {
                                    self.exactly_once.store(
                                        p.exactly_once_delivery_enabled,
                                        std::sync::atomic::Ordering::Release,
                                    );
                                }
                                if response.received_messages.is_empty() {
                                    continue;
                                }
                                // Each ack id is made once, here, and shared from then on.
                                let mut messages: Vec<Received> = response
                                    .received_messages
                                    .into_iter()
                                    .map(Received::from)
                                    .collect();
                                if self.exactly_once.load(std::sync::atomic::Ordering::Acquire) {
                                    messages = self.confirm_receipt(messages, &counters).await;
                                    if messages.is_empty() {
                                        continue;
                                    }
                                }
                                for m in &messages {
                                    outstanding.add_published(
                                        m.id.clone(),
                                        message_bytes(&m.message),
                                        published(&m.message),
                                    );
                                }
                                DeliveryCounters::add(&counters.read, messages.len() as u64);
                                if let Err(SendError(Pulled::Messages(messages))) =
                                    out.send(Pulled::Messages(messages))
                                {
                                    // The reader went away meanwhile (its statement ended):
                                    // these go back at once (unless the source was aborted).
                                    let ids: Vec<AckId> =
                                        messages.into_iter().map(|m| m.id).collect();
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
            DeliveryCounters::add(&counters.reconnects, 1);
            failures = failures.saturating_add(1);
            let wait = RECONNECT.jittered(failures);
            tracing::debug!(
                subscription = %self.subscription,
                code = ?status.code(),
                "StreamingPull stream of {} ended ({}); opening it again in {:?}",
                self.subscription,
                status.message(),
                wait
            );
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = changed(&mut stop) => {}
                _ = changed(&mut idle) => {}
                _ = out.closed() => return,
            }
        }
    }
}

/// Ends a request stream when dropped.
struct EndOnDrop(futures::stream::AbortHandle);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::null_method::FeedOptions;
    use crate::bench::null_server::{NullServer, NullServerOptions, NullService};
    use crate::connectors::pubsub::null_subscribe::Hub;

    /// A stream the puller leaves (here for idleness) ends at the server at once, although the
    /// channel stays open for the partition's acknowledgements: its request side ends, so the
    /// client resets it. Left open, the service would go on sending it messages that nobody
    /// reads, each held there until its lease lapses.
    #[tokio::test]
    async fn a_stream_left_for_idleness_ends_at_the_server_while_the_channel_lives() {
        const SUB: &str = "projects/p/subscriptions/left";
        let server = NullServer::start(
            "127.0.0.1:0".parse().unwrap(),
            NullServerOptions::new(
                NullService::PubSubSubscribe,
                FeedOptions {
                    messages: 10,
                    message_size: 64,
                    ..FeedOptions::default()
                },
            ),
        )
        .await
        .unwrap();
        let address = server.addr().to_string();
        let channel = crate::google::plaintext_channel(&address).await.unwrap();
        let details = server.details().unwrap();
        let subscription = details
            .as_any()
            .downcast_ref::<Hub>()
            .unwrap()
            .subscription(SUB);
        let (returns, _verdicts) =
            AckQueue::new(Arc::new(std::sync::atomic::AtomicBool::new(false)));
        let puller = Puller {
            channel: GrpcChannel::Plaintext(channel.clone()),
            reach: Reachability::emulator(address.clone(), "test"),
            subscription: SUB.into(),
            client_id: "left".into(),
            max_outstanding_messages: 1000,
            max_outstanding_bytes: 1 << 20,
            held_capacity: 0,
            ack_deadline: Duration::from_secs(10),
            returns,
            exactly_once: Default::default(),
        };
        let (out, mut pulled) = mpsc::unbounded_channel();
        let (_stop_tx, stop) = watch::channel(None);
        let (idle_tx, idle) = watch::channel(false);
        let task = tokio::spawn(puller.run(
            out,
            Arc::new(Outstanding::new(1000, 1 << 20)),
            Arc::new(DeliveryCounters::default()),
            stop,
            idle,
        ));
        assert!(matches!(pulled.recv().await, Some(Pulled::Messages(_))));
        assert_eq!(subscription.open_streams(), 1);

        idle_tx.send(true).unwrap();
        task.await.unwrap();
        let mut waited = Duration::ZERO;
        while subscription.open_streams() > 0 && waited < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(20)).await;
            waited += Duration::from_millis(20);
        }
        assert_eq!(
            subscription.open_streams(),
            0,
            "the stream is still open at the server {waited:?} after the puller left it"
        );
        drop(channel);
    }

    #[test]
    fn reconnects_back_off_from_100_ms_to_10_s() {
        assert_eq!(RECONNECT.delay(1), Duration::from_millis(100));
        assert_eq!(RECONNECT.delay(2), Duration::from_millis(200));
        assert_eq!(RECONNECT.delay(20), Duration::from_secs(10));
        let wait = RECONNECT.jittered(1);
        assert!(wait >= Duration::from_millis(50) && wait <= Duration::from_millis(100));
    }

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
