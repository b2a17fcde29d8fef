//! The one pacing of every retry loop in Leasehold: capped exponential backoff with jitter.
//!
//! [`Backoff`] is the policy (a first wait and a cap); [`Waits`] walks it for a loop that waits
//! between tries (the worker's idle polling, heartbeat and completion retries, the lease guard's
//! renewals, the generator's creates); [`RetryPolicy`] bounds it by a number of tries (the
//! lease-service client). task-service paces the retries of failed tasks with the same
//! [`Backoff::delay`], counted by the task's attempts.
//!
//! Every wait is drawn uniformly between half its ceiling and its ceiling ("equal jitter"):
//! waits grow about twofold each time, never exceed the cap, and callers that failed together
//! do not try again together.

use std::time::Duration;

use rand::Rng;

/// Capped exponential backoff: the `attempt`-th wait (1-based) has the ceiling
/// `min(max, base · 2^(attempt-1))` and is drawn between half that and all of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The ceiling of the first wait.
    pub base: Duration,
    /// The ceiling of every wait; below `base` it is taken as `base`.
    pub max: Duration,
}

impl Backoff {
    pub const fn new(base: Duration, max: Duration) -> Self {
        Self { base, max }
    }

    /// The longest wait before try number `attempt + 1`, that is after the `attempt`-th failure
    /// (1-based; 0 is taken as 1).
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(30);
        self.base
            .saturating_mul(2u32.saturating_pow(doublings))
            .min(self.max.max(self.base))
    }

    /// The wait after the `attempt`-th failure: uniform in `[ceiling/2, ceiling]`.
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.ceiling(attempt);
        let ceiling_us = u64::try_from(ceiling.as_micros()).unwrap_or(u64::MAX);
        Duration::from_micros(rand::rng().random_range(ceiling_us / 2..=ceiling_us))
    }

    /// A fresh walk of this backoff, for a loop that waits between tries.
    pub fn waits(self) -> Waits {
        Waits {
            backoff: self,
            attempt: 0,
        }
    }
}

/// The waits of one retry loop: each [`Waits::next_delay`] is [`Backoff::delay`] of the next
/// attempt, and [`Waits::reset`] starts again from the first once something succeeded.
#[derive(Debug, Clone)]
pub struct Waits {
    backoff: Backoff,
    attempt: u32,
}

impl Waits {
    /// Back to the shortest wait (after something happened).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// The ceiling of the next wait.
    pub fn ceiling(&self) -> Duration {
        self.backoff.ceiling(self.attempt.saturating_add(1))
    }

    /// The next wait; the one after will be about twice as long, up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        self.attempt = self.attempt.saturating_add(1);
        self.backoff.delay(self.attempt)
    }
}

/// A [`Backoff`] bounded by a number of tries: how Leasehold's clients retry a call that
/// failed transiently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Tries in all, the first included. 1 means no retry.
    pub max_attempts: u32,
    pub backoff: Backoff,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 4,
            backoff: Backoff::new(Duration::from_millis(50), Duration::from_secs(1)),
        }
    }
}

impl RetryPolicy {
    /// No retries: one try only.
    pub fn none() -> Self {
        Self {
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// The pause after the `attempt`-th failed try.
    pub fn delay(&self, attempt: u32) -> Duration {
        self.backoff.delay(attempt)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    const MIN: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_millis(5_000);

    #[test]
    fn ceilings_double_up_to_the_cap() {
        let backoff = Backoff::new(MIN, MAX);
        let ceilings: Vec<_> = (1..=10).map(|a| backoff.ceiling(a).as_millis()).collect();
        assert_eq!(
            ceilings,
            [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000, 5000]
        );
        assert_eq!(backoff.ceiling(0), MIN, "attempt 0 is taken as the first");
        assert_eq!(backoff.ceiling(u32::MAX), MAX, "no overflow far out");
    }

    #[test]
    fn each_wait_lies_between_half_its_ceiling_and_its_ceiling() {
        let backoff = Backoff::new(MIN, MAX);
        for attempt in 1..40 {
            let ceiling = backoff.ceiling(attempt);
            for _ in 0..50 {
                let delay = backoff.delay(attempt);
                assert!(
                    delay <= ceiling && delay >= ceiling / 2,
                    "{delay:?} vs {ceiling:?}"
                );
            }
        }
    }

    #[test]
    fn waits_are_jittered() {
        let backoff = Backoff::new(MIN, MAX);
        let third: HashSet<_> = (0..50).map(|_| backoff.delay(3)).collect();
        assert!(third.len() > 10, "only {} distinct waits", third.len());
        let at_cap: HashSet<_> = (0..50).map(|_| backoff.delay(20)).collect();
        assert!(at_cap.len() > 10, "waits at the cap are jittered too");
    }

    #[test]
    fn a_walk_grows_and_resets() {
        let mut waits = Backoff::new(MIN, MAX).waits();
        let mut ceilings = Vec::new();
        for _ in 0..8 {
            ceilings.push(waits.ceiling().as_millis());
            let delay = waits.next_delay();
            assert!(delay >= MIN / 2 && delay <= MAX, "{delay:?}");
        }
        assert_eq!(ceilings, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        waits.reset();
        assert_eq!(waits.ceiling(), MIN);
        assert!(waits.next_delay() <= MIN, "the first wait again");
    }

    #[test]
    fn a_cap_below_the_base_is_the_base_and_zero_never_waits() {
        let backoff = Backoff::new(MIN, Duration::from_millis(1));
        assert!((1..10).all(|a| backoff.ceiling(a) == MIN));
        let zero = Backoff::new(Duration::ZERO, Duration::ZERO);
        assert_eq!(zero.delay(7), Duration::ZERO);
    }

    #[test]
    fn the_default_policy_retries_three_times() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.max_attempts, 4);
        assert!(policy.delay(1) <= Duration::from_millis(50));
        assert_eq!(RetryPolicy::none().max_attempts, 1);
    }
}
