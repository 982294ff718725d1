//! The null StreamingPull server (feature `testing`): what `gcp-sql serve-null --service
//! pubsub-subscribe` answers. It stands in for the Pub/Sub Subscriber service: every
//! subscription name it is asked for has its own in-memory backlog of canned messages
//! ([`FeedOptions`]), which it streams as fast as each stream's flow control allows, with the
//! service's lease semantics ([`subscription`]; what it implements of Google's documented
//! behaviour and what not is in docs/service_facts.md, "The null StreamingPull server").
//!
//! | method | answer |
//! |---|---|
//! | `Subscriber/StreamingPull` | the backlog, in responses of up to [`MAX_BATCH`] messages; acknowledgements, nacks, extensions and `stream_ack_deadline_seconds` in the request stream honoured |
//! | `Subscriber/Acknowledge`, `Subscriber/ModifyAckDeadline` | honoured (0 seconds nacks) |
//! | `Subscriber/GetSubscription` | the subscription on topic `projects/P/topics/null`, ordered when the feed has ordering keys |
//! | `Publisher/GetTopic` | the topic, without a schema |
//!
//! Every other method answers `UNIMPLEMENTED`. The server's [`NullTotals`](crate::bench::null_server::NullTotals)
//! count acknowledgements: `requests` are the `Acknowledge` calls and the stream requests that
//! carried ack ids, `records` the messages acknowledged (each once), `record_bytes` their data
//! bytes. The deliveries, redeliveries, nacks and lapsed leases are in [`Hub`]'s report
//! ([`NullServer::details`](crate::bench::null_server::NullServer::details)).
//!
//! Message `n` (from 0) has data `{"id":n,"body":"xxx…"}`, padded with `x` to
//! [`FeedOptions::message_size`] bytes (at least [`MIN_MESSAGE_SIZE`]), or what the feed's
//! [`FeedOptions::payload`] makes of `n`; message id `n + 1`, the
//! server's start as its publish time (plus `n` times [`FeedOptions::publish_time_step`]), and, with ordering keys, the key `k{n % keys}`.

pub mod subscription;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use gcloud_sdk::google::pubsub::v1::streaming_pull_response::SubscriptionProperties;
use gcloud_sdk::google::pubsub::v1::{
    AcknowledgeRequest, GetSubscriptionRequest, GetTopicRequest, ModifyAckDeadlineRequest,
    PubsubMessage, ReceivedMessage, StreamingPullRequest, StreamingPullResponse,
    Subscription as SubscriptionResource, Topic,
};
use prost::Message as _;
use tonic::{Status, Streaming};

use self::subscription::{Delivery, Invalid, Subscription, SubscriptionStats};
use crate::bench::null_method::{
    FeedOptions, GrpcRequest, GrpcResponse, MAX_REQUEST_BYTES, MIN_MESSAGE_SIZE, NullDetails,
    NullMethod, NullRoutes, NullService, NullState, Routed, grpc,
};

/// The gRPC path of `StreamingPull`.
pub const STREAMING_PULL_PATH: &str = "/google.pubsub.v1.Subscriber/StreamingPull";
/// Most messages in one StreamingPull response.
pub const MAX_BATCH: usize = 1000;
/// Most data bytes in one StreamingPull response (beyond one message): under the 4 MiB a
/// client decodes by default.
pub const MAX_BATCH_BYTES: usize = 3 * 1024 * 1024;

/// This service's null method, as its descriptor carries it.
pub static NULL_METHOD: NullMethod = NullMethod {
    name: "pubsub-subscribe",
    method_path: STREAMING_PULL_PATH,
    records_word: "acknowledged messages",
    max_request_bytes: MAX_REQUEST_BYTES,
    routes,
};

impl NullService {
    /// The Pub/Sub subscription null service (StreamingPull).
    #[allow(non_upper_case_globals)]
    pub const PubSubSubscribe: NullService = NullService::of(&NULL_METHOD);
}

/// The routes of the server: the Subscriber service, and the Publisher's `GetTopic`.
fn routes(state: Arc<NullState>) -> tonic::service::Routes {
    let hub = Arc::new(Hub::new(state.clone()));
    state.set_details(hub.clone());
    tonic::service::Routes::new(Routed(SubscriberGrpc { hub: hub.clone() }))
        .add_service(Routed(PublisherGrpc { hub }))
}

/// The server's subscriptions, each made on first use.
#[derive(Debug)]
pub struct Hub {
    state: Arc<NullState>,
    feed: FeedOptions,
    started: SystemTime,
    subscriptions: Mutex<BTreeMap<String, Arc<Subscription>>>,
}

impl Hub {
    fn new(state: Arc<NullState>) -> Hub {
        Hub {
            feed: state.feed(),
            state,
            started: SystemTime::now(),
            subscriptions: Mutex::new(BTreeMap::new()),
        }
    }

    /// The subscription `name`, with a fresh backlog the first time it is asked for.
    pub fn subscription(&self, name: &str) -> Arc<Subscription> {
        self.subscriptions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(name.to_string())
            .or_insert_with(|| Arc::new(Subscription::new(self.feed.clone())))
            .clone()
    }

    /// Each subscription asked for so far, with its counts.
    pub fn stats(&self) -> Vec<(String, SubscriptionStats)> {
        let subscriptions: Vec<(String, Arc<Subscription>)> = self
            .subscriptions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(n, s)| (n.clone(), s.clone()))
            .collect();
        subscriptions
            .into_iter()
            .map(|(n, s)| (n, s.stats()))
            .collect()
    }

    /// The subscription a request names, refusing a name that is not
    /// `projects/P/subscriptions/S`.
    fn named(&self, name: &str) -> Result<Arc<Subscription>, Status> {
        super::names::pubsub_subscription(name).map_err(|e| {
            Status::invalid_argument(format!("invalid subscription name '{name}': {e}"))
        })?;
        Ok(self.subscription(name))
    }

    /// The message of `delivery`, as the stream sends it.
    fn received(&self, delivery: Delivery) -> ReceivedMessage {
        let id = delivery.id;
        let data = match &self.feed.payload {
            Some(payload) => payload.data(id),
            None => {
                let head = format!("{{\"id\":{id},\"body\":\"");
                let mut data = Vec::with_capacity(self.feed.message_size.max(MIN_MESSAGE_SIZE));
                data.extend_from_slice(head.as_bytes());
                let pad = self.feed.message_size.saturating_sub(head.len() + 2);
                data.resize(head.len() + pad, b'x');
                data.extend_from_slice(b"\"}");
                data
            }
        };
        let ordering_key = if self.feed.ordering_keys > 0 {
            format!("k{}", id % u64::from(self.feed.ordering_keys))
        } else {
            String::new()
        };
        ReceivedMessage {
            ack_id: delivery.ack_id(),
            message: Some(PubsubMessage {
                data,
                message_id: (id + 1).to_string(),
                publish_time: Some(
                    match self.feed.publish_time_step {
                        Some(step) => {
                            self.started
                                + step.saturating_mul(u32::try_from(id).unwrap_or(u32::MAX))
                        }
                        None => self.started,
                    }
                    .into(),
                ),
                ordering_key,
                ..Default::default()
            }),
            delivery_attempt: i32::try_from(delivery.attempt).unwrap_or(i32::MAX),
        }
    }

    /// Acknowledges `ack_ids` on `subscription` and counts what that settled.
    fn acknowledge(
        &self,
        subscription: &Subscription,
        ack_ids: &[String],
        body_bytes: usize,
    ) -> Result<(), Status> {
        let acked = subscription.acknowledge(ack_ids).map_err(invalid)?;
        let size = subscription.feed().message_size as u64;
        self.state
            .count_settled(acked, acked * size, body_bytes as u64);
        Ok(())
    }

    /// What a later request of a stream carries: acknowledgements, deadline changes, a new
    /// stream ack deadline.
    fn apply(
        &self,
        subscription: &Subscription,
        stream: u64,
        request: &StreamingPullRequest,
    ) -> Result<(), Status> {
        if request.modify_deadline_ack_ids.len() != request.modify_deadline_seconds.len() {
            return Err(Status::invalid_argument(format!(
                "modify_deadline_seconds has {} value(s) for {} modify_deadline_ack_ids",
                request.modify_deadline_seconds.len(),
                request.modify_deadline_ack_ids.len()
            )));
        }
        if request.stream_ack_deadline_seconds != 0 {
            Subscription::check_stream_deadline(request.stream_ack_deadline_seconds)
                .map_err(invalid)?;
            subscription.set_stream_deadline(stream, request.stream_ack_deadline_seconds);
        }
        if !request.ack_ids.is_empty() {
            self.acknowledge(subscription, &request.ack_ids, request.encoded_len())?;
        }
        for (id, seconds) in request
            .modify_deadline_ack_ids
            .iter()
            .zip(&request.modify_deadline_seconds)
        {
            subscription
                .modify_deadline(std::slice::from_ref(id), *seconds)
                .map_err(invalid)?;
        }
        Ok(())
    }
}

impl NullDetails for Hub {
    fn report(&self) -> String {
        let stats = self.stats();
        let mut sum = SubscriptionStats::default();
        for (_, s) in &stats {
            sum.messages += s.messages;
            sum.delivered += s.delivered;
            sum.redelivered += s.redelivered;
            sum.acked += s.acked;
            sum.nacked += s.nacked;
            sum.expired += s.expired;
            sum.stale += s.stale;
            sum.outstanding += s.outstanding;
            sum.max_attempts = sum.max_attempts.max(s.max_attempts);
        }
        format!(
            "subscriptions={} backlog={} delivered={} redelivered={} acked={} nacked={} expired={} stale={} outstanding={} max_delivery_attempt={}",
            stats.len(),
            sum.messages,
            sum.delivered,
            sum.redelivered,
            sum.acked,
            sum.nacked,
            sum.expired,
            sum.stale,
            sum.outstanding,
            sum.max_attempts
        )
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

fn invalid(e: Invalid) -> Status {
    Status::invalid_argument(e.0)
}

/// Closes its stream when the last holder (the response stream or the request reader) is gone.
struct OpenStream {
    subscription: Arc<Subscription>,
    id: u64,
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.subscription.close_stream(self.id);
    }
}

/// The StreamingPull handler.
#[derive(Clone)]
struct Pull {
    hub: Arc<Hub>,
}

/// How the request side of a stream ended, as the response side learns it.
type Ended = Option<Result<(), Status>>;

impl Pull {
    async fn open(
        hub: Arc<Hub>,
        mut requests: Streaming<StreamingPullRequest>,
    ) -> Result<BoxStream<'static, Result<StreamingPullResponse, Status>>, Status> {
        let first = requests
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("the stream ended before its first request"))?;
        let subscription = hub.named(&first.subscription)?;
        Subscription::check_stream_deadline(first.stream_ack_deadline_seconds).map_err(invalid)?;
        let id = subscription.open_stream(
            first.max_outstanding_messages,
            first.max_outstanding_bytes,
            first.stream_ack_deadline_seconds,
        );
        let open = Arc::new(OpenStream {
            subscription: subscription.clone(),
            id,
        });
        hub.apply(
            &subscription,
            id,
            &StreamingPullRequest {
                stream_ack_deadline_seconds: 0,
                ..first
            },
        )?;
        let (ended_tx, ended_rx) = tokio::sync::watch::channel::<Ended>(None);
        // The request side: acknowledgements and deadlines until the client stops sending.
        tokio::spawn({
            let hub = hub.clone();
            let open = open.clone();
            async move {
                let end = loop {
                    match requests.message().await {
                        Ok(Some(request)) => {
                            if let Err(status) = hub.apply(&open.subscription, open.id, &request) {
                                break Err(status);
                            }
                        }
                        Ok(None) => break Ok(()),
                        // The client went away (cancelled, killed): the response side is
                        // dropped too.
                        Err(status) => break Err(status),
                    }
                };
                let _ = ended_tx.send(Some(end));
            }
        });
        let properties = SubscriptionProperties {
            exactly_once_delivery_enabled: false,
            message_ordering_enabled: hub.feed.ordering_keys > 0,
        };
        let per_response = MAX_BATCH
            .min(MAX_BATCH_BYTES / hub.feed.message_size.max(1))
            .max(1);
        let state = (hub, open, ended_rx, false);
        let responses =
            futures::stream::unfold(state, move |(hub, open, mut ended, done)| async move {
                if done {
                    return None;
                }
                loop {
                    let end = ended.borrow().clone();
                    if let Some(end) = end {
                        return match end {
                            // The client closed its side: the stream ends.
                            Ok(()) => None,
                            Err(status) => Some((Err(status), (hub, open, ended, true))),
                        };
                    }
                    let taken = open.subscription.take(open.id, per_response);
                    if !taken.is_empty() {
                        let response = StreamingPullResponse {
                            received_messages: taken.into_iter().map(|d| hub.received(d)).collect(),
                            subscription_properties: Some(properties),
                            ..Default::default()
                        };
                        return Some((Ok(response), (hub, open, ended, false)));
                    }
                    tokio::select! {
                        _ = open.subscription.wait_for_work(open.id) => {}
                        _ = ended.changed() => {}
                    }
                }
            });
        Ok(Box::pin(responses))
    }
}

impl tonic::server::StreamingService<StreamingPullRequest> for Pull {
    type Response = StreamingPullResponse;
    type ResponseStream = BoxStream<'static, Result<StreamingPullResponse, Status>>;
    type Future = BoxFuture<'static, Result<tonic::Response<Self::ResponseStream>, Status>>;

    fn call(&mut self, request: tonic::Request<Streaming<StreamingPullRequest>>) -> Self::Future {
        let hub = self.hub.clone();
        Box::pin(async move {
            Pull::open(hub, request.into_inner())
                .await
                .map(tonic::Response::new)
        })
    }
}

/// One unary method: the answer of `answer` after the server's latency.
struct Unary<Req, Resp> {
    hub: Arc<Hub>,
    answer: fn(&Hub, Req) -> Result<Resp, Status>,
}

impl<Req, Resp> Clone for Unary<Req, Resp> {
    fn clone(&self) -> Self {
        Unary {
            hub: self.hub.clone(),
            answer: self.answer,
        }
    }
}

impl<Req: Send + 'static, Resp: Send + 'static> tonic::server::UnaryService<Req>
    for Unary<Req, Resp>
{
    type Response = Resp;
    type Future = BoxFuture<'static, Result<tonic::Response<Resp>, Status>>;

    fn call(&mut self, request: tonic::Request<Req>) -> Self::Future {
        let answer = (self.answer)(&self.hub, request.into_inner());
        let latency = self.hub.state.latency();
        Box::pin(async move {
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            answer.map(tonic::Response::new)
        })
    }
}

/// Serves `request` with the unary `answer`.
async fn unary<Req, Resp>(
    hub: Arc<Hub>,
    request: GrpcRequest,
    answer: fn(&Hub, Req) -> Result<Resp, Status>,
) -> GrpcResponse
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + Send + 'static,
{
    grpc::<Resp, Req>(MAX_REQUEST_BYTES)
        .unary(Unary { hub, answer }, request)
        .await
}

fn acknowledge(hub: &Hub, request: AcknowledgeRequest) -> Result<(), Status> {
    let body = request.encoded_len();
    let subscription = hub.named(&request.subscription)?;
    hub.acknowledge(&subscription, &request.ack_ids, body)
}

fn modify_ack_deadline(hub: &Hub, request: ModifyAckDeadlineRequest) -> Result<(), Status> {
    hub.named(&request.subscription)?
        .modify_deadline(&request.ack_ids, request.ack_deadline_seconds)
        .map_err(invalid)
}

fn get_subscription(
    hub: &Hub,
    request: GetSubscriptionRequest,
) -> Result<SubscriptionResource, Status> {
    hub.named(&request.subscription)?;
    let project = request
        .subscription
        .split('/')
        .nth(1)
        .unwrap_or_default()
        .to_string();
    Ok(SubscriptionResource {
        name: request.subscription,
        topic: format!("projects/{project}/topics/null"),
        ack_deadline_seconds: subscription::MIN_STREAM_ACK_DEADLINE_SECONDS,
        enable_message_ordering: hub.feed.ordering_keys > 0,
        ..Default::default()
    })
}

fn get_topic(_hub: &Hub, request: GetTopicRequest) -> Result<Topic, Status> {
    Ok(Topic {
        name: request.topic,
        ..Default::default()
    })
}

/// The Subscriber service.
#[derive(Clone)]
struct SubscriberGrpc {
    hub: Arc<Hub>,
}

impl NullRoutes for SubscriberGrpc {
    const NAME: &'static str = "google.pubsub.v1.Subscriber";
    const SERVER: &'static str = "null subscription server";

    fn route(
        &self,
        method: &str,
        request: GrpcRequest,
    ) -> Option<BoxFuture<'static, GrpcResponse>> {
        let hub = self.hub.clone();
        Some(match method {
            "StreamingPull" => Box::pin(async move {
                grpc::<StreamingPullResponse, StreamingPullRequest>(MAX_REQUEST_BYTES)
                    .streaming(Pull { hub }, request)
                    .await
            }),
            "Acknowledge" => Box::pin(unary(hub, request, acknowledge)),
            "ModifyAckDeadline" => Box::pin(unary(hub, request, modify_ack_deadline)),
            "GetSubscription" => Box::pin(unary(hub, request, get_subscription)),
            _ => return None,
        })
    }
}

/// The Publisher service: only `GetTopic`, which a reader may ask for its topic's schema.
#[derive(Clone)]
struct PublisherGrpc {
    hub: Arc<Hub>,
}

impl NullRoutes for PublisherGrpc {
    const NAME: &'static str = "google.pubsub.v1.Publisher";
    const SERVER: &'static str = "null subscription server";

    fn route(
        &self,
        method: &str,
        request: GrpcRequest,
    ) -> Option<BoxFuture<'static, GrpcResponse>> {
        (method == "GetTopic")
            .then(|| Box::pin(unary(self.hub.clone(), request, get_topic)) as BoxFuture<'static, _>)
    }
}

#[cfg(test)]
mod tests {

    use futures::channel::mpsc;
    use gcloud_sdk::google::pubsub::v1::subscriber_client::SubscriberClient;

    use super::*;
    use crate::bench::null_server::{NullServer, NullServerOptions, NullService};

    const SUB: &str = "projects/p/subscriptions/null-sub";

    async fn start(feed: FeedOptions) -> (NullServer, SubscriberClient<tonic::transport::Channel>) {
        let server = NullServer::start(
            "127.0.0.1:0".parse().unwrap(),
            NullServerOptions::new(NullService::PubSubSubscribe, feed),
        )
        .await
        .unwrap();
        let client = SubscriberClient::connect(format!("http://{}", server.addr()))
            .await
            .unwrap();
        (server, client)
    }

    fn feed(messages: u64) -> FeedOptions {
        FeedOptions {
            messages,
            message_size: 64,
            ..FeedOptions::default()
        }
    }

    fn first_request(max_messages: i64) -> StreamingPullRequest {
        StreamingPullRequest {
            subscription: SUB.into(),
            stream_ack_deadline_seconds: 10,
            max_outstanding_messages: max_messages,
            ..Default::default()
        }
    }

    fn hub(server: &NullServer) -> Arc<dyn NullDetails> {
        server
            .details()
            .expect("the subscription server keeps details")
    }

    fn stats(server: &NullServer) -> SubscriptionStats {
        let details = hub(server);
        let hub = details.as_any().downcast_ref::<Hub>().unwrap();
        hub.stats().into_iter().find(|(n, _)| n == SUB).unwrap().1
    }

    #[tokio::test]
    async fn a_stream_gets_what_its_flow_control_allows_and_acks_in_the_stream_are_counted() {
        // Four messages: nothing is left to deliver once the nacked one came back.
        let (server, mut client) = start(feed(4)).await;
        let (tx, rx) = mpsc::unbounded();
        tx.unbounded_send(first_request(2)).unwrap();
        let mut stream = client.streaming_pull(rx).await.unwrap().into_inner();
        let first = stream.message().await.unwrap().unwrap();
        let got: Vec<&PubsubMessage> = first
            .received_messages
            .iter()
            .map(|m| m.message.as_ref().unwrap())
            .collect();
        assert_eq!(got.len(), 2, "max_outstanding_messages = 2");
        assert_eq!(got[0].data.len(), 64);
        assert!(got[1].data.starts_with(br#"{"id":1,"body":"xx"#));
        assert!(got[1].data.ends_with(br#"xx"}"#));
        assert_eq!(got[1].message_id, "2");
        assert_eq!(first.received_messages[0].delivery_attempt, 1);
        // Acknowledged through the stream: two more come.
        tx.unbounded_send(StreamingPullRequest {
            ack_ids: first
                .received_messages
                .iter()
                .map(|m| m.ack_id.clone())
                .collect(),
            ..Default::default()
        })
        .unwrap();
        let second = stream.message().await.unwrap().unwrap();
        assert_eq!(second.received_messages.len(), 2);
        // One nacked through the stream comes back at once.
        tx.unbounded_send(StreamingPullRequest {
            modify_deadline_ack_ids: vec![second.received_messages[0].ack_id.clone()],
            modify_deadline_seconds: vec![0],
            ..Default::default()
        })
        .unwrap();
        let third = stream.message().await.unwrap().unwrap();
        assert_eq!(third.received_messages.len(), 1);
        assert_eq!(
            third.received_messages[0]
                .message
                .as_ref()
                .unwrap()
                .message_id,
            second.received_messages[0]
                .message
                .as_ref()
                .unwrap()
                .message_id
        );
        assert_eq!(third.received_messages[0].delivery_attempt, 2);
        // Acknowledged with the unary call.
        client
            .acknowledge(AcknowledgeRequest {
                subscription: SUB.into(),
                ack_ids: vec![third.received_messages[0].ack_id.clone()],
            })
            .await
            .unwrap();
        let totals = server.totals();
        assert_eq!((totals.requests, totals.records), (2, 3));
        assert_eq!(totals.record_bytes, 3 * 64);
        let s = stats(&server);
        assert_eq!(
            (s.delivered, s.redelivered, s.acked, s.nacked),
            (5, 1, 3, 1)
        );
        assert!(hub(&server).report().contains("acked=3"));
        // The client closes its side: the stream ends.
        drop(tx);
        while stream.message().await.unwrap().is_some() {}
    }

    #[tokio::test]
    async fn a_bad_stream_request_is_refused_naming_the_field() {
        let (_server, mut client) = start(feed(5)).await;
        let mut request = first_request(10);
        request.stream_ack_deadline_seconds = 5;
        let status = client
            .streaming_pull(futures::stream::iter([request]))
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status.message().contains("stream_ack_deadline_seconds"),
            "{status}"
        );
        let mut request = first_request(10);
        request.subscription = "null-sub".into();
        let status = client
            .streaming_pull(futures::stream::iter([request]))
            .await
            .unwrap_err();
        assert!(
            status.message().contains("invalid subscription name"),
            "{status}"
        );
        let status = client
            .modify_ack_deadline(ModifyAckDeadlineRequest {
                subscription: SUB.into(),
                ack_ids: vec!["not-an-ack-id".into()],
                ack_deadline_seconds: 10,
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
    }

    #[tokio::test]
    async fn the_subscription_and_its_topic_are_answered_and_other_methods_are_not() {
        let (server, mut client) = start(FeedOptions {
            ordering_keys: 4,
            ..feed(5)
        })
        .await;
        let subscription = client
            .get_subscription(GetSubscriptionRequest {
                subscription: SUB.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(subscription.topic, "projects/p/topics/null");
        assert!(subscription.enable_message_ordering);
        let mut publisher =
            gcloud_sdk::google::pubsub::v1::publisher_client::PublisherClient::connect(format!(
                "http://{}",
                server.addr()
            ))
            .await
            .unwrap();
        let topic = publisher
            .get_topic(GetTopicRequest {
                topic: subscription.topic.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(topic.schema_settings, None);
        let status = client
            .delete_subscription(gcloud_sdk::google::pubsub::v1::DeleteSubscriptionRequest {
                subscription: SUB.into(),
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unimplemented);
        assert!(status.message().contains("DeleteSubscription"), "{status}");
    }

    #[tokio::test]
    async fn an_ordered_feed_holds_a_keys_next_message_back() {
        let (_server, mut client) = start(FeedOptions {
            ordering_keys: 2,
            ..feed(6)
        })
        .await;
        let (tx, rx) = mpsc::unbounded();
        tx.unbounded_send(first_request(100)).unwrap();
        let mut stream = client.streaming_pull(rx).await.unwrap().into_inner();
        let first = stream.message().await.unwrap().unwrap();
        let keys: Vec<&str> = first
            .received_messages
            .iter()
            .map(|m| m.message.as_ref().unwrap().ordering_key.as_str())
            .collect();
        assert_eq!(keys, ["k0", "k1"]);
        assert!(
            first
                .subscription_properties
                .is_some_and(|p| p.message_ordering_enabled)
        );
    }
}
