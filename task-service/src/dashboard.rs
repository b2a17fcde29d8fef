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
use leasehold::lease_client::{LeaseListing, LeaseSet};
use leasehold::server::ApiError;
use leasehold::server::auth::{Role, bearer_token, locked};
use leasehold::server::db;
use leasehold::server::http::{get_only, method_not_allowed};
use leasehold::{LeaseClient, LeaseError};
use serde::Deserialize;

use crate::state::{State, json_holding};
use crate::tasks;

/// The page: HTML, CSS and JavaScript in one file, no build step.
const PAGE: &str = include_str!("dashboard.html");

pub fn configure(cfg: &mut web::ServiceConfig) {
    // Every view and every filter lives in the URL, so a link or a reload shows the same
    // thing: each view's path serves the page, which reads its state from the URL.
    cfg.service(get_only("/dashboard", page))
        .service(get_only(
            "/dashboard/{view:(leases|tasks|workers|schedules|generator)}",
            page,
        ))
        .service(get_only("/dashboard/tasks/{id:[0-9]{1,19}}", page))
        .service(get_only("/", to_dashboard))
        .service(
            web::scope("/api/dashboard")
                .service(get_only("/overview", overview))
                .service(get_only("/throughput", throughput))
                .service(get_only("/leases", leases))
                .service(
                    web::resource("/leases/{id}/revoke")
                        .route(locked(web::post().to(revoke), Role::Operator))
                        .default_service(web::to(method_not_allowed)),
                ),
        );
}

/// A browser sent to the service's address lands on the dashboard, not on a 404.
async fn to_dashboard() -> HttpResponse {
    HttpResponse::Found()
        .insert_header((actix_web::http::header::LOCATION, "/dashboard"))
        .finish()
}

async fn page() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header(("cache-control", "no-cache"))
        .body(PAGE)
}

/// Everything the tasks, workers and generator views show, in one answer.
/// The overview takes no parameter, and says so rather than ignoring one.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OverviewQuery {}

async fn overview(
    state: State,
    _query: web::Query<OverviewQuery>,
) -> Result<HttpResponse, ApiError> {
    let turn = state.reads.turn().await?;
    let mut conn = db::connection(&state.pool).await?;
    let overview = tasks::overview(&mut conn, &state.engine).await?;
    drop(conn);
    json_holding(overview, turn).await
}

/// A parameter of another name (the page's own `window`) is refused, not ignored.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ThroughputQuery {
    window_seconds: Option<i64>,
}

/// The charts' series over a window: 5 minutes (the default), an hour or a day.
async fn throughput(
    state: State,
    query: web::Query<ThroughputQuery>,
) -> Result<HttpResponse, ApiError> {
    let window = query
        .window_seconds
        .unwrap_or(tasks::read::CHART_WINDOWS[0]);
    tasks::read::check_window(window)?;
    let turn = state.reads.turn().await?;
    let mut conn = db::connection(&state.pool).await?;
    let throughput = tasks::read::throughput(&mut conn, window).await?;
    drop(conn);
    json_holding(throughput, turn).await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaseQuery {
    status: Option<String>,
    resource_prefix: Option<String>,
    limit: Option<u32>,
    cursor: Option<String>,
    order: Option<String>,
}

/// lease-service's listing, through this service.
async fn leases(state: State, query: web::Query<LeaseQuery>) -> Result<HttpResponse, ApiError> {
    let status = query.status.as_deref().unwrap_or("all");
    let set = LeaseSet::parse(status).ok_or_else(|| {
        ApiError::invalid(
            "invalid_query",
            "status",
            "status must be all, active, expired, released or renewed",
        )
    })?;
    let newest_first = match query.order.as_deref() {
        None | Some("asc") => false,
        Some("desc") => true,
        Some(_) => {
            return Err(ApiError::invalid(
                "invalid_query",
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

/// An operator's revocation, sent to lease-service with the operator's own token, never
/// task-service's. The route is locked here too, so that a token this service knows without the
/// operator role is refused as every other route refuses it (403), not passed on to be unknown
/// at lease-service (401).
async fn revoke(
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
            status: if code == "lease_not_found" { 404 } else { 409 },
            body: Box::new(leasehold::api::ErrorBody::new(code, reason)),
        },
        LeaseError::Held {
            resource, holder, ..
        } => ApiError::Upstream {
            status: 409,
            body: Box::new(leasehold::api::ErrorBody::new(
                "lease_held".to_owned(),
                format!("{resource} is held by {holder}"),
            )),
        },
        other => ApiError::Internal(format!("lease-service: {other}")),
    }
}
