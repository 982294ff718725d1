//! Retry timing with the Google SDKs' (gax) semantics, kept apart from classification.
//!
//! [`Transport::classify`](super::Transport::classify) decides *whether* an outcome is worth
//! another attempt; this module decides *when* and *for how long*: the delay before each retry,
//! the deadline of each attempt, and when the budget is spent.
//!
//! The zero values mean what the retry settings of the Google API client libraries (gax
//! `RetrySettings`) mean by them:
//!
//! | setting | zero means |
//! |---|---|
//! | `total_timeout` | retries bounded by `max_attempts` only (both zero: no retries) |
//! | `max_attempts` | retries bounded by `total_timeout` only |
//! | `initial_rpc_timeout` | the first attempt has no deadline |
//! | `max_rpc_timeout` | every retry runs without a deadline |
//! | `max_retry_delay` | no delay from the second retry on |
//! | `initial_retry_delay` | no delay before the first retry |

use std::time::Duration;

use tokio::time::Instant;

/// Retry settings of the send RPC, as the Google SDKs (gax) define them.
///
/// ```
/// use std::time::Duration;
/// use gcp_sql::core::RetrySettings;
///
/// // Bounded by attempts only: gax reads a zero total timeout that way.
/// let settings = RetrySettings { total_timeout: Duration::ZERO, max_attempts: 3, ..RetrySettings::default() };
/// assert_eq!(settings.max_attempts, 3);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct RetrySettings {
    /// Total time budget of an operation including its retries, measured from its first
    /// attempt. Zero: bounded by `max_attempts` only.
    pub total_timeout: Duration,
    /// Attempts, the first included. Zero: bounded by `total_timeout` only.
    pub max_attempts: u32,
    /// Delay before the first retry. Zero: none.
    pub initial_retry_delay: Duration,
    /// Factor the delay grows by per retry.
    pub retry_delay_multiplier: f64,
    /// Cap of the delay from the second retry on. Zero: no delay from the second retry on.
    pub max_retry_delay: Duration,
    /// Deadline of the first attempt (and of the first retry). Zero: no deadline.
    pub initial_rpc_timeout: Duration,
    /// Factor the attempt deadline grows by per retry.
    pub rpc_timeout_multiplier: f64,
    /// Cap of the attempt deadline of retries. Zero: every retry runs without deadline.
    pub max_rpc_timeout: Duration,
    /// Sleep a uniformly random duration in `[0, delay)` instead of `delay`.
    pub jitter: bool,
}

/// The default retry settings of the Java Pub/Sub client's publisher (`Publisher.Builder`).
impl Default for RetrySettings {
    fn default() -> Self {
        RetrySettings {
            total_timeout: Duration::from_secs(600),
            max_attempts: 0,
            initial_retry_delay: Duration::from_millis(100),
            retry_delay_multiplier: 4.0,
            max_retry_delay: Duration::from_secs(60),
            initial_rpc_timeout: Duration::from_secs(5),
            rpc_timeout_multiplier: 4.0,
            max_rpc_timeout: Duration::from_secs(60),
            jitter: true,
        }
    }
}

impl RetrySettings {
    /// Settings bounded by attempts only: `max_attempts` attempts, waiting `first_delay` before
    /// the first retry and doubling from there (capped at a minute), without jitter; every
    /// attempt gets `rpc_timeout` as its deadline (zero: none).
    ///
    /// ```
    /// use std::time::Duration;
    /// use gcp_sql::core::RetrySettings;
    /// let s = RetrySettings::doubling(5, Duration::from_millis(100), Duration::ZERO);
    /// assert_eq!((s.max_attempts, s.jitter), (5, false));
    /// ```
    pub const fn doubling(max_attempts: u32, first_delay: Duration, rpc_timeout: Duration) -> Self {
        RetrySettings {
            total_timeout: Duration::ZERO,
            max_attempts,
            initial_retry_delay: first_delay,
            retry_delay_multiplier: 2.0,
            max_retry_delay: Duration::from_secs(60),
            initial_rpc_timeout: rpc_timeout,
            rpc_timeout_multiplier: 1.0,
            max_rpc_timeout: rpc_timeout,
            jitter: false,
        }
    }

    /// Settings that never give up (unlimited attempts and time), keeping the delays and
    /// deadlines of `base`. The Java Pub/Sub publisher does this when ordering is enabled,
    /// because giving up on a key would break its order; the progress watchdog is then what
    /// ends an outage.
    pub fn unlimited(base: &RetrySettings) -> Self {
        RetrySettings {
            total_timeout: Duration::MAX,
            max_attempts: 0,
            ..base.clone()
        }
    }

    /// Starts the retry state of one operation whose first attempt begins `now`.
    pub fn start(&self, now: Instant) -> RetryState {
        RetryState {
            settings: self.clone(),
            started: now,
            attempts: 0,
            delay: Duration::ZERO,
            rpc_timeout: self.initial_rpc_timeout,
        }
    }
}

/// The retry progress of one operation: attempts made, the current delay and deadline.
#[derive(Debug, Clone)]
pub struct RetryState {
    settings: RetrySettings,
    started: Instant,
    attempts: u32,
    /// The un-jittered delay of the retry last scheduled.
    delay: Duration,
    /// The deadline of the next attempt (zero: none).
    rpc_timeout: Duration,
}

impl RetryState {
    /// Attempts made so far (each [`RetryState::begin_attempt`] counts one).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Records that an attempt starts now and returns its deadline (`None`: no deadline).
    /// Under a total timeout the deadline is clamped to the time left, as gax does.
    pub fn begin_attempt(&mut self, now: Instant) -> Option<Duration> {
        self.attempts = self.attempts.saturating_add(1);
        if self.rpc_timeout.is_zero() {
            return None;
        }
        let mut timeout = self.rpc_timeout;
        if !self.settings.total_timeout.is_zero() && self.settings.total_timeout != Duration::MAX {
            let spent = now.saturating_duration_since(self.started);
            let left = self.settings.total_timeout.saturating_sub(spent);
            // A zero deadline would mean "none"; keep at least a millisecond.
            timeout = timeout.min(left).max(Duration::from_millis(1));
        }
        Some(timeout)
    }

    /// After a failed attempt: the delay to wait before the next one, or `None` when the
    /// budget is spent. The returned delay is already jittered when the settings ask for it.
    pub fn next_delay(&mut self, now: Instant) -> Option<Duration> {
        let s = &self.settings;
        if s.total_timeout.is_zero() && s.max_attempts == 0 {
            return None;
        }
        if s.max_attempts > 0 && self.attempts >= s.max_attempts {
            return None;
        }
        // The first retry uses the initial values as they are; later ones grow and are capped.
        let (delay, rpc_timeout) = if self.attempts <= 1 {
            // A zero cap makes every retry, the first included, run without a deadline.
            let rpc = if s.max_rpc_timeout.is_zero() {
                Duration::ZERO
            } else {
                s.initial_rpc_timeout
            };
            (s.initial_retry_delay, rpc)
        } else {
            (
                scale(self.delay, s.retry_delay_multiplier).min(s.max_retry_delay),
                scale(self.rpc_timeout, s.rpc_timeout_multiplier).min(s.max_rpc_timeout),
            )
        };
        let slept = if s.jitter { jittered(delay) } else { delay };
        if !s.total_timeout.is_zero() {
            let spent = now.saturating_duration_since(self.started);
            if spent.saturating_add(slept) > s.total_timeout {
                return None;
            }
        }
        self.delay = delay;
        self.rpc_timeout = rpc_timeout;
        Some(slept)
    }
}

/// `d * factor`, saturating; a factor below 1 (or NaN) leaves `d` unchanged.
fn scale(d: Duration, factor: f64) -> Duration {
    if factor.is_nan() || factor < 1.0 {
        return d;
    }
    let secs = d.as_secs_f64() * factor;
    Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
}

/// A uniformly random duration in `[0, delay)` (zero stays zero).
fn jittered(delay: Duration) -> Duration {
    let nanos = delay.as_nanos().min(u64::MAX as u128) as u64;
    if nanos == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(fastrand::u64(0..nanos))
}

/// Exponential backoff of the recovery paths (a missing destination, a connector's own
/// transient-failure retry).
#[derive(Debug, Clone, PartialEq)]
pub struct Backoff {
    /// The first backoff.
    pub initial: Duration,
    /// The backoff cap.
    pub max: Duration,
    /// Factor the backoff grows by per attempt.
    pub multiplier: f64,
}

impl Backoff {
    /// The backoff after the `retry`-th failed attempt (1 for the first): `initial`,
    /// then multiplied per retry, capped at `max`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use gcp_sql::core::Backoff;
    /// let b = Backoff { initial: Duration::from_millis(500), max: Duration::from_secs(2), multiplier: 2.0 };
    /// assert_eq!(b.delay(1), Duration::from_millis(500));
    /// assert_eq!(b.delay(2), Duration::from_secs(1));
    /// assert_eq!(b.delay(5), Duration::from_secs(2));
    /// ```
    pub fn delay(&self, retry: u32) -> Duration {
        let mut d = self.initial.min(self.max);
        for _ in 1..retry {
            d = scale(d, self.multiplier).min(self.max);
            if d == self.max {
                break;
            }
        }
        d
    }

    /// [`Backoff::delay`] with "equal jitter": between half of it and all of it, uniformly, so
    /// that many clients that failed together do not come back together.
    ///
    /// ```
    /// use std::time::Duration;
    /// use gcp_sql::core::Backoff;
    /// let b = Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(10), multiplier: 2.0 };
    /// let d = b.jittered(2);
    /// assert!(d >= Duration::from_millis(100) && d <= Duration::from_millis(200));
    /// ```
    pub fn jittered(&self, retry: u32) -> Duration {
        self.delay(retry).mul_f64(0.5 + fastrand::f64() * 0.5)
    }
}

/// Runs `call` until it succeeds, `retryable` refuses its error, or `settings`' budget is spent
/// (attempts, total time), sleeping the settings' delay between attempts. Each attempt is
/// given the deadline the settings set for it (`None`: none). Returns the last result and the
/// attempts made.
///
/// The one retry loop of the calls that are not a sink's sends (those run through the core's
/// resolver): a source's acknowledgements, nacks and lease extensions, a dead-letter publish.
pub async fn retry<T, E, F, Fut>(
    settings: &RetrySettings,
    retryable: impl Fn(&E) -> bool,
    mut call: F,
) -> (Result<T, E>, u32)
where
    F: FnMut(Option<Duration>) -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut state = settings.start(Instant::now());
    loop {
        let deadline = state.begin_attempt(Instant::now());
        let error = match call(deadline).await {
            Ok(value) => return (Ok(value), state.attempts()),
            Err(error) => error,
        };
        if !retryable(&error) {
            return (Err(error), state.attempts());
        }
        match state.next_delay(Instant::now()) {
            Some(delay) => tokio::time::sleep(delay).await,
            None => return (Err(error), state.attempts()),
        }
    }
}

pub use crate::error::is_transient_code;

#[cfg(test)]
mod tests {
    use super::*;

    fn fixed(total: u64, attempts: u32) -> RetrySettings {
        RetrySettings {
            total_timeout: Duration::from_millis(total),
            max_attempts: attempts,
            initial_retry_delay: Duration::from_millis(100),
            retry_delay_multiplier: 2.0,
            max_retry_delay: Duration::from_millis(300),
            initial_rpc_timeout: Duration::from_secs(1),
            rpc_timeout_multiplier: 2.0,
            max_rpc_timeout: Duration::from_secs(3),
            jitter: false,
        }
    }

    /// [`fixed`] with `change` made to it.
    fn fixed_with(
        total: u64,
        attempts: u32,
        change: impl FnOnce(&mut RetrySettings),
    ) -> RetrySettings {
        let mut settings = fixed(total, attempts);
        change(&mut settings);
        settings
    }

    /// Runs failed attempts with the clock advancing by each delay; returns the delays.
    fn delays(settings: &RetrySettings) -> Vec<Duration> {
        let mut now = Instant::now();
        let mut state = settings.start(now);
        let mut out = Vec::new();
        for _ in 0..20 {
            state.begin_attempt(now);
            match state.next_delay(now) {
                Some(d) => {
                    out.push(d);
                    now += d;
                }
                None => break,
            }
        }
        out
    }

    /// The deadline of each attempt `settings` allows when every attempt fails at once.
    fn deadlines(settings: &RetrySettings) -> Vec<Option<Duration>> {
        let now = Instant::now();
        let mut state = settings.start(now);
        let mut out = vec![state.begin_attempt(now)];
        while out.len() < 20 && state.next_delay(now).is_some() {
            out.push(state.begin_attempt(now));
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn delays_grow_by_multiplier_and_cap() {
        let d = delays(&fixed(0, 6));
        let ms: Vec<u64> = d.iter().map(|d| d.as_millis() as u64).collect();
        assert_eq!(ms, vec![100, 200, 300, 300, 300]);
    }

    #[tokio::test(start_paused = true)]
    async fn zero_total_and_zero_attempts_means_no_retries() {
        assert!(delays(&fixed(0, 0)).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn zero_total_timeout_bounds_by_attempts_only() {
        // 4 attempts: 3 retries, however long they take.
        let s = fixed_with(0, 4, |s| {
            s.initial_retry_delay = Duration::from_secs(1000);
            s.max_retry_delay = Duration::from_secs(1000);
        });
        assert_eq!(delays(&s).len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn zero_max_attempts_bounds_by_time_only() {
        // Delays 100, 200, 300, 300 ... until 1000 ms are spent: 100+200+300+300 = 900, the
        // next 300 would end past the total.
        assert_eq!(delays(&fixed(1000, 0)).len(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn zero_initial_delay_means_no_delay_before_first_retry() {
        let s = fixed_with(0, 3, |s| s.initial_retry_delay = Duration::ZERO);
        // multiplier of zero stays zero: every retry immediate
        assert_eq!(delays(&s), vec![Duration::ZERO, Duration::ZERO]);
    }

    #[tokio::test(start_paused = true)]
    async fn zero_max_delay_means_no_delay_from_second_retry_on() {
        let s = fixed_with(0, 4, |s| s.max_retry_delay = Duration::ZERO);
        assert_eq!(
            delays(&s),
            vec![Duration::from_millis(100), Duration::ZERO, Duration::ZERO]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn zero_initial_rpc_timeout_means_no_deadline() {
        let s = fixed_with(0, 3, |s| s.initial_rpc_timeout = Duration::ZERO);
        assert_eq!(deadlines(&s)[0], None);
    }

    #[tokio::test(start_paused = true)]
    async fn zero_max_rpc_timeout_means_retries_run_without_deadline() {
        let s = fixed_with(0, 4, |s| s.max_rpc_timeout = Duration::ZERO);
        assert_eq!(
            deadlines(&s),
            vec![Some(Duration::from_secs(1)), None, None, None]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn rpc_timeout_grows_and_is_clamped_to_time_left() {
        let s = fixed(2500, 0);
        let start = Instant::now();
        let mut state = s.start(start);
        assert_eq!(state.begin_attempt(start), Some(Duration::from_secs(1)));
        let d = state.next_delay(start).unwrap_or_default();
        // First retry keeps the initial deadline.
        assert_eq!(state.begin_attempt(start + d), Some(Duration::from_secs(1)));
        let later = start + Duration::from_millis(1500);
        assert!(state.next_delay(later).is_some());
        // 2 s would be next, but only 1 s - (delay) is left of the 2.5 s budget.
        let t = state
            .begin_attempt(later + Duration::from_millis(200))
            .unwrap_or_default();
        assert_eq!(t, Duration::from_millis(800));
    }

    #[tokio::test(start_paused = true)]
    async fn jitter_stays_below_the_delay() {
        let delay = Duration::from_millis(100);
        let mut seen_nonzero = false;
        for _ in 0..1000 {
            let j = jittered(delay);
            assert!(j < delay, "{j:?}");
            seen_nonzero |= j > Duration::ZERO;
        }
        assert!(seen_nonzero);
        assert_eq!(jittered(Duration::ZERO), Duration::ZERO);
        let s = fixed_with(0, 3, |s| s.jitter = true);
        for d in delays(&s) {
            assert!(d < Duration::from_millis(200));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn unlimited_never_gives_up() {
        let s = RetrySettings::unlimited(&fixed(10, 2));
        let mut now = Instant::now();
        let mut state = s.start(now);
        for _ in 0..10_000 {
            state.begin_attempt(now);
            now += state.next_delay(now).expect("unlimited retries");
        }
    }

    #[test]
    fn transient_codes_match_the_official_publish_retry_set() {
        assert!(is_transient_code(tonic::Code::Unavailable));
        assert!(is_transient_code(tonic::Code::ResourceExhausted));
        assert!(!is_transient_code(tonic::Code::InvalidArgument));
        assert!(!is_transient_code(tonic::Code::NotFound));
        assert!(!is_transient_code(tonic::Code::PermissionDenied));
    }

    #[tokio::test(start_paused = true)]
    async fn retry_runs_until_success_refusal_or_budget() {
        let settings = fixed(0, 4);
        let start = Instant::now();
        let mut seen = Vec::new();
        let (result, attempts) = retry(
            &settings,
            |e: &&str| *e == "transient",
            |deadline| {
                seen.push((start.elapsed(), deadline));
                let n = seen.len();
                async move { if n < 3 { Err("transient") } else { Ok(n) } }
            },
        )
        .await;
        assert_eq!((result, attempts), (Ok(3), 3));
        let at: Vec<Duration> = seen.iter().map(|(t, _)| *t).collect();
        assert_eq!(
            at,
            [
                Duration::ZERO,
                Duration::from_millis(100),
                Duration::from_millis(300)
            ]
        );
        assert_eq!(
            seen[0].1,
            Some(Duration::from_secs(1)),
            "the attempt's deadline"
        );

        let (result, attempts) = retry(
            &settings,
            |_: &&str| false,
            |_| async { Err::<(), _>("fatal") },
        )
        .await;
        assert_eq!(
            (result, attempts),
            (Err("fatal"), 1),
            "not retryable: one attempt"
        );

        let (result, attempts) = retry(
            &settings,
            |_: &&str| true,
            |_| async { Err::<(), _>("down") },
        )
        .await;
        assert_eq!((result, attempts), (Err("down"), 4), "max_attempts");
    }

    #[test]
    fn jittered_backoff_stays_between_half_and_all_of_the_delay() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(10),
            multiplier: 2.0,
        };
        for retry in 1..12 {
            let d = b.jittered(retry);
            assert!(d >= b.delay(retry) / 2 && d <= b.delay(retry), "{d:?}");
        }
    }

    #[test]
    fn backoff_caps_at_max() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(250),
            multiplier: 2.0,
        };
        assert_eq!(b.delay(1), Duration::from_millis(100));
        assert_eq!(b.delay(2), Duration::from_millis(200));
        assert_eq!(b.delay(3), Duration::from_millis(250));
        assert_eq!(b.delay(100), Duration::from_millis(250));
    }
}
