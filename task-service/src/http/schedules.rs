//! The schedules' routes: create, read, replace, delete, pause and resume.

use actix_web::{HttpResponse, web};
use leasehold::api::ErrorBody;
use leasehold::schedules::{CreateSchedule, ReplaceSchedule, Schedule, Schedules};
use leasehold::server::db;
use leasehold::server::{ApiError, Json};

use crate::schedules;
use crate::state::State;

/// Schedules
#[utoipa::path(
    get,
    path = "/api/schedules",
    tag = "schedules",
    responses((status = 200, description = "Every schedule", body = Schedules))
)]
pub(super) async fn schedules_list(state: State) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(schedules::list(&mut conn).await?))
}

/// Create a schedule
#[utoipa::path(
    post,
    path = "/api/schedules",
    tag = "schedules",
    responses(
        (status = 201, description = "The schedule", body = Schedule, links(
            ("Get" = (operation_id = "schedule_get", parameters(("name" = "$response.body#/name")), description = "Read this schedule")),
            ("Pause" = (operation_id = "schedule_pause", parameters(("name" = "$response.body#/name")), description = "Pause this schedule")),
            ("Resume" = (operation_id = "schedule_resume", parameters(("name" = "$response.body#/name")), description = "Resume this schedule")),
            ("Delete" = (operation_id = "schedule_delete", parameters(("name" = "$response.body#/name")), description = "Delete this schedule")),
        )),
        (status = 400, description = "`invalid_field`, `missing_field`, `malformed_json`, `invalid_cron`, `invalid_timezone`", body = ErrorBody),
        (status = 409, description = "`schedule_exists`: the name is taken", body = ErrorBody),
    )
)]
pub(super) async fn schedule_create(
    state: State,
    body: Json<CreateSchedule>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let schedule = schedules::create(&mut conn, &state.engine, body.into_inner()).await?;
    Ok(HttpResponse::Created().json(schedule))
}

/// One schedule
#[utoipa::path(
    get,
    path = "/api/schedules/{name}",
    tag = "schedules",
    params(("name" = String, Path, description = "The schedule's name", min_length = 1, max_length = 200, pattern = r"^(?!\.\.?$)[^\u0000-\u001F\u007F-\u009F]*$")),
    responses(
        (status = 200, description = "The schedule", body = Schedule),
        (status = 404, description = "`schedule_not_found`", body = ErrorBody),
    )
)]
pub(super) async fn schedule_get(
    state: State,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(schedules::get(&mut conn, &name).await?))
}

/// Create or replace a schedule
#[utoipa::path(
    put,
    path = "/api/schedules/{name}",
    tag = "schedules",
    params(("name" = String, Path, description = "The schedule's name", min_length = 1, max_length = 200, pattern = r"^(?!\.\.?$)[^\u0000-\u001F\u007F-\u009F]*$")),
    responses(
        (status = 201, description = "The schedule, created", body = Schedule),
        (status = 200, description = "The schedule, replaced", body = Schedule),
        (status = 400, description = "`invalid_field`, `missing_field`, `malformed_json`, `invalid_cron`, `invalid_timezone`, `name_mismatch`", body = ErrorBody),
    )
)]
pub(super) async fn schedule_replace(
    state: State,
    name: web::Path<String>,
    body: Json<ReplaceSchedule>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let (schedule, created) =
        schedules::replace(&mut conn, &state.engine, &name, body.into_inner()).await?;
    Ok(if created {
        HttpResponse::Created().json(schedule)
    } else {
        HttpResponse::Ok().json(schedule)
    })
}

/// Delete a schedule
#[utoipa::path(
    delete,
    path = "/api/schedules/{name}",
    tag = "schedules",
    params(("name" = String, Path, description = "The schedule's name", min_length = 1, max_length = 200, pattern = r"^(?!\.\.?$)[^\u0000-\u001F\u007F-\u009F]*$")),
    responses(
        (status = 200, description = "The schedule deleted", body = Schedule),
        (status = 404, description = "`schedule_not_found`", body = ErrorBody),
    )
)]
pub(super) async fn schedule_delete(
    state: State,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(schedules::delete(&mut conn, &name).await?))
}

/// Pause a schedule
#[utoipa::path(
    post,
    path = "/api/schedules/{name}/pause",
    tag = "schedules",
    params(("name" = String, Path, description = "The schedule's name", min_length = 1, max_length = 200, pattern = r"^(?!\.\.?$)[^\u0000-\u001F\u007F-\u009F]*$")),
    responses(
        (status = 200, description = "The schedule", body = Schedule),
        (status = 404, description = "`schedule_not_found`", body = ErrorBody),
    )
)]
pub(super) async fn schedule_pause(
    state: State,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let schedule = schedules::set_paused(&mut conn, &state.engine, &name, true).await?;
    Ok(HttpResponse::Ok().json(schedule))
}

/// Resume a schedule
#[utoipa::path(
    post,
    path = "/api/schedules/{name}/resume",
    tag = "schedules",
    params(("name" = String, Path, description = "The schedule's name", min_length = 1, max_length = 200, pattern = r"^(?!\.\.?$)[^\u0000-\u001F\u007F-\u009F]*$")),
    responses(
        (status = 200, description = "The schedule", body = Schedule),
        (status = 404, description = "`schedule_not_found`", body = ErrorBody),
    )
)]
pub(super) async fn schedule_resume(
    state: State,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    let schedule = schedules::set_paused(&mut conn, &state.engine, &name, false).await?;
    Ok(HttpResponse::Ok().json(schedule))
}
