//! A typed client of task-service: the worker's API (`worker`: claim, heartbeat, complete,
//! fail) and the producers' and operators' (`operator`: create, read, list, cancel, retry, and
//! the generator's desired state). The worker, the generator and the command line all use it,
//! so none of them can drift from the wire types in [`crate::tasks`] and [`crate::generator`].
//!
//! Every call is one HTTP exchange: retrying is the caller's business, since only the caller
//! knows how long a task's lease still holds or whether a repeat is safe. A connection error, a
//! timeout, a 5xx or 429 answer, or an unreadable success body is [`CallError::Transient`] and
//! moves the client on to the next configured URL; any other non-2xx answer is
//! [`CallError::Refused`] with task-service's `code`.

mod operator;
mod worker;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::ErrorCode;
use crate::transport::{self, Call, Sent};
use reqwest::StatusCode;
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use operator::{Bulk, Created, QueueListing, TaskCounts, TaskListing};

/// Why a call did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// No answer, or one that says "try later": the request may or may not have taken effect.
    #[error("{0}")]
    Transient(String),
    /// task-service answered and said no.
    #[error("task-service refused ({status} {code}): {error}")]
    Refused {
        status: u16,
        code: ErrorCode,
        error: String,
    },
}

impl CallError {
    /// A 409 or 404: the task is no longer ours (lease lost or superseded, task finished or
    /// cancelled, or gone).
    pub fn is_loss(&self) -> bool {
        matches!(self, Self::Refused { status, .. } if *status == 409 || *status == 404)
    }

    /// task-service's error code, for refusals.
    pub fn code(&self) -> Option<&ErrorCode> {
        match self {
            Self::Refused { code, .. } => Some(code),
            Self::Transient(_) => None,
        }
    }
}

/// A client of one or more task-service replicas.
#[derive(Debug)]
pub struct TaskClient {
    http: reqwest::Client,
    /// What bounds each request; a claim that waits gets its wait on top.
    timeout: Duration,
    /// Sent as `Authorization: Bearer ...` (through `http`'s default headers).
    bearer: Option<crate::api::Secret>,
    urls: Vec<String>,
    current: AtomicUsize,
}

/// A successful exchange: the status (some calls tell outcomes apart by it) and the body.
struct Answer {
    status: StatusCode,
    body: Vec<u8>,
}

impl Answer {
    /// The body as `T`; a body that does not read as `T` is transient, like no answer at all.
    fn read<T: DeserializeOwned>(&self, what: &str) -> Result<T, CallError> {
        serde_json::from_slice(&self.body)
            .map_err(|err| CallError::Transient(format!("unreadable answer to {what}: {err}")))
    }
}

impl TaskClient {
    /// A client of the task-service replicas at `urls` (a call that fails transiently moves the
    /// client on to the next), with a 5-second timeout per request and no token: the shape of
    /// [`crate::LeaseClient::new`], set further by the same `with_` methods.
    pub fn new<S: Into<String>>(urls: impl IntoIterator<Item = S>) -> Self {
        let timeout = Duration::from_secs(5);
        Self {
            http: http_client(timeout, None),
            timeout,
            bearer: None,
            urls: urls
                .into_iter()
                .map(|url| url.into().trim_end_matches('/').to_owned())
                .collect(),
            current: AtomicUsize::new(0),
        }
    }

    /// What bounds each request (a claim that waits gets its wait on top).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self.http = http_client(timeout, self.bearer.as_ref());
        self
    }

    /// Sends `token` as a bearer token with every request (a token with the role each route
    /// needs, when task-service's `AUTH_TOKENS` is set). `None` or an empty token sends none.
    pub fn with_bearer_token(mut self, token: Option<&str>) -> Self {
        self.bearer = token.filter(|t| !t.is_empty()).map(crate::api::Secret::new);
        self.http = http_client(self.timeout, self.bearer.as_ref());
        self
    }

    /// The URL the next call goes to.
    pub fn current_url(&self) -> &str {
        let index = self.current.load(Ordering::Relaxed) % self.urls.len().max(1);
        self.urls.get(index).map_or("", String::as_str)
    }

    /// One exchange with the current URL; on a transient failure the next URL becomes current.
    async fn send<B: Serialize>(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&B>,
    ) -> Result<Answer, CallError> {
        self.send_waiting(method, path, query, body, Duration::ZERO)
            .await
    }

    /// [`TaskClient::send`] of a request the service may hold up to `wait` before answering.
    async fn send_waiting<B: Serialize>(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&B>,
        wait: Duration,
    ) -> Result<Answer, CallError> {
        let count = self.urls.len().max(1);
        let index = self.current.load(Ordering::Relaxed) % count;
        let base = self.urls.get(index).map_or("", String::as_str);
        let url = format!("{base}{path}");
        let call = Call {
            method,
            url: &url,
            query,
            body,
            bearer: None,
            timeout: Some(self.timeout.saturating_add(wait)),
        };
        let result = match transport::exchange(&self.http, "task-service", call).await {
            Sent::Answer { status, body } => Ok(Answer { status, body }),
            Sent::Refused { status, body } => Err(CallError::Refused {
                status: status.as_u16(),
                code: body.code,
                error: body.error,
            }),
            Sent::Transient(reason) => Err(CallError::Transient(reason)),
        };
        if let Err(CallError::Transient(reason)) = &result
            && count > 1
        {
            // Only the first of several concurrent failures against this URL moves on.
            let next = (index + 1) % count;
            if self
                .current
                .compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                tracing::warn!(
                    failed = %base,
                    next = %self.urls.get(next).map_or("", String::as_str),
                    %reason,
                    "task-service call failed; switching to the next URL"
                );
            }
        }
        result
    }
}

/// The HTTP client of a [`TaskClient`]: its timeout, and its token in every request's headers.
/// Building one fails only where TLS cannot start; the plain client then still serves HTTP.
fn http_client(timeout: Duration, bearer: Option<&crate::api::Secret>) -> reqwest::Client {
    crate::keep_alive::client_builder()
        .default_headers(crate::api::Secret::bearer_headers(bearer))
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(2)))
        .build()
        .unwrap_or_else(|_| reqwest::Client::new())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn losses_are_409_and_404() {
        let refused = |status| CallError::Refused {
            status,
            code: ErrorCode::Unknown,
            error: String::new(),
        };
        assert!(refused(409).is_loss());
        assert!(refused(404).is_loss());
        assert!(!refused(400).is_loss());
        assert!(!CallError::Transient("x".to_owned()).is_loss());
    }
}
