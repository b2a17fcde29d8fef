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
use leasehold::server::ApiError;
use leasehold::server::db;
use leasehold::server::http::{get_only, method_not_allowed};
use serde::Deserialize;

use crate::http::State;
use crate::{generator, repo};

/// The page: HTML, CSS and JavaScript in one file, no build step.
const PAGE: &str = include_str!("dashboard.html");

/// Throughput shown: the last ten minutes in ten-second buckets.
const WINDOW_SECONDS: i64 = 600;
const BUCKET_SECONDS: i64 = 10;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(get_only("/dashboard", page))
        .service(get_only("/", to_dashboard))
        .service(
            web::scope("/api/dashboard")
                .service(get_only("/overview", overview))
                .service(get_only("/leases", leases))
                .service(
                    web::resource("/leases/{id}/revoke")
                        .route(web::post().to(revoke))
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
async fn overview(state: State) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let counts = repo::counts(&mut conn).await?;
    let oldest_due = repo::oldest_due(&mut conn).await?;
    let throughput = repo::throughput(&mut conn, WINDOW_SECONDS, BUCKET_SECONDS).await?;
    let workers = repo::processors(&mut conn).await?;
    let generator = generator::status(&mut conn, &state.engine).await?;
    let counts: Vec<_> = counts
        .into_iter()
        .map(|c| serde_json::json!({"queue": c.queue, "status": c.status, "count": c.count}))
        .collect();
    let oldest: Vec<_> = oldest_due
        .into_iter()
        .map(|o| serde_json::json!({"queue": o.queue, "ageSeconds": o.age_seconds}))
        .collect();
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "counts": counts,
        "oldestDue": oldest,
        "throughput": {"windowSeconds": WINDOW_SECONDS, "bucketSeconds": BUCKET_SECONDS,
                       "buckets": throughput},
        "workers": workers,
        "generator": generator,
    })))
}

/// `GET /api/tasks/{id}/events`: the task's history, oldest first.
pub async fn task_events(state: State, id: web::Path<i64>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let events = repo::events(&mut conn, *id).await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({ "events": events })))
}

#[derive(Debug, Deserialize)]
struct LeaseQuery {
    status: Option<String>,
    resource_prefix: Option<String>,
    limit: Option<u32>,
}

/// lease-service's listing, through this service.
async fn leases(state: State, query: web::Query<LeaseQuery>) -> Result<HttpResponse, ApiError> {
    let path = match query.status.as_deref().unwrap_or("all") {
        "all" => "",
        "active" => "/active",
        "expired" => "/expired",
        "released" => "/released",
        "renewed" => "/renewed",
        _ => {
            return Err(ApiError::invalid(
                "invalid_query",
                "status",
                "status must be all, active, expired, released or renewed",
            ));
        }
    };
    let mut params = vec![("limit", query.limit.unwrap_or(200).min(1000).to_string())];
    if let Some(prefix) = &query.resource_prefix {
        params.push(("resource_prefix", prefix.clone()));
    }
    let request = state
        .http
        .get(format!("{}/api/leases{path}", state.lease_service_url))
        .query(&params);
    forward(request).await
}

/// An operator's revocation, sent to lease-service with the operator's own credentials.
async fn revoke(
    state: State,
    id: web::Path<i64>,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let mut outgoing = state.http.post(format!(
        "{}/api/leases/{}/revoke",
        state.lease_service_url, *id
    ));
    if let Some(authorization) = request
        .headers()
        .get(actix_web::http::header::AUTHORIZATION)
    {
        outgoing = outgoing.header(reqwest::header::AUTHORIZATION, authorization.as_bytes());
    }
    forward(outgoing).await
}

/// Sends `request` and answers with lease-service's status and JSON body as they are.
async fn forward(request: reqwest::RequestBuilder) -> Result<HttpResponse, ApiError> {
    let response = request
        .headers(leasehold::telemetry::inject())
        .timeout(std::time::Duration::from_secs(5))
        .send()
        .await
        .map_err(|err| ApiError::Unavailable(format!("lease-service unreachable: {err}")))?;
    let status = actix_web::http::StatusCode::from_u16(response.status().as_u16())
        .unwrap_or(actix_web::http::StatusCode::BAD_GATEWAY);
    let body = response
        .bytes()
        .await
        .map_err(|err| ApiError::Unavailable(format!("lease-service answer lost: {err}")))?;
    Ok(HttpResponse::build(status)
        .content_type("application/json")
        .body(body))
}
