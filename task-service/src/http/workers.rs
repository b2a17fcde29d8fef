//! The worker processes' routes: a process's beat and its goodbye, and the list of those alive.

use actix_web::{HttpResponse, web};
use leasehold::api::ErrorBody;
use leasehold::server::{ApiError, Json};
use leasehold::workers::{WorkerBeat, WorkerGone, WorkerLease, Workers};

use crate::state::State;

/// A worker process's beat
///
/// Announces the process (`worker:<id>`, with what it says of itself) and renews its liveness
/// lease, whose fence its claims name so that its tasks need no lease of their own.
#[utoipa::path(
    put,
    path = "/api/workers/{id}",
    tag = "workers",
    params(("id" = String, Path, description = "The worker process's id", min_length = 1, max_length = 505, pattern = r"^(?!\.\.?$)[^\u0000-\u001F\u007F-\u009F]*$")),
    responses(
        (status = 200, description = "The liveness lease to present at the next beat", body = WorkerLease, links(
            ("Gone" = (operation_id = "worker_gone", parameters(("id" = "$request.path.id")), request_body = json!({"instance": "$request.body#/instance", "fence": "$response.body#/fence", "secret": "$request.body#/secret"}), description = "The process stops")),
        )),
        (status = 400, description = "`invalid_field`, `missing_field`, `malformed_json`, `invalid_ttl`", body = ErrorBody),
        (status = 409, description = "`worker_id_in_use`: another live process has this id; `lease_lost`, `lease_expired`, `lease_released`, `lease_revoked`: the lease presented is no longer this process's", body = ErrorBody),
    )
)]
pub(super) async fn worker_beat(
    state: State,
    id: web::Path<String>,
    body: Json<WorkerBeat>,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(crate::workers::beat(&state.engine, &id, &body).await?))
}

/// A worker process's goodbye
///
/// Releases its liveness lease; its tasks are handed back by their own requests.
#[utoipa::path(
    delete,
    path = "/api/workers/{id}",
    tag = "workers",
    params(("id" = String, Path, description = "The worker process's id", min_length = 1, max_length = 505, pattern = r"^(?!\.\.?$)[^\u0000-\u001F\u007F-\u009F]*$")),
    responses(
        (status = 204, description = "Its lease released"),
        (status = 400, description = "`invalid_field`, `missing_field`, `malformed_json`", body = ErrorBody),
        (status = 409, description = "`lease_lost`, `lease_expired`, `lease_revoked`: the lease is no longer this process's", body = ErrorBody),
    )
)]
pub(super) async fn worker_gone(
    state: State,
    id: web::Path<String>,
    body: Json<WorkerGone>,
) -> Result<HttpResponse, ApiError> {
    crate::workers::gone(&state.engine, &id, &body).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// Worker processes
///
/// The processes that announced themselves, with their liveness and what they run.
#[utoipa::path(
    get,
    path = "/api/workers",
    tag = "workers",
    responses((status = 200, description = "The worker processes", body = Workers))
)]
pub(super) async fn workers_list(state: State) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(crate::workers::list(&state.engine).await?))
}
