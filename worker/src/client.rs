//! A small client of task-service's worker API (`/api/tasks/next`, `/{id}/heartbeat`,
//! `/{id}/complete`, `/{id}/fail`).
//!
//! Every call is one HTTP exchange: retrying is the caller's business, since only the caller
//! knows how long a task's lease still holds. A connection error, a timeout, a 5xx or 429 answer,
//! or an unreadable success body is [`CallError::Transient`] and moves the client on to the next
//! configured URL; any other non-2xx answer is [`CallError::Refused`] with task-service's `code`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tracing::Instrument;

use leasehold::ErrorBody;
use leasehold::tasks::{
    ClaimTasks, CompleteItem, CompleteTask, CompleteTasks, CompletedTasks, FailTask, Heartbeat,
    Task,
};
use reqwest::StatusCode;
use serde::Serialize;
use serde_json::Value;

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
        code: String,
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
    pub fn code(&self) -> Option<&str> {
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
    urls: Vec<String>,
    current: AtomicUsize,
}

impl TaskClient {
    /// `urls` without trailing slashes; `timeout` bounds each request; `token`, if any, is sent
    /// as a bearer token with every request.
    pub fn new(
        urls: Vec<String>,
        timeout: Duration,
        token: Option<&leasehold::api::Secret>,
    ) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .default_headers(leasehold::api::Secret::bearer_headers(token))
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(2)))
            .build()?;
        Ok(Self {
            http,
            urls,
            current: AtomicUsize::new(0),
        })
    }

    /// The URL the next call goes to.
    pub fn current_url(&self) -> &str {
        let index = self.current.load(Ordering::Relaxed) % self.urls.len().max(1);
        self.urls.get(index).map_or("", String::as_str)
    }

    /// `POST /api/tasks/next`: the tasks claimed (none when nothing is due). Without `limit` the
    /// service answers with one task; with it, with a list.
    pub async fn claim(
        &self,
        processor: &str,
        queue: Option<&str>,
        limit: Option<i64>,
    ) -> Result<Vec<Task>, CallError> {
        let body = ClaimTasks {
            processor: processor.to_owned(),
            queue: queue.map(str::to_owned),
            limit,
        };
        // Each exchange with task-service is a trace of its own, tagged with the task, so that
        // searching by task id shows the task's whole life.
        let span = tracing::info_span!(
            parent: None,
            "claim tasks",
            task.processor = %processor,
            task.queue = queue.unwrap_or(""),
            task.id = tracing::field::Empty,
            task.ids = tracing::field::Empty,
            task.fence = tracing::field::Empty,
        );
        let bytes = self
            .send(reqwest::Method::POST, "/api/tasks/next".to_owned(), &body)
            .instrument(span.clone())
            .await?;
        let tasks = parse_claim(&bytes)?;
        if let [task] = tasks.as_slice() {
            span.record("task.id", task.id);
            if let Some(fence) = task.fence {
                span.record("task.fence", fence);
            }
        }
        let ids: Vec<String> = tasks.iter().map(|t| t.id.to_string()).collect();
        span.record("task.ids", ids.join(","));
        Ok(tasks)
    }

    /// `PUT /api/tasks/{id}/heartbeat`.
    pub async fn heartbeat(
        &self,
        id: i64,
        processor: &str,
        fence: Option<i64>,
    ) -> Result<Option<Task>, CallError> {
        let body = Heartbeat {
            processor: processor.to_owned(),
            fence,
        };
        self.update(format!("/api/tasks/{id}/heartbeat"), &body)
            .instrument(task_span("heartbeat task", id, processor, fence))
            .await
    }

    /// `PUT /api/tasks/{id}/complete`.
    pub async fn complete(
        &self,
        id: i64,
        processor: &str,
        fence: Option<i64>,
        task_output: Value,
    ) -> Result<Option<Task>, CallError> {
        let body = CompleteTask {
            processor: processor.to_owned(),
            task_output,
            fence,
        };
        self.update(format!("/api/tasks/{id}/complete"), &body)
            .instrument(task_span("complete task", id, processor, fence))
            .await
    }

    /// `PUT /api/tasks/complete`: several completions in one request. One result per item, in
    /// order: `Ok` for an accepted completion, the refusal it got otherwise. A failure of the
    /// whole exchange is the `Err`.
    pub async fn complete_many(
        &self,
        processor: &str,
        tasks: Vec<CompleteItem>,
    ) -> Result<Vec<Result<Option<Task>, CallError>>, CallError> {
        let ids: Vec<String> = tasks.iter().map(|t| t.id.to_string()).collect();
        let span = tracing::info_span!(
            parent: None,
            "tasks",
            otel.name = "complete tasks",
            task.ids = %ids.join(","),
            task.processor = %processor,
        );
        let body = CompleteTasks {
            processor: processor.to_owned(),
            tasks,
        };
        let bytes = self
            .send(
                reqwest::Method::PUT,
                "/api/tasks/complete".to_owned(),
                &body,
            )
            .instrument(span)
            .await?;
        let answer: CompletedTasks = serde_json::from_slice(&bytes).map_err(|err| {
            CallError::Transient(format!("unreadable answer to a batch completion: {err}"))
        })?;
        Ok(answer
            .results
            .into_iter()
            .map(|result| {
                if (200..300).contains(&result.status) {
                    return Ok(result.task);
                }
                let error = result
                    .error
                    .unwrap_or_else(|| ErrorBody::new("unknown", ""));
                if result.status >= 500 || result.status == 429 {
                    Err(CallError::Transient(format!(
                        "task-service answered {} ({}: {})",
                        result.status, error.code, error.error
                    )))
                } else {
                    Err(CallError::Refused {
                        status: result.status,
                        code: error.code,
                        error: error.error,
                    })
                }
            })
            .collect())
    }

    /// `PUT /api/tasks/{id}/fail`. `requeue` hands the task back without charging the attempt.
    pub async fn fail(
        &self,
        id: i64,
        processor: &str,
        fence: Option<i64>,
        error: &str,
        retryable: bool,
        requeue: bool,
    ) -> Result<Option<Task>, CallError> {
        let body = FailTask {
            processor: processor.to_owned(),
            error: error.to_owned(),
            fence,
            retryable,
            requeue,
        };
        self.update(format!("/api/tasks/{id}/fail"), &body)
            .instrument(task_span("fail task", id, processor, fence))
            .await
    }

    /// A PUT whose success answer is the task. Any 2xx counts as accepted, even if the body
    /// cannot be read (the task is then `None`).
    async fn update<B: Serialize>(
        &self,
        path: String,
        body: &B,
    ) -> Result<Option<Task>, CallError> {
        let bytes = self.send(reqwest::Method::PUT, path, body).await?;
        Ok(serde_json::from_slice(&bytes).ok())
    }

    /// One exchange with the current URL; on a transient failure the next URL becomes current.
    async fn send<B: Serialize>(
        &self,
        method: reqwest::Method,
        path: String,
        body: &B,
    ) -> Result<Vec<u8>, CallError> {
        let count = self.urls.len().max(1);
        let index = self.current.load(Ordering::Relaxed) % count;
        let base = self.urls.get(index).map_or("", String::as_str);
        let url = format!("{base}{path}");
        let result = exchange(&self.http, method, &url, body).await;
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

/// The root span of one exchange about task `id` (a trace of its own).
fn task_span(name: &'static str, id: i64, processor: &str, fence: Option<i64>) -> tracing::Span {
    tracing::info_span!(
        parent: None,
        "task",
        otel.name = name,
        task.id = id,
        task.processor = %processor,
        task.fence = fence.unwrap_or_default(),
    )
}

async fn exchange<B: Serialize>(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: &B,
) -> Result<Vec<u8>, CallError> {
    let span = leasehold::telemetry::client_span(method.as_str(), url);
    let sent = async {
        http.request(method, url)
            .headers(leasehold::telemetry::inject())
            .json(body)
            .send()
            .await
    }
    .instrument(span.clone())
    .await;
    let response = sent.map_err(|err| {
        let reason = leasehold::lease_client::describe(&err);
        leasehold::telemetry::record_response(&span, Err(&reason));
        CallError::Transient(reason)
    })?;
    let status = response.status();
    leasehold::telemetry::record_response(&span, Ok(status.as_u16()));
    let bytes = response
        .bytes()
        .await
        .map_err(|err| CallError::Transient(leasehold::lease_client::describe(&err)))?;
    if status.is_success() {
        return Ok(bytes.to_vec());
    }
    let body: Option<ErrorBody> = serde_json::from_slice(&bytes).ok();
    if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
        let detail = body.map_or_else(String::new, |b| format!(" ({}: {})", b.code, b.error));
        return Err(CallError::Transient(format!(
            "task-service answered {status}{detail}"
        )));
    }
    let (code, error) = match body {
        Some(body) => (body.code, body.error),
        None => (
            "unknown".to_owned(),
            String::from_utf8_lossy(&bytes).chars().take(200).collect(),
        ),
    };
    Err(CallError::Refused {
        status: status.as_u16(),
        code,
        error,
    })
}

/// The claim answer: a task, a list of tasks, or `{"message": ...}` when none is due.
fn parse_claim(bytes: &[u8]) -> Result<Vec<Task>, CallError> {
    let unreadable =
        |err: serde_json::Error| CallError::Transient(format!("unreadable claim answer: {err}"));
    let value: Value = serde_json::from_slice(bytes).map_err(unreadable)?;
    match value {
        Value::Array(_) => serde_json::from_value(value).map_err(unreadable),
        Value::Object(ref fields) if fields.contains_key("id") => {
            Ok(vec![serde_json::from_value(value).map_err(unreadable)?])
        }
        Value::Object(_) | Value::Null => Ok(Vec::new()),
        other => Err(CallError::Transient(format!(
            "unexpected claim answer: {other}"
        ))),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::handler::tests::task;

    #[test]
    fn claim_answers_of_every_shape() {
        let one = serde_json::to_vec(&task(4, json!({}))).unwrap();
        assert_eq!(parse_claim(&one).unwrap()[0].id, 4);
        let many = serde_json::to_vec(&vec![task(5, json!({})), task(6, json!({}))]).unwrap();
        let ids: Vec<_> = parse_claim(&many).unwrap().iter().map(|t| t.id).collect();
        assert_eq!(ids, [5, 6]);
        assert!(parse_claim(b"[]").unwrap().is_empty());
        assert!(
            parse_claim(br#"{"message":"no tasks"}"#)
                .unwrap()
                .is_empty()
        );
        assert!(matches!(
            parse_claim(b"<html>"),
            Err(CallError::Transient(_))
        ));
        assert!(matches!(
            parse_claim(br#"{"id":"x"}"#),
            Err(CallError::Transient(_))
        ));
    }

    #[test]
    fn losses_are_409_and_404() {
        let refused = |status| CallError::Refused {
            status,
            code: "x".to_owned(),
            error: String::new(),
        };
        assert!(refused(409).is_loss());
        assert!(refused(404).is_loss());
        assert!(!refused(400).is_loss());
        assert!(!CallError::Transient("x".to_owned()).is_loss());
    }

    #[tokio::test]
    async fn transient_failures_rotate_urls() {
        // Nothing listens on port 1 of localhost.
        let client = TaskClient::new(
            vec![
                "http://127.0.0.1:1".to_owned(),
                "http://127.0.0.1:2".to_owned(),
            ],
            Duration::from_millis(500),
            None,
        )
        .unwrap();
        assert_eq!(client.current_url(), "http://127.0.0.1:1");
        let err = client.heartbeat(1, "w", Some(1)).await.unwrap_err();
        assert!(matches!(err, CallError::Transient(_)), "{err}");
        assert_eq!(client.current_url(), "http://127.0.0.1:2");
        let _ = client.heartbeat(1, "w", Some(1)).await;
        assert_eq!(client.current_url(), "http://127.0.0.1:1");
    }
}
