//! The other revisions of the schema a scan bound from its topic (ADR 0062).
//!
//! A scan without `format` binds the newest revision of its topic's schema when it starts
//! (ADR 0053). Pub/Sub stamps each message published to a schema'd topic with the schema's
//! name and the revision it validated the message against ([`SCHEMA_NAME_ATTRIBUTE`],
//! [`SCHEMA_REVISION_ATTRIBUTE`]). A message stamped with the bound schema's name and another
//! revision is read with that revision: before a batch is decoded, [`Revisions::prepare`]
//! fetches each revision it has not seen (`GetSchema` of `name@revision`, once per revision per
//! partition) and builds its [`RevisionReader`]; a revision that cannot be fetched (deleted:
//! NOT_FOUND; not permitted) makes its messages bad messages, naming the revision.
//!
//! A partition keeps at most [`MAX_REVISIONS`] readers, least recently used out first; a
//! batch that needs more keeps them all until the next batch.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;

use gcloud_sdk::google::pubsub::v1::ReceivedMessage;

use super::decode::{
    MessageDecoder, RevisionReader, SCHEMA_NAME_ATTRIBUTE, SCHEMA_REVISION_ATTRIBUTE,
};
use crate::encode::schema::PayloadSchema;
use crate::error::Result;

/// How many revision readers one partition keeps between batches.
pub const MAX_REVISIONS: usize = 16;

/// The revision readers of one partition; see the module docs.
#[derive(Debug)]
pub struct Revisions {
    /// The bound schema's name.
    name: String,
    /// The bound revision: its messages use the scan's decoder.
    bound: String,
    /// Most recently used last: (revision id, batch that last used it, reader).
    readers: VecDeque<(String, u64, Arc<RevisionReader>)>,
    /// The number of the batch being prepared.
    batch: u64,
    /// Readers kept between batches.
    capacity: usize,
}

impl Revisions {
    /// The readers of the schema `name`, bound at revision `bound`.
    pub fn new(name: impl Into<String>, bound: impl Into<String>) -> Self {
        Revisions {
            name: name.into(),
            bound: bound.into(),
            readers: VecDeque::new(),
            batch: 0,
            capacity: MAX_REVISIONS,
        }
    }

    /// The revision `m` was stamped with, when it is a revision of the bound schema other than
    /// the bound one.
    fn other_revision<'m>(&self, m: &'m ReceivedMessage) -> Option<&'m str> {
        let attributes = &m.message.as_ref()?.attributes;
        if attributes.get(SCHEMA_NAME_ATTRIBUTE)? != &self.name {
            return None;
        }
        let revision = attributes.get(SCHEMA_REVISION_ATTRIBUTE)?;
        (!revision.is_empty() && *revision != self.bound).then_some(revision.as_str())
    }

    /// Makes sure every other revision `messages` were stamped with has its reader: the ones
    /// not kept are fetched with `fetch` (the revision id in; its definition out) and bound by
    /// `decoder` ([`MessageDecoder::for_revision`]). A fetch refused for good (NOT_FOUND for a
    /// deleted revision, PERMISSION_DENIED: any error that is not
    /// [retryable](crate::error::Error::is_retryable)) is
    /// kept as a refused reader naming the revision and the status (never data), so that it is
    /// not fetched again for every message. A transient status (UNAVAILABLE,
    /// DEADLINE_EXCEEDED, ...) is returned instead: the caller fails the batch without
    /// acknowledging it, since treating good messages as bad for a passing fault could drop
    /// them.
    pub async fn prepare<F, Fut>(
        &mut self,
        messages: &[ReceivedMessage],
        decoder: &MessageDecoder,
        mut fetch: F,
    ) -> Result<()>
    where
        F: FnMut(String) -> Fut,
        Fut: Future<Output = Result<PayloadSchema>>,
    {
        self.batch += 1;
        for m in messages {
            let Some(revision) = self.other_revision(m) else {
                continue;
            };
            if let Some(at) = self.readers.iter().position(|(r, ..)| r == revision) {
                if let Some(mut entry) = self.readers.remove(at) {
                    entry.1 = self.batch;
                    self.readers.push_back(entry);
                }
                continue;
            }
            let revision = revision.to_string();
            let label = format!("revision {revision} of schema '{}'", self.name);
            let reader = match fetch(revision.clone()).await {
                Ok(schema) => decoder.for_revision(&schema, &label),
                Err(e) if e.is_retryable() => return Err(e),
                Err(e) => {
                    tracing::warn!(
                        schema = %self.name,
                        revision = %revision,
                        "cannot read {label}: its messages are bad messages ({e})"
                    );
                    RevisionReader::Refused {
                        column: None,
                        reason: format!("{label} cannot be read ({e})"),
                    }
                }
            };
            self.evict();
            self.readers
                .push_back((revision, self.batch, Arc::new(reader)));
        }
        Ok(())
    }

    /// Makes room for one more reader: drops the least recently used one that this batch does
    /// not use, while [`MAX_REVISIONS`] are kept.
    fn evict(&mut self) {
        while self.readers.len() >= self.capacity {
            let Some(oldest) = self.readers.iter().position(|(_, b, _)| *b != self.batch) else {
                return;
            };
            self.readers.remove(oldest);
        }
    }

    /// The reader of the revision `m` was stamped with, when it is another revision of the
    /// bound schema that [`prepare`](Self::prepare) saw.
    pub fn reader(&self, m: &ReceivedMessage) -> Option<&RevisionReader> {
        let revision = self.other_revision(m)?;
        self.readers
            .iter()
            .find(|(r, ..)| r == revision)
            .map(|(_, _, reader)| reader.as_ref())
    }

    /// The revision ids kept, least recently used first.
    pub fn kept(&self) -> Vec<&str> {
        self.readers.iter().map(|(r, ..)| r.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use gcloud_sdk::google::pubsub::v1::PubsubMessage;
    use tonic::Code;

    use super::*;
    use crate::encode::schema::{SchemaEncoding, SchemaType};
    use crate::error::Error;
    use crate::options::PayloadFormat;

    const NAME: &str = "projects/p/schemas/orders";
    const A: &str =
        r#"{"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}]}"#;
    const B: &str = r#"{"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"},
        {"name": "extra", "type": ["null", "string"], "default": null}]}"#;

    fn avro(definition: &str) -> PayloadSchema {
        PayloadSchema {
            kind: SchemaType::Avro,
            definition: definition.into(),
            encoding: SchemaEncoding::Binary,
            origin: "test".into(),
        }
    }

    fn stamped(id: &str, revision: &str, data: &[u8]) -> ReceivedMessage {
        ReceivedMessage {
            ack_id: format!("ack-{id}"),
            message: Some(PubsubMessage {
                data: data.to_vec(),
                message_id: id.into(),
                attributes: [
                    (SCHEMA_NAME_ATTRIBUTE.to_string(), NAME.to_string()),
                    (SCHEMA_REVISION_ATTRIBUTE.to_string(), revision.to_string()),
                ]
                .into_iter()
                .collect(),
                ..Default::default()
            }),
            delivery_attempt: 0,
        }
    }

    /// A table (`id` NOT NULL, `extra` nullable) bound to revision `b` (schema B).
    fn decoder() -> MessageDecoder {
        let table = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("extra", DataType::Utf8, true),
        ]));
        MessageDecoder::new(table, PayloadFormat::Json, &Default::default())
            .unwrap()
            .with_schema(&avro(B))
            .unwrap()
    }

    #[tokio::test]
    async fn a_message_of_another_revision_is_read_with_it_and_fetched_once() {
        let d = decoder();
        let mut revisions = Revisions::new(NAME, "b");
        let fetched = RefCell::new(Vec::new());
        // Revision a: 1 (id 1); revision b: 4, 2, "hi" (id 2, extra "hi").
        let messages = [
            stamped("m1", "a", &[2]),
            stamped("m2", "b", &[4, 2, 4, b'h', b'i']),
            stamped("m3", "a", &[6]),
        ];
        revisions
            .prepare(&messages, &d, |r| {
                fetched.borrow_mut().push(r);
                async { Ok(avro(A)) }
            })
            .await
            .unwrap();
        assert_eq!(*fetched.borrow(), ["a"]);
        let out = d.decode_with(&messages, |m| revisions.reader(m)).unwrap();
        assert!(out.bad.is_empty(), "{:?}", out.bad);
        let ids = out.batch.column(0).as_primitive::<Int64Type>();
        assert_eq!(ids.values().to_vec(), vec![1, 2, 3]);
        let extra = out.batch.column(1).as_string::<i32>();
        assert!(extra.is_null(0) && extra.is_null(2));
        assert_eq!(extra.value(1), "hi");
        // Without the revision, the scan's decoder refuses revision a's datums.
        let plain = d.decode(&messages).unwrap();
        assert_eq!(plain.bad.len(), 2, "{:?}", plain.batch);
    }

    #[tokio::test]
    async fn a_revision_that_cannot_be_fetched_makes_its_messages_bad_naming_it() {
        let d = decoder();
        let mut revisions = Revisions::new(NAME, "b");
        let messages = [
            stamped("m1", "gone", b"secret"),
            stamped("m2", "b", &[4, 0]),
        ];
        let calls = RefCell::new(0);
        for _ in 0..2 {
            revisions
                .prepare(&messages, &d, |r| {
                    *calls.borrow_mut() += 1;
                    let status = tonic::Status::new(Code::NotFound, "no such revision");
                    async move { Err(Error::rpc("GetSchema", &format!("{NAME}@{r}"), &status, 1)) }
                })
                .await
                .unwrap();
        }
        assert_eq!(*calls.borrow(), 1, "a failed revision is not fetched again");
        let out = d.decode_with(&messages, |m| revisions.reader(m)).unwrap();
        assert_eq!(out.batch.num_rows(), 1);
        assert_eq!(out.bad.len(), 1);
        let text = out.bad[0].describe();
        assert!(
            text.contains("'m1'")
                && text.contains("revision gone")
                && text.contains("NOT_FOUND")
                && !text.contains("secret"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_not_null_column_the_revision_lacks_refuses_its_messages() {
        let table = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("extra", DataType::Utf8, false),
        ]));
        let d = MessageDecoder::new(table, PayloadFormat::Json, &Default::default())
            .unwrap()
            .with_schema(&avro(
                r#"{"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"},
                {"name": "extra", "type": "string"}]}"#,
            ))
            .unwrap();
        let mut revisions = Revisions::new(NAME, "b");
        let messages = [stamped("m1", "a", &[2])];
        revisions
            .prepare(&messages, &d, |_| async { Ok(avro(A)) })
            .await
            .unwrap();
        let out = d.decode_with(&messages, |m| revisions.reader(m)).unwrap();
        assert_eq!(out.bad[0].column.as_deref(), Some("extra"));
        let text = out.bad[0].describe();
        for wanted in ["revision a", "no field 'extra'", "NOT NULL"] {
            assert!(text.contains(wanted), "{wanted}: {text}");
        }
    }

    #[tokio::test]
    async fn at_most_sixteen_revisions_are_kept_least_recently_used_out_first() {
        let d = decoder();
        let mut revisions = Revisions::new(NAME, "b");
        let fetches = RefCell::new(0);
        let mut prepare_one = async |revision: &str| {
            let messages = [stamped("m", revision, &[2])];
            revisions
                .prepare(&messages, &d, |_| {
                    *fetches.borrow_mut() += 1;
                    async { Ok(avro(A)) }
                })
                .await
                .unwrap();
        };
        for r in 0..MAX_REVISIONS {
            prepare_one(&format!("r{r}")).await;
        }
        // r0 used again: r1 is now the least recently used.
        prepare_one("r0").await;
        prepare_one("r16").await;
        assert_eq!(*fetches.borrow(), MAX_REVISIONS + 1);
        let kept = revisions.kept();
        assert_eq!(kept.len(), MAX_REVISIONS);
        assert!(!kept.contains(&"r1") && kept.contains(&"r0") && kept.contains(&"r16"));
        // One batch with more revisions than the bound keeps them all for itself.
        let many: Vec<_> = (100..100 + MAX_REVISIONS + 2)
            .map(|r| stamped("m", &format!("r{r}"), &[2]))
            .collect();
        revisions
            .prepare(&many, &d, |_| async { Ok(avro(A)) })
            .await
            .unwrap();
        assert_eq!(revisions.kept().len(), MAX_REVISIONS + 2);
        let out = d.decode_with(&many, |m| revisions.reader(m)).unwrap();
        assert_eq!(out.batch.num_rows(), MAX_REVISIONS + 2);
        // The next batch trims back to the bound as it adds.
        revisions
            .prepare(&[stamped("m", "last", &[2])], &d, |_| async { Ok(avro(A)) })
            .await
            .unwrap();
        assert!(revisions.kept().len() <= MAX_REVISIONS);
    }

    #[tokio::test]
    async fn a_transient_status_fails_the_batch_and_is_asked_again() {
        let d = decoder();
        let mut revisions = Revisions::new(NAME, "b");
        let messages = [stamped("m1", "a", &[2])];
        let e = revisions
            .prepare(&messages, &d, |r| async move {
                let status = tonic::Status::new(Code::Unavailable, "try later");
                Err(Error::rpc("GetSchema", &format!("{NAME}@{r}"), &status, 1))
            })
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("@a") && e.contains("UNAVAILABLE"), "{e}");
        assert!(revisions.kept().is_empty(), "a passing fault is not kept");
        revisions
            .prepare(&messages, &d, |_| async { Ok(avro(A)) })
            .await
            .unwrap();
        let out = d.decode_with(&messages, |m| revisions.reader(m)).unwrap();
        assert!(
            out.bad.is_empty() && out.batch.num_rows() == 1,
            "{:?}",
            out.bad
        );
    }
}
