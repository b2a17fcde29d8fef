//! Routes and handlers: each handler takes a connection, calls one function of [`crate::leases`]
//! and shapes the answer. Extractor failures are turned into JSON errors here too.

use std::time::Duration;

use actix_web::{HttpRequest, HttpResponse, web};
use leasehold::api::{
    AcquireLease, AcquireLeases, CheckLeases, CheckedLeases, OneLease, ReleaseLease, ReleaseLeases,
    ReleasedLeases, RenewLease,
};
use leasehold::server::auth::{Role, locked};
use leasehold::server::http::{
    Order, Page, extractors, get_only, healthz, method_not_allowed, metrics_response, ready,
};
use leasehold::server::wakeups::Wakeups;
use serde::Deserialize;

use crate::db::{self, DbPool};
use crate::error::ApiError;
use crate::leases::{self, AcquireOutcome, SecretPolicy, TtlPolicy, read};
use crate::metrics::Metrics;
use crate::repo::{Listing, ResourceFilter};

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// What every handler can reach.
pub struct AppState {
    pub pool: DbPool,
    pub ttl: TtlPolicy,
    pub secrets: SecretPolicy,
    pub metrics: Metrics,
    /// Single acquires, renewals and releases, served in groups of those that arrive together.
    pub groups: leases::Groups,
    /// The acquires waiting for a held lease (`wait_ms`) on this replica.
    pub wakeups: Wakeups,
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

/// Mounts every route. The caller adds the [`AppState`] and the
/// [`leasehold::server::auth::Auth`] as app data. Writes need the `leaseholder` role, revoking
/// another's lease the `operator` role; reads are open.
pub fn configure(cfg: &mut web::ServiceConfig) {
    extractors(cfg, MAX_BODY_BYTES);
    cfg.service(
        web::scope("/api/leases")
            .service(
                web::resource("")
                    .route(web::get().to(listing(Listing::All)))
                    .route(locked(web::post().to(acquire), Role::Leaseholder))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                web::resource("/batch")
                    .route(locked(web::post().to(acquire_many), Role::Leaseholder))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                web::resource("/batch/release")
                    .route(locked(web::post().to(release_many), Role::Leaseholder))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                web::resource("/batch/check")
                    .route(locked(web::post().to(check_many), Role::Leaseholder))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(get_only("/active", listing(Listing::Active)))
            .service(get_only("/expired", listing(Listing::Expired)))
            .service(get_only("/renewed", listing(Listing::Renewed)))
            .service(get_only("/released", listing(Listing::Released)))
            .service(
                web::resource("/renew")
                    .route(locked(web::put().to(renew), Role::Leaseholder))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                web::resource("/release")
                    .route(locked(web::delete().to(release), Role::Leaseholder))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                web::resource("/{id}")
                    .route(web::get().to(get_by_id))
                    .route(locked(web::delete().to(release_by_id), Role::Leaseholder))
                    .default_service(web::to(method_not_allowed)),
            )
            .service(
                web::resource("/{id}/revoke")
                    .route(locked(web::post().to(revoke), Role::Operator))
                    .default_service(web::to(method_not_allowed)),
            ),
    )
    .service(get_only("/healthz", healthz))
    .service(get_only("/readyz", readyz))
    .service(get_only("/metrics", metrics));
}

async fn acquire(state: State, body: web::Json<AcquireLease>) -> Result<HttpResponse, ApiError> {
    Ok(
        match state.groups.acquire_waiting(&state.wakeups, &body).await? {
            AcquireOutcome::Acquired(lease) => HttpResponse::Created().json(lease),
            AcquireOutcome::Extended(lease) => HttpResponse::Ok().json(lease),
        },
    )
}

async fn acquire_many(
    state: State,
    body: web::Json<AcquireLeases>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let answer =
        leases::acquire_many(&mut conn, state.ttl, state.secrets, &state.metrics, &body).await?;
    Ok(HttpResponse::Ok().json(answer))
}

/// Releases in one transaction: one commit for the batch. A refusal is that item's answer; only
/// a failure of the database fails the whole request (and then nothing was released).
async fn release_many(
    state: State,
    body: web::Json<ReleaseLeases>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let results =
        leases::release_many(&mut conn, state.secrets, &state.metrics, &body.leases).await?;
    Ok(HttpResponse::Ok().json(ReleasedLeases { results }))
}

/// Where each acquisition stands, in one read (see [`leases::check_many`]).
async fn check_many(state: State, body: web::Json<CheckLeases>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let results = leases::check_many(&mut conn, &body.leases).await?;
    Ok(HttpResponse::Ok().json(CheckedLeases { results }))
}

async fn renew(state: State, body: web::Json<RenewLease>) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(state.groups.renew(&body).await?))
}

async fn release(state: State, body: web::Json<ReleaseLease>) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(state.groups.release(&body, None).await?))
}

async fn release_by_id(
    state: State,
    id: web::Path<i64>,
    body: web::Json<ReleaseLease>,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(state.groups.release(&body, Some(*id)).await?))
}

async fn revoke(state: State, id: web::Path<i64>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(leases::revoke(&mut conn, &state.metrics, *id).await?))
}

async fn get_by_id(state: State, id: web::Path<i64>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let lease = leases::get(&mut conn, *id).await?;
    Ok(HttpResponse::Ok().json(OneLease { lease }))
}

/// Query of the listing routes. Pages are in id order (`order=desc`: newest first); `cursor` is
/// the `nextCursor` of the previous page. `resource` names one resource exactly (a lookup that
/// no number of leases sharing its prefix can push off the first page); `resource_prefix`
/// narrows to resources starting with it.
#[derive(Debug, Deserialize)]
struct PageQuery {
    limit: Option<i64>,
    cursor: Option<String>,
    order: Option<Order>,
    resource: Option<String>,
    resource_prefix: Option<String>,
}

/// The handler of one listing route: every listing shares [`list`], and differs only in which
/// leases it selects.
fn listing(
    which: Listing,
) -> impl Fn(State, web::Query<PageQuery>, HttpRequest) -> ListFuture + Clone + 'static {
    move |state, query, request| Box::pin(list(state, query, request, which))
}

type ListFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<HttpResponse, ApiError>>>>;

/// Answers `{"leases": [...], "nextCursor": ..., "now": ...}` (the sample's pages read
/// `data.leases`): `now` is the database's clock the page was judged by, so that a reader can
/// tell every lease's time from one reading, never its own clock.
async fn list(
    state: State,
    query: web::Query<PageQuery>,
    request: HttpRequest,
    listing: Listing,
) -> Result<HttpResponse, ApiError> {
    let page = Page::parse(query.limit, query.cursor.as_deref(), query.order)?;
    let filter = ResourceFilter {
        exact: query.resource.as_deref(),
        prefix: query.resource_prefix.as_deref(),
    };
    read::check_filter(filter)?;
    let mut conn = db::connection(&state.pool).await?;
    let (leases, now) = read::list(&mut conn, listing, filter, page).await?;
    let mut beside = serde_json::Map::new();
    if let Some(now) = now {
        beside.insert("now".to_owned(), serde_json::json!(now));
    }
    Ok(page.respond_beside(
        &request,
        ("leases", leases),
        false,
        |lease| lease.id,
        &[
            ("resource", query.resource.as_deref()),
            ("resource_prefix", query.resource_prefix.as_deref()),
        ],
        beside,
    ))
}

/// Ready when the database answers within two seconds.
async fn readyz(state: State) -> Result<HttpResponse, ApiError> {
    let check = async {
        let mut conn = db::connection(&state.pool).await?;
        Ok::<_, ApiError>(leasehold::server::db::node(&mut conn).await?)
    };
    match tokio::time::timeout(Duration::from_secs(2), check).await {
        Ok(Ok(node)) => Ok(ready(node)),
        Ok(Err(err)) => Err(ApiError::Unavailable(format!("database not ready: {err}"))),
        Err(_) => Err(ApiError::Unavailable(
            "database did not answer within 2 s".to_owned(),
        )),
    }
}

async fn metrics(state: State) -> Result<HttpResponse, ApiError> {
    metrics_response(&state.metrics.registry)
}
