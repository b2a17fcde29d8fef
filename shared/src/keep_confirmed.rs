//! The one loop that keeps a lease confirmed: the lease guard's renewals
//! ([`crate::lease_guard`]) and the worker's task heartbeats both run it, each with its own call
//! and its own retry pace.
//!
//! The rule it keeps: confirm on the interval, counted from the send instant of the last
//! confirmed request; after a transient failure, try again on the caller's backoff; end the
//! moment the loss is certain (the service refused), and end unconfirmed once the conservative
//! [`LeaseDeadline`] passes, even with a request in flight: an answer that comes later cannot
//! make up for the time the lease may already have been someone else's.

use std::future::Future;
use std::time::Duration;

use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::deadline::LeaseDeadline;
use crate::retry::Backoff;

/// What one confirming call came to. `L` is the caller's own account of a loss.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confirmation<L> {
    /// The lease holds: the answer gave its TTL, or did not (the TTL last known then holds).
    Confirmed { ttl: Option<Duration> },
    /// The service refused: the lease is certainly gone.
    Lost(L),
    /// The call settled nothing (timeout, 5xx, unreachable): worth another try before the
    /// deadline.
    Failed(String),
    /// Nothing was sent; the next try is at this instant. A pause is no failure: it neither
    /// grows the backoff nor forgets the last error.
    Postponed(Instant),
}

/// How [`keep_confirmed`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended<L> {
    /// `stop` was cancelled.
    Stopped,
    /// A call said the lease was lost.
    Lost(L),
    /// The deadline passed with no confirmation; the last failure since the last confirmation,
    /// if any.
    Unconfirmed { last_error: Option<String> },
}

/// Keeps the lease behind `deadline` confirmed by calling `confirm` every `interval` (and, after
/// a failure, after each wait of `retries`), until `stop`, a loss, or the deadline.
///
/// Each call's send instant is taken just before `confirm` is called, and a confirmation moves
/// `deadline` from there: the loop is the one writer of `deadline` while it runs.
pub async fn keep_confirmed<L, F, Fut>(
    deadline: &LeaseDeadline,
    interval: Duration,
    retries: Backoff,
    stop: &CancellationToken,
    mut confirm: F,
) -> Ended<L>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Confirmation<L>>,
{
    let mut retries = retries.waits();
    let mut next = deadline.confirmed() + interval;
    let mut last_error: Option<String> = None;
    loop {
        let call = async {
            sleep_until(next).await;
            let sent = Instant::now();
            (sent, confirm().await)
        };
        let (sent, outcome) = tokio::select! {
            biased;
            () = stop.cancelled() => return Ended::Stopped,
            () = sleep_until(deadline.at()) => return Ended::Unconfirmed { last_error },
            done = call => done,
        };
        match outcome {
            Confirmation::Confirmed { ttl } => {
                deadline.confirm(sent, ttl);
                next = sent + interval;
                last_error = None;
                retries.reset();
            }
            Confirmation::Lost(lost) => return Ended::Lost(lost),
            Confirmation::Failed(error) => {
                last_error = Some(error);
                next = Instant::now() + retries.next_delay();
            }
            Confirmation::Postponed(until) => next = until,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use tokio::time::sleep;

    use super::*;

    const TTL: Duration = Duration::from_secs(10);
    const MARGIN: Duration = Duration::from_secs(1);
    const INTERVAL: Duration = Duration::from_secs(3);
    /// How long each call takes to be answered.
    const TRIP: Duration = Duration::from_millis(200);
    const RETRIES: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(400));

    /// One run of the loop: how it ended and when, the instants the calls were made, and the
    /// lease's deadline as the loop left it.
    struct Run {
        start: Instant,
        deadline: LeaseDeadline,
        ended: Ended<&'static str>,
        at: Instant,
        calls: Vec<Instant>,
    }

    /// Runs the loop over a lease of [`TTL`] confirmed at the start, stopped after `stop_after`
    /// if given, with calls that answer after [`TRIP`] what `answer` says for the n-th call
    /// (0-based), or never where it says nothing.
    async fn run(
        stop_after: Option<Duration>,
        answer: impl Fn(usize) -> Option<Confirmation<&'static str>>,
    ) -> Run {
        let start = Instant::now();
        let deadline = LeaseDeadline::new(start, TTL, MARGIN);
        let stop = CancellationToken::new();
        if let Some(after) = stop_after {
            let stopper = stop.clone();
            tokio::spawn(async move {
                sleep(after).await;
                stopper.cancel();
            });
        }
        let calls = RefCell::new(Vec::new());
        let looping = keep_confirmed(&deadline, INTERVAL, RETRIES, &stop, || {
            let n = {
                let mut calls = calls.borrow_mut();
                calls.push(Instant::now());
                calls.len() - 1
            };
            let outcome = answer(n);
            async move {
                sleep(TRIP).await;
                match outcome {
                    Some(outcome) => outcome,
                    None => std::future::pending().await,
                }
            }
        });
        // A loop that would never end fails the test instead of hanging it.
        let ended = tokio::time::timeout(Duration::from_secs(3_600), looping)
            .await
            .expect("the loop never ended");
        Run {
            start,
            at: Instant::now(),
            calls: calls.into_inner(),
            deadline,
            ended,
        }
    }

    fn gaps(calls: &[Instant]) -> Vec<Duration> {
        calls.windows(2).map(|pair| pair[1] - pair[0]).collect()
    }

    fn failed(error: &str) -> Option<Confirmation<&'static str>> {
        Some(Confirmation::Failed(error.to_owned()))
    }

    const CONFIRMED: Option<Confirmation<&'static str>> =
        Some(Confirmation::Confirmed { ttl: None });

    #[tokio::test(start_paused = true)]
    async fn each_confirmation_pushes_the_deadline_from_its_send_instant() {
        // The fourth answer says the lease now lasts twice as long, the later ones say nothing.
        let run = run(Some(Duration::from_secs(61)), |n| {
            Some(Confirmation::Confirmed {
                ttl: (n <= 3).then_some(if n == 3 { 2 * TTL } else { TTL }),
            })
        })
        .await;
        // Held for a minute on a lease of 10 s: only because each beat moved the deadline.
        assert_eq!(run.ended, Ended::Stopped);
        assert_eq!(run.at, run.start + Duration::from_secs(61));
        assert_eq!(run.calls[0], run.start + INTERVAL);
        // The interval counts from each send, not from its answer.
        assert!(gaps(&run.calls).iter().all(|gap| *gap == INTERVAL));
        assert_eq!(run.calls.len(), 20);
        let last = run.calls[run.calls.len() - 1];
        assert_eq!(run.deadline.confirmed(), last);
        assert_eq!(run.deadline.at(), last + 2 * TTL - MARGIN);
    }

    #[tokio::test(start_paused = true)]
    async fn transient_failures_are_retried_until_the_deadline_then_it_ends_unconfirmed() {
        let run = run(None, |n| failed(&format!("failure {n}"))).await;
        assert_eq!(run.at, run.start + TTL - MARGIN);
        // The last call may still have been in flight at the deadline.
        let answered = run
            .calls
            .iter()
            .filter(|call| **call + TRIP < run.at)
            .count();
        assert_eq!(
            run.ended,
            Ended::Unconfirmed {
                last_error: Some(format!("failure {}", answered - 1)),
            }
        );
        assert_eq!(run.calls[0], run.start + INTERVAL);
        // Retried on the backoff (each wait within its ceiling, after the call's trip), not on
        // the interval, and not in a tight loop.
        let gaps = gaps(&run.calls);
        assert!(gaps.len() >= 8, "{gaps:?}");
        assert!(
            gaps.iter()
                .all(|gap| *gap >= TRIP + RETRIES.base / 2 && *gap <= TRIP + RETRIES.max),
            "{gaps:?}"
        );
        assert_eq!(run.deadline.confirmed(), run.start);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_in_flight_at_the_deadline_is_abandoned_and_a_confirmation_forgets_errors() {
        // Failures, a confirmation, then a call that never comes back.
        let run = run(None, |n| match n {
            0..=3 => failed("refused connection"),
            4 => CONFIRMED,
            _ => None,
        })
        .await;
        let calls = &run.calls;
        assert_eq!(calls.len(), 6);
        assert_eq!(calls[5], calls[4] + INTERVAL);
        assert_eq!(run.deadline.confirmed(), calls[4]);
        assert_eq!(run.at, calls[4] + TTL - MARGIN);
        assert_eq!(run.ended, Ended::Unconfirmed { last_error: None });
    }

    #[tokio::test(start_paused = true)]
    async fn a_confirmation_starts_the_backoff_again() {
        // Enough failures to reach the cap, a confirmation, one failure more.
        let run = run(None, |n| match n {
            0..=3 | 5 => failed("timed out"),
            4 => CONFIRMED,
            _ => None,
        })
        .await;
        assert_eq!(run.calls.len(), 7);
        let first_retry = run.calls[6] - run.calls[5];
        assert!(
            first_retry >= TRIP + RETRIES.base / 2 && first_retry <= TRIP + RETRIES.base,
            "{first_retry:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_loss_ends_it_at_once() {
        let run = run(None, |n| match n {
            0 => CONFIRMED,
            1 => failed("timed out"),
            _ => Some(Confirmation::Lost("held by another")),
        })
        .await;
        assert_eq!(run.ended, Ended::Lost("held by another"));
        assert_eq!(run.calls.len(), 3);
        assert_eq!(run.at, run.calls[2] + TRIP);
        assert!(!run.deadline.passed());
    }

    #[tokio::test(start_paused = true)]
    async fn stop_ends_it_even_with_a_call_in_flight() {
        let run = run(Some(INTERVAL + TRIP / 2), |_| None).await;
        assert_eq!(run.ended, Ended::Stopped);
        assert_eq!(run.at, run.start + INTERVAL + TRIP / 2);
        assert_eq!(run.calls, vec![run.start + INTERVAL]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_postponed_call_is_tried_again_then_and_is_no_failure() {
        let resume = Instant::now() + Duration::from_secs(5);
        let run = run(None, |n| match n {
            0 => failed("timed out"),
            1 => Some(Confirmation::Postponed(resume)),
            _ => None,
        })
        .await;
        assert_eq!(run.calls.len(), 3);
        assert_eq!(run.calls[2], resume);
        assert_eq!(run.at, run.start + TTL - MARGIN);
        assert_eq!(
            run.ended,
            Ended::Unconfirmed {
                last_error: Some("timed out".to_owned())
            }
        );
    }
}
