//! Routes and handlers: each handler takes a connection, calls one function of [`crate::leases`]
//! and shapes the answer. Extractor failures are turned into JSON errors here too.

use std::time::{Duration, Instant};

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::error::{JsonPayloadError, PathError, QueryPayloadError};
use actix_web::middleware::Next;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use shared::api::{AcquireLease, MAX_NAME_BYTES, ReleaseLease, RenewLease};

use crate::db::{self, DbPool};
use crate::error::ApiError;
use crate::leases::{self, AcquireOutcome, TtlPolicy};
use crate::metrics::Metrics;
use crate::repo::{self, Listing};

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 16 * 1024;
/// Page size of listings when `limit` is not given, and the most a page may hold.
pub const DEFAULT_PAGE: i64 = 100;
pub const MAX_PAGE: i64 = 1000;

/// What every handler can reach.
pub struct AppState {
    pub pool: DbPool,
    pub ttl: TtlPolicy,
    pub metrics: Metrics,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("pool", &self.pool.status())
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

type State = web::Data<AppState>;

/// Mounts every route. The caller adds the [`AppState`] as app data.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.app_data(json_config())
        .app_data(path_config())
        .app_data(query_config())
        .service(
            web::scope("/api/leases")
                .service(
                    web::resource("")
                        .route(web::get().to(list_all))
                        .route(web::post().to(acquire))
                        .default_service(web::to(method_not_allowed)),
                )
                .service(get_only("/active", list_active))
                .service(get_only("/expired", list_expired))
                .service(get_only("/renewed", list_renewed))
                .service(get_only("/released", list_released))
                .service(
                    web::resource("/renew")
                        .route(web::put().to(renew))
                        .default_service(web::to(method_not_allowed)),
                )
                .service(
                    web::resource("/release")
                        .route(web::delete().to(release))
                        .default_service(web::to(method_not_allowed)),
                )
                .service(
                    web::resource("/{id}")
                        .route(web::get().to(get_by_id))
                        .route(web::delete().to(release_by_id))
                        .default_service(web::to(method_not_allowed)),
                ),
        )
        .service(get_only("/healthz", healthz))
        .service(get_only("/readyz", readyz))
        .service(get_only("/metrics", metrics));
}

fn get_only<F, Args>(path: &str, handler: F) -> actix_web::Resource
where
    F: actix_web::Handler<Args>,
    Args: actix_web::FromRequest + 'static,
    F::Output: actix_web::Responder + 'static,
{
    web::resource(path)
        .route(web::get().to(handler))
        .default_service(web::to(method_not_allowed))
}

async fn acquire(state: State, body: web::Json<AcquireLease>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(
        match leases::acquire(&mut conn, state.ttl, &state.metrics, &body).await? {
            AcquireOutcome::Acquired(lease) => HttpResponse::Created().json(lease),
            AcquireOutcome::Extended(lease) => HttpResponse::Ok().json(lease),
        },
    )
}

async fn renew(state: State, body: web::Json<RenewLease>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let lease = leases::renew(&mut conn, state.ttl, &state.metrics, &body).await?;
    Ok(HttpResponse::Ok().json(lease))
}

async fn release(state: State, body: web::Json<ReleaseLease>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let lease = leases::release(&mut conn, &state.metrics, &body, None).await?;
    Ok(HttpResponse::Ok().json(lease))
}

async fn release_by_id(
    state: State,
    id: web::Path<i64>,
    body: web::Json<ReleaseLease>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let lease = leases::release(&mut conn, &state.metrics, &body, Some(*id)).await?;
    Ok(HttpResponse::Ok().json(lease))
}

async fn get_by_id(state: State, id: web::Path<i64>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(leases::get(&mut conn, *id).await?))
}

/// Query of the listing routes. Pages are in id order; `cursor` is the `X-Next-Cursor` of the
/// previous page.
#[derive(Debug, Deserialize)]
struct PageQuery {
    limit: Option<i64>,
    cursor: Option<String>,
    resource_prefix: Option<String>,
}

async fn list_all(
    s: State,
    q: web::Query<PageQuery>,
    r: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    list(s, q, r, Listing::All).await
}
async fn list_active(
    s: State,
    q: web::Query<PageQuery>,
    r: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    list(s, q, r, Listing::Active).await
}
async fn list_expired(
    s: State,
    q: web::Query<PageQuery>,
    r: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    list(s, q, r, Listing::Expired).await
}
async fn list_renewed(
    s: State,
    q: web::Query<PageQuery>,
    r: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    list(s, q, r, Listing::Renewed).await
}
async fn list_released(
    s: State,
    q: web::Query<PageQuery>,
    r: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    list(s, q, r, Listing::Released).await
}

/// Answers a JSON array (the sample's shape), with the next page's cursor in `X-Next-Cursor`
/// and a `Link: <...>; rel="next"` header when there is more.
async fn list(
    state: State,
    query: web::Query<PageQuery>,
    request: HttpRequest,
    listing: Listing,
) -> Result<HttpResponse, ApiError> {
    let limit = match query.limit {
        None => DEFAULT_PAGE,
        Some(limit) if limit >= 1 => limit.min(MAX_PAGE),
        Some(limit) => {
            return Err(ApiError::invalid(
                "invalid_limit",
                "limit",
                format!("limit must be at least 1, got {limit}"),
            ));
        }
    };
    let after = match query.cursor.as_deref() {
        None | Some("") => 0,
        Some(cursor) => cursor
            .parse::<i64>()
            .ok()
            .filter(|after| *after >= 0)
            .ok_or_else(|| {
                ApiError::invalid(
                    "invalid_cursor",
                    "cursor",
                    "cursor is not one this service gave",
                )
            })?,
    };
    if let Some(prefix) = &query.resource_prefix
        && prefix.len() > MAX_NAME_BYTES
    {
        return Err(ApiError::invalid(
            "invalid_field",
            "resource_prefix",
            format!("resource_prefix must be at most {MAX_NAME_BYTES} bytes"),
        ));
    }
    let mut conn = db::connection(&state.pool).await?;
    let mut rows = repo::list(
        &mut conn,
        listing,
        query.resource_prefix.as_deref(),
        after,
        limit + 1,
    )
    .await?;
    let more = rows.len() > usize::try_from(limit).unwrap_or(usize::MAX);
    rows.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    let mut response = HttpResponse::Ok();
    if more && let Some(last) = rows.last() {
        let next = last.id.to_string();
        let mut link = format!("{}?cursor={next}&limit={limit}", request.path());
        if let Some(prefix) = &query.resource_prefix {
            link.push_str("&resource_prefix=");
            link.push_str(&percent_encode(prefix));
        }
        response.insert_header(("X-Next-Cursor", next));
        response.insert_header(("Link", format!("<{link}>; rel=\"next\"")));
    }
    Ok(response.json(rows.into_iter().map(leases::to_api).collect::<Vec<_>>()))
}

fn percent_encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({ "status": "ok" }))
}

/// Ready when the database answers within two seconds.
async fn readyz(state: State) -> Result<HttpResponse, ApiError> {
    let check = async {
        let mut conn = db::connection(&state.pool).await?;
        repo::ping(&mut conn).await.map_err(ApiError::from)
    };
    match tokio::time::timeout(Duration::from_secs(2), check).await {
        Ok(Ok(())) => Ok(HttpResponse::Ok().json(serde_json::json!({ "status": "ready" }))),
        Ok(Err(err)) => Err(ApiError::Unavailable(format!("database not ready: {err}"))),
        Err(_) => Err(ApiError::Unavailable(
            "database did not answer within 2 s".to_owned(),
        )),
    }
}

async fn metrics(state: State) -> Result<HttpResponse, ApiError> {
    let text = state
        .metrics
        .render()
        .map_err(|err| ApiError::Internal(err.to_string()))?;
    Ok(HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(text))
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// The app's fallback for paths no route matches.
pub async fn not_found(request: HttpRequest) -> ApiError {
    ApiError::NotFound {
        code: "not_found",
        message: format!("no route for {} {}", request.method(), request.path()),
    }
}

impl actix_web::Responder for ApiError {
    type Body = actix_web::body::BoxBody;

    fn respond_to(self, _: &HttpRequest) -> HttpResponse {
        actix_web::ResponseError::error_response(&self)
    }
}

fn json_config() -> web::JsonConfig {
    web::JsonConfig::default()
        .limit(MAX_BODY_BYTES)
        // The sample's clients and curl users do not always say what they send; a body that
        // says it is something else is still refused (415).
        .content_type_required(false)
        .error_handler(|err, _| json_error(err).into())
}

fn json_error(err: JsonPayloadError) -> ApiError {
    match err {
        JsonPayloadError::OverflowKnownLength { .. } | JsonPayloadError::Overflow { .. } => {
            ApiError::PayloadTooLarge {
                limit: MAX_BODY_BYTES,
            }
        }
        JsonPayloadError::ContentType => ApiError::UnsupportedMediaType,
        JsonPayloadError::Deserialize(err) if err.is_data() => {
            let message = err.to_string();
            let code = if message.starts_with("missing field") {
                "missing_field"
            } else {
                "invalid_field"
            };
            ApiError::Invalid {
                code,
                field: None,
                message: format!("invalid request body: {message}"),
            }
        }
        JsonPayloadError::Deserialize(err) => ApiError::Invalid {
            code: "malformed_json",
            field: None,
            message: format!("request body is not valid JSON: {err}"),
        },
        other => ApiError::Invalid {
            code: "malformed_json",
            field: None,
            message: format!("could not read the request body: {other}"),
        },
    }
}

fn path_config() -> web::PathConfig {
    web::PathConfig::default().error_handler(|err: PathError, _| {
        ApiError::invalid("invalid_id", "id", format!("invalid path: {err}")).into()
    })
}

fn query_config() -> web::QueryConfig {
    web::QueryConfig::default().error_handler(|err: QueryPayloadError, _| {
        ApiError::Invalid {
            code: "invalid_query",
            field: None,
            message: format!("invalid query string: {err}"),
        }
        .into()
    })
}

/// Middleware: counts and times every request by its route pattern (never the raw path, which
/// would make a metric series per lease id).
pub async fn record_metrics(
    request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = Instant::now();
    let method = request.method().to_string();
    let state = request.app_data::<State>().cloned();
    let response = next.call(request).await?;
    if let Some(state) = state {
        let route = response
            .request()
            .match_pattern()
            .unwrap_or_else(|| "unmatched".to_owned());
        let status = response.status().as_u16().to_string();
        state
            .metrics
            .http_requests
            .with_label_values(&[method.as_str(), route.as_str(), status.as_str()])
            .inc();
        state
            .metrics
            .http_duration
            .with_label_values(&[method.as_str(), route.as_str()])
            .observe(started.elapsed().as_secs_f64());
    }
    Ok(response)
}
