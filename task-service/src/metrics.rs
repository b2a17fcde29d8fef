//! Prometheus metrics of one task-service process, served at `GET /metrics`. Counters count what
//! this replica did; the `tasks`, `oldest_due_task_age_seconds` and `queue_paused` gauges are
//! read from the database at scrape time, so every replica reports the same totals.
//!
//! Queue names are chosen by producers, so the `queue` label is capped ([`QueueLabels`]): the
//! first `METRICS_MAX_QUEUES` queues a replica meets get their own value, every other queue is
//! counted under [`OTHER_QUEUES`]. Schedule names (`schedule_ticks_total`) are capped the same
//! way.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use leasehold::server::http::HttpMetrics;
use prometheus::core::{MetricVec, MetricVecBuilder};
use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

use crate::repo::{OldestDue, QueueCount, QueueRow};

/// `METRICS_MAX_QUEUES` unless configured.
pub const DEFAULT_MAX_QUEUES: usize = 100;

/// The `queue` label value of every queue past the cap.
pub const OTHER_QUEUES: &str = "_other";

/// The queue label values handed out so far: each queue keeps the value it first got, so a
/// series never changes name while the process lives.
#[derive(Debug)]
pub struct QueueLabels {
    max: usize,
    named: Mutex<HashSet<String>>,
}

impl QueueLabels {
    pub fn new(max: usize) -> QueueLabels {
        QueueLabels {
            max,
            named: Mutex::new(HashSet::new()),
        }
    }

    /// `queue` itself while fewer than the cap have been named, else [`OTHER_QUEUES`].
    pub fn label<'a>(&self, queue: &'a str) -> &'a str {
        let Ok(mut named) = self.named.lock() else {
            return OTHER_QUEUES;
        };
        if named.contains(queue) {
            return queue;
        }
        if named.len() < self.max {
            named.insert(queue.to_owned());
            return queue;
        }
        OTHER_QUEUES
    }
}

/// A metric family whose first label is a queue: [`ByQueue::with_label_values`] puts the
/// queue through [`QueueLabels`].
#[derive(Clone)]
pub struct ByQueue<V> {
    vec: V,
    queues: Arc<QueueLabels>,
}

impl<V> std::fmt::Debug for ByQueue<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ByQueue").finish_non_exhaustive()
    }
}

impl<T: MetricVecBuilder> ByQueue<MetricVec<T>> {
    /// The series for `values`, the first of which is the queue.
    pub fn with_label_values(&self, values: &[&str]) -> T::M {
        let mut values = values.to_vec();
        if let Some(queue) = values.first_mut() {
            *queue = self.queues.label(queue);
        }
        self.vec.with_label_values(&values)
    }
}

#[derive(Debug, Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub http: HttpMetrics,
    pub created: ByQueue<IntCounterVec>,
    pub claimed: ByQueue<IntCounterVec>,
    pub completed: ByQueue<IntCounterVec>,
    pub failed: ByQueue<IntCounterVec>,
    pub dead: ByQueue<IntCounterVec>,
    pub cancelled: ByQueue<IntCounterVec>,
    pub retried: ByQueue<IntCounterVec>,
    pub lease_lost: IntCounterVec,
    pub claim_to_complete: ByQueue<HistogramVec>,
    pub tasks: IntGaugeVec,
    pub oldest_due: GaugeVec,
    /// 1 for each paused queue, 0 for one resumed (queues never paused are not listed).
    pub queue_paused: IntGaugeVec,
    pub swept: IntCounter,
    pub sweeps: IntCounterVec,
    /// Claims waiting for work on this replica now.
    pub claims_waiting: IntGauge,
    /// Schedule ticks this replica's ticker made or missed, by schedule (capped as queues are)
    /// and outcome.
    pub schedule_ticks: ByQueue<IntCounterVec>,
    /// Claims that took fewer tasks than they asked for because a queue's limit bound.
    pub limit_waits: ByQueue<IntCounterVec>,
    queues: Arc<QueueLabels>,
}

fn counter(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntCounterVec> {
    registered(registry, IntCounterVec::new(Opts::new(name, help), labels)?)
}

/// Registers `metric` with `registry` and hands it back.
fn registered<M: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    metric: M,
) -> prometheus::Result<M> {
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

/// The counters of a task's life, by queue: created, claimed, completed, failed, dead,
/// cancelled and retried, in that order.
fn lifecycle_counters(registry: &Registry) -> prometheus::Result<[IntCounterVec; 7]> {
    let queue = &["queue"][..];
    Ok([
        counter(
            registry,
            "tasks_created_total",
            "Tasks created, by queue.",
            queue,
        )?,
        counter(
            registry,
            "tasks_claimed_total",
            "Claims granted (each is an attempt), by queue.",
            queue,
        )?,
        counter(
            registry,
            "tasks_completed_total",
            "Completions accepted, by queue.",
            queue,
        )?,
        counter(
            registry,
            "tasks_failed_total",
            "Failures reported by workers, by queue and what followed (retry, dead, requeued).",
            &["queue", "outcome"],
        )?,
        counter(
            registry,
            "tasks_dead_total",
            "Tasks that became dead, by queue and reason (failed, attempts_exhausted).",
            &["queue", "reason"],
        )?,
        counter(
            registry,
            "tasks_cancelled_total",
            "Tasks cancelled, by queue.",
            queue,
        )?,
        counter(
            registry,
            "tasks_retried_total",
            "Dead tasks put back in their queue by an operator, by queue.",
            queue,
        )?,
    ])
}

/// The gauges read from the database: tasks by queue and status, the oldest due task's age,
/// and which queues are paused.
fn database_gauges(
    registry: &Registry,
) -> prometheus::Result<(IntGaugeVec, GaugeVec, IntGaugeVec)> {
    let tasks = IntGaugeVec::new(
        Opts::new("tasks", "Tasks in the database, by queue and status."),
        &["queue", "status"],
    )?;
    let oldest_due = GaugeVec::new(
        Opts::new(
            "oldest_due_task_age_seconds",
            "How long the oldest due pending task has waited, by queue.",
        ),
        &["queue"],
    )?;
    let queue_paused = IntGaugeVec::new(
        Opts::new(
            "queue_paused",
            "1 while a queue is paused (claims skip its tasks), by queue.",
        ),
        &["queue"],
    )?;
    Ok((
        registered(registry, tasks)?,
        registered(registry, oldest_due)?,
        registered(registry, queue_paused)?,
    ))
}

/// What the background jobs count: rows the retention sweeper deleted, its rounds, and the
/// schedules' ticks.
fn maintenance_metrics(
    registry: &Registry,
) -> prometheus::Result<(IntCounter, IntCounterVec, IntCounterVec)> {
    let swept = IntCounter::new(
        "task_retention_deleted_total",
        "Finished tasks deleted by the retention sweeper.",
    )?;
    let sweeps = counter(
        registry,
        "task_retention_runs_total",
        "Retention sweeper rounds run by the replica holding its lease, by outcome (swept, failed).",
        &["outcome"],
    )?;
    let schedule_ticks = counter(
        registry,
        "schedule_ticks_total",
        "Schedule ticks, by schedule and outcome: created (on time), caught_up (the one task \
         for ticks missed while no replica ran), skipped (missed, no task), duplicate (its \
         task existed already).",
        &["schedule", "outcome"],
    )?;
    Ok((registered(registry, swept)?, sweeps, schedule_ticks))
}

impl Metrics {
    /// Metrics with the default cap on queue labels.
    pub fn new() -> prometheus::Result<Self> {
        Metrics::with_max_queues(DEFAULT_MAX_QUEUES)
    }

    /// Metrics whose `queue` label names at most `max_queues` queues (and [`OTHER_QUEUES`]).
    pub fn with_max_queues(max_queues: usize) -> prometheus::Result<Self> {
        let queues = Arc::new(QueueLabels::new(max_queues));
        let by_queue = |vec| ByQueue {
            vec,
            queues: queues.clone(),
        };
        let registry = Registry::new();
        let http = HttpMetrics::register(&registry)?;
        let [
            created,
            claimed,
            completed,
            failed,
            dead,
            cancelled,
            retried,
        ] = lifecycle_counters(&registry)?;
        let (tasks, oldest_due, queue_paused) = database_gauges(&registry)?;
        let (swept, sweeps, schedule_ticks) = maintenance_metrics(&registry)?;
        let lease_lost = counter(
            &registry,
            "task_lease_losses_total",
            "Heartbeats, completions and failures refused because the worker's lease was lost or superseded.",
            &["operation"],
        )?;
        let claim_to_complete = registered(
            &registry,
            HistogramVec::new(
                HistogramOpts::new(
                    "task_claim_to_complete_seconds",
                    "Time from a task's claim to its accepted completion, by queue.",
                )
                .buckets(vec![
                    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
                ]),
                &["queue"],
            )?,
        )?;
        let claims_waiting = registered(
            &registry,
            IntGauge::new(
                "task_claims_waiting",
                "Claims on this replica waiting for a task to become due (wait_ms).",
            )?,
        )?;
        let limit_waits = counter(
            &registry,
            "queue_limit_waits_total",
            "Claims that took fewer tasks than they asked for because a queue was at its limit, \
             by queue and limit (concurrency).",
            &["queue", "limit"],
        )?;
        Ok(Self {
            limit_waits: by_queue(limit_waits),
            // Schedules are capped as queues are, in a label set of their own.
            schedule_ticks: ByQueue {
                vec: schedule_ticks,
                queues: Arc::new(QueueLabels::new(max_queues)),
            },
            claims_waiting,
            registry,
            http,
            created: by_queue(created),
            claimed: by_queue(claimed),
            completed: by_queue(completed),
            failed: by_queue(failed),
            dead: by_queue(dead),
            cancelled: by_queue(cancelled),
            retried: by_queue(retried),
            lease_lost,
            claim_to_complete: ByQueue {
                vec: claim_to_complete,
                queues: queues.clone(),
            },
            tasks,
            oldest_due,
            queue_paused,
            swept,
            sweeps,
            queues,
        })
    }

    /// Replaces the database-derived gauges with a fresh reading. The queues past the cap add
    /// up under [`OTHER_QUEUES`]: their tasks summed, their oldest due task the oldest of all.
    pub fn observe_database(
        &self,
        counts: &[QueueCount],
        oldest: &[OldestDue],
        queues: &[QueueRow],
    ) {
        self.tasks.reset();
        for row in counts {
            self.tasks
                .with_label_values(&[self.queues.label(&row.queue), row.status.as_str()])
                .add(row.count);
        }
        self.oldest_due.reset();
        for row in oldest {
            let gauge = self
                .oldest_due
                .with_label_values(&[self.queues.label(&row.queue)]);
            gauge.set(gauge.get().max(row.age_seconds));
        }
        self.queue_paused.reset();
        for row in queues {
            let gauge = self
                .queue_paused
                .with_label_values(&[self.queues.label(&row.queue)]);
            gauge.set(gauge.get().max(i64::from(row.paused)));
        }
    }
}
