//! The worker process's presence: while it lives it beats (`PUT /api/workers/{id}`), and
//! task-service keeps a liveness lease `worker:<id>` in lease-service for it, carrying its host,
//! version, queue, slots, busy slots and tasks done. Three missed beats and its lease lapses:
//! operators see it as lost. On a clean stop it says so (`DELETE /api/workers/{id}`) and shows
//! as stopped at once. A change of its busy slots brings the next beat forward (at most one a
//! second), so the picture follows the work. A beat that fails only costs the picture: tasks
//! never wait on it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use leasehold::api::Secret;
use leasehold::task_client::{CallError, TaskClient};
use leasehold::workers::{MAX_TTL_SECONDS, WorkerBeat, WorkerGone, WorkerInfo};
use tokio_util::sync::CancellationToken;

use crate::config::Settings;

/// The longest between two beats, whatever the heartbeat interval: task-service refuses a
/// liveness lease longer than [`MAX_TTL_SECONDS`].
const MAX_BEAT_INTERVAL: Duration = Duration::from_secs(60);
/// Beats a process may miss before it counts as lost.
const MISSED_BEATS: u32 = 3;

/// The soonest a change of load brings the next beat forward to, after the last one.
const MIN_BEAT_SPACING: Duration = Duration::from_secs(1);

/// How busy the process is, kept by the claim loop and read by each beat.
#[derive(Debug, Default)]
pub(crate) struct Load {
    busy: AtomicU32,
    pub(crate) done: AtomicU64,
    /// Signalled when the busy slots change, so the picture follows within a second or so
    /// rather than a heartbeat interval.
    changed: tokio::sync::Notify,
}

impl Load {
    fn busy(&self) -> u32 {
        self.busy.load(Ordering::Relaxed)
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
    let ttl = (every * MISSED_BEATS).min(Duration::from_secs(MAX_TTL_SECONDS.unsigned_abs()));
    let ttl_seconds = i64::try_from(ttl.as_secs().max(1)).unwrap_or(1);
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
            ttl_seconds,
            fence,
            secret: Some(secret.clone()),
        };
        match client.worker_beat(id, &beat).await {
            Ok(lease) => {
                fence = Some(lease.fence);
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
                return;
            }
            Err(err) => {
                tracing::warn!(error = %err, "worker beat refused; trying again at the next");
                fence = None;
            }
        }
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
