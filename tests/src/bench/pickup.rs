//! How soon waiting work starts: a task created on an idle stack, from its creation to its start
//! (one idle worker waiting in task-service, `CLAIM_WAIT_MS`), and a lease released while an
//! acquire waits for it, from the release to the waiter's acquisition. Both by the database's
//! clock, one sample at a time, so each is a wake-up's latency, not a queue's.

use std::time::{Duration, Instant};

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Double};
use diesel_async::RunQueryDsl;
use leasehold::server::db::OneRow;
use leasehold::tasks::CreateTask;
use serde_json::json;

use super::measure::Samples;
use super::{Bench, BenchOptions, Report, connect};
use crate::Service;

#[derive(QueryableByName)]
struct Started {
    #[diesel(sql_type = Double)]
    pickup_ms: f64,
}

/// The section's name (the half-load pickup of the end-to-end run joins it).
pub(super) const SECTION: &str = "how soon waiting work starts (database clock)";
/// The idle pickup's figure, which graphile-worker's is compared with.
pub(super) const IDLE_PICKUP: &str = "idle pickup: create → start, one worker waiting";

pub(super) async fn pickup(bench: &Bench, options: &BenchOptions, report: &mut Report) {
    let n = options.pickup_samples;
    report.figures.push(idle_pickup(bench, n).await.figure(
        SECTION,
        IDLE_PICKUP,
        1,
        None,
        Duration::from_secs(1),
    ));
    report.figures.push(lease_handover(bench, n).await.figure(
        SECTION,
        "lease wait: release → the waiter's acquisition",
        1,
        None,
        Duration::from_secs(1),
    ));
}

/// One worker, idle, long-polling; each task is created only once the previous one started.
async fn idle_pickup(bench: &Bench, samples: usize) -> Samples {
    let _worker = Service::worker(
        &bench.tasks.base_url(),
        &[
            ("WORKER_ID", "bench-pickup"),
            ("WORKER_QUEUE", "pickup"),
            ("RUST_LOG", "warn"),
        ],
    )
    .await;
    let tasks = bench.task_client();
    let mut conn = connect(&bench.task_db).await;
    let mut result = Samples::default();
    for _ in 0..samples {
        // Idle between samples, as the worker would be: its claim is waiting again.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let created = tasks
            .create(&CreateTask {
                task_data: json!({"sleep_duration_seconds": 0}),
                queue: Some("pickup".to_owned()),
                ..CreateTask::default()
            })
            .await;
        let Ok(created) = created else {
            result.errors += 1;
            continue;
        };
        let id = created.into_task().id;
        // A guard against a hang, not a measure: generous, for a loaded machine.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let started: Option<Started> = diesel::sql_query(
                "SELECT EXTRACT(EPOCH FROM started_at - created_at)::float8 * 1000 AS pickup_ms
                 FROM tasks WHERE id = $1 AND started_at IS NOT NULL",
            )
            .bind::<BigInt, _>(id)
            .get_one(&mut conn)
            .await
            .ok();
            if let Some(started) = started {
                result
                    .latencies
                    .push(Duration::from_secs_f64(started.pickup_ms.max(0.0) / 1000.0));
                break;
            }
            if Instant::now() > deadline {
                result.errors += 1;
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    result
}

/// A lease passed from holder to waiter: the waiter asks while the lease is held, and the
/// holder releases once the waiter waits in lease-service.
async fn lease_handover(bench: &Bench, samples: usize) -> Samples {
    let client = bench.lease_client();
    let resource = "bench:handover";
    let mut result = Samples::default();
    let Ok(mut held) = client.acquire(resource, "holder-0", None).await else {
        result.errors += 1;
        return result;
    };
    for i in 1..=samples {
        let waiter = {
            let client = client.clone();
            let holder = format!("holder-{i}");
            tokio::spawn(async move {
                client
                    .acquire_waiting(resource, &holder, None, None, Duration::from_secs(30))
                    .await
            })
        };
        let waiting = Instant::now() + Duration::from_secs(30);
        while crate::metric_sum(&bench.leases.metrics().await, "lease_acquires_waiting") < 1.0
            && Instant::now() < waiting
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let released = client.release(resource, &held.holder, held.proof()).await;
        let next = waiter.await.ok().and_then(Result::ok);
        match (released, next) {
            (Ok(released), Some((next, _))) => {
                if let Some(released_at) = released.released_at {
                    let gap = (next.created_at - released_at)
                        .num_microseconds()
                        .unwrap_or(0);
                    result
                        .latencies
                        .push(Duration::from_micros(u64::try_from(gap).unwrap_or(0)));
                }
                held = next;
            }
            _ => {
                result.errors += 1;
                return result;
            }
        }
    }
    result
}

/// Single tasks created at a steady `rate` (one per request, by 8 producers each on its own
/// clock) for `duration`, into `queue`, whose workers are running; then the creation-to-start
/// latencies of those tasks (database clock) once all started, and how busy all cores were
/// meanwhile.
pub(super) async fn at_rate(
    bench: &Bench,
    queue: &str,
    rate: f64,
    duration: Duration,
) -> (Samples, Duration, f64) {
    const PRODUCERS: usize = 8;
    let period = Duration::from_secs_f64(PRODUCERS as f64 / rate.max(1.0));
    let cpu_before = machine_cpu();
    let started = Instant::now();
    let handles: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let tasks = bench.task_client();
            let queue = queue.to_owned();
            tokio::spawn(async move {
                // Each producer starts at its own offset, so the creates are spread evenly.
                tokio::time::sleep(period.mul_f64(p as f64 / PRODUCERS as f64)).await;
                let mut tick = tokio::time::interval(period);
                let end = Instant::now() + duration;
                let (mut ids, mut errors) = (Vec::new(), 0u64);
                while Instant::now() < end {
                    tick.tick().await;
                    let created = tasks
                        .create(&CreateTask {
                            task_data: json!({"sleep_duration_seconds": 0}),
                            queue: Some(queue.clone()),
                            ..CreateTask::default()
                        })
                        .await;
                    match created {
                        Ok(created) => ids.push(created.into_task().id),
                        Err(_) => errors += 1,
                    }
                }
                (ids, errors)
            })
        })
        .collect();
    let (mut ids, mut errors) = (Vec::new(), 0u64);
    for handle in handles {
        if let Ok((more, failed)) = handle.await {
            ids.extend(more);
            errors += failed;
        }
    }
    let elapsed = started.elapsed();
    let busy = busy_since(&cpu_before);
    let mut conn = connect(&bench.task_db).await;
    let query = "SELECT EXTRACT(EPOCH FROM started_at - created_at)::float8 * 1000 AS pickup_ms
         FROM tasks WHERE id = ANY($1) AND started_at IS NOT NULL";
    let deadline = Instant::now() + Duration::from_secs(60);
    let pickups = loop {
        let pickups: Vec<Started> = diesel::sql_query(query)
            .bind::<diesel::sql_types::Array<BigInt>, _>(&ids)
            .load(&mut conn)
            .await
            .unwrap_or_else(|err| panic!("{query}: {err}"));
        if pickups.len() >= ids.len() || Instant::now() > deadline {
            break pickups;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let samples = Samples {
        errors: errors + ids.len().saturating_sub(pickups.len()) as u64,
        latencies: pickups
            .iter()
            .map(|p| Duration::from_secs_f64(p.pickup_ms.max(0.0) / 1000.0))
            .collect(),
    };
    (samples, elapsed, busy)
}

/// The machine's CPU time so far, in clock ticks: (busy, all), from `/proc/stat`'s first line
/// (busy is everything but idle and I/O wait).
fn machine_cpu() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|field| field.parse().ok())
        .collect();
    let all: u64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
    (all.saturating_sub(idle), all)
}

/// The share of all cores' time spent busy since `before` ([`machine_cpu`]), 0 to 1: whether a
/// phase's latencies are those of a machine with CPU to spare or of queues for a saturated one.
fn busy_since(before: &(u64, u64)) -> f64 {
    let after = machine_cpu();
    let all = after.1.saturating_sub(before.1);
    if all == 0 {
        return 0.0;
    }
    after.0.saturating_sub(before.0) as f64 / all as f64
}
