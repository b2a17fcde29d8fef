//! Growth: the same figures with more and more finished rows present.

use super::leases::lease_http;
use super::sample::leasehold_cycles;
use super::{Bench, BenchOptions, Report, execute};

pub(super) async fn growth(bench: &Bench, options: &BenchOptions, report: &mut Report) {
    let mut present = 0u64;
    let mut first: Option<(f64, f64)> = None;
    let clients = 32.min(*options.lease_concurrency.iter().max().unwrap_or(&32));
    for &size in &options.growth_sizes {
        let more = size.saturating_sub(present);
        execute(
            &bench.task_db,
            &format!(
                "INSERT INTO tasks (task_data, queue, status, max_attempts, attempts, processor,
                                    fence, started_at, processed_at, task_output)
                 SELECT '{{}}', 'finished', 'succeeded', 1, 1, 'old', g, now(), now(), '{{}}'
                 FROM generate_series(1, {more}) g"
            ),
        )
        .await;
        execute(
            &bench.lease_db,
            &format!(
                "INSERT INTO leases (resource, holder, fence, ttl_seconds, created_at, released_at,
                                     expires_at)
                 SELECT 'ended-{size}-' || g, 'old', nextval('leases_fence_seq'), 30, now(),
                        now(), now()
                 FROM generate_series(1, {more}) g"
            ),
        )
        .await;
        execute(&bench.task_db, "VACUUM ANALYZE tasks").await;
        execute(&bench.lease_db, "VACUUM ANALYZE leases").await;
        // Write the bulk insert's dirty pages out now, or the checkpoint that follows it runs
        // during the measurement and the figure measures it instead of the table's size.
        execute(&bench.lease_db, "CHECKPOINT").await;
        present = size;

        let before = report.figures.len();
        let rates = lease_http(bench, options, clients, true, report).await;
        for figure in &mut report.figures[before..] {
            figure.rows = Some(size);
        }
        let queue = format!("growth-{size}");
        let backlog = (options.e2e_tasks / 2).max(100);
        execute(
            &bench.task_db,
            &format!(
                "INSERT INTO tasks (task_data, queue, max_attempts)
                 SELECT '{{}}', '{queue}', 3 FROM generate_series(1, {backlog})"
            ),
        )
        .await;
        let (samples, elapsed) = leasehold_cycles(bench, options, &queue).await;
        let claim = samples.figure(
            "growth: claim and complete over HTTP",
            "claim and complete",
            options.claim_clients,
            Some(size),
            elapsed,
        );
        let claim_rate = claim.per_second;
        report.figures.push(claim);
        match first {
            None => first = Some((rates[0], claim_rate)),
            Some((acquire0, claim0)) => {
                report.ratio(
                    format!("lease acquire with {size} rows / with the fewest"),
                    rates[0],
                    acquire0,
                );
                report.ratio(
                    format!("claim and complete with {size} rows / with the fewest"),
                    claim_rate,
                    claim0,
                );
            }
        }
    }
}
