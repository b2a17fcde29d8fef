//! What both clients' errors ([`crate::CallError`], [`crate::LeaseError`]) say of a failed
//! call, read one way whatever the service: a caller that reports failures (the command line)
//! maps them once, rather than once per client.

use crate::ErrorCode;
use crate::lease_client::LeaseError;
use crate::task_client::CallError;

/// A failed call to a Leasehold service.
pub trait ServiceError: std::error::Error + Send + Sync + 'static {
    /// The service's answer, when it answered and said no: its HTTP status, code and message.
    fn refusal(&self) -> Option<(u16, &ErrorCode, &str)>;
    /// The HTTP status the failure stands for: the service's own, or the one its kind implies
    /// (a lease held by another: 409); `None` when no service said no.
    fn status(&self) -> Option<u16>;
    /// No answer, or one that says "try later": the call may or may not have taken effect.
    fn is_transient(&self) -> bool;
}

impl ServiceError for CallError {
    fn refusal(&self) -> Option<(u16, &ErrorCode, &str)> {
        match self {
            CallError::Refused {
                status,
                code,
                error,
            } => Some((*status, code, error)),
            CallError::Transient(_) => None,
        }
    }

    fn status(&self) -> Option<u16> {
        self.refusal().map(|(status, _, _)| status)
    }

    fn is_transient(&self) -> bool {
        matches!(self, CallError::Transient(_))
    }
}

impl ServiceError for LeaseError {
    fn refusal(&self) -> Option<(u16, &ErrorCode, &str)> {
        match self {
            LeaseError::Rejected {
                status,
                code,
                error,
            } => Some((*status, code, error)),
            _ => None,
        }
    }

    fn status(&self) -> Option<u16> {
        match self {
            LeaseError::Rejected { status, .. } => Some(*status),
            LeaseError::Lost {
                code: ErrorCode::LeaseNotFound,
                ..
            } => Some(404),
            LeaseError::Held { .. }
            | LeaseError::Lost { .. }
            | LeaseError::AcquireTimeout { .. } => Some(409),
            LeaseError::Unavailable(_) | LeaseError::InvalidConfig(_) => None,
        }
    }

    fn is_transient(&self) -> bool {
        matches!(self, LeaseError::Unavailable(_))
    }
}
