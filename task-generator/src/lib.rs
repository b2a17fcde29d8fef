//! task-generator: fake work for the workers, produced by exactly one replica at a time.
//!
//! Every replica runs a [`leasehold::Singleton`] on the lease `task-generator`. The holder reads
//! the desired state (started or stopped, rate, sleep range) from task-service, which any
//! task-service replica changes, and creates `{"sleep_duration_seconds": N}` tasks at the rate.
//! Each create names its fence (`generator_fence`) and carries the idempotency key
//! `task-generator:<fence>:<term>:<sequence>`, so a retried request never creates a second task;
//! task-service refuses a fence that no longer holds the lease, and any create once the
//! generator is stopped (the leader then goes back to polling the desired state).
//! The holder checks that its lease is certainly held right before every request and stops the
//! moment the guard signals loss. A stopped generator keeps its lease: the leader stays ready
//! and starts producing the moment the desired state says so, and status can name it.
//!
//! # Layout
//!
//! This file holds the configuration and [`run`], which elects the leader; `produce` is the
//! leader's term (read the desired state, create at the rate, retry with the same key), `pace`
//! the rate and the sleep durations, `metrics` what it counts.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use leasehold::metrics_server::MetricsServer;
use leasehold::{GuardConfig, LeaseClient, Singleton, SingletonEvent, TaskClient};
use tokio_util::sync::CancellationToken;

mod metrics;
mod pace;
mod produce;

pub use metrics::Metrics;

use produce::Producer;

/// Configuration: flags, each also read from an environment variable.
#[derive(Debug, Clone, Args)]
pub struct GeneratorConfig {
    /// Base URL of task-service.
    #[arg(long, env = "TASK_SERVICE_URL", value_parser = leasehold::service_url)]
    pub task_service_url: String,

    /// Base URL of lease-service.
    #[arg(long, env = "LEASE_SERVICE_URL", value_parser = leasehold::service_url)]
    pub lease_service_url: String,

    /// Bearer token sent to both services: it needs the `leaseholder` role in lease-service's
    /// `AUTH_TOKENS` and the `producer` role in task-service's, when they are set. Unset: none
    /// is sent.
    #[arg(long, env = "AUTH_TOKEN", hide_env_values = true)]
    pub auth_token: Option<leasehold::api::Secret>,

    /// This replica's name, the holder of the lease while it leads (default: host name, process
    /// id and a random suffix).
    #[arg(long, env = "GENERATOR_ID")]
    pub generator_id: Option<String>,

    /// The lease the replicas contend for (task-service's GENERATOR_LEASE_RESOURCE must match).
    #[arg(
        long,
        env = "GENERATOR_LEASE_RESOURCE",
        default_value = "task-generator"
    )]
    pub lease_resource: String,

    /// Length of the leader's lease: a dead leader is replaced within this plus one retry
    /// interval.
    #[arg(long, env = "GENERATOR_LEASE_TTL_SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub lease_ttl_seconds: u64,

    /// How often a standby tries to take the lease (jittered ±20 %). Bounded, so that no
    /// duration made from it can overflow.
    #[arg(long, env = "GENERATOR_RETRY_INTERVAL_SECONDS", default_value_t = 5.0,
          value_parser = leasehold::float_within(0.01..=3600.0))]
    pub retry_interval_seconds: f64,

    /// How often the leader re-reads the desired state from task-service.
    #[arg(long, env = "GENERATOR_SETTINGS_POLL_MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub settings_poll_ms: u64,

    /// Queue of the tasks it creates.
    #[arg(long, env = "GENERATOR_QUEUE", default_value = "default")]
    pub queue: String,

    /// Serve `GET /healthz` and `GET /metrics` on this address.
    #[arg(long, env = "METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,
}

/// Contends for the lease and, while leading, produces tasks, until `shutdown` is cancelled;
/// then releases the lease (so a standby takes over at once) and returns.
pub async fn run(config: GeneratorConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    let holder = config
        .generator_id
        .clone()
        .unwrap_or_else(|| leasehold::identity::instance_id("task-generator"));
    let metrics = Metrics::new().context("registering metrics")?;
    let server = match config.metrics_addr {
        Some(address) => Some(MetricsServer::start(address, metrics.registry.clone())?),
        None => None,
    };
    tracing::info!(%holder, resource = %config.lease_resource, "task-generator started");

    let producer = Producer {
        tasks: TaskClient::new([config.task_service_url.as_str()])
            .with_timeout(Duration::from_secs(5))
            .with_bearer_token(
                config
                    .auth_token
                    .as_ref()
                    .map(leasehold::api::Secret::expose),
            ),
        holder: holder.clone(),
        config: config.clone(),
        metrics: metrics.clone(),
    };
    let observed = metrics.clone();
    let singleton = Singleton::new(
        LeaseClient::new(config.lease_service_url.trim_end_matches('/')).with_bearer_token(
            config
                .auth_token
                .as_ref()
                .map(leasehold::api::Secret::expose),
        ),
        GuardConfig::new(&config.lease_resource, &holder)
            .ttl(Duration::from_secs(config.lease_ttl_seconds)),
        Duration::from_secs_f64(config.retry_interval_seconds),
    )
    .on_event(move |event| match event {
        SingletonEvent::Acquired { .. } => {
            observed.acquisitions.inc();
            observed.leading.set(1);
        }
        SingletonEvent::Lost { .. } => {
            observed.losses.inc();
            observed.leading.set(0);
        }
        SingletonEvent::Released { .. } => observed.leading.set(0),
    });
    let result = singleton
        .run(shutdown, |lease| producer.produce(lease))
        .await
        .context("contending for the generator lease");
    if let Some(server) = server {
        server.stop().await;
    }
    tracing::info!("task-generator stopped");
    result
}
