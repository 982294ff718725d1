//! `start_at`: a replay, applied once with Pub/Sub's `Seek` before the first pull (ADR 0072).
//!
//! A scan whose table says `start_at` seeks its subscription before any of its partitions opens
//! a stream, once for the whole scan. Whether the seek was already done is recorded in a small
//! object of its own in the table's `progress_path` folder,
//! `<project>.<subscription>.start_at.json`: `{"subscription", "start_at", "applied_at"}`.
//!
//! - No record, or a record of another `start_at`: the scan seeks, then writes the record.
//! - A record of the same `start_at` (compared in its canonical form,
//!   [`StartAt::canonical`]): the scan does not seek again, and says so in one `info` line. A
//!   restarted pipeline therefore carries on from where it was rather than replaying twice;
//!   to replay to the same point again, delete the record (or name another point).
//! - A failure between the seek and the record (a crash, an object store that refuses the
//!   write) leaves no record, so the next scan seeks again: a second replay, never a skipped
//!   one. A record that cannot be written fails the scan, which has already sought.
//!
//! The seek is retried like an acknowledgement (transient statuses, [`super::acks::ACK_RETRY`]);
//! a permanent status (an unknown snapshot, a subscription the emulator cannot seek) fails the
//! scan with an error naming `start_at`.

use std::sync::Arc;

use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::object_store::path::Path as StorePath;
use datafusion::object_store::{ObjectStore, ObjectStoreExt as _, PutPayload};
use gcloud_sdk::google::pubsub::v1::SeekRequest;
use gcloud_sdk::google::pubsub::v1::seek_request::Target;
use gcloud_sdk::google::pubsub::v1::subscriber_client::SubscriberClient;

use super::acks::{ACK_CALL_TIMEOUT, ACK_RETRY, retryable_ack_status};
use super::options::{Replay, START_AT, StartAt};
use crate::core::retry::retry;
use crate::error::{Error, Result};
use crate::google::{GrpcChannel, ROUTING_HEADER, Reachability, routing_value, with_deadline};

/// What [`apply`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The subscription was sought, and the seek recorded.
    Sought,
    /// The same `start_at` was recorded already (at the time given): no seek.
    AlreadyRecorded(String),
}

/// The record's object name in the folder: `<project>.<subscription>.start_at.json`.
pub fn record_name(subscription: &str) -> String {
    let mut parts = subscription.split('/');
    match (parts.nth(1), parts.nth(1)) {
        (Some(project), Some(id)) => format!("{project}.{id}.start_at.json"),
        _ => format!("{}.start_at.json", subscription.replace('/', ".")),
    }
}

/// Where a replay's record lives, and the store that holds it.
struct Record {
    store: Arc<dyn ObjectStore>,
    path: StorePath,
    describe: String,
}

impl Record {
    fn open(replay: &Replay, subscription: &str, runtime: &RuntimeEnv) -> Result<Self> {
        let folder = &replay.folder;
        let describe = format!(
            "{}/{}",
            folder.as_str().trim_end_matches('/'),
            record_name(subscription)
        );
        let fail = |message: String| {
            START_AT.invalid(
                replay.at.canonical(),
                format!("the record of the seek, {describe}: {message}"),
            )
        };
        let store_url = ObjectStoreUrl::parse(&folder[..url::Position::BeforePath])
            .map_err(|e| fail(e.to_string()))?;
        let store = runtime
            .object_store(&store_url)
            .map_err(|e| fail(format!("no object store is registered for it: {e}")))?;
        let path = StorePath::from_url_path(format!(
            "{}/{}",
            folder.path().trim_end_matches('/'),
            record_name(subscription)
        ))
        .map_err(|e| fail(e.to_string()))?;
        Ok(Record {
            store,
            path,
            describe,
        })
    }

    fn error(&self, at: &StartAt, message: impl std::fmt::Display) -> Error {
        START_AT.invalid(
            at.canonical(),
            format!("the record of the seek, {}: {message}", self.describe),
        )
    }

    /// The recorded `start_at` and when it was applied; `None` when there is no record.
    async fn read(&self, at: &StartAt) -> Result<Option<(String, String)>> {
        let bytes = match self.store.get(&self.path).await {
            Ok(got) => got.bytes().await.map_err(|e| self.error(at, e))?,
            Err(datafusion::object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.error(at, e)),
        };
        let value: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| self.error(at, format!("is not JSON ({e}); delete it to seek again")))?;
        let field = |name: &str| value.get(name).and_then(|v| v.as_str()).map(str::to_string);
        match field("start_at") {
            Some(recorded) => Ok(Some((recorded, field("applied_at").unwrap_or_default()))),
            None => Err(self.error(at, "has no 'start_at'; delete it to seek again")),
        }
    }

    async fn write(&self, subscription: &str, at: &StartAt, applied_at: &str) -> Result<()> {
        let body = serde_json::json!({
            "subscription": subscription,
            "start_at": at.canonical(),
            "applied_at": applied_at,
        });
        self.store
            .put(&self.path, PutPayload::from(body.to_string().into_bytes()))
            .await
            .map_err(|e| {
                self.error(
                    at,
                    format!(
                        "could not be written ({e}); the subscription was sought, and the next \
                         scan will seek it again"
                    ),
                )
            })?;
        Ok(())
    }
}

/// Seeks `subscription` to `at` through `channel`, retrying transient statuses.
pub async fn seek(
    channel: &GrpcChannel,
    reach: &Reachability,
    subscription: &str,
    at: &StartAt,
) -> Result<()> {
    let target = match at {
        StartAt::Time(t) => Target::Time(prost_types::Timestamp {
            seconds: t.timestamp(),
            nanos: i32::try_from(t.timestamp_subsec_nanos()).unwrap_or(0),
        }),
        StartAt::Snapshot(name) => Target::Snapshot(name.clone()),
    };
    let (result, attempts) = retry(
        &ACK_RETRY,
        |status: &tonic::Status| retryable_ack_status(status.code()),
        |_deadline| {
            let mut request = with_deadline(
                tonic::Request::new(SeekRequest {
                    subscription: subscription.to_string(),
                    target: Some(target.clone()),
                }),
                Some(ACK_CALL_TIMEOUT),
                channel.is_google(),
            );
            if let Ok(value) = routing_value(&[("subscription", subscription)]) {
                request.metadata_mut().insert(ROUTING_HEADER, value);
            }
            let mut client = SubscriberClient::new(channel.clone());
            async move { reach.observe(client.seek(request).await).map(drop) }
        },
    )
    .await;
    result.map_err(|status| {
        let hint = match (status.code(), at) {
            (tonic::Code::NotFound, StartAt::Snapshot(_)) => {
                " (the snapshot, or the subscription, does not exist: list the snapshots with \
                 pubsub_snapshots)"
            }
            (tonic::Code::NotFound, StartAt::Time(_)) => " (the subscription does not exist)",
            _ => "",
        };
        START_AT.invalid(
            at.canonical(),
            format!(
                "Seek of {subscription} failed after {attempts} attempt(s): {:?}: {}{hint}",
                status.code(),
                status.message()
            ),
        )
    })
}

/// Applies `replay` to `subscription` once: seeks unless the record says this `start_at` was
/// applied already, then records it.
pub async fn apply(
    replay: &Replay,
    subscription: &str,
    channel: &GrpcChannel,
    reach: &Reachability,
    runtime: &RuntimeEnv,
) -> Result<Applied> {
    let record = Record::open(replay, subscription, runtime)?;
    let wanted = replay.at.canonical();
    if let Some((recorded, applied_at)) = record.read(&replay.at).await?
        && recorded == wanted
    {
        tracing::info!(
            subscription = %subscription,
            "start_at = '{wanted}' was applied at {applied_at} (recorded in {}): not seeking \
             again; delete the record to replay once more",
            record.describe
        );
        return Ok(Applied::AlreadyRecorded(applied_at));
    }
    seek(channel, reach, subscription, &replay.at).await?;
    let applied_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    record.write(subscription, &replay.at, &applied_at).await?;
    tracing::info!(
        subscription = %subscription,
        "sought {subscription} to {wanted} (start_at), recorded in {}",
        record.describe
    );
    Ok(Applied::Sought)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_is_named_after_the_subscription() {
        assert_eq!(
            record_name("projects/demo/subscriptions/clicks"),
            "demo.clicks.start_at.json"
        );
    }

    fn replay(folder: &std::path::Path, at: &str) -> Replay {
        Replay {
            at: StartAt::parse(at, "demo").unwrap(),
            folder: url::Url::from_directory_path(folder).unwrap(),
        }
    }

    #[tokio::test]
    async fn a_recorded_start_at_is_not_sought_again_and_another_one_is() {
        let dir = tempfile::tempdir().unwrap();
        let sub = "projects/demo/subscriptions/clicks";
        let runtime = RuntimeEnv::default();
        let first = replay(dir.path(), "timestamp:2026-12-01T10:00:00Z");
        let record = Record::open(&first, sub, &runtime).unwrap();
        assert_eq!(record.read(&first.at).await.unwrap(), None);
        record
            .write(sub, &first.at, "2026-12-04T00:00:00.000Z")
            .await
            .unwrap();
        // The same point: recorded, so `apply` returns before any call (the channel below
        // points where nothing listens, and is never used).
        let channel = GrpcChannel::Plaintext(
            crate::google::plaintext_endpoint("127.0.0.1:1")
                .unwrap()
                .connect_lazy(),
        );
        let reach = Reachability::emulator("127.0.0.1:1", "test");
        let applied = apply(&first, sub, &channel, &reach, &runtime)
            .await
            .unwrap();
        assert_eq!(
            applied,
            Applied::AlreadyRecorded("2026-12-04T00:00:00.000Z".into())
        );
        // Another point: a seek is attempted (and fails here, naming start_at).
        let other = replay(dir.path(), "timestamp:2026-12-02T10:00:00Z");
        let err = apply(&other, sub, &channel, &reach, &runtime)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("'start_at'") && err.contains("Seek"), "{err}");
        // A broken record is an error naming the option, not a silent seek.
        std::fs::write(dir.path().join(record_name(sub)), b"{").unwrap();
        let err = apply(&first, sub, &channel, &reach, &runtime)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("'start_at'") && err.contains("not JSON"),
            "{err}"
        );
    }
}
