//! One HTTP exchange with a Leasehold service, as both clients ([`crate::LeaseClient`] and
//! [`crate::TaskClient`]) make it: the client span and the trace context, the request, and the
//! answer sorted three ways. What each client does with the three (retry, move to the next URL,
//! read the body as its own type) is its own policy.
//!
//! The sorting is the contract both services keep: a 2xx is an answer; a 5xx or 429 says "try
//! later" and is transient, as no answer at all is (the request may or may not have taken
//! effect); any other status is a refusal, whose JSON body names the `code`. A refusal whose body
//! is not JSON (a proxy's page) keeps its first 200 characters under the code `unknown`.

use std::time::Duration;

use reqwest::StatusCode;
use serde::Serialize;
use tracing::Instrument;

use crate::api::Secret;
use crate::{ErrorBody, ErrorCode};

/// One request: what to send where, and what bounds it.
pub(crate) struct Call<'a, Q: ?Sized, B> {
    pub(crate) method: reqwest::Method,
    pub(crate) url: &'a str,
    pub(crate) query: &'a Q,
    pub(crate) body: Option<&'a B>,
    /// Sent as `Authorization: Bearer`, when the client was not built with it.
    pub(crate) bearer: Option<&'a Secret>,
    /// The request's own timeout, when it is not the client's (a call the service may hold
    /// open, waiting, gets its wait on top).
    pub(crate) timeout: Option<Duration>,
}

/// How an exchange ended.
#[derive(Debug)]
pub(crate) enum Sent {
    /// A 2xx: its status (some calls tell outcomes apart by it) and body.
    Answer { status: StatusCode, body: Vec<u8> },
    /// Any other non-2xx but 5xx and 429: the service said no.
    Refused { status: StatusCode, body: ErrorBody },
    /// No answer, or one that says "try later", in a few words.
    Transient(String),
}

/// Makes `call` with `http`; `service` names the service in what a transient failure says.
pub(crate) async fn exchange<Q: Serialize + ?Sized, B: Serialize>(
    http: &reqwest::Client,
    service: &str,
    call: Call<'_, Q, B>,
) -> Sent {
    let span = crate::telemetry::client_span(call.method.as_str(), call.url);
    let sent = async {
        let mut request = http
            .request(call.method, call.url)
            .headers(crate::telemetry::inject())
            .query(call.query);
        if let Some(token) = call.bearer {
            request = request.bearer_auth(token.expose());
        }
        if let Some(timeout) = call.timeout {
            request = request.timeout(timeout);
        }
        if let Some(body) = call.body {
            request = request.json(body);
        }
        request.send().await
    }
    .instrument(span.clone())
    .await;
    let response = match sent {
        Ok(response) => response,
        Err(err) => {
            let reason = describe(&err);
            crate::telemetry::record_response(&span, Err(&reason));
            return Sent::Transient(reason);
        }
    };
    let status = response.status();
    crate::telemetry::record_response(&span, Ok(status.as_u16()));
    match response.bytes().await {
        Ok(bytes) if status.is_success() => Sent::Answer {
            status,
            body: bytes.to_vec(),
        },
        Ok(bytes) => sort_failure(service, status, &bytes),
        Err(err) => Sent::Transient(describe(&err)),
    }
}

/// A non-2xx answer: transient when it says "try later", a refusal otherwise.
fn sort_failure(service: &str, status: StatusCode, bytes: &[u8]) -> Sent {
    let body: Option<ErrorBody> = serde_json::from_slice(bytes).ok();
    if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
        let detail = body.map_or_else(String::new, |b| format!(" ({}: {})", b.code, b.error));
        return Sent::Transient(format!("{service} answered {status}{detail}"));
    }
    let body = body.unwrap_or_else(|| {
        ErrorBody::new(
            ErrorCode::Unknown,
            String::from_utf8_lossy(bytes)
                .chars()
                .take(200)
                .collect::<String>(),
        )
    });
    Sent::Refused { status, body }
}

/// A failed HTTP exchange in a few words that say which kind it was (timed out, could not
/// connect, or reqwest's own words): what the clients of both services log and report.
pub fn describe(err: &reqwest::Error) -> String {
    if err.is_timeout() {
        format!("timed out: {err}")
    } else if err.is_connect() {
        format!("cannot connect: {err}")
    } else {
        err.to_string()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn only_answers_that_say_try_later_are_transient() {
        let body = br#"{"error":"busy","code":"unavailable"}"#;
        for status in [
            StatusCode::SERVICE_UNAVAILABLE,
            StatusCode::TOO_MANY_REQUESTS,
        ] {
            let Sent::Transient(reason) = sort_failure("task-service", status, body) else {
                panic!("{status} is not transient");
            };
            assert!(reason.contains("task-service answered"), "{reason}");
            assert!(reason.contains("unavailable: busy"), "{reason}");
        }
        let stopped = sort_failure(
            "task-service",
            StatusCode::CONFLICT,
            br#"{"error":"stopped","code":"generator_stopped"}"#,
        );
        let Sent::Refused { status, body } = stopped else {
            panic!("a 409 is a refusal");
        };
        assert_eq!(
            (status, body.code),
            (StatusCode::CONFLICT, ErrorCode::GeneratorStopped)
        );
    }

    #[test]
    fn a_refusal_that_is_not_json_keeps_its_text_under_unknown() {
        let Sent::Refused { body, .. } =
            sort_failure("lease-service", StatusCode::BAD_REQUEST, b"<html>no</html>")
        else {
            panic!("a 400 is a refusal");
        };
        assert_eq!(
            (body.code, body.error.as_str()),
            (ErrorCode::Unknown, "<html>no</html>")
        );
    }
}
