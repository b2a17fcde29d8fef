//! The generator's Prometheus metrics.

use prometheus::{IntCounter, IntGauge, Registry};

/// The generator's metrics.
#[derive(Debug, Clone)]
pub struct Metrics {
    pub(crate) registry: Registry,
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
