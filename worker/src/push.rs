//! Work in any language, behind a route of the application's own: [`PushHandler`] POSTs each
//! task to a URL (`worker --push URL`, or `WORKER_PUSH_URL`), as Google Cloud Tasks' HTTP
//! targets do, with every guarantee of a Rust handler, since it is one: the runner heartbeats
//! while the request is in flight, and drops it (closing its connection) when the task is
//! cancelled, its lease is lost or the shutdown grace runs out.
//!
//! The contract:
//! - the body: the task, as `GET /api/tasks/{id}` holds it under `task` (camelCase), the same
//!   JSON an exec command reads on stdin;
//! - headers: `Leasehold-Task-Id`, `Leasehold-Attempt`, `Leasehold-Deadline` (when a lost
//!   heartbeat would end the work, RFC 3339), `traceparent`; and with `WORKER_PUSH_SECRET`,
//!   the Standard Webhooks headers `webhook-id`, `webhook-timestamp` and `webhook-signature`
//!   over the exact body;
//! - 2xx: succeeded, the body the output (JSON when it parses, else a string, cut to the output
//!   limit); 429 or 503 with `Retry-After` (seconds or an HTTP-date): snoozed that long, the
//!   attempt not charged; 429 or 503 without it, any 5xx, a timeout, a refused or reset
//!   connection: failed retryably; any other 4xx: failed for good. The failure message is the
//!   status and the start of the body.

use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{KeyInit as _, Mac as _};
use leasehold::tasks::{MAX_ERROR_CHARS, Task};
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, DATE, HeaderMap, HeaderValue, RETRY_AFTER};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::handler::{TaskFailure, TaskHandler, TaskResult};
use crate::output::{MAX_OUTPUT_BYTES, MAX_SNOOZE, output_value, snooze};

/// POSTs each task to an endpoint.
#[derive(Debug, Clone)]
pub struct PushHandler {
    url: reqwest::Url,
    /// The URL as messages and spans show it: without its query, which may hold a token.
    shown: String,
    /// Its own pool, kept alive between tasks: one connection a slot, reused.
    client: reqwest::Client,
    timeout: Option<Duration>,
    secret: Option<WebhookSecret>,
}

impl PushHandler {
    /// A handler for `url` (checked here, so a bad one stops the worker at startup), each
    /// request limited to `timeout` (`None`: no limit), signed with `secret` when given.
    pub fn new(
        url: &str,
        timeout: Option<Duration>,
        secret: Option<WebhookSecret>,
    ) -> Result<PushHandler, String> {
        let parsed = reqwest::Url::parse(url)
            .map_err(|err| format!("the push URL {url:?} does not parse: {err}"))?;
        if parsed.scheme() != "http" {
            // The worker is built without TLS: it runs beside its application, as a sidecar.
            return Err(format!(
                "the push URL {url:?} is not http://: the worker pushes to an application beside \
                 it (the same pod or host), in plain HTTP"
            ));
        }
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(format!("the push URL {url:?} names no host"));
        }
        // A credential in the URL would reach the task's failure messages and its spans.
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(
                "the push URL holds a user or a password: sign pushes with WORKER_PUSH_SECRET \
                 instead"
                    .to_owned(),
            );
        }
        let client = reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(60))
            // A redirect would turn the POST into a GET of another page (a login form's 200
            // would pass for success) or send the signed task elsewhere: a 3xx is an answer.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|err| format!("cannot build the push client: {err}"))?;
        let mut shown = parsed.clone();
        shown.set_query(None);
        Ok(PushHandler {
            shown: shown.to_string(),
            url: parsed,
            client,
            timeout,
            secret,
        })
    }

    async fn run(&self, task: Task, cancel: CancellationToken) -> TaskResult {
        // A client span inside the task's: the application's own spans join the trace.
        let span = leasehold::telemetry::client_span("POST", &self.shown);
        let answer = self.push(task, cancel).instrument(span.clone()).await;
        match &answer {
            Ok(answer) => leasehold::telemetry::record_response(&span, Ok(answer.0.as_u16())),
            Err(failure) => leasehold::telemetry::record_response(&span, Err(&failure.message)),
        }
        let (status, headers, body, cut) = answer?;
        judge(status, &headers, &body, cut)
    }

    /// The task sent, and the answer, or why there is none.
    async fn push(&self, task: Task, cancel: CancellationToken) -> Result<Answer, TaskFailure> {
        let body = serde_json::to_vec(&task)
            .map_err(|err| TaskFailure::retryable(format!("cannot write the task: {err}")))?;
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert("leasehold-task-id", HeaderValue::from(task.id));
        headers.insert("leasehold-attempt", HeaderValue::from(task.attempts));
        if let Some(deadline) = task.must_heart_beat_before
            && let Ok(value) = HeaderValue::from_str(&deadline.to_rfc3339())
        {
            headers.insert("leasehold-deadline", value);
        }
        headers.extend(leasehold::telemetry::inject());
        if let Some(secret) = &self.secret {
            let id = format!("task_{}", task.id);
            let timestamp = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs();
            let signature = secret.sign(&id, timestamp, &body);
            for (name, value) in [
                ("webhook-id", id),
                ("webhook-timestamp", timestamp.to_string()),
                ("webhook-signature", signature),
            ] {
                if let Ok(value) = HeaderValue::from_str(&value) {
                    headers.insert(name, value);
                }
            }
        }
        let mut request = self
            .client
            .post(self.url.clone())
            .headers(headers)
            .body(body);
        if let Some(limit) = self.timeout {
            request = request.timeout(limit);
        }
        // A stop drops the request, which closes its connection: the application sees its
        // client gone, and nothing it answers afterwards is used.
        let answer = tokio::select! {
            answer = exchange(request) => answer,
            () = cancel.cancelled() => {
                return Err(TaskFailure::retryable("stopped: the task was cancelled or lost"));
            }
        };
        answer.map_err(|err| {
            TaskFailure::retryable(if err.is_timeout() {
                format!("timed out after {:?}", self.timeout.unwrap_or_default())
            } else {
                format!(
                    "no answer from {}: {}",
                    self.shown,
                    leasehold::describe_http_error(&err.without_url())
                )
            })
        })
    }
}

/// An answer: its status, its headers, its body (cut to the output limit) and whether it was
/// cut.
type Answer = (StatusCode, HeaderMap, Vec<u8>, bool);

/// The request sent and its answer read, its body cut to the output limit.
async fn exchange(request: reqwest::RequestBuilder) -> Result<Answer, reqwest::Error> {
    let mut response = request.send().await?;
    let status = response.status();
    let headers = response.headers().clone();
    let mut body = Vec::new();
    let mut cut = false;
    // Reading stops at the limit: the rest is not waited for, and the connection, not
    // reusable then, is closed.
    while let Some(chunk) = response.chunk().await? {
        let room = MAX_OUTPUT_BYTES.saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if chunk.len() > room {
            cut = true;
            break;
        }
    }
    Ok((status, headers, body, cut))
}

/// An answer's outcome, by its status (Cloud Tasks' HTTP targets, in words).
fn judge(status: StatusCode, headers: &HeaderMap, body: &[u8], cut: bool) -> TaskResult {
    if status.is_success() {
        return Ok(output_value("body", body, cut));
    }
    let said = || {
        let text = String::from_utf8_lossy(body);
        let text = text.trim();
        let mut message = format!("answered {status}");
        if !text.is_empty() {
            message.push_str(": ");
            message.extend(text.chars().take(MAX_ERROR_CHARS - 64));
        }
        message
    };
    if status.is_redirection() {
        let to = headers
            .get(reqwest::header::LOCATION)
            .and_then(|to| to.to_str().ok())
            .unwrap_or("nowhere said");
        return Err(TaskFailure::permanent(format!(
            "answered {status}, a redirect to {to}: the push URL must name the route itself"
        )));
    }
    if matches!(
        status,
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
    ) {
        return Err(match retry_after(headers) {
            Some(delay) => snooze(delay),
            None => TaskFailure::retryable(said()),
        });
    }
    if status.is_client_error() {
        return Err(TaskFailure::permanent(said()));
    }
    Err(TaskFailure::retryable(said()))
}

/// `Retry-After` as a delay: seconds, or an HTTP-date read against the answer's own `Date`
/// (both the application's clock, so the worker's clock does not enter), else against now.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds.min(MAX_SNOOZE.as_secs())));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    let now = headers
        .get(DATE)
        .and_then(|date| date.to_str().ok())
        .and_then(|date| httpdate::parse_http_date(date).ok())
        .unwrap_or_else(SystemTime::now);
    Some(at.duration_since(now).unwrap_or_default().min(MAX_SNOOZE))
}

impl TaskHandler for PushHandler {
    fn handle(
        &self,
        task: Task,
        cancel: CancellationToken,
    ) -> impl Future<Output = TaskResult> + Send {
        self.run(task, cancel)
    }
}

/// A Standard Webhooks signing secret: `whsec_` and the key in base64 (or the base64 alone).
#[derive(Clone)]
pub struct WebhookSecret(Vec<u8>);

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookSecret(..)")
    }
}

impl std::str::FromStr for WebhookSecret {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let encoded = text.trim().strip_prefix("whsec_").unwrap_or(text.trim());
        let key = BASE64
            .decode(encoded)
            .map_err(|_| "is not whsec_ followed by the key in base64".to_owned())?;
        if key.len() < 16 {
            return Err(format!(
                "is a key of {} bytes; take at least 16 (24 to 64 as Standard Webhooks advise)",
                key.len()
            ));
        }
        Ok(WebhookSecret(key))
    }
}

impl WebhookSecret {
    /// `webhook-signature`: `v1,` and the base64 HMAC-SHA256 of `{id}.{timestamp}.{body}`.
    pub fn sign(&self, id: &str, timestamp: u64, body: &[u8]) -> String {
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_standard_webhooks_own_example() {
        // The specification's example: its secret, message id, timestamp, body and signature.
        let secret: WebhookSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".parse().unwrap();
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            secret.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1_614_265_330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn retry_after_is_seconds_or_a_date_read_against_the_answers_own_date() {
        let headers = |pairs: &[(&'static str, &str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.insert(*name, HeaderValue::from_str(value).unwrap());
            }
            map
        };
        assert_eq!(
            retry_after(&headers(&[("retry-after", "30")])),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            retry_after(&headers(&[
                ("retry-after", "Wed, 21 Oct 2015 07:28:30 GMT"),
                ("date", "Wed, 21 Oct 2015 07:28:00 GMT"),
            ])),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            retry_after(&headers(&[
                ("retry-after", "Wed, 21 Oct 2015 07:27:00 GMT"),
                ("date", "Wed, 21 Oct 2015 07:28:00 GMT"),
            ])),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after(&headers(&[("retry-after", "soon")])), None);
        assert_eq!(retry_after(&headers(&[])), None);
    }

    #[test]
    fn each_status_class_has_its_outcome() {
        let none = HeaderMap::new();
        let mut later = HeaderMap::new();
        later.insert(RETRY_AFTER, HeaderValue::from_static("7"));
        assert_eq!(
            judge(StatusCode::OK, &none, b"{\"a\":1}", false),
            Ok(serde_json::json!({"a": 1}))
        );
        assert_eq!(
            judge(StatusCode::NO_CONTENT, &none, b"", false),
            Ok(serde_json::json!(""))
        );
        for status in [
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::SERVICE_UNAVAILABLE,
        ] {
            let snoozed = judge(status, &later, b"", false).unwrap_err();
            assert_eq!(snoozed.snooze, Some(Duration::from_secs(7)));
            let failed = judge(status, &none, b"busy", false).unwrap_err();
            assert!(failed.retryable && failed.snooze.is_none(), "{failed:?}");
            assert!(failed.message.contains("busy"), "{failed:?}");
        }
        let bad = judge(StatusCode::UNPROCESSABLE_ENTITY, &none, b"no", false).unwrap_err();
        assert!(!bad.retryable, "{bad:?}");
        let broken = judge(StatusCode::BAD_GATEWAY, &later, b"", false).unwrap_err();
        assert!(broken.retryable && broken.snooze.is_none(), "{broken:?}");
        let mut moved = HeaderMap::new();
        moved.insert(
            reqwest::header::LOCATION,
            HeaderValue::from_static("/login"),
        );
        let redirected = judge(StatusCode::FOUND, &moved, b"", false).unwrap_err();
        assert!(!redirected.retryable, "{redirected:?}");
        assert!(redirected.message.contains("/login"), "{redirected:?}");
        // A snooze charges no attempt: a zero one would come back at once, for ever.
        let mut now = HeaderMap::new();
        now.insert(RETRY_AFTER, HeaderValue::from_static("0"));
        let soon = judge(StatusCode::SERVICE_UNAVAILABLE, &now, b"", false).unwrap_err();
        assert_eq!(soon.snooze, Some(crate::output::MIN_SNOOZE));
    }

    #[test]
    fn only_a_plain_http_url_with_a_host_and_a_base64_secret_are_taken() {
        assert!(PushHandler::new("http://127.0.0.1:8000/work", None, None).is_ok());
        for bad in [
            "not a url",
            "https://example.com/",
            "ftp://x/",
            "http://",
            "http://user:password@127.0.0.1/work",
        ] {
            assert!(PushHandler::new(bad, None, None).is_err(), "{bad}");
        }
        assert!("whsec_not*base64".parse::<WebhookSecret>().is_err());
        assert!("whsec_c2hvcnQ=".parse::<WebhookSecret>().is_err());
    }
}
