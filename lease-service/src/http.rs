//! Routes and handlers: each handler takes a connection, calls one function of [`crate::leases`]
//! and shapes the answer. Extractor failures are turned into JSON errors here too.

use std::time::Duration;

use actix_web::{HttpRequest, HttpResponse, web};
use leasehold::api::{
    AcquireLease, AcquireLeases, AcquiredLeases, CheckLeases, CheckedLeases, ErrorBody, Lease,
    LeasePage, OneLease, ReleaseLease, ReleaseLeases, ReleasedLeases, RenewLease,
};
use leasehold::server::Json;
use leasehold::server::auth::{Auth, Role};
use leasehold::server::http::{Order, Page, Probe, extractors, metrics_response, ready};
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

/// What mounts every route (see [`routes`]), documented with the TTLs `ttl` allows and as
/// `auth` locks them. The caller adds the [`AppState`] and `auth` as app data.
pub fn configure(
    ttl: TtlPolicy,
    auth: &Auth,
) -> impl Fn(&mut web::ServiceConfig) + Clone + Send + 'static {
    let routes = std::sync::Arc::new(documented(ttl).with_auth(auth));
    move |cfg| {
        extractors(cfg, MAX_BODY_BYTES);
        routes.mount(cfg);
    }
}

/// The routes, their document stating the TTLs this service takes.
pub fn documented(ttl: TtlPolicy) -> leasehold::server::routes::Routes {
    let (min, max) = (ttl.min_seconds, ttl.max_seconds);
    ["AcquireLease", "AcquireLeases", "RenewLease"]
        .into_iter()
        .fold(routes(), |routes, schema| {
            routes.bound(schema, "ttl_seconds", min, max)
        })
}

// Every route, once: what serves it and what documents it (`GET /api/openapi.json`). Writes
// need the `leaseholder` role, revoking another's lease the `operator` role; reads are open.
// A fixed path comes before one with a parameter in its place (`/batch` before `/{id}`).
leasehold::routes! {
    pub fn routes;
    list_all,
    acquire [Role::Leaseholder],
    acquire_many [Role::Leaseholder],
    release_many [Role::Leaseholder],
    check_many [Role::Leaseholder],
    list_active,
    list_expired,
    list_renewed,
    list_released,
    renew [Role::Leaseholder],
    release [Role::Leaseholder],
    get_by_id,
    release_by_id [Role::Leaseholder],
    revoke [Role::Operator],
    readyz,
    metrics,
}

/// Acquire a lease
///
/// Takes `resource` for `holder` for `ttl_seconds` (default 30, within the service's
/// `LEASE_MIN_TTL_SECONDS` to `LEASE_MAX_TTL_SECONDS`). A new acquisition answers 201 with a
/// greater fence than any before it on that resource and a `secret` (or keeps the one the
/// request brought); the holder acquiring again answers 200 and extends its lease, fence kept.
/// With `wait_ms`, a held lease is waited for up to that long.
#[utoipa::path(
    post,
    path = "/api/leases",
    tag = "leases",
    responses(
        (status = 201, description = "A new acquisition", body = Lease, links(
            ("Renew" = (operation_id = "renew", request_body = json!({"resource": "$response.body#/resource", "holder": "$response.body#/holder", "fence": "$response.body#/fence", "secret": "$response.body#/secret"}), description = "Renew this lease")),
            ("Release" = (operation_id = "release", request_body = json!({"resource": "$response.body#/resource", "holder": "$response.body#/holder", "fence": "$response.body#/fence", "secret": "$response.body#/secret"}), description = "Release this lease")),
            ("Get" = (operation_id = "get_by_id", parameters(("id" = "$response.body#/id")), description = "Read this lease")),
            ("ReleaseById" = (operation_id = "release_by_id", parameters(("id" = "$response.body#/id")), request_body = json!({"resource": "$response.body#/resource", "holder": "$response.body#/holder", "fence": "$response.body#/fence", "secret": "$response.body#/secret"}), description = "Release this lease by its id")),
            ("Revoke" = (operation_id = "revoke", parameters(("id" = "$response.body#/id")), description = "Revoke this lease")),
        )),
        (status = 200, description = "The holder's own lease, extended (reentrant)", body = Lease),
        (status = 400, description = "`invalid_field`, `missing_field`, `malformed_json`, `invalid_ttl`, `invalid_secret`, `invalid_wait`, `invalid_metadata`, `secret_required`", body = ErrorBody),
        (status = 409, description = "`lease_held`: another holder has it (with `holder`, `expiresAt`, `expiresInMs`); `wrong_secret`: a reentrant acquire with another secret", body = ErrorBody),
    )
)]
async fn acquire(state: State, body: Json<AcquireLease>) -> Result<HttpResponse, ApiError> {
    Ok(
        match state.groups.acquire_waiting(&state.wakeups, &body).await? {
            AcquireOutcome::Acquired(lease) => HttpResponse::Created().json(lease),
            AcquireOutcome::Extended(lease) => HttpResponse::Ok().json(lease),
        },
    )
}

/// Acquire many leases
///
/// Up to 100 distinct resources in one statement and one commit, for one `holder` or a holder
/// each (`holders`, in the order of `resources`). Each is acquired as `POST /api/leases` would
/// acquire it alone; there is no all-or-nothing.
#[utoipa::path(
    post,
    path = "/api/leases/batch",
    tag = "leases",
    responses(
        (status = 200, description = "Which were acquired (new), extended (the holder's own) and held (someone else's)", body = AcquiredLeases),
        (status = 400, description = "`invalid_batch`, `duplicate_resource`, `invalid_field`, `missing_field`, `malformed_json`, `invalid_ttl`, `invalid_metadata`", body = ErrorBody),
    )
)]
async fn acquire_many(state: State, body: Json<AcquireLeases>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let answer =
        leases::acquire_many(&mut conn, state.ttl, state.secrets, &state.metrics, &body).await?;
    Ok(HttpResponse::Ok().json(answer))
}

/// Release many leases
///
/// Up to 100 releases in one transaction; one result per release, in order, each with the
/// status and body its own `DELETE /api/leases/release` would have got.
#[utoipa::path(
    post,
    path = "/api/leases/batch/release",
    tag = "leases",
    responses(
        (status = 200, description = "One result per release", body = ReleasedLeases),
        (status = 400, description = "`invalid_batch`, `invalid_field`, `missing_field`, `malformed_json`", body = ErrorBody),
    )
)]
async fn release_many(state: State, body: Json<ReleaseLeases>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let results =
        leases::release_many(&mut conn, state.secrets, &state.metrics, &body.leases).await?;
    Ok(HttpResponse::Ok().json(ReleasedLeases { results }))
}

/// Check many acquisitions
///
/// Where up to 100 acquisitions stand, each by resource and fence, read in one statement and
/// written nowhere: `held` (its holder may act), `lapsed`, `expired`, `released`, `revoked`,
/// `superseded` or `missing`.
#[utoipa::path(
    post,
    path = "/api/leases/batch/check",
    tag = "leases",
    responses(
        (status = 200, description = "One result per acquisition, in order", body = CheckedLeases),
        (status = 400, description = "`invalid_batch`, `invalid_field`, `missing_field`, `malformed_json`", body = ErrorBody),
    )
)]
async fn check_many(state: State, body: Json<CheckLeases>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let results = leases::check_many(&mut conn, &body.leases).await?;
    Ok(HttpResponse::Ok().json(CheckedLeases { results }))
}

/// Renew a lease
///
/// Extends the holder's lease by its TTL (or a new `ttl_seconds`) from now. With `fence`, only
/// that acquisition is renewed.
#[utoipa::path(
    put,
    path = "/api/leases/renew",
    tag = "leases",
    responses(
        (status = 200, description = "The renewed lease", body = Lease, links(
            ("Release" = (operation_id = "release", request_body = json!({"resource": "$response.body#/resource", "holder": "$response.body#/holder", "fence": "$response.body#/fence", "secret": "$response.body#/secret"}), description = "Release this lease")),
        )),
        (status = 400, description = "`invalid_field`, `missing_field`, `malformed_json`, `invalid_ttl`, `invalid_metadata`, `secret_required`", body = ErrorBody),
        (status = 404, description = "`lease_not_found`: the resource has no lease", body = ErrorBody),
        (status = 409, description = "`not_holder`, `stale_fence`, `lease_expired`, `lease_released`, `lease_revoked`, `wrong_secret`", body = ErrorBody),
    )
)]
async fn renew(state: State, body: Json<RenewLease>) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(state.groups.renew(&body).await?))
}

/// Release a lease
///
/// Ends the holder's lease now; the next acquisition gets a greater fence. Repeating a release
/// (same holder and fence) answers 200 again.
#[utoipa::path(
    delete,
    path = "/api/leases/release",
    tag = "leases",
    responses(
        (status = 200, description = "The released lease", body = Lease),
        (status = 400, description = "`invalid_field`, `missing_field`, `malformed_json`, `secret_required`", body = ErrorBody),
        (status = 404, description = "`lease_not_found`: the resource has no lease", body = ErrorBody),
        (status = 409, description = "`not_holder`, `stale_fence`, `lease_expired`, `lease_revoked`, `wrong_secret`", body = ErrorBody),
    )
)]
async fn release(state: State, body: Json<ReleaseLease>) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(state.groups.release(&body, None).await?))
}

/// Release a lease by id
///
/// As `DELETE /api/leases/release`, for the lease with this id (the sample's request); the
/// body names its resource and holder.
#[utoipa::path(
    delete,
    path = "/api/leases/{id}",
    tag = "leases",
    params(("id" = i64, Path, description = "The lease's id")),
    responses(
        (status = 200, description = "The released lease", body = Lease),
        (status = 400, description = "`invalid_id`, `invalid_field`, `missing_field`, `malformed_json`, `secret_required`", body = ErrorBody),
        (status = 404, description = "`lease_not_found`: no lease of that id on that resource", body = ErrorBody),
        (status = 409, description = "`not_holder`, `stale_fence`, `lease_expired`, `lease_revoked`, `wrong_secret`", body = ErrorBody),
    )
)]
async fn release_by_id(
    state: State,
    id: web::Path<i64>,
    body: Json<ReleaseLease>,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(state.groups.release(&body, Some(*id)).await?))
}

/// Revoke a lease
///
/// An operator ends lease `id` whoever holds it: its holder's renewals and releases then get
/// 409 `lease_revoked`, and the next acquisition gets a greater fence.
#[utoipa::path(
    post,
    path = "/api/leases/{id}/revoke",
    tag = "leases",
    params(("id" = i64, Path, description = "The lease's id")),
    responses(
        (status = 200, description = "The revoked lease", body = Lease),
        (status = 404, description = "`lease_not_found`", body = ErrorBody),
    )
)]
async fn revoke(state: State, id: web::Path<i64>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(leases::revoke(&mut conn, &state.metrics, *id).await?))
}

/// One lease
#[utoipa::path(
    get,
    path = "/api/leases/{id}",
    tag = "leases",
    params(("id" = i64, Path, description = "The lease's id")),
    responses(
        (status = 200, description = "The lease, as `{lease}`", body = OneLease),
        (status = 404, description = "`lease_not_found`", body = ErrorBody),
    )
)]
async fn get_by_id(state: State, id: web::Path<i64>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let lease = leases::get(&mut conn, *id).await?;
    Ok(HttpResponse::Ok().json(OneLease { lease }))
}

/// Query of the listing routes. Pages are in id order (`order=desc`: newest first); `cursor` is
/// the `nextCursor` of the previous page. `resource` names one resource exactly (a lookup that
/// no number of leases sharing its prefix can push off the first page); `resource_prefix`
/// narrows to resources starting with it.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct PageQuery {
    /// Leases per page: 1 or more, at most 1,000 are answered (default 100).
    #[param(minimum = 1)]
    limit: Option<i64>,
    /// The previous page's `nextCursor`.
    #[param(pattern = r"^[0-9]{0,18}$")]
    cursor: Option<String>,
    /// `asc` (oldest first, the default) or `desc` (newest first).
    #[param(inline)]
    order: Option<Order>,
    /// Only the lease of this resource, exactly.
    #[param(max_length = 512, pattern = r"^[^\u0000]*$")]
    resource: Option<String>,
    /// Only leases whose resource starts with this.
    #[param(max_length = 512, pattern = r"^[^\u0000]*$")]
    resource_prefix: Option<String>,
}

macro_rules! listing {
    ($name:ident, $path:literal, $which:expr, $summary:literal) => {
        #[doc = $summary]
        ///
        /// A page as `{leases, nextCursor, now}`: `now` is the database's clock the page was
        /// judged by (time every lease's `expiresAt` from it, not from your own clock), and
        /// `nextCursor` the next page's `cursor` (null on the last page).
        #[utoipa::path(
            get,
            path = $path,
            tag = "leases",
            params(PageQuery),
            responses(
                (status = 200, description = "A page of leases", body = LeasePage),
                (status = 400, description = "`invalid_limit`, `invalid_cursor`, `invalid_query`, `invalid_field`", body = ErrorBody),
            )
        )]
        async fn $name(
            state: State,
            query: web::Query<PageQuery>,
            request: HttpRequest,
        ) -> Result<HttpResponse, ApiError> {
            list(state, query, request, $which).await
        }
    };
}

listing!(list_all, "/api/leases", Listing::All, "All leases");
listing!(
    list_active,
    "/api/leases/active",
    Listing::Active,
    "Active leases"
);
listing!(
    list_expired,
    "/api/leases/expired",
    Listing::Expired,
    "Expired leases"
);
listing!(
    list_renewed,
    "/api/leases/renewed",
    Listing::Renewed,
    "Leases renewed at least once"
);
listing!(
    list_released,
    "/api/leases/released",
    Listing::Released,
    "Released leases"
);

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

/// Readiness
///
/// Ready when the database answers within two seconds.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, description = "Ready, with the database node it reached", body = Probe),
    )
)]
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

/// Prometheus metrics
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses((status = 200, description = "The Prometheus text format", content_type = "text/plain", body = String))
)]
async fn metrics(state: State) -> Result<HttpResponse, ApiError> {
    metrics_response(&state.metrics.registry)
}
