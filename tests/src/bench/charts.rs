//! The dashboard's day chart over a busy day: `chart_events` events of history (a million in
//! the full run) spread over the last day, folded into the per-minute rollup as the sweeper's
//! first round after a deploy folds them, then the day's and the hour's charts read through
//! task-service, against the raw read of the same day that the charts made before the rollup
//! (on a direct connection without a statement timeout; task-service's 5 s ended it).

use std::time::{Duration, Instant};

use diesel::sql_types::BigInt;
use diesel_async::RunQueryDsl;
use task_service::repo;

use super::measure::Samples;
use super::{Bench, BenchOptions, Report, connect, execute};
use crate::{EVENTS_PER_TASK, synthesize_history};

pub(super) const SECTION: &str = "dashboard charts over a day of history";

/// The day chart's read before the rollup: every event of the window with the event before it,
/// in 60 buckets.
const RAW_DAY: &str = "
    SELECT (floor(EXTRACT(EPOCH FROM now() - e.at) / $2) * $2)::bigint AS seconds_ago,
           count(*) FILTER (WHERE e.to_status = 'running') AS started,
           count(*) FILTER (WHERE e.to_status = 'succeeded') AS succeeded,
           count(*) FILTER (WHERE e.from_status IS NULL) AS created,
           count(*) FILTER (WHERE e.to_status = 'dead'
                               OR (e.from_status = 'running' AND e.to_status = 'pending'
                                   AND e.charged)) AS failed,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY e.pickup_ms) AS pickup_p50_ms,
           percentile_cont(0.99) WITHIN GROUP (ORDER BY e.pickup_ms) AS pickup_p99_ms
    FROM task_transitions e
    WHERE e.at > now() - make_interval(secs => $1)
    GROUP BY 1 ORDER BY 1";

/// Folds the history into the rollup until it is caught up, as a sweeper's round does (the
/// bench's task-service runs none); the minutes folded.
pub(super) async fn fold_all(conn: &mut diesel_async::AsyncPgConnection) -> i64 {
    let mut minutes = 0;
    loop {
        let fold = repo::fold_history(conn).await.unwrap();
        minutes += fold.minutes;
        if !fold.more {
            return minutes;
        }
    }
}

/// Reads of each chart through HTTP, one at a time.
const CHART_READS: usize = 20;
/// Runs of the raw read: each takes seconds.
const RAW_READS: usize = 3;

pub(super) async fn charts(bench: &Bench, options: &BenchOptions, report: &mut Report) {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let tasks = (options.chart_events as f64 / EVENTS_PER_TASK) as u64;
    synthesize_history(&bench.task_db, tasks, "1 day", "1 minute").await;
    execute(&bench.task_db, "VACUUM ANALYZE task_events").await;
    execute(&bench.task_db, "VACUUM ANALYZE tasks").await;
    execute(&bench.task_db, "CHECKPOINT").await;
    let mut conn = connect(&bench.task_db).await;
    let events = {
        #[derive(diesel::QueryableByName)]
        struct Count {
            #[diesel(sql_type = BigInt)]
            n: i64,
        }
        let counted: Vec<Count> = diesel::sql_query(
            "SELECT count(*) AS n FROM task_events WHERE at > now() - interval '1 day'",
        )
        .load(&mut conn)
        .await
        .unwrap();
        u64::try_from(counted[0].n).unwrap_or(0)
    };

    // As after a deploy onto this history: nothing folded. The sweeper's first round folds the
    // day a chunk a transaction; here its very function does, on one connection.
    execute(
        &bench.task_db,
        "TRUNCATE task_throughput_minutes, task_queue_minutes",
    )
    .await;
    execute(
        &bench.task_db,
        "UPDATE task_rollup SET folded_through = NULL",
    )
    .await;
    let started = Instant::now();
    let minutes = fold_all(&mut conn).await;
    let mut fold = Samples::default();
    fold.latencies.push(started.elapsed());
    let mut fold = fold.figure(
        SECTION,
        &format!("fold the day into the rollup ({minutes} minutes; the sweeper's first round)"),
        1,
        Some(events),
        started.elapsed(),
    );
    fold.per_second = 0.0;
    report.figures.push(fold);

    let mut chart_p50 = 0.0;
    for (window, name) in [
        (86_400, "day chart (60 buckets of 24 minutes)"),
        (3600, "hour chart"),
    ] {
        let url = bench.tasks.url(&format!(
            "/api/dashboard/throughput?window_seconds={window}"
        ));
        let mut samples = Samples::default();
        let started = Instant::now();
        for _ in 0..CHART_READS {
            let read = Instant::now();
            let answered = match bench.http.get(&url).send().await {
                Ok(answer) if answer.status().is_success() => answer.bytes().await.is_ok(),
                _ => false,
            };
            if answered {
                samples.latencies.push(read.elapsed());
            } else {
                samples.errors += 1;
            }
        }
        let figure = samples.figure(
            SECTION,
            &format!("{name}: rollup + unfolded tail, through HTTP"),
            1,
            Some(events),
            started.elapsed(),
        );
        if window == 86_400 {
            chart_p50 = figure.p50_ms;
        }
        report.figures.push(figure);
    }

    diesel::sql_query("SET statement_timeout = 0")
        .execute(&mut conn)
        .await
        .unwrap();
    let mut raw = Samples::default();
    let started = Instant::now();
    for _ in 0..RAW_READS {
        let read = Instant::now();
        let rows = diesel::sql_query(RAW_DAY)
            .bind::<BigInt, _>(86_400i64)
            .bind::<BigInt, _>(1_440i64)
            .execute(&mut conn)
            .await;
        match rows {
            Ok(_) => raw.latencies.push(read.elapsed()),
            Err(_) => raw.errors += 1,
        }
    }
    let raw = raw.figure(
        SECTION,
        "day chart: the raw read it replaced (every event and the one before it), direct SQL",
        1,
        Some(events),
        started.elapsed().max(Duration::from_millis(1)),
    );
    report.ratio(
        "day chart: raw read / rollup read (p50)",
        raw.p50_ms,
        chart_p50,
    );
    report.figures.push(raw);
}
