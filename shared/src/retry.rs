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
