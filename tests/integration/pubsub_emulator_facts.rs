//! What the Pub/Sub emulator does with a nack (a `ModifyAckDeadline` of 0), pinned because the
//! source's tests and docs/service_facts.md rely on it: a nacked message goes back at once to
//! a reader that is still streaming from the subscription, the stream it came from included,
//! and an independent reader gets it at once only when no stream that could take it is open.
//! Messages nacked while the stream that received them is still open are handed back down that
//! stream; if it then closes, they come back to anyone only after a delay: once the lease that
//! redelivery took has lapsed (the stream's 10 s ack deadline in the test below; a minute in one
//! run where the stream closed before reading the redelivery).

use std::time::Duration;

use gcloud_sdk::google::pubsub::v1::publisher_client::PublisherClient;
use gcloud_sdk::google::pubsub::v1::subscriber_client::SubscriberClient;
use gcloud_sdk::google::pubsub::v1::{
    ModifyAckDeadlineRequest, PublishRequest, PubsubMessage, PullRequest, StreamingPullRequest,
    StreamingPullResponse,
};
use tokio::sync::mpsc;
use tonic::Streaming;
use tonic::transport::Channel;

/// Longer than any answer "at once" takes on a loaded machine, far shorter than the
/// subscription's 600 s ack deadline and the minute a dropped redelivery waits.
const AT_ONCE: Duration = Duration::from_secs(5);
/// Longer than the delay after which a message handed to a closed stream comes back (a minute
/// at most, seen here).
const LATER: Duration = Duration::from_secs(180);
const MESSAGES: usize = 5;

struct Subscription {
    name: String,
    subscriber: SubscriberClient<Channel>,
}

impl Subscription {
    /// A fresh subscription with [`MESSAGES`] messages published to its topic.
    async fn with_messages(prefix: &str) -> Self {
        let admin = crate::support::PubSubAdmin::connect().await;
        let (topic, name) = admin
            .topic_with_subscription("emulator-facts", prefix, false)
            .await;
        let channel = gcp_sql::emulators::plaintext_channel(&admin.host)
            .await
            .expect("channel to the Pub/Sub emulator");
        let messages = (0..MESSAGES)
            .map(|i| PubsubMessage {
                data: i.to_string().into(),
                ..Default::default()
            })
            .collect();
        PublisherClient::new(channel.clone())
            .publish(PublishRequest { topic, messages })
            .await
            .expect("Publish");
        Subscription {
            name,
            subscriber: SubscriberClient::new(channel),
        }
    }

    /// One unary pull, answered at once; the ack ids it got (nothing is acknowledged).
    async fn pull_once(&self) -> Vec<String> {
        #[allow(deprecated)] // return_immediately: the emulator honours it.
        let request = PullRequest {
            subscription: self.name.clone(),
            max_messages: 100,
            return_immediately: true,
        };
        let pulled = self.subscriber.clone().pull(request).await.expect("Pull");
        let messages = pulled.into_inner().received_messages;
        messages.into_iter().map(|m| m.ack_id).collect()
    }

    /// Pulls until [`MESSAGES`] messages came back or `bound` passed; how many came back.
    async fn pull_back_within(&self, bound: Duration) -> usize {
        let until = tokio::time::Instant::now() + bound;
        let mut back = 0;
        while back < MESSAGES && tokio::time::Instant::now() < until {
            back += self.pull_once().await.len();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        back
    }

    async fn nack(&self, ack_ids: Vec<String>) {
        self.subscriber
            .clone()
            .modify_ack_deadline(ModifyAckDeadlineRequest {
                subscription: self.name.clone(),
                ack_ids,
                ack_deadline_seconds: 0,
            })
            .await
            .expect("ModifyAckDeadline 0");
    }

    /// A StreamingPull reader (the sender keeps the stream open) and the ack ids of the
    /// [`MESSAGES`] messages it received.
    async fn stream_all(
        &self,
    ) -> (
        mpsc::Sender<StreamingPullRequest>,
        Streaming<StreamingPullResponse>,
        Vec<String>,
    ) {
        let (tx, rx) = mpsc::channel(4);
        tx.send(StreamingPullRequest {
            subscription: self.name.clone(),
            stream_ack_deadline_seconds: 10,
            max_outstanding_messages: 1000,
            ..Default::default()
        })
        .await
        .unwrap();
        let requests =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
        let mut stream = self
            .subscriber
            .clone()
            .streaming_pull(requests)
            .await
            .expect("StreamingPull")
            .into_inner();
        let mut ack_ids = Vec::new();
        while ack_ids.len() < MESSAGES {
            let response = stream.message().await.expect("stream").expect("open");
            ack_ids.extend(response.received_messages.into_iter().map(|m| m.ack_id));
        }
        (tx, stream, ack_ids)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_with_no_stream_open_is_available_to_another_reader_at_once() {
    let s = Subscription::with_messages("nack-pull").await;
    let ack_ids = s.pull_once().await;
    assert_eq!(ack_ids.len(), MESSAGES);
    s.nack(ack_ids).await;
    assert_eq!(s.pull_back_within(AT_ONCE).await, MESSAGES);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_after_the_stream_closed_is_available_to_another_reader_at_once() {
    let s = Subscription::with_messages("nack-closed").await;
    let (tx, stream, ack_ids) = s.stream_all().await;
    drop((tx, stream));
    s.nack(ack_ids).await;
    assert_eq!(s.pull_back_within(AT_ONCE).await, MESSAGES);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_while_the_stream_is_open_goes_back_down_that_stream() {
    let s = Subscription::with_messages("nack-open").await;
    let (tx, mut stream, ack_ids) = s.stream_all().await;
    s.nack(ack_ids).await;
    let mut again = 0;
    while again < MESSAGES {
        let response = tokio::time::timeout(AT_ONCE, stream.message())
            .await
            .expect("redelivered on the open stream at once")
            .expect("stream")
            .expect("open");
        again += response.received_messages.len();
    }
    assert_eq!(again, MESSAGES);
    // Closed now, holding the redelivered messages: another reader gets them only later.
    drop((tx, stream));
    assert_eq!(
        s.pull_back_within(AT_ONCE).await,
        0,
        "messages handed to a stream that then closed are not available at once"
    );
    assert_eq!(
        s.pull_back_within(LATER).await,
        MESSAGES,
        "they are not lost: they come back later"
    );
}
