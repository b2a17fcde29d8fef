//! The one place where failures become HTTP answers.
//!
//! Every non-2xx answer is JSON [`ErrorBody`]: `error` for people, `code` for programs.

use crate::api::{ErrorBody, ErrorCode};
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use chrono::{DateTime, Utc};

#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    /// The request is malformed or a field is out of bounds.
    #[error("{message}")]
    Invalid {
        code: ErrorCode,
        field: Option<&'static str>,
        message: String,
    },
    /// Another holder has the lease.
    #[error("lease on {resource:?} is held by {holder:?}")]
    Held {
        resource: String,
        holder: String,
        expires_at: DateTime<Utc>,
        expires_in_ms: i64,
    },
    /// The request contradicts the lease's state (not the holder, stale fence, expired, ...).
    #[error("{message}")]
    Conflict { code: ErrorCode, message: String },
    /// A well-formed request the service will not carry out (e.g. an idempotency key reused
    /// with different content).
    #[error("{message}")]
    Unprocessable { code: ErrorCode, message: String },
    #[error("{message}")]
    NotFound { code: ErrorCode, message: String },
    /// No bearer token, a malformed one, or one the service does not know.
    #[error("{0}")]
    Unauthorized(String),
    /// A known token without the role the route needs.
    #[error("{0}")]
    Forbidden(String),
    /// A browser request from a web page of another origin, which `CORS_ALLOWED_ORIGINS` does
    /// not name: a write it sends, or the preflight that asks leave to send one.
    #[error("{0}")]
    OriginNotAllowed(String),
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("request body too large (limit {limit} bytes)")]
    PayloadTooLarge { limit: usize },
    #[error("expected a JSON body (Content-Type: application/json)")]
    UnsupportedMediaType,
    /// The client did not send its whole body in time.
    #[error("the request body did not arrive within {timeout_ms} ms")]
    BodyTimeout { timeout_ms: u128 },
    /// The database (or another dependency) cannot be reached; retrying later may work.
    #[error("{0}")]
    Unavailable(String),
    /// The database aborted the transaction to break a lock cycle (`deadlock detected`) or a
    /// serialization conflict. Nothing it wrote stays, and the same transaction run again will
    /// most likely pass: [`super::db::Contended`] runs it again, and only a transaction
    /// that keeps losing answers with this (503, `unavailable`), never with a 500.
    #[error("{0}")]
    Contention(String),
    /// The service cannot do its work until an operator fixes its configuration (503); `code`
    /// names what is wrong, so that it is not taken for a passing outage.
    #[error("{message}")]
    Misconfigured { code: ErrorCode, message: String },
    #[error("internal error")]
    Internal(String),
    /// A refusal of a service this one called on a client's behalf (the dashboard's lease views
    /// and revocations), passed on as it came: its status, code and message.
    #[error("{}", body.error)]
    Upstream { status: u16, body: Box<ErrorBody> },
}

impl ApiError {
    /// The seconds a 503 asks its client to wait before trying again (`Retry-After`): a second
    /// for what passes by itself (a database or a service out of reach, a turn not come), half
    /// a minute for what waits for an operator (a configuration another service refuses).
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Self::Unavailable(_) | Self::Contention(_) => Some(1),
            Self::Misconfigured { .. } => Some(30),
            _ => None,
        }
    }

    pub fn invalid(code: ErrorCode, field: &'static str, message: impl Into<String>) -> Self {
        Self::Invalid {
            code,
            field: Some(field),
            message: message.into(),
        }
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Invalid { code, .. }
            | Self::Conflict { code, .. }
            | Self::Unprocessable { code, .. }
            | Self::NotFound { code, .. }
            | Self::Misconfigured { code, .. } => code.clone(),
            Self::Held { .. } => ErrorCode::LeaseHeld,
            Self::Unauthorized(_) => ErrorCode::Unauthorized,
            Self::Forbidden(_) => ErrorCode::Forbidden,
            Self::OriginNotAllowed(_) => ErrorCode::OriginNotAllowed,
            Self::MethodNotAllowed => ErrorCode::MethodNotAllowed,
            Self::PayloadTooLarge { .. } => ErrorCode::PayloadTooLarge,
            Self::UnsupportedMediaType => ErrorCode::UnsupportedMediaType,
            Self::BodyTimeout { .. } => ErrorCode::RequestTimeout,
            Self::Unavailable(_) | Self::Contention(_) => ErrorCode::Unavailable,
            Self::Internal(_) => ErrorCode::Internal,
            Self::Upstream { body, .. } => body.code.clone(),
        }
    }
}

impl ApiError {
    /// The JSON body this error answers with: for a whole response, or for one item of a batch
    /// answered item by item.
    pub fn body(&self) -> ErrorBody {
        if let Self::Upstream { body, .. } = self {
            return (**body).clone();
        }
        let mut body = ErrorBody::new(self.code(), self.to_string());
        match self {
            Self::Held {
                holder,
                expires_at,
                expires_in_ms,
                ..
            } => {
                body.holder = Some(holder.clone());
                body.expires_at = Some(*expires_at);
                body.expires_in_ms = Some(*expires_in_ms);
            }
            Self::Invalid { field, .. } => body.field = field.map(str::to_owned),
            _ => {}
        }
        body
    }
}

impl From<diesel::result::Error> for ApiError {
    fn from(err: diesel::result::Error) -> Self {
        use diesel::result::{DatabaseErrorKind, Error};
        match err {
            // Connection-level trouble: the database restarted or is going away.
            Error::DatabaseError(DatabaseErrorKind::ClosedConnection, info) => {
                Self::Unavailable(format!("database connection lost: {}", info.message()))
            }
            Error::DatabaseError(DatabaseErrorKind::UnableToSendCommand, info) => {
                Self::Unavailable(format!("database unreachable: {}", info.message()))
            }
            Error::DatabaseError(DatabaseErrorKind::SerializationFailure, info) => {
                Self::Contention(format!("database contention: {}", info.message()))
            }
            other => {
                let message = other.to_string();
                // tokio-postgres reports a dead connection as an unknown error with this text.
                // The rest are what a failover looks like from a session: the server went away
                // mid-request, never answered ([`super::database`] closed the connection), or
                // is now a standby. A write's outcome is then unknown, so it is never a success.
                // diesel names no kind for SQLSTATE 40P01; its text is PostgreSQL's own.
                if message.contains("deadlock detected") {
                    return Self::Contention(format!("database contention: {message}"));
                }
                if [
                    "connection closed",
                    "shutting down",
                    "error communicating with the server",
                    "terminating connection",
                    "read-only transaction",
                ]
                .iter()
                .any(|sign| message.contains(sign))
                {
                    Self::Unavailable(format!("database unavailable: {message}"))
                } else if message.contains("statement timeout") {
                    // A statement bounded by `statement_timeout` ran past it: busy, not broken.
                    Self::Unavailable(format!("the database took too long: {message}"))
                } else {
                    Self::Internal(message)
                }
            }
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::Invalid { .. } => StatusCode::BAD_REQUEST,
            Self::Held { .. } | Self::Conflict { .. } => StatusCode::CONFLICT,
            Self::Unprocessable { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Self::NotFound { .. } => StatusCode::NOT_FOUND,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) | Self::OriginNotAllowed(_) => StatusCode::FORBIDDEN,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Self::Unavailable(_) | Self::Contention(_) | Self::Misconfigured { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            // Only a refusal is passed on; anything else from upstream is a bad gateway.
            Self::Upstream { status, .. } => StatusCode::from_u16(*status)
                .ok()
                .filter(|s| s.is_client_error() || s.is_server_error())
                .unwrap_or(StatusCode::BAD_GATEWAY),
        }
    }

    fn error_response(&self) -> HttpResponse {
        match self {
            Self::Internal(detail) => tracing::error!(%detail, "internal error"),
            Self::Unavailable(detail) => tracing::warn!(%detail, "dependency unavailable"),
            Self::Contention(detail) => {
                tracing::warn!(%detail, "lost to contention, retries spent")
            }
            Self::Misconfigured { message, .. } => tracing::error!(%message, "misconfigured"),
            _ => {}
        }
        let body = self.body();
        let mut response = HttpResponse::build(self.status_code());
        if let Self::Unauthorized(_) = self {
            response.insert_header((
                actix_web::http::header::WWW_AUTHENTICATE,
                "Bearer realm=\"leasehold\"",
            ));
        }
        if let Some(seconds) = self.retry_after() {
            response.insert_header((actix_web::http::header::RETRY_AFTER, seconds.to_string()));
        }
        if let Self::BodyTimeout { .. } = self {
            // The rest of the body may still be on its way: do not read it as the next request.
            response.force_close();
        }
        response.json(body)
    }
}

impl actix_web::Responder for ApiError {
    type Body = actix_web::body::BoxBody;

    fn respond_to(self, _: &actix_web::HttpRequest) -> HttpResponse {
        self.error_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use diesel::result::{DatabaseErrorKind, Error};

    #[test]
    fn a_statement_past_its_timeout_is_unavailable_not_internal() {
        let timeout = Error::DatabaseError(
            DatabaseErrorKind::Unknown,
            Box::new("canceling statement due to statement timeout".to_owned()),
        );
        assert!(matches!(ApiError::from(timeout), ApiError::Unavailable(_)));
        let other = Error::DatabaseError(
            DatabaseErrorKind::Unknown,
            Box::new("division by zero".to_owned()),
        );
        assert!(matches!(ApiError::from(other), ApiError::Internal(_)));
    }

    #[test]
    fn a_deadlock_or_serialization_failure_is_contention_never_internal() {
        let deadlock = Error::DatabaseError(
            DatabaseErrorKind::Unknown,
            Box::new("deadlock detected".to_owned()),
        );
        let serialization = Error::DatabaseError(
            DatabaseErrorKind::SerializationFailure,
            Box::new("could not serialize access due to concurrent update".to_owned()),
        );
        for err in [deadlock, serialization] {
            let mapped = ApiError::from(err);
            assert!(matches!(mapped, ApiError::Contention(_)), "{mapped:?}");
            assert_eq!(mapped.status_code(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(mapped.retry_after(), Some(1));
        }
    }
}
