//! Unit tests of the writer, end to end through its public lifecycle, on a paused clock against
//! the in-process [`FakeTransport`].

use std::time::Duration;

use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use tokio::time::Instant;
use tonic::Code;

use super::*;
use crate::core::metrics::names;
use crate::core::{Backoff, BatchThresholds, RecoverySettings, RetrySettings};
// This whole file is the writer's test module (`#[cfg(test)] mod tests;` in `mod.rs`); the
// attribute below says so again where a reader of this file alone looks, before its first use
// of the test support: the core depends on `crate::testing` in its tests only.
#[cfg(test)]
use crate::testing::{FakeReply, FakeTransport};

type Fake = FakeTransport<u32>;

/// The flow settings the writer's tests start from (also used by the statement-path tests
/// in `connectors`).
pub(crate) fn config() -> FlowConfig {
    FlowConfig {
        max_in_flight_records: 100,
        max_in_flight_bytes: u64::MAX,
        in_flight_option: "max_in_flight_messages",
        progress_timeout: Some(Duration::from_secs(600)),
        progress_option: "publish_progress_timeout",
        shutdown_timeout: Duration::from_secs(30),
        shutdown_option: "shutdown_timeout",
        max_active_destinations: 10,
        destination_idle_timeout: Duration::from_secs(300),
        per_destination_metrics: false,
        max_consecutive_rejections: Some(100),
        breaker_option: "max_consecutive_rejections",
        batch: BatchThresholds {
            max_records: 10,
            max_bytes: 1_000_000,
            max_delay: Duration::from_millis(10),
        },
        retry: RetrySettings {
            total_timeout: Duration::ZERO,
            max_attempts: 5,
            initial_retry_delay: Duration::from_millis(100),
            retry_delay_multiplier: 2.0,
            max_retry_delay: Duration::from_secs(1),
            initial_rpc_timeout: Duration::ZERO,
            rpc_timeout_multiplier: 1.0,
            max_rpc_timeout: Duration::ZERO,
            jitter: false,
        },
        retry_option: Some("retry_max_attempts"),
        not_found: None,
        failure_policy: FailurePolicy::Fail,
        max_concurrent_sends: 10,
        max_records_per_second: None,
    }
}

struct Harness {
    fake: Arc<Fake>,
    writer: FlowWriter<Fake>,
    set: ExecutionPlanMetricsSet,
}

impl Harness {
    fn new(config: FlowConfig) -> Self {
        let fake = Arc::new(Fake::new());
        let set = ExecutionPlanMetricsSet::new();
        let writer = FlowWriter::new(fake.clone(), config, SinkMetrics::new(&set));
        Harness { fake, writer, set }
    }

    fn metric(&self, name: &str) -> usize {
        self.set
            .clone_inner()
            .sum_by_name(name)
            .map(|v| v.as_usize())
            .unwrap_or(0)
    }

    async fn write(&mut self, n: u32, destination: &str) -> Result<()> {
        self.writer.write(envelope(n, destination, None)).await
    }

    async fn write_all(
        &mut self,
        range: std::ops::RangeInclusive<u32>,
        destination: &str,
    ) -> Result<()> {
        for n in range {
            self.write(n, destination).await?;
        }
        Ok(())
    }
}

fn envelope(n: u32, destination: &str, key: Option<&str>) -> Envelope<u32> {
    Envelope {
        record: n,
        bytes: 10,
        destination: Arc::from(destination),
        sequence_key: key.map(Arc::from),
        serial_key: None,
        handle: None,
    }
}

fn sorted(mut v: Vec<u32>) -> Vec<u32> {
    v.sort_unstable();
    v
}

#[tokio::test(start_paused = true)]
async fn new_writer_has_no_side_effects() {
    let h = Harness::new(config());
    tokio::task::yield_now().await;
    assert!(h.fake.opened().is_empty());
    assert!(h.fake.calls().is_empty());
    drop(h.writer);
    tokio::task::yield_now().await;
    assert!(h.fake.closed().is_empty());
}

#[tokio::test(start_paused = true)]
async fn delay_timer_sends_while_the_writer_is_not_called() {
    let mut h = Harness::new(config());
    h.write(1, "d").await.expect("write");
    assert!(h.fake.calls().is_empty(), "below every threshold");
    // The input stalls: nothing calls the writer, the 10 ms delay still sends the batch.
    tokio::time::sleep(Duration::from_millis(11)).await;
    assert_eq!(h.fake.batches(), vec![vec![1]]);
    assert_eq!(h.writer.delivered(), 1);
}

#[tokio::test(start_paused = true)]
async fn count_threshold_sends_full_batches_and_flush_sends_the_rest() {
    let mut h = Harness::new(config());
    h.write_all(1..=25, "d").await.expect("write");
    h.writer.flush().await.expect("flush");
    let sizes: Vec<usize> = h.fake.batches().iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![10, 10, 5]);
    assert_eq!(h.writer.delivered(), 25);
    assert_eq!(h.metric(names::RECORDS_SENT), 25);
    assert_eq!(h.metric(names::RECORDS_ACKED), 25);
    assert_eq!(h.metric(names::BYTES_SENT), 250);
    assert_eq!(h.metric(names::SEND_RPCS), 3);
    assert_eq!(h.metric(names::IN_FLIGHT_RECORDS), 0);
}

#[tokio::test(start_paused = true)]
async fn writing_many_batches_like_writing_one_by_one_across_destinations_and_a_full_gate() {
    let mut c = config();
    c.max_in_flight_records = 15;
    c.batch.max_records = 4;
    let mut h = Harness::new(c);
    h.fake
        .respond_with(|_| FakeReply::Delay(Duration::from_secs(1), Box::new(FakeReply::Ok)));
    let mut envelopes: Vec<Envelope<u32>> = (1..=30)
        .map(|n| envelope(n, if n <= 20 { "a" } else { "b" }, None))
        .collect();
    let start = Instant::now();
    h.writer.write_many(&mut envelopes).await.expect("write");
    assert!(envelopes.is_empty(), "the input is drained");
    // 15 fit at once; the 16th waited for the first batches to resolve, 1 s in.
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(h.metric(names::IN_FLIGHT_RECORDS_HIGH_WATER), 15);
    h.writer.flush().await.expect("flush");
    assert_eq!(h.writer.delivered(), 30);
    let calls = h.fake.calls();
    let to = |d: &str| -> Vec<Vec<u32>> {
        calls
            .iter()
            .filter(|c| &*c.destination == d)
            .map(|c| c.records.clone())
            .collect()
    };
    // Batches per destination in admission order, cut at 4 records; the blocked admission of
    // 16 sent the open [13, 14, 15] first, and the flush sent the [20] left open.
    assert_eq!(
        to("a"),
        vec![
            vec![1, 2, 3, 4],
            vec![5, 6, 7, 8],
            vec![9, 10, 11, 12],
            vec![13, 14, 15],
            vec![16, 17, 18, 19],
            vec![20]
        ]
    );
    assert_eq!(
        to("b"),
        vec![vec![21, 22, 23, 24], vec![25, 26, 27, 28], vec![29, 30]]
    );
}

#[tokio::test(start_paused = true)]
async fn write_at_the_in_flight_cap_waits_for_a_completion() {
    let mut c = config();
    c.max_in_flight_records = 2;
    c.batch.max_records = 1;
    let mut h = Harness::new(c);
    h.fake
        .respond_with(|_| FakeReply::Delay(Duration::from_secs(5), Box::new(FakeReply::Ok)));
    let start = Instant::now();
    h.write_all(1..=3, "d").await.expect("write");
    // The third write waited for the first completion, 5 s in.
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert_eq!(h.metric(names::IN_FLIGHT_RECORDS_HIGH_WATER), 2);
    h.writer.flush().await.expect("flush");
    assert_eq!(h.writer.delivered(), 3);
}

#[tokio::test(start_paused = true)]
async fn retryable_failure_is_retried_and_counted_once_as_sent() {
    let mut h = Harness::new(config());
    h.fake
        .push(FakeReply::code(Code::Unavailable))
        .push(FakeReply::code(Code::ResourceExhausted));
    h.write_all(1..=3, "d").await.expect("write");
    let start = Instant::now();
    h.writer.flush().await.expect("flush");
    // 100 ms then 200 ms of backoff.
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    assert_eq!(h.fake.batches(), vec![vec![1, 2, 3]; 3]);
    assert_eq!(
        h.metric(names::RECORDS_SENT),
        3,
        "each record once, never per retry"
    );
    assert_eq!(h.metric(names::SEND_RPCS), 3);
    assert_eq!(h.metric(names::RETRIES), 2);
    assert_eq!(h.metric(names::SEND_ERRORS), 6);
    assert_eq!(h.metric(names::SEND_ERRORS_BY_CODE), 6);
    let snapshot = h.writer.metrics().snapshot();
    assert_eq!(
        snapshot.send_errors_by_code.get(&Code::Unavailable),
        Some(&3)
    );
    assert_eq!(snapshot.parked_for_retry, 0);
    assert_eq!(h.writer.delivered(), 3);
}

#[tokio::test(start_paused = true)]
async fn records_waiting_out_a_backoff_are_parked_and_stay_in_flight() {
    let mut h = Harness::new(config());
    h.fake.push(FakeReply::code(Code::Unavailable));
    h.write_all(1..=2, "d").await.expect("write");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(h.metric(names::PARKED_FOR_RETRY), 2);
    assert_eq!(h.metric(names::IN_FLIGHT_RECORDS), 2);
    h.writer.flush().await.expect("flush");
    assert_eq!(h.metric(names::PARKED_FOR_RETRY), 0);
}

#[tokio::test(start_paused = true)]
async fn retry_exhaustion_names_operation_destination_and_code() {
    let mut c = config();
    c.retry.max_attempts = 3;
    let mut h = Harness::new(c);
    h.fake.respond_with(|_| FakeReply::code(Code::Unavailable));
    h.write(1, "projects/p/topics/t").await.expect("write");
    match h.writer.flush().await {
        Err(Error::RetryExhausted { source, option }) => {
            assert_eq!(option, "retry_max_attempts");
            let Error::Rpc {
                operation,
                destination,
                code,
                attempts,
                ..
            } = *source
            else {
                panic!("unexpected {source:?}");
            };
            assert_eq!(operation, "FakeSend");
            assert_eq!(destination, "projects/p/topics/t");
            assert_eq!(code, Code::Unavailable);
            assert_eq!(attempts, 3);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(h.metric(names::RETRIES), 2);
    // Later calls report the failure by its summary.
    assert!(matches!(
        h.write(2, "projects/p/topics/t").await,
        Err(Error::Failed(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn attempt_deadline_is_passed_and_enforced() {
    let mut c = config();
    c.retry.initial_rpc_timeout = Duration::from_secs(1);
    c.retry.max_rpc_timeout = Duration::from_secs(1);
    let mut h = Harness::new(c);
    h.fake.push(FakeReply::Delay(
        Duration::from_secs(3600),
        Box::new(FakeReply::Ok),
    ));
    h.write(1, "d").await.expect("write");
    h.writer.flush().await.expect("the retry succeeds");
    let calls = h.fake.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].timeout, Some(Duration::from_secs(1)));
    assert_eq!(
        h.writer
            .metrics()
            .snapshot()
            .send_errors_by_code
            .get(&Code::DeadlineExceeded),
        Some(&1)
    );
}

#[tokio::test(start_paused = true)]
async fn fatal_status_fails_the_writer_with_its_first_error() {
    let mut h = Harness::new(config());
    h.fake.push(FakeReply::code(Code::PermissionDenied));
    h.write(1, "d").await.expect("write");
    assert!(matches!(
        h.writer.flush().await,
        Err(Error::Rpc {
            code: Code::PermissionDenied,
            attempts: 1,
            ..
        })
    ));
    assert!(matches!(h.writer.flush().await, Err(Error::Failed(_))));
}

#[tokio::test(start_paused = true)]
async fn a_write_waiting_at_the_cap_does_not_slip_in_past_a_failure() {
    let mut c = config();
    c.max_in_flight_records = 1;
    c.batch.max_records = 1;
    let mut h = Harness::new(c);
    h.fake.push(FakeReply::code(Code::PermissionDenied));
    h.write(1, "d").await.expect("the first write is admitted");
    // The second write waits for the first record's permit; that permit is released only
    // after the writer is marked failed, so the second record is never sent.
    assert!(h.write(2, "d").await.is_err());
    assert_eq!(h.fake.batches(), vec![vec![1]]);
}

#[tokio::test(start_paused = true)]
async fn delivered_is_final_when_flush_returns() {
    let mut h = Harness::new(config());
    h.fake
        .respond_with(|_| FakeReply::Delay(Duration::from_millis(5), Box::new(FakeReply::Ok)));
    h.write_all(1..=50, "d").await.expect("write");
    h.writer.flush().await.expect("flush");
    assert_eq!(h.writer.delivered(), 50);
    assert_eq!(h.metric(names::RECORDS_ACKED), 50);
}

#[tokio::test(start_paused = true)]
async fn per_record_failures_retry_only_the_failed_entries() {
    let mut h = Harness::new(config());
    h.fake.push(FakeReply::PerRecord(vec![
        Ok(()),
        Err(tonic::Status::unavailable("busy")),
        Ok(()),
    ]));
    h.write_all(1..=3, "d").await.expect("write");
    h.writer.flush().await.expect("flush");
    assert_eq!(h.fake.batches(), vec![vec![1, 2, 3], vec![2]]);
    assert_eq!(h.writer.delivered(), 3);
    assert_eq!(h.metric(names::RECORDS_SENT), 3);
}

#[tokio::test(start_paused = true)]
async fn duplicate_counts_as_delivered_and_deduplicated() {
    let mut h = Harness::new(config());
    h.fake.push(FakeReply::PerRecord(vec![
        Ok(()),
        Err(tonic::Status::already_exists("task exists")),
    ]));
    h.write_all(1..=2, "d").await.expect("write");
    h.writer.flush().await.expect("flush");
    assert_eq!(h.writer.delivered(), 2);
    assert_eq!(h.metric(names::RECORDS_DEDUPLICATED), 1);
    assert_eq!(h.metric(names::RECORDS_ACKED), 2);
}

fn reject_seven(fake: &Fake) {
    fake.respond_with(|call| {
        if call.records.contains(&7) {
            FakeReply::code(Code::InvalidArgument)
        } else {
            FakeReply::Ok
        }
    });
}

#[tokio::test(start_paused = true)]
async fn isolation_finds_the_one_bad_record_in_a_batch_of_ten() {
    let mut c = config();
    c.failure_policy = FailurePolicy::Drop;
    let mut h = Harness::new(c);
    reject_seven(&h.fake);
    h.write_all(1..=10, "d").await.expect("write");
    h.writer.flush().await.expect("flush");
    let batches = h.fake.batches();
    assert_eq!(batches[0], (1..=10).collect::<Vec<_>>());
    // Every record of the refused batch is re-sent alone.
    assert_eq!(
        sorted(batches[1..].iter().map(|b| b[0]).collect()),
        (1..=10).collect::<Vec<_>>()
    );
    assert!(batches[1..].iter().all(|b| b.len() == 1));
    assert_eq!(h.writer.delivered(), 9);
    assert_eq!(h.metric(names::RECORDS_ACKED), 9);
    assert_eq!(h.metric(names::RECORDS_REJECTED), 1);
    assert_eq!(h.metric(names::RECORDS_DROPPED), 1);
}

#[tokio::test(start_paused = true)]
async fn fail_policy_fails_at_the_first_confirmed_rejection() {
    let mut h = Harness::new(config());
    reject_seven(&h.fake);
    h.write_all(1..=10, "projects/p/topics/t")
        .await
        .expect("write");
    match h.writer.flush().await {
        Err(Error::Rejected {
            destination, code, ..
        }) => {
            assert_eq!(destination, "projects/p/topics/t");
            assert_eq!(code, Code::InvalidArgument);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(h.metric(names::RECORDS_REJECTED), 1);
    assert_eq!(h.metric(names::RECORDS_DROPPED), 0);
}

#[tokio::test(start_paused = true)]
async fn breaker_trips_after_n_consecutive_confirmed_rejections() {
    let mut c = config();
    c.failure_policy = FailurePolicy::Drop;
    c.max_consecutive_rejections = Some(3);
    c.batch.max_records = 1;
    let mut h = Harness::new(c);
    h.fake
        .respond_with(|_| FakeReply::code(Code::InvalidArgument));
    let mut result = Ok(());
    for n in 1..=10 {
        result = h.write(n, "d").await;
        if result.is_err() {
            break;
        }
        tokio::task::yield_now().await;
    }
    if result.is_ok() {
        result = h.writer.flush().await;
    }
    match result {
        Err(Error::RejectionBreaker { option, count }) => {
            assert_eq!(option, "max_consecutive_rejections");
            assert_eq!(count, 3);
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn any_success_resets_the_breaker() {
    let mut c = config();
    c.failure_policy = FailurePolicy::Drop;
    c.max_consecutive_rejections = Some(2);
    c.batch.max_records = 1;
    let mut h = Harness::new(c);
    // Odd records are refused, even ones delivered: never two refusals in a row.
    h.fake.respond_with(|call| {
        if call.records[0] % 2 == 1 {
            FakeReply::code(Code::InvalidArgument)
        } else {
            FakeReply::Ok
        }
    });
    for n in 1..=40 {
        h.write(n, "d").await.expect("write");
        h.writer.flush().await.expect("flush");
    }
    assert_eq!(h.metric(names::RECORDS_DROPPED), 20);
    assert_eq!(h.writer.delivered(), 20);
}

#[tokio::test(start_paused = true)]
async fn unbounded_breaker_never_trips() {
    let mut c = config();
    c.failure_policy = FailurePolicy::Drop;
    c.max_consecutive_rejections = None;
    let mut h = Harness::new(c);
    h.fake
        .respond_with(|_| FakeReply::code(Code::InvalidArgument));
    h.write_all(1..=50, "d").await.expect("write");
    h.writer.flush().await.expect("flush");
    assert_eq!(h.metric(names::RECORDS_DROPPED), 50);
}

#[tokio::test(start_paused = true)]
async fn serializer_rejections_never_count_toward_the_breaker() {
    let mut c = config();
    c.failure_policy = FailurePolicy::Drop;
    c.max_consecutive_rejections = Some(1);
    let mut h = Harness::new(c);
    for row in 0..10 {
        h.writer
            .reject_encoded(
                Error::Encode {
                    row,
                    reason: "too big".into(),
                },
                DeadPayload::default,
            )
            .await
            .expect("skipped");
    }
    h.write(1, "d").await.expect("write");
    h.writer.flush().await.expect("flush");
    assert_eq!(h.metric(names::RECORDS_SKIPPED), 10);
    assert_eq!(h.metric(names::RECORDS_REJECTED), 0);
}

#[tokio::test(start_paused = true)]
async fn serializer_rejection_under_fail_policy_is_returned() {
    let mut h = Harness::new(config());
    let err = h
        .writer
        .reject_encoded(
            Error::Encode {
                row: 4,
                reason: "attribute key over 256 bytes".into(),
            },
            DeadPayload::default,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Encode { row: 4, .. }));
    assert_eq!(h.metric(names::RECORDS_SKIPPED), 0);
    assert!(matches!(h.write(1, "d").await, Err(Error::Failed(_))));
}

#[tokio::test(start_paused = true)]
async fn stall_trips_the_watchdog_once_naming_the_option() {
    let mut h = Harness::new(config());
    h.fake.push(FakeReply::Stall);
    h.write(1, "d").await.expect("write");
    let start = Instant::now();
    match h.writer.flush().await {
        Err(Error::ProgressTimeout {
            option,
            waiting_for,
            ..
        }) => {
            assert_eq!(option, "publish_progress_timeout");
            assert!(waiting_for.contains("flush"));
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(start.elapsed(), Duration::from_secs(600));
    assert!(matches!(h.writer.flush().await, Err(Error::Failed(_))));
}

#[tokio::test(start_paused = true)]
async fn slow_but_answering_service_never_trips_the_watchdog() {
    let mut c = config();
    c.progress_timeout = Some(Duration::from_secs(10));
    c.batch.max_records = 1;
    c.max_concurrent_sends = 1;
    let mut h = Harness::new(c);
    h.fake
        .respond_with(|_| FakeReply::Delay(Duration::from_secs(8), Box::new(FakeReply::Ok)));
    h.write_all(1..=20, "d").await.expect("write");
    let start = Instant::now();
    h.writer
        .flush()
        .await
        .expect("a slow service is not a stall");
    assert!(start.elapsed() > Duration::from_secs(100));
    assert_eq!(h.writer.delivered(), 20);
}

fn recovery(create: bool) -> RecoverySettings {
    RecoverySettings {
        backoff: Backoff {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(10),
            multiplier: 2.0,
        },
        max_attempts: 3,
        attempts_option: "recovery_max_attempts",
        create,
    }
}

#[tokio::test(start_paused = true)]
async fn not_found_recovery_creates_then_resends() {
    let mut c = config();
    c.not_found = Some(recovery(true));
    let mut h = Harness::new(c);
    h.fake.set_missing("projects/p/topics/new");
    h.write(1, "projects/p/topics/new").await.expect("write");
    let start = Instant::now();
    h.writer.flush().await.expect("recovered");
    assert_eq!(start.elapsed(), Duration::from_millis(500));
    assert_eq!(
        h.fake.created(),
        vec![Arc::<str>::from("projects/p/topics/new")]
    );
    assert_eq!(h.fake.batches(), vec![vec![1], vec![1]]);
    assert_eq!(h.metric(names::RESOURCES_CREATED), 1);
    assert_eq!(h.writer.delivered(), 1);
}

#[tokio::test(start_paused = true)]
async fn not_found_recovery_exhausts_naming_the_attempts_option() {
    let mut c = config();
    c.not_found = Some(recovery(false));
    let mut h = Harness::new(c);
    h.fake.set_missing("q");
    h.write(1, "q").await.expect("write");
    match h.writer.flush().await {
        Err(Error::RecoveryExhausted {
            destination,
            option,
            attempts,
            ..
        }) => {
            assert_eq!(destination, "q");
            assert_eq!(option, "recovery_max_attempts");
            assert_eq!(attempts, 3);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(h.fake.created().is_empty(), "creation was not asked for");
    assert_eq!(h.fake.calls().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn not_found_without_recovery_is_fatal() {
    let mut h = Harness::new(config());
    h.fake.set_missing("q");
    h.write(1, "q").await.expect("write");
    assert!(matches!(
        h.writer.flush().await,
        Err(Error::Rpc {
            code: Code::NotFound,
            ..
        })
    ));
}

#[tokio::test(start_paused = true)]
async fn sequence_key_failure_is_repaired_before_later_records_of_the_key() {
    let mut c = config();
    c.batch.max_records = 2;
    let mut h = Harness::new(c);
    h.fake.push(FakeReply::code(Code::Unavailable));
    for n in 1..=4 {
        h.writer
            .write(envelope(n, "d", Some("k")))
            .await
            .expect("write");
    }
    // Records 3 and 4 wait while the key's first batch is in flight (and retried).
    h.writer
        .write(envelope(100, "d", None))
        .await
        .expect("unkeyed");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let during = h.fake.batches();
    assert_eq!(
        during,
        vec![vec![1, 2], vec![100]],
        "later records of the key wait for the repair"
    );
    h.writer.flush().await.expect("flush");
    assert_eq!(
        h.fake.batches(),
        vec![vec![1, 2], vec![100], vec![1, 2], vec![3, 4]]
    );
    assert_eq!(h.writer.delivered(), 5);
}

#[tokio::test(start_paused = true)]
async fn eviction_drains_before_release_at_one_active_destination() {
    let mut c = config();
    c.max_active_destinations = 1;
    let mut h = Harness::new(c);
    h.fake
        .respond_with(|_| FakeReply::Delay(Duration::from_secs(2), Box::new(FakeReply::Ok)));
    let start = Instant::now();
    for d in ["a", "b", "c"] {
        h.write_all(1..=3, d).await.expect("write");
    }
    // Each switch waited for the previous destination's batch to resolve (2 s each).
    assert_eq!(start.elapsed(), Duration::from_secs(4));
    let names = |v: Vec<Destination>| v.iter().map(|d| d.to_string()).collect::<Vec<_>>();
    assert_eq!(names(h.fake.opened()), vec!["a", "b", "c"]);
    assert_eq!(names(h.fake.closed()), vec!["a", "b"]);
    assert_eq!(
        h.writer.delivered(),
        6,
        "a and b were drained before release"
    );
    h.writer.flush().await.expect("flush");
    assert_eq!(h.writer.delivered(), 9);
}

#[tokio::test(start_paused = true)]
async fn release_overrun_fails_the_writer_before_opening_the_replacement() {
    let mut c = config();
    c.max_active_destinations = 1;
    let mut h = Harness::new(c);
    h.fake.set_close_delay(Duration::from_secs(60));
    h.write(1, "a").await.expect("write");
    h.writer.flush().await.expect("flush");
    match h.write(2, "b").await {
        Err(Error::ShutdownTimeout {
            option,
            budget,
            clients,
        }) => {
            assert_eq!(option, "shutdown_timeout");
            assert_eq!(budget, Duration::from_secs(30));
            assert_eq!(clients, 1);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(h.fake.opened().len(), 1, "no replacement was opened");
}

#[tokio::test(start_paused = true)]
async fn close_costs_one_budget_for_all_clients_and_overrun_fails() {
    let mut c = config();
    let mut h = Harness::new(c.clone());
    h.fake.set_close_delay(Duration::from_secs(20));
    for d in ["a", "b", "c"] {
        h.write(1, d).await.expect("write");
    }
    h.writer.flush().await.expect("flush");
    let start = Instant::now();
    h.writer
        .close()
        .await
        .expect("three 20 s closes fit one 30 s budget");
    assert_eq!(start.elapsed(), Duration::from_secs(20));
    assert_eq!(h.fake.closed().len(), 3);

    c.shutdown_timeout = Duration::from_secs(10);
    let mut h = Harness::new(c);
    h.fake.set_close_delay(Duration::from_secs(20));
    h.write(1, "a").await.expect("write");
    h.writer.flush().await.expect("flush");
    assert!(matches!(
        h.writer.close().await,
        Err(Error::ShutdownTimeout { clients: 1, .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn idle_destinations_are_released_after_a_flush_and_reopen_transparently() {
    let mut h = Harness::new(config());
    h.write(1, "a").await.expect("write");
    h.writer.flush().await.expect("flush");
    tokio::time::sleep(Duration::from_secs(301)).await;
    h.write(2, "b").await.expect("write");
    h.writer.flush().await.expect("flush");
    let names = |v: Vec<Destination>| v.iter().map(|d| d.to_string()).collect::<Vec<_>>();
    assert_eq!(names(h.fake.closed()), vec!["a"]);
    h.write(3, "a").await.expect("write");
    h.writer.flush().await.expect("flush");
    assert_eq!(names(h.fake.opened()), vec!["a", "b", "a"]);
    assert_eq!(h.writer.delivered(), 3);
}

#[tokio::test(start_paused = true)]
async fn dropped_writer_aborts_sends_and_releases_clients() {
    let mut h = Harness::new(config());
    h.fake.push(FakeReply::Stall);
    h.write_all(1..=10, "a").await.expect("write");
    tokio::task::yield_now().await;
    assert_eq!(h.fake.calls().len(), 1);
    let Harness { fake, writer, set } = h;
    drop(writer);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(fake.closed(), vec![Arc::<str>::from("a")]);
    assert_eq!(
        set.clone_inner()
            .sum_by_name(names::IN_FLIGHT_RECORDS)
            .map(|v| v.as_usize()),
        Some(0)
    );
}

#[tokio::test(start_paused = true)]
async fn open_failure_is_returned_by_write() {
    let mut h = Harness::new(config());
    h.fake.set_open_error("no credentials");
    assert!(matches!(h.write(1, "a").await, Err(Error::Connect { .. })));
}

#[tokio::test(start_paused = true)]
async fn per_destination_counters_only_when_enabled() {
    let mut c = config();
    c.per_destination_metrics = true;
    let mut h = Harness::new(c);
    h.write_all(1..=3, "a").await.expect("write");
    h.write_all(1..=2, "b").await.expect("write");
    h.writer.flush().await.expect("flush");
    assert_eq!(h.metric(names::RECORDS_SENT_BY_DESTINATION), 5);

    let mut h = Harness::new(config());
    h.write(1, "a").await.expect("write");
    h.writer.flush().await.expect("flush");
    assert_eq!(
        h.set
            .clone_inner()
            .sum_by_name(names::RECORDS_SENT_BY_DESTINATION),
        None
    );
}

#[tokio::test(start_paused = true)]
async fn settle_returns_as_the_last_running_send_ends() {
    let mut h = Harness::new(config());
    h.fake
        .respond_with(|_| FakeReply::Delay(Duration::from_millis(3_005), Box::new(FakeReply::Ok)));
    // Ten records: one full batch, sent at once.
    h.write_all(1..=10, "d").await.expect("write");
    let start = Instant::now();
    let unresolved = h.writer.settle().await;
    // Woken by the lease's end itself, not by a poll interval.
    assert_eq!(start.elapsed(), Duration::from_millis(3_005));
    assert_eq!(unresolved, 0);
    assert_eq!(h.writer.delivered(), 10);
}

#[tokio::test(start_paused = true)]
async fn settle_stops_at_the_shutdown_budget_and_counts_what_is_unresolved() {
    let mut h = Harness::new(config());
    h.fake.push(FakeReply::Stall);
    h.write_all(1..=10, "d").await.expect("write");
    let start = Instant::now();
    let unresolved = h.writer.settle().await;
    assert_eq!(start.elapsed(), Duration::from_secs(30));
    assert_eq!(unresolved, 10);
    assert_eq!(h.writer.delivered(), 0);
}

// --- after a failure: nothing new is sent, and the counts add up ------------------------------

#[tokio::test(start_paused = true)]
async fn an_open_batch_is_not_sent_when_its_delay_timer_fires_after_a_failure() {
    let mut c = config();
    c.batch.max_delay = Duration::from_secs(60);
    let mut h = Harness::new(c);
    // Three rows sit in an open batch, below every threshold; its 60 s timer is armed.
    h.write_all(1..=3, "d").await.expect("write");
    // The row after them is one the encoder rejected: under `fail` the writer fails.
    let err = h
        .writer
        .reject_encoded(
            Error::Encode {
                row: 3,
                reason: "too big".into(),
            },
            DeadPayload::default,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Encode { row: 3, .. }));
    // The timer fires (the clock runs past the delay): the batch stays unsent.
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert!(h.fake.calls().is_empty(), "{:?}", h.fake.calls());
    assert_eq!(h.metric(names::RECORDS_SENT), 0);
    // The failed statement waits for nothing and counts the three as not delivered.
    assert_eq!(h.writer.settle().await, 3);
    assert!(h.fake.calls().is_empty());
    assert_eq!(h.writer.delivered(), 0);
    assert_eq!(h.writer.not_delivered(), 3);
}

#[tokio::test(start_paused = true)]
async fn settle_stops_an_open_batch_from_going_out_after_a_failure_outside_the_writer() {
    let mut c = config();
    c.batch.max_delay = Duration::from_secs(60);
    let mut h = Harness::new(c);
    h.write_all(1..=3, "d").await.expect("write");
    // The statement's input failed: the writer itself is healthy, the statement settles it.
    assert_eq!(h.writer.settle().await, 3);
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert!(h.fake.calls().is_empty(), "{:?}", h.fake.calls());
    assert_eq!(h.writer.not_delivered(), 3);
}

#[tokio::test(start_paused = true)]
async fn an_isolation_pass_sends_nothing_after_another_batch_fails_the_writer() {
    let mut h = Harness::new(config());
    // The batch of 1..=10 is refused as a whole at once, so its records are re-sent alone, one
    // after the other, each answered OK after 100 ms; the batch of 11..=20 is answered
    // PERMISSION_DENIED at 150 ms, while the second of those solo sends is on the wire.
    h.fake.respond_with(|call| {
        if call.records.len() > 1 && call.records.contains(&1) {
            FakeReply::code(Code::InvalidArgument)
        } else if call.records.contains(&11) {
            FakeReply::Delay(
                Duration::from_millis(150),
                Box::new(FakeReply::code(Code::PermissionDenied)),
            )
        } else {
            FakeReply::Delay(Duration::from_millis(100), Box::new(FakeReply::Ok))
        }
    });
    h.write_all(1..=20, "d").await.expect("write");
    let err = h.writer.flush().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Rpc {
                code: Code::PermissionDenied,
                ..
            }
        ),
        "{err:?}"
    );
    h.writer.settle().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    // The solo send on the wire at the failure finished; none started after it.
    let solo: Vec<Vec<u32>> = h
        .fake
        .batches()
        .into_iter()
        .filter(|b| b.len() == 1)
        .collect();
    assert_eq!(solo, vec![vec![1], vec![2]]);
    assert_eq!(h.writer.delivered(), 2);
    assert_eq!(h.writer.not_delivered(), 18);
}

#[tokio::test(start_paused = true)]
async fn a_retry_is_not_sent_after_another_batch_fails_the_writer() {
    let mut h = Harness::new(config());
    // The batch of 1..=10 is answered UNAVAILABLE (retried after 100 ms); the batch of 11..=20
    // is answered PERMISSION_DENIED after 50 ms, which fails the writer before that retry.
    h.fake.respond_with(|call| {
        if call.records.contains(&1) {
            FakeReply::code(Code::Unavailable)
        } else {
            FakeReply::Delay(
                Duration::from_millis(50),
                Box::new(FakeReply::code(Code::PermissionDenied)),
            )
        }
    });
    h.write_all(1..=20, "d").await.expect("write");
    let err = h.writer.flush().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Rpc {
                code: Code::PermissionDenied,
                ..
            }
        ),
        "{err:?}"
    );
    h.writer.settle().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    // Each batch went out once: the retry of the first never did.
    assert_eq!(h.fake.calls().len(), 2, "{:?}", h.fake.batches());
    assert_eq!(h.writer.delivered(), 0);
    assert_eq!(h.writer.not_delivered(), 20);
}

#[tokio::test(start_paused = true)]
async fn not_delivered_leaves_out_acknowledged_dropped_and_refused_records() {
    // Under `drop`: 9 acknowledged, 1 dropped, nothing left.
    let mut c = config();
    c.failure_policy = FailurePolicy::Drop;
    let mut h = Harness::new(c);
    reject_seven(&h.fake);
    h.write_all(1..=10, "d").await.expect("write");
    h.writer.flush().await.expect("flush");
    assert_eq!(h.writer.delivered(), 9);
    assert_eq!(h.writer.not_delivered(), 0);

    // Under `fail`: 9 acknowledged, 1 refused (the failure itself), nothing left.
    let mut h = Harness::new(config());
    reject_seven(&h.fake);
    h.write_all(1..=10, "d").await.expect("write");
    assert!(matches!(
        h.writer.flush().await,
        Err(Error::Rejected { .. })
    ));
    h.writer.settle().await;
    assert_eq!(h.writer.delivered(), 9);
    assert_eq!(h.writer.not_delivered(), 0);

    // A stalled send: the ten records are neither acknowledged nor refused.
    let mut h = Harness::new(config());
    h.fake.push(FakeReply::Stall);
    h.write_all(1..=10, "d").await.expect("write");
    assert_eq!(h.writer.settle().await, 10);
    assert_eq!(h.writer.not_delivered(), 10);
}

#[cfg(feature = "cli")]
#[tokio::test(start_paused = true)]
async fn a_writer_dropped_mid_statement_logs_its_counts_at_warn() {
    let (captured, _guard) = crate::testing::logs::capture_warnings();
    let mut h = Harness::new(config());
    // One batch of ten acknowledged, then a batch of ten that stalls.
    h.write_all(1..=10, "d").await.expect("write");
    h.writer.flush().await.expect("flush");
    h.fake.push(FakeReply::Stall);
    h.write_all(11..=20, "d").await.expect("write");
    tokio::task::yield_now().await;
    // The statement's future is dropped (cancelled): no error can carry the counts.
    drop(h.writer);
    let log = captured.text();
    assert!(log.contains("WARN"), "{log}");
    assert!(
        log.contains("10 row(s) were acknowledged; 10 admitted row(s) were not delivered"),
        "{log}"
    );
    assert!(log.contains("acknowledged=10"), "{log}");
    assert!(log.contains("not_delivered=10"), "{log}");
}

/// Many batches meet one missing destination that the sink is asked to create: it is created
/// once, and the re-sends that follow the creation are neither retries nor warnings.
#[cfg(feature = "cli")]
#[tokio::test(start_paused = true)]
async fn the_resend_after_an_asked_for_creation_is_not_a_retry() {
    let (captured, _guard) = crate::testing::logs::capture_warnings();
    let mut c = config();
    c.not_found = Some(recovery(true));
    let mut h = Harness::new(c);
    h.fake.set_missing("projects/p/topics/new");
    // Five batches of ten, all sent before the first answer comes back.
    h.write_all(1..=50, "projects/p/topics/new")
        .await
        .expect("write");
    h.writer.flush().await.expect("recovered");
    assert_eq!(h.writer.delivered(), 50);
    assert_eq!(h.metric(names::RESOURCES_CREATED), 1);
    assert!(h.metric(names::SEND_ERRORS) >= 10, "a batch met NOT_FOUND");
    assert_eq!(h.metric(names::RETRIES), 0);
    let log = captured.text();
    assert!(!log.contains("retrying a send"), "{log}");
    assert!(!log.contains("WARN"), "{log}");
}

/// A destination still missing after its creation is retried like any other failure: counted
/// and logged.
#[tokio::test(start_paused = true)]
async fn a_destination_still_missing_after_its_creation_is_a_retry() {
    let mut c = config();
    c.not_found = Some(recovery(true));
    let mut h = Harness::new(c);
    h.fake
        .set_missing("projects/p/topics/new")
        .set_create_restores(false);
    h.write(1, "projects/p/topics/new").await.expect("write");
    match h.writer.flush().await {
        Err(Error::RecoveryExhausted { attempts, .. }) => assert_eq!(attempts, 3),
        other => panic!("unexpected {other:?}"),
    }
    // Three sends: the first, the one after the creation (not a retry), one retry.
    assert_eq!(h.fake.batches(), vec![vec![1], vec![1], vec![1]]);
    assert_eq!(h.fake.created().len(), 1);
    assert_eq!(h.metric(names::RETRIES), 1);
}

/// Writes `records` records in runs of `run` through `write_many`, each record its own RPC
/// answered at once, and returns when each RPC started.
async fn send_starts_under_rate(config: FlowConfig, records: u32, run: u32) -> Vec<Instant> {
    let mut h = Harness::new(config);
    let starts: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let seen = starts.clone();
    h.fake.respond_with(move |_| {
        seen.lock().expect("starts").push(Instant::now());
        FakeReply::Ok
    });
    let mut n = 0;
    while n < records {
        let mut envelopes: Vec<_> = (n..(n + run).min(records))
            .map(|i| envelope(i, "d", None))
            .collect();
        n += envelopes.len() as u32;
        h.writer.write_many(&mut envelopes).await.expect("write");
    }
    h.writer.flush().await.expect("flush");
    assert_eq!(h.writer.delivered(), u64::from(records));
    h.writer.close().await.expect("close");
    let starts = starts.lock().expect("starts").clone();
    assert_eq!(starts.len(), records as usize, "one RPC per record");
    starts
}

fn one_record_batches(rate: Option<f64>) -> FlowConfig {
    FlowConfig {
        max_in_flight_records: 1_000,
        max_records_per_second: rate,
        batch: BatchThresholds {
            max_records: 1,
            max_bytes: u64::MAX,
            max_delay: Duration::ZERO,
        },
        ..config()
    }
}

#[tokio::test(start_paused = true)]
async fn a_rate_limit_holds_the_measured_send_rate() {
    for (rate, records) in [(200.0, 1_001), (7.5, 76), (2_000.0, 4_001)] {
        let starts = send_starts_under_rate(one_record_batches(Some(rate)), records, 256).await;
        let span = starts
            .last()
            .unwrap()
            .duration_since(starts[0])
            .as_secs_f64();
        // The first record goes at once, each later one a token later.
        let measured = f64::from(records - 1) / span;
        assert!(
            (measured - rate).abs() <= rate * 0.10,
            "rate {rate}/s measured {measured:.2}/s over {span:.3} s"
        );
        // And no one-second window holds more than the rate plus the burst window's tokens.
        let burst = (rate * crate::core::rate::BURST_WINDOW.as_secs_f64()).max(1.0);
        let most = starts
            .iter()
            .map(|s| {
                starts
                    .iter()
                    .filter(|t| *t >= s && t.duration_since(*s) < Duration::from_secs(1))
                    .count()
            })
            .max()
            .unwrap_or(0);
        assert!(
            most as f64 <= rate + burst,
            "rate {rate}/s: {most} sends in one second"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn without_a_rate_limit_nothing_waits() {
    let start = Instant::now();
    let starts = send_starts_under_rate(one_record_batches(None), 500, 100).await;
    assert_eq!(starts.last().unwrap().duration_since(start), Duration::ZERO);
}

/// The rate of the sends that started in `[from, to)` seconds after `origin`: sends minus one
/// over the time between the first and the last of them.
fn rate_between(starts: &[Instant], origin: Instant, from: f64, to: f64) -> f64 {
    let inside: Vec<f64> = starts
        .iter()
        .map(|s| s.duration_since(origin).as_secs_f64())
        .filter(|t| *t >= from && *t < to)
        .collect();
    assert!(
        inside.len() > 2,
        "too few sends in [{from}, {to}): {inside:?} of {:?}",
        starts
            .iter()
            .map(|s| s.duration_since(origin).as_secs_f64())
            .collect::<Vec<_>>()
    );
    (inside.len() - 1) as f64 / (inside.last().unwrap() - inside[0])
}

/// One record in flight at a time, each send answered after 10 ms (so 100 records/s without a
/// limit), `hint(n)` deciding whether record `n`'s answer carries a load hint.
async fn starts_under_hints(
    records: u32,
    configured: Option<f64>,
    hint: impl Fn(u32) -> Option<crate::core::LoadHint> + Send + Sync + 'static,
) -> (Instant, Vec<Instant>) {
    let origin = Instant::now();
    let config = FlowConfig {
        max_in_flight_records: 1,
        max_concurrent_sends: 1,
        ..one_record_batches(configured)
    };
    let mut h = Harness::new(config);
    let starts: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let seen = starts.clone();
    h.fake.respond_with(move |call| {
        seen.lock().expect("starts").push(Instant::now());
        let answer = FakeReply::Delay(Duration::from_millis(10), Box::new(FakeReply::Ok));
        match hint(call.records[0]) {
            Some(hint) => FakeReply::WithHint(hint, Box::new(answer)),
            None => answer,
        }
    });
    let mut envelopes: Vec<_> = (0..records).map(|i| envelope(i, "d", None)).collect();
    h.writer.write_many(&mut envelopes).await.expect("write");
    h.writer.flush().await.expect("flush");
    assert_eq!(h.writer.delivered(), u64::from(records));
    h.writer.close().await.expect("close");
    let starts = starts.lock().expect("starts").clone();
    (origin, starts)
}

#[tokio::test(start_paused = true)]
async fn a_load_hint_slows_admission_for_its_period_then_lapses() {
    let half = crate::core::LoadHint {
        factor: 0.5,
        period: Duration::from_secs(1),
    };
    // Record 200 starts at 2.0 s; its answer (at 2.01 s) asks for half the load for a second.
    let (origin, starts) = starts_under_hints(600, None, move |n| (n == 200).then_some(half)).await;
    let before = rate_between(&starts, origin, 0.5, 1.9);
    let slowed = rate_between(&starts, origin, 2.1, 2.9);
    let after = rate_between(&starts, origin, 3.2, 4.0);
    assert!(
        (before - 100.0).abs() <= 10.0,
        "before the hint: {before:.1}/s"
    );
    assert!(
        (slowed - 50.0).abs() <= 5.0,
        "under the hint: {slowed:.1}/s"
    );
    assert!(
        (after - 100.0).abs() <= 10.0,
        "after it lapsed: {after:.1}/s"
    );
}

#[tokio::test(start_paused = true)]
async fn repeated_load_hints_compound_once_per_period_and_respect_the_configured_rate() {
    let half = crate::core::LoadHint {
        factor: 0.5,
        period: Duration::from_secs(1),
    };
    // Every answer asks for half the load: 100/s becomes 50/s at once, 25/s a period later;
    // the hints within a period only keep the limit in force.
    let (origin, starts) = starts_under_hints(100, None, move |_| Some(half)).await;
    let first = rate_between(&starts, origin, 0.1, 0.95);
    let second = rate_between(&starts, origin, 1.1, 1.95);
    assert!((first - 50.0).abs() <= 5.0, "first period: {first:.1}/s");
    assert!((second - 25.0).abs() <= 2.5, "second period: {second:.1}/s");

    // A hint above 1 does not lift a configured rate, nor does one arriving unlimited.
    let more = crate::core::LoadHint {
        factor: 3.0,
        period: Duration::from_millis(100),
    };
    let (origin, starts) = starts_under_hints(100, Some(40.0), move |_| Some(more)).await;
    let capped = rate_between(&starts, origin, 0.2, 2.0);
    assert!(
        (capped - 40.0).abs() <= 4.0,
        "configured cap: {capped:.1}/s"
    );
}

#[tokio::test(start_paused = true)]
async fn a_load_hint_never_stops_a_writer() {
    let stop = crate::core::LoadHint {
        factor: 1e-9,
        period: Duration::from_secs(60),
    };
    let (origin, starts) = starts_under_hints(30, None, move |n| (n == 5).then_some(stop)).await;
    // Slowed to the floor of one record per second, not to nothing.
    let slowed = rate_between(&starts, origin, 1.0, 30.0);
    assert!(
        (slowed - crate::core::rate::MIN_SERVER_RATE).abs() <= 0.1,
        "{slowed:.2}/s"
    );
}

// --- the dead-letter policy ---------------------------------------------------------------------

/// A dead-letter sink that keeps what it is given; `fail_write_after` writes succeed, then
/// every write fails; `fail_finish` makes the end fail.
#[derive(Default)]
struct MemoryDeadLetters {
    rows: std::sync::Mutex<Vec<DeadRow>>,
    fail_write_after: Option<usize>,
    fail_finish: bool,
    finished: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl crate::core::DeadLetterSink for MemoryDeadLetters {
    fn describe(&self) -> String {
        "memory".into()
    }

    async fn write(&self, row: DeadRow) -> Result<()> {
        let mut rows = lock(&self.rows);
        if self.fail_write_after.is_some_and(|n| rows.len() >= n) {
            return Err(Error::DeadLetter {
                target: "memory".into(),
                message: "full".into(),
            });
        }
        rows.push(row);
        Ok(())
    }

    async fn finish(&self) -> Result<()> {
        self.finished.fetch_add(1, Ordering::Relaxed);
        if self.fail_finish {
            return Err(Error::DeadLetter {
                target: "memory".into(),
                message: "cannot complete".into(),
            });
        }
        Ok(())
    }
}

fn dead_letter_harness(config: FlowConfig, sink: Arc<MemoryDeadLetters>) -> Harness {
    let fake = Arc::new(Fake::new());
    let set = ExecutionPlanMetricsSet::new();
    let describe: crate::core::dead_letter::DescribeRecord<u32> = Arc::new(|n: &u32| DeadPayload {
        payload: Some(n.to_string().into_bytes()),
        row: None,
    });
    let writer = FlowWriter::with_dead_letters(
        fake.clone(),
        config,
        SinkMetrics::new(&set),
        Some(DeadLetters { sink, describe }),
    );
    Harness { fake, writer, set }
}

fn dead_letter_config() -> FlowConfig {
    let mut c = config();
    c.failure_policy = FailurePolicy::DeadLetter;
    c
}

#[tokio::test(start_paused = true)]
async fn a_confirmed_rejection_is_written_to_the_dead_letters_with_its_status() {
    let sink = Arc::new(MemoryDeadLetters::default());
    let mut h = dead_letter_harness(dead_letter_config(), sink.clone());
    reject_seven(&h.fake);
    h.write_all(1..=10, "d").await.expect("write");
    h.writer.flush().await.expect("flush");
    h.writer.finish_dead_letters().await.expect("finish");
    let rows = lock(&sink.rows).clone();
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!(row.destination, "d");
    assert_eq!(row.class, DeadClass::Rejected);
    assert_eq!(row.code, Some("INVALID_ARGUMENT"));
    assert_eq!(row.attempts, 1);
    assert_eq!(row.data.payload.as_deref(), Some(&b"7"[..]));
    assert_eq!(h.writer.delivered(), 9);
    assert_eq!(h.writer.dead_lettered(), 1);
    assert_eq!(h.writer.not_delivered(), 0);
    assert_eq!(h.metric(names::RECORDS_REJECTED), 1);
    assert_eq!(h.metric(names::RECORDS_DEAD_LETTERED), 1);
    assert_eq!(h.metric(names::RECORDS_DROPPED), 0);
    assert_eq!(sink.finished.load(Ordering::Relaxed), 1);
}

#[tokio::test(start_paused = true)]
async fn an_encoding_rejection_is_written_with_the_row_it_renders() {
    let sink = Arc::new(MemoryDeadLetters::default());
    let mut h = dead_letter_harness(dead_letter_config(), sink.clone());
    let mut row = serde_json::Map::new();
    row.insert("id".into(), serde_json::Value::from(4));
    h.writer
        .reject_encoded(
            Error::Encode {
                row: 4,
                reason: "too big".into(),
            },
            || DeadPayload {
                payload: None,
                row: Some(row.clone()),
            },
        )
        .await
        .expect("dead-lettered");
    let rows = lock(&sink.rows).clone();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].class, DeadClass::Encoding);
    assert_eq!(rows[0].code, None);
    assert_eq!(rows[0].attempts, 0);
    assert!(rows[0].message.contains("too big"), "{}", rows[0].message);
    assert_eq!(rows[0].data.row.as_ref(), Some(&row));
    assert_eq!(h.metric(names::RECORDS_DEAD_LETTERED), 1);
    assert_eq!(h.metric(names::RECORDS_SKIPPED), 0);
    assert_eq!(h.writer.dead_lettered(), 1);
}

#[tokio::test(start_paused = true)]
async fn dead_lettered_rejections_feed_the_same_breaker_as_drop() {
    let sink = Arc::new(MemoryDeadLetters::default());
    let mut c = dead_letter_config();
    c.max_consecutive_rejections = Some(3);
    c.batch.max_records = 1;
    let mut h = dead_letter_harness(c, sink.clone());
    h.fake
        .respond_with(|_| FakeReply::code(Code::InvalidArgument));
    let mut result = Ok(());
    for n in 1..=10 {
        result = h.write(n, "d").await;
        if result.is_err() {
            break;
        }
        tokio::task::yield_now().await;
    }
    if result.is_ok() {
        result = h.writer.flush().await;
    }
    assert!(
        matches!(result, Err(Error::RejectionBreaker { count: 3, .. })),
        "{result:?}"
    );
    // The rows that tripped it are in the dead letters all the same.
    assert_eq!(lock(&sink.rows).len(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_dead_letter_write_that_fails_fails_the_writer_and_the_row_counts_as_not_delivered() {
    let sink = Arc::new(MemoryDeadLetters {
        fail_write_after: Some(1),
        ..Default::default()
    });
    let mut c = dead_letter_config();
    c.batch.max_records = 1;
    let mut h = dead_letter_harness(c, sink.clone());
    // Records 3 and 6 are refused: the first goes to the dead letters, the second cannot.
    h.fake.respond_with(|call| {
        if call.records[0] % 3 == 0 {
            FakeReply::code(Code::InvalidArgument)
        } else {
            FakeReply::Ok
        }
    });
    let mut result = Ok(());
    for n in 1..=6 {
        result = h.write(n, "d").await;
        if result.is_err() {
            break;
        }
        h.writer.flush().await.ok();
    }
    if result.is_ok() {
        result = h.writer.flush().await;
    }
    assert!(
        matches!(&result, Err(Error::DeadLetter { message, .. }) | Err(Error::Failed(message)) if message.contains("full")),
        "{result:?}"
    );
    h.writer.settle().await;
    assert_eq!(h.writer.delivered(), 4);
    assert_eq!(h.writer.dead_lettered(), 1);
    assert_eq!(h.writer.not_delivered(), 1);
    assert_eq!(h.metric(names::RECORDS_DEAD_LETTERED), 1);
}

#[tokio::test(start_paused = true)]
async fn a_dead_letter_sink_that_cannot_finish_reports_its_rows_as_not_delivered() {
    let sink = Arc::new(MemoryDeadLetters {
        fail_finish: true,
        ..Default::default()
    });
    let mut h = dead_letter_harness(dead_letter_config(), sink);
    reject_seven(&h.fake);
    h.write_all(1..=10, "d").await.expect("write");
    h.writer
        .reject_encoded(
            Error::Encode {
                row: 10,
                reason: "bad".into(),
            },
            DeadPayload::default,
        )
        .await
        .expect("dead-lettered");
    h.writer.flush().await.expect("flush");
    assert_eq!(h.writer.dead_lettered(), 2);
    let error = h.writer.finish_dead_letters().await.unwrap_err();
    assert!(error.to_string().contains("cannot complete"), "{error}");
    // Both rows it held are gone from the dead letters: the refused record and the row the
    // encoder rejected are reported as not delivered.
    assert_eq!(h.writer.dead_lettered(), 0);
    assert_eq!(h.writer.not_delivered(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_dead_letter_policy_without_a_sink_fails_at_the_first_dead_row() {
    let mut h = Harness::new(dead_letter_config());
    let error = h
        .writer
        .reject_encoded(
            Error::Encode {
                row: 0,
                reason: "bad".into(),
            },
            DeadPayload::default,
        )
        .await
        .unwrap_err();
    assert!(error.to_string().contains("dead_letter_topic"), "{error}");
    // Neither delivered nor dead-lettered: reported.
    assert_eq!(h.writer.not_delivered(), 1);
    assert_eq!(h.writer.dead_lettered(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_writer_still_finishes_its_dead_letters() {
    let sink = Arc::new(MemoryDeadLetters::default());
    let mut h = dead_letter_harness(dead_letter_config(), sink.clone());
    h.writer
        .reject_encoded(
            Error::Encode {
                row: 0,
                reason: "bad".into(),
            },
            DeadPayload::default,
        )
        .await
        .expect("dead-lettered");
    drop(h.writer);
    tokio::task::yield_now().await;
    assert_eq!(sink.finished.load(Ordering::Relaxed), 1);
    assert_eq!(lock(&sink.rows).len(), 1);
}

#[test]
fn a_statements_caps_are_split_among_its_writers() {
    let mut c = config();
    c.max_in_flight_records = 1000;
    c.max_in_flight_bytes = 64 << 20;
    c.max_concurrent_sends = 1000;
    c.max_records_per_second = Some(100.0);
    let share = c.share_of(3);
    assert_eq!(share.max_in_flight_records, 334);
    assert_eq!(share.max_in_flight_bytes, (64u64 << 20).div_ceil(3));
    assert_eq!(share.max_concurrent_sends, 334);
    let rate = share.max_records_per_second.expect("a rate");
    assert!((rate * 3.0 - 100.0).abs() < 1e-9, "{rate}");
    // Per-writer settings stay as they are.
    assert_eq!(share.batch, c.batch);
    assert_eq!(share.retry, c.retry);
    assert_eq!(share.max_active_destinations, c.max_active_destinations);
    // One writer (or none known) keeps the whole; a share is never 0; count-only stays so.
    assert_eq!(c.share_of(1), c);
    assert_eq!(c.share_of(0), c);
    c.max_in_flight_records = 2;
    c.max_in_flight_bytes = u64::MAX;
    c.max_records_per_second = None;
    let share = c.share_of(8);
    assert_eq!(share.max_in_flight_records, 1);
    assert_eq!(share.max_in_flight_bytes, u64::MAX);
    assert_eq!(share.max_records_per_second, None);
}
