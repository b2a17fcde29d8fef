//! The heartbeat loop and the lease state it keeps: while a task runs, its lease is renewed every
//! heartbeat interval, and the worker's own view of how long the lease holds lives in one
//! [`LeaseState`] shared by the loop and the task's run. The loop is a separate task beside the
//! handler rather than part of it so that a handler that blocks, or ignores its token, can neither
//! stop the heartbeats nor delay the moment the lease counts as lost; and the state is shared
//! rather than messaged so that the task's run can check the deadline itself right before it sends
//! an answer (after a pause of the whole process the loop may not have run yet). The retry pace of
//! heartbeats is also the pace of completions and failures, so it is defined here once.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold::LeaseDeadline;
use leasehold::keep_confirmed::{Confirmation, Ended, keep_confirmed};
use leasehold::retry::Backoff;
use leasehold::tasks::Task;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::ctx::Ctx;

/// Retries of heartbeats, completions and failures: from this...
const RETRY_MIN: Duration = Duration::from_millis(100);
/// ...up to this (or half the heartbeat interval, if shorter).
const RETRY_MAX: Duration = Duration::from_secs(2);

/// The sample's lease length, counted on when a task-service older than the `leaseTtlMs` field
/// answers a claim without it.
pub(crate) const FALLBACK_LEASE_TTL: Duration = Duration::from_secs(30);

/// The TTL of a claimed task's lease, as task-service's answer gives it.
pub(crate) fn lease_ttl(task: &Task) -> Duration {
    task.lease_ttl()
        .filter(|ttl| !ttl.is_zero())
        .unwrap_or_else(|| {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!(
                    fallback_seconds = FALLBACK_LEASE_TTL.as_secs(),
                    "task-service's claim answer carries no lease TTL (leaseTtlMs; an older \
                     task-service): counting each lease as the sample's 30 s"
                );
            });
            FALLBACK_LEASE_TTL
        })
}

/// What the runner and the heartbeat loop know about a task's lease.
pub(crate) struct LeaseState {
    /// Counted from the send instant of the last accepted claim or heartbeat, by the last TTL
    /// task-service's answers gave.
    deadline: LeaseDeadline,
    /// Between heartbeats: the configured interval, or half the TTL if that is shorter, so that
    /// a failed heartbeat is retried for at least another half TTL before the lease runs out.
    interval: Duration,
    reason: Mutex<Option<String>>,
    /// The loss was task-service's answer (409), not this worker's own deadline.
    refused: std::sync::atomic::AtomicBool,
    /// Cancelled when the lease is lost.
    pub(crate) lost: CancellationToken,
}

impl LeaseState {
    /// The lease of a task whose claim, sent at `claim_sent`, was answered with a lease of `ttl`.
    pub(crate) fn new(ttl: Duration, configured_interval: Duration, claim_sent: Instant) -> Self {
        Self {
            deadline: LeaseDeadline::new(claim_sent, ttl, LeaseDeadline::default_margin(ttl)),
            interval: configured_interval.min(ttl / 2),
            reason: Mutex::new(None),
            refused: std::sync::atomic::AtomicBool::new(false),
            lost: CancellationToken::new(),
        }
    }

    /// The instant after which the lease is treated as lost unless confirmed again.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline.at()
    }

    /// How long to wait between heartbeats of this task.
    pub(crate) fn interval(&self) -> Duration {
        self.interval
    }

    pub(crate) fn lose(&self, reason: String) {
        {
            let mut slot = self.reason.lock().unwrap_or_else(PoisonError::into_inner);
            if slot.is_none() {
                *slot = Some(reason);
            }
        }
        self.lost.cancel();
    }

    /// Lost because task-service refused a heartbeat (the claim is no longer this worker's).
    pub(crate) fn lose_refused(&self, reason: String) {
        self.refused
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.lose(reason);
    }

    /// Whether task-service refused the claim, rather than this worker giving it up when no
    /// heartbeat was confirmed in time.
    pub(crate) fn was_refused(&self) -> bool {
        self.refused.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn reason(&self) -> String {
        self.reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .unwrap_or_else(|| "lease lost".to_owned())
    }
}

/// Heartbeats a task until `stop`, or until its lease is lost (refused, or its deadline passed):
/// the one keep-alive loop ([`keep_confirmed`]), with task-service's heartbeat as its call, and
/// the chaos `pause` as calls postponed.
pub(crate) async fn keep_alive(
    ctx: Arc<Ctx>,
    id: i64,
    fence: Option<i64>,
    lease: Arc<LeaseState>,
    stop: CancellationToken,
    pause: Option<(Instant, Instant)>,
) {
    let (ctx, state): (&Ctx, &LeaseState) = (&ctx, &lease);
    let processor = ctx.settings.worker_id.as_str();
    let mut paused = false;
    let beat = move || {
        let postponed = pause.and_then(|(from, until)| {
            let now = Instant::now();
            (now >= from && now < until).then(|| {
                if !paused {
                    paused = true;
                    tracing::warn!(
                        task_id = id,
                        fence,
                        pause_seconds = (until - now).as_secs_f64(),
                        "chaos: skipping heartbeats of task {id}"
                    );
                }
                until
            })
        });
        async move {
            if let Some(until) = postponed {
                return Confirmation::Postponed(until);
            }
            match ctx.client.heartbeat(id, processor, fence).await {
                Ok(task) => {
                    ctx.metrics.heartbeats.with_label_values(&["ok"]).inc();
                    let ttl = task.as_ref().and_then(Task::lease_ttl);
                    tracing::debug!(
                        task_id = id,
                        fence,
                        must_heart_beat_before = ?task.and_then(|t| t.must_heart_beat_before),
                        "heartbeat accepted"
                    );
                    Confirmation::Confirmed { ttl }
                }
                Err(err) if err.is_loss() => {
                    ctx.metrics.heartbeats.with_label_values(&["refused"]).inc();
                    Confirmation::Lost(err)
                }
                Err(err) => {
                    ctx.metrics.heartbeats.with_label_values(&["error"]).inc();
                    let left = state.deadline().saturating_duration_since(Instant::now());
                    tracing::warn!(
                        task_id = id,
                        fence,
                        error = %err,
                        deadline_in_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
                        "heartbeat of task {id} failed; retrying until the lease deadline"
                    );
                    Confirmation::Failed(err.to_string())
                }
            }
        }
    };
    let interval = lease.interval();
    match keep_confirmed(
        &lease.deadline,
        interval,
        retry_backoff(interval),
        &stop,
        beat,
    )
    .await
    {
        Ended::Stopped => {}
        Ended::Lost(err) => lease.lose_refused(format!("heartbeat refused: {err}")),
        Ended::Unconfirmed {
            last_error: Some(err),
        } => lease.lose(format!(
            "no heartbeat confirmed before the lease deadline; last error: {err}"
        )),
        Ended::Unconfirmed { last_error: None } => {
            lease.lose("no heartbeat confirmed before the lease deadline".to_owned());
        }
    }
}

/// Retries of a task's heartbeats and final answer, paced by its heartbeat `interval`.
pub(crate) fn retry_backoff(interval: Duration) -> Backoff {
    let max = (interval / 2).min(RETRY_MAX);
    Backoff::new(RETRY_MIN.min(max), max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_lease_deadline_moves_with_confirmations_only_forward() {
        let start = Instant::now();
        let ttl = Duration::from_secs(30);
        let lease = LeaseState::new(ttl, Duration::from_secs(15), start);
        assert_eq!(lease.deadline(), start + Duration::from_secs(28));
        lease
            .deadline
            .confirm(start + Duration::from_secs(15), Some(ttl));
        assert_eq!(lease.deadline(), start + Duration::from_secs(43));
        // A late answer to an older heartbeat.
        lease
            .deadline
            .confirm(start + Duration::from_secs(5), Some(ttl));
        assert_eq!(lease.deadline(), start + Duration::from_secs(43));
        lease.lose("first".to_owned());
        lease.lose("second".to_owned());
        assert!(lease.lost.is_cancelled());
        assert_eq!(lease.reason(), "first");
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_and_the_pace_follow_the_ttl_task_service_gives() {
        let start = Instant::now();
        // task-service's 4 s lease under a worker configured to beat every 15 s.
        let lease = LeaseState::new(Duration::from_secs(4), Duration::from_secs(15), start);
        assert_eq!(lease.interval(), Duration::from_secs(2));
        assert_eq!(lease.deadline(), start + Duration::from_millis(3_600));
        // A heartbeat answer that says the renewed lease lasts 10 s.
        lease.deadline.confirm(
            start + Duration::from_secs(2),
            Some(Duration::from_secs(10)),
        );
        // (The margin stays the one the claim's TTL set: 400 ms.)
        assert_eq!(lease.deadline(), start + Duration::from_millis(11_600));
        // An answer without the field keeps the last TTL known.
        lease.deadline.confirm(start + Duration::from_secs(4), None);
        assert_eq!(lease.deadline(), start + Duration::from_millis(13_600));
        // A configured interval shorter than half the TTL is kept.
        let fast = LeaseState::new(Duration::from_secs(30), Duration::from_secs(1), start);
        assert_eq!(fast.interval(), Duration::from_secs(1));
    }
}
