//! The queues this replica's claims last found without limits: what the claim round
//! ([`crate::tasks`]' `limits` and `claim` modules) learns, kept for the next claim.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

/// The queues this replica's last claim of each found without limits. A claim group that
/// carries completions locks a limited queue's row only once they are judged, since judging may
/// wait for lease-service and for task rows, and every claim of the queue would wait for its
/// row meanwhile; a queue without limits has no row to hold (its claims take only a share lock
/// on the table, which nothing but a change of limits waits for), so its claims lock beside
/// lease-service's check and save a round trip. Knowing wrongly costs only time: a queue given
/// limits since is locked early once, holding its row through the check, and either way its
/// room is counted after its lock.
#[derive(Debug, Clone, Default)]
pub struct Unlimited(Arc<Mutex<HashSet<String>>>);

/// How many queues [`Unlimited`] remembers; past it, it forgets them all (a replica that claims
/// from more queues than this locks late, as if it knew none).
const UNLIMITED_KEPT: usize = 10_000;

impl Unlimited {
    /// Whether the last claim of `queue` found it without limits.
    pub fn known(&self, queue: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(queue)
    }

    /// What a claim of `queue` found.
    pub fn learn(&self, queue: &str, unlimited: bool) {
        let mut known = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if !unlimited {
            known.remove(queue);
        } else if !known.contains(queue) {
            if known.len() >= UNLIMITED_KEPT {
                known.clear();
            }
            known.insert(queue.to_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_is_known_unlimited_until_a_claim_finds_limits() {
        let unlimited = Unlimited::default();
        assert!(!unlimited.known("q"), "nothing is known before a claim");
        unlimited.learn("q", true);
        assert!(unlimited.known("q"));
        assert!(!unlimited.known("other"));
        unlimited.learn("q", false);
        assert!(!unlimited.known("q"), "limits found are remembered at once");
    }

    #[test]
    fn the_queues_known_unlimited_are_bounded() {
        let unlimited = Unlimited::default();
        for n in 0..UNLIMITED_KEPT {
            unlimited.learn(&format!("q{n}"), true);
        }
        assert!(unlimited.known("q0"));
        unlimited.learn("one more", true);
        assert!(unlimited.known("one more"));
        assert!(
            !unlimited.known("q0"),
            "past the bound, the rest is forgotten"
        );
        let kept = unlimited
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        assert_eq!(kept, 1);
    }
}
