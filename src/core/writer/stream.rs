//! The writer loop: one writer's input stream driven through its [`FlowWriter`], with flush
//! points and the statement's stop request. Core types only: the connector supplies how a
//! batch encodes and how a rejected row reads as a dead letter.

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::execution::SendableRecordBatchStream;
use futures::{FutureExt, StreamExt};
use tokio::time::{Instant, MissedTickBehavior};

use super::FlowWriter;
use crate::core::run::{FlushPoint, FlushSettings, WriterContext};
use crate::core::{DeadPayload, Envelope, StopKind, Transport};
use crate::error::{Error, Result};

/// How a row the encoder rejected reads in its dead letter: the source row of `batch` at the
/// given index.
pub type SourceRow = fn(&RecordBatch, usize) -> DeadPayload;

/// Drives one writer's input through its [`FlowWriter`]: encodes each batch with `encode`,
/// writes what encodes and hands what does not to the failure policy, makes flush points,
/// flushes at the end, and closes.
///
/// `encode` appends one entry per row, in row order, for the batch whose first row has the
/// given index within the writer's input; `source_row` renders a row it rejected for the
/// dead-letter policy. On failure the writer sends nothing new, lets the
/// sends already under way finish (within the shutdown budget), and the error says how many
/// rows were acknowledged and how many were not delivered: every failure, whatever its cause
/// (the input stream, the encoder under the `fail` policy, the service, the progress watchdog,
/// the release of the clients), is returned as one [`Error::Incomplete`] carrying both counts.
///
/// Flush points (`flush`): at each one the writer sends every open batch, waits until every
/// row it admitted is resolved, releases idle destinations, completes its dead-letter object
/// (so the messages of its rows may be acknowledged), tells its input (which completes its
/// own), and reports a [`FlushPoint`] (a log line, and `ctx.observer`). Input is not read
/// meanwhile.
///
/// The statement's stop request (`ctx.stop`, see [`StopKind`]) is watched while waiting for
/// input and while writing:
/// - a drain stops reading input once the batch in hand is written, then flushes within the
///   shutdown budget: `Ok` when every admitted row was delivered;
/// - a settle (another writer failed) sends nothing new and waits for the sends on the wire
///   within the shutdown budget;
/// - an abort waits for nothing.
///
/// Short of a fully delivered drain, a stopped writer returns an [`Error::Incomplete`] whose
/// source is [`Error::Stopped`], with its counts.
pub(crate) async fn write_stream<T, F>(
    mut writer: FlowWriter<T>,
    mut input: SendableRecordBatchStream,
    ctx: &WriterContext,
    flush: FlushSettings,
    source_row: SourceRow,
    mut encode: F,
) -> Result<u64>
where
    T: Transport,
    F: FnMut(&RecordBatch, u64, &mut Vec<Result<Envelope<T::Record>>>) -> Result<()> + Send,
{
    let stop = &ctx.stop;
    let stopped = |detail: Option<String>| {
        let reason = stop
            .reason()
            .unwrap_or_else(|| "the statement was stopped".into());
        Error::Stopped {
            reason: match detail {
                Some(d) => format!("{reason}; {d}"),
                None => reason,
            },
        }
    };
    let started = Instant::now();
    let budget = writer.shutdown_timeout();
    // Set when a drain overran its budget: the budget is spent, nothing more is waited for.
    let mut overran = false;
    let mut encoded = Vec::new();
    let mut run = Vec::new();
    let drive = async {
        let mut first_row = 0u64;
        let mut points = 0u64;
        let mut since_point = 0u64;
        let mut ticker = flush.interval.map(|every| {
            let mut t = tokio::time::interval_at(Instant::now() + every, every);
            t.set_missed_tick_behavior(MissedTickBehavior::Delay);
            t
        });
        let mut draining = false;
        // With an input that carries delivery handles, a stop asks the input to stop reading
        // instead: it then emits what it read and ends, and every row it emitted is written
        // and settled, so what it read is acknowledged.
        let mut input_stopped = false;
        loop {
            let next = if draining {
                // Stopping: the rows the input already holds (decoded, or waiting in a
                // repartition's buffers) are still taken, but nothing is waited for.
                match ready_next(&mut input).await {
                    Some(next) => next,
                    None => break,
                }
            } else {
                let tick = crate::core::run::next_tick(&mut ticker);
                tokio::select! {
                    biased;
                    _ = stop.stopped(), if !input_stopped => {
                        match &ctx.delivery {
                            Some(slot) => {
                                tracing::info!(
                                    writer = ctx.writer + 1,
                                    writers = ctx.writers,
                                    input = %slot.describe(),
                                    "stop requested: the input stops reading; writing what it read"
                                );
                                slot.stop_reading();
                                input_stopped = true;
                            }
                            None => draining = true,
                        }
                        continue;
                    }
                    () = tick => {
                        flush_point(&mut writer, ctx, &mut points, first_row, started).await?;
                        since_point = 0;
                        continue;
                    }
                    next = input.next() => next,
                }
            };
            let Some(batch) = next else { break };
            let batch = batch?;
            // The batch's delivery handle is taken before the input is asked for anything
            // more, and every row of it is retained: each is settled once it is delivered,
            // dead-lettered or dropped (crate::core::delivery).
            let handle = ctx.delivery.as_ref().and_then(|slot| slot.current());
            if let Some(handle) = &handle {
                handle.retain(batch.num_rows() as u64)?;
            }
            encode(&batch, first_row, &mut encoded)?;
            // Rows that encoded go to the writer in runs; a rejected row is handed to the
            // failure policy after the rows before it, so the order of outcomes is the row order.
            for (row, record) in encoded.drain(..).enumerate() {
                match record {
                    Ok(mut envelope) => {
                        envelope.handle.clone_from(&handle);
                        run.push(envelope);
                    }
                    Err(rejected) => {
                        writer.write_many(&mut run).await?;
                        writer
                            .reject_encoded(rejected, || source_row(&batch, row))
                            .await?;
                        writer.settle_taken(handle.as_ref());
                    }
                }
            }
            writer.write_many(&mut run).await?;
            first_row += batch.num_rows() as u64;
            since_point += batch.num_rows() as u64;
            if !draining && flush.rows.is_some_and(|rows| since_point >= rows) {
                flush_point(&mut writer, ctx, &mut points, first_row, started).await?;
                since_point = 0;
                if let Some(t) = ticker.as_mut() {
                    t.reset();
                }
            }
        }
        if draining {
            tracing::info!(
                writer = ctx.writer + 1,
                writers = ctx.writers,
                rows_read = first_row,
                "stop requested: no more input is read; delivering what was admitted"
            );
            if tokio::time::timeout(budget, writer.flush()).await.is_err() {
                overran = true;
                return Err(stopped(Some(format!(
                    "delivering the admitted rows overran the shutdown budget of {budget:?}"
                ))));
            }
        } else {
            writer.flush().await?;
        }
        Ok(())
    };
    // Cancelling `drive` at a settle or an abort is safe for the counts: a row it had admitted
    // but not yet batched is dropped unsent, and is counted below as not delivered. The stop is
    // polled first: once raised, `drive` is not polled again (not even for a batch it has
    // ready).
    let result: Result<()> = tokio::select! {
        biased;
        _ = stop.reaches(StopKind::Settle) => Err(stopped(None)),
        result = drive => result,
    };
    // The dead-letter destination is completed once, whatever the outcome: after a failure,
    // once the sends under way have settled (their rejections may still dead-letter rows).
    let mut dead_letters_finished = false;
    let result = match result {
        Ok(()) => {
            dead_letters_finished = true;
            writer.finish_dead_letters().await
        }
        Err(error) => Err(error),
    };
    let (error, acknowledged, not_delivered, dead_lettered) = match result {
        Ok(()) => {
            let (acknowledged, not_delivered) = (writer.delivered(), writer.not_delivered());
            let dead_lettered = writer.dead_lettered();
            match writer.close().await {
                Ok(()) => return Ok(acknowledged),
                // Every row landed, but releasing the clients overran its budget.
                Err(error) => (error, acknowledged, not_delivered, dead_lettered),
            }
        }
        Err(error) => {
            if !overran {
                // An abort cuts the settle short; it waits for nothing.
                tokio::select! {
                    biased;
                    _ = stop.reaches(StopKind::Abort) => {}
                    _ = writer.settle() => {}
                }
            }
            if !dead_letters_finished && let Err(finish) = writer.finish_dead_letters().await {
                tracing::warn!(error = %finish, "completing the dead letters of a failed statement");
            }
            // Counted once the sends under way have finished; closing aborts what is left.
            let (acknowledged, not_delivered) = (writer.delivered(), writer.not_delivered());
            let dead_lettered = writer.dead_lettered();
            if let Err(close) = writer.close().await {
                tracing::warn!(error = %close, "releasing clients after a failed statement");
            }
            (error, acknowledged, not_delivered, dead_lettered)
        }
    };
    Err(Error::Incomplete {
        source: Box::new(error),
        acknowledged,
        not_delivered,
        dead_lettered,
    })
}

/// The input's next item if it is ready now (or after letting other tasks run once): `None`
/// when the input would have to wait.
async fn ready_next(
    input: &mut SendableRecordBatchStream,
) -> Option<Option<datafusion::error::Result<RecordBatch>>> {
    for _ in 0..2 {
        if let Some(next) = input.next().now_or_never() {
            return Some(next);
        }
        tokio::task::yield_now().await;
    }
    None
}

/// One flush point: every open batch sent and every admitted row resolved, idle destinations
/// released (both inside [`FlowWriter::flush`]), then the point reported.
async fn flush_point<T: Transport>(
    writer: &mut FlowWriter<T>,
    ctx: &WriterContext,
    sequence: &mut u64,
    rows_read: u64,
    started: Instant,
) -> Result<()> {
    // The point is the moment it was made: every row read until then is resolved once the
    // flush returns.
    let elapsed = started.elapsed();
    writer.flush().await?;
    // Every dead letter written until now is stored, and the messages of its rows may be
    // acknowledged; the input completes what it holds of its own too (ADR 0071).
    writer.roll_dead_letters().await?;
    if let Some(input) = &ctx.delivery {
        input.flush_point();
    }
    *sequence += 1;
    writer.metrics().flush_point();
    let point = FlushPoint {
        writer: ctx.writer,
        writers: ctx.writers,
        sequence: *sequence,
        elapsed,
        rows_read,
        counts: writer.metrics().counts(),
        per_destination: writer.metrics().per_destination(),
        delivery: ctx.delivery.as_ref().map(|slot| slot.counts()),
    };
    let c = &point.counts;
    tracing::info!(
        writer = ctx.writer + 1,
        writers = ctx.writers,
        sequence = point.sequence,
        rows_read,
        acknowledged = c.acknowledged,
        skipped = c.skipped,
        dropped = c.dropped,
        dead_lettered = c.dead_lettered,
        retries = c.retries,
        destinations_released = c.destinations_released,
        "flush point: every row read so far is resolved"
    );
    if let Some(input) = &point.delivery {
        tracing::info!(
            writer = ctx.writer + 1,
            messages_read = input.messages_read,
            messages_acknowledged = input.messages_acked,
            messages_nacked = input.messages_nacked,
            "flush point: the input's messages so far (acknowledgements follow delivery)"
        );
    }
    if let Some(observer) = &ctx.observer {
        observer(&point);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use std::sync::Arc;

    use super::*;
    use crate::core::{FlowConfig, SinkMetrics};
    use crate::testing::{FakeReply, FakeTransport};
    use datafusion::arrow::array::UInt32Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
    use datafusion::physical_plan::stream::RecordBatchStreamAdapter;

    const PROGRESS: Duration = Duration::from_secs(10);
    const SHUTDOWN: Duration = Duration::from_secs(3);

    /// The core tests' settings, with the budgets these tests time and no breaker. They set no
    /// attempt deadline: a stalled send ends only by the watchdog or the settle.
    fn config() -> FlowConfig {
        FlowConfig {
            progress_timeout: Some(PROGRESS),
            shutdown_timeout: SHUTDOWN,
            max_consecutive_rejections: None,
            ..crate::core::test_flow_config()
        }
    }

    /// Encodes each row as its index in the writer's input, to destination `d`.
    fn encode_indices(
        batch: &RecordBatch,
        first_row: u64,
        out: &mut Vec<Result<Envelope<u32>>>,
    ) -> Result<()> {
        for row in 0..batch.num_rows() as u64 {
            out.push(Ok(Envelope {
                record: u32::try_from(first_row + row).expect("row index"),
                bytes: 10,
                destination: Arc::from("d"),
                sequence_key: None,
                serial_key: None,
                handle: None,
            }));
        }
        Ok(())
    }

    /// No rejected row is expected: the encoder above rejects none.
    fn no_source_row(_: &RecordBatch, _: usize) -> DeadPayload {
        DeadPayload::default()
    }

    /// One batch of `rows` rows, each encoded as its own index.
    async fn run_statement(fake: Arc<FakeTransport<u32>>, rows: u32) -> Result<u64> {
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::UInt32, false)]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(UInt32Array::from_iter_values(0..rows))],
        )
        .expect("batch");
        let input: SendableRecordBatchStream = Box::pin(RecordBatchStreamAdapter::new(
            schema,
            futures::stream::iter([Ok(batch)]),
        ));
        let set = ExecutionPlanMetricsSet::new();
        let writer = FlowWriter::new(fake, config(), SinkMetrics::new(&set));
        write_stream(
            writer,
            input,
            &WriterContext::single(),
            FlushSettings::default(),
            no_source_row,
            encode_indices,
        )
        .await
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_statement_returns_one_shutdown_budget_after_its_progress_timeout() {
        let fake = Arc::new(FakeTransport::<u32>::new());
        fake.respond_with(|_| FakeReply::Stall);
        let start = Instant::now();
        let error = run_statement(fake.clone(), 25).await.unwrap_err();
        // The watchdog fires at the progress timeout; the sends still on the wire are then
        // given one shutdown budget to settle, and the release after it costs nothing more.
        assert_eq!(start.elapsed(), PROGRESS + SHUTDOWN);
        match error {
            Error::Incomplete {
                source,
                acknowledged,
                not_delivered,
                ..
            } => {
                assert!(
                    matches!(*source, Error::ProgressTimeout { option, .. } if option == "publish_progress_timeout"),
                    "{source:?}"
                );
                assert_eq!(acknowledged, 0);
                assert_eq!(not_delivered, 25);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(fake.closed(), vec![Arc::<str>::from("d")]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_statement_whose_stalled_sends_end_during_the_settle_returns_as_they_end() {
        let fake = Arc::new(FakeTransport::<u32>::new());
        // Each send answers a second after the watchdog fired: the settle waits for that
        // second only, not for its whole budget.
        fake.respond_with(|_| {
            FakeReply::Delay(PROGRESS + Duration::from_secs(1), Box::new(FakeReply::Ok))
        });
        let start = Instant::now();
        let error = run_statement(fake, 25).await.unwrap_err();
        assert_eq!(start.elapsed(), PROGRESS + Duration::from_secs(1));
        // Every admitted row was acknowledged during the settle, and the error says so.
        assert!(
            matches!(
                &error,
                Error::Incomplete { source, acknowledged: 25, not_delivered: 0, .. }
                    if matches!(**source, Error::ProgressTimeout { .. })
            ),
            "{error:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_takes_the_rows_the_input_holds_ready_and_waits_for_no_more() {
        let fake = Arc::new(FakeTransport::<u32>::new());
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::UInt32, false)]));
        let batch = |from: u32| {
            RecordBatch::try_new(
                Arc::clone(&schema),
                vec![Arc::new(UInt32Array::from_iter_values(from..from + 10))],
            )
            .map_err(datafusion::error::DataFusionError::from)
        };
        // Three batches the source already holds, then a source that never yields again.
        let ready = futures::stream::iter([batch(0), batch(10), batch(20)]);
        let input: SendableRecordBatchStream = Box::pin(RecordBatchStreamAdapter::new(
            schema.clone(),
            ready.chain(futures::stream::pending()),
        ));
        let ctx = WriterContext::single();
        // Stopped before the writer read anything.
        ctx.stop.stop(StopKind::Drain, "stop requested (test)");
        let set = ExecutionPlanMetricsSet::new();
        let writer = FlowWriter::new(fake.clone(), config(), SinkMetrics::new(&set));
        let delivered = write_stream(
            writer,
            input,
            &ctx,
            FlushSettings::default(),
            no_source_row,
            encode_indices,
        )
        .await
        .expect("a drain that delivered everything is Ok");
        assert_eq!(delivered, 30);
        let mut sent: Vec<u32> = fake.calls().into_iter().flat_map(|c| c.records).collect();
        sent.sort_unstable();
        assert_eq!(sent, (0..30).collect::<Vec<_>>());
    }

    /// A slot that hands out one recorder as the origin of every batch.
    #[derive(Debug)]
    struct FixedSlot(Arc<crate::core::delivery::tests::Recorder>);

    impl crate::core::delivery::DeliveryInput for FixedSlot {
        fn current(&self) -> Option<Arc<dyn crate::core::delivery::DeliveryHandle>> {
            Some(self.0.clone())
        }

        fn stop_reading(&self) {}

        fn counts(&self) -> crate::core::delivery::DeliveryCounts {
            crate::core::delivery::DeliveryCounts::default()
        }

        fn settled(&self) -> futures::future::BoxFuture<'static, ()> {
            Box::pin(async {})
        }

        fn describe(&self) -> String {
            "a fixed origin".into()
        }
    }

    /// Two batches of five rows (indices 0 to 9) through a writer whose input has an origin,
    /// under `policy`; the encoder refuses row 3.
    async fn run_with_origin(
        fake: Arc<FakeTransport<u32>>,
        policy: crate::core::FailurePolicy,
    ) -> (Result<u64>, Arc<crate::core::delivery::tests::Recorder>) {
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::UInt32, false)]));
        let batch = |from: u32| {
            RecordBatch::try_new(
                Arc::clone(&schema),
                vec![Arc::new(UInt32Array::from_iter_values(from..from + 5))],
            )
            .map_err(Into::into)
        };
        let input: SendableRecordBatchStream = Box::pin(RecordBatchStreamAdapter::new(
            schema.clone(),
            futures::stream::iter([batch(0), batch(5)]),
        ));
        let recorder = Arc::new(crate::core::delivery::tests::Recorder::default());
        let ctx = WriterContext {
            delivery: Some(Arc::new(FixedSlot(recorder.clone()))),
            ..WriterContext::single()
        };
        let set = ExecutionPlanMetricsSet::new();
        let config = FlowConfig {
            failure_policy: policy,
            ..config()
        };
        let writer = FlowWriter::new(fake, config, SinkMetrics::new(&set));
        let result = write_stream(
            writer,
            input,
            &ctx,
            FlushSettings::default(),
            no_source_row,
            |batch, first_row, out| {
                encode_indices(batch, first_row, out)?;
                if (first_row..first_row + batch.num_rows() as u64).contains(&3) {
                    out[usize::try_from(3 - first_row).expect("index")] =
                        Err(Error::invalid("n", "3", "refused by the test encoder"));
                }
                Ok(())
            },
        )
        .await;
        (result, recorder)
    }

    #[tokio::test(start_paused = true)]
    async fn every_row_of_an_origin_is_retained_and_settled_by_how_it_ended() {
        use crate::core::delivery::Delivery as Settled;
        let fake = Arc::new(FakeTransport::<u32>::new());
        // Row 7 is refused by the service (alone too); every other row is delivered.
        fake.respond_with(|call| {
            FakeReply::PerRecord(
                call.records
                    .iter()
                    .map(|r| match r {
                        7 => Err(tonic::Status::invalid_argument("scripted refusal")),
                        _ => Ok(()),
                    })
                    .collect(),
            )
        });
        let (result, origin) = run_with_origin(fake, crate::core::FailurePolicy::Drop).await;
        assert_eq!(
            result.expect("the drop policy keeps the statement going"),
            8
        );
        assert_eq!(*origin.retained.lock().unwrap(), 10);
        assert_eq!(origin.count(Settled::Delivered), 8);
        assert_eq!(
            origin.count(Settled::Dropped),
            2,
            "row 3 (encoder), row 7 (service)"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn rows_that_were_not_delivered_are_never_settled() {
        let fake = Arc::new(FakeTransport::<u32>::new());
        fake.respond_with(|_| FakeReply::code(tonic::Code::PermissionDenied));
        let (result, origin) = run_with_origin(fake, crate::core::FailurePolicy::Drop).await;
        assert!(result.is_err(), "a fatal status fails the writer");
        assert_eq!(*origin.retained.lock().unwrap(), 10);
        // Only the row the encoder refused (dropped before anything was sent) settles.
        let settled: u64 = origin.settled.lock().unwrap().iter().map(|(n, _)| n).sum();
        assert!(settled <= 1, "settled {settled} rows of a failed statement");
        assert_eq!(origin.count(crate::core::delivery::Delivery::Delivered), 0);
    }
}
