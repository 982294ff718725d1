//! The settler of one source partition: sends the acknowledgements and nacks the tickets ask
//! for, and extends the leases of the messages the partition holds.
//!
//! Acknowledgements and nacks travel as unary calls (`Acknowledge`; `ModifyAckDeadline` with a
//! deadline of 0 for a nack), at most [`MAX_IDS_PER_CALL`] ack ids a call. After the first
//! request of a round the settler gathers what else the tickets ask for during [`ACK_GATHER`]
//! (or until a call is full), as Google's subscribers do: fewer, fuller calls for the service,
//! for at most that much delay of an acknowledgement. A transient failure is retried
//! ([`ACK_ATTEMPTS`] attempts, doubling backoff); a call that still fails is logged and left:
//! an acknowledgement that did not take means the service delivers the message again (a
//! duplicate, never a loss).
//!
//! The settler ends once every ticket and the partition's stream are gone (its queue closes),
//! after sending what was asked for.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use gcloud_sdk::google::pubsub::v1::subscriber_client::SubscriberClient;
use gcloud_sdk::google::pubsub::v1::{AcknowledgeRequest, ModifyAckDeadlineRequest};
use tokio::sync::mpsc;
use tonic::Code;

use super::SourceCounters;
use super::lease::{Outstanding, ack_deadline_seconds, lease_interval};
use super::ticket::AckCommand;
use crate::google::{GrpcChannel, ROUTING_HEADER, routing_value, with_deadline};

/// Most ack ids in one `Acknowledge` or `ModifyAckDeadline` call: 2,500, the batch limit of
/// Google's subscribers (a request must also stay under the service's 512 KiB request size,
/// which 2,500 ack ids of the usual length do).
pub const MAX_IDS_PER_CALL: usize = 2500;
/// How long a settler gathers acknowledgements and nacks before it sends them: 100 ms, the
/// acknowledgement batching delay of Google's subscribers.
pub const ACK_GATHER: Duration = Duration::from_millis(100);
/// Attempts of one acknowledgement, nack or lease call.
pub const ACK_ATTEMPTS: u32 = 5;
/// Deadline of one acknowledgement, nack or lease call.
pub const ACK_CALL_TIMEOUT: Duration = Duration::from_secs(60);
const ACK_INITIAL_BACKOFF: Duration = Duration::from_millis(100);

/// Whether an acknowledgement-side call is worth another attempt: the codes the official
/// clients retry for Acknowledge and ModifyAckDeadline.
pub fn retryable_ack_status(code: Code) -> bool {
    matches!(
        code,
        Code::DeadlineExceeded
            | Code::ResourceExhausted
            | Code::Aborted
            | Code::Internal
            | Code::Unavailable
            | Code::Unknown
    )
}

/// The RPC side of a settler: one subscription through one channel.
#[derive(Clone, Debug)]
pub struct AckClient {
    channel: GrpcChannel,
    subscription: String,
}

impl AckClient {
    /// A client for `subscription` over `channel`.
    pub fn new(channel: GrpcChannel, subscription: impl Into<String>) -> Self {
        AckClient {
            channel,
            subscription: subscription.into(),
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

    async fn call(&self, ids: &[String], deadline: Option<i32>) -> Result<(), tonic::Status> {
        let mut client = SubscriberClient::new(self.channel.clone());
        match deadline {
            None => client
                .acknowledge(self.request(AcknowledgeRequest {
                    subscription: self.subscription.clone(),
                    ack_ids: ids.to_vec(),
                }))
                .await
                .map(drop),
            Some(seconds) => client
                .modify_ack_deadline(self.request(ModifyAckDeadlineRequest {
                    subscription: self.subscription.clone(),
                    ack_ids: ids.to_vec(),
                    ack_deadline_seconds: seconds,
                }))
                .await
                .map(drop),
        }
    }

    /// Sends one call per [`MAX_IDS_PER_CALL`] ids: an acknowledgement (`deadline` `None`) or
    /// a deadline change, retrying transient failures. Returns how many ids were not taken.
    pub async fn send(&self, ids: &[String], deadline: Option<i32>) -> usize {
        let mut failed = 0;
        for chunk in ids.chunks(MAX_IDS_PER_CALL) {
            let mut backoff = ACK_INITIAL_BACKOFF;
            for attempt in 1..=ACK_ATTEMPTS {
                match self.call(chunk, deadline).await {
                    Ok(()) => break,
                    Err(status)
                        if attempt < ACK_ATTEMPTS && retryable_ack_status(status.code()) =>
                    {
                        tokio::time::sleep(backoff).await;
                        backoff *= 2;
                    }
                    Err(status) => {
                        tracing::warn!(
                            subscription = %self.subscription,
                            messages = chunk.len(),
                            code = ?status.code(),
                            attempts = attempt,
                            "{} of {} message(s) of {} failed: {} (the service will deliver them again)",
                            match deadline {
                                None => "Acknowledge",
                                Some(0) => "the nack (ModifyAckDeadline 0)",
                                Some(_) => "the lease extension (ModifyAckDeadline)",
                            },
                            chunk.len(),
                            self.subscription,
                            status.message()
                        );
                        failed += chunk.len();
                        break;
                    }
                }
            }
        }
        failed
    }
}

/// Runs the settler of one partition until its queue closes: acknowledges and nacks what the
/// tickets ask for, and extends the leases of what `outstanding` holds by `ack_deadline`, every
/// third of it, up to `max_lease`.
pub async fn run_settler(
    client: AckClient,
    mut queue: mpsc::UnboundedReceiver<AckCommand>,
    outstanding: Arc<Outstanding>,
    counters: Arc<SourceCounters>,
    max_lease: Duration,
    ack_deadline: Duration,
) {
    let every = lease_interval(ack_deadline);
    let mut leases = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    leases.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            command = queue.recv() => {
                let Some(first) = command else { break };
                let (acks, nacks, closed) = gather(first, &mut queue).await;
                if !acks.is_empty() {
                    let failed = client.send(&acks, None).await;
                    counters.acked.fetch_add((acks.len() - failed) as u64, Ordering::Relaxed);
                    outstanding.remove(&acks);
                }
                if !nacks.is_empty() {
                    let failed = client.send(&nacks, Some(0)).await;
                    counters.nacked.fetch_add((nacks.len() - failed) as u64, Ordering::Relaxed);
                    outstanding.remove(&nacks);
                }
                if closed {
                    break;
                }
            }
            _ = leases.tick() => {
                let (extend, expired) = outstanding.due(max_lease);
                if !expired.is_empty() {
                    counters.lease_expired.fetch_add(expired.len() as u64, Ordering::Relaxed);
                    tracing::warn!(
                        subscription = %client.subscription,
                        messages = expired.len(),
                        "{} message(s) were held for max_lease_duration ({:?}) without being delivered; their lease lapses and the service delivers them again",
                        expired.len(),
                        max_lease
                    );
                }
                if !extend.is_empty() {
                    client
                        .send(&extend, Some(ack_deadline_seconds(ack_deadline)))
                        .await;
                }
            }
        }
    }
}

/// One round of requests, from `first` on: what the tickets ask for during [`ACK_GATHER`], or
/// until [`MAX_IDS_PER_CALL`] ids are gathered, or until the queue closes (the third value).
async fn gather(
    first: AckCommand,
    queue: &mut mpsc::UnboundedReceiver<AckCommand>,
) -> (Vec<String>, Vec<String>, bool) {
    let (mut acks, mut nacks) = (Vec::new(), Vec::new());
    let deadline = tokio::time::sleep(ACK_GATHER);
    tokio::pin!(deadline);
    let mut next = Some(first);
    loop {
        match next.take() {
            Some(AckCommand::Ack(ids)) => acks.extend(ids),
            Some(AckCommand::Nack(ids)) => nacks.extend(ids),
            None => {}
        }
        if acks.len() + nacks.len() >= MAX_IDS_PER_CALL {
            return (acks, nacks, false);
        }
        tokio::select! {
            command = queue.recv() => match command {
                Some(command) => next = Some(command),
                None => return (acks, nacks, true),
            },
            () = &mut deadline => return (acks, nacks, false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(ids: &[&str]) -> AckCommand {
        AckCommand::Ack(ids.iter().map(|s| s.to_string()).collect())
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_gathers_what_comes_within_the_gather_delay() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        tx.send(ack(&["b"])).unwrap();
        let late = tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(ACK_GATHER / 2).await;
            late.send(AckCommand::Nack(vec!["c".into()])).unwrap();
            tokio::time::sleep(ACK_GATHER).await;
            late.send(ack(&["d"])).unwrap();
        });
        let (acks, nacks, closed) = gather(ack(&["a"]), &mut rx).await;
        assert_eq!(acks, ["a", "b"]);
        assert_eq!(nacks, ["c"]);
        assert!(!closed, "the queue is still open");
        let next = rx.recv().await.unwrap();
        assert!(
            matches!(next, AckCommand::Ack(ids) if ids == ["d"]),
            "the next round's"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_call_or_a_closed_queue_ends_the_round_at_once() {
        let (tx, mut rx) = mpsc::unbounded_channel::<AckCommand>();
        let many: Vec<String> = (0..MAX_IDS_PER_CALL).map(|i| i.to_string()).collect();
        let started = tokio::time::Instant::now();
        let (acks, _, closed) = gather(AckCommand::Ack(many), &mut rx).await;
        assert_eq!(acks.len(), MAX_IDS_PER_CALL);
        assert!(!closed);
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "a full call waits for nothing"
        );
        drop(tx);
        let (acks, _, closed) = gather(ack(&["x"]), &mut rx).await;
        assert_eq!(acks, ["x"]);
        assert!(closed, "the queue closed: the settler sends and ends");
    }
}
