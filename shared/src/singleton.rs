//! Exclusive jobs (seed 002's exclusive scheduled job): run a job on exactly one replica of
//! many at a time, and let another take over when that one dies, pauses or shuts down.
//!
//! Every replica runs a [`Singleton`] for the same resource. The one that acquires the lease
//! runs the job under a [`LeaseGuard`]; the others stand by, retrying every `retry_interval`
//! (with jitter, so they do not stampede). When the guard signals loss, the job's future is
//! dropped at once and the replica goes back to standing by; on shutdown it releases the lease
//! so a standby takes over at its next retry instead of after the TTL.
//!
//! A job must not trust that it still leads just because it is running: a paused process runs
//! its own code before anything else notices the pause. Check [`LeaseHandle::is_held`] right
//! before each action, and hand [`LeaseHandle::fence`] to whatever you write to.

use std::future::Future;
use std::time::Duration;

use rand::Rng;
use tokio_util::sync::CancellationToken;

use crate::lease_client::{LeaseClient, LeaseError};
use crate::lease_guard::{GuardConfig, LeaseGuard, LeaseHandle, LeaseLost};

/// A change of leadership, for metrics and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SingletonEvent {
    /// This replica now leads, under this fence.
    Acquired { fence: i64 },
    /// This replica lost the lease while leading.
    Lost { fence: i64, reason: LeaseLost },
    /// This replica gave the lease up (shutdown, or the job ended).
    Released { fence: i64 },
}

type Observer = Box<dyn FnMut(&SingletonEvent) + Send>;

/// Why a term of leadership ended.
enum Ended {
    Lost(LeaseLost),
    Shutdown,
    JobReturned,
}

/// Runs a job on whichever replica holds the lease `config.resource`.
pub struct Singleton {
    client: LeaseClient,
    guard: GuardConfig,
    retry_interval: Duration,
    observer: Option<Observer>,
}

impl std::fmt::Debug for Singleton {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Singleton")
            .field("guard", &self.guard)
            .field("retry_interval", &self.retry_interval)
            .finish_non_exhaustive()
    }
}

impl Singleton {
    /// `guard` names the resource, this replica (the holder) and the TTL; standbys retry every
    /// `retry_interval`, so a dead leader is replaced within its TTL plus one retry interval.
    pub fn new(client: LeaseClient, guard: GuardConfig, retry_interval: Duration) -> Self {
        Self {
            client,
            guard,
            retry_interval,
            observer: None,
        }
    }

    /// Calls `observer` on every change of leadership.
    pub fn on_event(mut self, observer: impl FnMut(&SingletonEvent) + Send + 'static) -> Self {
        self.observer = Some(Box::new(observer));
        self
    }

    fn notify(&mut self, event: SingletonEvent) {
        tracing::info!(resource = %self.guard.resource, holder = %self.guard.holder, ?event, "leadership");
        if let Some(observer) = self.observer.as_mut() {
            observer(&event);
        }
    }

    /// Contends for the lease until `shutdown` is cancelled; while it leads, runs
    /// `job(handle)`. If the job returns, the lease is released and the job runs again at the
    /// next acquisition. Fails only for a configuration that can never hold a lease.
    pub async fn run<F, Fut>(
        mut self,
        shutdown: CancellationToken,
        mut job: F,
    ) -> Result<(), LeaseError>
    where
        F: FnMut(LeaseHandle) -> Fut,
        Fut: Future<Output = ()>,
    {
        loop {
            if shutdown.is_cancelled() {
                return Ok(());
            }
            match LeaseGuard::acquire(&self.client, self.guard.clone()).await {
                Ok(guard) => {
                    let fence = guard.fence();
                    self.notify(SingletonEvent::Acquired { fence });
                    let lost = guard.lost();
                    let ended = tokio::select! {
                        biased;
                        reason = lost => Ended::Lost(reason),
                        () = shutdown.cancelled() => Ended::Shutdown,
                        () = job(guard.handle()) => Ended::JobReturned,
                    };
                    // A job that returned because the lease is in doubt (it checks `is_held`
                    // before acting) lost it, even if the renewal task has not said so yet.
                    let ended = match ended {
                        Ended::JobReturned if !guard.is_held() => Ended::Lost(
                            guard
                                .loss_reason()
                                .unwrap_or(LeaseLost::Unconfirmed { last_error: None }),
                        ),
                        other => other,
                    };
                    match ended {
                        // Stand by like everyone else: re-contending at once could re-acquire a
                        // lease that is in doubt, reentrantly, under the same fence.
                        Ended::Lost(reason) => {
                            drop(guard);
                            self.notify(SingletonEvent::Lost { fence, reason });
                        }
                        Ended::Shutdown | Ended::JobReturned => {
                            if let Err(err) = guard.release().await {
                                tracing::warn!(error = %err, "could not release the singleton lease; it will expire");
                            }
                            self.notify(SingletonEvent::Released { fence });
                        }
                    }
                }
                Err(err @ LeaseError::InvalidConfig(_)) => return Err(err),
                Err(LeaseError::Held { .. }) => {}
                Err(err) => {
                    tracing::warn!(resource = %self.guard.resource, error = %err, "cannot contend for the singleton lease")
                }
            }
            let pause = self
                .retry_interval
                .mul_f64(rand::rng().random_range(0.8..1.2));
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// The exclusive scheduled job: while this replica leads, `tick` runs every `every`
    /// (measured from the start of one tick to the start of the next), and never after the lease
    /// is in doubt.
    pub async fn run_periodic<F, Fut>(
        self,
        shutdown: CancellationToken,
        every: Duration,
        tick: F,
    ) -> Result<(), LeaseError>
    where
        F: FnMut(LeaseHandle) -> Fut,
        Fut: Future<Output = ()>,
    {
        // One term runs at a time, so the lock is never contended; it only lets every term's
        // future own the same `tick`.
        let tick = std::sync::Arc::new(tokio::sync::Mutex::new(tick));
        self.run(shutdown, move |lease| {
            let mut schedule = tokio::time::interval(every);
            schedule.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let tick = tick.clone();
            async move {
                let mut tick = tick.lock().await;
                loop {
                    schedule.tick().await;
                    if !lease.is_held() {
                        return;
                    }
                    tick(lease.clone()).await;
                }
            }
        })
        .await
    }
}
