//! The retry policy of Leasehold's clients: capped exponential backoff with full jitter.

use std::time::Duration;

use rand::Rng;

/// Capped exponential backoff with full jitter.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Tries in all, the first included. 1 means no retry.
    pub max_attempts: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 4,
            base_delay: Duration::from_millis(50),
            max_delay: Duration::from_secs(1),
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

    /// The longest pause before retry number `attempt` (1-based): min(cap, base·2^attempt).
    pub fn ceiling(&self, attempt: u32) -> Duration {
        self.base_delay
            .saturating_mul(2u32.saturating_pow(attempt.min(16)))
            .min(self.max_delay)
    }

    /// The pause before retry number `attempt` (1-based): uniform in `[0, ceiling(attempt)]`
    /// (full jitter, so that clients that failed together do not retry together).
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.ceiling(attempt);
        let millis = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(rand::rng().random_range(0..=millis))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_jittered_and_capped() {
        let policy = RetryPolicy::default();
        for attempt in 1..30 {
            let ceiling = (policy.base_delay * 2u32.pow(attempt.min(16))).min(policy.max_delay);
            assert_eq!(policy.ceiling(attempt), ceiling);
            for _ in 0..20 {
                assert!(policy.delay(attempt) <= ceiling);
            }
        }
        let spread: std::collections::HashSet<_> = (0..50).map(|_| policy.delay(5)).collect();
        assert!(spread.len() > 5, "delays are jittered");
    }
}

/// A stateful backoff for loops that wait between tries (the worker's idle polling, its
/// heartbeat and completion retries): the ceiling starts at `min` and doubles after every wait,
/// up to `max`. Each wait is drawn uniformly between half the ceiling and the ceiling, but never
/// below `min`, so waits always lie within `min..=max`, grow roughly twofold each time, and
/// loops that went idle together do not wake together.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    ceiling: Duration,
}

impl Backoff {
    /// `max` below `min` is taken as `min`.
    pub fn new(min: Duration, max: Duration) -> Self {
        let max = max.max(min);
        Self {
            min,
            max,
            ceiling: min,
        }
    }

    /// Back to the shortest wait (after something happened).
    pub fn reset(&mut self) {
        self.ceiling = self.min;
    }

    /// The ceiling of the next wait.
    pub fn ceiling(&self) -> Duration {
        self.ceiling
    }

    /// The next wait; the one after will be about twice as long, up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self.ceiling;
        self.ceiling = self.ceiling.saturating_mul(2).min(self.max);
        let floor = (ceiling / 2).max(self.min).min(ceiling);
        let floor_us = u64::try_from(floor.as_micros()).unwrap_or(u64::MAX);
        let ceiling_us = u64::try_from(ceiling.as_micros()).unwrap_or(u64::MAX);
        Duration::from_micros(rand::rng().random_range(floor_us..=ceiling_us))
    }
}

#[cfg(test)]
mod backoff_tests {
    use std::collections::HashSet;

    use super::*;

    const MIN: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_millis(5_000);

    #[test]
    fn grows_twofold_up_to_the_cap() {
        let mut backoff = Backoff::new(MIN, MAX);
        let mut ceilings = Vec::new();
        for _ in 0..10 {
            ceilings.push(backoff.ceiling().as_millis());
            let delay = backoff.next_delay();
            assert!(delay >= MIN && delay <= MAX, "{delay:?}");
        }
        assert_eq!(
            ceilings,
            [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000, 5000]
        );
        backoff.reset();
        assert_eq!(backoff.ceiling(), MIN);
        assert_eq!(backoff.next_delay(), MIN, "the first wait is the minimum");
    }

    #[test]
    fn each_wait_lies_between_half_the_ceiling_and_the_ceiling() {
        for _ in 0..200 {
            let mut backoff = Backoff::new(MIN, MAX);
            for _ in 0..12 {
                let ceiling = backoff.ceiling();
                let delay = backoff.next_delay();
                assert!(delay <= ceiling, "{delay:?} > {ceiling:?}");
                assert!(
                    delay >= (ceiling / 2).max(MIN),
                    "{delay:?} < half of {ceiling:?}"
                );
            }
        }
    }

    #[test]
    fn waits_are_jittered() {
        let mut seen = HashSet::new();
        for _ in 0..50 {
            let mut backoff = Backoff::new(MIN, MAX);
            backoff.next_delay();
            backoff.next_delay();
            seen.insert(backoff.next_delay()); // ceiling 400 ms: between 200 and 400 ms
        }
        assert!(seen.len() > 10, "only {} distinct waits", seen.len());
        let mut capped = Backoff::new(MIN, MAX);
        for _ in 0..10 {
            capped.next_delay();
        }
        let at_cap: HashSet<_> = (0..50).map(|_| capped.next_delay()).collect();
        assert!(at_cap.len() > 10, "waits at the cap are jittered too");
        assert!(at_cap.iter().all(|d| *d >= MAX / 2 && *d <= MAX));
    }

    #[test]
    fn max_below_min_is_min() {
        let mut backoff = Backoff::new(MIN, Duration::from_millis(1));
        assert_eq!(backoff.next_delay(), MIN);
        assert_eq!(backoff.next_delay(), MIN);
    }
}
