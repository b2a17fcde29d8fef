//! Routes and handlers, by resource (tasks, their reads, queues, schedules, the generator,
//! worker processes; the dashboard's are in [`crate::dashboard`]): each takes a connection,
//! calls one function of [`crate::tasks`] (or its resource's module) and shapes the answer.

mod generator;
mod queues;
mod schedules;
mod task_reads;
mod tasks;
mod workers;

use std::time::Duration;

use actix_web::{HttpResponse, web};
use leasehold::api::ErrorBody;
use leasehold::server::ApiError;
use leasehold::server::auth::{Auth, Role};
use leasehold::server::db;
use leasehold::server::http::{Probe, extractors, metrics_response, ready};

use crate::dashboard;
use crate::state::State;
use crate::tasks::read::{self};

/// Largest request body accepted (task data is capped lower, at 64 KiB).
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// Largest body of `POST /api/tasks/batch`: 1,000 tasks of about 16 KiB each.
pub const MAX_BATCH_BODY_BYTES: usize = 16 * 1024 * 1024;

/// What mounts every route (see [`routes`]), documented as `auth` locks them. The caller adds
/// the [`crate::state::AppState`] and `auth` as app data.
pub fn configure(auth: &Auth) -> impl Fn(&mut web::ServiceConfig) + Clone + Send + 'static {
    let routes = std::sync::Arc::new(
        routes()
            .body_limit("/api/tasks/batch", MAX_BATCH_BODY_BYTES)
            // One body for the three bulk operations; each takes its own statuses.
            .narrow("retry_many", "status", &["dead", "cancelled"])
            .narrow("cancel_many", "status", &["pending", "running"])
            .narrow("delete_many", "status", &["succeeded", "dead", "cancelled"])
            .with_auth(auth),
    );
    move |cfg| {
        extractors(cfg, MAX_BODY_BYTES);
        routes.mount(cfg);
    }
}

// Every route, once: what serves it and what documents it (`GET /api/openapi.json`). Each
// write needs its role (producer, worker or operator); reads are open. A fixed path comes
// before one with a parameter in its place (`/api/tasks/retry` before `/api/tasks/{id}`).
leasehold::routes! {
    pub fn routes;
    task_reads::list_all,
    tasks::create [Role::Producer],
    tasks::create_many [Role::Producer],
    tasks::retry_many [Role::Operator],
    tasks::cancel_many [Role::Operator],
    tasks::delete_many [Role::Operator],
    task_reads::list_processed,
    task_reads::list_started,
    task_reads::counts,
    tasks::next [Role::Worker],
    tasks::complete_many [Role::Worker],
    task_reads::get_by_id,
    task_reads::events,
    tasks::heartbeat [Role::Worker],
    tasks::complete [Role::Worker],
    tasks::fail [Role::Worker],
    tasks::snooze [Role::Worker],
    tasks::cancel [Role::Operator],
    tasks::retry [Role::Operator],
    generator::generator_status,
    generator::generator_settings,
    generator::generator_start [Role::Operator],
    generator::generator_stop [Role::Operator],
    generator::generator_stop_post [Role::Operator],
    queues::queues_list,
    queues::queue_get,
    queues::queue_set_limits [Role::Operator],
    queues::queue_pause [Role::Operator],
    queues::queue_resume [Role::Operator],
    schedules::schedules_list,
    schedules::schedule_create [Role::Operator],
    schedules::schedule_get,
    schedules::schedule_replace [Role::Operator],
    schedules::schedule_delete [Role::Operator],
    schedules::schedule_pause [Role::Operator],
    schedules::schedule_resume [Role::Operator],
    workers::workers_list,
    workers::worker_beat [Role::Worker],
    workers::worker_gone [Role::Worker],
    dashboard::page,
    dashboard::page_view,
    dashboard::page_task,
    dashboard::to_dashboard,
    dashboard::overview,
    dashboard::throughput,
    dashboard::leases,
    dashboard::revoke [Role::Operator],
    readyz,
    metrics,
}

/// Readiness
///
/// Ready when the database answers, lease-service is healthy and accepts the task lease TTL,
/// all within two seconds.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, description = "Ready, with the database node it reached", body = Probe),
        (status = 503, description = "`unavailable`, `task_lease_ttl_rejected`", body = ErrorBody),
    )
)]
async fn readyz(state: State) -> Result<HttpResponse, ApiError> {
    Ok(ready(
        crate::tasks::ready(&state.pool, &state.engine).await?,
    ))
}

/// Prometheus metrics
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses((status = 200, description = "The Prometheus text format", content_type = "text/plain", body = String))
)]
async fn metrics(state: State) -> Result<HttpResponse, ApiError> {
    // The gauges read every queue's counts: a heavy read, which waits its turn like the others
    // (within the two seconds), so that scrapes cannot take the claims' connections either.
    let reading = async {
        let _turn = state.reads.turn().await?;
        let mut conn = db::connection(&state.pool).await?;
        read::gauges(&mut conn).await
    };
    // A database that does not answer leaves the gauges as they were; counters still serve.
    match tokio::time::timeout(Duration::from_secs(2), reading).await {
        Ok(Ok(gauges)) => state.engine.metrics.observe_database(
            &gauges.counts,
            &gauges.oldest_due,
            &gauges.queues,
        ),
        Ok(Err(err)) => tracing::warn!(error = %err, "could not read task gauges"),
        Err(_) => tracing::warn!("reading task gauges timed out"),
    }
    metrics_response(&state.engine.metrics.registry)
}
