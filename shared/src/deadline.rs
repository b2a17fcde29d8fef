//! The conservative lease deadline, the one rule by which a holder decides on its own that it
//! may no longer act on a lease: the leases guard ([`crate::lease_guard`]) and the worker's
//! task heartbeat both keep one.
//!
//! The lease service judges expiry by its database's clock, which a holder cannot read. What a
//! holder does know is when it *sent* the last request that the service confirmed: the lease was
//! granted or renewed at some moment after that, so it lasts at least until that send instant
//! plus the TTL, by any clock running at the database's rate. The holder counts on its own
//! monotonic clock from the send instant (never from the answer's arrival, which may come late)
//! and gives up a safety margin for the difference in clock rates.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// Until when a lease is certainly held, as last confirmed. Shared between the task that renews
/// the lease and the code acting on it, which checks it right before it acts.
#[derive(Debug)]
pub struct LeaseDeadline {
    margin: Duration,
    /// The send instant of the last confirmed request, and the TTL it confirmed.
    confirmed: Mutex<(Instant, Duration)>,
}

impl LeaseDeadline {
    /// The margin a holder gives up unless told otherwise: a tenth of the TTL, between 100 ms
    /// and 2 s (enough for a clock-rate error far beyond any real one, and for the answer's
    /// trip; never so much that a short lease is mostly margin).
    pub fn default_margin(ttl: Duration) -> Duration {
        (ttl / 10).clamp(Duration::from_millis(100), Duration::from_secs(2))
    }

    /// A lease of `ttl`, confirmed by a request sent at `sent`; `margin` is given up at the end.
    pub fn new(sent: Instant, ttl: Duration, margin: Duration) -> Self {
        Self {
            margin,
            confirmed: Mutex::new((sent, ttl)),
        }
    }

    /// Records a confirmation of a lease of `ttl` by a request sent at `sent`; an answer that
    /// gave no TTL (from a service older than the field) confirms the TTL last known. Only a
    /// later request moves the deadline: a late answer to an earlier one confirms nothing new.
    pub fn confirm(&self, sent: Instant, ttl: Option<Duration>) {
        let mut confirmed = self.lock();
        if sent >= confirmed.0 {
            *confirmed = (sent, ttl.unwrap_or(confirmed.1));
        }
    }

    /// The send instant of the last confirmed request.
    pub fn confirmed(&self) -> Instant {
        self.lock().0
    }

    /// The instant after which the lease is treated as lost unless confirmed again. The margin
    /// is at most half the confirmed TTL: a confirmation may carry a shorter TTL than the first
    /// (a worker's task covered by its process's lease is confirmed for what is left of that
    /// lease), and a margin sized for the first TTL would put the deadline before the
    /// confirmation itself. A worker beating twice a second lost every task that way.
    pub fn at(&self) -> Instant {
        let (sent, ttl) = *self.lock();
        let valid_until = sent + ttl;
        valid_until
            .checked_sub(self.margin.min(ttl / 2))
            .unwrap_or(valid_until)
    }

    /// Whether the deadline has passed.
    pub fn passed(&self) -> bool {
        Instant::now() >= self.at()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Instant, Duration)> {
        self.confirmed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_confirmation_shorter_than_the_margin_keeps_half_its_ttl() {
        let start = Instant::now();
        let ttl = Duration::from_secs(30);
        let deadline = LeaseDeadline::new(start, ttl, LeaseDeadline::default_margin(ttl));
        assert_eq!(deadline.at(), start + Duration::from_secs(28));
        // What is left of a process's lease, shorter than the 2 s margin of the claim's TTL.
        let beat = start + Duration::from_millis(500);
        deadline.confirm(beat, Some(Duration::from_millis(1400)));
        assert_eq!(deadline.at(), beat + Duration::from_millis(700));
    }

    #[tokio::test]
    async fn the_deadline_counts_from_the_send_instant_and_moves_only_forward() {
        let start = Instant::now();
        let deadline = LeaseDeadline::new(start, Duration::from_secs(30), Duration::from_secs(2));
        assert_eq!(deadline.at(), start + Duration::from_secs(28));
        deadline.confirm(
            start + Duration::from_secs(15),
            Some(Duration::from_secs(30)),
        );
        assert_eq!(deadline.at(), start + Duration::from_secs(43));
        assert_eq!(deadline.confirmed(), start + Duration::from_secs(15));
        // A late answer to an older request.
        deadline.confirm(
            start + Duration::from_secs(5),
            Some(Duration::from_secs(30)),
        );
        assert_eq!(deadline.at(), start + Duration::from_secs(43));
        // A renewal that changed the TTL.
        deadline.confirm(
            start + Duration::from_secs(20),
            Some(Duration::from_secs(10)),
        );
        assert_eq!(deadline.at(), start + Duration::from_secs(28));
        // An answer that did not say: the TTL last confirmed holds.
        deadline.confirm(start + Duration::from_secs(21), None);
        assert_eq!(deadline.at(), start + Duration::from_secs(29));
        assert!(!deadline.passed());
    }

    #[test]
    fn the_default_margin_is_a_tenth_of_the_ttl_within_bounds() {
        let margin = |ms| LeaseDeadline::default_margin(Duration::from_millis(ms)).as_millis();
        assert_eq!(margin(5_000), 500);
        assert_eq!(margin(30_000), 2_000);
        assert_eq!(margin(600), 100);
    }
}
