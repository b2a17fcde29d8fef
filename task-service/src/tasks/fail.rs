//! A worker's failure of its task: retried after a backoff, or dead once its attempts are
//! used or the failure is permanent.

use diesel_async::AsyncConnection;
use leasehold::server::{ApiError, validate_name};
use leasehold::tasks::{FailTask, Task, TaskStatus};
use tracing::field::Empty;

use super::Transition;
use super::owner::{finish, owned, prove_end};
use crate::context::Context;
use crate::repo::{self, Db};
use leasehold::tasks::MAX_ERROR_CHARS;

#[tracing::instrument(name = "fail task", skip_all, fields(
    task.id = id,
    task.processor = %request.processor,
    task.fence = request.fence.unwrap_or_default(),
    task.queue = Empty,
    task.status = Empty,
))]
pub async fn fail(
    conn: &mut Db,
    engine: &Context,
    id: i64,
    request: &FailTask,
) -> Result<Task, ApiError> {
    validate_name("processor", &request.processor)?;
    // PostgreSQL text cannot hold NUL; the error is for people, so it is cleaned, not refused.
    let error: String = request
        .error
        .chars()
        .filter(|c| *c != '\0')
        .take(MAX_ERROR_CHARS)
        .collect();
    let processor = request.processor.as_str();
    let outcome = conn
        .transaction::<_, ApiError, _>(async |conn| {
            let task = match owned(conn, id, processor, request.fence, Some(&error)).await? {
                Ok(task) => task,
                Err(cancelled) => return Ok(cancelled),
            };
            prove_end(engine, &task, processor, "fail").await?;
            let queue = task.queue.as_str();
            let row = if request.requeue {
                engine
                    .metrics
                    .failed
                    .with_label_values(&[queue, "requeued"])
                    .inc();
                repo::mark_retry(conn, id, Some(&error), 0.0, true).await?
            } else if !request.retryable || task.attempts >= task.max_attempts {
                engine
                    .metrics
                    .failed
                    .with_label_values(&[queue, "dead"])
                    .inc();
                engine
                    .metrics
                    .dead
                    .with_label_values(&[queue, "failed"])
                    .inc();
                let reason = if request.retryable {
                    format!(
                        "attempt {} of {} failed: {error}",
                        task.attempts, task.max_attempts
                    )
                } else {
                    format!("failed, not retryable: {error}")
                };
                repo::mark_final(conn, id, TaskStatus::Dead, Some(&reason)).await?
            } else {
                engine
                    .metrics
                    .failed
                    .with_label_values(&[queue, "retry"])
                    .inc();
                repo::mark_retry(
                    conn,
                    id,
                    Some(&error),
                    engine.retry_delay(task.attempts),
                    false,
                )
                .await?
            };
            Ok(Transition::Done(row))
        })
        .await?;
    finish(engine, outcome, processor).await
}
