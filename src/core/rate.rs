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

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How many seconds of tokens the bucket holds at most: a writer idle for this long may admit
/// `rate × BURST_WINDOW` records at once. Short, so that the cap also holds over short windows
/// (the Cloud Tasks ramp guidance is a per-second rate), and long enough that a wake-up a few
/// milliseconds late (timer granularity, a busy runtime) loses no tokens.
pub const BURST_WINDOW: Duration = Duration::from_millis(100);

/// A token bucket of `rate` tokens per second.
#[derive(Debug)]
pub struct RateLimiter {
    rate: f64,
    capacity: f64,
    state: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

impl RateLimiter {
    /// A limiter of `per_second` tokens per second (a finite number above zero; anything else
    /// is taken as one token per second, the options refuse it earlier).
    pub fn new(per_second: f64) -> Self {
        let rate = if per_second.is_finite() && per_second > 0.0 {
            per_second
        } else {
            1.0
        };
        RateLimiter {
            rate,
            capacity: (rate * BURST_WINDOW.as_secs_f64()).max(1.0),
            state: Mutex::new(Bucket {
                tokens: 1.0,
                last: Instant::now(),
            }),
        }
    }

    /// The rate, in tokens per second.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    fn bucket(&self) -> std::sync::MutexGuard<'_, Bucket> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn refill(&self, b: &mut Bucket, now: Instant) {
        let elapsed = now.saturating_duration_since(b.last).as_secs_f64();
        b.tokens = (b.tokens + elapsed * self.rate).min(self.capacity);
        b.last = now;
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
        self.refill(&mut b, now);
        if b.tokens < 1.0 {
            let missing = 1.0 - b.tokens;
            // At least a microsecond, so a caller never spins on a zero wait.
            let wait = Duration::from_secs_f64(missing / self.rate).max(Duration::from_micros(1));
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
        b.tokens = (b.tokens + n as f64).min(self.capacity);
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
