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
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::config::Settings;
use crate::runner::Ctx;

/// Retries of heartbeats, completions and failures: from this...
const RETRY_MIN: Duration = Duration::from_millis(100);
/// ...up to this (or half the heartbeat interval, if shorter).
const RETRY_MAX: Duration = Duration::from_secs(2);

/// What the runner and the heartbeat loop know about a task's lease.
pub(crate) struct LeaseState {
    /// The task lease's TTL, which every accepted claim or heartbeat confirms anew.
    ttl: Duration,
    /// Counted from the send instant of the last accepted claim or heartbeat.
    deadline: LeaseDeadline,
    reason: Mutex<Option<String>>,
    /// Cancelled when the lease is lost.
    pub(crate) lost: CancellationToken,
}

impl LeaseState {
    pub(crate) fn new(ttl: Duration, margin: Duration, claim_sent: Instant) -> Self {
        Self {
            ttl,
            deadline: LeaseDeadline::new(claim_sent, ttl, margin),
            reason: Mutex::new(None),
            lost: CancellationToken::new(),
        }
    }

    pub(crate) fn confirmed(&self) -> Instant {
        self.deadline.confirmed()
    }

    /// The instant after which the lease is treated as lost unless confirmed again.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline.at()
    }

    pub(crate) fn confirm(&self, sent: Instant) {
        self.deadline.confirm(sent, self.ttl);
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

    pub(crate) fn reason(&self) -> String {
        self.reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .unwrap_or_else(|| "lease lost".to_owned())
    }
}

/// Heartbeats a task until `stop`, or until its lease is lost (refused, or its deadline passed).
pub(crate) async fn keep_alive(
    ctx: Arc<Ctx>,
    id: i64,
    fence: Option<i64>,
    lease: Arc<LeaseState>,
    stop: CancellationToken,
    pause: Option<(Instant, Instant)>,
) {
    let settings = &ctx.settings;
    let processor = settings.worker_id.as_str();
    let mut backoff = retry_backoff(settings);
    let mut next = lease.confirmed() + settings.heartbeat_interval;
    let mut last_error: Option<String> = None;
    let mut paused = false;
    let unconfirmed = |last_error: &Option<String>| match last_error {
        Some(err) => format!("no heartbeat confirmed before the lease deadline; last error: {err}"),
        None => "no heartbeat confirmed before the lease deadline".to_owned(),
    };
    loop {
        let deadline = lease.deadline();
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = sleep_until(deadline) => {
                lease.lose(unconfirmed(&last_error));
                return;
            }
            () = sleep_until(next) => {}
        }
        if let Some((from, until)) = pause {
            let now = Instant::now();
            if now >= from && now < until {
                if !paused {
                    paused = true;
                    tracing::warn!(
                        task_id = id,
                        fence,
                        pause_seconds = (until - now).as_secs_f64(),
                        "chaos: skipping heartbeats of task {id}"
                    );
                }
                next = until;
                continue;
            }
        }
        let sent = Instant::now();
        let result = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = sleep_until(deadline) => {
                lease.lose(unconfirmed(&last_error));
                return;
            }
            result = ctx.client.heartbeat(id, processor, fence) => result,
        };
        match result {
            Ok(task) => {
                ctx.metrics.heartbeats.with_label_values(&["ok"]).inc();
                lease.confirm(sent);
                backoff.reset();
                last_error = None;
                next = sent + settings.heartbeat_interval;
                tracing::debug!(
                    task_id = id,
                    fence,
                    must_heart_beat_before = ?task.and_then(|t| t.must_heart_beat_before),
                    "heartbeat accepted"
                );
            }
            Err(err) if err.is_loss() => {
                ctx.metrics.heartbeats.with_label_values(&["refused"]).inc();
                lease.lose(format!("heartbeat refused: {err}"));
                return;
            }
            Err(err) => {
                ctx.metrics.heartbeats.with_label_values(&["error"]).inc();
                let left = lease.deadline().saturating_duration_since(Instant::now());
                tracing::warn!(
                    task_id = id,
                    fence,
                    error = %err,
                    deadline_in_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
                    "heartbeat of task {id} failed; retrying until the lease deadline"
                );
                last_error = Some(err.to_string());
                next = Instant::now() + backoff.next_delay();
            }
        }
    }
}

pub(crate) fn retry_backoff(settings: &Settings) -> Backoff {
    let max = (settings.heartbeat_interval / 2).min(RETRY_MAX);
    Backoff::new(RETRY_MIN.min(max), max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_lease_deadline_moves_with_confirmations_only_forward() {
        let start = Instant::now();
        let lease = LeaseState::new(Duration::from_secs(30), Duration::from_secs(2), start);
        assert_eq!(lease.deadline(), start + Duration::from_secs(28));
        lease.confirm(start + Duration::from_secs(15));
        assert_eq!(lease.deadline(), start + Duration::from_secs(43));
        lease.confirm(start + Duration::from_secs(5)); // a late answer to an older heartbeat
        assert_eq!(lease.deadline(), start + Duration::from_secs(43));
        lease.lose("first".to_owned());
        lease.lose("second".to_owned());
        assert!(lease.lost.is_cancelled());
        assert_eq!(lease.reason(), "first");
    }
}
