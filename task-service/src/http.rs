//! Routes and handlers: each takes a connection, calls one function of [`crate::tasks`] and
//! shapes the answer.

use std::collections::BTreeMap;
use std::time::Duration;

use actix_web::{HttpRequest, HttpResponse, web};
use leasehold::generator::StartGenerator;
use leasehold::server::auth::{Role, locked};
use leasehold::server::db::{self, DbPool};
use leasehold::server::http::{
    Order, Page, extractors, get_only, healthz, method_not_allowed, metrics_response,
};
use leasehold::server::{ApiError, validate_name_within};
use leasehold::tasks::{
    ClaimTasks, CompleteTask, CompleteTasks, CompletedTasks, CreateTask, FailTask, Heartbeat,
    MAX_QUEUE_BYTES, NoTask, TaskStatus,
};
use serde::Deserialize;

use crate::tasks::{self, Created, Engine};
use crate::{generator, repo};

/// Largest request body accepted (task data is capped lower, at 64 KiB).
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// What every handler can reach.
pub struct AppState {
    pub pool: DbPool,
    /// Claims and single completions, served in groups of those that arrive together.
    pub claims: tasks::ClaimGroups,
    pub completions: tasks::CompletionGroups,
    pub engine: Engine,
    /// lease-service's base URL: `/readyz` asks its `/healthz`, the dashboard its lease views.
    pub lease_service_url: String,
    pub http: reqwest::Client,
    /// Listings that may run at once, each until its answer is sent: with [`LIST_MAX_BYTES`],
    /// what bounds the memory that open reads of large tasks can take. Others wait their turn.
    pub listings: std::sync::Arc<tokio::sync::Semaphore>,
}

/// Most bytes of task JSON (`taskData`, `taskOutput`, `lastError`) in one listing page; past it
/// the page is cut and `nextCursor` continues it.
pub const LIST_MAX_BYTES: i64 = 4 * 1024 * 1024;

/// Listings served at once by one replica.
pub const LISTINGS_IN_FLIGHT: usize = 4;

/// How long a listing waits for its turn before answering 503: readers that do not read their
/// answers hold the turns, and waiting on them for ever would hide that.
const LISTING_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// An answer's body that holds its listing's turn until it is sent. actix polls a body again
/// only once most of what it last gave is written to the socket, so a page stays counted
/// against [`LISTINGS_IN_FLIGHT`] for as long as its bytes are in this process, however slowly
/// its reader reads.
struct HoldingTurn {
    body: actix_web::body::BoxBody,
    _turn: tokio::sync::OwnedSemaphorePermit,
}

impl actix_web::body::MessageBody for HoldingTurn {
    type Error = Box<dyn std::error::Error>;

    fn size(&self) -> actix_web::body::BodySize {
        self.body.size()
    }

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<web::Bytes, Self::Error>>> {
        std::pin::Pin::new(&mut self.get_mut().body).poll_next(cx)
    }
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("pool", &self.pool.status())
            .field("lease_service_url", &self.lease_service_url)
            .finish_non_exhaustive()
    }
}

pub(crate) type State = web::Data<AppState>;

/// Mounts every route. The caller adds the [`AppState`] and the
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
            .service(get_only("/{id}/events", crate::dashboard::task_events))
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
    .configure(crate::dashboard::configure)
    .service(get_only("/healthz", healthz))
    .service(get_only("/readyz", readyz))
    .service(get_only("/metrics", metrics));
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

/// 200 with one result per completion (each with its own status: 202, 409, 404, ...).
async fn complete_many(
    state: State,
    body: web::Json<CompleteTasks>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let results = tasks::complete_many(&mut conn, &state.engine, &body).await?;
    Ok(HttpResponse::Ok().json(CompletedTasks { results }))
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
    // Under its name, as the sample answers it and its task page reads it (`data.task`).
    let task = tasks::get(&mut conn, *id).await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({ "task": task })))
}

/// Query of the listings: `status` (comma-separated), `queue`, `limit`, `cursor`, `order`.
#[derive(Debug, Deserialize)]
struct ListQuery {
    status: Option<String>,
    queue: Option<String>,
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
    let page = Page::parse(query.limit, query.cursor.as_deref(), query.order)?;
    let mut statuses: Vec<TaskStatus> = within.to_vec();
    if let Some(wanted) = query.status.as_deref().filter(|s| !s.is_empty()) {
        let mut chosen = Vec::new();
        for name in wanted.split(',') {
            let status = TaskStatus::parse(name.trim()).ok_or_else(|| {
                ApiError::invalid(
                    "invalid_status",
                    "status",
                    format!("unknown status {name:?}; known: pending, running, succeeded, dead, cancelled"),
                )
            })?;
            chosen.push(status);
        }
        statuses.retain(|s| chosen.contains(s));
    }
    if let Some(queue) = &query.queue {
        validate_name_within("queue", queue, MAX_QUEUE_BYTES)?;
    }
    let turn = tokio::time::timeout(LISTING_WAIT, state.listings.clone().acquire_owned())
        .await
        .map_err(|_| {
            ApiError::Unavailable(format!(
                "{LISTINGS_IN_FLIGHT} listings are being sent; try again later"
            ))
        })?
        .map_err(|_| ApiError::Unavailable("shutting down".to_owned()))?;
    let mut conn = db::connection(&state.pool).await?;
    let (rows, cut) = repo::list(
        &mut conn,
        &statuses,
        query.queue.as_deref(),
        page,
        LIST_MAX_BYTES,
    )
    .await?;
    drop(conn);
    let tasks: Vec<_> = rows.into_iter().map(tasks::to_api).collect();
    let answer = page.respond(
        &request,
        "tasks",
        tasks,
        cut,
        |task| task.id,
        &[
            ("status", query.status.as_deref()),
            ("queue", query.queue.as_deref()),
        ],
    );
    Ok(answer
        .map_body(|_, body| HoldingTurn { body, _turn: turn })
        .map_into_boxed_body())
}

/// Per queue, the number of tasks in each status (every status listed, zeros included).
async fn counts(state: State) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let rows = repo::counts(&mut conn).await?;
    let mut queues: BTreeMap<String, BTreeMap<&str, i64>> = BTreeMap::new();
    let mut total: BTreeMap<&str, i64> = TaskStatus::ALL.iter().map(|s| (s.as_str(), 0)).collect();
    for row in &rows {
        let per_queue = queues
            .entry(row.queue.clone())
            .or_insert_with(|| TaskStatus::ALL.iter().map(|s| (s.as_str(), 0)).collect());
        *per_queue.entry(row.status.as_str()).or_default() += row.count;
        *total.entry(row.status.as_str()).or_default() += row.count;
    }
    Ok(HttpResponse::Ok().json(serde_json::json!({ "queues": queues, "total": total })))
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
    // One budget for the whole check, within a Kubernetes readiness probe's `timeoutSeconds: 2`:
    // a probe that gives up before the answer learns nothing of why.
    const BUDGET: Duration = Duration::from_secs(2);
    let waiting_on = std::cell::Cell::new("the database");
    let check = async {
        let database = async {
            let mut conn = db::connection(&state.pool).await?;
            repo::ping(&mut conn).await.map_err(ApiError::from)
        };
        database
            .await
            .map_err(|err| ApiError::Unavailable(format!("database not ready: {err}")))?;
        waiting_on.set("lease-service's /healthz");
        let leases = state
            .http
            .get(format!("{}/healthz", state.lease_service_url))
            .send()
            .await
            .map_err(|err| ApiError::Unavailable(format!("lease-service unreachable: {err}")))?;
        if !leases.status().is_success() {
            return Err(ApiError::Unavailable(format!(
                "lease-service answered {}",
                leases.status()
            )));
        }
        waiting_on.set("lease-service's verdict on the task lease TTL");
        // A TTL lease-service refuses would starve every claim while all looks healthy.
        tasks::check_lease_ttl(&state.engine).await
    };
    match tokio::time::timeout(BUDGET, check).await {
        Ok(Ok(())) => Ok(HttpResponse::Ok().json(serde_json::json!({ "status": "ready" }))),
        Ok(Err(err)) => Err(err),
        Err(_) => Err(ApiError::Unavailable(format!(
            "not ready within {} s: still waiting for {}",
            BUDGET.as_secs(),
            waiting_on.get()
        ))),
    }
}

async fn metrics(state: State) -> Result<HttpResponse, ApiError> {
    let reading = async {
        let mut conn = db::connection(&state.pool).await?;
        let counts = repo::counts(&mut conn).await?;
        let oldest = repo::oldest_due(&mut conn).await?;
        Ok::<_, ApiError>((counts, oldest))
    };
    // A database that does not answer leaves the gauges as they were; counters still serve.
    match tokio::time::timeout(Duration::from_secs(2), reading).await {
        Ok(Ok((counts, oldest))) => state.engine.metrics.observe_database(&counts, &oldest),
        Ok(Err(err)) => tracing::warn!(error = %err, "could not read task gauges"),
        Err(_) => tracing::warn!("reading task gauges timed out"),
    }
    metrics_response(&state.engine.metrics.registry)
}
