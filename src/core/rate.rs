//! The admission rate limit: a token bucket on the writer's clock (`tokio::time`, so a paused
//! test clock drives it).
//!
//! A connector that has a records-per-second cap (Cloud Tasks' `max_tasks_per_second`) sets
//! [`FlowConfig::max_records_per_second`](super::FlowConfig::max_records_per_second); the
//! writer then takes one token per record before the record is admitted, and waits for tokens
//! when there are none. Tokens accrue continuously at the rate, up to [`BURST_WINDOW`] worth of
//! them (and at least one), so a writer that was idle may send that many at once, and a writer
//! that keeps up is paced at the rate: `n` records take `(n - 1) / rate` seconds. The bucket
//! starts with one token, so the first record does not wait.
//!
//! Retries and re-sends of admitted records take no token: they are bounded by their backoff,
//! and a retried record was counted once already.
//!
//! # A server asking to slow down ([`LoadHint`])
//!
//! A service may say how the client should change its load (Bigtable's `RateLimitInfo` in a
//! `MutateRowsResponse`: multiply the current load by `factor`, then leave it for `period`).
//! A transport hands such a hint to the core ([`Transport::take_load_hint`](super::Transport::take_load_hint));
//! [`Throttle`] applies it to the admission rate, without knowing which service sent it:
//!
//! - the first hint with a factor below 1 sets a server limit of the writer's measured
//!   admission rate (records per second over the last [`METER_WINDOW`]) times the factor;
//! - later hints multiply that limit by their factor, at most once per `period` (hints within
//!   the period are taken as "still in force");
//! - a limit is never below [`MIN_SERVER_RATE`], so a writer always makes progress;
//! - when no hint arrived for a whole `period`, the server limit lapses;
//! - a configured rate (`max_records_per_second`) stays an upper bound throughout.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How many seconds of tokens the bucket holds at most: a writer idle for this long may admit
/// `rate × BURST_WINDOW` records at once. Short, so that the cap also holds over short windows
/// (the Cloud Tasks ramp guidance is a per-second rate), and long enough that a wake-up a few
/// milliseconds late (timer granularity, a busy runtime) loses no tokens.
pub const BURST_WINDOW: Duration = Duration::from_millis(100);

/// The window the writer's admission rate is measured over, for the first [`LoadHint`].
pub const METER_WINDOW: Duration = Duration::from_secs(1);

/// The lowest rate a [`LoadHint`] may slow a writer to, in records per second.
pub const MIN_SERVER_RATE: f64 = 1.0;

/// The shortest period a [`LoadHint`] is taken to have: a zero or missing period would let a
/// stream of hints compound without bound.
pub const MIN_HINT_PERIOD: Duration = Duration::from_millis(100);

/// A service's request to change the client's load: multiply it by `factor`, and do not
/// change it again before `period` has passed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadHint {
    /// The multiplier of the current load (below 1: slow down; above: the service can take
    /// more).
    pub factor: f64,
    /// How long the adjusted load should stay before the next adjustment.
    pub period: Duration,
}

/// A token bucket of `rate` tokens per second.
#[derive(Debug)]
pub struct RateLimiter {
    state: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    rate: f64,
    capacity: f64,
    tokens: f64,
    last: Instant,
}

fn valid_rate(per_second: f64) -> f64 {
    if per_second.is_finite() && per_second > 0.0 {
        per_second
    } else {
        1.0
    }
}

fn capacity_of(rate: f64) -> f64 {
    (rate * BURST_WINDOW.as_secs_f64()).max(1.0)
}

impl RateLimiter {
    /// A limiter of `per_second` tokens per second (a finite number above zero; anything else
    /// is taken as one token per second, the options refuse it earlier).
    pub fn new(per_second: f64) -> Self {
        let rate = valid_rate(per_second);
        RateLimiter {
            state: Mutex::new(Bucket {
                rate,
                capacity: capacity_of(rate),
                tokens: 1.0,
                last: Instant::now(),
            }),
        }
    }

    /// The rate, in tokens per second.
    pub fn rate(&self) -> f64 {
        self.bucket().rate
    }

    /// Changes the rate from now on (the tokens accrued so far are kept, up to the new
    /// capacity).
    pub fn set_rate(&self, per_second: f64) {
        let now = Instant::now();
        let mut b = self.bucket();
        refill(&mut b, now);
        b.rate = valid_rate(per_second);
        b.capacity = capacity_of(b.rate);
        b.tokens = b.tokens.min(b.capacity);
    }

    fn bucket(&self) -> std::sync::MutexGuard<'_, Bucket> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes up to `wanted` whole tokens that are there now and returns how many it took
    /// (`wanted` of zero takes none). When there is not one, takes none and returns how long
    /// until the next one accrues.
    pub fn try_take(&self, wanted: usize) -> Result<usize, Duration> {
        if wanted == 0 {
            return Ok(0);
        }
        let now = Instant::now();
        let mut b = self.bucket();
        refill(&mut b, now);
        if b.tokens < 1.0 {
            let missing = 1.0 - b.tokens;
            // At least a microsecond, so a caller never spins on a zero wait.
            let wait = Duration::from_secs_f64(missing / b.rate).max(Duration::from_micros(1));
            return Err(wait);
        }
        let taken = (b.tokens.floor() as usize).min(wanted);
        b.tokens -= taken as f64;
        Ok(taken)
    }

    /// Waits until at least one token is there, then takes up to `wanted` of them (at least
    /// one, when `wanted` is not zero). `check` runs after every wait; its error ends the wait.
    pub async fn take<E>(
        &self,
        wanted: usize,
        check: impl Fn() -> Result<(), E>,
    ) -> Result<usize, E> {
        loop {
            match self.try_take(wanted) {
                Ok(n) => return Ok(n),
                Err(wait) => {
                    tokio::time::sleep(wait).await;
                    check()?;
                }
            }
        }
    }

    /// Gives back `n` tokens taken but not used (the gate admitted fewer records than were
    /// allowed), up to the bucket's capacity.
    pub fn give_back(&self, n: usize) {
        if n == 0 {
            return;
        }
        let mut b = self.bucket();
        b.tokens = (b.tokens + n as f64).min(b.capacity);
    }
}

fn refill(b: &mut Bucket, now: Instant) {
    let elapsed = now.saturating_duration_since(b.last).as_secs_f64();
    b.tokens = (b.tokens + elapsed * b.rate).min(b.capacity);
    b.last = now;
}

/// The admission rate of one writer: the configured limit, a server's [`LoadHint`]s, and the
/// meter the first hint is applied to. Without either limit, nothing waits.
#[derive(Debug)]
pub struct Throttle {
    configured: Option<f64>,
    limiter: RateLimiter,
    state: Mutex<ThrottleState>,
}

#[derive(Debug)]
struct ThrottleState {
    /// Whether a limit is in force (configured or from the server).
    limited: bool,
    server: Option<ServerLimit>,
    meter: Meter,
}

#[derive(Debug, Clone, Copy)]
struct ServerLimit {
    rate: f64,
    adjusted: Instant,
    last_hint: Instant,
    period: Duration,
}

/// Records admitted per [`METER_WINDOW`]: the count of the window under way and the rate of
/// the last complete one.
#[derive(Debug)]
struct Meter {
    start: Instant,
    count: u64,
    last_rate: Option<f64>,
}

impl Meter {
    fn roll(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.start);
        if elapsed >= METER_WINDOW {
            self.last_rate = Some(self.count as f64 / elapsed.as_secs_f64());
            self.start = now;
            self.count = 0;
        }
    }

    fn rate(&self, now: Instant) -> Option<f64> {
        self.last_rate.or_else(|| {
            let elapsed = now.saturating_duration_since(self.start).as_secs_f64();
            (elapsed > 0.0 && self.count > 0).then(|| self.count as f64 / elapsed)
        })
    }
}

impl Throttle {
    /// A throttle with the configured rate `configured` (`None`: no configured limit).
    pub fn new(configured: Option<f64>) -> Self {
        let now = Instant::now();
        Throttle {
            configured: configured.map(valid_rate),
            limiter: RateLimiter::new(configured.unwrap_or(1.0)),
            state: Mutex::new(ThrottleState {
                limited: configured.is_some(),
                server: None,
                meter: Meter {
                    start: now,
                    count: 0,
                    last_rate: None,
                },
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ThrottleState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The rate in force now (`None`: none), after a server limit whose hints stopped lapsed.
    pub fn rate(&self) -> Option<f64> {
        let mut s = self.state();
        self.lapse(&mut s, Instant::now());
        s.limited.then(|| self.limiter.rate())
    }

    /// Drops a server limit no hint has renewed for a whole period.
    fn lapse(&self, s: &mut ThrottleState, now: Instant) {
        if let Some(limit) = s.server
            && now.saturating_duration_since(limit.last_hint) >= limit.period
        {
            s.server = None;
            tracing::info!(
                rate = ?self.configured,
                "the service stopped asking to slow down: back to the configured admission rate"
            );
            self.apply(s);
        }
    }

    fn apply(&self, s: &mut ThrottleState) {
        let rate = match (self.configured, s.server.map(|l| l.rate)) {
            (Some(c), Some(r)) => Some(c.min(r)),
            (c, r) => c.or(r),
        };
        s.limited = rate.is_some();
        if let Some(rate) = rate {
            self.limiter.set_rate(rate);
        }
    }

    /// Waits until a record may be admitted, and returns how many may be now: `None` when no
    /// limit is in force, else the tokens taken (at least one; give back the unused ones with
    /// [`Throttle::unused`]). `check` runs after every wait; its error ends the wait.
    pub async fn take<E>(&self, check: impl Fn() -> Result<(), E>) -> Result<Option<usize>, E> {
        loop {
            if !self.limited_now() {
                return Ok(None);
            }
            match self.limiter.try_take(usize::MAX) {
                Ok(n) => return Ok(Some(n)),
                Err(wait) => {
                    tokio::time::sleep(wait).await;
                    check()?;
                }
            }
        }
    }

    fn limited_now(&self) -> bool {
        let mut s = self.state();
        self.lapse(&mut s, Instant::now());
        s.limited
    }

    /// Gives back `n` tokens [`Throttle::take`] allowed but the gate did not admit.
    pub fn unused(&self, n: usize) {
        if n > 0 && self.state().limited {
            self.limiter.give_back(n);
        }
    }

    /// Counts `n` admitted records in the meter the first [`LoadHint`] is applied to.
    pub fn count(&self, n: usize) {
        let now = Instant::now();
        let mut s = self.state();
        s.meter.roll(now);
        s.meter.count += n as u64;
    }

    /// Applies a service's [`LoadHint`] (see the module docs). A factor that is not a finite
    /// number above zero is ignored.
    pub fn hint(&self, hint: LoadHint) {
        if !(hint.factor.is_finite() && hint.factor > 0.0) {
            return;
        }
        let now = Instant::now();
        let period = hint.period.max(MIN_HINT_PERIOD);
        let mut s = self.state();
        self.lapse(&mut s, now);
        let rate = match s.server {
            Some(mut limit) => {
                limit.last_hint = now;
                limit.period = period;
                if now.saturating_duration_since(limit.adjusted) >= period {
                    limit.rate = (limit.rate * hint.factor).max(MIN_SERVER_RATE);
                    limit.adjusted = now;
                    s.server = Some(limit);
                    Some(limit.rate)
                } else {
                    s.server = Some(limit);
                    None
                }
            }
            // Not limited by the service: only a request to slow down changes anything.
            None if hint.factor < 1.0 => {
                s.meter.roll(now);
                let Some(load) = s.meter.rate(now) else {
                    return;
                };
                let rate = (load * hint.factor).max(MIN_SERVER_RATE);
                s.server = Some(ServerLimit {
                    rate,
                    adjusted: now,
                    last_hint: now,
                    period,
                });
                Some(rate)
            }
            None => None,
        };
        if let Some(rate) = rate {
            tracing::warn!(
                factor = hint.factor,
                ?period,
                rate,
                "the service asked to change the load: admission rate adjusted"
            );
            self.apply(&mut s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn paces_a_steady_caller_at_the_rate() {
        let limiter = RateLimiter::new(50.0);
        let start = Instant::now();
        let mut taken = 0;
        while taken < 501 {
            taken += limiter
                .take(1, || Ok::<(), ()>(()))
                .await
                .expect("no check fails");
        }
        // The first token is there at once; 500 more accrue at 50 per second.
        let elapsed = start.elapsed().as_secs_f64();
        assert!((elapsed - 10.0).abs() < 0.05, "took {elapsed} s");
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_writer_gets_at_most_the_burst_window() {
        let limiter = RateLimiter::new(1000.0);
        tokio::time::sleep(Duration::from_secs(5)).await;
        // 100 ms worth of tokens, not 5 s worth.
        assert_eq!(limiter.try_take(10_000), Ok(100));
        assert!(limiter.try_take(1).is_err());
        // Tokens given back are there again.
        limiter.give_back(3);
        assert_eq!(limiter.try_take(10), Ok(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_rate_waits_for_its_next_token() {
        let limiter = RateLimiter::new(0.5);
        assert_eq!(limiter.try_take(5), Ok(1), "the first token is there");
        let wait = limiter.try_take(1).expect_err("none left");
        assert_eq!(wait, Duration::from_secs(2));
        assert_eq!(limiter.try_take(0), Ok(0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_check_ends_the_wait() {
        let limiter = RateLimiter::new(1.0);
        assert_eq!(limiter.try_take(1), Ok(1));
        let result = limiter.take(1, || Err("stopped")).await;
        assert_eq!(result, Err("stopped"));
    }
}
