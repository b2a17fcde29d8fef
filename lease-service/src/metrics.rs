//! Prometheus metrics of one lease-service process, served at `GET /metrics`.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry, TextEncoder,
};

/// Every metric lease-service exports. One registry per app (not the global one), so that
/// several apps in one test process do not collide.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    pub http_requests: IntCounterVec,
    pub http_duration: HistogramVec,
    pub acquisitions: IntCounterVec,
    pub renewals: IntCounter,
    pub releases: IntCounter,
    pub conflicts: IntCounterVec,
    pub swept: IntCounter,
    pub sweeps: IntCounterVec,
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let http_requests = IntCounterVec::new(
            Opts::new(
                "http_requests_total",
                "HTTP requests answered, by route and status.",
            ),
            &["method", "route", "status"],
        )?;
        let http_duration = HistogramVec::new(
            HistogramOpts::new(
                "http_request_duration_seconds",
                "Time to answer an HTTP request, by route.",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
            &["method", "route"],
        )?;
        let acquisitions = IntCounterVec::new(
            Opts::new(
                "lease_acquisitions_total",
                "Leases granted: new acquisitions and reentrant ones by the current holder.",
            ),
            &["kind"],
        )?;
        let renewals = IntCounter::new("lease_renewals_total", "Leases renewed.")?;
        let releases = IntCounter::new("lease_releases_total", "Leases released.")?;
        let conflicts = IntCounterVec::new(
            Opts::new(
                "lease_conflicts_total",
                "Acquires, renewals and releases refused, by operation and reason.",
            ),
            &["operation", "code"],
        )?;
        let swept = IntCounter::new(
            "lease_retention_deleted_total",
            "Ended leases deleted by the retention sweeper.",
        )?;
        let sweeps = IntCounterVec::new(
            Opts::new(
                "lease_retention_runs_total",
                "Retention sweeper rounds, by outcome (swept, standby, failed).",
            ),
            &["outcome"],
        )?;
        registry.register(Box::new(http_requests.clone()))?;
        registry.register(Box::new(http_duration.clone()))?;
        registry.register(Box::new(acquisitions.clone()))?;
        registry.register(Box::new(renewals.clone()))?;
        registry.register(Box::new(releases.clone()))?;
        registry.register(Box::new(conflicts.clone()))?;
        registry.register(Box::new(swept.clone()))?;
        registry.register(Box::new(sweeps.clone()))?;
        Ok(Self {
            registry,
            http_requests,
            http_duration,
            acquisitions,
            renewals,
            releases,
            conflicts,
            swept,
            sweeps,
        })
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        let mut buffer = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buffer)?;
        String::from_utf8(buffer).map_err(|err| prometheus::Error::Msg(err.to_string()))
    }
}
