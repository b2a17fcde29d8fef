//! What every worker transition of a task (heartbeat, fail, snooze, complete) rests on. A
//! worker's transition is allowed only to the task's current worker (by name, and by fence when
//! given), and its lease call is made while the row is locked, so lease-service's answer and
//! the row's change cannot disagree. A cancellation asked for
//! meanwhile wins over the worker's transition: the task ends as cancelled, and the worker is
//! told to stop.

use leasehold::ErrorCode;
use leasehold::LeaseError;
use leasehold::server::ApiError;
use leasehold::tasks::{Task, TaskStatus};

use super::refusal::{finished, lease_refusal};
use super::{Transition, cover, locked, to_api};
use crate::context::Context;
use crate::repo::{self, Db, TaskRow};

/// Locks the task for a transition by its worker: refused unless `processor` (with `fence`)
/// owns it; `Ok(Err(..))` when a cancellation asked for meanwhile ends it instead (recording
/// `error`, if given); `Ok(Ok(task))` to go on.
pub(super) async fn owned(
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

/// The proof at the end of a worker's work on the task (a failure, a snooze): the task's own
/// lease is released (only its current holder can); a shared one is checked.
pub(super) async fn prove_end(
    engine: &Context,
    task: &TaskRow,
    processor: &str,
    operation: &str,
) -> Result<(), ApiError> {
    let refused = |err| lease_refusal(engine, operation, err);
    match task.shared_lease() {
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

/// After the transition's commit: release the lease of a task that a cancellation ended, and
/// answer.
pub(super) async fn finish(
    engine: &Context,
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
