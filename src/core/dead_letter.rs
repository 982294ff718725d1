//! Dead letters: where the `dead_letter` failure policy puts the rows a sink cannot deliver.
//!
//! The core knows only the abstraction: a [`DeadLetterSink`] receives one [`DeadRow`] per row
//! the encoder rejected or the service refused (confirmed by the isolation pass), the same rows
//! the `drop` policy skips. What the sink is (a Pub/Sub topic, an NDJSON object in a store) is
//! the connectors' business (`connectors::dead_letter`).
//!
//! A row counts as dead-lettered once it is stored: when [`DeadLetterSink::write`] returned
//! `Ok` for a sink that stores each row as it is written ([`DeadLetterSink::stored_on_write`],
//! a topic), else once the object holding it was completed ([`DeadLetterSink::roll`] at a flush
//! point, [`DeadLetterSink::finish`] at the end). A write that fails fails the statement, and so
//! does a roll or a finish that fails (the rows written since the last completed object are
//! then reported as not delivered). A row is delivered, dead-lettered, or reported undelivered;
//! the input message a dead-lettered row came from is acknowledged only once the row is stored
//! (ADR 0071).

use std::sync::Arc;

use async_trait::async_trait;

use crate::error::Result;

/// Why a row is dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadClass {
    /// The encoder rejected the row (a serializer rejection): it was never sent.
    Encoding,
    /// The service refused the record, confirmed by sending it alone.
    Rejected,
    /// The row arrived for a window that was already emitted (ADR 0068).
    Late,
}

impl DeadClass {
    /// The name written into the dead letter (`encoding`, `rejected`).
    pub fn name(self) -> &'static str {
        match self {
            DeadClass::Encoding => "encoding",
            DeadClass::Rejected => "rejected",
            DeadClass::Late => "late",
        }
    }
}

/// What a dead letter carries of the row itself.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeadPayload {
    /// The encoded payload, where the record has one (a Pub/Sub message's data, a task's
    /// body).
    pub payload: Option<Vec<u8>>,
    /// The row as one JSON object: the source row for an encoding rejection, the record as it
    /// was sent for a service rejection (its payload left out).
    pub row: Option<serde_json::Map<String, serde_json::Value>>,
}

/// One row the sink could not deliver, with why.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadRow {
    /// Where the row was going (the resolved destination; empty when the encoder rejected the
    /// row before it had one).
    pub destination: String,
    /// Why it is dead.
    pub class: DeadClass,
    /// The service's status code (`INVALID_ARGUMENT`); `None` for an encoding rejection.
    pub code: Option<&'static str>,
    /// The error message (the service's, or the encoder's; never a row value).
    pub message: String,
    /// Send attempts the record had (0: never sent).
    pub attempts: u32,
    /// The row itself.
    pub data: DeadPayload,
}

/// Where a writer's dead rows go. One per writer of a statement; called from the writer's
/// send tasks, possibly at once.
#[async_trait]
pub trait DeadLetterSink: Send + Sync + 'static {
    /// Where the dead letters go, for errors and logs (`dead_letter_topic
    /// 'projects/p/topics/t'`).
    fn describe(&self) -> String;

    /// Stores one dead row (or, when not [`stored_on_write`](Self::stored_on_write), adds it
    /// to the object being written). `Err` fails the statement (the row then counts as not
    /// delivered).
    async fn write(&self, row: DeadRow) -> Result<()>;

    /// Whether a row is stored once [`write`](Self::write) returned `Ok` (a topic: each row is
    /// its own message), or only once the object holding it is completed by
    /// [`roll`](Self::roll) or [`finish`](Self::finish) (a path). The message a row came from
    /// is acknowledged only once the row is stored.
    fn stored_on_write(&self) -> bool {
        true
    }

    /// Completes the object written so far, if any, so that every row written until now is
    /// stored; the next [`write`](Self::write) starts a new object. Called at each flush point
    /// of the statement (and by a source on its own bound), so that in a statement that never
    /// ends dead letters are stored, and their messages acknowledged, within a flush interval.
    /// `Err`: the rows written since the previous roll are not stored, and nothing more is
    /// written. A sink that stores on write has nothing to complete.
    async fn roll(&self) -> Result<()> {
        Ok(())
    }

    /// Completes what [`write`](Self::write) started (an object written as it goes). Called
    /// once, at the end of the statement, whether it succeeded or not. `Err` fails the
    /// statement, and the rows written since the last [`roll`](Self::roll) count as not
    /// delivered.
    async fn finish(&self) -> Result<()>;
}

/// Renders a connector's record as a [`DeadPayload`] (its payload, and the rest of it as
/// JSON), for a record the service refused.
pub type DescribeRecord<R> = Arc<dyn Fn(&R) -> DeadPayload + Send + Sync>;

/// The dead-letter side of a writer under the `dead_letter` policy.
pub struct DeadLetters<R> {
    /// Where the rows go.
    pub sink: Arc<dyn DeadLetterSink>,
    /// How a refused record becomes the row of its dead letter.
    pub describe: DescribeRecord<R>,
}

impl<R> Clone for DeadLetters<R> {
    fn clone(&self) -> Self {
        DeadLetters {
            sink: self.sink.clone(),
            describe: self.describe.clone(),
        }
    }
}

impl<R> std::fmt::Debug for DeadLetters<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadLetters")
            .field("sink", &self.sink.describe())
            .finish()
    }
}
