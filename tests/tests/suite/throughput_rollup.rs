//! The dashboard's hour and day charts read the history's per-minute rollup and its unfolded
//! tail, and answer what the raw history gives for the same window: the same counts in every
//! bucket, the same queue series, pickup percentiles within the histogram's 2.2%. A minute is
//! folded only once no transaction that could still record an event in it is open.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde_json::{Value, json};
use task_service::charts::queue_series;
use task_service::repo::QueueMoves;
use tests::{Service, eventually, execute, fresh_database, metric_sum, query, synthesize_history};

/// The original raw read of the charts, with buckets of whole minutes (bucket 0 holds the
/// current minute) and `percentile_disc`: per bucket, the counts and the pickup percentiles,
/// and the start of the current minute it was read in.
fn raw_buckets_sql(window_minutes: i64, bucket_minutes: i64) -> String {
    format!(
        "WITH ev AS (
             SELECT (greatest(0, EXTRACT(EPOCH FROM date_trunc('minute', now())
                                                    - date_trunc('minute', e.at)) / 60)::bigint
                     / {bucket_minutes}) AS bucket,
                    e.from_status, e.to_status, e.charged, e.pickup_ms AS ms
             FROM task_transitions e
             WHERE e.at >= date_trunc('minute', now())
                           - make_interval(mins => {window_minutes} - 1)
         )
         SELECT bucket * {bucket_minutes} * 60 AS seconds_ago,
                count(*) FILTER (WHERE from_status IS NULL) AS created,
                count(*) FILTER (WHERE to_status = 'running') AS started,
                count(*) FILTER (WHERE to_status = 'succeeded') AS succeeded,
                count(*) FILTER (WHERE to_status = 'dead'
                                    OR (from_status = 'running' AND to_status = 'pending'
                                        AND charged)) AS failed,
                percentile_disc(0.5) WITHIN GROUP (ORDER BY ms) AS p50,
                percentile_disc(0.99) WITHIN GROUP (ORDER BY ms) AS p99,
                date_trunc('minute', now())::text AS minute
         FROM ev GROUP BY bucket ORDER BY bucket"
    )
}

/// Each queue's net moves per bucket from the raw history, one per task and transition, and
/// its counts now (`seconds_ago` null).
fn raw_moves_sql(window_minutes: i64, bucket_minutes: i64) -> String {
    format!(
        "SELECT e.queue,
                (greatest(0, EXTRACT(EPOCH FROM date_trunc('minute', now())
                                                - date_trunc('minute', e.at)) / 60)::bigint
                 / {bucket_minutes} * {bucket_minutes} * 60) AS seconds_ago,
                sum((e.to_status = 'pending')::int
                    - (e.from_status IS NOT DISTINCT FROM 'pending')::int) AS pending,
                sum((e.to_status = 'running')::int
                    - (e.from_status IS NOT DISTINCT FROM 'running')::int) AS running
         FROM task_transitions e
         WHERE e.at >= date_trunc('minute', now()) - make_interval(mins => {window_minutes} - 1)
         GROUP BY 1, 2
         UNION ALL
         SELECT queue, NULL, count(*) FILTER (WHERE status = 'pending'),
                count(*) FILTER (WHERE status = 'running')
         FROM tasks WHERE status IN ('pending', 'running') GROUP BY queue"
    )
}

async fn database_minute(task_db: &str) -> String {
    query(task_db, "SELECT date_trunc('minute', now())::text AS m").await[0]["m"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The chart of `window_seconds` as task-service answers it, checked against the raw history
/// read in the same minute: every bucket's counts equal, its pickup percentiles within the
/// histogram's resolution of the raw ones, the queue series equal. Returns the answer.
async fn answers_as_the_raw_history(tasks: &Service, task_db: &str, window_seconds: i64) -> Value {
    let (window_minutes, bucket_minutes) = (window_seconds / 60, window_seconds / 3600);
    for _ in 0..5 {
        let before = database_minute(task_db).await;
        let answer = tasks
            .get(&format!(
                "/api/dashboard/throughput?window_seconds={window_seconds}"
            ))
            .await;
        assert_eq!(answer.status, 200, "{:?}", answer.body);
        let raw = query(task_db, &raw_buckets_sql(window_minutes, bucket_minutes)).await;
        let raw_moves = query(task_db, &raw_moves_sql(window_minutes, bucket_minutes)).await;
        if database_minute(task_db).await != before {
            // A minute turned between the reads: their buckets differ; read again.
            continue;
        }
        let buckets = answer.body["buckets"].as_array().unwrap();
        assert_eq!(
            buckets.len(),
            raw.len(),
            "{window_seconds}: {buckets:?} against {raw:?}"
        );
        for (bucket, raw) in buckets.iter().zip(&raw) {
            assert_eq!(bucket["secondsAgo"], raw["seconds_ago"], "{bucket} {raw}");
            for (field, raw_field) in [
                ("created", "created"),
                ("started", "started"),
                ("claimed", "started"),
                ("succeeded", "succeeded"),
                ("completed", "succeeded"),
                ("failed", "failed"),
            ] {
                assert_eq!(bucket[field], raw[raw_field], "{field}: {bucket} {raw}");
            }
            for (field, raw_field) in [("pickupP50Ms", "p50"), ("pickupP99Ms", "p99")] {
                match (bucket[field].as_f64(), raw[raw_field].as_f64()) {
                    (None, None) => {}
                    (Some(read), Some(exact)) => assert!(
                        (read - exact).abs() <= 0.022 * (1.0 + exact) + 1e-6,
                        "{field}: {read} for {exact}: {bucket} {raw}"
                    ),
                    other => panic!("{field}: {other:?}: {bucket} {raw}"),
                }
            }
        }
        let moves = raw_moves
            .iter()
            .map(|m| QueueMoves {
                queue: m["queue"].as_str().unwrap().to_owned(),
                seconds_ago: m["seconds_ago"].as_i64(),
                pending: m["pending"].as_i64().unwrap(),
                running: m["running"].as_i64().unwrap(),
            })
            .collect();
        let series = serde_json::to_value(queue_series(moves, 60, bucket_minutes * 60)).unwrap();
        assert_eq!(
            answer.body["queues"], series,
            "{window_seconds}: queue series"
        );
        return answer.body;
    }
    panic!("a minute turned between the reads five times running");
}

/// Whether the fold has reached the last minute or two: its round is over.
async fn caught_up(task_db: &str) -> bool {
    let rows = query(
        task_db,
        "SELECT folded_through >= date_trunc('minute', now()) - interval '2 minutes' AS up
         FROM task_rollup",
    )
    .await;
    rows[0]["up"] == json!(true)
}

/// Creates, claims and ends tasks through the API (now): `ends` says, per task, whether it
/// completes (`true`) or fails (`false`); one more task stays pending.
async fn traffic(tasks: &Service, queue: &str, ends: &[bool]) {
    for _ in 0..=ends.len() {
        let created = tasks
            .post(
                "/api/tasks",
                &json!({"task_data": {}, "queue": queue, "max_attempts": 3}),
            )
            .await;
        assert_eq!(created.status, 201, "{:?}", created.body);
    }
    for (k, completes) in ends.iter().enumerate() {
        let processor = format!("w{k}");
        let claim = tasks
            .post(
                "/api/tasks/next",
                &json!({"processor": processor, "queue": queue}),
            )
            .await;
        assert_eq!(claim.status, 202, "{:?}", claim.body);
        let (id, fence) = (&claim.body["id"], &claim.body["fence"]);
        let end = if *completes {
            tasks
                .put(
                    &format!("/api/tasks/{id}/complete"),
                    &json!({"processor": processor, "fence": fence, "task_output": {}}),
                )
                .await
        } else {
            tasks
                .put(
                    &format!("/api/tasks/{id}/fail"),
                    &json!({"processor": processor, "fence": fence, "error": "no"}),
                )
                .await
        };
        assert_eq!(end.status, 202, "{:?}", end.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_of_the_rollup_and_its_tail_answer_as_the_raw_history() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    // The sweeper folds once at start, then not for 20 minutes (its lease's TTL, three
    // intervals, is within lease-service's hour): the test folds by restarting it.
    let mut tasks = Service::task_service(
        &task_db,
        &leases.base_url(),
        &[("TASK_SWEEP_INTERVAL_SECONDS", "1200")],
    )
    .await;
    eventually(
        Duration::from_secs(60),
        "the first round's fold",
        || async { caught_up(&task_db).await },
    )
    .await;
    // A day of history from before the rollup existed: a deploy onto a busy system.
    execute(
        &task_db,
        "TRUNCATE task_throughput_minutes, task_queue_minutes",
    )
    .await;
    execute(&task_db, "UPDATE task_rollup SET folded_through = NULL").await;
    let events = synthesize_history(&task_db, 3_000, "1 day", "2 minutes").await;
    assert!(events > 9_000, "{events}");
    traffic(&tasks, "live", &[true, true, false]).await;

    // Nothing folded: the whole window is read from the history.
    for window in [3600, 86_400] {
        let answer = answers_as_the_raw_history(&tasks, &task_db, window).await;
        let created: i64 = answer["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["created"].as_i64().unwrap())
            .sum();
        assert!(created >= 4, "{window}: {answer}");
    }

    // The sweeper's first round after a restart folds the day, a chunk a transaction (the
    // stop lets go of its lease, so the new process takes it at once).
    tasks.terminate(Duration::from_secs(10)).await;
    tasks.start_again().await;
    eventually(Duration::from_secs(60), "the day folded", || async {
        caught_up(&task_db).await
    })
    .await;
    let folded = query(
        &task_db,
        "SELECT count(*) AS minutes, sum(created) AS created FROM task_throughput_minutes",
    )
    .await;
    assert!(
        folded[0]["minutes"].as_i64().unwrap() > 100,
        "the day's minutes are in the rollup: {folded:?}"
    );
    // Events after the fold: the unfolded tail, in a bucket with folded minutes.
    traffic(&tasks, "live", &[true, false]).await;
    traffic(&tasks, "other", &[true]).await;
    let tail = query(
        &task_db,
        "SELECT count(*) AS n FROM task_events
         WHERE at >= (SELECT folded_through FROM task_rollup)",
    )
    .await;
    assert!(tail[0]["n"].as_i64().unwrap() >= 10, "{tail:?}");
    for window in [3600, 86_400] {
        answers_as_the_raw_history(&tasks, &task_db, window).await;
    }
}

/// A transaction that stays open past the end of its minute holds the fold back until it
/// commits, so the event it records in that minute is counted, not lost behind the fold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minute_is_folded_only_once_no_open_transaction_can_still_record_in_it() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let tasks = Service::task_service(
        &task_db,
        &leases.base_url(),
        &[("TASK_SWEEP_INTERVAL_SECONDS", "1")],
    )
    .await;
    let mut open = AsyncPgConnection::establish(&task_db).await.unwrap();
    diesel::sql_query("BEGIN").execute(&mut open).await.unwrap();
    // A create as task-service writes one: the task and its history in one statement.
    diesel::sql_query(
        "WITH moved AS (
             INSERT INTO tasks (task_data, queue, max_attempts) VALUES ('{}', 'late', 3)
             RETURNING id, queue, fence, attempts
         )
         INSERT INTO task_events (at, queue, to_status, task_ids, fences, attempts)
         SELECT now(), queue, 'pending', ARRAY[id], ARRAY[fence], ARRAY[attempts] FROM moved",
    )
    .execute(&mut open)
    .await
    .unwrap();
    let started = query(
        &task_db,
        "SELECT min(xact_start)::text AS at FROM pg_stat_activity
         WHERE datname = current_database() AND xact_start IS NOT NULL
           AND query LIKE 'WITH moved AS (%INSERT INTO tasks%'",
    )
    .await[0]["at"]
        .as_str()
        .unwrap()
        .to_owned();
    // Once the minute after the transaction's has begun, a fold that judged by the clock alone
    // would fold the transaction's minute; wait for two rounds after that.
    eventually(
        Duration::from_secs(150),
        "the minute after the open transaction's",
        || async {
            let rows = query(
                &task_db,
                &format!(
                    "SELECT date_trunc('minute', now() - interval '5 s')
                            > date_trunc('minute', '{started}'::timestamptz) AS past"
                ),
            )
            .await;
            rows[0]["past"].as_bool().unwrap()
        },
    )
    .await;
    let rounds = metric_sum(&tasks.metrics().await, "task_retention_runs_total");
    eventually(
        Duration::from_secs(30),
        "two more sweeper rounds",
        || async {
            metric_sum(&tasks.metrics().await, "task_retention_runs_total") >= rounds + 2.0
        },
    )
    .await;
    let held = query(
        &task_db,
        &format!(
            "SELECT folded_through <= '{started}'::timestamptz AS held, folded_through::text
             FROM task_rollup"
        ),
    )
    .await;
    assert_eq!(
        held[0]["held"],
        json!(true),
        "{held:?} (open since {started})"
    );

    diesel::sql_query("COMMIT")
        .execute(&mut open)
        .await
        .unwrap();
    eventually(
        Duration::from_secs(30),
        "the fold past the commit",
        || async {
            let rows = query(
                &task_db,
                &format!(
                    "SELECT folded_through > '{started}'::timestamptz AS past FROM task_rollup"
                ),
            )
            .await;
            rows[0]["past"] == json!(true)
        },
    )
    .await;
    let answer = answers_as_the_raw_history(&tasks, &task_db, 3600).await;
    let created: i64 = answer["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["created"].as_i64().unwrap())
        .sum();
    assert_eq!(
        created, 1,
        "the late transaction's task is counted: {answer}"
    );
}
