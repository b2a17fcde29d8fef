//! A task's reads: one task, its history, the listings by status, and the counts per queue.

use actix_web::{HttpRequest, HttpResponse, web};
use leasehold::api::ErrorBody;
use leasehold::server::ApiError;
use leasehold::server::db;
use leasehold::server::http::{NamePage, Order, Page};
use leasehold::tasks::{OneTask, TaskCounts, TaskPage, TaskStatus};
use serde::Deserialize;

use crate::state::{LIST_MAX_BYTES, State, holding};
use crate::tasks::read::{self, Listing, TaskHistory};
use crate::tasks::{self};

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
pub(super) async fn get_by_id(state: State, id: web::Path<i64>) -> Result<HttpResponse, ApiError> {
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
pub(super) async fn events(state: State, id: web::Path<i64>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(tasks::events(&mut conn, *id).await?))
}

/// Query of the listings: filters, then the page.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct ListQuery {
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
        pub(super) async fn $name(
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

pub(super) async fn list(
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

/// Query of the counts: one queue, or a page of them.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct CountsQuery {
    /// Only this queue (answered even when it has no task); `total` is then its counts.
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = r"^[^\u0000-\u001F\u007F-\u009F]*$"
    )]
    queue: Option<String>,
    /// Queues per page: 1 or more, at most 1,000 are answered (default 100).
    #[param(minimum = 1)]
    limit: Option<i64>,
    /// The previous page's `nextCursor`.
    cursor: Option<String>,
}

/// Counts per queue
///
/// Per queue, the number of tasks in each status (every status listed, zeros included), a page
/// of queues at a time by name (`nextCursor` and a `Link` header lead to the next), beside
/// `total`, over every queue whatever the page. With `queue`, that queue alone. Paged since
/// 30,000 queues made one answer of 2-3 MB.
#[utoipa::path(
    get,
    path = "/api/tasks/counts",
    tag = "tasks",
    params(CountsQuery),
    responses(
        (status = 200, description = "The counts", body = TaskCounts),
        (status = 400, description = "`invalid_limit`, `invalid_cursor`, `invalid_query`, `invalid_field`", body = ErrorBody),
    )
)]
pub(super) async fn counts(
    state: State,
    query: web::Query<CountsQuery>,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let page = NamePage::parse(query.limit, query.cursor.as_deref(), None)?;
    let turn = state.reads.turn().await?;
    let mut conn = db::connection(&state.pool).await?;
    let (counts, last) = tasks::counts(&mut conn, query.queue.as_deref(), &page).await?;
    drop(conn);
    let mut body = serde_json::Map::new();
    body.insert(
        "total".to_owned(),
        serde_json::to_value(&counts.total).unwrap_or_default(),
    );
    let answer = page.respond_keyed(
        &request,
        ("queues", &counts.queues),
        last.as_deref(),
        &[],
        body,
    );
    Ok(holding(answer, turn))
}
