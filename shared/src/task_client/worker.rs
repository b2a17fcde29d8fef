//! The worker's calls: claim, heartbeat, complete (alone or many at once) and fail. Each
//! exchange is a trace of its own, tagged with the task, so that searching by task id shows the
//! task's whole life.

use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use tracing::Instrument;

use super::{CallError, TaskClient};
use crate::tasks::{
    ClaimNext, ClaimTasks, CompleteItem, CompleteTask, CompleteTasks, CompletedTasks, FailTask,
    Heartbeat, MAX_CLAIM_WAIT_MS, SnoozeTask, Task,
};
use crate::workers::{ClaimantLease, WorkerBeat, WorkerGone, WorkerLease};
use crate::{ErrorBody, ErrorCode};

impl TaskClient {
    /// `POST /api/tasks/next`: the tasks claimed (none when nothing is due). Without `limit` the
    /// service answers with one task; with it, with a list.
    pub async fn claim(
        &self,
        processor: &str,
        queue: Option<&str>,
        limit: Option<i64>,
    ) -> Result<Vec<Task>, CallError> {
        self.claim_waiting(processor, queue, limit, Duration::ZERO)
            .await
    }

    /// [`TaskClient::claim`], waiting up to `wait` (at most [`MAX_CLAIM_WAIT_MS`]) for a task
    /// to become due when none is: the request's own timeout is longer by `wait`. A
    /// task-service that does not know `wait_ms` answers at once, as to [`TaskClient::claim`].
    pub async fn claim_waiting(
        &self,
        processor: &str,
        queue: Option<&str>,
        limit: Option<i64>,
        wait: Duration,
    ) -> Result<Vec<Task>, CallError> {
        self.claim_covered(processor, queue, limit, wait, None)
            .await
    }

    /// [`TaskClient::claim_waiting`], with the tasks covered by the worker process's liveness
    /// lease `worker` (the id it beats under and the fence of its last answered beat) rather
    /// than by a lease each.
    pub async fn claim_covered(
        &self,
        processor: &str,
        queue: Option<&str>,
        limit: Option<i64>,
        wait: Duration,
        worker: Option<&ClaimantLease>,
    ) -> Result<Vec<Task>, CallError> {
        let wait = wait.min(Duration::from_millis(MAX_CLAIM_WAIT_MS));
        let body = ClaimTasks {
            processor: processor.to_owned(),
            queue: queue.map(str::to_owned),
            limit,
            wait_ms: (!wait.is_zero()).then(|| u64::try_from(wait.as_millis()).unwrap_or(0)),
            worker: worker.cloned(),
        };
        let span = tracing::info_span!(
            parent: None,
            "claim tasks",
            task.processor = %processor,
            task.queue = queue.unwrap_or(""),
            task.id = tracing::field::Empty,
            task.ids = tracing::field::Empty,
            task.fence = tracing::field::Empty,
        );
        let answer = self
            .send_waiting(
                reqwest::Method::POST,
                "/api/tasks/next",
                &[],
                Some(&body),
                wait,
            )
            .instrument(span.clone())
            .await?;
        let tasks = parse_claim(&answer.body)?;
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
        self.update(&format!("/api/tasks/{id}/heartbeat"), &body)
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
        self.update(&format!("/api/tasks/{id}/complete"), &body)
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
        Ok(self.complete_then_claim(processor, tasks, None).await?.0)
    }

    /// [`TaskClient::complete_many`] that also claims the next tasks (`next`), in the same
    /// request and transaction. Besides the completions' results: the claimed tasks (possibly
    /// none), the claim's refusal as a whole, or `None` when nothing was claimed because
    /// `next` was not asked, or task-service predates it (the caller then claims on its own).
    pub async fn complete_then_claim(
        &self,
        processor: &str,
        tasks: Vec<CompleteItem>,
        next: Option<ClaimNext>,
    ) -> Result<
        (
            Vec<Result<Option<Task>, CallError>>,
            Option<Result<Vec<Task>, CallError>>,
        ),
        CallError,
    > {
        let ids: Vec<String> = tasks.iter().map(|t| t.id.to_string()).collect();
        let span = tracing::info_span!(
            parent: None,
            "tasks",
            otel.name = if next.is_some() { "complete tasks and claim" } else { "complete tasks" },
            task.ids = %ids.join(","),
            task.processor = %processor,
            task.claimed = tracing::field::Empty,
        );
        let asked = next.is_some();
        let body = CompleteTasks {
            processor: processor.to_owned(),
            tasks,
            next,
        };
        let answer: CompletedTasks = self
            .send(
                reqwest::Method::PUT,
                "/api/tasks/complete",
                &[],
                Some(&body),
            )
            .instrument(span.clone())
            .await?
            .read("a batch completion")?;
        let results = answer
            .results
            .into_iter()
            .map(|result| {
                if (200..300).contains(&result.status) {
                    Ok(result.task)
                } else {
                    Err(refusal(result.status, result.error))
                }
            })
            .collect();
        let claimed = match (asked, answer.claimed, answer.claim_refused) {
            (false, _, _) => None,
            (true, _, Some(refused)) => Some(Err(refusal(refused.status, Some(refused.error)))),
            (true, Some(claimed), None) => {
                let ids: Vec<String> = claimed.iter().map(|t| t.id.to_string()).collect();
                span.record("task.claimed", ids.join(","));
                Some(Ok(claimed))
            }
            (true, None, None) => None,
        };
        Ok((results, claimed))
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
        self.update(&format!("/api/tasks/{id}/fail"), &body)
            .instrument(task_span("fail task", id, processor, fence))
            .await
    }

    /// `PUT /api/tasks/{id}/snooze`: the task back to pending, due in `seconds`, without
    /// charging the attempt.
    pub async fn snooze(
        &self,
        id: i64,
        processor: &str,
        fence: Option<i64>,
        seconds: f64,
    ) -> Result<Option<Task>, CallError> {
        let body = SnoozeTask {
            processor: processor.to_owned(),
            fence,
            seconds,
        };
        self.update(&format!("/api/tasks/{id}/snooze"), &body)
            .instrument(task_span("snooze task", id, processor, fence))
            .await
    }

    /// A PUT whose success answer is the task. Any 2xx counts as accepted, even if the body
    /// cannot be read (the task is then `None`): the worker acts on acceptance alone.
    /// `PUT /api/workers/{id}`: this worker process's beat; the lease to present at the next.
    pub async fn worker_beat(&self, id: &str, beat: &WorkerBeat) -> Result<WorkerLease, CallError> {
        let path = format!("/api/workers/{}", crate::percent::encode(id));
        self.send(reqwest::Method::PUT, &path, &[], Some(beat))
            .await?
            .read("a worker's lease")
    }

    /// `DELETE /api/workers/{id}`: this worker process stops.
    pub async fn worker_gone(&self, id: &str, gone: &WorkerGone) -> Result<(), CallError> {
        let path = format!("/api/workers/{}", crate::percent::encode(id));
        self.send(reqwest::Method::DELETE, &path, &[], Some(gone))
            .await
            .map(drop)
    }

    async fn update<B: Serialize>(&self, path: &str, body: &B) -> Result<Option<Task>, CallError> {
        let answer = self
            .send(reqwest::Method::PUT, path, &[], Some(body))
            .await?;
        Ok(serde_json::from_slice(&answer.body).ok())
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

/// The error of a refusal reported inside an answer (a batch item's, or a claim's): transient
/// for 5xx and 429, as the exchange itself would count it.
fn refusal(status: u16, error: Option<ErrorBody>) -> CallError {
    let error = error.unwrap_or_else(|| ErrorBody::new(ErrorCode::Unknown, ""));
    if status >= 500 || status == 429 {
        CallError::Transient(format!(
            "task-service answered {status} ({}: {})",
            error.code, error.error
        ))
    } else {
        CallError::Refused {
            status,
            code: error.code,
            error: error.error,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use chrono::Utc;
    use serde_json::json;

    use super::*;
    use crate::tasks::TaskStatus;

    fn task(id: i64) -> Task {
        let now = Utc::now();
        Task {
            id,
            task_data: json!({}),
            scheduled_at: now,
            processor: Some("test".to_owned()),
            last_heart_beat_at: None,
            must_heart_beat_before: None,
            started_at: Some(now),
            processed_at: None,
            task_output: None,
            status: TaskStatus::Running,
            queue: "default".to_owned(),
            priority: 0,
            attempts: 1,
            max_attempts: 3,
            fence: Some(7),
            idempotency_key: None,
            concurrency_key: None,
            last_error: None,
            cancel_requested: false,
            created_at: now,
            updated_at: now,
            lease_ttl_ms: None,
            waited_ms: None,
        }
    }

    #[test]
    fn claim_answers_of_every_shape() {
        let one = serde_json::to_vec(&task(4)).unwrap();
        assert_eq!(parse_claim(&one).unwrap()[0].id, 4);
        let many = serde_json::to_vec(&vec![task(5), task(6)]).unwrap();
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

    #[tokio::test]
    async fn transient_failures_rotate_urls() {
        // Nothing listens on port 1 or 2 of localhost.
        let client = TaskClient::new(["http://127.0.0.1:1", "http://127.0.0.1:2"])
            .with_timeout(Duration::from_millis(500));
        assert_eq!(client.current_url(), "http://127.0.0.1:1");
        let err = client.heartbeat(1, "w", Some(1)).await.unwrap_err();
        assert!(matches!(err, CallError::Transient(_)), "{err}");
        assert_eq!(client.current_url(), "http://127.0.0.1:2");
        let _ = client.heartbeat(1, "w", Some(1)).await;
        assert_eq!(client.current_url(), "http://127.0.0.1:1");
    }
}
