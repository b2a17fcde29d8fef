//! Routes and handlers: each takes a connection, calls one function of [`crate::tasks`] and
//! shapes the answer.

use std::time::Duration;

use actix_web::{HttpRequest, HttpResponse, web};
use leasehold::generator::StartGenerator;
use leasehold::queues::QueueSettings;
use leasehold::schedules::{CreateSchedule, ReplaceSchedule};
use leasehold::server::ApiError;
use leasehold::server::auth::{Role, locked};
use leasehold::server::db;
use leasehold::server::http::{
    NamePage, Order, Page, extractors, get_only, healthz, method_not_allowed, metrics_response,
    ready, with_body_limit,
};
use leasehold::tasks::{
    BulkTasks, ClaimTasks, CompleteTask, CompleteTasks, CompletedTasks, CreateTask, CreatedTasks,
    FailTask, Heartbeat, NoTask, SnoozeTask, TaskStatus,
};
use leasehold::workers::{WorkerBeat, WorkerGone};
use serde::Deserialize;

use crate::generator;
use crate::schedules;
use crate::state::{LIST_MAX_BYTES, State, holding, json_holding};
use crate::tasks::read::{self, Listing};
use crate::tasks::{self, Created};

/// Largest request body accepted (task data is capped lower, at 64 KiB).
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// Largest body of `POST /api/tasks/batch`: 1,000 tasks of about 16 KiB each.
pub const MAX_BATCH_BODY_BYTES: usize = 16 * 1024 * 1024;

/// Mounts every route. The caller adds the [`crate::state::AppState`] and the
/// [`leasehold::server::auth::Auth`] as app data. Each write route needs its role (producer,
/// worker or operator); reads are open.
pub fn configure(cfg: &mut web::ServiceConfig) {
    extractors(cfg, MAX_BODY_BYTES);
    cfg.service(
        web::scope("/api/tasks")
            .service(
                web::resource("")
                    .route(web::get().to(list_all))
                    .route(locked(web::post().to(create), Role::Producer))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(with_body_limit(
                web::resource("/batch")
                    .route(locked(web::post().to(create_many), Role::Producer))
                    .default_service(web::to(method_not_allowed)),
                MAX_BATCH_BODY_BYTES,
            ))
            // Bulk operations by filter (registered before `/{id}`, which would take the name).
            .service(
                web::resource("/retry")
                    .route(locked(web::post().to(retry_many), Role::Operator))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                web::resource("/cancel")
                    .route(locked(web::post().to(cancel_many), Role::Operator))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                web::resource("/delete")
                    .route(locked(web::post().to(delete_many), Role::Operator))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(get_only("/processed", list_processed))
            .service(get_only("/started", list_started))
            .service(get_only("/counts", counts))
            .service(
                web::resource("/next")
                    .route(locked(web::post().to(next), Role::Worker))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                web::resource("/complete")
                    .route(locked(web::put().to(complete_many), Role::Worker))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(get_only("/{id}", get_by_id))
            .service(get_only("/{id}/events", events))
            .service(
                web::resource("/{id}/heartbeat")
                    .route(locked(web::put().to(heartbeat), Role::Worker))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                web::resource("/{id}/complete")
                    .route(locked(web::put().to(complete), Role::Worker))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                web::resource("/{id}/fail")
                    .route(locked(web::put().to(fail), Role::Worker))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                web::resource("/{id}/snooze")
                    .route(locked(web::put().to(snooze), Role::Worker))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                web::resource("/{id}/cancel")
                    .route(locked(web::post().to(cancel), Role::Operator))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                web::resource("/{id}/retry")
                    .route(locked(web::post().to(retry), Role::Operator))
                    .default_service(web::to(method_not_allowed)),
            ),
    )
    .service(
        web::scope("/api/generator")
            .service(get_only("/status", generator_status))
            .service(get_only("/settings", generator_settings))
            .service(
                web::resource("/start")
                    .route(locked(web::post().to(generator_start), Role::Operator))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                // The sample's generator page stops with DELETE; POST is kept for our clients.
                web::resource("/stop")
                    .route(locked(web::delete().to(generator_stop), Role::Operator))
                    .route(locked(web::post().to(generator_stop), Role::Operator))
                    .default_service(web::to(method_not_allowed)),
            ),
    )
    .service(
        web::scope("/api/queues")
            .service(get_only("", queues_list))
            .service(
                web::resource("/{queue}")
                    .route(web::get().to(queue_get))
                    .route(locked(web::put().to(queue_set_limits), Role::Operator))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                web::resource("/{queue}/pause")
                    .route(locked(web::post().to(queue_pause), Role::Operator))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                web::resource("/{queue}/resume")
                    .route(locked(web::post().to(queue_resume), Role::Operator))
                    .default_service(web::to(method_not_allowed)),
            ),
    )
    .service(
        web::scope("/api/schedules")
            .service(
                web::resource("")
                    .route(web::get().to(schedules_list))
                    .route(locked(web::post().to(schedule_create), Role::Operator))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                web::resource("/{name}")
                    .route(web::get().to(schedule_get))
                    .route(locked(web::put().to(schedule_replace), Role::Operator))
                    .route(locked(web::delete().to(schedule_delete), Role::Operator))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                web::resource("/{name}/pause")
                    .route(locked(web::post().to(schedule_pause), Role::Operator))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                web::resource("/{name}/resume")
                    .route(locked(web::post().to(schedule_resume), Role::Operator))
                    .default_service(web::to(method_not_allowed)),
            ),
    )
    .service(
        web::scope("/api/workers")
            .service(get_only("", workers_list))
            .service(
                web::resource("/{id}")
                    .route(locked(web::put().to(worker_beat), Role::Worker))
                    .route(locked(web::delete().to(worker_gone), Role::Worker))
                    .default_service(web::to(method_not_allowed)),
            ),
    )
    .configure(crate::dashboard::configure)
    .service(get_only("/healthz", healthz))
    .service(get_only("/readyz", readyz))
    .service(get_only("/metrics", metrics));
}

/// A worker process's beat: 200 with the liveness lease to present at the next one.
async fn worker_beat(
    state: State,
    id: web::Path<String>,
    body: web::Json<WorkerBeat>,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(crate::workers::beat(&state.engine, &id, &body).await?))
}

/// A worker process that stops: 204, its lease released.
async fn worker_gone(
    state: State,
    id: web::Path<String>,
    body: web::Json<WorkerGone>,
) -> Result<HttpResponse, ApiError> {
    crate::workers::gone(&state.engine, &id, &body).await?;
    Ok(HttpResponse::NoContent().finish())
}

async fn workers_list(state: State) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(crate::workers::list(&state.engine).await?))
}

async fn create(state: State, body: web::Json<CreateTask>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(
        match tasks::create(&mut conn, &state.engine, body.into_inner()).await? {
            Created::New(task) => HttpResponse::Created().json(task),
            Created::Existing(task) => HttpResponse::Ok().json(task),
        },
    )
}

/// 200 with one result per create (each with its own status: 201, 200, 400, ...).
async fn create_many(
    state: State,
    body: web::Json<tasks::create_many::Batch>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let results = tasks::create_many(&mut conn, &state.engine, body.into_inner()).await?;
    Ok(HttpResponse::Ok().json(CreatedTasks { results }))
}

/// 202 with the task (a list when `limit` was given), or 200 `{message}` when none is due.
async fn next(state: State, body: web::Json<ClaimTasks>) -> Result<HttpResponse, ApiError> {
    let mut claimed = tasks::claim(&state.claims, &state.engine, &body).await?;
    Ok(match (claimed.is_empty(), body.limit.is_some()) {
        (true, _) => HttpResponse::Ok().json(NoTask {
            message: "No tasks available".to_owned(),
        }),
        (false, true) => HttpResponse::Accepted().json(claimed),
        (false, false) => HttpResponse::Accepted().json(claimed.swap_remove(0)),
    })
}

/// 200 with one result per completion (each with its own status: 202, 409, 404, ...), and the
/// tasks claimed after them when the request asked for its `next` ones.
async fn complete_many(
    state: State,
    body: web::Json<CompleteTasks>,
) -> Result<HttpResponse, ApiError> {
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

async fn heartbeat(
    state: State,
    id: web::Path<i64>,
    body: web::Json<Heartbeat>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let task = tasks::heartbeat(&mut conn, &state.engine, *id, &body).await?;
    Ok(HttpResponse::Accepted().json(task))
}

async fn complete(
    state: State,
    id: web::Path<i64>,
    body: web::Json<CompleteTask>,
) -> Result<HttpResponse, ApiError> {
    let task = tasks::complete(&state.completions, &state.engine, *id, body.into_inner()).await?;
    Ok(HttpResponse::Accepted().json(task))
}

async fn fail(
    state: State,
    id: web::Path<i64>,
    body: web::Json<FailTask>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let task = tasks::fail(&mut conn, &state.engine, *id, &body).await?;
    Ok(HttpResponse::Accepted().json(task))
}

async fn retry_many(state: State, body: web::Json<BulkTasks>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(tasks::retry_many(&mut conn, &state.engine, &body).await?))
}

async fn cancel_many(state: State, body: web::Json<BulkTasks>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(tasks::cancel_many(&mut conn, &state.engine, &body).await?))
}

async fn delete_many(state: State, body: web::Json<BulkTasks>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(tasks::delete_many(&mut conn, &body).await?))
}

async fn snooze(
    state: State,
    id: web::Path<i64>,
    body: web::Json<SnoozeTask>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let task = tasks::snooze(&mut conn, &state.engine, *id, &body).await?;
    Ok(HttpResponse::Accepted().json(task))
}

/// 200 when a pending task was cancelled; 202 when a running one will be at its next heartbeat.
async fn cancel(state: State, id: web::Path<i64>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let (task, immediate) = tasks::cancel(&mut conn, &state.engine, *id).await?;
    Ok(if immediate {
        HttpResponse::Ok().json(task)
    } else {
        HttpResponse::Accepted().json(task)
    })
}

async fn retry(state: State, id: web::Path<i64>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(tasks::retry(&mut conn, &state.engine, *id).await?))
}

async fn get_by_id(state: State, id: web::Path<i64>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(tasks::get(&mut conn, *id).await?))
}

/// `GET /api/tasks/{id}/events`: the task's history, oldest first.
async fn events(state: State, id: web::Path<i64>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(tasks::events(&mut conn, *id).await?))
}

/// Query of the listings: `status` (comma-separated), `queue`, `limit`, `cursor`, `order`.
#[derive(Debug, Deserialize)]
struct ListQuery {
    status: Option<String>,
    queue: Option<String>,
    processor: Option<String>,
    key: Option<String>,
    created_after: Option<chrono::DateTime<chrono::Utc>>,
    created_before: Option<chrono::DateTime<chrono::Utc>>,
    limit: Option<i64>,
    cursor: Option<String>,
    order: Option<Order>,
}

async fn list_all(
    s: State,
    q: web::Query<ListQuery>,
    r: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    list(s, q, r, &TaskStatus::ALL).await
}

/// The sample's "processed": every task that reached an end.
async fn list_processed(
    s: State,
    q: web::Query<ListQuery>,
    r: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    list(
        s,
        q,
        r,
        &[
            TaskStatus::Succeeded,
            TaskStatus::Dead,
            TaskStatus::Cancelled,
        ],
    )
    .await
}

/// The sample's "started": tasks being worked on now.
async fn list_started(
    s: State,
    q: web::Query<ListQuery>,
    r: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    list(s, q, r, &[TaskStatus::Running]).await
}

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

/// Per queue, the number of tasks in each status (every status listed, zeros included).
async fn counts(state: State) -> Result<HttpResponse, ApiError> {
    let turn = state.reads.turn().await?;
    let mut conn = db::connection(&state.pool).await?;
    let counts = tasks::counts(&mut conn).await?;
    drop(conn);
    json_holding(counts, turn).await
}

async fn generator_status(state: State) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(generator::status(&mut conn, &state.engine).await?))
}

/// The desired state alone (what generator replicas poll; no lease-service call).
async fn generator_settings(state: State) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(generator::settings(&mut conn).await?))
}

/// The sample's start takes no body; a JSON body may change the rate and the sleep range.
async fn generator_start(state: State, body: web::Bytes) -> Result<HttpResponse, ApiError> {
    let change: StartGenerator = if body.iter().all(u8::is_ascii_whitespace) {
        StartGenerator::default()
    } else {
        serde_json::from_slice(&body).map_err(|err| ApiError::Invalid {
            code: if err.is_data() {
                "invalid_field"
            } else {
                "malformed_json"
            },
            field: None,
            message: format!("invalid request body: {err}"),
        })?
    };
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(generator::start(&mut conn, &state.engine, change).await?))
}

async fn generator_stop(state: State) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(generator::stop(&mut conn, &state.engine).await?))
}

/// Ready when the database answers, lease-service is healthy and accepts the task lease TTL,
/// all within two seconds.
async fn readyz(state: State) -> Result<HttpResponse, ApiError> {
    Ok(ready(tasks::ready(&state.pool, &state.engine).await?))
}

/// Query of the queues' listing: `limit`, `cursor`, `order`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QueuesQuery {
    limit: Option<i64>,
    cursor: Option<String>,
    order: Option<Order>,
}

/// A page of the queues, by name, as the task listings page: `{"queues": [...], "nextCursor"}`.
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

/// A heavy read too: it counts the queue's tasks.
async fn queue_get(state: State, queue: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let turn = state.reads.turn().await?;
    let mut conn = db::connection(&state.pool).await?;
    let queue = crate::queues::get(&mut conn, &queue).await?;
    drop(conn);
    json_holding(queue, turn).await
}

async fn queue_set_limits(
    state: State,
    queue: web::Path<String>,
    body: web::Json<QueueSettings>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(crate::queues::set_limits(&mut conn, &queue, &body).await?))
}

async fn queue_pause(state: State, queue: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(crate::queues::set_paused(&mut conn, &queue, true).await?))
}

async fn queue_resume(state: State, queue: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(crate::queues::set_paused(&mut conn, &queue, false).await?))
}

async fn schedules_list(state: State) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(schedules::list(&mut conn).await?))
}

/// 201 with the schedule; 409 `schedule_exists` when the name is taken.
async fn schedule_create(
    state: State,
    body: web::Json<CreateSchedule>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let schedule = schedules::create(&mut conn, &state.engine, body.into_inner()).await?;
    Ok(HttpResponse::Created().json(schedule))
}

async fn schedule_get(state: State, name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(schedules::get(&mut conn, &name).await?))
}

/// 201 when the schedule was created, 200 when replaced.
async fn schedule_replace(
    state: State,
    name: web::Path<String>,
    body: web::Json<ReplaceSchedule>,
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

async fn schedule_delete(state: State, name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(schedules::delete(&mut conn, &name).await?))
}

async fn schedule_pause(state: State, name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let schedule = schedules::set_paused(&mut conn, &state.engine, &name, true).await?;
    Ok(HttpResponse::Ok().json(schedule))
}

async fn schedule_resume(state: State, name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let schedule = schedules::set_paused(&mut conn, &state.engine, &name, false).await?;
    Ok(HttpResponse::Ok().json(schedule))
}

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
