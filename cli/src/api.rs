//! The CLI's clients of the two services: [`leasehold::LeaseClient`] and
//! [`leasehold::TaskClient`], the same typed clients every other caller uses, and the words it
//! reports a failed request in.

use std::time::Duration;

use anyhow::Context;
use leasehold::{CallError, LeaseClient, LeaseError, RetryPolicy, TaskClient};

use crate::Cli;

/// How long one request may take: an operator waits, but not forever.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The two services, as the CLI talks to them.
#[derive(Debug)]
pub(crate) struct Api {
    pub(crate) leases: LeaseClient,
    pub(crate) tasks: TaskClient,
}

impl Api {
    pub(crate) fn new(cli: &Cli) -> anyhow::Result<Api> {
        let token = cli.token.as_deref().map(leasehold::api::Secret::new);
        // An operator's command is tried once: the operator sees the failure and decides.
        let leases = LeaseClient::with_timeout(cli.lease_url.trim_end_matches('/'), TIMEOUT)
            .with_bearer_token(cli.token.as_deref())
            .with_retry(RetryPolicy::none());
        let tasks = TaskClient::new(
            vec![cli.task_url.trim_end_matches('/').to_owned()],
            TIMEOUT,
            token.as_ref(),
        )
        .context("building the HTTP client")?;
        Ok(Api { leases, tasks })
    }

    /// Turns a failed lease-service call into the CLI's report of it.
    pub(crate) fn leases_failed(
        &self,
        method: &str,
        path: &str,
    ) -> impl FnOnce(LeaseError) -> anyhow::Error {
        let url = format!("{}{path}", self.leases.base_url());
        let method = method.to_owned();
        move |err| failed(&method, &url, err)
    }

    /// Turns a failed task-service call into the CLI's report of it.
    pub(crate) fn tasks_failed(
        &self,
        method: &str,
        path: &str,
    ) -> impl FnOnce(CallError) -> anyhow::Error {
        let url = format!("{}{path}", self.tasks.current_url());
        let method = method.to_owned();
        move |err| failed(&method, &url, err)
    }
}

/// A failure that may be a service's answer with a status, a message and a code.
pub(crate) trait Refusal: std::error::Error + Send + Sync + 'static {
    fn refusal(&self) -> Option<(u16, &str, &str)>;
}

impl Refusal for CallError {
    fn refusal(&self) -> Option<(u16, &str, &str)> {
        match self {
            CallError::Refused {
                status,
                code,
                error,
            } => Some((*status, code, error)),
            CallError::Transient(_) => None,
        }
    }
}

impl Refusal for LeaseError {
    fn refusal(&self) -> Option<(u16, &str, &str)> {
        match self {
            LeaseError::Rejected {
                status,
                code,
                error,
            } => Some((*status, code, error)),
            _ => None,
        }
    }
}

/// What the CLI prints for a failed request: a refusal quotes the service's status, message
/// and code on one line (what operators and scripts grep for); anything else names the request
/// and gives the reason beneath it.
pub(crate) fn failed<E: Refusal>(method: &str, url: &str, err: E) -> anyhow::Error {
    match err.refusal() {
        Some((status, code, error)) => {
            let status = reqwest::StatusCode::from_u16(status)
                .map_or_else(|_| status.to_string(), |status| status.to_string());
            anyhow::anyhow!("{method} {url} answered {status}: {error} ({code})")
        }
        None => anyhow::Error::new(err).context(format!("{method} {url}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_quotes_status_message_and_code() {
        let refused = CallError::Refused {
            status: 409,
            code: "not_dead".to_owned(),
            error: "task 4 is not dead".to_owned(),
        };
        assert_eq!(
            failed("POST", "http://t/api/tasks/4/retry", refused).to_string(),
            "POST http://t/api/tasks/4/retry answered 409 Conflict: task 4 is not dead (not_dead)"
        );
        let unauthorized = LeaseError::Rejected {
            status: 401,
            code: "unauthorized".to_owned(),
            error: "a bearer token is required".to_owned(),
        };
        let text = failed("POST", "http://l/api/leases", unauthorized).to_string();
        assert!(text.contains("401 Unauthorized") && text.contains("(unauthorized)"));
    }

    #[test]
    fn no_answer_names_the_request_and_keeps_the_reason() {
        let err = failed(
            "GET",
            "http://t/api/tasks",
            CallError::Transient("cannot connect".to_owned()),
        );
        assert_eq!(err.to_string(), "GET http://t/api/tasks");
        assert_eq!(err.root_cause().to_string(), "cannot connect");
    }
}
