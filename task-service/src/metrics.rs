//! Prometheus metrics of one task-service process, served at `GET /metrics`. Counters count what
//! this replica did; the `tasks` and `oldest_due_task_age_seconds` gauges are read from the
//! database at scrape time, so every replica reports the same totals.

use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
};
use shared::server::http::HttpMetrics;

use crate::repo::{OldestDue, QueueCount};

#[derive(Debug, Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub http: HttpMetrics,
    pub created: IntCounterVec,
    pub claimed: IntCounterVec,
    pub completed: IntCounterVec,
    pub failed: IntCounterVec,
    pub dead: IntCounterVec,
    pub cancelled: IntCounterVec,
    pub retried: IntCounterVec,
    pub lease_lost: IntCounterVec,
    pub claim_to_complete: HistogramVec,
    pub tasks: IntGaugeVec,
    pub oldest_due: GaugeVec,
    pub swept: IntCounter,
    pub sweeps: IntCounterVec,
}

fn counter(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntCounterVec> {
    let metric = IntCounterVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

impl Metrics {
    pub fn new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        let http = HttpMetrics::register(&registry)?;
        let created = counter(
            &registry,
            "tasks_created_total",
            "Tasks created, by queue.",
            &["queue"],
        )?;
        let claimed = counter(
            &registry,
            "tasks_claimed_total",
            "Claims granted (each is an attempt), by queue.",
            &["queue"],
        )?;
        let completed = counter(
            &registry,
            "tasks_completed_total",
            "Completions accepted, by queue.",
            &["queue"],
        )?;
        let failed = counter(
            &registry,
            "tasks_failed_total",
            "Failures reported by workers, by queue and what followed (retry, dead, requeued).",
            &["queue", "outcome"],
        )?;
        let dead = counter(
            &registry,
            "tasks_dead_total",
            "Tasks that became dead, by queue and reason (failed, attempts_exhausted).",
            &["queue", "reason"],
        )?;
        let cancelled = counter(
            &registry,
            "tasks_cancelled_total",
            "Tasks cancelled, by queue.",
            &["queue"],
        )?;
        let retried = counter(
            &registry,
            "tasks_retried_total",
            "Dead tasks put back in their queue by an operator, by queue.",
            &["queue"],
        )?;
        let lease_lost = counter(
            &registry,
            "task_lease_losses_total",
            "Heartbeats, completions and failures refused because the worker's lease was lost or superseded.",
            &["operation"],
        )?;
        let claim_to_complete = HistogramVec::new(
            HistogramOpts::new(
                "task_claim_to_complete_seconds",
                "Time from a task's claim to its accepted completion, by queue.",
            )
            .buckets(vec![
                0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
            ]),
            &["queue"],
        )?;
        registry.register(Box::new(claim_to_complete.clone()))?;
        let tasks = IntGaugeVec::new(
            Opts::new("tasks", "Tasks in the database, by queue and status."),
            &["queue", "status"],
        )?;
        registry.register(Box::new(tasks.clone()))?;
        let oldest_due = GaugeVec::new(
            Opts::new(
                "oldest_due_task_age_seconds",
                "How long the oldest due pending task has waited, by queue.",
            ),
            &["queue"],
        )?;
        registry.register(Box::new(oldest_due.clone()))?;
        let swept = IntCounter::new(
            "task_retention_deleted_total",
            "Finished tasks deleted by the retention sweeper.",
        )?;
        registry.register(Box::new(swept.clone()))?;
        let sweeps = counter(
            &registry,
            "task_retention_runs_total",
            "Retention sweeper rounds, by outcome (swept, standby, failed).",
            &["outcome"],
        )?;
        Ok(Self {
            registry,
            http,
            created,
            claimed,
            completed,
            failed,
            dead,
            cancelled,
            retried,
            lease_lost,
            claim_to_complete,
            tasks,
            oldest_due,
            swept,
            sweeps,
        })
    }

    /// Replaces the database-derived gauges with a fresh reading.
    pub fn observe_database(&self, counts: &[QueueCount], oldest: &[OldestDue]) {
        self.tasks.reset();
        for row in counts {
            self.tasks
                .with_label_values(&[row.queue.as_str(), row.status.as_str()])
                .set(row.count);
        }
        self.oldest_due.reset();
        for row in oldest {
            self.oldest_due
                .with_label_values(&[row.queue.as_str()])
                .set(row.age_seconds);
        }
    }
}
