//! A task's writes: create (one or many), claim, heartbeat, complete, fail, snooze, cancel and
//! retry, singly and in bulk.

use actix_web::{HttpResponse, web};
use leasehold::api::ErrorBody;
use leasehold::server::db;
use leasehold::server::peer::Peer;
use leasehold::server::{ApiError, Json};
use leasehold::tasks::{
    BulkResult, BulkTasks, ClaimAnswer, ClaimTasks, CompleteTask, CompleteTasks, CompletedTasks,
    CreateTask, CreatedTasks, FailTask, Heartbeat, NoTask, SnoozeTask, Task,
};

use crate::state::State;
use crate::tasks::{self, Created};

/// Create a task
///
/// `task_data` is a JSON object (at most 64 KiB). With an `idempotency_key`, a repeat answers
/// 200 with the first task; a repeat asking for another task is 422.
#[utoipa::path(
    post,
    path = "/api/tasks",
    tag = "tasks",
    responses(
        (status = 201, description = "The task created", body = Task, links(
            ("Get" = (operation_id = "get_by_id", parameters(("id" = "$response.body#/id")), description = "Read this task")),
            ("History" = (operation_id = "events", parameters(("id" = "$response.body#/id")), description = "This task's history")),
            ("Cancel" = (operation_id = "cancel", parameters(("id" = "$response.body#/id")), description = "Cancel this task")),
            ("Retry" = (operation_id = "retry", parameters(("id" = "$response.body#/id")), description = "Retry this task once dead")),
        )),
        (status = 200, description = "The task an earlier create with this `idempotency_key` made", body = Task),
        (status = 400, description = "`invalid_field`, `missing_field`, `malformed_json`, `too_large`", body = ErrorBody),
        (status = 409, description = "`stale_generator`, `generator_stopped`: a generator's create whose lease no longer holds", body = ErrorBody),
        (status = 422, description = "`idempotency_key_reused`: the key names another task", body = ErrorBody),
    )
)]
pub(super) async fn create(state: State, body: Json<CreateTask>) -> Result<HttpResponse, ApiError> {
    Ok(
        match tasks::create(
            &state.pool,
            &state.creates,
            &state.engine,
            body.into_inner(),
        )
        .await?
        {
            Created::New(task) => HttpResponse::Created().json(task),
            Created::Existing(task) => HttpResponse::Ok().json(task),
        },
    )
}

/// Create many tasks
///
/// Up to 1,000 creates in one transaction; one result per create, in order, each with the
/// status and body its own `POST /api/tasks` would have got.
#[utoipa::path(
    post,
    path = "/api/tasks/batch",
    tag = "tasks",
    request_body = tasks::create_many::Batch,
    responses(
        (status = 200, description = "One result per create", body = CreatedTasks),
        (status = 400, description = "`invalid_batch`, `invalid_field`, `missing_field`, `malformed_json`", body = ErrorBody),
    )
)]
pub(super) async fn create_many(
    state: State,
    body: Json<tasks::create_many::Batch>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let results = tasks::create_many(&mut conn, &state.engine, body.into_inner()).await?;
    Ok(HttpResponse::Ok().json(CreatedTasks { results }))
}

/// Claim tasks
///
/// The sample's claim: 202 with one task (a list when `limit` was given), or 200
/// `{message}` when none is due (after waiting up to `wait_ms` for one).
#[utoipa::path(
    post,
    path = "/api/tasks/next",
    tag = "tasks",
    responses(
        (status = 202, description = "The task claimed (a list of them when `limit` was given)", body = ClaimAnswer, links(
            ("Heartbeat" = (operation_id = "heartbeat", parameters(("id" = "$response.body#/id")), request_body = json!({"processor": "$response.body#/processor", "fence": "$response.body#/fence"}), description = "Heartbeat the task claimed")),
            ("Complete" = (operation_id = "complete", parameters(("id" = "$response.body#/id")), request_body = json!({"processor": "$response.body#/processor", "fence": "$response.body#/fence"}), description = "Complete the task claimed")),
            ("Fail" = (operation_id = "fail", parameters(("id" = "$response.body#/id")), request_body = json!({"processor": "$response.body#/processor", "fence": "$response.body#/fence"}), description = "Fail the task claimed")),
            ("Snooze" = (operation_id = "snooze", parameters(("id" = "$response.body#/id")), request_body = json!({"processor": "$response.body#/processor", "fence": "$response.body#/fence", "seconds": 1}), description = "Snooze the task claimed")),
        )),
        (status = 200, description = "No task is due", body = NoTask),
        (status = 400, description = "`invalid_field`, `missing_field`, `malformed_json`, `invalid_limit`, `invalid_wait`", body = ErrorBody),
        (status = 409, description = "`lease_lost`, `lease_expired`, `lease_revoked`: the worker lease the claim names is no longer held", body = ErrorBody),
    )
)]
pub(super) async fn next(
    state: State,
    body: Json<ClaimTasks>,
    client: Peer,
) -> Result<HttpResponse, ApiError> {
    let groups = (&state.claims, &state.pool);
    let mut claimed = tasks::claim(groups, &state.engine, &body, &client).await?;
    Ok(match (claimed.is_empty(), body.limit.is_some()) {
        (true, _) => HttpResponse::Ok().json(NoTask {
            message: "No tasks available".to_owned(),
        }),
        (false, true) => HttpResponse::Accepted().json(ClaimAnswer::Many(claimed)),
        (false, false) => {
            HttpResponse::Accepted().json(ClaimAnswer::One(Box::new(claimed.swap_remove(0))))
        }
    })
}

/// Complete many tasks (and claim the next)
///
/// Up to 100 completions in one transaction; one result per task, each with the status its own
/// `PUT /api/tasks/{id}/complete` would have got. With `next`, the tasks claimed after them in
/// the same transaction (`claimed`), or why the claim got none (`claimRefused`).
#[utoipa::path(
    put,
    path = "/api/tasks/complete",
    tag = "tasks",
    responses(
        (status = 200, description = "One result per completion", body = CompletedTasks),
        (status = 400, description = "`invalid_batch`, `duplicate_task`, `invalid_field`, `missing_field`, `malformed_json`, `invalid_limit`", body = ErrorBody),
    )
)]
pub(super) async fn complete_many(
    state: State,
    body: Json<CompleteTasks>,
    client: Peer,
) -> Result<HttpResponse, ApiError> {
    if let Some(next) = &body.next {
        let groups = (&state.claims, &state.pool);
        let answer =
            tasks::complete_then_claim(groups, &state.engine, &body, next, &client).await?;
        return Ok(HttpResponse::Ok().json(answer));
    }
    let mut conn = db::connection(&state.pool).await?;
    let results = tasks::complete_many(&mut conn, &state.engine, &body).await?;
    Ok(HttpResponse::Ok().json(CompletedTasks {
        results,
        claimed: None,
        claim_refused: None,
    }))
}

/// Heartbeat a task
///
/// The claimant renews its task's lease; 409 `cancelled` when an operator asked for it to stop.
#[utoipa::path(
    put,
    path = "/api/tasks/{id}/heartbeat",
    tag = "tasks",
    params(("id" = i64, Path, description = "The task's id")),
    responses(
        (status = 202, description = "The task, its lease renewed", body = Task, links(
            ("Complete" = (operation_id = "complete", parameters(("id" = "$response.body#/id")), request_body = json!({"processor": "$response.body#/processor", "fence": "$response.body#/fence"}), description = "Complete the task")),
        )),
        (status = 400, description = "`invalid_field`, `missing_field`, `malformed_json`, `invalid_fence`", body = ErrorBody),
        (status = 404, description = "`task_not_found`", body = ErrorBody),
        (status = 409, description = "`not_owner` (another processor's task), `lease_lost` (its lease expired or a newer claim superseded it), `lease_revoked`, `task_finished`, `cancelled`", body = ErrorBody),
    )
)]
pub(super) async fn heartbeat(
    state: State,
    id: web::Path<i64>,
    body: Json<Heartbeat>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let task = tasks::heartbeat(&mut conn, &state.engine, *id, &body).await?;
    Ok(HttpResponse::Accepted().json(task))
}

/// Complete a task
#[utoipa::path(
    put,
    path = "/api/tasks/{id}/complete",
    tag = "tasks",
    params(("id" = i64, Path, description = "The task's id")),
    responses(
        (status = 202, description = "The task, succeeded", body = Task),
        (status = 400, description = "`invalid_field`, `missing_field`, `malformed_json`, `invalid_fence`, `too_large`", body = ErrorBody),
        (status = 404, description = "`task_not_found`", body = ErrorBody),
        (status = 409, description = "`not_owner` (another processor's task), `lease_lost` (its lease expired or a newer claim superseded it), `lease_revoked`, `task_finished`, `cancelled`", body = ErrorBody),
    )
)]
pub(super) async fn complete(
    state: State,
    id: web::Path<i64>,
    body: Json<CompleteTask>,
) -> Result<HttpResponse, ApiError> {
    let task = tasks::complete(&state.completions, &state.engine, *id, body.into_inner()).await?;
    Ok(HttpResponse::Accepted().json(task))
}

/// Fail a task
///
/// Back to pending after a capped, jittered backoff, or dead when its attempts are used up
/// (`retryable: false`: dead at once; `requeue: true`: handed back now, the attempt not charged).
#[utoipa::path(
    put,
    path = "/api/tasks/{id}/fail",
    tag = "tasks",
    params(("id" = i64, Path, description = "The task's id")),
    responses(
        (status = 202, description = "The task, pending again or dead", body = Task),
        (status = 400, description = "`invalid_field`, `missing_field`, `malformed_json`, `invalid_fence`", body = ErrorBody),
        (status = 404, description = "`task_not_found`", body = ErrorBody),
        (status = 409, description = "`not_owner` (another processor's task), `lease_lost` (its lease expired or a newer claim superseded it), `lease_revoked`, `task_finished`, `cancelled`", body = ErrorBody),
    )
)]
pub(super) async fn fail(
    state: State,
    id: web::Path<i64>,
    body: Json<FailTask>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let task = tasks::fail(&mut conn, &state.engine, *id, &body).await?;
    Ok(HttpResponse::Accepted().json(task))
}

/// Retry tasks by filter
///
/// Dead tasks (or, with `"status": "cancelled"`, cancelled ones) back to pending with
/// fresh attempts; at most `limit` (default 1,000) per call, oldest first.
#[utoipa::path(
    post,
    path = "/api/tasks/retry",
    tag = "tasks",
    responses(
        (status = 200, description = "How many tasks it touched: repeat until `touched` is 0", body = BulkResult),
        (status = 400, description = "`invalid_field`, `invalid_status`, `too_many_ids`, `invalid_limit`, `malformed_json`", body = ErrorBody),
    )
)]
pub(super) async fn retry_many(
    state: State,
    body: Json<BulkTasks>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(tasks::retry_many(&mut conn, &state.engine, &body).await?))
}

/// Cancel tasks by filter
///
/// Pending ones now, running ones at their next heartbeat; at most `limit` per call.
#[utoipa::path(
    post,
    path = "/api/tasks/cancel",
    tag = "tasks",
    responses(
        (status = 200, description = "How many tasks it touched: repeat until `touched` is 0", body = BulkResult),
        (status = 400, description = "`invalid_field`, `invalid_status`, `too_many_ids`, `invalid_limit`, `malformed_json`", body = ErrorBody),
    )
)]
pub(super) async fn cancel_many(
    state: State,
    body: Json<BulkTasks>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(tasks::cancel_many(&mut conn, &state.engine, &body).await?))
}

/// Delete tasks by filter
///
/// Finished tasks only; at most `limit` per call.
#[utoipa::path(
    post,
    path = "/api/tasks/delete",
    tag = "tasks",
    responses(
        (status = 200, description = "How many tasks it touched: repeat until `touched` is 0", body = BulkResult),
        (status = 400, description = "`invalid_field`, `invalid_status`, `too_many_ids`, `invalid_limit`, `malformed_json`", body = ErrorBody),
    )
)]
pub(super) async fn delete_many(
    state: State,
    body: Json<BulkTasks>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(tasks::delete_many(&mut conn, &body).await?))
}

/// Snooze a task
///
/// The claimant puts its task off: pending again, due in `seconds` (0 to a year), the attempt
/// not charged, the lease released.
#[utoipa::path(
    put,
    path = "/api/tasks/{id}/snooze",
    tag = "tasks",
    params(("id" = i64, Path, description = "The task's id")),
    responses(
        (status = 202, description = "The task, pending again", body = Task),
        (status = 400, description = "`invalid_snooze`, `invalid_field`, `missing_field`, `malformed_json`, `invalid_fence`", body = ErrorBody),
        (status = 404, description = "`task_not_found`", body = ErrorBody),
        (status = 409, description = "`not_owner` (another processor's task), `lease_lost` (its lease expired or a newer claim superseded it), `lease_revoked`, `task_finished`, `cancelled`", body = ErrorBody),
    )
)]
pub(super) async fn snooze(
    state: State,
    id: web::Path<i64>,
    body: Json<SnoozeTask>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let task = tasks::snooze(&mut conn, &state.engine, *id, &body).await?;
    Ok(HttpResponse::Accepted().json(task))
}

/// Cancel a task
///
/// A pending task at once (200); a running one at its worker's next heartbeat (202).
#[utoipa::path(
    post,
    path = "/api/tasks/{id}/cancel",
    tag = "tasks",
    params(("id" = i64, Path, description = "The task's id")),
    responses(
        (status = 200, description = "The task, cancelled", body = Task),
        (status = 202, description = "The task, to be cancelled at its next heartbeat", body = Task),
        (status = 404, description = "`task_not_found`", body = ErrorBody),
        (status = 409, description = "`task_finished`", body = ErrorBody),
    )
)]
pub(super) async fn cancel(state: State, id: web::Path<i64>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let (task, immediate) = tasks::cancel(&mut conn, &state.engine, *id).await?;
    Ok(if immediate {
        HttpResponse::Ok().json(task)
    } else {
        HttpResponse::Accepted().json(task)
    })
}

/// Retry a dead task
///
/// Back to pending, due now, with its attempts renewed.
#[utoipa::path(
    post,
    path = "/api/tasks/{id}/retry",
    tag = "tasks",
    params(("id" = i64, Path, description = "The task's id")),
    responses(
        (status = 200, description = "The task, pending again", body = Task),
        (status = 404, description = "`task_not_found`", body = ErrorBody),
        (status = 409, description = "`not_dead`", body = ErrorBody),
    )
)]
pub(super) async fn retry(state: State, id: web::Path<i64>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(tasks::retry(&mut conn, &state.engine, *id).await?))
}
