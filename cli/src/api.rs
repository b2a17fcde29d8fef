//! The CLI's clients of the two services: [`leasehold::LeaseClient`] and
//! [`leasehold::TaskClient`], the same typed clients every other caller uses, and the words it
//! reports a failed request in.

use std::time::Duration;

use leasehold::{CallError, LeaseClient, LeaseError, RetryPolicy, ServiceError, TaskClient};

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
    pub(crate) fn new(cli: &Cli) -> Api {
        // An operator's command is tried once: the operator sees the failure and decides.
        let leases = LeaseClient::new(cli.lease_url.as_str())
            .with_timeout(TIMEOUT)
            .with_bearer_token(cli.token.as_deref())
            .with_retry(RetryPolicy::none());
        let tasks = TaskClient::new([cli.task_url.as_str()])
            .with_timeout(TIMEOUT)
            .with_bearer_token(cli.token.as_deref());
        Api { leases, tasks }
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

/// How a command ended, as its exit status: what a script may branch on without reading the
/// message. Listed in `leasehold --help` ([`EXIT_CODES`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Anything not below: a local failure (a file, a terminal, JSON given on the command line).
    Failure = 1,
    /// The command line itself is wrong (clap's own status for usage errors).
    Usage = 2,
    /// 404: what was named does not exist.
    NotFound = 3,
    /// 409, 412, 422: refused because of how things stand (held by another, not dead, a
    /// stale fence, an idempotency key reused). Retrying the same request will not help.
    Conflict = 4,
    /// 400, 413, 415: the service refused the request's input.
    Invalid = 5,
    /// 401, 403: no token, or one without the role the request needs.
    Unauthorized = 6,
    /// The service could not be reached, timed out, answered 429 or 5xx, or gave an answer the
    /// CLI could not read: try again later.
    Unavailable = 7,
}

/// The exit statuses, as `leasehold --help` lists them.
pub const EXIT_CODES: &str = "\
Exit status:
  0  done
  1  failed for another reason (a local error)
  2  usage: the command line is wrong
  3  not found (404)
  4  conflict: refused because of how things stand (409, 412, 422)
  5  invalid: the service refused the input (400, 413, 415)
  6  unauthorized: no token, or a token without the role (401, 403)
  7  unavailable: the service could not be reached, timed out, answered 429 or 5xx, or
     gave an answer that could not be read";

impl Exit {
    /// The exit for a service's answer with this HTTP status.
    pub fn of_status(status: u16) -> Exit {
        match status {
            404 => Exit::NotFound,
            409 | 412 | 422 => Exit::Conflict,
            400 | 413 | 415 => Exit::Invalid,
            401 | 403 => Exit::Unauthorized,
            429 | 500..=599 => Exit::Unavailable,
            _ => Exit::Failure,
        }
    }

    /// The exit a command's error asks for: the first failed request's, else [`Exit::Failure`].
    pub fn of(err: &anyhow::Error) -> Exit {
        err.downcast_ref::<Failed>()
            .map_or(Exit::Failure, |failed| failed.exit)
    }
}

/// A failed request, as the CLI reports it, with the exit it calls for.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub(crate) struct Failed {
    message: String,
    exit: Exit,
}

/// A command refused on the CLI's side, as a wrong command line is (exit 2).
pub(crate) fn usage(message: String) -> anyhow::Error {
    anyhow::Error::new(Failed {
        message,
        exit: Exit::Usage,
    })
}

/// What the CLI prints for a failed request: a refusal quotes the service's status, message
/// and code on one line (what operators and scripts grep for); anything else names the request
/// and gives the reason beneath it.
pub(crate) fn failed<E: ServiceError>(method: &str, url: &str, err: E) -> anyhow::Error {
    let exit = if err.is_transient() {
        Exit::Unavailable
    } else {
        err.status().map_or(Exit::Failure, Exit::of_status)
    };
    match err.refusal() {
        Some((status, code, error)) => {
            let status = reqwest::StatusCode::from_u16(status)
                .map_or_else(|_| status.to_string(), |status| status.to_string());
            anyhow::Error::new(Failed {
                message: format!("{method} {url} answered {status}: {error} ({code})"),
                exit,
            })
        }
        None => anyhow::Error::new(err).context(Failed {
            message: format!("{method} {url}"),
            exit,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold::ErrorCode;

    #[test]
    fn each_failure_exits_with_its_kind() {
        let refused = |status| CallError::Refused {
            status,
            code: ErrorCode::Unknown,
            error: "e".to_owned(),
        };
        for (status, exit) in [
            (404, Exit::NotFound),
            (409, Exit::Conflict),
            (422, Exit::Conflict),
            (400, Exit::Invalid),
            (413, Exit::Invalid),
            (401, Exit::Unauthorized),
            (403, Exit::Unauthorized),
            (429, Exit::Unavailable),
            (503, Exit::Unavailable),
        ] {
            let err = failed("GET", "http://t/x", refused(status));
            assert_eq!(Exit::of(&err), exit, "{status}");
            // A command may say more about what it was doing; the exit stays the request's.
            assert_eq!(Exit::of(&err.context("showing task 1")), exit, "{status}");
        }
        let unreachable = CallError::Transient("connection refused".to_owned());
        assert_eq!(
            Exit::of(&failed("GET", "http://t/x", unreachable)),
            Exit::Unavailable
        );
        let held = LeaseError::Held {
            resource: "r".to_owned(),
            holder: "h".to_owned(),
            expires_at: None,
            expires_in: None,
        };
        assert_eq!(
            Exit::of(&failed("POST", "http://l/x", held)),
            Exit::Conflict
        );
        assert_eq!(Exit::of(&anyhow::anyhow!("local")), Exit::Failure);
        // What `--help` lists is what the process returns.
        for exit in [
            Exit::Failure,
            Exit::Usage,
            Exit::NotFound,
            Exit::Conflict,
            Exit::Invalid,
            Exit::Unauthorized,
            Exit::Unavailable,
        ] {
            let line = format!("  {}  ", exit as u8);
            assert!(EXIT_CODES.contains(&line), "{exit:?} is not listed");
        }
    }

    #[test]
    fn a_refusal_quotes_status_message_and_code() {
        let refused = CallError::Refused {
            status: 409,
            code: ErrorCode::NotDead,
            error: "task 4 is not dead".to_owned(),
        };
        assert_eq!(
            failed("POST", "http://t/api/tasks/4/retry", refused).to_string(),
            "POST http://t/api/tasks/4/retry answered 409 Conflict: task 4 is not dead (not_dead)"
        );
        let unauthorized = LeaseError::Rejected {
            status: 401,
            code: ErrorCode::Unauthorized,
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
