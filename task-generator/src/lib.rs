//! task-generator: fake work for the workers, produced by exactly one replica at a time.
//!
//! Every replica runs a [`shared::Singleton`] on the lease `task-generator`. The holder reads
//! the desired state (started or stopped, rate, sleep range) from task-service, which any
//! task-service replica changes, and creates `{"sleep_duration_seconds": N}` tasks at the rate.
//! Each task's idempotency key is `task-generator:<fence>:<term>:<sequence>`, so a retried
//! request never creates a second task, and task-service refuses a key whose fence no longer
//! holds the lease.
//! The holder checks that its lease is certainly held right before every request and stops the
//! moment the guard signals loss. A stopped generator keeps its lease: the leader stays ready
//! and starts producing the moment the desired state says so, and status can name it.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use prometheus::{IntCounter, IntGauge, Registry};
use rand::Rng;
use reqwest::StatusCode;
use shared::generator::GeneratorSettings;
use shared::metrics_server::MetricsServer;
use shared::tasks::CreateTask;
use shared::{GuardConfig, LeaseClient, LeaseHandle, Singleton, SingletonEvent};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Configuration: flags, each also read from an environment variable.
#[derive(Debug, Clone, Args)]
pub struct GeneratorConfig {
    /// Base URL of task-service.
    #[arg(long, env = "TASK_SERVICE_URL")]
    pub task_service_url: String,

    /// Base URL of lease-service.
    #[arg(long, env = "LEASE_SERVICE_URL")]
    pub lease_service_url: String,

    /// Bearer token sent to both services: it needs the `leaseholder` role in lease-service's
    /// `AUTH_TOKENS` and the `producer` role in task-service's, when they are set. Unset: none
    /// is sent.
    #[arg(long, env = "AUTH_TOKEN", hide_env_values = true)]
    pub auth_token: Option<shared::api::Secret>,

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
    #[arg(long, env = "GENERATOR_LEASE_TTL_SECONDS", default_value_t = 30)]
    pub lease_ttl_seconds: u64,

    /// How often a standby tries to take the lease (jittered ±20 %).
    #[arg(long, env = "GENERATOR_RETRY_INTERVAL_SECONDS", default_value_t = 5.0)]
    pub retry_interval_seconds: f64,

    /// How often the leader re-reads the desired state from task-service.
    #[arg(long, env = "GENERATOR_SETTINGS_POLL_MS", default_value_t = 1000)]
    pub settings_poll_ms: u64,

    /// Queue of the tasks it creates.
    #[arg(long, env = "GENERATOR_QUEUE", default_value = "default")]
    pub queue: String,

    /// Serve `GET /healthz` and `GET /metrics` on this address.
    #[arg(long, env = "METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,
}

impl GeneratorConfig {
    pub fn validate(&self) -> Result<(), String> {
        for (name, url) in [
            ("TASK_SERVICE_URL", &self.task_service_url),
            ("LEASE_SERVICE_URL", &self.lease_service_url),
        ] {
            if !url.starts_with("http://") {
                return Err(format!("{name} must be an http:// URL, got {url:?}"));
            }
        }
        if !(1..=3600).contains(&self.lease_ttl_seconds) {
            return Err("GENERATOR_LEASE_TTL_SECONDS must be between 1 and 3600".to_owned());
        }
        if !(self.retry_interval_seconds.is_finite() && self.retry_interval_seconds > 0.0) {
            return Err("GENERATOR_RETRY_INTERVAL_SECONDS must be a positive number".to_owned());
        }
        if self.settings_poll_ms == 0 {
            return Err("GENERATOR_SETTINGS_POLL_MS must be at least 1".to_owned());
        }
        Ok(())
    }
}

/// The generator's metrics.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    pub produced: IntCounter,
    pub acquisitions: IntCounter,
    pub losses: IntCounter,
    pub leading: IntGauge,
    pub create_errors: IntCounter,
}

impl Metrics {
    pub fn new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        let produced = IntCounter::new(
            "generator_tasks_produced_total",
            "Tasks this replica created.",
        )?;
        let acquisitions = IntCounter::new(
            "generator_lease_acquisitions_total",
            "Times this replica took the generator lease.",
        )?;
        let losses = IntCounter::new(
            "generator_lease_losses_total",
            "Times this replica lost the generator lease while leading.",
        )?;
        let leading = IntGauge::new(
            "generator_leader",
            "1 while this replica holds the generator lease.",
        )?;
        let create_errors = IntCounter::new(
            "generator_create_errors_total",
            "Task creations that failed (and were retried or given up).",
        )?;
        for metric in [&produced, &acquisitions, &losses, &create_errors] {
            registry.register(Box::new(metric.clone()))?;
        }
        registry.register(Box::new(leading.clone()))?;
        Ok(Self {
            registry,
            produced,
            acquisitions,
            losses,
            leading,
            create_errors,
        })
    }
}

/// Contends for the lease and, while leading, produces tasks, until `shutdown` is cancelled;
/// then releases the lease (so a standby takes over at once) and returns.
pub async fn run(config: GeneratorConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    config.validate().map_err(anyhow::Error::msg)?;
    let holder = config
        .generator_id
        .clone()
        .unwrap_or_else(|| shared::identity::instance_id("task-generator"));
    let metrics = Metrics::new().context("registering metrics")?;
    let server = match config.metrics_addr {
        Some(address) => Some(MetricsServer::start(address, metrics.registry.clone())?),
        None => None,
    };
    tracing::info!(%holder, resource = %config.lease_resource, "task-generator started");

    let producer = Producer {
        http: reqwest::Client::builder()
            .default_headers(shared::api::Secret::bearer_headers(
                config.auth_token.as_ref(),
            ))
            .timeout(Duration::from_secs(5))
            .build()
            .context("building the HTTP client")?,
        tasks_url: config.task_service_url.trim_end_matches('/').to_owned(),
        holder: holder.clone(),
        config: config.clone(),
        metrics: metrics.clone(),
    };
    let observed = metrics.clone();
    let singleton = Singleton::new(
        LeaseClient::new(config.lease_service_url.trim_end_matches('/'))
            .with_bearer_token(config.auth_token.as_ref().map(shared::api::Secret::expose)),
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

#[derive(Debug)]
struct Producer {
    http: reqwest::Client,
    tasks_url: String,
    holder: String,
    config: GeneratorConfig,
    metrics: Metrics,
}

impl Producer {
    /// The leader's loop: returns only if the lease is in doubt (the singleton then notices the
    /// loss); it is dropped outright when the guard signals loss.
    async fn produce(&self, lease: LeaseHandle) {
        let fence = lease.fence();
        // A holder that lost its lease in doubt may win it back reentrantly, under the same
        // fence: the term's random nonce keeps its keys apart from the previous term's.
        let term: u32 = rand::random();
        let poll = Duration::from_millis(self.config.settings_poll_ms);
        let mut settings: Option<GeneratorSettings> = None;
        let mut polled = Instant::now();
        let mut next = Instant::now();
        let mut sequence: u64 = 0;
        tracing::info!(
            fence,
            "leading: producing tasks while the generator is started"
        );
        loop {
            if settings.is_none() || polled.elapsed() >= poll {
                match self.settings().await {
                    Ok(fresh) => settings = Some(fresh),
                    Err(err) => {
                        tracing::warn!(error = %err, "cannot read the generator's settings")
                    }
                }
                polled = Instant::now();
            }
            let Some(current) = settings.as_ref().filter(|s| s.running) else {
                tokio::time::sleep(poll).await;
                next = Instant::now();
                continue;
            };
            tokio::time::sleep_until(next).await;
            let sleep = if current.max_sleep_seconds > current.min_sleep_seconds {
                rand::rng().random_range(current.min_sleep_seconds..=current.max_sleep_seconds)
            } else {
                current.min_sleep_seconds
            };
            let sleep = (sleep * 1000.0).round() / 1000.0;
            if !self.create(&lease, fence, term, sequence, sleep).await {
                return;
            }
            sequence += 1;
            let period = Duration::from_secs_f64(1.0 / current.rate_per_second);
            // Keep the rate, but never burst to catch up after a stall.
            next = (next + period).max(Instant::now() - period);
        }
    }

    /// One `POST /api/tasks`, as a trace of its own (generator → task-service → database).
    async fn send(
        &self,
        body: &CreateTask,
        fence: i64,
        sequence: u64,
    ) -> Result<StatusCode, reqwest::Error> {
        use tracing::Instrument;
        let root = tracing::info_span!(
            parent: None,
            "generate task",
            generator.holder = %self.holder,
            generator.fence = fence,
            generator.sequence = sequence,
            task.id = tracing::field::Empty,
        );
        let url = format!("{}/api/tasks", self.tasks_url);
        async {
            let client = shared::telemetry::client_span("POST", &url);
            let answer = self
                .http
                .post(&url)
                .headers(client.in_scope(shared::telemetry::inject))
                .json(body)
                .send()
                .instrument(client.clone())
                .await;
            let status = match &answer {
                Ok(response) => Ok(response.status().as_u16()),
                Err(err) => Err(err.to_string()),
            };
            shared::telemetry::record_response(
                &client,
                status.as_ref().copied().map_err(String::as_str),
            );
            let response = answer?;
            let status = response.status();
            if let Ok(task) = response.json::<serde_json::Value>().await
                && let Some(id) = task["id"].as_i64()
            {
                tracing::Span::current().record("task.id", id);
            }
            Ok(status)
        }
        .instrument(root)
        .await
    }

    async fn settings(&self) -> anyhow::Result<GeneratorSettings> {
        let answer = self
            .http
            .get(format!("{}/api/generator/settings", self.tasks_url))
            .send()
            .await?
            .error_for_status()?;
        Ok(answer.json().await?)
    }

    /// Creates task `sequence` of this term, retrying transient failures with the same
    /// idempotency key. False when the lease is in doubt or task-service says another replica
    /// leads: stop producing.
    async fn create(
        &self,
        lease: &LeaseHandle,
        fence: i64,
        term: u32,
        sequence: u64,
        sleep: f64,
    ) -> bool {
        let body = CreateTask {
            task_data: serde_json::json!({
                "sleep_duration_seconds": sleep,
                "generator": {
                    "holder": self.holder,
                    "fence": fence,
                    "term": format!("{term:08x}"),
                    "sequence": sequence,
                },
            }),
            queue: Some(self.config.queue.clone()),
            idempotency_key: Some(format!(
                "{}:{fence}:{term:08x}:{sequence}",
                self.config.lease_resource
            )),
            ..CreateTask::default()
        };
        let mut pause = Duration::from_millis(100);
        loop {
            // Never send once the lease is in doubt, whatever woke us.
            if !lease.is_held() {
                return false;
            }
            let answer = self.send(&body, fence, sequence).await;
            match answer {
                Ok(StatusCode::CREATED) => {
                    self.metrics.produced.inc();
                    tracing::debug!(fence, sequence, "task created");
                    return true;
                }
                // A retry of a request whose first answer was lost: already created.
                Ok(StatusCode::OK) => return true,
                Ok(StatusCode::CONFLICT) => {
                    tracing::warn!(fence, "task-service says this replica no longer leads");
                    return false;
                }
                Ok(status) if status.is_client_error() => {
                    self.metrics.create_errors.inc();
                    tracing::error!(%status, "task-service refused a generated task; skipping it");
                    return true;
                }
                Ok(status) => {
                    self.metrics.create_errors.inc();
                    tracing::warn!(%status, "creating a task failed; retrying");
                }
                Err(err) => {
                    self.metrics.create_errors.inc();
                    tracing::warn!(error = %err, "creating a task failed; retrying");
                }
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }
}
