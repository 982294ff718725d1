//! The settler of one input partition: sends the verdicts its tickets ask for
//! ([`super::ticket::Verdict`]) and extends the leases of what the partition holds, through
//! the small port an input implements ([`Acknowledger`]: acknowledge these ids, nack these
//! ids, extend these leases).
//!
//! After the first verdict of a round the settler gathers what else the tickets ask for during
//! [`SettlerConfig::gather`] (or until a call is full), as Google's subscribers do: fewer,
//! fuller calls, for at most that much delay of an acknowledgement. Every call carries at most
//! [`SettlerConfig::max_ids_per_call`] ids. Every [`SettlerConfig::lease_every`] the leases of
//! what the partition holds are extended, except those held for [`SettlerConfig::max_lease`]
//! or longer, which are let go (the service delivers them again).
//!
//! Each call is retried through [`crate::core::retry::retry`] under
//! [`SettlerConfig::retry`], for the statuses [`Acknowledger::retryable`] names; a call that
//! still fails is logged and left: an acknowledgement that did not take means the service
//! delivers the message again (a duplicate, never a loss).
//!
//! An input whose service answers an acknowledgement id by id (Pub/Sub's exactly-once delivery:
//! [`Acknowledger::confirms`], [`Acknowledger::per_id`]) has the ids of a failed call split:
//! the transient ones sent again, alone, the refused ones counted
//! ([`super::DeliveryCounts::messages_ack_refused`]), the rest taken (and confirmed).
//!
//! The settler ends once every ticket and the partition's stream are gone (its queue closes),
//! after sending what was asked for.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;

use super::lease::Outstanding;
use super::ticket::Verdict;
use super::{DeliveryCounters, DeliveryId};
use crate::core::retry::{RetrySettings, retry};

/// What an input supplies to its settler: one call each, for at most
/// [`SettlerConfig::max_ids_per_call`] ids.
#[async_trait]
pub trait Acknowledger<I: DeliveryId>: Send + Sync + 'static {
    /// Acknowledges `ids`: the service forgets them.
    async fn ack(&self, ids: &[I]) -> Result<(), tonic::Status>;

    /// Hands `ids` back: the service delivers them to a reader again.
    async fn nack(&self, ids: &[I]) -> Result<(), tonic::Status>;

    /// Extends the lease of `ids` (by the input's own deadline).
    async fn extend(&self, ids: &[I]) -> Result<(), tonic::Status>;

    /// Whether a failed call is worth another attempt.
    fn retryable(&self, status: &tonic::Status) -> bool;

    /// Whether the service confirms each acknowledgement id by id (Pub/Sub's exactly-once
    /// delivery): an acknowledgement call that succeeds then confirms every id it carried, and
    /// one that fails may say which ids failed and how ([`per_id`](Self::per_id)). False by
    /// default.
    fn confirms(&self) -> bool {
        false
    }

    /// What a failed call of `ids` says id by id, when the service says it (exactly-once
    /// delivery): the ids to send again and the ids refused for good; every other id of the
    /// call was taken. `None` (the default): the call failed as a whole.
    fn per_id(&self, _status: &tonic::Status, _ids: &[I]) -> Option<PerId<I>> {
        None
    }

    /// The input, for logs (`subscription projects/p/subscriptions/s`).
    fn describe(&self) -> String;
}

/// What a failed call said of its ids, one by one ([`Acknowledger::per_id`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerId<I> {
    /// Ids that failed for now (`TRANSIENT_FAILURE_*`): sent again.
    pub transient: Vec<I>,
    /// Ids refused for good (`PERMANENT_FAILURE_*`, e.g. an ack id whose lease lapsed).
    pub refused: Vec<I>,
}

/// What one acknowledgement, nack or lease extension of a list of ids came to.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Tally<I> {
    /// Ids the service took.
    taken: usize,
    /// Of those, the ones it confirmed id by id.
    confirmed: usize,
    /// Ids it refused for good, id by id.
    refused: Vec<I>,
    /// Ids whose call failed (as a whole, or still transient after the last attempt).
    failed: usize,
}

/// How a settler gathers, chunks, retries and leases.
#[derive(Debug, Clone)]
pub struct SettlerConfig {
    /// How long a round gathers verdicts after its first one.
    pub gather: Duration,
    /// Most ids in one call (a full round is sent at once).
    pub max_ids_per_call: usize,
    /// How often the leases of held ids are extended.
    pub lease_every: Duration,
    /// How long an id may be held before its lease is let go.
    pub max_lease: Duration,
    /// The retry of each call.
    pub retry: RetrySettings,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Ack,
    Nack,
    Extend,
}

impl Call {
    fn name(self) -> &'static str {
        match self {
            Call::Ack => "the acknowledgement",
            Call::Nack => "the nack",
            Call::Extend => "the lease extension",
        }
    }
}

/// Sends `ids` as `call`, one call per [`SettlerConfig::max_ids_per_call`] ids, each retried;
/// says how many ids were taken, confirmed, refused and not taken.
///
/// A call that fails with what the service says id by id ([`Acknowledger::per_id`]) counts
/// the ids it did not name as taken, the refused ones as refused, and sends the transient ones
/// again, up to [`RetrySettings::max_attempts`] rounds with the retry's growing delay, as
/// Google's subscribers do for exactly-once delivery.
async fn send<I: DeliveryId, A: Acknowledger<I> + ?Sized>(
    port: &A,
    config: &SettlerConfig,
    call: Call,
    ids: &[I],
) -> Tally<I> {
    let mut tally = Tally {
        taken: 0,
        confirmed: 0,
        refused: Vec::new(),
        failed: 0,
    };
    let confirms = port.confirms();
    for chunk in ids.chunks(config.max_ids_per_call.max(1)) {
        let mut pending: Vec<I> = chunk.to_vec();
        let mut rounds = 0u32;
        let mut delay = config.retry.initial_retry_delay;
        loop {
            rounds += 1;
            let attempt: &[I] = &pending;
            let (result, attempts) = retry(
                &config.retry,
                |status: &tonic::Status| port.retryable(status),
                |_deadline| async move {
                    match call {
                        Call::Ack => port.ack(attempt).await,
                        Call::Nack => port.nack(attempt).await,
                        Call::Extend => port.extend(attempt).await,
                    }
                },
            )
            .await;
            let status = match result {
                Ok(()) => {
                    tally.taken += pending.len();
                    if confirms {
                        tally.confirmed += pending.len();
                    }
                    break;
                }
                Err(status) => status,
            };
            let Some(split) = port.per_id(&status, &pending) else {
                tracing::warn!(
                    input = %port.describe(),
                    messages = pending.len(),
                    code = ?status.code(),
                    attempts,
                    "{} of {} message(s) of {} failed: {} (the service will deliver them again)",
                    call.name(),
                    pending.len(),
                    port.describe(),
                    status.message()
                );
                tally.failed += pending.len();
                break;
            };
            let named = split.transient.len() + split.refused.len();
            let taken = pending.len().saturating_sub(named);
            tally.taken += taken;
            if confirms {
                tally.confirmed += taken;
            }
            if !split.refused.is_empty() {
                tracing::warn!(
                    input = %port.describe(),
                    messages = split.refused.len(),
                    "{} of {} message(s) of {} was refused for good: their ack ids are no longer \
                     valid (the lease lapsed); the service delivers them again",
                    call.name(),
                    split.refused.len(),
                    port.describe()
                );
                tally.refused.extend(split.refused);
            }
            pending = split.transient;
            if pending.is_empty() {
                break;
            }
            if config.retry.max_attempts > 0 && rounds >= config.retry.max_attempts {
                tracing::warn!(
                    input = %port.describe(),
                    messages = pending.len(),
                    "{} of {} message(s) of {} still failed for now after {rounds} round(s); \
                     left (the service will deliver them again)",
                    call.name(),
                    pending.len(),
                    port.describe()
                );
                tally.failed += pending.len();
                break;
            }
            tokio::time::sleep(delay).await;
            delay = delay.mul_f64(config.retry.retry_delay_multiplier.max(1.0));
        }
    }
    tally
}

/// Runs the settler of one partition until its queue closes: sends what the tickets ask for,
/// and extends the leases of what `outstanding` holds every [`SettlerConfig::lease_every`], up
/// to [`SettlerConfig::max_lease`].
pub async fn run_settler<I: DeliveryId>(
    port: Arc<dyn Acknowledger<I>>,
    config: SettlerConfig,
    mut queue: mpsc::UnboundedReceiver<Verdict<I>>,
    outstanding: Arc<Outstanding<I>>,
    counters: Arc<DeliveryCounters>,
) {
    let every = config.lease_every.max(Duration::from_millis(1));
    let mut leases = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    leases.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            verdict = queue.recv() => {
                let Some(first) = verdict else { break };
                // A settled id leaves flow control when its verdict arrives, not once the call
                // is sent: as in Google's subscribers, where a message stops counting against
                // the outstanding bounds when it is acknowledged, and the acknowledgement is
                // sent with the next gathered call. (Freed only after the call, a stream with
                // 1,000 outstanding messages and a 100 ms gather read at most ~10,000 a
                // second, whatever its CPU: docs/benchmarks.md.)
                let (acks, nacks, holds, closed) =
                    gather(first, &mut queue, &config, |ids| outstanding.remove(ids)).await;
                if !holds.is_empty() {
                    outstanding.park(&holds);
                    counters.held.store(outstanding.parked(), std::sync::atomic::Ordering::Relaxed);
                }
                if !acks.is_empty() {
                    let tally = send(port.as_ref(), &config, Call::Ack, &acks).await;
                    DeliveryCounters::add(&counters.acked, tally.taken as u64);
                    DeliveryCounters::add(&counters.ack_confirmed, tally.confirmed as u64);
                    DeliveryCounters::add(&counters.ack_refused, tally.refused.len() as u64);
                }
                if !nacks.is_empty() {
                    let tally = send(port.as_ref(), &config, Call::Nack, &nacks).await;
                    DeliveryCounters::add(&counters.nacked, tally.taken as u64);
                }
                counters.held.store(outstanding.parked(), std::sync::atomic::Ordering::Relaxed);
                if closed {
                    break;
                }
            }
            _ = leases.tick() => {
                let (extend, expired) = outstanding.due(config.max_lease);
                if !expired.is_empty() {
                    DeliveryCounters::add(&counters.lease_expired, expired.len() as u64);
                    tracing::warn!(
                        input = %port.describe(),
                        messages = expired.len(),
                        "{} message(s) were held for max_lease_duration ({:?}) without being delivered; their lease lapses and the service delivers them again",
                        expired.len(),
                        config.max_lease
                    );
                }
                if !extend.is_empty() {
                    let tally = send(port.as_ref(), &config, Call::Extend, &extend).await;
                    DeliveryCounters::add(&counters.lease_extensions, tally.taken as u64);
                    // A lease the service refused for good is gone (the message is delivered
                    // again): it is not extended again, and no longer counts as held.
                    if !tally.refused.is_empty() {
                        outstanding.remove(&tally.refused);
                    }
                }
            }
        }
    }
}

/// What one round gathered: ids to acknowledge, to nack and to park, and whether the queue
/// closed.
type Round<I> = (Vec<I>, Vec<I>, Vec<I>, bool);

/// One round of verdicts, from `first` on: what the tickets ask for during
/// [`SettlerConfig::gather`], or until [`SettlerConfig::max_ids_per_call`] ids are gathered, or
/// until the queue closes. `settled` is told of each acknowledged or nacked id as it arrives.
async fn gather<I: DeliveryId>(
    first: Verdict<I>,
    queue: &mut mpsc::UnboundedReceiver<Verdict<I>>,
    config: &SettlerConfig,
    settled: impl Fn(&[I]),
) -> Round<I> {
    let (mut acks, mut nacks, mut holds) = (Vec::new(), Vec::new(), Vec::new());
    let deadline = tokio::time::sleep(config.gather);
    tokio::pin!(deadline);
    let mut next = Some(first);
    loop {
        match next.take() {
            Some(Verdict::Ack(ids)) => {
                settled(&ids);
                acks.extend(ids);
            }
            Some(Verdict::Nack(ids)) => {
                settled(&ids);
                nacks.extend(ids);
            }
            Some(Verdict::Hold(ids)) => holds.extend(ids),
            None => {}
        }
        if acks.len() + nacks.len() >= config.max_ids_per_call {
            return (acks, nacks, holds, false);
        }
        tokio::select! {
            verdict = queue.recv() => match verdict {
                Some(verdict) => next = Some(verdict),
                None => return (acks, nacks, holds, true),
            },
            () = &mut deadline => return (acks, nacks, holds, false),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::time::Instant;

    use super::*;

    const GATHER: Duration = Duration::from_millis(100);

    fn config(max_ids_per_call: usize) -> SettlerConfig {
        SettlerConfig {
            gather: GATHER,
            max_ids_per_call,
            lease_every: Duration::from_secs(20),
            max_lease: Duration::from_secs(60),
            retry: RetrySettings::doubling(3, Duration::from_millis(100), Duration::ZERO),
        }
    }

    fn ack(ids: &[&str]) -> Verdict<String> {
        Verdict::Ack(ids.iter().map(|s| s.to_string()).collect())
    }

    /// A fake service: records every call with the (paused) time it was made, and fails the
    /// first `fail_first` calls with `UNAVAILABLE`.
    #[derive(Default)]
    struct Fake {
        calls: Mutex<Vec<(Call, Vec<String>, Duration)>>,
        fail_first: Mutex<usize>,
        started: Mutex<Option<Instant>>,
    }

    impl Fake {
        fn record(&self, call: Call, ids: &[String]) -> Result<(), tonic::Status> {
            let started = *self
                .started
                .lock()
                .unwrap()
                .get_or_insert_with(Instant::now);
            self.calls
                .lock()
                .unwrap()
                .push((call, ids.to_vec(), started.elapsed()));
            let mut fail = self.fail_first.lock().unwrap();
            if *fail > 0 {
                *fail -= 1;
                return Err(tonic::Status::unavailable("try again"));
            }
            Ok(())
        }

        fn calls(&self) -> Vec<(Call, Vec<String>, Duration)> {
            self.calls.lock().unwrap().clone()
        }
    }

    #[async_trait]
    impl Acknowledger<String> for Fake {
        async fn ack(&self, ids: &[String]) -> Result<(), tonic::Status> {
            self.record(Call::Ack, ids)
        }
        async fn nack(&self, ids: &[String]) -> Result<(), tonic::Status> {
            self.record(Call::Nack, ids)
        }
        async fn extend(&self, ids: &[String]) -> Result<(), tonic::Status> {
            self.record(Call::Extend, ids)
        }
        fn retryable(&self, status: &tonic::Status) -> bool {
            status.code() == tonic::Code::Unavailable
        }
        fn describe(&self) -> String {
            "a fake input".into()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_gathers_what_comes_within_the_gather_delay() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        tx.send(ack(&["b"])).unwrap();
        let late = tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(GATHER / 2).await;
            late.send(Verdict::Nack(vec!["c".into()])).unwrap();
            tokio::time::sleep(GATHER).await;
            late.send(ack(&["d"])).unwrap();
        });
        let (acks, nacks, _, closed) = gather(ack(&["a"]), &mut rx, &config(2500), |_| {}).await;
        assert_eq!(acks, ["a", "b"]);
        assert_eq!(nacks, ["c"]);
        assert!(!closed, "the queue is still open");
        let next = rx.recv().await.unwrap();
        assert!(
            matches!(next, Verdict::Ack(ids) if ids == ["d"]),
            "the next round's"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_call_or_a_closed_queue_ends_the_round_at_once() {
        let max = 2500;
        let (tx, mut rx) = mpsc::unbounded_channel::<Verdict<String>>();
        let many: Vec<String> = (0..max).map(|i| i.to_string()).collect();
        let started = Instant::now();
        let (acks, _, _, closed) = gather(Verdict::Ack(many), &mut rx, &config(max), |_| {}).await;
        assert_eq!(acks.len(), max);
        assert!(!closed);
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "a full call waits for nothing"
        );
        drop(tx);
        let (acks, _, _, closed) = gather(ack(&["x"]), &mut rx, &config(max), |_| {}).await;
        assert_eq!(acks, ["x"]);
        assert!(closed, "the queue closed: the settler sends and ends");
    }

    #[tokio::test(start_paused = true)]
    async fn verdicts_are_chunked_per_call_and_counted() {
        let fake = Arc::new(Fake::default());
        let outstanding = Arc::new(Outstanding::<String>::new(100, 1000));
        for id in ["a", "b", "c", "n"] {
            outstanding.add(id.to_string(), 1);
        }
        let counters = Arc::new(DeliveryCounters::default());
        let (tx, rx) = mpsc::unbounded_channel();
        tx.send(ack(&["a", "b", "c"])).unwrap();
        tx.send(Verdict::Nack(vec!["n".to_string()])).unwrap();
        drop(tx);
        run_settler(
            fake.clone(),
            config(2),
            rx,
            outstanding.clone(),
            counters.clone(),
        )
        .await;
        let calls: Vec<(Call, Vec<String>)> = fake
            .calls()
            .into_iter()
            .map(|(c, ids, _)| (c, ids))
            .collect();
        assert_eq!(
            calls,
            [
                (Call::Ack, vec!["a".to_string(), "b".to_string()]),
                (Call::Ack, vec!["c".to_string()]),
                (Call::Nack, vec!["n".to_string()]),
            ]
        );
        let counts = counters.snapshot();
        assert_eq!((counts.messages_acked, counts.messages_nacked), (3, 1));
        assert!(outstanding.is_empty(), "settled ids leave the held set");
    }

    #[tokio::test(start_paused = true)]
    async fn a_transient_failure_is_retried_with_backoff_and_a_lasting_one_is_left() {
        let fake = Arc::new(Fake::default());
        *fake.fail_first.lock().unwrap() = 2;
        let counters = Arc::new(DeliveryCounters::default());
        let (tx, rx) = mpsc::unbounded_channel();
        tx.send(ack(&["a"])).unwrap();
        drop(tx);
        let outstanding = Arc::new(Outstanding::<String>::new(10, 10));
        run_settler(fake.clone(), config(10), rx, outstanding, counters.clone()).await;
        let at: Vec<Duration> = fake.calls().into_iter().map(|(_, _, t)| t).collect();
        // Three attempts: the retry delays are 100 ms, then 200 ms.
        assert_eq!(
            at,
            [
                Duration::ZERO,
                Duration::from_millis(100),
                Duration::from_millis(300)
            ]
        );
        assert_eq!(counters.snapshot().messages_acked, 1);

        // Failing every attempt: three calls, then the ids are left (not counted).
        let fake = Arc::new(Fake::default());
        *fake.fail_first.lock().unwrap() = 10;
        let (tx, rx) = mpsc::unbounded_channel();
        tx.send(ack(&["a"])).unwrap();
        drop(tx);
        let counters = Arc::new(DeliveryCounters::default());
        let outstanding = Arc::new(Outstanding::<String>::new(10, 10));
        run_settler(fake.clone(), config(10), rx, outstanding, counters.clone()).await;
        assert_eq!(fake.calls().len(), 3);
        assert_eq!(counters.snapshot().messages_acked, 0);
    }

    /// An input that confirms acknowledgements and answers per id: `refuse` for good, and
    /// `flaky` once for now.
    struct PerIdFake {
        calls: Mutex<Vec<Vec<String>>>,
        flaky_once: Mutex<bool>,
    }

    #[async_trait]
    impl Acknowledger<String> for PerIdFake {
        async fn ack(&self, ids: &[String]) -> Result<(), tonic::Status> {
            self.calls.lock().unwrap().push(ids.to_vec());
            let flaky = ids.iter().any(|i| i == "flaky") && {
                let mut once = self.flaky_once.lock().unwrap();
                std::mem::replace(&mut *once, false)
            };
            if flaky || ids.iter().any(|i| i == "refuse") {
                return Err(tonic::Status::invalid_argument("per id"));
            }
            Ok(())
        }
        async fn nack(&self, _: &[String]) -> Result<(), tonic::Status> {
            Ok(())
        }
        async fn extend(&self, ids: &[String]) -> Result<(), tonic::Status> {
            if ids.iter().any(|i| i == "refuse") {
                return Err(tonic::Status::invalid_argument("per id"));
            }
            Ok(())
        }
        fn retryable(&self, _: &tonic::Status) -> bool {
            false
        }
        fn confirms(&self) -> bool {
            true
        }
        fn per_id(&self, _: &tonic::Status, ids: &[String]) -> Option<PerId<String>> {
            let once = *self.flaky_once.lock().unwrap();
            Some(PerId {
                transient: ids
                    .iter()
                    .filter(|i| *i == "flaky" && !once)
                    .cloned()
                    .collect(),
                refused: ids.iter().filter(|i| *i == "refuse").cloned().collect(),
            })
        }
        fn describe(&self) -> String {
            "a per-id fake".into()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_per_id_answer_resends_the_transient_ids_and_counts_the_refused_ones() {
        let fake = Arc::new(PerIdFake {
            calls: Mutex::new(Vec::new()),
            flaky_once: Mutex::new(true),
        });
        let counters = Arc::new(DeliveryCounters::default());
        let (tx, rx) = mpsc::unbounded_channel();
        tx.send(ack(&["ok", "refuse", "flaky"])).unwrap();
        drop(tx);
        let outstanding = Arc::new(Outstanding::<String>::new(10, 10));
        run_settler(fake.clone(), config(10), rx, outstanding, counters.clone()).await;
        let calls = fake.calls.lock().unwrap().clone();
        assert_eq!(
            calls,
            [
                vec!["ok".to_string(), "refuse".to_string(), "flaky".to_string()],
                vec!["flaky".to_string()],
            ]
        );
        let c = counters.snapshot();
        assert_eq!(
            (
                c.messages_acked,
                c.messages_ack_confirmed,
                c.messages_ack_refused
            ),
            (2, 2, 1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_refused_for_good_is_no_longer_held_or_extended() {
        let fake = Arc::new(PerIdFake {
            calls: Mutex::new(Vec::new()),
            flaky_once: Mutex::new(false),
        });
        let outstanding = Arc::new(Outstanding::<String>::new(10, 100));
        outstanding.add("keep".to_string(), 1);
        outstanding.add("refuse".to_string(), 1);
        let counters = Arc::new(DeliveryCounters::default());
        let (tx, rx) = mpsc::unbounded_channel::<Verdict<String>>();
        let settler = tokio::spawn(run_settler(
            fake,
            config(10),
            rx,
            outstanding.clone(),
            counters.clone(),
        ));
        tokio::time::sleep(Duration::from_secs(21)).await;
        assert_eq!(outstanding.len(), 1, "the refused lease is let go");
        assert_eq!(counters.snapshot().lease_extensions, 1);
        drop(tx);
        settler.await.unwrap();
    }

    /// A settler of `outstanding` against a [`Fake`] service, with its counters and queue.
    #[allow(clippy::type_complexity)]
    fn settle_with_fake(
        outstanding: &Arc<Outstanding<String>>,
    ) -> (
        Arc<Fake>,
        Arc<DeliveryCounters>,
        mpsc::UnboundedSender<Verdict<String>>,
        tokio::task::JoinHandle<()>,
    ) {
        let fake = Arc::new(Fake::default());
        let counters = Arc::new(DeliveryCounters::default());
        let (tx, rx) = mpsc::unbounded_channel::<Verdict<String>>();
        let settler = tokio::spawn(run_settler(
            fake.clone(),
            config(10),
            rx,
            outstanding.clone(),
            counters.clone(),
        ));
        (fake, counters, tx, settler)
    }

    #[tokio::test(start_paused = true)]
    async fn an_acknowledged_id_leaves_flow_control_before_its_call_is_sent() {
        let outstanding = Arc::new(Outstanding::<String>::new(2, 100));
        outstanding.add("a".to_string(), 1);
        outstanding.add("b".to_string(), 1);
        assert!(!outstanding.has_room());
        let (fake, counters, tx, settler) = settle_with_fake(&outstanding);
        tx.send(ack(&["a"])).unwrap();
        tx.send(Verdict::Nack(vec!["b".to_string()])).unwrap();
        tokio::time::sleep(GATHER / 2).await;
        assert!(fake.calls().is_empty(), "still gathering");
        assert!(
            outstanding.is_empty(),
            "the stream may read again meanwhile"
        );
        tokio::time::sleep(GATHER).await;
        let calls: Vec<Call> = fake.calls().into_iter().map(|(c, _, _)| c).collect();
        assert_eq!(calls, [Call::Ack, Call::Nack]);
        let c = counters.snapshot();
        assert_eq!((c.messages_acked, c.messages_nacked), (1, 1));
        drop(tx);
        settler.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn held_ids_are_extended_each_tick_until_their_lease_is_let_go() {
        let outstanding = Arc::new(Outstanding::<String>::new(10, 100));
        outstanding.add("held".to_string(), 1);
        let (fake, counters, tx, settler) = settle_with_fake(&outstanding);
        // Ticks at 20 s and 40 s extend; at 60 s the lease is let go.
        tokio::time::sleep(Duration::from_secs(61)).await;
        let extends: Vec<Duration> = fake
            .calls()
            .into_iter()
            .filter(|(c, _, _)| *c == Call::Extend)
            .map(|(_, _, t)| t)
            .collect();
        assert_eq!(extends, [Duration::ZERO, Duration::from_secs(20)]);
        assert_eq!(counters.snapshot().leases_expired, 1);
        assert!(outstanding.is_empty());
        drop(tx);
        settler.await.unwrap();
    }
}
