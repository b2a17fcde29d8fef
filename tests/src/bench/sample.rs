//! The sample's claim against Leasehold's, on the same backlog sizes, then the claim's latency
//! at half the measured maximum rate.

use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Text};
use diesel::{OptionalExtension, QueryableByName};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use leasehold::server::db::OneRow;
use leasehold::{LeaseClient, TaskClient};
use serde_json::json;

use super::measure::{Samples, run_clients};
use super::{Bench, BenchOptions, Report, connect, execute};

#[derive(QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// The sample's `tasks` table (`processed_at IS NULL` means pending; no index but the key).
const SAMPLE_TABLE: &str = "
CREATE TABLE IF NOT EXISTS sample_tasks (
    id BIGSERIAL PRIMARY KEY,
    task_data JSONB NOT NULL,
    scheduled_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    processor TEXT,
    last_heartbeat_at TIMESTAMP(3),
    must_heartbeat_before TIMESTAMP(3),
    started_at TIMESTAMP(3),
    processed_at TIMESTAMP(3),
    task_output JSONB
)";

/// Makes both backlogs `pending` tasks long: the sample's table and a Leasehold queue.
async fn fill_backlogs(bench: &Bench, queue: &str, pending: u64) {
    execute(&bench.task_db, SAMPLE_TABLE).await;
    execute(&bench.task_db, "TRUNCATE sample_tasks").await;
    execute(
        &bench.task_db,
        &format!(
            "INSERT INTO sample_tasks (task_data, scheduled_at)
             SELECT '{{\"sleep_duration_seconds\": 0}}', now() - random() * interval '1 day'
             FROM generate_series(1, {pending})"
        ),
    )
    .await;
    insert_backlog(bench, queue, pending).await;
    execute(&bench.task_db, "VACUUM ANALYZE sample_tasks").await;
    execute(&bench.task_db, "VACUUM ANALYZE tasks").await;
    execute(&bench.task_db, "CHECKPOINT").await;
}

/// `pending` no-op tasks in `queue`, due at random over the last day.
async fn insert_backlog(bench: &Bench, queue: &str, pending: u64) {
    execute(
        &bench.task_db,
        &format!(
            "INSERT INTO tasks (task_data, queue, max_attempts, scheduled_at)
             SELECT '{{\"sleep_duration_seconds\": 0}}', '{queue}', 3,
                    now() - random() * interval '1 day'
             FROM generate_series(1, {pending})"
        ),
    )
    .await;
}

/// A backlog of `pending` tasks in `limited`, a queue whose `limit` (a column of `queues`) is
/// 10,000 running tasks; with `keys`, the tasks spread over that many concurrency keys.
async fn fill_limited(bench: &Bench, limited: &str, pending: u64, limit: &str, keys: Option<u32>) {
    insert_backlog(bench, limited, pending).await;
    if let Some(keys) = keys {
        execute(
            &bench.task_db,
            &format!(
                "UPDATE tasks SET concurrency_key = 'tenant-' || (id % {keys}) WHERE queue = '{limited}'"
            ),
        )
        .await;
    }
    execute(
        &bench.task_db,
        &format!("INSERT INTO queues (queue, {limit}) VALUES ('{limited}', 10000)"),
    )
    .await;
    execute(&bench.task_db, "VACUUM ANALYZE tasks").await;
    execute(&bench.task_db, "CHECKPOINT").await;
}

/// One claim-and-complete by the sample's algorithm: lock the earliest unprocessed row (after
/// skipping `skip`), ask lease-service for its lease while the row is locked, skip on refusal.
async fn sample_cycle(
    conn: &mut AsyncPgConnection,
    leases: &LeaseClient,
    processor: &str,
) -> Result<(), String> {
    let mut skip = 0i64;
    loop {
        diesel::sql_query("BEGIN")
            .execute(conn)
            .await
            .map_err(|e| e.to_string())?;
        let row: Option<Id> = diesel::sql_query(
            "SELECT id FROM sample_tasks WHERE processed_at IS NULL
             ORDER BY scheduled_at ASC LIMIT 1 OFFSET $1 FOR UPDATE",
        )
        .bind::<BigInt, _>(skip)
        .get_one(conn)
        .await
        .optional()
        .map_err(|e| e.to_string())?;
        let Some(Id { id }) = row else {
            let _ = diesel::sql_query("ROLLBACK").execute(conn).await;
            return Err("no task".to_owned());
        };
        let resource = format!("sample-task:{id}");
        match leases
            .acquire(&resource, processor, Some(Duration::from_secs(30)))
            .await
        {
            Ok(lease) => {
                diesel::sql_query(
                    "UPDATE sample_tasks SET processor = $2, started_at = now(),
                         last_heartbeat_at = now(), must_heartbeat_before = now() + interval '30 s'
                     WHERE id = $1",
                )
                .bind::<BigInt, _>(id)
                .bind::<Text, _>(processor)
                .execute(conn)
                .await
                .map_err(|e| e.to_string())?;
                diesel::sql_query("COMMIT")
                    .execute(conn)
                    .await
                    .map_err(|e| e.to_string())?;
                // Complete: record the output, release the lease.
                diesel::sql_query(
                    "UPDATE sample_tasks SET processed_at = now(), task_output = '{}' WHERE id = $1",
                )
                .bind::<BigInt, _>(id)
                .execute(conn)
                .await
                .map_err(|e| e.to_string())?;
                let _ = leases.release(&resource, processor, lease.proof()).await;
                return Ok(());
            }
            Err(_) => {
                let _ = diesel::sql_query("ROLLBACK").execute(conn).await;
                skip += 1;
            }
        }
    }
}

/// One claim-and-complete through task-service's HTTP API, with the typed client the worker
/// uses. Returns the claim's latency.
async fn leasehold_cycle(
    tasks: &TaskClient,
    processor: &str,
    queue: &str,
) -> Result<Duration, String> {
    let started = Instant::now();
    let claim = tasks.claim(processor, Some(queue), None).await;
    let claimed = started.elapsed();
    let claimed_tasks = claim.map_err(|e| format!("claim: {e}"))?;
    let task = claimed_tasks
        .into_iter()
        .next()
        .ok_or("claim found no task")?;
    tasks
        .complete(task.id, processor, None, json!({}))
        .await
        .map_err(|e| format!("complete: {e}"))?;
    Ok(claimed)
}

/// Closed-loop Leasehold claim-and-complete cycles on `queue` for one phase.
pub(super) async fn leasehold_cycles(
    bench: &Bench,
    options: &BenchOptions,
    queue: &str,
) -> (Samples, Duration) {
    let tasks = Arc::new(bench.task_client());
    let phase = options.phase;
    run_clients(options.claim_clients, |k| {
        let tasks = tasks.clone();
        let queue = queue.to_owned();
        async move {
            let mut samples = Samples::default();
            let deadline = Instant::now() + phase;
            let processor = format!("bench-claimer-{k}");
            while Instant::now() < deadline {
                let started = Instant::now();
                match leasehold_cycle(&tasks, &processor, &queue).await {
                    Ok(_) => samples.latencies.push(started.elapsed()),
                    Err(_) => samples.errors += 1,
                }
            }
            samples
        }
    })
    .await
}

pub(super) async fn sample_comparison(bench: &Bench, options: &BenchOptions, report: &mut Report) {
    let section = "claim and complete: the sample's algorithm against Leasehold's";
    let mut half_load_rate = 0.0;
    for &pending in &options.backlog_sizes {
        let queue = format!("backlog-{pending}");
        fill_backlogs(bench, &queue, pending).await;

        let leases = bench.lease_client();
        let task_db = bench.task_db.clone();
        let phase = options.phase.max(Duration::from_secs(1));
        let (samples, elapsed) = run_clients(options.claim_clients, |k| {
            let leases = leases.clone();
            let task_db = task_db.clone();
            async move {
                let mut conn = connect(&task_db).await;
                let mut samples = Samples::default();
                let deadline = Instant::now() + phase;
                let processor = format!("sample-claimer-{k}");
                while Instant::now() < deadline {
                    let started = Instant::now();
                    match sample_cycle(&mut conn, &leases, &processor).await {
                        Ok(()) => samples.latencies.push(started.elapsed()),
                        Err(_) => samples.errors += 1,
                    }
                }
                samples
            }
        })
        .await;
        let sample = samples.figure(
            section,
            "the sample's claim (OFFSET scan, FOR UPDATE, lease call under the lock)",
            options.claim_clients,
            Some(pending),
            elapsed,
        );
        let (samples, elapsed) = leasehold_cycles(bench, options, &queue).await;
        let ours = samples.figure(
            section,
            "Leasehold's claim (SKIP LOCKED, fenced lease) over HTTP",
            options.claim_clients,
            Some(pending),
            elapsed,
        );
        report.ratio(
            format!("Leasehold / sample claim-and-complete, {pending} pending"),
            ours.per_second,
            sample.per_second,
        );
        if half_load_rate == 0.0 {
            half_load_rate = ours.per_second / 2.0;
            // The cost of a concurrency limit that does not bind: the same claims on a queue
            // limited far above the clients' number.
            for (suffix, limit, keys, what) in [
                (
                    "limited",
                    "concurrency_limit",
                    None,
                    "Leasehold's claim, queue limited to 10,000 running (far above the load)",
                ),
                (
                    "keyed",
                    "key_concurrency_limit",
                    Some(100),
                    "Leasehold's claim, 100 keys each limited to 10,000 running (far above the load)",
                ),
            ] {
                let limited = format!("{queue}-{suffix}");
                fill_limited(bench, &limited, pending, limit, keys).await;
                let (samples, elapsed) = leasehold_cycles(bench, options, &limited).await;
                let capped =
                    samples.figure(section, what, options.claim_clients, Some(pending), elapsed);
                report.ratio(
                    format!(
                        "{suffix} (not binding) / unlimited claim-and-complete, {pending} pending"
                    ),
                    capped.per_second,
                    ours.per_second,
                );
                report.figures.push(capped);
            }
        }
        // The end-to-end rates (worker processes, the sample's own way of working) against the
        // sample's claim on this backlog, when the end-to-end section ran.
        for (what, workers) in [
            ("single claims", options.single_workers),
            (
                "batched claims",
                options.workers * options.batch_concurrency,
            ),
        ] {
            let name = format!("{what}: claim → complete (claim-to-complete latency)");
            let end_to_end = report
                .find(super::e2e::SECTION, &name, workers)
                .map(|figure| figure.per_second);
            if let Some(rate) = end_to_end {
                report.ratio(
                    format!("end to end, {what} / sample claim-and-complete, {pending} pending"),
                    rate,
                    sample.per_second,
                );
            }
        }
        report.figures.push(sample);
        report.figures.push(ours);
    }
    half_load(bench, options, half_load_rate, report).await;
}

/// Claims at a fixed rate of half the measured maximum (open loop): their latency when the
/// service is not saturated.
async fn half_load(bench: &Bench, options: &BenchOptions, rate: f64, report: &mut Report) {
    let queue = "half-load";
    let count = (rate * options.phase.as_secs_f64().max(1.0))
        .ceil()
        .max(10.0) as u64;
    execute(
        &bench.task_db,
        &format!(
            "INSERT INTO tasks (task_data, queue, max_attempts)
             SELECT '{{}}', '{queue}', 3 FROM generate_series(1, {})",
            count + 10
        ),
    )
    .await;
    let period = Duration::from_secs_f64(1.0 / rate.max(1.0));
    let started = Instant::now();
    let mut ticker = tokio::time::interval(period);
    let mut handles = Vec::new();
    let tasks = Arc::new(bench.task_client());
    for i in 0..count {
        ticker.tick().await;
        let tasks = tasks.clone();
        handles.push(tokio::spawn(async move {
            leasehold_cycle(&tasks, &format!("half-load-{i}"), queue).await
        }));
    }
    let mut samples = Samples::default();
    for handle in handles {
        match handle.await {
            Ok(Ok(latency)) => samples.latencies.push(latency),
            _ => samples.errors += 1,
        }
    }
    report.figures.push(samples.figure(
        "claim latency at half the maximum claim rate (open loop)",
        &format!("claim at {rate:.0}/s"),
        0,
        None,
        started.elapsed(),
    ));
}
