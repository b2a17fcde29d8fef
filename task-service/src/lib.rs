//! task-service: the only writer of the `tasks` table.
//!
//! Workers claim due tasks with `FOR UPDATE SKIP LOCKED`; each claim is backed by a lease on
//! the task from lease-service, whose fencing token the worker carries in every heartbeat,
//! completion and failure. A worker that dies or pauses loses its lease, and its task is
//! claimed again; a worker whose lease was superseded is refused (409) and changes nothing.
//! See `docs/src/design.md` for the invariants and `docs/src/task-api.md` for the HTTP API.
//!
//! # Layout
//!
//! `main.rs` only parses the command line; [`serve`] wires the pieces and hands them to the
//! start-up both services share ([`leasehold::server::startup`]):
//!
//! - [`config`]: the service's settings (flags and environment variables);
//! - [`db`]: the embedded migrations;
//! - [`context`]: what the rules need besides a connection ([`context::Context`]: the one
//!   lease-service client, settings, and the state every replica keeps);
//! - [`state`]: what every handler reaches (pool, groups, the rules' [`context::Context`] with its
//!   one lease-service client, the heavy reads' turns);
//! - [`http`]: the task and generator routes, thin handlers, one rule call each;
//!   [`dashboard`]: the operator page and its routes;
//! - [`tasks`]: the rules, one module per operation (create, claim, complete, transition, read,
//!   ready), and the claim and completion groups;
//! - [`generator`]: the generator's desired state and who leads it;
//! - [`queues`]: pause and resume, and each queue's state;
//! - [`schedules`]: periodic tasks (their definitions; the ticker is in [`maintenance`]);
//! - [`repo`]: every SQL statement, one module per kind;
//! - [`maintenance`]: the background jobs, one module each, composed in one place: on one
//!   replica (lapsed cancellations, the history rollup, retention) and on every replica (the
//!   schedule ticker, the wake-up listener);
//! - [`metrics`].

pub mod charts;
pub mod config;
pub mod context;
pub mod dashboard;
pub mod db;
pub mod generator;
pub mod http;
pub mod maintenance;
pub mod metrics;
pub mod queues;
pub mod repo;
pub mod schedules;
pub mod state;
pub mod tasks;
pub mod workers;

/// Where the tests and the tools found it before the migrations moved to [`db`].
pub use db::migrate;

use std::net::TcpListener;
use std::time::Duration;

use actix_web::web;
use anyhow::Context;
use leasehold::server::startup::{self, Server};
use leasehold::{Backoff, LeaseClient, RetryPolicy};
use tokio_util::sync::CancellationToken;

use crate::config::ServeConfig;
use crate::maintenance::LeaderConfig;
use crate::metrics::Metrics;
use crate::state::AppState;
use leasehold::server::wakeups::Wakeups;

/// Runs task-service until SIGTERM or SIGINT.
pub async fn serve(config: ServeConfig) -> anyhow::Result<()> {
    config.validate().map_err(anyhow::Error::msg)?;
    let listener = startup::bind(&config.server, || db::migrate(&config.database_url)).await?;
    run(config, listener, leasehold::shutdown::token()).await
}

/// Serves on `listener` until `stop` is cancelled, then finishes in-flight requests (up to the
/// grace period) and stops the background jobs ([`maintenance`]).
pub async fn run(
    config: ServeConfig,
    listener: TcpListener,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let database = config.server.database(&config.database_url, "")?;
    let pool = db::pool(&database, config.server.database_pool_size)?;
    let metrics =
        Metrics::with_max_queues(config.metrics_max_queues).context("registering metrics")?;
    let lease_url = config.lease_service_url.trim_end_matches('/').to_owned();
    let call_timeout = Duration::from_millis(config.lease_call_timeout_ms);
    let token = config
        .lease_service_token
        .as_ref()
        .map(leasehold::api::Secret::expose);
    let engine = context::Context {
        leases: LeaseClient::new(lease_url.as_str())
            .with_timeout(call_timeout)
            .with_retry(RetryPolicy::none())
            .with_bearer_token(token),
        lease_ttl: Duration::from_secs(config.lease_ttl_seconds),
        lease_prefix: config.lease_prefix.clone(),
        generator_resource: config.generator_resource.clone(),
        default_max_attempts: config.default_max_attempts,
        retry: Backoff::new(
            Duration::from_secs_f64(config.retry_base_seconds),
            Duration::from_secs_f64(config.retry_max_seconds),
        ),
        metrics: metrics.clone(),
        lease_ttl_verdict: context::TtlVerdict::default(),
        wakeups: Wakeups::new(
            stop.clone(),
            config.server.wait_recheck(),
            metrics.claims_waiting.clone(),
        ),
        schedules_changed: std::sync::Arc::default(),
        unlimited: context::Unlimited::default(),
    };
    let maintenance_engine = engine.clone();
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let reads_in_flight = config.reads_in_flight(cores);
    tracing::info!(reads_in_flight, "heavy reads served at once");
    let state = web::Data::new(AppState::new(
        pool.clone(),
        engine,
        config.groups_in_flight,
        reads_in_flight,
    ));
    tracing::info!(lease_service = %lease_url, "task-service calls lease-service");
    let maintenance = maintenance::run(
        database,
        pool,
        maintenance_engine,
        LeaderConfig {
            holder: config.server.holder("task-service"),
            interval: Duration::from_secs(config.sweep_interval_seconds),
            retention_seconds: config.retention_seconds,
        },
        stop.clone(),
    );
    let routes = http::configure(&config.auth_tokens);
    let server = Server {
        name: "task-service",
        args: config.server,
        auth: config.auth_tokens,
        http_metrics: metrics.http.clone(),
    };
    server
        .run_until_stopped(listener, stop, state, routes, maintenance)
        .await
}
