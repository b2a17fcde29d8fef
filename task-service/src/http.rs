//! Routes and handlers: each takes a connection, calls one function of [`crate::tasks`] and
//! shapes the answer.

use std::time::Duration;

use actix_web::{HttpRequest, HttpResponse, web};
use leasehold::ErrorCode;
use leasehold::api::ErrorBody;
use leasehold::generator::{GeneratorSettings, GeneratorStatus, StartGenerator};
use leasehold::queues::{QueueSettings, QueueState, Queues};
use leasehold::schedules::{CreateSchedule, ReplaceSchedule, Schedule, Schedules};
use leasehold::server::auth::Role;
use leasehold::server::db;
use leasehold::server::http::{NamePage, Order, Page, Probe, extractors, metrics_response, ready};
use leasehold::server::{ApiError, Json};
use leasehold::tasks::{
    BulkResult, BulkTasks, ClaimAnswer, ClaimTasks, CompleteTask, CompleteTasks, CompletedTasks,
    CreateTask, CreatedTasks, FailTask, Heartbeat, NoTask, OneTask, SnoozeTask, Task, TaskCounts,
    TaskPage, TaskStatus,
};
use leasehold::workers::{WorkerBeat, WorkerGone, WorkerLease, Workers};
use serde::Deserialize;

use crate::dashboard;
use crate::generator;
use crate::schedules;
use crate::state::{LIST_MAX_BYTES, State, holding, json_holding};
use crate::tasks::read::{self, Listing, TaskHistory};
use crate::tasks::{self, Created};

/// Largest request body accepted (task data is capped lower, at 64 KiB).
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// Largest body of `POST /api/tasks/batch`: 1,000 tasks of about 16 KiB each.
pub const MAX_BATCH_BODY_BYTES: usize = 16 * 1024 * 1024;

/// Mounts every route (see [`routes`]). The caller adds the [`crate::state::AppState`] and the
/// [`leasehold::server::auth::Auth`] as app data.
pub fn configure(cfg: &mut web::ServiceConfig) {
    extractors(cfg, MAX_BODY_BYTES);
    routes()
        .body_limit("/api/tasks/batch", MAX_BATCH_BODY_BYTES)
        // One body for the three bulk operations; each takes its own statuses.
        .narrow("retry_many", "status", &["dead", "cancelled"])
        .narrow("cancel_many", "status", &["pending", "running"])
        .narrow("delete_many", "status", &["succeeded", "dead", "cancelled"])
        .mount(cfg);
}

// Every route, once: what serves it and what documents it (`GET /api/openapi.json`). Each
// write needs its role (producer, worker or operator); reads are open. A fixed path comes
// before one with a parameter in its place (`/api/tasks/retry` before `/api/tasks/{id}`).
leasehold::routes! {
    pub fn routes;
    list_all,
    create [Role::Producer],
    create_many [Role::Producer],
    retry_many [Role::Operator],
    cancel_many [Role::Operator],
    delete_many [Role::Operator],
    list_processed,
    list_started,
    counts,
    next [Role::Worker],
    complete_many [Role::Worker],
    get_by_id,
    events,
    heartbeat [Role::Worker],
    complete [Role::Worker],
    fail [Role::Worker],
    snooze [Role::Worker],
    cancel [Role::Operator],
    retry [Role::Operator],
    generator_status,
    generator_settings,
    generator_start [Role::Operator],
    generator_stop [Role::Operator],
    generator_stop_post [Role::Operator],
    queues_list,
    queue_get,
    queue_set_limits [Role::Operator],
    queue_pause [Role::Operator],
    queue_resume [Role::Operator],
    schedules_list,
    schedule_create [Role::Operator],
    schedule_get,
    schedule_replace [Role::Operator],
    schedule_delete [Role::Operator],
    schedule_pause [Role::Operator],
    schedule_resume [Role::Operator],
    workers_list,
    worker_beat [Role::Worker],
    worker_gone [Role::Worker],
    dashboard::page,
    dashboard::page_view,
    dashboard::page_task,
    dashboard::to_dashboard,
    dashboard::overview,
    dashboard::throughput,
    dashboard::leases,
    dashboard::revoke [Role::Operator],
    readyz,
    metrics,
}

/// A worker process's beat
///
/// Announces the process (`worker:<id>`, with what it says of itself) and renews its liveness
/// lease, whose fence its claims name so that its tasks need no lease of their own.
#[utoipa::path(
    put,
    path = "/api/workers/{id}",
    tag = "workers",
    params(("id" = String, Path, description = "The worker process's id", min_length = 1, max_length = 505, pattern = r"^(?!\.\.?$)[^\u0000-\u001F\u007F-\u009F]*$")),
    responses(
        (status = 200, description = "The liveness lease to present at the next beat", body = WorkerLease, links(
            ("Gone" = (operation_id = "worker_gone", parameters(("id" = "$request.path.id")), request_body = json!({"instance": "$request.body#/instance", "fence": "$response.body#/fence", "secret": "$request.body#/secret"}), description = "The process stops")),
        )),
        (status = 400, description = "`invalid_field`, `missing_field`, `malformed_json`, `invalid_ttl`", body = ErrorBody),
        (status = 409, description = "`worker_id_in_use`: another live process has this id; `lease_lost`, `lease_expired`, `lease_released`, `lease_revoked`: the lease presented is no longer this process's", body = ErrorBody),
    )
)]
async fn worker_beat(
    state: State,
    id: web::Path<String>,
    body: Json<WorkerBeat>,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(crate::workers::beat(&state.engine, &id, &body).await?))
}

/// A worker process's goodbye
///
/// Releases its liveness lease; its tasks are handed back by their own requests.
#[utoipa::path(
    delete,
    path = "/api/workers/{id}",
    tag = "workers",
    params(("id" = String, Path, description = "The worker process's id", min_length = 1, max_length = 505, pattern = r"^(?!\.\.?$)[^\u0000-\u001F\u007F-\u009F]*$")),
    responses(
        (status = 204, description = "Its lease released"),
        (status = 400, description = "`invalid_field`, `missing_field`, `malformed_json`", body = ErrorBody),
        (status = 409, description = "`lease_lost`, `lease_expired`, `lease_revoked`: the lease is no longer this process's", body = ErrorBody),
    )
)]
async fn worker_gone(
    state: State,
    id: web::Path<String>,
    body: Json<WorkerGone>,
) -> Result<HttpResponse, ApiError> {
    crate::workers::gone(&state.engine, &id, &body).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// Worker processes
///
/// The processes that announced themselves, with their liveness and what they run.
#[utoipa::path(
    get,
    path = "/api/workers",
    tag = "workers",
    responses((status = 200, description = "The worker processes", body = Workers))
)]
async fn workers_list(state: State) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(crate::workers::list(&state.engine).await?))
}

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
async fn create(state: State, body: Json<CreateTask>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(
        match tasks::create(&mut conn, &state.engine, body.into_inner()).await? {
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
async fn create_many(
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
async fn next(state: State, body: Json<ClaimTasks>) -> Result<HttpResponse, ApiError> {
    let mut claimed = tasks::claim(&state.claims, &state.engine, &body).await?;
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
async fn complete_many(state: State, body: Json<CompleteTasks>) -> Result<HttpResponse, ApiError> {
    if let Some(next) = &body.next {
        let answer = tasks::complete_then_claim(&state.claims, &state.engine, &body, next).await?;
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
async fn heartbeat(
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
async fn complete(
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
async fn fail(
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
async fn retry_many(state: State, body: Json<BulkTasks>) -> Result<HttpResponse, ApiError> {
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
async fn cancel_many(state: State, body: Json<BulkTasks>) -> Result<HttpResponse, ApiError> {
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
async fn delete_many(state: State, body: Json<BulkTasks>) -> Result<HttpResponse, ApiError> {
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
async fn snooze(
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
async fn cancel(state: State, id: web::Path<i64>) -> Result<HttpResponse, ApiError> {
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
async fn retry(state: State, id: web::Path<i64>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(tasks::retry(&mut conn, &state.engine, *id).await?))
}

/// One task
#[utoipa::path(
    get,
    path = "/api/tasks/{id}",
    tag = "tasks",
    params(("id" = i64, Path, description = "The task's id")),
    responses(
        (status = 200, description = "The task, as `{task}`", body = OneTask),
        (status = 404, description = "`task_not_found`", body = ErrorBody),
    )
)]
async fn get_by_id(state: State, id: web::Path<i64>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(tasks::get(&mut conn, *id).await?))
}

/// A task's history
///
/// Every transition of the task, oldest first.
#[utoipa::path(
    get,
    path = "/api/tasks/{id}/events",
    tag = "tasks",
    params(("id" = i64, Path, description = "The task's id")),
    responses(
        (status = 200, description = "Its history", body = TaskHistory),
        (status = 404, description = "`task_not_found`", body = ErrorBody),
    )
)]
async fn events(state: State, id: web::Path<i64>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(tasks::events(&mut conn, *id).await?))
}

/// Query of the listings: filters, then the page.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// Only tasks in these statuses, comma-separated (`pending,running`).
    #[param(
        pattern = r"^( *(pending|running|succeeded|dead|cancelled) *(, *(pending|running|succeeded|dead|cancelled) *)*)?$"
    )]
    status: Option<String>,
    /// Only tasks of this queue.
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = r"^[^\u0000-\u001F\u007F-\u009F]*$"
    )]
    queue: Option<String>,
    /// Only tasks this processor last claimed.
    #[param(
        min_length = 1,
        max_length = 512,
        pattern = r"^[^\u0000-\u001F\u007F-\u009F]*$"
    )]
    processor: Option<String>,
    /// Only tasks of this concurrency key.
    #[param(
        min_length = 1,
        max_length = 255,
        pattern = r"^[^\u0000-\u001F\u007F-\u009F]*$"
    )]
    key: Option<String>,
    /// Only tasks created after this instant (RFC 3339, years 1 to 9999).
    created_after: Option<chrono::DateTime<chrono::Utc>>,
    /// Only tasks created before this instant (RFC 3339, years 1 to 9999).
    created_before: Option<chrono::DateTime<chrono::Utc>>,
    /// Tasks per page: 1 or more, at most 1,000 are answered (default 100).
    #[param(minimum = 1)]
    limit: Option<i64>,
    /// The previous page's `nextCursor`.
    #[param(pattern = r"^[0-9]{0,18}$")]
    cursor: Option<String>,
    /// `asc` (oldest first, the default) or `desc` (newest first).
    #[param(inline)]
    order: Option<Order>,
}

macro_rules! listing {
    ($name:ident, $path:literal, $within:expr, $summary:literal $(, $about:literal)?) => {
        #[doc = $summary]
        $(#[doc = ""] #[doc = $about])?
        #[utoipa::path(
            get,
            path = $path,
            tag = "tasks",
            params(ListQuery),
            responses(
                (status = 200, description = "A page of tasks, as `{tasks, nextCursor}`; a page also ends at 4 MiB of task JSON", body = TaskPage),
                (status = 400, description = "`invalid_status`, `invalid_limit`, `invalid_cursor`, `invalid_query`, `invalid_field`", body = ErrorBody),
            )
        )]
        async fn $name(
            state: State,
            query: web::Query<ListQuery>,
            request: HttpRequest,
        ) -> Result<HttpResponse, ApiError> {
            list(state, query, request, $within).await
        }
    };
}

listing!(list_all, "/api/tasks", &TaskStatus::ALL, "All tasks");
listing!(
    list_processed,
    "/api/tasks/processed",
    &[
        TaskStatus::Succeeded,
        TaskStatus::Dead,
        TaskStatus::Cancelled
    ],
    "Finished tasks",
    "The sample's \"processed\": every task that reached an end."
);
listing!(
    list_started,
    "/api/tasks/started",
    &[TaskStatus::Running],
    "Running tasks",
    "The sample's \"started\": tasks being worked on now."
);

async fn list(
    state: State,
    query: web::Query<ListQuery>,
    request: HttpRequest,
    within: &[TaskStatus],
) -> Result<HttpResponse, ApiError> {
    let listing = Listing {
        within,
        status: query.status.as_deref(),
        queue: query.queue.as_deref(),
        processor: query.processor.as_deref(),
        key: query.key.as_deref(),
        created_after: query.created_after,
        created_before: query.created_before,
        page: Page::parse(query.limit, query.cursor.as_deref(), query.order)?,
    };
    let statuses = read::check_listing(&listing)?;
    let turn = state.reads.turn().await?;
    let mut conn = db::connection(&state.pool).await?;
    let (tasks, cut) = read::list(&mut conn, &listing, &statuses, LIST_MAX_BYTES).await?;
    drop(conn);
    let answer = listing.page.respond(
        &request,
        "tasks",
        tasks,
        cut,
        |task| task.id,
        &[("status", listing.status), ("queue", listing.queue)],
    );
    Ok(holding(answer, turn))
}

/// Counts per queue
///
/// Per queue, the number of tasks in each status (every status listed, zeros included).
#[utoipa::path(
    get,
    path = "/api/tasks/counts",
    tag = "tasks",
    responses((status = 200, description = "The counts", body = TaskCounts))
)]
async fn counts(state: State) -> Result<HttpResponse, ApiError> {
    let turn = state.reads.turn().await?;
    let mut conn = db::connection(&state.pool).await?;
    let counts = tasks::counts(&mut conn).await?;
    drop(conn);
    json_holding(counts, turn).await
}

/// The generator's state
///
/// What it should do, and which replica leads it now.
#[utoipa::path(
    get,
    path = "/api/generator/status",
    tag = "generator",
    responses((status = 200, description = "The generator's state", body = GeneratorStatus))
)]
async fn generator_status(state: State) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(generator::status(&mut conn, &state.engine).await?))
}

/// The generator's settings
///
/// The desired state alone (what generator replicas poll; no lease-service call).
#[utoipa::path(
    get,
    path = "/api/generator/settings",
    tag = "generator",
    responses((status = 200, description = "The generator's settings", body = GeneratorSettings))
)]
async fn generator_settings(state: State) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(generator::settings(&mut conn).await?))
}

/// Start the generator
///
/// The sample's start takes no body; a JSON body may change the rate and the sleep range.
#[utoipa::path(
    post,
    path = "/api/generator/start",
    tag = "generator",
    request_body(content = Option<StartGenerator>, description = "Optional: a new rate and sleep range"),
    responses(
        (status = 200, description = "The generator's state", body = GeneratorStatus),
        (status = 400, description = "`invalid_field`, `malformed_json`", body = ErrorBody),
    )
)]
async fn generator_start(state: State, body: web::Bytes) -> Result<HttpResponse, ApiError> {
    // No body, and a JSON `null`, change nothing.
    let change: StartGenerator = if body.iter().all(u8::is_ascii_whitespace) {
        StartGenerator::default()
    } else {
        leasehold::strict::from_slice::<Option<StartGenerator>>(&body)
            .map(Option::unwrap_or_default)
            .map_err(|err| ApiError::Invalid {
                code: if err.is_data() {
                    ErrorCode::InvalidField
                } else {
                    ErrorCode::MalformedJson
                },
                field: None,
                message: format!("invalid request body: {err}"),
            })?
    };
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(generator::start(&mut conn, &state.engine, change).await?))
}

/// Stop the generator
///
/// The sample's generator page stops with `DELETE`.
#[utoipa::path(
    delete,
    path = "/api/generator/stop",
    tag = "generator",
    responses((status = 200, description = "The generator's state", body = GeneratorStatus))
)]
async fn generator_stop(state: State) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(generator::stop(&mut conn, &state.engine).await?))
}

/// Stop the generator (`POST`)
///
/// As `DELETE /api/generator/stop`, kept for Leasehold's own clients.
#[utoipa::path(
    post,
    path = "/api/generator/stop",
    tag = "generator",
    responses((status = 200, description = "The generator's state", body = GeneratorStatus))
)]
async fn generator_stop_post(state: State) -> Result<HttpResponse, ApiError> {
    generator_stop(state).await
}

/// Readiness
///
/// Ready when the database answers, lease-service is healthy and accepts the task lease TTL,
/// all within two seconds.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, description = "Ready, with the database node it reached", body = Probe),
        (status = 503, description = "`unavailable`, `task_lease_ttl_rejected`", body = ErrorBody),
    )
)]
async fn readyz(state: State) -> Result<HttpResponse, ApiError> {
    Ok(ready(tasks::ready(&state.pool, &state.engine).await?))
}

/// Query of the queues' listing: the page.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct QueuesQuery {
    /// Queues per page: 1 or more, at most 1,000 are answered (default 100).
    #[param(minimum = 1)]
    limit: Option<i64>,
    /// The previous page's `nextCursor`.
    cursor: Option<String>,
    /// `asc` (by name, the default) or `desc`.
    #[param(inline)]
    order: Option<Order>,
}

/// Queues
///
/// A page of the queues, by name: `{queues, nextCursor}`.
#[utoipa::path(
    get,
    path = "/api/queues",
    tag = "queues",
    params(QueuesQuery),
    responses(
        (status = 200, description = "A page of queues", body = Queues),
        (status = 400, description = "`invalid_limit`, `invalid_cursor`, `invalid_query`", body = ErrorBody),
    )
)]
async fn queues_list(
    state: State,
    query: web::Query<QueuesQuery>,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let page = NamePage::parse(query.limit, query.cursor.as_deref(), query.order)?;
    let turn = state.reads.turn().await?;
    let mut conn = db::connection(&state.pool).await?;
    let (queues, more) = crate::queues::list(&mut conn, &page).await?;
    drop(conn);
    let answer = page.respond(&request, "queues", queues, more, |q| q.queue.as_str(), &[]);
    Ok(holding(answer, turn))
}

/// One queue
///
/// Its counts, pause and limits (a queue nobody used reads as running and empty).
#[utoipa::path(
    get,
    path = "/api/queues/{queue}",
    tag = "queues",
    params(("queue" = String, Path, description = "The queue's name", min_length = 1, max_length = 128, pattern = r"^(?!\.\.?$)[^\u0000-\u001F\u007F-\u009F]*$")),
    responses(
        (status = 200, description = "The queue", body = QueueState),
        (status = 400, description = "`invalid_field`: not a queue's name", body = ErrorBody),
    )
)]
async fn queue_get(state: State, queue: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let turn = state.reads.turn().await?;
    let mut conn = db::connection(&state.pool).await?;
    let queue = crate::queues::get(&mut conn, &queue).await?;
    drop(conn);
    json_holding(queue, turn).await
}

/// Set a queue's limits
///
/// `concurrency_limit`, `key_concurrency_limit` and `rate_limit`; a field left out lifts its
/// limit.
#[utoipa::path(
    put,
    path = "/api/queues/{queue}",
    tag = "queues",
    params(("queue" = String, Path, description = "The queue's name", min_length = 1, max_length = 128, pattern = r"^(?!\.\.?$)[^\u0000-\u001F\u007F-\u009F]*$")),
    responses(
        (status = 200, description = "The queue", body = QueueState),
        (status = 400, description = "`invalid_field`, `malformed_json`", body = ErrorBody),
    )
)]
async fn queue_set_limits(
    state: State,
    queue: web::Path<String>,
    body: Json<QueueSettings>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(crate::queues::set_limits(&mut conn, &queue, &body).await?))
}

/// Pause a queue
///
/// Claims stop handing out its tasks on every replica; running ones finish.
#[utoipa::path(
    post,
    path = "/api/queues/{queue}/pause",
    tag = "queues",
    params(("queue" = String, Path, description = "The queue's name", min_length = 1, max_length = 128, pattern = r"^(?!\.\.?$)[^\u0000-\u001F\u007F-\u009F]*$")),
    responses(
        (status = 200, description = "The queue", body = QueueState),
        (status = 400, description = "`invalid_field`: not a queue's name", body = ErrorBody),
    )
)]
async fn queue_pause(state: State, queue: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(crate::queues::set_paused(&mut conn, &queue, true).await?))
}

/// Resume a queue
#[utoipa::path(
    post,
    path = "/api/queues/{queue}/resume",
    tag = "queues",
    params(("queue" = String, Path, description = "The queue's name", min_length = 1, max_length = 128, pattern = r"^(?!\.\.?$)[^\u0000-\u001F\u007F-\u009F]*$")),
    responses(
        (status = 200, description = "The queue", body = QueueState),
        (status = 400, description = "`invalid_field`: not a queue's name", body = ErrorBody),
    )
)]
async fn queue_resume(state: State, queue: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(crate::queues::set_paused(&mut conn, &queue, false).await?))
}

/// Schedules
#[utoipa::path(
    get,
    path = "/api/schedules",
    tag = "schedules",
    responses((status = 200, description = "Every schedule", body = Schedules))
)]
async fn schedules_list(state: State) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(schedules::list(&mut conn).await?))
}

/// Create a schedule
#[utoipa::path(
    post,
    path = "/api/schedules",
    tag = "schedules",
    responses(
        (status = 201, description = "The schedule", body = Schedule, links(
            ("Get" = (operation_id = "schedule_get", parameters(("name" = "$response.body#/name")), description = "Read this schedule")),
            ("Pause" = (operation_id = "schedule_pause", parameters(("name" = "$response.body#/name")), description = "Pause this schedule")),
            ("Resume" = (operation_id = "schedule_resume", parameters(("name" = "$response.body#/name")), description = "Resume this schedule")),
            ("Delete" = (operation_id = "schedule_delete", parameters(("name" = "$response.body#/name")), description = "Delete this schedule")),
        )),
        (status = 400, description = "`invalid_field`, `missing_field`, `malformed_json`, `invalid_cron`, `invalid_timezone`", body = ErrorBody),
        (status = 409, description = "`schedule_exists`: the name is taken", body = ErrorBody),
    )
)]
async fn schedule_create(
    state: State,
    body: Json<CreateSchedule>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let schedule = schedules::create(&mut conn, &state.engine, body.into_inner()).await?;
    Ok(HttpResponse::Created().json(schedule))
}

/// One schedule
#[utoipa::path(
    get,
    path = "/api/schedules/{name}",
    tag = "schedules",
    params(("name" = String, Path, description = "The schedule's name", min_length = 1, max_length = 200, pattern = r"^(?!\.\.?$)[^\u0000-\u001F\u007F-\u009F]*$")),
    responses(
        (status = 200, description = "The schedule", body = Schedule),
        (status = 404, description = "`schedule_not_found`", body = ErrorBody),
    )
)]
async fn schedule_get(state: State, name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(schedules::get(&mut conn, &name).await?))
}

/// Create or replace a schedule
#[utoipa::path(
    put,
    path = "/api/schedules/{name}",
    tag = "schedules",
    params(("name" = String, Path, description = "The schedule's name", min_length = 1, max_length = 200, pattern = r"^(?!\.\.?$)[^\u0000-\u001F\u007F-\u009F]*$")),
    responses(
        (status = 201, description = "The schedule, created", body = Schedule),
        (status = 200, description = "The schedule, replaced", body = Schedule),
        (status = 400, description = "`invalid_field`, `missing_field`, `malformed_json`, `invalid_cron`, `invalid_timezone`, `name_mismatch`", body = ErrorBody),
    )
)]
async fn schedule_replace(
    state: State,
    name: web::Path<String>,
    body: Json<ReplaceSchedule>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let (schedule, created) =
        schedules::replace(&mut conn, &state.engine, &name, body.into_inner()).await?;
    Ok(if created {
        HttpResponse::Created().json(schedule)
    } else {
        HttpResponse::Ok().json(schedule)
    })
}

/// Delete a schedule
#[utoipa::path(
    delete,
    path = "/api/schedules/{name}",
    tag = "schedules",
    params(("name" = String, Path, description = "The schedule's name", min_length = 1, max_length = 200, pattern = r"^(?!\.\.?$)[^\u0000-\u001F\u007F-\u009F]*$")),
    responses(
        (status = 200, description = "The schedule deleted", body = Schedule),
        (status = 404, description = "`schedule_not_found`", body = ErrorBody),
    )
)]
async fn schedule_delete(state: State, name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(schedules::delete(&mut conn, &name).await?))
}

/// Pause a schedule
#[utoipa::path(
    post,
    path = "/api/schedules/{name}/pause",
    tag = "schedules",
    params(("name" = String, Path, description = "The schedule's name", min_length = 1, max_length = 200, pattern = r"^(?!\.\.?$)[^\u0000-\u001F\u007F-\u009F]*$")),
    responses(
        (status = 200, description = "The schedule", body = Schedule),
        (status = 404, description = "`schedule_not_found`", body = ErrorBody),
    )
)]
async fn schedule_pause(state: State, name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let schedule = schedules::set_paused(&mut conn, &state.engine, &name, true).await?;
    Ok(HttpResponse::Ok().json(schedule))
}

/// Resume a schedule
#[utoipa::path(
    post,
    path = "/api/schedules/{name}/resume",
    tag = "schedules",
    params(("name" = String, Path, description = "The schedule's name", min_length = 1, max_length = 200, pattern = r"^(?!\.\.?$)[^\u0000-\u001F\u007F-\u009F]*$")),
    responses(
        (status = 200, description = "The schedule", body = Schedule),
        (status = 404, description = "`schedule_not_found`", body = ErrorBody),
    )
)]
async fn schedule_resume(state: State, name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let schedule = schedules::set_paused(&mut conn, &state.engine, &name, false).await?;
    Ok(HttpResponse::Ok().json(schedule))
}

/// Prometheus metrics
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses((status = 200, description = "The Prometheus text format", content_type = "text/plain", body = String))
)]
async fn metrics(state: State) -> Result<HttpResponse, ApiError> {
    // The gauges read every queue's counts: a heavy read, which waits its turn like the others
    // (within the two seconds), so that scrapes cannot take the claims' connections either.
    let reading = async {
        let _turn = state.reads.turn().await?;
        let mut conn = db::connection(&state.pool).await?;
        read::gauges(&mut conn).await
    };
    // A database that does not answer leaves the gauges as they were; counters still serve.
    match tokio::time::timeout(Duration::from_secs(2), reading).await {
        Ok(Ok(gauges)) => state.engine.metrics.observe_database(
            &gauges.counts,
            &gauges.oldest_due,
            &gauges.queues,
        ),
        Ok(Err(err)) => tracing::warn!(error = %err, "could not read task gauges"),
        Err(_) => tracing::warn!("reading task gauges timed out"),
    }
    metrics_response(&state.engine.metrics.registry)
}
