//! Claims while heavy reads run: the claim's latency with nobody reading, then while
//! `heavy_readers` clients read the heaviest routes over and over (counts of every queue, the
//! dashboard's overview and day chart, a page of 1,000 queues, a page of 1,000 tasks), with as
//! many queues present as the hostile probe made (30,000). The issue this answers: 40-80 such
//! readers took every database connection, and claims waited 3.6-6.5 s or got 503. Now at
//! most `READS_IN_FLIGHT` reads hold a connection (by default half the cores: 1 on the
//! development machine's two); the rest wait their turn. `READS_IN_FLIGHT=4` in the bench's
//! environment reaches task-service, to compare.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use leasehold::TaskClient;
use serde_json::json;

use super::charts::fold_all;
use super::measure::{Samples, run_clients};
use super::{Bench, BenchOptions, Report, connect};

pub(super) const SECTION: &str =
    "claims while heavy reads run (READS_IN_FLIGHT: by default half the cores, here 1)";

/// The routes the readers take in turn.
const HEAVY_READS: [&str; 5] = [
    "/api/tasks/counts",
    "/api/dashboard/overview",
    "/api/queues?limit=1000",
    "/api/dashboard/throughput?window_seconds=86400",
    "/api/tasks?limit=1000",
];

/// `claim_clients` closed-loop clients claiming from `queue` and completing each task for one
/// phase; the samples are the claims' latencies alone.
async fn claims(bench: &Bench, options: &BenchOptions, queue: &str) -> (Samples, Duration) {
    let tasks = Arc::new(bench.task_client());
    let phase = options.phase;
    run_clients(options.claim_clients, |k| {
        let tasks = tasks.clone();
        let queue = queue.to_owned();
        async move {
            let mut samples = Samples::default();
            let deadline = Instant::now() + phase;
            let processor = format!("bench-reads-claimer-{k}");
            while Instant::now() < deadline {
                match claim_and_complete(&tasks, &processor, &queue).await {
                    Ok(claimed) => samples.latencies.push(claimed),
                    Err(_) => samples.errors += 1,
                }
            }
            samples
        }
    })
    .await
}

/// One claim and its completion; the claim's latency.
async fn claim_and_complete(
    tasks: &TaskClient,
    processor: &str,
    queue: &str,
) -> Result<Duration, String> {
    let started = Instant::now();
    let claimed = tasks
        .claim(processor, Some(queue), None)
        .await
        .map_err(|e| format!("claim: {e}"))?;
    let latency = started.elapsed();
    let task = claimed.into_iter().next().ok_or("claim found no task")?;
    tasks
        .complete(task.id, processor, None, json!({}))
        .await
        .map_err(|e| format!("complete: {e}"))?;
    Ok(latency)
}

pub(super) async fn reads(bench: &Bench, options: &BenchOptions, report: &mut Report) {
    let queue = "bench-reads";
    let queues = options.read_queues;
    // The probe's queues, each with a task waiting far ahead and one finished, and the backlog
    // to claim from: written without history, as if made long ago, so that the history the
    // reads find is the day's of the charts section (a million events) when both run, not a
    // burst of this set-up's inserts in the last minutes.
    let backlog = (options.e2e_tasks * 3).max(2_000);
    let mut conn = connect(&bench.task_db).await;
    for sql in [
        "SET session_replication_role = replica".to_owned(),
        format!(
            "INSERT INTO tasks (task_data, queue, max_attempts, scheduled_at)
             SELECT '{{}}', 'probe-' || g, 3, '2999-01-01' FROM generate_series(1, {queues}) g"
        ),
        format!(
            "INSERT INTO tasks (task_data, queue, status, max_attempts, attempts, processor,
                                fence, started_at, processed_at, task_output)
             SELECT '{{}}', 'probe-' || g, 'succeeded', 3, 1, 'old', g, now(), now(), '{{}}'
             FROM generate_series(1, {queues}) g"
        ),
        // Enough to claim for two phases at any speed this machine reaches.
        format!(
            "INSERT INTO tasks (task_data, queue, max_attempts)
             SELECT '{{}}', '{queue}', 3 FROM generate_series(1, {backlog})"
        ),
        "VACUUM ANALYZE tasks".to_owned(),
        "CHECKPOINT".to_owned(),
    ] {
        diesel_async::RunQueryDsl::execute(diesel::sql_query(sql), &mut conn)
            .await
            .unwrap();
    }
    // The sweeper keeps the charts' rollup within a minute or so of now; the bench's
    // task-service runs no sweeper, so the section folds as its round would.
    fold_all(&mut conn).await;

    let (alone, elapsed) = claims(bench, options, queue).await;
    let alone = alone.figure(
        SECTION,
        "claim, nobody reading",
        options.claim_clients,
        Some(queues),
        elapsed,
    );

    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..options.heavy_readers)
        .map(|k| {
            let http = bench.http.clone();
            let base = bench.tasks.base_url();
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut samples = Samples::default();
                let mut n = k;
                while !stop.load(Ordering::Relaxed) {
                    let url = format!("{base}{}", HEAVY_READS[n % HEAVY_READS.len()]);
                    n += 1;
                    let started = Instant::now();
                    let answered = match http.get(&url).send().await {
                        Ok(answer) if answer.status().is_success() => answer.bytes().await.is_ok(),
                        _ => false,
                    };
                    if answered {
                        samples.latencies.push(started.elapsed());
                    } else {
                        samples.errors += 1;
                    }
                }
                samples
            })
        })
        .collect();
    // The readers' first round is under way before the claims start.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let read_started = Instant::now();
    let (loaded, elapsed) = claims(bench, options, queue).await;
    stop.store(true, Ordering::Relaxed);
    let mut read = Samples::default();
    for reader in readers {
        if let Ok(samples) = reader.await {
            read.merge(samples);
        }
    }
    let loaded = loaded.figure(
        SECTION,
        &format!(
            "claim while {} clients read the heaviest routes",
            options.heavy_readers
        ),
        options.claim_clients,
        Some(queues),
        elapsed,
    );
    let read = read.figure(
        SECTION,
        "the heavy reads themselves (each waits for its turn)",
        options.heavy_readers,
        Some(queues),
        read_started.elapsed(),
    );
    report.ratio(
        format!(
            "claim p99 while {} clients read / nobody reading",
            options.heavy_readers
        ),
        loaded.p99_ms,
        alone.p99_ms,
    );
    report.ratio(
        format!(
            "claim p50 while {} clients read / nobody reading",
            options.heavy_readers
        ),
        loaded.p50_ms,
        alone.p50_ms,
    );
    report.figures.extend([alone, loaded, read]);
}
