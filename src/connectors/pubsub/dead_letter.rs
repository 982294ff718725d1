//! Dead letters published to a Pub/Sub topic (`dead_letter_topic`, under
//! `failure_policy = 'dead_letter'`), for a table of any connector: [`TOPICS`] is what this
//! connector supplies to the generic dead-letter code, and [`describe_pubsub`] is how a
//! refused Pub/Sub message is carried in a dead letter.

use std::collections::HashMap;

use async_trait::async_trait;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use gcloud_sdk::google::pubsub::v1::PubsubMessage;
use serde_json::{Map, Value};

use super::client::{ClientSettings, PubSubTransport};
use super::names;
use super::sink::mapping::PubsubRecord;
use crate::connectors::dead_letter::{
    DeadLetterContext, DeadLetterTopics, MAX_ATTRIBUTE_VALUE_BYTES, TOPIC_ATTEMPTS, TOPIC_TIMEOUT,
    reasons, truncate_at_char,
};
use crate::core::{
    Class, DeadLetterSink, DeadPayload, DeadRow, Destination, RetrySettings, SendOutcome,
    Transport, retry,
};
use crate::error::{Error, Result};
use crate::options::ClientCore;

/// Dead-letter topics, as the generic dead-letter code reaches them.
pub static TOPICS: DeadLetterTopics = DeadLetterTopics {
    service: super::SERVICE,
    resolve: names::pubsub_topic,
    open: open_topic,
};

/// The client settings of a dead-letter topic: the connection given, never creating topics.
fn topic_settings(connection: ClientCore) -> ClientSettings {
    ClientSettings {
        endpoint: connection.endpoint,
        emulator_host: connection.emulator_host,
        credentials_file: connection.credentials_file,
        auto_create_topic: false,
    }
}

/// Opens the dead-letter sink of `topic`: connects the Pub/Sub transport (lazily for an
/// emulator) and opens the topic's client. Nothing is published yet.
fn open_topic(
    topic: String,
    connection: ClientCore,
    context: DeadLetterContext,
    describe: String,
) -> BoxFuture<'static, Result<Arc<dyn DeadLetterSink>>> {
    async move {
        let transport = PubSubTransport::connect(&topic_settings(connection)).await?;
        let destination: Destination = topic.as_str().into();
        let client = transport.open(&destination).await?;
        let sink: Arc<dyn DeadLetterSink> = Arc::new(TopicSink {
            transport,
            client,
            destination,
            context,
            describe,
        });
        Ok(sink)
    }
    .boxed()
}

/// The retry of one dead-letter publish, through the core's retry loop with the writers'
/// classification of a Publish status: [`TOPIC_ATTEMPTS`] attempts of [`TOPIC_TIMEOUT`] each,
/// waiting 200 ms before the first retry and doubling (200, 400, 800, 1600 ms).
const PUBLISH_RETRY: RetrySettings =
    RetrySettings::doubling(TOPIC_ATTEMPTS, Duration::from_millis(200), TOPIC_TIMEOUT);

/// Dead letters published to a Pub/Sub topic.
struct TopicSink {
    transport: PubSubTransport,
    client: <PubSubTransport as Transport>::Client,
    destination: Destination,
    context: DeadLetterContext,
    describe: String,
}

#[async_trait]
impl DeadLetterSink for TopicSink {
    fn describe(&self) -> String {
        self.describe.clone()
    }

    async fn write(&self, row: DeadRow) -> Result<()> {
        // Every value within the attribute limit (a table name may be long; the message is cut
        // in `reasons` already).
        let attributes: HashMap<String, String> = reasons(&self.context, &row)
            .into_iter()
            .map(|(k, v)| {
                let v = truncate_at_char(&v, MAX_ATTRIBUTE_VALUE_BYTES).to_string();
                (k.to_string(), v)
            })
            .collect();
        let data = match (row.data.payload, row.data.row) {
            (Some(payload), _) => payload,
            (None, Some(json)) => Value::Object(json).to_string().into_bytes(),
            (None, None) => Vec::new(),
        };
        let message = PubsubMessage {
            data,
            attributes,
            ..Default::default()
        };
        let record = PubsubRecord::from_message(&message);
        let (result, attempts) = retry(
            &PUBLISH_RETRY,
            |status: &tonic::Status| self.transport.classify(status, true) == Class::Retryable,
            |deadline| {
                let record = &record;
                async move {
                    let outcome = self
                        .transport
                        .send(&self.client, &self.destination, &[record], deadline)
                        .await;
                    match outcome {
                        SendOutcome::Whole(result) => result,
                        SendOutcome::PerRecord(mut v) => v.pop().unwrap_or(Ok(())),
                    }
                }
            },
        )
        .await;
        let Err(status) = result else {
            return Ok(());
        };
        let what = if self.transport.classify(&status, true) == Class::NotFound {
            "the topic does not exist (a dead-letter topic is never created)".to_string()
        } else {
            format!("Publish failed after {attempts} attempt(s)")
        };
        Err(Error::DeadLetter {
            target: self.describe.clone(),
            message: format!(
                "{what}: {} {}",
                crate::core::metrics::code_name(status.code()),
                status.message()
            ),
        })
    }

    async fn finish(&self) -> Result<()> {
        Ok(())
    }
}

/// A refused Pub/Sub message: its data is the payload; its attributes and ordering key the
/// row.
pub fn describe_pubsub(record: &PubsubRecord) -> DeadPayload {
    let Ok(message) = record.to_message() else {
        return DeadPayload::default();
    };
    let mut row = Map::new();
    if !message.attributes.is_empty() {
        let mut attributes: Vec<_> = message.attributes.into_iter().collect();
        attributes.sort();
        row.insert(
            "attributes".into(),
            Value::Object(
                attributes
                    .into_iter()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect(),
            ),
        );
    }
    if !message.ordering_key.is_empty() {
        row.insert("ordering_key".into(), Value::String(message.ordering_key));
    }
    DeadPayload {
        payload: Some(message.data),
        row: Some(row),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_letter_publish_keeps_its_attempts_and_backoff() {
        let mut state = PUBLISH_RETRY.start(tokio::time::Instant::now());
        let now = tokio::time::Instant::now();
        let mut delays = Vec::new();
        assert_eq!(state.begin_attempt(now), Some(TOPIC_TIMEOUT));
        while let Some(d) = state.next_delay(now) {
            delays.push(d.as_millis());
            assert_eq!(state.begin_attempt(now), Some(TOPIC_TIMEOUT));
        }
        assert_eq!(delays, [200, 400, 800, 1600]);
        assert_eq!(state.attempts(), TOPIC_ATTEMPTS);
    }

    #[test]
    fn a_dead_letter_topic_is_never_created() {
        let settings = topic_settings(ClientCore {
            emulator_host: Some("localhost:8085".into()),
            ..Default::default()
        });
        assert!(!settings.auto_create_topic);
        assert_eq!(settings.emulator_host.as_deref(), Some("localhost:8085"));
    }
}
