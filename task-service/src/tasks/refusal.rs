//! The refusals several operations answer with. They live together so that one situation gets
//! one code and one wording wherever it is met: in particular, what lease-service's answer about
//! a worker's lease means to that worker (lost, revoked, or lease-service unreachable or
//! misconfigured, which is not the worker's fault and so is 503, not 409).

use leasehold::ErrorCode;
use leasehold::LeaseError;
use leasehold::server::ApiError;
use leasehold::tasks::TaskStatus;

use crate::context::Context;

pub(super) fn task_not_found(id: i64) -> ApiError {
    ApiError::NotFound {
        code: ErrorCode::TaskNotFound,
        message: format!("no task with id {id}"),
    }
}

pub(super) fn finished(id: i64, status: TaskStatus) -> ApiError {
    ApiError::Conflict {
        code: ErrorCode::TaskFinished,
        message: format!("task {id} is already {}", status.as_str()),
    }
}

/// lease-service said no (or could not be asked) about a worker's lease.
pub(super) fn lease_refusal(engine: &Context, operation: &str, err: LeaseError) -> ApiError {
    match err {
        LeaseError::Unavailable(reason) => {
            ApiError::Unavailable(format!("lease-service unavailable: {reason}"))
        }
        LeaseError::Held { .. } | LeaseError::Lost { .. } => {
            engine
                .metrics
                .lease_lost
                .with_label_values(&[operation])
                .inc();
            // An operator's revoke is named as such: the worker was evicted, not late.
            let code = match &err {
                LeaseError::Lost {
                    code: ErrorCode::LeaseRevoked,
                    ..
                } => ErrorCode::LeaseRevoked,
                _ => ErrorCode::LeaseLost,
            };
            ApiError::Conflict {
                code,
                message: format!("the task's lease was lost: {err}"),
            }
        }
        LeaseError::Rejected {
            status: 401 | 403, ..
        } => ApiError::Unavailable(credentials_refused(&err)),
        other => ApiError::Internal(format!("lease-service refused: {other}")),
    }
}

/// lease-service does not accept task-service's token: every task lease call will fail until
/// an operator fixes the configuration, so it is reported as unavailability, loudly.
pub(super) fn credentials_refused(err: &LeaseError) -> String {
    let message = format!(
        "lease-service refused task-service's credentials (check LEASE_SERVICE_TOKEN): {err}"
    );
    tracing::error!("{message}");
    message
}
