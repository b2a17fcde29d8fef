//! The queues' routes: listing, one queue, its limits, pause and resume.

use actix_web::{HttpRequest, HttpResponse, web};
use leasehold::api::ErrorBody;
use leasehold::queues::{QueueSettings, QueueState, Queues};
use leasehold::server::db;
use leasehold::server::http::{NamePage, Order};
use leasehold::server::{ApiError, Json};
use serde::Deserialize;

use crate::state::{State, holding, json_holding};

/// Query of the queues' listing: the page.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct QueuesQuery {
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
pub(super) async fn queues_list(
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
pub(super) async fn queue_get(
    state: State,
    queue: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
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
pub(super) async fn queue_set_limits(
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
pub(super) async fn queue_pause(
    state: State,
    queue: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
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
pub(super) async fn queue_resume(
    state: State,
    queue: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(crate::queues::set_paused(&mut conn, &queue, false).await?))
}
