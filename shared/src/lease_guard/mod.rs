//! A lease held in the background: [`LeaseGuard`] renews it and says the moment it is lost;
//! [`with_lease`] runs a future only while the lease is held (seed 001's `async with`).
//!
//! Loss is judged conservatively. lease-service computes a renewal's expiry from the database's
//! clock *after* it receives the request, so the lease is certainly valid until the local
//! monotonic instant at which the last successful renewal was *sent*, plus the TTL. The guard
//! signals loss a safety margin before that instant if no renewal has succeeded since, and at
//! once when lease-service refuses a renewal. A renewal that merely errors (timeout, 5xx,
//! connection refused) is not a loss: the guard retries until the deadline.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::deadline::LeaseDeadline;
use tokio_util::sync::CancellationToken;

use crate::api::{DEFAULT_TTL_SECONDS, ErrorCode, Lease};
use crate::lease_client::{LeaseClient, LeaseError};

mod renewal;
mod scope;

use renewal::{keep_renewed, lease_ttl};
pub use scope::{LeaseScope, with_lease};

/// What to hold and how to keep it.
#[derive(Debug, Clone)]
pub struct GuardConfig {
    pub resource: String,
    pub holder: String,
    /// Lease length; whole seconds (lease-service counts in seconds). Default 30 s.
    pub ttl: Duration,
    /// Time between renewals. Default: a third of the TTL.
    pub renew_interval: Option<Duration>,
    /// How long before the conservative deadline loss is signalled. Default: a tenth of the
    /// TTL, between 100 ms and 2 s.
    pub safety_margin: Option<Duration>,
}

impl GuardConfig {
    pub fn new(resource: impl Into<String>, holder: impl Into<String>) -> Self {
        Self {
            resource: resource.into(),
            holder: holder.into(),
            ttl: Duration::from_secs(DEFAULT_TTL_SECONDS.unsigned_abs()),
            renew_interval: None,
            safety_margin: None,
        }
    }

    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    pub fn renew_interval(mut self, interval: Duration) -> Self {
        self.renew_interval = Some(interval);
        self
    }

    pub fn safety_margin(mut self, margin: Duration) -> Self {
        self.safety_margin = Some(margin);
        self
    }

    /// The effective renewal interval and safety margin, or why they cannot keep the lease.
    fn timings(&self) -> Result<(Duration, Duration), LeaseError> {
        if self.ttl < Duration::from_secs(1) {
            return Err(LeaseError::InvalidConfig(format!(
                "ttl {:?} is shorter than one second",
                self.ttl
            )));
        }
        let interval = self.renew_interval.unwrap_or(self.ttl / 3);
        if interval.is_zero() || interval >= self.ttl {
            return Err(LeaseError::InvalidConfig(format!(
                "renew interval {interval:?} must be positive and shorter than the ttl {:?}",
                self.ttl
            )));
        }
        let margin = self.safety_margin.unwrap_or_else(|| {
            (self.ttl / 10).clamp(Duration::from_millis(100), Duration::from_secs(2))
        });
        if interval + margin >= self.ttl {
            return Err(LeaseError::InvalidConfig(format!(
                "renew interval {interval:?} plus safety margin {margin:?} must be shorter than the ttl {:?}",
                self.ttl
            )));
        }
        Ok((interval, margin))
    }
}

/// Why a guard stopped holding its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseLost {
    /// lease-service refused a renewal: the lease expired, was released, revoked (`code`
    /// `lease_revoked`) or taken over.
    Refused { code: ErrorCode, reason: String },
    /// No renewal succeeded in time (lease-service unreachable or paused); the lease may
    /// already have expired, so it must be treated as gone.
    Unconfirmed { last_error: Option<String> },
}

impl std::fmt::Display for LeaseLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Refused { code, reason } => write!(f, "renewal refused ({code}): {reason}"),
            Self::Unconfirmed {
                last_error: Some(err),
            } => {
                write!(
                    f,
                    "no renewal confirmed before the deadline; last error: {err}"
                )
            }
            Self::Unconfirmed { last_error: None } => {
                write!(f, "no renewal confirmed before the deadline")
            }
        }
    }
}

impl From<LeaseLost> for LeaseError {
    fn from(lost: LeaseLost) -> Self {
        match lost {
            LeaseLost::Refused { code, reason } => LeaseError::Lost { code, reason },
            unconfirmed @ LeaseLost::Unconfirmed { .. } => LeaseError::Lost {
                code: ErrorCode::LeaseUnconfirmed,
                reason: unconfirmed.to_string(),
            },
        }
    }
}

#[derive(Debug)]
struct Shared {
    lease: Mutex<Lease>,
    reason: Mutex<Option<LeaseLost>>,
    lost: CancellationToken,
    /// Until when the lease is certainly held, so that [`LeaseGuard::is_held`] can answer
    /// without waiting for the renewal task to run.
    deadline: LeaseDeadline,
}

impl Shared {
    fn lose(&self, why: LeaseLost) {
        tracing::warn!(resource = %self.lease().resource, reason = %why, "lease lost");
        *self.reason.lock().unwrap_or_else(PoisonError::into_inner) = Some(why);
        self.lost.cancel();
    }

    fn lease(&self) -> Lease {
        self.lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// A held lease, renewed in the background until released, dropped or lost.
#[derive(Debug)]
pub struct LeaseGuard {
    client: LeaseClient,
    shared: Arc<Shared>,
    stop: CancellationToken,
    renewer: Option<JoinHandle<()>>,
}

impl LeaseGuard {
    /// Acquires the lease once (failing with [`LeaseError::Held`] if another holder has it) and
    /// starts renewing it.
    pub async fn acquire(client: &LeaseClient, config: GuardConfig) -> Result<Self, LeaseError> {
        config.timings()?;
        let sent = Instant::now();
        let lease = client
            .acquire(&config.resource, &config.holder, Some(config.ttl))
            .await?;
        Self::start(client.clone(), config, lease, sent)
    }

    /// Like [`LeaseGuard::acquire`], but waits up to `timeout` for the lease to become free.
    pub async fn acquire_with_timeout(
        client: &LeaseClient,
        config: GuardConfig,
        timeout: Duration,
    ) -> Result<Self, LeaseError> {
        config.timings()?;
        client
            .acquire_with_timeout(&config.resource, &config.holder, Some(config.ttl), timeout)
            .await?;
        // That may have taken several tries, and only a single request's send instant is a safe
        // start for the local deadline: confirm with a reentrant acquire, which keeps the fence.
        let sent = Instant::now();
        let lease = client
            .acquire(&config.resource, &config.holder, Some(config.ttl))
            .await?;
        Self::start(client.clone(), config, lease, sent)
    }

    fn start(
        client: LeaseClient,
        config: GuardConfig,
        lease: Lease,
        sent: Instant,
    ) -> Result<Self, LeaseError> {
        let (interval, margin) = config.timings()?;
        let ttl = lease_ttl(&lease);
        let shared = Arc::new(Shared {
            lease: Mutex::new(lease),
            reason: Mutex::new(None),
            lost: CancellationToken::new(),
            deadline: LeaseDeadline::new(sent, ttl, margin),
        });
        let stop = CancellationToken::new();
        let renewer = tokio::spawn(keep_renewed(
            client.clone(),
            shared.clone(),
            stop.clone(),
            interval,
        ));
        Ok(Self {
            client,
            shared,
            stop,
            renewer: Some(renewer),
        })
    }

    /// The lease as of the last successful acquire or renewal.
    pub fn lease(&self) -> Lease {
        self.shared.lease()
    }

    /// The fencing token: pass it to whatever the lease protects.
    pub fn fence(&self) -> i64 {
        self.shared
            .lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .fence
    }

    pub fn is_lost(&self) -> bool {
        self.shared.lost.is_cancelled()
    }

    /// Whether the lease is certainly still held *now*: not lost, and the conservative deadline
    /// not passed. Check it right before acting on the lease: a process that was paused (a GC
    /// pause, SIGSTOP) may run its own code before its renewal task notices the deadline passed.
    pub fn is_held(&self) -> bool {
        self.handle().is_held()
    }

    pub fn loss_reason(&self) -> Option<LeaseLost> {
        self.shared
            .reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A token cancelled the moment the lease is lost (a child: cancelling it affects only it).
    pub fn loss_token(&self) -> CancellationToken {
        self.shared.lost.child_token()
    }

    /// Resolves when the lease is lost, with the reason. Never resolves while it is held.
    pub fn lost(&self) -> impl Future<Output = LeaseLost> + Send + 'static {
        let shared = self.shared.clone();
        async move {
            shared.lost.cancelled().await;
            shared
                .reason
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
                .unwrap_or(LeaseLost::Unconfirmed { last_error: None })
        }
    }

    /// A cheap, cloneable view of this guard's lease for code that runs under it.
    pub fn handle(&self) -> LeaseHandle {
        LeaseHandle {
            shared: self.shared.clone(),
        }
    }

    /// Stops renewing and releases the lease, so another holder can acquire it at once.
    pub async fn release(mut self) -> Result<Lease, LeaseError> {
        self.stop_renewing().await;
        let lease = self.lease();
        self.client
            .release(&lease.resource, &lease.holder, lease.proof())
            .await
    }

    async fn stop_renewing(&mut self) {
        self.stop.cancel();
        if let Some(renewer) = self.renewer.take() {
            // The renewer only ends by itself or on `stop`; a join error means it panicked,
            // which `Drop`'s best effort does not need to know about.
            let _ = renewer.await;
        }
    }
}

/// What work running under a [`LeaseGuard`] can ask of its lease, without owning the guard.
#[derive(Debug, Clone)]
pub struct LeaseHandle {
    shared: Arc<Shared>,
}

impl LeaseHandle {
    pub fn fence(&self) -> i64 {
        self.shared
            .lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .fence
    }

    pub fn lease(&self) -> Lease {
        self.shared.lease()
    }

    /// See [`LeaseGuard::is_held`]: check it right before acting on the lease.
    pub fn is_held(&self) -> bool {
        !self.shared.lost.is_cancelled() && !self.shared.deadline.passed()
    }

    /// Cancelled the moment the lease is lost (a child token).
    pub fn loss_token(&self) -> CancellationToken {
        self.shared.lost.child_token()
    }
}

impl Drop for LeaseGuard {
    /// Best effort: stop renewing and release in the background, if a runtime is still there.
    /// A lease that cannot be released here simply expires after its TTL.
    fn drop(&mut self) {
        self.stop.cancel();
        let Some(renewer) = self.renewer.take() else {
            return; // released explicitly
        };
        renewer.abort();
        // A lease in doubt is left to expire: a release sent now could land after this holder
        // re-acquired it (reentrantly, same fence) and end the new term.
        if !self.is_held() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            let lease = self.lease();
            runtime.spawn(async move {
                if let Err(err) = client
                    .release(&lease.resource, &lease.holder, lease.proof())
                    .await
                {
                    tracing::debug!(resource = %lease.resource, error = %err, "release on drop failed");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_interval_must_leave_room_before_the_ttl() {
        let base = GuardConfig::new("r", "h").ttl(Duration::from_secs(3));
        assert!(base.timings().is_ok());
        let (interval, margin) = base.timings().unwrap_or_default();
        assert_eq!(interval, Duration::from_secs(1));
        assert_eq!(margin, Duration::from_millis(300));
        assert!(matches!(
            base.clone()
                .renew_interval(Duration::from_secs(3))
                .timings(),
            Err(LeaseError::InvalidConfig(_))
        ));
        assert!(matches!(
            base.clone()
                .renew_interval(Duration::from_secs(5))
                .timings(),
            Err(LeaseError::InvalidConfig(_))
        ));
        assert!(matches!(
            base.clone()
                .renew_interval(Duration::from_millis(2900))
                .timings(),
            Err(LeaseError::InvalidConfig(_))
        ));
        assert!(matches!(
            GuardConfig::new("r", "h")
                .ttl(Duration::from_millis(500))
                .timings(),
            Err(LeaseError::InvalidConfig(_))
        ));
    }
}
