//! Prometheus metrics of one lease-service process, served at `GET /metrics`.

use leasehold::server::http::HttpMetrics;
use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};

/// Every metric lease-service exports. One registry per app (not the global one), so that
/// several apps in one test process do not collide.
#[derive(Debug, Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub http: HttpMetrics,
    pub acquisitions: IntCounterVec,
    pub renewals: IntCounter,
    pub releases: IntCounter,
    pub conflicts: IntCounterVec,
    pub swept: IntCounter,
    pub sweeps: IntCounterVec,
    /// Acquires on this replica waiting for a held lease (`wait_ms`) now.
    pub acquires_waiting: IntGauge,
    /// Acquires that asked to wait but found `LEASE_MAX_WAITERS` waiting, and answered at once.
    pub waits_refused: IntCounter,
    pub group_sizes: HistogramVec,
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let http = HttpMetrics::register(&registry)?;
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
        let group_sizes = HistogramVec::new(
            HistogramOpts::new(
                "lease_group_size",
                "Single acquires, renewals and releases served by one statement, by operation.",
            )
            .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 100.0]),
            &["operation"],
        )?;
        registry.register(Box::new(group_sizes.clone()))?;
        registry.register(Box::new(acquisitions.clone()))?;
        registry.register(Box::new(renewals.clone()))?;
        registry.register(Box::new(releases.clone()))?;
        registry.register(Box::new(conflicts.clone()))?;
        registry.register(Box::new(swept.clone()))?;
        registry.register(Box::new(sweeps.clone()))?;
        let acquires_waiting = IntGauge::new(
            "lease_acquires_waiting",
            "Acquires on this replica waiting for a held lease to be released or expire (wait_ms).",
        )?;
        registry.register(Box::new(acquires_waiting.clone()))?;
        let waits_refused = IntCounter::new(
            "lease_acquire_waits_refused_total",
            "Acquires that asked to wait (wait_ms) while LEASE_MAX_WAITERS waited on this replica, and answered at once.",
        )?;
        registry.register(Box::new(waits_refused.clone()))?;
        Ok(Self {
            acquires_waiting,
            waits_refused,
            registry,
            http,
            acquisitions,
            renewals,
            releases,
            conflicts,
            swept,
            sweeps,
            group_sizes,
        })
    }
}
