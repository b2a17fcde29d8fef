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

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use leasehold::generator::{
    GeneratorSettings, MAX_RATE_PER_SECOND, MAX_SLEEP_SECONDS, MIN_RATE_PER_SECOND,
};
use leasehold::metrics_server::MetricsServer;
use leasehold::tasks::CreateTask;
use leasehold::{GuardConfig, LeaseClient, LeaseHandle, Singleton, SingletonEvent};
use prometheus::{IntCounter, IntGauge, Registry};
use rand::Rng;
use reqwest::StatusCode;
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
        // Bounded, so that no duration made from it can overflow.
        if !(0.01..=3600.0).contains(&self.retry_interval_seconds) {
            return Err(
                "GENERATOR_RETRY_INTERVAL_SECONDS must be between 0.01 and 3600".to_owned(),
            );
        }
        if !(1..=3_600_000).contains(&self.settings_poll_ms) {
            return Err("GENERATOR_SETTINGS_POLL_MS must be between 1 and 3600000".to_owned());
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
        .unwrap_or_else(|| leasehold::identity::instance_id("task-generator"));
    let metrics = Metrics::new().context("registering metrics")?;
    let server = match config.metrics_addr {
        Some(address) => Some(MetricsServer::start(address, metrics.registry.clone())?),
        None => None,
    };
    tracing::info!(%holder, resource = %config.lease_resource, "task-generator started");

    let producer = Producer {
        http: reqwest::Client::builder()
            .default_headers(leasehold::api::Secret::bearer_headers(
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
            let pace = Pace::of(current);
            tokio::time::sleep_until(next).await;
            match self
                .create(&lease, fence, term, sequence, pace.sleep())
                .await
            {
                Created::Done => sequence += 1,
                // Read the settings again at once: production resumes when they say started.
                Created::Stopped => {
                    settings = None;
                    continue;
                }
                Created::LeadsNoLonger => return,
            }
            // Keep the rate, but never burst to catch up after a stall.
            let after = next.checked_add(pace.period).unwrap_or(next);
            next = match Instant::now().checked_sub(pace.period) {
                Some(floor) => after.max(floor),
                None => after,
            };
        }
    }

    /// One `POST /api/tasks`, as a trace of its own (generator → task-service → database).
    async fn send(
        &self,
        body: &CreateTask,
        fence: i64,
        sequence: u64,
    ) -> Result<(StatusCode, Option<String>), reqwest::Error> {
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
            let client = leasehold::telemetry::client_span("POST", &url);
            let answer = self
                .http
                .post(&url)
                .headers(client.in_scope(leasehold::telemetry::inject))
                .json(body)
                .send()
                .instrument(client.clone())
                .await;
            let status = match &answer {
                Ok(response) => Ok(response.status().as_u16()),
                Err(err) => Err(err.to_string()),
            };
            leasehold::telemetry::record_response(
                &client,
                status.as_ref().copied().map_err(String::as_str),
            );
            let response = answer?;
            let status = response.status();
            let body = response.json::<serde_json::Value>().await.ok();
            if let Some(id) = body.as_ref().and_then(|task| task["id"].as_i64()) {
                tracing::Span::current().record("task.id", id);
            }
            let code = body.and_then(|error| error["code"].as_str().map(str::to_owned));
            Ok((status, code))
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
    /// idempotency key.
    async fn create(
        &self,
        lease: &LeaseHandle,
        fence: i64,
        term: u32,
        sequence: u64,
        sleep: f64,
    ) -> Created {
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
            generator_fence: Some(fence),
            ..CreateTask::default()
        };
        let mut pause = Duration::from_millis(100);
        loop {
            // Never send once the lease is in doubt, whatever woke us.
            if !lease.is_held() {
                return Created::LeadsNoLonger;
            }
            let answer = self.send(&body, fence, sequence).await;
            match answer {
                Ok((StatusCode::CREATED, _)) => {
                    self.metrics.produced.inc();
                    tracing::debug!(fence, sequence, "task created");
                    return Created::Done;
                }
                // A retry of a request whose first answer was lost: already created.
                Ok((StatusCode::OK, _)) => return Created::Done,
                Ok((StatusCode::CONFLICT, code))
                    if code.as_deref() == Some("generator_stopped") =>
                {
                    tracing::info!(fence, "the generator was stopped; waiting to be started");
                    return Created::Stopped;
                }
                Ok((StatusCode::CONFLICT, _)) => {
                    tracing::warn!(fence, "task-service says this replica no longer leads");
                    return Created::LeadsNoLonger;
                }
                Ok((status, _)) if status.is_client_error() => {
                    self.metrics.create_errors.inc();
                    tracing::error!(%status, "task-service refused a generated task; skipping it");
                    return Created::Done;
                }
                Ok((status, _)) => {
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

/// How one create ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Created {
    /// Created, already created, or skipped for good: on to the next task.
    Done,
    /// task-service refused it because the generator is stopped.
    Stopped,
    /// The lease is in doubt, or task-service says another replica leads: stop producing.
    LeadsNoLonger,
}

/// The pace the settings ask for, kept within [`leasehold::generator`]'s bounds whatever was read,
/// so that no value can make a duration overflow or a random range empty.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Pace {
    period: Duration,
    min_sleep: f64,
    max_sleep: f64,
}

impl Pace {
    fn of(settings: &GeneratorSettings) -> Self {
        Self::new(
            settings.rate_per_second,
            settings.min_sleep_seconds,
            settings.max_sleep_seconds,
        )
    }

    fn new(rate: f64, min_sleep: f64, max_sleep: f64) -> Self {
        let rate = if rate.is_nan() {
            MIN_RATE_PER_SECOND
        } else {
            rate.clamp(MIN_RATE_PER_SECOND, MAX_RATE_PER_SECOND)
        };
        let seconds = |value: f64| {
            if value.is_nan() {
                0.0
            } else {
                value.clamp(0.0, MAX_SLEEP_SECONDS)
            }
        };
        let (min, max) = (seconds(min_sleep), seconds(max_sleep));
        Self {
            period: Duration::try_from_secs_f64(1.0 / rate).unwrap_or(Duration::from_secs(1000)),
            min_sleep: min.min(max),
            max_sleep: max.max(min),
        }
    }

    /// A task's `sleep_duration_seconds`, to the millisecond.
    fn sleep(&self) -> f64 {
        let sleep = if self.max_sleep > self.min_sleep {
            rand::rng().random_range(self.min_sleep..=self.max_sleep)
        } else {
            self.min_sleep
        };
        (sleep * 1000.0).round() / 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_setting_makes_the_pace_panic_or_leave_its_bounds() {
        let odd = [
            0.0,
            -0.0,
            1e-300,
            -1.0,
            f64::MIN_POSITIVE,
            5e-324,
            1e300,
            f64::MAX,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            0.5,
        ];
        for rate in odd {
            for min in odd {
                for max in odd {
                    let pace = Pace::new(rate, min, max);
                    assert!(pace.period >= Duration::from_millis(1), "{rate}");
                    assert!(pace.period <= Duration::from_secs(1000), "{rate}");
                    let sleep = pace.sleep();
                    assert!((0.0..=MAX_SLEEP_SECONDS).contains(&sleep), "{min} {max}");
                }
            }
        }
        assert_eq!(
            Pace::new(1e-300, 1.0, 2.0).period,
            Duration::from_secs(1000)
        );
        assert_eq!(Pace::new(4.0, 1.0, 2.0).period, Duration::from_millis(250));
    }
}
