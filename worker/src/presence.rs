//! The worker process's presence: while it lives it beats (`PUT /api/workers/{id}`), and
//! task-service keeps a liveness lease `worker:<id>` in lease-service for it, carrying its host,
//! version, queue, slots, busy slots and tasks done. Three missed beats and its lease lapses:
//! operators see it as lost. On a clean stop it says so (`DELETE /api/workers/{id}`) and shows
//! as stopped at once. A change of its busy slots brings the next beat forward (at most one a
//! second), so the picture follows the work. The same lease covers the tasks the process claims
//! once a beat was answered (their claims name it): its tasks take no lease of their own, and
//! if the lease lapses (the process paused past its TTL) they are lost to it together. A beat
//! that fails only costs that: claims then take a lease per task, and tasks never wait on it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use leasehold::api::Secret;
use leasehold::task_client::{CallError, TaskClient};
use leasehold::workers::{ClaimantLease, MAX_TTL_SECONDS, WorkerBeat, WorkerGone, WorkerInfo};
use tokio_util::sync::CancellationToken;

use crate::config::Settings;

/// The longest between two beats, whatever the heartbeat interval: task-service refuses a
/// liveness lease longer than [`MAX_TTL_SECONDS`].
const MAX_BEAT_INTERVAL: Duration = Duration::from_secs(60);
/// Beats a process may miss before it counts as lost (unless the task lease TTL is longer).
const MISSED_BEATS: u32 = 3;

/// The soonest a change of load brings the next beat forward to, after the last one.
const MIN_BEAT_SPACING: Duration = Duration::from_secs(1);

/// How busy the process is, kept by the claim loop and read by each beat.
#[derive(Debug, Default)]
pub(crate) struct Load {
    busy: AtomicU32,
    pub(crate) done: AtomicU64,
    /// The fence of the liveness lease the last answered beat renewed or took (0: none known):
    /// claims name it, so that the tasks they get are covered by it, not by a lease each.
    lease_fence: AtomicI64,
    /// The task lease TTL task-service claims with (`leaseTtlMs`, 0 until a claim answered):
    /// the liveness lease, which covers the tasks, lasts at least as long, so that the process's
    /// tasks are as safe from a few missed beats as a task under a lease of its own is from a
    /// few missed heartbeats.
    task_lease_ttl_ms: AtomicU64,
    /// Set once the first beat was answered or failed: the claim loop waits for it, so that a
    /// process's claims are covered by its lease from the first one, not by chance.
    first_beat_over: AtomicBool,
    first_beat: tokio::sync::Notify,
    /// Signalled when the busy slots change, so the picture follows within a second or so
    /// rather than a heartbeat interval.
    changed: tokio::sync::Notify,
}

impl Load {
    fn busy(&self) -> u32 {
        self.busy.load(Ordering::Relaxed)
    }

    /// The process's liveness lease for a claim to name, once a beat was answered.
    pub(crate) fn claimant_lease(&self, id: &str) -> Option<ClaimantLease> {
        let fence = self.lease_fence.load(Ordering::Relaxed);
        (fence > 0).then(|| ClaimantLease {
            id: id.to_owned(),
            fence,
        })
    }

    /// Waits until the first beat was answered or failed.
    pub(crate) async fn first_beat_over(&self) {
        loop {
            let notified = self.first_beat.notified();
            if self.first_beat_over.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }

    fn end_first_beat(&self) {
        self.first_beat_over.store(true, Ordering::Release);
        self.first_beat.notify_waiters();
    }

    /// Keeps the task lease TTL a claim answered with.
    pub(crate) fn learn_task_lease_ttl(&self, ttl: Duration) {
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        self.task_lease_ttl_ms.store(ms, Ordering::Relaxed);
    }

    /// The liveness lease's TTL in whole seconds: `missed` beats of `every`, and at least the
    /// task lease TTL claims answered with, within what task-service grants.
    fn lease_ttl_seconds(&self, every: Duration, missed: u32) -> i64 {
        let task_ttl = Duration::from_millis(self.task_lease_ttl_ms.load(Ordering::Relaxed));
        let ttl = (every * missed)
            .max(task_ttl)
            .min(Duration::from_secs(MAX_TTL_SECONDS.unsigned_abs()));
        i64::try_from(ttl.as_secs_f64().ceil() as u64)
            .unwrap_or(MAX_TTL_SECONDS)
            .max(1)
    }

    /// task-service refused a claim under the process's lease as no longer held (it lapsed
    /// while the process could not beat, or an operator revoked it): claims go without it, each
    /// task under a lease of its own, until the next beat, asked for now, takes the lease anew.
    pub(crate) fn lease_refused(&self) {
        self.lease_fence.store(0, Ordering::Relaxed);
        self.changed.notify_one();
    }

    pub(crate) fn set_busy(&self, busy: usize) {
        let busy = u32::try_from(busy).unwrap_or(u32::MAX);
        if self.busy.swap(busy, Ordering::Relaxed) != busy {
            self.changed.notify_one();
        }
    }
}

/// Beats every heartbeat interval (at most a minute) until `stop`, then says the process is
/// gone.
pub(crate) async fn announce(
    client: Arc<TaskClient>,
    settings: Settings,
    load: Arc<Load>,
    stop: CancellationToken,
) {
    let every = settings.heartbeat_interval.min(MAX_BEAT_INTERVAL);
    let host = leasehold::identity::host_name("unknown");
    let concurrency = u32::try_from(settings.concurrency).unwrap_or(u32::MAX);
    let id = settings.worker_id.as_str();
    // This run's own name: the lease's holder, so another process under the same id is refused.
    let instance = leasehold::identity::instance_id(&host);
    // This run's proof of holding, sent at every beat: every acquisition of the lease keeps it,
    // so a beat whose answer is lost (a replica killed or paused mid-beat) leaves nothing the
    // next beat cannot prove. A task-service that answers with a secret of lease-service's (one
    // from before processes brought their own) has it replaced.
    let mut secret = Secret::random();
    // The fence of the lease the last answered beat renewed or took.
    let mut fence: Option<i64> = None;
    loop {
        let beat = WorkerBeat {
            instance: instance.clone(),
            info: WorkerInfo {
                host: host.clone(),
                version: env!("CARGO_PKG_VERSION").to_owned(),
                queue: settings.queue.clone(),
                concurrency,
                busy: load.busy().min(concurrency),
                done: load.done.load(Ordering::Relaxed),
            },
            ttl_seconds: load.lease_ttl_seconds(every, MISSED_BEATS),
            fence,
            secret: Some(secret.clone()),
        };
        let answer = client.worker_beat(id, &beat).await;
        match answer {
            Ok(lease) => {
                fence = Some(lease.fence);
                load.lease_fence.store(lease.fence, Ordering::Relaxed);
                if let Some(given) = lease.secret {
                    secret = given;
                }
            }
            Err(err @ CallError::Transient(_)) => {
                tracing::debug!(error = %err, "worker beat failed; trying again at the next");
            }
            // A task-service from before worker processes were known: nothing to announce to.
            Err(CallError::Refused {
                status: 404 | 405, ..
            }) => {
                tracing::info!("task-service does not know worker processes; not announcing");
                load.end_first_beat();
                return;
            }
            Err(err) => {
                tracing::warn!(error = %err, "worker beat refused; trying again at the next");
                fence = None;
                load.lease_fence.store(0, Ordering::Relaxed);
            }
        }
        load.end_first_beat();
        let beaten = tokio::time::Instant::now();
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(every) => {}
            () = load.changed.notified() => {
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep_until(beaten + MIN_BEAT_SPACING) => {}
                }
            }
        }
    }
    // Claims from here on take a lease per task: this one is about to end.
    load.lease_fence.store(0, Ordering::Relaxed);
    if let Some(fence) = fence {
        let gone = WorkerGone {
            instance,
            fence,
            secret: Some(secret),
        };
        if let Err(err) = client.worker_gone(id, &gone).await {
            tracing::debug!(error = %err, "could not say the worker stopped; its lease will lapse");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_liveness_lease_lasts_three_beats_and_at_least_a_task_lease() {
        let load = Load::default();
        let beat = Duration::from_millis(500);
        // Three beats of half a second, rounded up.
        assert_eq!(load.lease_ttl_seconds(beat, MISSED_BEATS), 2);
        load.learn_task_lease_ttl(Duration::from_secs(30));
        assert_eq!(load.lease_ttl_seconds(beat, MISSED_BEATS), 30);
        assert_eq!(
            load.lease_ttl_seconds(Duration::from_secs(60), MISSED_BEATS),
            180
        );
        load.learn_task_lease_ttl(Duration::from_secs(3600));
        assert_eq!(load.lease_ttl_seconds(beat, MISSED_BEATS), MAX_TTL_SECONDS);
    }
}
