//! Tasks end to end, with worker processes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Text};

use leasehold::server::db::OneRow;
use leasehold::tasks::{CreateTask, MAX_CREATE_BATCH};
use serde_json::json;

use super::measure::{Samples, run_clients};
use super::pickup::at_rate;
use super::{Bench, BenchOptions, Figure, Report, connect};
use crate::Service;

#[derive(QueryableByName)]
pub(super) struct Drain {
    #[diesel(sql_type = BigInt)]
    pub(super) done: i64,
    #[diesel(sql_type = diesel::sql_types::Double)]
    pub(super) seconds: f64,
    #[diesel(sql_type = diesel::sql_types::Double)]
    pub(super) p50_ms: f64,
    #[diesel(sql_type = diesel::sql_types::Double)]
    pub(super) p99_ms: f64,
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    count: i64,
}

impl Drain {
    /// The drain as a figure of `section`: `total` tasks were to be done by `concurrency`
    /// slots, and those not done are its errors.
    pub(super) fn figure(
        &self,
        section: &str,
        name: &str,
        concurrency: usize,
        total: u64,
    ) -> Figure {
        let seconds = self.seconds.max(1e-9);
        Figure {
            section: section.to_owned(),
            name: name.to_owned(),
            concurrency,
            rows: None,
            ops: self.done as u64,
            errors: total.saturating_sub(self.done as u64),
            seconds,
            per_second: self.done as f64 / seconds,
            p50_ms: self.p50_ms,
            p99_ms: self.p99_ms,
        }
    }
}

/// `count` worker processes of `slots` slots each, claiming ahead up to `prefetch`, on `queue`
/// only, with `extra` settings (the work they do, say).
pub(super) async fn start_workers(
    bench: &Bench,
    queue: &str,
    count: usize,
    slots: usize,
    prefetch: usize,
    extra: &[(&str, &str)],
) -> Vec<Service> {
    let (slots, prefetch) = (slots.to_string(), prefetch.to_string());
    let mut running = Vec::with_capacity(count);
    for w in 0..count {
        let id = format!("bench-{queue}-{w}");
        let mut env = vec![
            ("WORKER_ID", id.as_str()),
            ("WORKER_QUEUE", queue),
            ("WORKER_CONCURRENCY", slots.as_str()),
            ("WORKER_PREFETCH", prefetch.as_str()),
            ("POLL_MIN_MS", "5"),
            ("POLL_MAX_MS", "50"),
            ("RUST_LOG", "warn"),
        ];
        env.extend_from_slice(extra);
        running.push(Service::worker(&bench.tasks.base_url(), &env).await);
    }
    running
}

/// The succeeded tasks of `queue`: how many, over what span, and their claim-to-complete
/// latencies, by the database's own timestamps.
pub(super) async fn drained(task_db: &str, queue: &str) -> Drain {
    let mut conn = connect(task_db).await;
    diesel::sql_query(
        "SELECT count(*) AS done,
                COALESCE(EXTRACT(EPOCH FROM max(processed_at) - min(started_at)), 0)::float8 AS seconds,
                COALESCE(percentile_cont(0.5) WITHIN GROUP
                    (ORDER BY EXTRACT(EPOCH FROM processed_at - started_at)) * 1000, 0)::float8 AS p50_ms,
                COALESCE(percentile_cont(0.99) WITHIN GROUP
                    (ORDER BY EXTRACT(EPOCH FROM processed_at - started_at)) * 1000, 0)::float8 AS p99_ms
         FROM tasks WHERE queue = $1 AND status = 'succeeded'",
    )
    .bind::<Text, _>(queue)
    .get_one(&mut conn)
    .await
    .unwrap()
}

/// A backlog of `total` no-op tasks in `queue`, created over HTTP in batches of 1,000
/// (`POST /api/tasks/batch`, one statement and one commit each) by 4 producers; each task's
/// latency is its batch's.
pub(super) async fn backlog(bench: &Bench, queue: &str, total: u64) -> (Samples, Duration) {
    let batch = MAX_CREATE_BATCH as u64;
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let tasks = Arc::new(bench.task_client());
    run_clients(4, |_| {
        let tasks = tasks.clone();
        let next = next.clone();
        let queue = queue.to_owned();
        async move {
            let mut samples = Samples::default();
            loop {
                let first = next.fetch_add(batch, std::sync::atomic::Ordering::Relaxed);
                if first >= total {
                    break;
                }
                let task = CreateTask {
                    task_data: json!({"sleep_duration_seconds": 0}),
                    queue: Some(queue.clone()),
                    ..CreateTask::default()
                };
                let creates = vec![task; usize::try_from(batch.min(total - first)).unwrap_or(0)];
                let started = Instant::now();
                // Only a new task (201) counts; anything else is an error of the run.
                match tasks.create_many(&creates).await {
                    Ok(results) => {
                        let latency = started.elapsed();
                        for result in results {
                            if result.status == 201 {
                                samples.latencies.push(latency);
                            } else {
                                samples.errors += 1;
                            }
                        }
                    }
                    Err(_) => samples.errors += creates.len() as u64,
                }
            }
            samples
        }
    })
    .await
}

/// Waits until `total` tasks of `queue` succeeded (ten minutes at most). Watched with a count
/// the index answers; the figures come from the rows at the end (the database's own
/// timestamps), so the watching costs the run little.
pub(super) async fn wait_done(task_db: &str, queue: &str, total: u64) {
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut conn = connect(task_db).await;
    loop {
        let done: Count = diesel::sql_query(
            "SELECT count(*) AS count FROM tasks WHERE queue = $1 AND status = 'succeeded'",
        )
        .bind::<Text, _>(queue)
        .get_one(&mut conn)
        .await
        .unwrap();
        if done.count as u64 >= total || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The section's name, which the sections that compare with it find its figures by.
pub(super) const SECTION: &str = "tasks end to end (worker processes, no-op work)";

pub(super) async fn end_to_end(bench: &Bench, options: &BenchOptions, report: &mut Report) {
    for (name, workers, slots) in [
        ("single claims", options.single_workers, 1),
        ("batched claims", options.workers, options.batch_concurrency),
    ] {
        let queue = format!("e2e-{}", name.replace(' ', "-"));
        let meter = bench.meter().await;
        let (samples, elapsed) = backlog(bench, &queue, options.e2e_tasks).await;
        let batch = MAX_CREATE_BATCH;
        report.figures.push(samples.figure(
            SECTION,
            &format!("create (HTTP, batches of {batch}) for {name}"),
            4,
            None,
            elapsed,
        ));

        let total = options.e2e_tasks;
        // Batched workers claim ahead up to their slots; a one-slot worker's completion already
        // carries its next claim, and a claim ahead would be sent alone while its task runs.
        let prefetch = if options.prefetch && slots > 1 {
            slots
        } else {
            0
        };
        let running = start_workers(bench, &queue, workers, slots, prefetch, &[]).await;
        wait_done(&bench.task_db, &queue, total).await;
        let drain = drained(&bench.task_db, &queue).await;
        let pids: Vec<u32> = running.iter().map(Service::pid_u32).collect();
        report
            .costs
            .push(meter.finish(name, drain.done as u64, &pids, 0.0).await);
        let figure = drain.figure(
            SECTION,
            &format!("{name}: claim → complete (claim-to-complete latency)"),
            workers * slots,
            total,
        );
        let per_second = figure.per_second;
        report.figures.push(figure);
        // Pickup at half the rate these workers just reached: single tasks created one per
        // request at a steady pace, each from its creation to its start.
        if slots == 1 {
            let rate = per_second / 2.0;
            let (samples, elapsed, busy) = at_rate(bench, &queue, rate, options.phase * 2).await;
            report.figures.push(samples.figure(
                super::pickup::SECTION,
                &format!(
                    "pickup at half the single-claim rate ({rate:.0}/s; all cores {:.0} % busy): create → start",
                    busy * 100.0
                ),
                workers,
                None,
                elapsed,
            ));
        }
        drop(running);
    }
}
