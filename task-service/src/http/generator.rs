//! The task generator's routes: its state and settings, start and stop.

use actix_web::{HttpResponse, web};
use leasehold::ErrorCode;
use leasehold::api::ErrorBody;
use leasehold::generator::{GeneratorSettings, GeneratorStatus, StartGenerator};
use leasehold::server::ApiError;
use leasehold::server::db;

use crate::generator;
use crate::state::State;

/// The generator's state
///
/// What it should do, and which replica leads it now.
#[utoipa::path(
    get,
    path = "/api/generator/status",
    tag = "generator",
    responses((status = 200, description = "The generator's state", body = GeneratorStatus))
)]
pub(super) async fn generator_status(state: State) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(generator::status(&mut conn, &state.engine).await?))
}

/// The generator's settings
///
/// The desired state alone (what generator replicas poll; no lease-service call).
#[utoipa::path(
    get,
    path = "/api/generator/settings",
    tag = "generator",
    responses((status = 200, description = "The generator's settings", body = GeneratorSettings))
)]
pub(super) async fn generator_settings(state: State) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(generator::settings(&mut conn).await?))
}

/// Start the generator
///
/// The sample's start takes no body; a JSON body may change the rate and the sleep range.
#[utoipa::path(
    post,
    path = "/api/generator/start",
    tag = "generator",
    request_body(content = Option<StartGenerator>, description = "Optional: a new rate and sleep range"),
    responses(
        (status = 200, description = "The generator's state", body = GeneratorStatus),
        (status = 400, description = "`invalid_field`, `malformed_json`", body = ErrorBody),
    )
)]
pub(super) async fn generator_start(
    state: State,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    // No body (the sample's start), and a JSON `null`, change nothing. A body of whitespace
    // alone is not JSON, and is refused as such.
    let change: StartGenerator = if body.is_empty() {
        StartGenerator::default()
    } else {
        leasehold::strict::from_slice::<Option<StartGenerator>>(&body)
            .map(Option::unwrap_or_default)
            .map_err(|err| ApiError::Invalid {
                code: if err.is_data() {
                    ErrorCode::InvalidField
                } else {
                    ErrorCode::MalformedJson
                },
                field: None,
                message: format!("invalid request body: {err}"),
            })?
    };
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(generator::start(&mut conn, &state.engine, change).await?))
}

/// Stop the generator
///
/// The sample's generator page stops with `DELETE`.
#[utoipa::path(
    delete,
    path = "/api/generator/stop",
    tag = "generator",
    responses((status = 200, description = "The generator's state", body = GeneratorStatus))
)]
pub(super) async fn generator_stop(state: State) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connection(&state.pool).await?;
    Ok(HttpResponse::Ok().json(generator::stop(&mut conn, &state.engine).await?))
}

/// Stop the generator (`POST`)
///
/// As `DELETE /api/generator/stop`, kept for Leasehold's own clients.
#[utoipa::path(
    post,
    path = "/api/generator/stop",
    tag = "generator",
    responses((status = 200, description = "The generator's state", body = GeneratorStatus))
)]
pub(super) async fn generator_stop_post(state: State) -> Result<HttpResponse, ApiError> {
    generator_stop(state).await
}
