//! Transport tests that need no service: status classes, the routing header, the settings.
//! The ones against the real Pub/Sub emulator are in `tests/integration/pubsub_transport.rs`
//! (`cargo test --lib` starts no emulator).

use std::sync::Arc;

use super::*;

const PROJECT: &str = "client-tests";

fn topic(id: &str) -> Destination {
    Arc::from(format!("projects/{PROJECT}/topics/{id}"))
}

#[test]
fn classifies_statuses_like_the_official_publish_retry_settings() {
    for code in [
        Code::Aborted,
        Code::Cancelled,
        Code::DeadlineExceeded,
        Code::Internal,
        Code::ResourceExhausted,
        Code::Unknown,
        Code::Unavailable,
    ] {
        assert_eq!(classify_publish_status(code), Class::Retryable, "{code:?}");
    }
    assert_eq!(classify_publish_status(Code::NotFound), Class::NotFound);
    assert_eq!(
        classify_publish_status(Code::InvalidArgument),
        Class::Rejected
    );
    for code in [
        Code::PermissionDenied,
        Code::Unauthenticated,
        Code::FailedPrecondition,
        Code::AlreadyExists,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::DataLoss,
    ] {
        assert_eq!(classify_publish_status(code), Class::Fatal, "{code:?}");
    }
}

#[tokio::test]
async fn a_topic_client_routes_by_the_percent_encoded_topic() {
    let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
    let transport = PubSubTransport::from_channel(channel, "127.0.0.1:1", false);
    let client = transport.open(&topic("a+b")).await.unwrap();
    assert_eq!(
        client.routing.to_str().unwrap(),
        "topic=projects%2Fclient-tests%2Ftopics%2Fa%2Bb"
    );
}

#[test]
fn settings_prefer_the_explicit_emulator_host() {
    let settings = ClientSettings {
        emulator_host: Some("127.0.0.1:1".into()),
        ..Default::default()
    };
    assert_eq!(
        settings.effective_emulator_host().as_deref(),
        Some("127.0.0.1:1")
    );
}
