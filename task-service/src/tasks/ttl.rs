//! Whether lease-service accepts task-service's lease TTL. The TTL is task-service's setting but
//! lease-service's bounds judge it, and a refused TTL refuses every claim's lease, which would
//! otherwise look like an empty queue. So the verdict is remembered where both the claim round
//! and `/readyz` see it: a refusal turns claims into a 503 that names the setting, and fails
//! readiness, until a claim or a probe sees the TTL accepted.

use std::sync::PoisonError;
use std::time::Duration;

use leasehold::ErrorCode;
use leasehold::LeaseError;
use leasehold::server::ApiError;

use super::Engine;

/// What lease-service last said of task-service's lease TTL: nothing yet, accepted, or refused
/// (with why). A refused TTL starves every claim, so it fails `/readyz` and claims answer 503
/// `task_lease_ttl_rejected` rather than "No tasks available".
#[derive(Debug, Clone, Default)]
pub struct TtlVerdict(std::sync::Arc<std::sync::Mutex<Option<Result<(), String>>>>);

impl TtlVerdict {
    fn get(&self) -> Option<Result<(), String>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn accept(&self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(Ok(()));
    }

    /// Records the refusal and answers the error that names it; logs it when it is news.
    pub(super) fn reject(&self, ttl: Duration, refusal: &str) -> ApiError {
        let message = format!(
            "lease-service refuses task-service's lease TTL of {} s (TASK_LEASE_TTL_SECONDS), so \
             no task can be claimed: set it within lease-service's LEASE_MIN_TTL_SECONDS and \
             LEASE_MAX_TTL_SECONDS ({refusal})",
            ttl.as_secs()
        );
        let previous = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(Err(message.clone()));
        if previous != Some(Err(message.clone())) {
            tracing::error!("{message}");
        }
        ApiError::Misconfigured {
            code: ErrorCode::TaskLeaseTtlRejected,
            message,
        }
    }
}

/// Whether lease-service accepts task-service's lease TTL, for `/readyz`: once a claim or this
/// probe has seen it accepted, no call is made; otherwise a lease is taken with that TTL on a
/// resource of its own and released in the background (a refused TTL writes nothing in
/// lease-service).
/// When lease-service cannot be asked, this says nothing: its health check reports that.
pub async fn check_lease_ttl(engine: &Engine) -> Result<(), ApiError> {
    if engine.lease_ttl_verdict.get() == Some(Ok(())) {
        return Ok(());
    }
    let probe: u64 = rand::random();
    let resource = format!("leasehold:task-lease-ttl-probe:{probe:016x}");
    let holder = format!("task-service-probe-{probe:016x}");
    match engine
        .leases
        .acquire(&resource, &holder, Some(engine.lease_ttl))
        .await
    {
        Ok(lease) => {
            engine.lease_ttl_verdict.accept();
            // The verdict is in: the answer (a readiness probe's, on a short budget) does not
            // wait for the release, which nothing depends on.
            let leases = engine.leases.clone();
            tokio::spawn(async move {
                if let Err(err) = leases.release(&resource, &holder, lease.proof()).await {
                    tracing::debug!(error = %err, "TTL probe lease not released; it will expire");
                }
            });
            Ok(())
        }
        Err(LeaseError::Rejected {
            code: ErrorCode::InvalidTtl,
            error,
            ..
        }) => Err(engine.lease_ttl_verdict.reject(engine.lease_ttl, &error)),
        Err(err) => {
            tracing::debug!(error = %err, "could not probe the task lease TTL");
            Ok(())
        }
    }
}
