//! A lease call's failure, as the client reports it: held by another, lost, refused for another
//! reason, or no answer.

use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::StatusCode;

use crate::api::{ErrorBody, ErrorCode};

/// Why a lease call did not succeed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LeaseError {
    /// Another holder has an unexpired lease on the resource.
    #[error("lease on {resource:?} is held by {holder:?} until {expires_at:?}")]
    Held {
        resource: String,
        holder: String,
        expires_at: Option<DateTime<Utc>>,
        /// Time left on the holder's lease, by the database's clock when it answered.
        expires_in: Option<Duration>,
    },
    /// The lease is no longer ours: expired, released, revoked by an operator (`lease_revoked`),
    /// taken over, stale fence, or gone.
    #[error("lease lost ({code}): {reason}")]
    Lost { code: ErrorCode, reason: String },
    /// lease-service could not be reached or failed, after retries.
    #[error("lease-service unavailable: {0}")]
    Unavailable(String),
    /// The request was refused as invalid (a 4xx other than a conflict).
    #[error("lease-service refused the request ({status} {code}): {error}")]
    Rejected {
        status: u16,
        code: ErrorCode,
        error: String,
    },
    /// `acquire_with_timeout` gave up.
    #[error("gave up acquiring {resource:?} after {waited:?}; last holder {last_holder:?}")]
    AcquireTimeout {
        resource: String,
        waited: Duration,
        last_holder: Option<String>,
    },
    /// A guard was configured in a way that cannot keep a lease.
    #[error("invalid lease guard configuration: {0}")]
    InvalidConfig(String),
}

impl LeaseError {
    /// True when lease-service answered and said no, as opposed to not answering.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            Self::Held { .. } | Self::Lost { .. } | Self::Rejected { .. }
        )
    }
}

pub(super) fn refusal(
    resource: &str,
    status: Option<StatusCode>,
    err: Result<ErrorBody, String>,
) -> LeaseError {
    let body = match (status, err) {
        (_, Err(reason)) | (None, Ok(ErrorBody { error: reason, .. })) => {
            return LeaseError::Unavailable(reason);
        }
        (Some(_), Ok(body)) => body,
    };
    let status = status.unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    match (status, &body.code) {
        (StatusCode::CONFLICT, ErrorCode::LeaseHeld) => LeaseError::Held {
            resource: resource.to_owned(),
            holder: body.holder.unwrap_or_default(),
            expires_at: body.expires_at,
            expires_in: body
                .expires_in_ms
                .and_then(|ms| u64::try_from(ms).ok())
                .map(Duration::from_millis),
        },
        (StatusCode::CONFLICT | StatusCode::NOT_FOUND, _) => LeaseError::Lost {
            code: body.code,
            reason: body.error,
        },
        _ => LeaseError::Rejected {
            status: status.as_u16(),
            code: body.code,
            error: body.error,
        },
    }
}
