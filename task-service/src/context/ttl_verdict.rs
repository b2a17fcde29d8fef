//! What lease-service last said of task-service's lease TTL, remembered where both the claim
//! round and `/readyz` see it ([`crate::tasks`]' `ttl` module asks, and judges).

use std::sync::PoisonError;
use std::time::Duration;

use leasehold::ErrorCode;
use leasehold::server::ApiError;

/// What lease-service last said of task-service's lease TTL: nothing yet, accepted, or refused
/// (with why). A refused TTL starves every claim, so it fails `/readyz` and claims answer 503
/// `task_lease_ttl_rejected` rather than "No tasks available".
#[derive(Debug, Clone, Default)]
pub struct TtlVerdict(std::sync::Arc<std::sync::Mutex<Option<Result<(), String>>>>);

impl TtlVerdict {
    pub(crate) fn get(&self) -> Option<Result<(), String>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn accept(&self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(Ok(()));
    }

    /// Records the refusal and answers the error that names it; logs it when it is news.
    pub(crate) fn reject(&self, ttl: Duration, refusal: &str) -> ApiError {
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
