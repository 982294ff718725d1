//! The resolve stage: what a send's outcome means for each record of the batch.
//!
//! [`Shared::resolve`] runs one batch to its end: it sends, sorts the records by the class of
//! their status ([`Shared::sort_outcomes`], which also acknowledges the delivered ones), and
//! hands each group to its own step:
//!
//! - fatal (a configuration or permission problem): the writer fails ([`Shared::fatal`]);
//! - rejected: an isolation pass re-sends each rejected record alone, and one confirmed alone
//!   goes to the failure policy and the consecutive-rejection breaker ([`Shared::isolate`],
//!   [`Shared::confirmed_rejection`]);
//! - NOT_FOUND: the recovery path, creating the destination when asked, under the recovery
//!   backoff and attempt budget ([`Shared::recover_not_found`]). The re-send that follows the
//!   creation the user asked for is part of that creation, not a retry: it is neither counted
//!   in `retries` nor logged as one (the transport reports the creation itself, once, when it
//!   made the destination). A NOT_FOUND after that is a retry like any other;
//! - retryable: the retry settings' timing and budget ([`Shared::retry_delay`]).
//!
//! The records still to send wait out the delay parked ([`Shared::park`]: counted in
//! `parked_for_retry`, still in flight) and the loop sends them again.
//!
//! Once the writer has failed (by this batch or another), no retry and no isolation send goes
//! out: the records still waiting are retired unsent and count as not delivered
//! ([`FlowWriter::not_delivered`](super::FlowWriter::not_delivered)).
//!
//! Every record that gets an outcome is moved to `retired`; the send task releases their gate
//! permits only after the outcome is counted and, for a failure, after the writer is marked
//! failed.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::Shared;
use crate::core::batch::Item;
use crate::core::dead_letter::{DeadClass, DeadPayload, DeadRow};
use crate::core::delivery::{Delivery, DeliveryHandle, settle_all};
use crate::core::metrics::{SinkMetrics, code_name};
use crate::core::retry::RetryState;
use crate::core::{Class, Destination, FailurePolicy, RetrySettings, SendOutcome, Transport};
use crate::error::{Error, Result};

/// Where one batch stands across its attempts.
struct BatchState {
    /// The transient-failure budget (restarted once a missing destination is back).
    retry: RetryState,
    /// NOT_FOUND re-sends so far.
    recovery_attempts: u32,
    /// Whether the transport was already asked to create the destination.
    created: bool,
    /// Under the fail policy, the first confirmed rejection: returned once the isolation pass
    /// has resolved every other record.
    first_rejection: Option<Error>,
}

impl BatchState {
    /// A batch about to be sent for the first time.
    fn new(retry: &RetrySettings) -> Self {
        BatchState {
            retry: retry.start(Instant::now()),
            recovery_attempts: 0,
            created: false,
            first_rejection: None,
        }
    }

    /// The batch is resolved: `Ok`, or the first confirmed rejection.
    fn finish(self) -> Result<()> {
        self.first_rejection.map_or(Ok(()), Err)
    }
}

/// One attempt's records that did not resolve, sorted by what happens to them next.
struct Sorted<R> {
    /// To send again: retryable and NOT_FOUND records.
    again: Vec<Item<R>>,
    /// Refused by the service, with their status.
    rejected: Vec<(Item<R>, tonic::Status)>,
    /// The status of the last record sent again (or failed), for the retry decision and errors.
    last: Option<tonic::Status>,
    /// Whether a record came back NOT_FOUND.
    missing: bool,
    /// A fatal status, if any record had one.
    fatal: Option<tonic::Status>,
}

impl<T: Transport> Shared<T> {
    /// Resolves a batch: acks, retries, recovers, isolates and applies the failure policy until
    /// every item is resolved, or returns the error that fails the writer.
    pub(super) async fn resolve(
        self: &Arc<Self>,
        destination: &Destination,
        client: &T::Client,
        mut items: Vec<Item<T::Record>>,
        retired: &mut Vec<Item<T::Record>>,
    ) -> Result<()> {
        let mut state = BatchState::new(&self.config.retry);
        loop {
            let solo = items.len() == 1;
            let timeout = state.retry.begin_attempt(Instant::now());
            let Some(outcome) = self.attempt(destination, client, &mut items, timeout).await else {
                // The writer failed while this batch waited for a send permit: it is not sent,
                // and its records stay undelivered (and are counted so).
                retired.append(&mut items);
                return state.finish();
            };
            let results = match outcome {
                SendOutcome::Whole(Ok(())) => {
                    // The common case, without a status per record.
                    let acked = items.len() as u64;
                    settle_all(
                        items.iter().map(|i| i.envelope.handle.as_ref()),
                        Delivery::Delivered,
                    );
                    retired.append(&mut items);
                    self.acknowledge(acked, 0);
                    return state.finish();
                }
                SendOutcome::Whole(r) => vec![r; items.len()],
                SendOutcome::PerRecord(v) => v,
            };
            let Sorted {
                mut again,
                rejected,
                last,
                missing,
                fatal,
            } = self.sort_outcomes(destination, items, results, solo, retired);
            if let Some(status) = fatal {
                retired.append(&mut again);
                retired.extend(rejected.into_iter().map(|(item, _)| item));
                return Err(self.fatal(destination, &status, &state.retry));
            }
            if let Err(e) = self
                .isolate(destination, client, rejected, solo, &mut state, retired)
                .await
            {
                retired.append(&mut again);
                return Err(e);
            }
            if again.is_empty() {
                return state.finish();
            }
            let status = last.unwrap_or_else(|| tonic::Status::unknown("no status"));
            let wait = if missing {
                self.recover_not_found(destination, client, &status, &mut state)
                    .await
            } else {
                self.retry_delay(destination, &status, &mut state.retry)
                    .map(|delay| (delay, Wait::Retry))
            };
            match wait {
                Ok((delay, wait)) => {
                    self.park(destination, &status, again.len(), delay, wait)
                        .await
                }
                Err(e) => {
                    retired.append(&mut again);
                    return Err(e);
                }
            }
            if self.is_failed() {
                // Another batch failed the writer while these waited: a retry would be a new
                // request after the failure. They stay undelivered (and are counted so).
                retired.append(&mut again);
                return state.finish();
            }
            items = again;
        }
    }

    /// Sorts one attempt's records by the class of their status. Acknowledged ones (delivered
    /// or de-duplicated) are retired and counted here; every failed one counts as a send error.
    fn sort_outcomes(
        &self,
        destination: &Destination,
        items: Vec<Item<T::Record>>,
        results: Vec<std::result::Result<(), tonic::Status>>,
        solo: bool,
        retired: &mut Vec<Item<T::Record>>,
    ) -> Sorted<T::Record> {
        let (mut acked, mut duplicates) = (0u64, 0u64);
        let mut sorted = Sorted {
            again: Vec::new(),
            rejected: Vec::new(),
            last: None,
            missing: false,
            fatal: None,
        };
        for (item, result) in items.into_iter().zip(results) {
            let (class, status) = match result {
                Ok(()) => (Class::Ok, None),
                Err(status) => (self.transport.classify(&status, solo), Some(status)),
            };
            match class {
                Class::Ok | Class::Duplicate => {
                    acked += 1;
                    duplicates += u64::from(class == Class::Duplicate);
                    if let Some(handle) = &item.envelope.handle {
                        handle.settle(1, Delivery::Delivered);
                    }
                    retired.push(item);
                }
                _ => {
                    let status = status.unwrap_or_else(|| tonic::Status::unknown("no status"));
                    self.metrics.send_error(
                        destination,
                        status.code(),
                        1,
                        self.config.per_destination_metrics,
                    );
                    match class {
                        Class::Retryable => sorted.again.push(item),
                        Class::NotFound => {
                            sorted.missing = true;
                            sorted.again.push(item);
                        }
                        Class::Rejected => {
                            sorted.rejected.push((item, status.clone()));
                            continue;
                        }
                        _ => {
                            sorted.fatal = Some(status.clone());
                            retired.push(item);
                        }
                    }
                    sorted.last = Some(status);
                }
            }
        }
        if acked > 0 {
            self.acknowledge(acked, duplicates);
        }
        sorted
    }

    /// The ack outcome: `acked` records delivered (`duplicates` of them delivered earlier).
    /// Any success resets the rejection breaker.
    fn acknowledge(&self, acked: u64, duplicates: u64) {
        self.metrics.acked(acked, duplicates);
        self.delivered.fetch_add(acked, Ordering::Relaxed);
        self.breaker.on_success();
    }

    /// The fatal outcome: the error that fails the writer.
    fn fatal(
        &self,
        destination: &Destination,
        status: &tonic::Status,
        retry: &RetryState,
    ) -> Error {
        rpc_error(
            self.transport.operation(),
            destination,
            status,
            retry.attempts(),
        )
    }

    /// The rejection outcome. A record rejected alone is confirmed and goes to the failure
    /// policy; one rejected in a batch is isolated: sent alone (and resolved like any batch) to
    /// tell a bad record from one refused because of its neighbours.
    ///
    /// Under the fail policy the first confirmed rejection fails the statement, but the
    /// isolation pass still runs to its end (the error kept in `state`), so the good records
    /// batched with the bad one are delivered rather than left unresolved behind it. Any other
    /// error (a breaker trip, a fatal status) ends the pass at once; the records it did not
    /// reach are retired with it.
    async fn isolate(
        self: &Arc<Self>,
        destination: &Destination,
        client: &T::Client,
        rejected: Vec<(Item<T::Record>, tonic::Status)>,
        solo: bool,
        state: &mut BatchState,
        retired: &mut Vec<Item<T::Record>>,
    ) -> Result<()> {
        let mut rejected = rejected.into_iter();
        while let Some((item, status)) = rejected.next() {
            if self.is_failed() {
                // Another batch failed the writer: no isolation send goes out after that (this
                // batch's own first rejection is kept in `state`, and does not fail the writer
                // until the pass ends). The records left are undelivered.
                retired.push(item);
                retired.extend(rejected.map(|(item, _)| item));
                return Ok(());
            }
            let outcome = if solo {
                let dead = self.describe_dead(&item.envelope.record);
                let handle = item.envelope.handle.clone();
                retired.push(item);
                self.confirmed_rejection(
                    destination,
                    &status,
                    dead,
                    state.retry.attempts(),
                    handle.as_ref(),
                )
                .await
            } else {
                tracing::warn!(%destination, code = code_name(status.code()), "isolating a rejected record by sending it alone");
                Box::pin(self.resolve(destination, client, vec![item], retired)).await
            };
            match outcome {
                Ok(()) => {}
                Err(e @ Error::Rejected { .. }) => {
                    state.first_rejection.get_or_insert(e);
                }
                Err(e) => {
                    retired.extend(rejected.map(|(item, _)| item));
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// A rejection confirmed by sending the record alone, under the failure policy: `fail`
    /// returns [`Error::Rejected`]; `drop` counts the record as dropped and feeds the
    /// consecutive-rejection breaker, which errs when it trips; `dead_letter` writes `dead`
    /// (the record as the connector renders it) to the dead-letter sink first (a write that
    /// fails is the error, and the record counts as not delivered), then counts it as
    /// dead-lettered and feeds the same breaker. The record's delivery handle, if any, is settled as
    /// dropped once that is done, or as dead-lettered once its dead letter is stored (never
    /// under `fail`).
    async fn confirmed_rejection(
        &self,
        destination: &Destination,
        status: &tonic::Status,
        dead: Option<DeadPayload>,
        attempts: u32,
        handle: Option<&Arc<dyn DeliveryHandle>>,
    ) -> Result<()> {
        match self.config.failure_policy {
            FailurePolicy::Fail => {
                self.metrics.rejected();
                self.refused.fetch_add(1, Ordering::Relaxed);
                Err(Error::Rejected {
                    destination: destination.to_string(),
                    code: status.code(),
                    message: status.message().to_string(),
                })
            }
            FailurePolicy::Drop => {
                self.metrics.rejected_and_dropped();
                self.dropped.fetch_add(1, Ordering::Relaxed);
                if let Some(handle) = handle {
                    handle.settle(1, Delivery::Dropped);
                }
                tracing::warn!(%destination, code = code_name(status.code()), message = status.message(), "dropping a rejected record");
                self.breaker.on_confirmed_rejection()
            }
            FailurePolicy::DeadLetter => {
                let row = DeadRow {
                    destination: destination.to_string(),
                    class: DeadClass::Rejected,
                    code: Some(code_name(status.code())),
                    message: status.message().to_string(),
                    attempts,
                    data: dead.unwrap_or_default(),
                };
                self.dead_letter(row).await?;
                self.settle_dead_lettered(handle);
                self.metrics.rejected_and_dead_lettered();
                self.dead_lettered.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%destination, code = code_name(status.code()), message = status.message(), "dead-lettered a rejected record");
                self.breaker.on_confirmed_rejection()
            }
        }
    }

    /// The NOT_FOUND outcome: the delay before the re-send under the recovery settings, asking
    /// the transport once to create the destination when the settings say so. Errs when there
    /// is no recovery (NOT_FOUND is then fatal), when its attempts run out, or when the
    /// creation fails. The transient-failure budget starts over once the destination is back.
    ///
    /// The re-send right after asking for the creation is [`Wait::AfterCreation`], whether this
    /// batch made the destination or found it made (by a batch sent at the same time): many
    /// batches meet the same missing destination at once, and none of them is retrying
    /// anything the user should be warned about. A later NOT_FOUND of the same batch is a
    /// [`Wait::Retry`].
    async fn recover_not_found(
        &self,
        destination: &Destination,
        client: &T::Client,
        status: &tonic::Status,
        state: &mut BatchState,
    ) -> Result<(Duration, Wait)> {
        let Some(recovery) = &self.config.not_found else {
            return Err(self.fatal(destination, status, &state.retry));
        };
        state.recovery_attempts += 1;
        if state.recovery_attempts >= recovery.max_attempts {
            return Err(Error::RecoveryExhausted {
                destination: destination.to_string(),
                option: recovery.attempts_option,
                attempts: state.recovery_attempts,
                message: status.message().to_string(),
            });
        }
        let mut wait = Wait::Retry;
        if recovery.create && !state.created {
            let made = self
                .transport
                .create_destination(client, destination)
                .await?;
            if made {
                // The transport logs the creation at info, naming what it made (a topic, a
                // table, column families); the core knows only that it was asked.
                tracing::debug!(%destination, "the missing destination was created");
                self.metrics.resource_created();
            } else {
                tracing::debug!(%destination, "the missing destination exists now");
            }
            state.created = true;
            wait = Wait::AfterCreation;
        }
        state.retry = self.config.retry.start(Instant::now());
        Ok((recovery.backoff.delay(state.recovery_attempts), wait))
    }

    /// The retryable outcome: the delay before the next attempt under the retry settings, or
    /// the error naming the spent budget (and the option behind it, when there is one).
    fn retry_delay(
        &self,
        destination: &Destination,
        status: &tonic::Status,
        retry: &mut RetryState,
    ) -> Result<Duration> {
        match retry.next_delay(Instant::now()) {
            Some(delay) => Ok(delay),
            None => Err(retry_exhausted(
                self.fatal(destination, status, retry),
                self.config.retry_option,
            )),
        }
    }

    /// Waits out a retry or recovery `delay` with `records` parked: counted in
    /// `parked_for_retry` (and still in flight) until the delay ends or the task is aborted. A
    /// [`Wait::Retry`] counts in `retries` and logs a warning; a [`Wait::AfterCreation`] does
    /// neither (debug only).
    async fn park(
        &self,
        destination: &Destination,
        status: &tonic::Status,
        records: usize,
        delay: Duration,
        wait: Wait,
    ) {
        match wait {
            Wait::Retry => {
                self.metrics.retried(status.code());
                tracing::warn!(%destination, code = code_name(status.code()), records, ?delay, "retrying a send");
            }
            Wait::AfterCreation => {
                tracing::debug!(%destination, records, ?delay, "sending again to the destination created for it");
            }
        }
        let parked = Parked::new(&self.metrics, records as u64);
        tokio::time::sleep(delay).await;
        drop(parked);
    }
}

/// Why records wait before they are sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// A retry: a transient failure, or a destination still missing. Counted in `retries`
    /// and logged at warn.
    Retry,
    /// The re-send after the destination the user asked the sink to create was created (by
    /// this batch or by another one at the same time): part of the creation, not a retry.
    AfterCreation,
}

/// Names the option behind a spent retry budget, when the connector has one.
fn retry_exhausted(error: Error, option: Option<&'static str>) -> Error {
    match option {
        Some(option) => Error::RetryExhausted {
            source: Box::new(error),
            option,
        },
        None => error,
    }
}

fn rpc_error(
    operation: &'static str,
    destination: &Destination,
    status: &tonic::Status,
    attempts: u32,
) -> Error {
    Error::rpc(operation, destination, status, attempts)
}

/// Counts records in `parked_for_retry` while alive (an aborted sleep uncounts them too).
struct Parked<'a> {
    metrics: &'a SinkMetrics,
    records: u64,
}

impl<'a> Parked<'a> {
    fn new(metrics: &'a SinkMetrics, records: u64) -> Self {
        metrics.parked(records);
        Parked { metrics, records }
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.metrics.unparked(self.records);
    }
}
