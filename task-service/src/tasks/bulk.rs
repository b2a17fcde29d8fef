//! Bulk operations by filter, the operator's "retry all dead": `POST /api/tasks/retry`,
//! `/cancel` and `/delete`. Each touches at most a bound of matching tasks in one statement
//! (one transaction), so a filter that matches millions is worked through call by call without
//! one long lock; each is the bulk form of an operation that exists for one task, and does to
//! each task what that does.

use leasehold::ErrorCode;
use leasehold::server::ApiError;
use leasehold::tasks::{BulkResult, BulkTasks, MAX_BULK, TaskStatus};

use super::read::{check_filter, creation_bound};
use crate::context::Context;
use crate::repo::{self, BulkFilter, Db, TaskFilter};

/// What one bulk operation may touch: the statuses it allows, and those it takes by default.
struct Allowed {
    operation: &'static str,
    statuses: &'static [TaskStatus],
    default: &'static [TaskStatus],
}

const RETRY: Allowed = Allowed {
    operation: "retry",
    statuses: &[TaskStatus::Dead, TaskStatus::Cancelled],
    default: &[TaskStatus::Dead],
};
const CANCEL: Allowed = Allowed {
    operation: "cancel",
    statuses: &[TaskStatus::Pending, TaskStatus::Running],
    default: &[TaskStatus::Pending, TaskStatus::Running],
};
/// Only finished tasks: a running task's worker and lease still count on its row.
const DELETE: Allowed = Allowed {
    operation: "delete",
    statuses: &[
        TaskStatus::Succeeded,
        TaskStatus::Dead,
        TaskStatus::Cancelled,
    ],
    default: &[
        TaskStatus::Succeeded,
        TaskStatus::Dead,
        TaskStatus::Cancelled,
    ],
};

/// The request checked against what `allowed` permits, before anything is written. Its task
/// fields are checked as a listing's are ([`super::read::check_filter`]).
fn filter<'r>(request: &'r BulkTasks, allowed: &Allowed) -> Result<BulkFilter<'r>, ApiError> {
    let statuses = match request.status {
        Some(status) if allowed.statuses.contains(&status) => vec![status],
        Some(status) => {
            let names: Vec<&str> = allowed.statuses.iter().map(|s| s.as_str()).collect();
            return Err(ApiError::invalid(
                ErrorCode::InvalidStatus,
                "status",
                format!(
                    "a bulk {} takes tasks that are {}, not {}",
                    allowed.operation,
                    names.join(" or "),
                    status.as_str()
                ),
            ));
        }
        None => allowed.default.to_vec(),
    };
    let tasks = TaskFilter {
        statuses,
        queue: request.queue.as_deref(),
        processor: request.processor.as_deref(),
        key: request.key.as_deref(),
        created_after: creation_bound(request.created_after),
        created_before: creation_bound(request.created_before),
    };
    check_filter(&tasks)?;
    if let Some(ids) = &request.ids
        && ids.len() > MAX_BULK as usize
    {
        return Err(ApiError::invalid(
            ErrorCode::TooManyIds,
            "ids",
            format!("at most {MAX_BULK} ids, got {}", ids.len()),
        ));
    }
    let limit = request.limit.unwrap_or(MAX_BULK);
    if !(1..=MAX_BULK).contains(&limit) {
        return Err(ApiError::invalid(
            ErrorCode::InvalidLimit,
            "limit",
            format!("limit must be between 1 and {MAX_BULK}, got {limit}"),
        ));
    }
    Ok(BulkFilter {
        tasks,
        ids: request.ids.as_deref(),
        limit,
    })
}

fn touched(n: usize) -> BulkResult {
    BulkResult {
        touched: u64::try_from(n).unwrap_or(u64::MAX),
    }
}

/// `POST /api/tasks/retry`: dead (by default) or cancelled tasks back to pending, due now, with
/// their attempts renewed. The claims waiting for their queues are woken.
pub async fn retry_many(
    conn: &mut Db,
    engine: &Context,
    request: &BulkTasks,
) -> Result<BulkResult, ApiError> {
    let rows = repo::retry_matching(conn, &filter(request, &RETRY)?).await?;
    for row in &rows {
        engine
            .metrics
            .retried
            .with_label_values(&[row.queue.as_str()])
            .inc();
    }
    tracing::info!(
        tasks = rows.len(),
        "tasks put back in their queues by an operator"
    );
    Ok(touched(rows.len()))
}

/// `POST /api/tasks/cancel`: pending tasks cancelled at once, running ones at their worker's
/// next heartbeat.
pub async fn cancel_many(
    conn: &mut Db,
    engine: &Context,
    request: &BulkTasks,
) -> Result<BulkResult, ApiError> {
    let rows = repo::cancel_matching(conn, &filter(request, &CANCEL)?).await?;
    for row in rows.iter().filter(|r| r.status == TaskStatus::Cancelled) {
        engine
            .metrics
            .cancelled
            .with_label_values(&[row.queue.as_str()])
            .inc();
    }
    tracing::info!(tasks = rows.len(), "tasks cancelled by an operator");
    Ok(touched(rows.len()))
}

/// `POST /api/tasks/delete`: finished tasks deleted.
pub async fn delete_many(conn: &mut Db, request: &BulkTasks) -> Result<BulkResult, ApiError> {
    let rows = repo::delete_matching(conn, &filter(request, &DELETE)?).await?;
    tracing::info!(tasks = rows.len(), "finished tasks deleted by an operator");
    Ok(touched(rows.len()))
}
