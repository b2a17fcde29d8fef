//! The operator dashboard: one self-contained page (`GET /dashboard`) and the read routes it
//! polls. Every task-service replica serves it, and everything it shows comes from the
//! databases (through this replica, or lease-service for leases), so any replica tells the same.
//!
//! The page's actions go to the ordinary write routes with the operator's bearer token (typed
//! into the page, kept in the browser's local storage), so the dashboard has no powers of its
//! own. Lease views and revocation go through this service to lease-service, so the page needs
//! one origin only; a revocation carries the operator's own `Authorization` header, never
//! task-service's token.

use actix_web::{HttpRequest, HttpResponse, web};
use leasehold::ErrorCode;
use leasehold::api::ErrorBody;
use leasehold::lease_client::{LeaseListing, LeaseSet};
use leasehold::server::ApiError;
use leasehold::server::auth::bearer_token;
use leasehold::server::db;
use leasehold::{LeaseClient, LeaseError};
use serde::Deserialize;

use crate::state::{State, json_holding};

/// The page: HTML, CSS and JavaScript in one file, no build step.
const PAGE: &str = include_str!("dashboard.html");

// Every view and every filter lives in the URL, so a link or a reload shows the same thing:
// each view's path serves the page, which reads its state from the URL. The routes are mounted
// with the service's others (`crate::http::routes`).

/// The dashboard
///
/// The operator's console: one self-contained page that polls the read routes below.
#[utoipa::path(
    get,
    path = "/dashboard",
    tag = "dashboard",
    responses((status = 200, description = "The page", content_type = "text/html", body = String))
)]
pub(crate) async fn page() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header(("cache-control", "no-cache"))
        .body(PAGE)
}

/// One of the dashboard's views
#[utoipa::path(
    get,
    path = "/dashboard/{view}",
    tag = "dashboard",
    params((
        "view" = String,
        Path,
        description = "The view",
        pattern = "^(leases|tasks|workers|schedules|generator)$"
    )),
    responses(
        (status = 200, description = "The page, showing that view", content_type = "text/html", body = String),
        (status = 404, description = "`not_found`: no such view", body = ErrorBody),
    )
)]
pub(crate) async fn page_view() -> HttpResponse {
    page().await
}

/// One task in the dashboard
#[utoipa::path(
    get,
    path = "/dashboard/tasks/{id}",
    tag = "dashboard",
    params(("id" = String, Path, description = "The task's id", pattern = "^[0-9]{1,19}$")),
    responses(
        (status = 200, description = "The page, showing the task", content_type = "text/html", body = String),
        (status = 404, description = "`not_found`: not a task's id", body = ErrorBody),
    )
)]
pub(crate) async fn page_task() -> HttpResponse {
    page().await
}

/// To the dashboard
///
/// A browser sent to the service's address lands on the dashboard, not on a 404.
#[utoipa::path(
    get,
    path = "/",
    tag = "dashboard",
    responses((
        status = 302,
        description = "To `/dashboard`",
        headers(("Location" = String, description = "`/dashboard`"))
    ))
)]
pub(crate) async fn to_dashboard() -> HttpResponse {
    HttpResponse::Found()
        .insert_header((actix_web::http::header::LOCATION, "/dashboard"))
        .finish()
}

/// The overview takes no parameter, and says so rather than ignoring one.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct OverviewQuery {}

/// The dashboard's overview
///
/// Everything the tasks, workers and generator views show, in one answer.
#[utoipa::path(
    get,
    path = "/api/dashboard/overview",
    tag = "dashboard",
    responses(
        (status = 200, description = "The overview", body = crate::charts::Overview),
        (status = 400, description = "`invalid_query`: it takes no parameter", body = ErrorBody),
    )
)]
pub(crate) async fn overview(
    state: State,
    _query: web::Query<OverviewQuery>,
) -> Result<HttpResponse, ApiError> {
    let turn = state.reads.turn().await?;
    let mut conn = db::connection(&state.pool).await?;
    let overview = crate::charts::overview(&mut conn, &state.engine).await?;
    drop(conn);
    json_holding(overview, turn).await
}

/// A parameter of another name (the page's own `window`) is refused, not ignored.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct ThroughputQuery {
    /// The window: 300 (the default), 3600 or 86400 seconds.
    #[param(schema_with = chart_windows)]
    window_seconds: Option<i64>,
}

/// The windows the charts are drawn over, in seconds.
fn chart_windows() -> utoipa::openapi::schema::Object {
    utoipa::openapi::schema::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::Integer)
        .enum_values(Some(crate::charts::CHART_WINDOWS))
        .build()
}

/// The dashboard's charts
///
/// The charts' series over a window: 5 minutes (the default), an hour or a day.
#[utoipa::path(
    get,
    path = "/api/dashboard/throughput",
    tag = "dashboard",
    params(ThroughputQuery),
    responses(
        (status = 200, description = "The series", body = crate::charts::Throughput),
        (status = 400, description = "`invalid_query`, `invalid_field`: another window", body = ErrorBody),
    )
)]
pub(crate) async fn throughput(
    state: State,
    query: web::Query<ThroughputQuery>,
) -> Result<HttpResponse, ApiError> {
    let window = query
        .window_seconds
        .unwrap_or(crate::charts::CHART_WINDOWS[0]);
    crate::charts::check_window(window)?;
    let turn = state.reads.turn().await?;
    let mut conn = db::connection(&state.pool).await?;
    let throughput = crate::charts::throughput(&mut conn, window).await?;
    drop(conn);
    json_holding(throughput, turn).await
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct LeaseQuery {
    /// `all` (the default), `active`, `expired`, `released` or `renewed`.
    #[param(pattern = "^(all|active|expired|released|renewed)$")]
    status: Option<String>,
    /// Only leases whose resource starts with this.
    #[param(max_length = 512, pattern = r"^[^\u0000]*$")]
    resource_prefix: Option<String>,
    /// Leases per page (default 200, at most 1,000 answered).
    #[param(minimum = 1, maximum = 4294967295_u32)]
    limit: Option<u32>,
    /// The previous page's `nextCursor`.
    #[param(pattern = r"^[0-9]{0,18}$")]
    cursor: Option<String>,
    /// `asc` (the default) or `desc`.
    #[param(pattern = "^(asc|desc)$")]
    order: Option<String>,
}

/// Leases, through task-service
///
/// lease-service's listing, through this service, so that the dashboard needs one origin.
#[utoipa::path(
    get,
    path = "/api/dashboard/leases",
    tag = "dashboard",
    params(LeaseQuery),
    responses(
        (status = 200, description = "A page of leases, as lease-service answers it", body = leasehold::api::LeasePage),
        (status = 400, description = "`invalid_query`, and lease-service's refusals passed on", body = ErrorBody),
    )
)]
pub(crate) async fn leases(
    state: State,
    query: web::Query<LeaseQuery>,
) -> Result<HttpResponse, ApiError> {
    let status = query.status.as_deref().unwrap_or("all");
    let set = LeaseSet::parse(status).ok_or_else(|| {
        ApiError::invalid(
            ErrorCode::InvalidQuery,
            "status",
            "status must be all, active, expired, released or renewed",
        )
    })?;
    let newest_first = match query.order.as_deref() {
        None | Some("asc") => false,
        Some("desc") => true,
        Some(_) => {
            return Err(ApiError::invalid(
                ErrorCode::InvalidQuery,
                "order",
                "order must be asc or desc",
            ));
        }
    };
    let listing = LeaseListing {
        set,
        resource_prefix: query.resource_prefix.clone(),
        limit: Some(query.limit.unwrap_or(200).min(1000)),
        cursor: query.cursor.clone(),
        newest_first,
    };
    let page = state
        .engine
        .leases
        .list(&listing)
        .await
        .map_err(passed_on)?;
    Ok(HttpResponse::Ok().json(page))
}

/// Revoke a lease, through task-service
///
/// An operator's revocation, sent to lease-service with the operator's own token, never
/// task-service's.
#[utoipa::path(
    post,
    path = "/api/dashboard/leases/{id}/revoke",
    tag = "dashboard",
    params(("id" = i64, Path, description = "The lease's id")),
    responses(
        (status = 200, description = "The revoked lease", body = leasehold::api::Lease),
        (status = 404, description = "`lease_not_found`", body = ErrorBody),
    )
)]
// The route is locked here too, so that a token this service knows without the operator role
// is refused as every other route refuses it (403), not passed on to be unknown at
// lease-service (401).
pub(crate) async fn revoke(
    state: State,
    id: web::Path<i64>,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let token = match request
        .headers()
        .get(actix_web::http::header::AUTHORIZATION)
    {
        Some(value) => Some(bearer_token(value.to_str().unwrap_or_default())?),
        None => None,
    };
    let operator: LeaseClient = state.engine.leases.clone().with_bearer_token(token);
    let lease = operator.revoke(*id).await.map_err(passed_on)?;
    Ok(HttpResponse::Ok().json(lease))
}

/// lease-service's refusal, passed on as it came; its absence is ours to report.
pub(crate) fn passed_on(err: LeaseError) -> ApiError {
    match err {
        LeaseError::Rejected {
            status,
            code,
            error,
        } => ApiError::Upstream {
            status,
            body: Box::new(leasehold::api::ErrorBody::new(code, error)),
        },
        LeaseError::Unavailable(reason) => {
            ApiError::Unavailable(format!("lease-service unreachable: {reason}"))
        }
        // The lease is not (or no longer) the caller's: lease-service's conflict, as it came.
        LeaseError::Lost { code, reason } => ApiError::Upstream {
            status: if matches!(code, ErrorCode::LeaseNotFound) {
                404
            } else {
                409
            },
            body: Box::new(leasehold::api::ErrorBody::new(code, reason)),
        },
        LeaseError::Held {
            resource, holder, ..
        } => ApiError::Upstream {
            status: 409,
            body: Box::new(leasehold::api::ErrorBody::new(
                ErrorCode::LeaseHeld,
                format!("{resource} is held by {holder}"),
            )),
        },
        other => ApiError::Internal(format!("lease-service: {other}")),
    }
}
