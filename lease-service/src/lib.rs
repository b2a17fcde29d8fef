//! lease-service: the only writer of the `leases` table.
//!
//! A lease is time-bound, exclusive ownership of a named resource. Acquire, renew and release
//! are each one SQL statement judged by the database's clock, every acquisition gets a fencing
//! token greater than any earlier one for its resource, and only the current holder can renew or
//! release. See `docs/src/design.md` for the invariants and `docs/src/lease-api.md` for the HTTP API.
//!
//! # Layout
//!
//! `main.rs` only parses the command line; [`serve`] wires the pieces and hands them to the
//! start-up both services share ([`leasehold::server::startup`]):
//!
//! - [`config`]: the service's settings (flags and environment variables);
//! - [`db`]: the pool and the embedded migrations;
//! - [`http`]: the routes, the `AppState` and thin handlers, one rule call each;
//! - [`leases`]: the rules, one module per operation (acquire, renew, release, revoke, read),
//!   and the groups concurrent single requests are served in;
//! - [`repo`]: every SQL statement, one module per kind;
//! - [`maintenance`]: the background jobs, one module each (retention, on the replica that
//!   holds the sweeper's lease; the wake-up listener, on every replica);
//! - [`metrics`], and [`error`], the shared `ApiError`.

pub mod config;
pub mod db;
/// The error type every handler returns, shared with task-service.
pub mod error {
    pub use leasehold::server::ApiError;
}
pub mod http;
pub mod leases;
pub mod maintenance;
pub mod metrics;
pub mod repo;

use std::net::TcpListener;
use std::time::Duration;

use actix_web::web;
use anyhow::Context;
use leasehold::server::startup::{self, Server};
use tokio_util::sync::CancellationToken;

use crate::config::ServeConfig;
use crate::http::AppState;
use crate::leases::{Groups, SecretPolicy, TtlPolicy};
use crate::maintenance::SweeperConfig;
use crate::metrics::Metrics;
use leasehold::server::wakeups::Wakeups;

/// Runs lease-service until SIGTERM or SIGINT: migrates (unless told not to), listens, sweeps.
pub async fn serve(config: ServeConfig) -> anyhow::Result<()> {
    config.validate().map_err(anyhow::Error::msg)?;
    #[cfg(feature = "test-hooks")]
    if config.test_break_acquire {
        tracing::error!(
            "LEASEHOLD_TEST_BREAK_ACQUIRE is set: acquire ignores expiry; leases are NOT exclusive"
        );
        repo::break_acquire();
    }
    let listener = startup::bind(&config.server, || db::migrate(&config.database_url)).await?;
    run(config, listener, leasehold::shutdown::token()).await
}

/// Serves on `listener` until `stop` is cancelled, then finishes in-flight requests (up to the
/// grace period), stops the background jobs ([`maintenance`]) and releases the sweeper's lease.
pub async fn run(
    config: ServeConfig,
    listener: TcpListener,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let database = config
        .server
        .database(&config.database_url, db::session(config.max_clock_skew_ms))?;
    let pool = db::pool(&database, config.server.database_pool_size)?;
    let metrics = Metrics::new().context("registering metrics")?;
    let ttl = TtlPolicy {
        default_seconds: config.default_ttl_seconds,
        min_seconds: config.min_ttl_seconds,
        max_seconds: config.max_ttl_seconds,
    };
    let secrets = SecretPolicy {
        required: config.require_secret,
    };
    let wakeups = Wakeups::with_limit(
        stop.clone(),
        config.server.wait_recheck(),
        metrics.acquires_waiting.clone(),
        config.max_waiters,
    );
    let state = web::Data::new(AppState {
        pool: pool.clone(),
        ttl,
        secrets,
        metrics: metrics.clone(),
        groups: Groups::new(
            pool.clone(),
            ttl,
            secrets,
            metrics.clone(),
            config.groups_in_flight,
        ),
        wakeups: wakeups.clone(),
    });
    if !config.require_secret {
        tracing::info!(
            "renew and release without the lease's secret are accepted (the sample's clients); set LEASE_REQUIRE_SECRET=true to require proof of holding"
        );
    }
    let maintenance = maintenance::run(
        database,
        pool,
        wakeups,
        metrics.clone(),
        SweeperConfig {
            holder: config.server.holder("lease-service"),
            interval: Duration::from_secs(config.sweep_interval_seconds),
            retention_seconds: config.retention_seconds,
        },
        stop.clone(),
    );
    let routes = http::configure(ttl, &config.auth_tokens);
    let server = Server {
        name: "lease-service",
        args: config.server,
        auth: config.auth_tokens,
        http_metrics: metrics.http.clone(),
    };
    server
        .run_until_stopped(listener, stop, state, routes, maintenance)
        .await
}
