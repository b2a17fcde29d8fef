//! Prometheus metrics of one worker process, served (with `GET /healthz`) by
//! [`MetricsServer`] when `METRICS_ADDR` is set.

pub use leasehold::metrics_server::MetricsServer;
use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

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
    /// `worker_tasks_snoozed_total`: tasks the handler put off, as task-service accepted.
    pub snoozed: IntCounter,
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
        let snoozed = IntCounter::new(
            "worker_tasks_snoozed_total",
            "Tasks the handler put off (snoozed), as task-service accepted.",
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
        registry.register(Box::new(snoozed.clone()))?;
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
            snoozed,
            in_flight,
            claim_to_complete,
            heartbeats,
            claim_requests,
        })
    }

    /// The registry holding every metric, for [`MetricsServer`].
    pub fn registry(&self) -> Registry {
        self.registry.clone()
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
        let server =
            MetricsServer::start("127.0.0.1:0".parse().unwrap(), metrics.registry()).unwrap();
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
