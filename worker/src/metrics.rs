//! Prometheus metrics of one worker process, and the optional HTTP server that exposes them
//! (`GET /metrics`) next to a liveness probe (`GET /healthz`).

use std::net::{SocketAddr, TcpListener};

use actix_web::{App, HttpResponse, HttpServer, web};
use anyhow::Context;
use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

/// Every metric the worker exports. One registry per worker (not the global one), so that
/// several workers in one test process do not collide.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    /// `worker_tasks_claimed_total`
    pub claimed: IntCounter,
    /// `worker_tasks_completed_total`: completions task-service accepted.
    pub completed: IntCounter,
    /// `worker_tasks_failed_total`: handler failures task-service accepted.
    pub failed: IntCounter,
    /// `worker_tasks_lost_total`: tasks dropped without an accepted answer (lease lost or
    /// unconfirmed, task cancelled or finished elsewhere, answer refused or never delivered).
    pub lost: IntCounter,
    /// `worker_tasks_requeued_total`: tasks handed back at shutdown.
    pub requeued: IntCounter,
    /// `worker_tasks_in_flight`
    pub in_flight: IntGauge,
    /// `worker_task_claim_to_complete_seconds`
    pub claim_to_complete: Histogram,
    /// `worker_heartbeats_total{outcome="ok"|"refused"|"error"}`
    pub heartbeats: IntCounterVec,
    /// `worker_claim_requests_total{outcome="claimed"|"empty"|"error"}`
    pub claim_requests: IntCounterVec,
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let claimed = IntCounter::new("worker_tasks_claimed_total", "Tasks claimed.")?;
        let completed = IntCounter::new(
            "worker_tasks_completed_total",
            "Tasks whose completion task-service accepted.",
        )?;
        let failed = IntCounter::new(
            "worker_tasks_failed_total",
            "Tasks whose handler failed, reported to task-service.",
        )?;
        let lost = IntCounter::new(
            "worker_tasks_lost_total",
            "Tasks dropped without an accepted answer: lease lost or unconfirmed, task cancelled \
             or finished elsewhere, or the answer refused or never delivered.",
        )?;
        let requeued = IntCounter::new(
            "worker_tasks_requeued_total",
            "Unfinished tasks handed back to task-service at shutdown.",
        )?;
        let in_flight = IntGauge::new("worker_tasks_in_flight", "Tasks being worked on now.")?;
        let claim_to_complete = Histogram::with_opts(
            HistogramOpts::new(
                "worker_task_claim_to_complete_seconds",
                "Time from sending the claim to task-service accepting the completion.",
            )
            .buckets(vec![
                0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
                1800.0, 3600.0,
            ]),
        )?;
        let heartbeats = IntCounterVec::new(
            Opts::new(
                "worker_heartbeats_total",
                "Heartbeats sent, by outcome (ok, refused, error).",
            ),
            &["outcome"],
        )?;
        let claim_requests = IntCounterVec::new(
            Opts::new(
                "worker_claim_requests_total",
                "Claim requests, by outcome (claimed, empty, error).",
            ),
            &["outcome"],
        )?;
        registry.register(Box::new(claimed.clone()))?;
        registry.register(Box::new(completed.clone()))?;
        registry.register(Box::new(failed.clone()))?;
        registry.register(Box::new(lost.clone()))?;
        registry.register(Box::new(requeued.clone()))?;
        registry.register(Box::new(in_flight.clone()))?;
        registry.register(Box::new(claim_to_complete.clone()))?;
        registry.register(Box::new(heartbeats.clone()))?;
        registry.register(Box::new(claim_requests.clone()))?;
        for outcome in ["ok", "refused", "error"] {
            heartbeats.with_label_values(&[outcome]);
        }
        for outcome in ["claimed", "empty", "error"] {
            claim_requests.with_label_values(&[outcome]);
        }
        Ok(Self {
            registry,
            claimed,
            completed,
            failed,
            lost,
            requeued,
            in_flight,
            claim_to_complete,
            heartbeats,
            claim_requests,
        })
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        let mut buffer = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buffer)?;
        String::from_utf8(buffer).map_err(|err| prometheus::Error::Msg(err.to_string()))
    }
}

/// The `/healthz` + `/metrics` server.
pub struct MetricsServer {
    address: SocketAddr,
    handle: actix_web::dev::ServerHandle,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl std::fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsServer")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl MetricsServer {
    /// Listens on `address` (port 0 picks a free port; see [`MetricsServer::address`]).
    pub fn start(address: SocketAddr, metrics: Metrics) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(address)
            .with_context(|| format!("binding METRICS_ADDR {address}"))?;
        let address = listener
            .local_addr()
            .context("reading the metrics address")?;
        let metrics = web::Data::new(metrics);
        let server = HttpServer::new(move || {
            App::new()
                .app_data(metrics.clone())
                .route("/healthz", web::get().to(healthz))
                .route("/metrics", web::get().to(render))
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(1)
        .listen(listener)
        .context("serving metrics")?
        .run();
        let handle = server.handle();
        let task = tokio::spawn(server);
        tracing::info!(%address, "metrics listening (GET /metrics, GET /healthz)");
        Ok(Self {
            address,
            handle,
            task,
        })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    pub async fn stop(self) {
        self.handle.stop(true).await;
        if let Ok(Err(err)) = self.task.await {
            tracing::warn!(error = %err, "metrics server failed");
        }
    }
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({ "status": "ok" }))
}

async fn render(metrics: web::Data<Metrics>) -> HttpResponse {
    match metrics.render() {
        Ok(text) => HttpResponse::Ok()
            .content_type("text/plain; version=0.0.4; charset=utf-8")
            .body(text),
        Err(err) => HttpResponse::InternalServerError().json(shared::ErrorBody::new(
            "internal",
            format!("cannot render metrics: {err}"),
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn serves_metrics_and_health() {
        let metrics = Metrics::new().unwrap();
        metrics.claimed.inc();
        metrics.claim_to_complete.observe(0.3);
        let server = MetricsServer::start("127.0.0.1:0".parse().unwrap(), metrics).unwrap();
        let base = format!("http://{}", server.address());
        let health = reqwest::get(format!("{base}/healthz")).await.unwrap();
        assert_eq!(health.status(), 200);
        let text = reqwest::get(format!("{base}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        for name in [
            "worker_tasks_claimed_total 1",
            "worker_tasks_completed_total 0",
            "worker_tasks_failed_total 0",
            "worker_tasks_lost_total 0",
            "worker_tasks_requeued_total 0",
            "worker_tasks_in_flight 0",
            "worker_task_claim_to_complete_seconds_count 1",
            "worker_heartbeats_total{outcome=\"ok\"} 0",
            "worker_claim_requests_total{outcome=\"empty\"} 0",
        ] {
            assert!(text.contains(name), "{name} missing from\n{text}");
        }
        let missing = reqwest::get(format!("{base}/nope")).await.unwrap();
        assert_eq!(missing.status(), 404);
        server.stop().await;
    }
}
