//! The Pub/Sub transport (`PubSubTransport`, the connector's core `Transport`) against the real
//! Pub/Sub emulator: a batch published and pulled back intact, a missing topic classified
//! `NOT_FOUND`, topic creation on and off, a name the service refuses.
//!
//! These were unit tests of `connectors::pubsub::client`; they live here so that
//! `cargo test --lib` starts no emulator.

use std::sync::Arc;
use std::time::Duration;

use gcloud_sdk::google::pubsub::v1::subscriber_client::SubscriberClient;
use gcloud_sdk::google::pubsub::v1::{PubsubMessage, PullRequest, Subscription};
use gcp_sql::Error;
use gcp_sql::connectors::pubsub::client::{ClientSettings, PubSubTransport};
use gcp_sql::connectors::pubsub::sink::mapping::PubsubRecord;
use gcp_sql::core::{Class, Destination, SendOutcome, Transport};
use gcp_sql::emulators::{EmulatorKind, plaintext_channel, shared};
use tonic::Code;

const PROJECT: &str = "client-tests";

async fn emulator_transport(auto_create_topic: bool) -> PubSubTransport {
    let emulator = shared(EmulatorKind::PubSub).await;
    let settings = ClientSettings {
        emulator_host: Some(emulator.host().to_string()),
        auto_create_topic,
        ..Default::default()
    };
    PubSubTransport::connect(&settings).await.unwrap()
}

fn topic(id: &str) -> Destination {
    Arc::from(format!("projects/{PROJECT}/topics/{id}"))
}

#[tokio::test]
async fn publishes_a_batch_that_a_subscription_pulls_back_intact() {
    let transport = emulator_transport(true).await;
    let destination = topic("publish-round-trip");
    let client = transport.open(&destination).await.unwrap();
    assert!(
        transport
            .create_destination(&client, &destination)
            .await
            .unwrap()
    );

    let emulator = shared(EmulatorKind::PubSub).await;
    let channel = plaintext_channel(emulator.host()).await.unwrap();
    let mut subscriber = SubscriberClient::new(channel);
    let subscription = format!("projects/{PROJECT}/subscriptions/round-trip-sub");
    subscriber
        .create_subscription(Subscription {
            name: subscription.clone(),
            topic: destination.to_string(),
            enable_message_ordering: true,
            ..Default::default()
        })
        .await
        .unwrap();

    let sent: Vec<PubsubMessage> = (0..5)
        .map(|i| PubsubMessage {
            data: format!("payload-{i}").into_bytes(),
            attributes: [
                ("n".to_string(), i.to_string()),
                ("kind".to_string(), "test".to_string()),
            ]
            .into(),
            ordering_key: if i % 2 == 0 {
                "even".into()
            } else {
                String::new()
            },
            ..Default::default()
        })
        .collect();
    let records: Vec<PubsubRecord> = sent.iter().map(PubsubRecord::from_message).collect();
    let refs: Vec<&PubsubRecord> = records.iter().collect();
    match transport
        .send(&client, &destination, &refs, Some(Duration::from_secs(30)))
        .await
    {
        SendOutcome::Whole(Ok(())) => {}
        other => panic!("publish failed: {other:?}"),
    }

    let mut received: Vec<PubsubMessage> = Vec::new();
    for _ in 0..50 {
        if received.len() >= sent.len() {
            break;
        }
        let response = subscriber
            .pull(PullRequest {
                subscription: subscription.clone(),
                max_messages: 100,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        received.extend(
            response
                .received_messages
                .into_iter()
                .filter_map(|m| m.message),
        );
    }
    received.sort_by(|a, b| a.data.cmp(&b.data));
    assert_eq!(received.len(), sent.len());
    for (got, want) in received.iter().zip(&sent) {
        assert_eq!(got.data, want.data);
        assert_eq!(got.attributes, want.attributes);
        assert_eq!(got.ordering_key, want.ordering_key);
        assert!(!got.message_id.is_empty());
    }
}

#[tokio::test]
async fn a_missing_topic_is_classified_not_found() {
    let transport = emulator_transport(false).await;
    let destination = topic("never-created");
    let client = transport.open(&destination).await.unwrap();
    let record = PubsubRecord::from_message(&PubsubMessage {
        data: b"x".to_vec(),
        ..Default::default()
    });
    let SendOutcome::Whole(Err(status)) = transport
        .send(&client, &destination, &[&record], None)
        .await
    else {
        panic!("publishing to a missing topic succeeded");
    };
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert_eq!(transport.classify(&status, true), Class::NotFound);
}

#[tokio::test]
async fn create_destination_creates_then_reports_that_the_topic_exists() {
    let transport = emulator_transport(true).await;
    let destination = topic("created-once");
    let client = transport.open(&destination).await.unwrap();
    assert!(
        transport
            .create_destination(&client, &destination)
            .await
            .unwrap()
    );
    assert!(
        !transport
            .create_destination(&client, &destination)
            .await
            .unwrap()
    );
    let record = PubsubRecord::from_message(&PubsubMessage {
        data: b"x".to_vec(),
        ..Default::default()
    });
    assert!(matches!(
        transport
            .send(&client, &destination, &[&record], None)
            .await,
        SendOutcome::Whole(Ok(()))
    ));
}

#[tokio::test]
async fn create_destination_refuses_when_auto_creation_is_off() {
    let transport = emulator_transport(false).await;
    let destination = topic("not-created");
    let client = transport.open(&destination).await.unwrap();
    let err = transport
        .create_destination(&client, &destination)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("auto_create_topic"), "{err}");
}

#[tokio::test]
async fn an_invalid_topic_name_is_rejected_by_the_service() {
    let transport = emulator_transport(true).await;
    let destination: Destination = Arc::from("projects/client-tests/topics/x");
    let client = transport.open(&destination).await.unwrap();
    let err = transport
        .create_destination(&client, &destination)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Rpc {
                code: Code::InvalidArgument,
                ..
            }
        ),
        "{err}"
    );
}
