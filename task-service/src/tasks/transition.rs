//! A running task's other transitions: its worker's heartbeat, failure and snooze, and an operator's
//! retry and cancel. A worker's transition is allowed only to the task's current worker (by
//! name, and by fence when given), and its lease call is made while the row is locked, so
//! lease-service's answer and the row's change cannot disagree. A cancellation asked for
//! meanwhile wins over the worker's transition: the task ends as cancelled, and the worker is
//! told to stop.

use std::time::Duration;

use diesel_async::AsyncConnection;
use leasehold::ErrorCode;
use leasehold::LeaseError;
use leasehold::server::{ApiError, validate_name};
use leasehold::tasks::{FailTask, Heartbeat, MAX_SNOOZE_SECONDS, SnoozeTask, Task, TaskStatus};
use tracing::field::Empty;

use super::refusal::{finished, lease_refusal};
use super::validate::MAX_ERROR_BYTES;
use super::{Engine, Transition, cover, locked, to_api};
use crate::repo::{self, Db, TaskRow};

/// Locks the task for a transition by its worker: refused unless `processor` (with `fence`)
/// owns it; `Ok(Err(..))` when a cancellation asked for meanwhile ends it instead (recording
/// `error`, if given); `Ok(Ok(task))` to go on.
async fn owned(
    conn: &mut Db,
    id: i64,
    processor: &str,
    fence: Option<i64>,
    error: Option<&str>,
) -> Result<Result<TaskRow, Transition>, ApiError> {
    let task = locked(conn, id).await?;
    check_owner(&task, processor, fence)?;
    if task.cancel_requested {
        let row = repo::mark_final(conn, id, TaskStatus::Cancelled, error).await?;
        return Ok(Err(Transition::Cancelled(row)));
    }
    Ok(Ok(task))
}

#[tracing::instrument(name = "heartbeat task", skip_all, fields(
    task.id = id,
    task.processor = %request.processor,
    task.fence = request.fence.unwrap_or_default(),
    task.queue = Empty,
    task.status = Empty,
))]
pub async fn heartbeat(
    conn: &mut Db,
    engine: &Engine,
    id: i64,
    request: &Heartbeat,
) -> Result<Task, ApiError> {
    validate_name("processor", &request.processor)?;
    let processor = request.processor.as_str();
    let (outcome, ttl) = conn
        .transaction::<_, ApiError, _>(async |conn| {
            let task = match owned(conn, id, processor, request.fence, None).await? {
                Ok(task) => task,
                Err(cancelled) => return Ok((cancelled, None)),
            };
            let (expiry, ttl) = keep_alive(engine, &task, processor).await?;
            let row = repo::record_heartbeat(conn, id, expiry, engine.lease_ttl).await?;
            Ok((Transition::Done(row), Some(ttl)))
        })
        .await?;
    let task = finish(engine, outcome, processor).await?;
    // The answer says how long the lease lasts from here, for the worker's deadline.
    Ok(match ttl {
        Some(ttl) => task.with_lease_ttl(ttl),
        None => task,
    })
}

/// A heartbeat's proof that the claim's lease lives, with when the claim runs out (none: the
/// task lease TTL from now, by the database's clock) and how long the worker may count on it
/// from here. The task's own lease is renewed, and the claim runs out with it. A shared lease
/// (its worker process's, which the process's own beats renew) is checked, and the claim runs
/// out a task lease TTL after this heartbeat, or sooner with the shared lease: a process's task
/// stays its own only while both its heartbeats and its process's lease go on, so a task whose
/// claim answer never reached its worker is not kept by the process's lease.
async fn keep_alive(
    engine: &Engine,
    task: &TaskRow,
    processor: &str,
) -> Result<(Option<chrono::DateTime<chrono::Utc>>, Duration), ApiError> {
    let refused = |err| lease_refusal(engine, "heartbeat", err);
    let Some(lease) = cover::shared(task) else {
        let lease = engine
            .leases
            .renew(
                &engine.resource(task.id),
                processor,
                task.lease_proof(),
                None,
            )
            .await
            .map_err(refused)?;
        let ttl = Duration::from_secs(u64::try_from(lease.ttl_seconds).unwrap_or(0));
        return Ok((Some(lease.expires_at), ttl));
    };
    let checks = cover::check(engine, &[lease]).await.map_err(refused)?;
    let Some(check) = checks.first() else {
        return Err(refused(LeaseError::Unavailable("no answer".to_owned())));
    };
    cover::verdict(check).map_err(refused)?;
    let lease_left =
        Duration::from_millis(u64::try_from(check.expires_in_ms.unwrap_or(0)).unwrap_or(0));
    Ok((None, engine.lease_ttl.min(lease_left)))
}

/// The proof at the end of a worker's work on the task (a failure, a snooze): the task's own
/// lease is released (only its current holder can); a shared one is checked.
async fn prove_end(
    engine: &Engine,
    task: &TaskRow,
    processor: &str,
    operation: &str,
) -> Result<(), ApiError> {
    let refused = |err| lease_refusal(engine, operation, err);
    match cover::shared(task) {
        None => engine
            .leases
            .release(&engine.resource(task.id), processor, task.lease_proof())
            .await
            .map(drop)
            .map_err(refused),
        Some(lease) => {
            let checks = cover::check(engine, &[lease]).await.map_err(refused)?;
            match checks.first() {
                Some(check) => cover::verdict(check).map_err(refused),
                None => Err(refused(LeaseError::Unavailable("no answer".to_owned()))),
            }
        }
    }
}

#[tracing::instrument(name = "fail task", skip_all, fields(
    task.id = id,
    task.processor = %request.processor,
    task.fence = request.fence.unwrap_or_default(),
    task.queue = Empty,
    task.status = Empty,
))]
pub async fn fail(
    conn: &mut Db,
    engine: &Engine,
    id: i64,
    request: &FailTask,
) -> Result<Task, ApiError> {
    validate_name("processor", &request.processor)?;
    // PostgreSQL text cannot hold NUL; the error is for people, so it is cleaned, not refused.
    let error: String = request
        .error
        .chars()
        .filter(|c| *c != '\0')
        .take(MAX_ERROR_BYTES / 4)
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

/// The worker's snooze: its task back to pending, due in `seconds`, the attempt not charged
/// (the task was not tried, only put off), and its lease released in the same transaction, with
/// the fence. A cancellation asked for meanwhile wins, as for a failure.
#[tracing::instrument(name = "snooze task", skip_all, fields(
    task.id = id,
    task.processor = %request.processor,
    task.fence = request.fence.unwrap_or_default(),
    task.queue = Empty,
    task.status = Empty,
))]
pub async fn snooze(
    conn: &mut Db,
    engine: &Engine,
    id: i64,
    request: &SnoozeTask,
) -> Result<Task, ApiError> {
    validate_name("processor", &request.processor)?;
    if !request.seconds.is_finite() || !(0.0..=MAX_SNOOZE_SECONDS).contains(&request.seconds) {
        return Err(ApiError::invalid(
            ErrorCode::InvalidSnooze,
            "seconds",
            format!(
                "seconds must be between 0 and {MAX_SNOOZE_SECONDS}, got {}",
                request.seconds
            ),
        ));
    }
    let processor = request.processor.as_str();
    let outcome = conn
        .transaction::<_, ApiError, _>(async |conn| {
            let task = match owned(conn, id, processor, request.fence, None).await? {
                Ok(task) => task,
                Err(cancelled) => return Ok(cancelled),
            };
            prove_end(engine, &task, processor, "snooze").await?;
            Ok(Transition::Done(
                repo::mark_retry(conn, id, None, request.seconds, true).await?,
            ))
        })
        .await?;
    finish(engine, outcome, processor).await
}

/// An operator's retry of a dead task (`POST /{id}/retry`): pending again, due now, with its
/// attempts renewed; any other status is 409 `not_dead`.
pub async fn retry(conn: &mut Db, engine: &Engine, id: i64) -> Result<Task, ApiError> {
    let row = conn
        .transaction::<_, ApiError, _>(async |conn| {
            let task = locked(conn, id).await?;
            match task.status {
                TaskStatus::Dead => Ok(repo::requeue_dead(conn, id).await?),
                other => Err(ApiError::Conflict {
                    code: ErrorCode::NotDead,
                    message: format!(
                        "task {id} is {}: only a dead task can be retried",
                        other.as_str()
                    ),
                }),
            }
        })
        .await?;
    engine
        .metrics
        .retried
        .with_label_values(&[row.queue.as_str()])
        .inc();
    tracing::info!(
        task.id = id,
        "dead task put back in its queue by an operator"
    );
    Ok(to_api(row))
}

/// A pending task is cancelled at once (200, `Ok(true)`); a running one is marked, and its
/// worker's next heartbeat or completion ends it (202, `Ok(false)`).
pub async fn cancel(conn: &mut Db, engine: &Engine, id: i64) -> Result<(Task, bool), ApiError> {
    let (row, immediate) = conn
        .transaction::<_, ApiError, _>(async |conn| {
            let task = locked(conn, id).await?;
            match task.status {
                TaskStatus::Pending => Ok((
                    repo::mark_final(conn, id, TaskStatus::Cancelled, None).await?,
                    true,
                )),
                TaskStatus::Running => Ok((repo::request_cancel(conn, id).await?, false)),
                done => Err(finished(id, done)),
            }
        })
        .await?;
    if immediate {
        engine
            .metrics
            .cancelled
            .with_label_values(&[row.queue.as_str()])
            .inc();
    }
    Ok((to_api(row), immediate))
}

/// After the transition's commit: release the lease of a task that a cancellation ended, and
/// answer.
pub(super) async fn finish(
    engine: &Engine,
    outcome: Transition,
    processor: &str,
) -> Result<Task, ApiError> {
    let row = match &outcome {
        Transition::Done(row) | Transition::Cancelled(row) => row,
    };
    let span = tracing::Span::current();
    span.record("task.queue", row.queue.as_str());
    span.record("task.status", row.status.as_str());
    // One line per request would drown the log (RUST_LOG=task_service=debug shows them).
    tracing::debug!(
        task.id = row.id,
        task.status = row.status.as_str(),
        "task updated"
    );
    match outcome {
        Transition::Done(row) => Ok(to_api(row)),
        Transition::Cancelled(row) => {
            engine
                .metrics
                .cancelled
                .with_label_values(&[row.queue.as_str()])
                .inc();
            engine.release_own_after_commit(&row, processor).await;
            Err(ApiError::Conflict {
                code: ErrorCode::Cancelled,
                message: format!("task {} was cancelled; stop working on it", row.id),
            })
        }
    }
}

/// Whether `processor` (with `fence`, if given) may act on the task as its current worker.
pub(super) fn check_owner(
    task: &TaskRow,
    processor: &str,
    fence: Option<i64>,
) -> Result<(), ApiError> {
    let status = task.status;
    if status.is_final() {
        return Err(finished(task.id, status));
    }
    if let Some(fence) = fence
        && task.fence != Some(fence)
    {
        return Err(ApiError::Conflict {
            code: ErrorCode::LeaseLost,
            message: format!(
                "fence {fence} is not the task's current fence {}: another claim superseded yours",
                task.fence.map_or("(none)".to_owned(), |f| f.to_string())
            ),
        });
    }
    if task.processor.as_deref() != Some(processor) {
        return Err(ApiError::Conflict {
            code: ErrorCode::NotOwner,
            message: format!("task {} is not claimed by {processor:?}", task.id),
        });
    }
    if status != TaskStatus::Running {
        return Err(ApiError::Conflict {
            code: ErrorCode::LeaseLost,
            message: format!("task {} is no longer running", task.id),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::fixtures;

    fn refusal(task: &TaskRow, processor: &str, fence: Option<i64>) -> Result<(), ErrorCode> {
        check_owner(task, processor, fence).map_err(|err| err.code())
    }

    #[test]
    fn the_current_worker_may_act_with_or_without_its_fence() {
        let task = fixtures::row(TaskStatus::Running, Some("w1"), Some(7));
        assert_eq!(refusal(&task, "w1", Some(7)), Ok(()));
        assert_eq!(refusal(&task, "w1", None), Ok(()));
    }

    #[test]
    fn a_superseded_fence_is_lost_even_under_the_same_name() {
        let task = fixtures::row(TaskStatus::Running, Some("w1"), Some(7));
        assert_eq!(refusal(&task, "w1", Some(6)), Err(ErrorCode::LeaseLost));
        // The fence is judged first: a stale claim learns that it lost the lease.
        assert_eq!(refusal(&task, "w2", Some(6)), Err(ErrorCode::LeaseLost));
    }

    #[test]
    fn another_worker_is_not_the_owner() {
        let task = fixtures::row(TaskStatus::Running, Some("w1"), Some(7));
        assert_eq!(refusal(&task, "w2", None), Err(ErrorCode::NotOwner));
        assert_eq!(refusal(&task, "w2", Some(7)), Err(ErrorCode::NotOwner));
    }

    #[test]
    fn a_task_no_longer_running_is_lost_and_a_finished_one_says_so() {
        let pending = fixtures::row(TaskStatus::Pending, Some("w1"), Some(7));
        assert_eq!(refusal(&pending, "w1", Some(7)), Err(ErrorCode::LeaseLost));
        for done in [
            TaskStatus::Succeeded,
            TaskStatus::Dead,
            TaskStatus::Cancelled,
        ] {
            let task = fixtures::row(done, Some("w1"), Some(7));
            assert_eq!(
                refusal(&task, "w1", Some(7)),
                Err(ErrorCode::TaskFinished),
                "{done:?}"
            );
            assert_eq!(
                refusal(&task, "w2", Some(6)),
                Err(ErrorCode::TaskFinished),
                "{done:?}"
            );
        }
    }
}
