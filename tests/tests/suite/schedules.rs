//! Periodic tasks against real task-service processes on one database: every tick makes exactly
//! one task however many replicas run and whichever of them is killed, frozen or restarted;
//! ticks missed while every replica was down make one task or none, as the schedule says, never
//! one each; a paused schedule makes nothing and resumes from its next tick; and the API
//! refuses bad definitions without writing anything.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::{Value, json};
use tests::{Service, eventually, fresh_database, metric_sum, query, snapshot};

/// How long any awaited condition may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(90);

async fn schedule_of(replica: &Service, name: &str) -> Value {
    let answer = replica.get(&format!("/api/schedules/{name}")).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    answer.body
}

/// The ticks that made tasks in `queue` (seconds since the epoch), oldest first, each with the
/// number of history entries that record its task's creation.
async fn ticks(task_db: &str, queue: &str) -> Vec<(f64, i64)> {
    query(
        task_db,
        &format!(
            "SELECT extract(epoch FROM t.scheduled_at)::float8 AS at,
                    (SELECT count(*) FROM task_transitions e
                      WHERE e.task_id = t.id AND e.from_status IS NULL) AS created
             FROM tasks t WHERE t.queue = '{queue}' ORDER BY t.scheduled_at, t.id"
        ),
    )
    .await
    .into_iter()
    .map(|row| {
        (
            row["at"].as_f64().unwrap(),
            row["created"].as_i64().unwrap(),
        )
    })
    .collect()
}

/// The database's clock, in seconds since the epoch.
async fn db_clock(task_db: &str) -> f64 {
    query(
        task_db,
        "SELECT extract(epoch FROM clock_timestamp())::float8 AS now",
    )
    .await[0]["now"]
        .as_f64()
        .unwrap()
}

/// Waits until the database's clock reads `at` or later: outages are measured on the clock the
/// ticks use, whatever this host's.
async fn until_db_clock(task_db: &str, at: f64) {
    eventually(PATIENCE, "the database clock to advance", || async {
        db_clock(task_db).await >= at
    })
    .await;
}

async fn await_ticks(task_db: &str, queue: &str, at_least: usize) {
    eventually(
        PATIENCE,
        &format!("{at_least} ticks in {queue}"),
        || async { ticks(task_db, queue).await.len() >= at_least },
    )
    .await;
}

/// Every tick from the first to the last made exactly one task, recorded created once.
fn assert_every_tick_once(ticks: &[(f64, i64)]) {
    assert!(ticks.len() > 1, "{ticks:?}");
    for (at, created) in ticks {
        assert_eq!(at.fract(), 0.0, "a tick falls on a whole second: {at}");
        assert_eq!(*created, 1, "the task of tick {at} was created once");
    }
    for pair in ticks.windows(2) {
        assert_eq!(
            pair[1].0 - pair[0].0,
            1.0,
            "consecutive ticks, none missed or doubled: {} then {}",
            pair[0].0,
            pair[1].0
        );
    }
}

#[tokio::test]
async fn every_tick_makes_exactly_one_task_across_three_replicas_killed_frozen_and_restarted() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(Service::task_service(&task_db, &leases.base_url(), &[]).await);
    }
    let created = replicas[0]
        .post(
            "/api/schedules",
            &json!({"name": "each-second", "cron": "* * * * * *", "queue": "ticks",
                    "task_data": {"sleep_duration_seconds": 0}}),
        )
        .await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    await_ticks(&task_db, "ticks", 2).await;

    // Each replica in turn killed with -9, and restarted once the others made ticks without it.
    for round in 0..6 {
        let victim = round % 3;
        replicas[victim].kill();
        let before = ticks(&task_db, "ticks").await.len();
        await_ticks(&task_db, "ticks", before + 2).await;
        replicas[victim].start_again().await;
    }
    // One frozen (SIGSTOP) while the others go on; whatever it held is given up.
    replicas[1].pause();
    let before = ticks(&task_db, "ticks").await.len();
    await_ticks(&task_db, "ticks", before + 3).await;
    replicas[1].resume();
    // All three down at once, for less than the misfire grace: the ticks of the outage are late,
    // not missed, and each makes its task once a replica is back.
    for replica in &mut replicas {
        replica.kill();
    }
    until_db_clock(&task_db, db_clock(&task_db).await + 3.0).await;
    for replica in &mut replicas {
        replica.start_again().await;
    }
    let before = ticks(&task_db, "ticks").await.len();
    await_ticks(&task_db, "ticks", before + 5).await;

    let paused = replicas[2]
        .send_as(None, "POST", "/api/schedules/each-second/pause", None)
        .await;
    assert_eq!(paused.status, 200, "{:?}", paused.body);
    let made = ticks(&task_db, "ticks").await;
    assert_every_tick_once(&made);
    let schedule = schedule_of(&replicas[0], "each-second").await;
    let last_task = replicas[0]
        .get(&format!("/api/tasks/{}", schedule["lastTaskId"]))
        .await;
    assert_eq!(last_task.body["task"]["queue"], "ticks", "{schedule:?}");
    let made_by: f64 = {
        let mut sum = 0.0;
        for replica in &replicas {
            sum += metric_sum(
                &replica.metrics().await,
                "schedule_ticks_total{outcome=\"created\"",
            );
        }
        sum
    };
    assert!(made_by >= 5.0, "the restarted replicas count their ticks");
}

#[tokio::test]
async fn ticks_missed_while_every_replica_was_down_make_one_task_or_none_never_one_each() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let mut replica = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    for catch_up in ["one", "none"] {
        let created = replica
            .post(
                "/api/schedules",
                &json!({"name": catch_up, "cron": "* * * * * *", "queue": catch_up,
                        "catch_up": catch_up, "misfire_grace_seconds": 1, "task_data": {}}),
            )
            .await;
        assert_eq!(created.status, 201, "{:?}", created.body);
    }
    await_ticks(&task_db, "one", 2).await;
    await_ticks(&task_db, "none", 2).await;

    replica.kill();
    // The last ticks made before the outage: a kill -9 commits nothing more.
    let last_before = |queue: &'static str| {
        let task_db = task_db.clone();
        async move { ticks(&task_db, queue).await.last().unwrap().0 }
    };
    let (one_before, none_before) = (last_before("one").await, last_before("none").await);
    // Down for at least eight ticks, far past the grace of one second.
    until_db_clock(&task_db, one_before.max(none_before) + 8.0).await;
    replica.start_again().await;
    await_ticks(&task_db, "one", ticks(&task_db, "one").await.len() + 2).await;
    await_ticks(&task_db, "none", ticks(&task_db, "none").await.len() + 2).await;

    for (queue, before, catch_ups) in [("one", one_before, 1), ("none", none_before, 0)] {
        // The first round after the restart judged every tick older than its `now()` less the
        // grace as missed; its tasks were all created at that `now()`.
        let first_round = query(
            &task_db,
            &format!(
                "SELECT extract(epoch FROM min(created_at))::float8 AS at FROM tasks
                 WHERE queue = '{queue}' AND scheduled_at > to_timestamp({before})"
            ),
        )
        .await[0]["at"]
            .as_f64()
            .unwrap();
        let cutoff = first_round - 1.0;
        let missed = (cutoff.ceil() - before - 1.0) as i64;
        assert!(missed >= 5, "{queue}: {missed} ticks were missed");
        let made = ticks(&task_db, queue).await;
        let during: Vec<f64> = made
            .iter()
            .map(|(at, _)| *at)
            .filter(|at| *at > before && *at < cutoff)
            .collect();
        assert_eq!(
            during.len(),
            catch_ups,
            "{queue}: of {missed} missed ticks, these made tasks: {during:?}"
        );
        if catch_ups == 1 {
            assert_eq!(
                during[0],
                cutoff.ceil() - 1.0,
                "the one task is for the latest missed tick"
            );
        }
        // After the outage every tick makes its task again, on time.
        let after: Vec<(f64, i64)> = made.into_iter().filter(|(at, _)| *at >= cutoff).collect();
        assert_every_tick_once(&after);
    }
    let metrics = replica.metrics().await;
    assert_eq!(
        metric_sum(
            &metrics,
            "schedule_ticks_total{outcome=\"caught_up\",schedule=\"one\"}"
        ),
        1.0,
        "{metrics}"
    );
    assert!(
        metric_sum(
            &metrics,
            "schedule_ticks_total{outcome=\"skipped\",schedule=\"none\"}"
        ) >= 5.0
    );
}

#[tokio::test]
async fn a_paused_schedule_makes_nothing_and_resumes_from_its_next_tick() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    let put = tasks
        .put(
            "/api/schedules/beat",
            &json!({"cron": "* * * * * *", "queue": "beat", "task_data": {"n": 1},
                    "concurrency_key": "acme"}),
        )
        .await;
    assert_eq!(put.status, 201, "{:?}", put.body);
    assert_eq!(put.body["concurrencyKey"], "acme");
    await_ticks(&task_db, "beat", 2).await;
    let keys = tests::query(
        &task_db,
        "SELECT DISTINCT concurrency_key FROM tasks WHERE queue = 'beat'",
    )
    .await;
    assert_eq!(
        keys,
        [json!({"concurrency_key": "acme"})],
        "its tasks carry its key"
    );

    let paused = tasks
        .send_as(None, "POST", "/api/schedules/beat/pause", None)
        .await;
    assert_eq!(paused.status, 200, "{:?}", paused.body);
    assert_eq!(paused.body["paused"], true);
    assert_eq!(paused.body["nextTickAt"], Value::Null);
    let made = ticks(&task_db, "beat").await;
    let paused_at = db_clock(&task_db).await;
    until_db_clock(&task_db, paused_at + 3.0).await;
    assert_eq!(ticks(&task_db, "beat").await, made, "nothing while paused");

    let resumed = tasks
        .send_as(None, "POST", "/api/schedules/beat/resume", None)
        .await;
    assert_eq!(resumed.status, 200, "{:?}", resumed.body);
    assert_eq!(resumed.body["paused"], false);
    let resumed_at = db_clock(&task_db).await;
    await_ticks(&task_db, "beat", made.len() + 2).await;
    let last_before = made.last().unwrap().0;
    let gap: Vec<f64> = ticks(&task_db, "beat")
        .await
        .into_iter()
        .map(|(at, _)| at)
        .filter(|at| *at > last_before && *at < resumed_at - 1.0)
        .collect();
    assert!(
        gap.is_empty(),
        "ticks while paused are not caught up: {gap:?}"
    );

    // Replacing the definition with the same cron keeps the next tick; a new one moves it.
    let same = tasks
        .put(
            "/api/schedules/beat",
            &json!({"cron": "* * * * * *", "queue": "beat", "task_data": {"n": 2}}),
        )
        .await;
    assert_eq!(same.status, 200, "{:?}", same.body);
    assert_eq!(same.body["taskData"], json!({"n": 2}));
    let hourly = tasks
        .put(
            "/api/schedules/beat",
            &json!({"cron": "0 * * * *", "queue": "beat", "task_data": {}}),
        )
        .await;
    assert_eq!(hourly.status, 200);
    let next = hourly.body["nextTickAt"].as_str().unwrap();
    assert!(next.contains(":00:00"), "on the hour: {next}");

    let deleted = tasks.delete("/api/schedules/beat", &json!({})).await;
    assert_eq!(deleted.status, 200, "{:?}", deleted.body);
    assert_eq!(
        tasks.get("/api/schedules/beat").await.code(),
        "schedule_not_found"
    );
    assert!(
        !ticks(&task_db, "beat").await.is_empty(),
        "a deleted schedule's tasks stay"
    );
}

#[tokio::test]
async fn schedules_are_listed_and_bad_definitions_are_refused_without_a_write() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    let nightly = json!({"name": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Paris",
                         "task_data": {"report": true}, "queue": "reports", "priority": 5,
                         "max_attempts": 2, "catch_up": "none"});
    let created = tasks.post("/api/schedules", &nightly).await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    let body = &created.body;
    assert_eq!(
        (
            &body["timezone"],
            &body["queue"],
            &body["priority"],
            &body["catchUp"]
        ),
        (
            &json!("Europe/Paris"),
            &json!("reports"),
            &json!(5),
            &json!("none")
        )
    );
    assert_eq!(body["misfireGraceSeconds"], 60, "the default grace");
    let next = body["nextTickAt"].as_str().unwrap();
    // 03:00 in Paris is 01:00 or 02:00 UTC, by the season.
    assert!(
        next.contains("T01:00:00") || next.contains("T02:00:00"),
        "{next}"
    );
    let again = tasks.post("/api/schedules", &nightly).await;
    assert_eq!((again.status, again.code()), (409, "schedule_exists"));
    let listed = tasks.get("/api/schedules").await;
    assert_eq!(listed.body["schedules"].as_array().unwrap().len(), 1);
    assert_eq!(listed.body["schedules"][0]["name"], "nightly");

    let before = snapshot(&task_db, "schedules").await;
    let base = json!({"name": "x", "cron": "* * * * *", "task_data": {}});
    let refusals: Vec<(Value, &str)> = vec![
        (json!({"cron": "61 * * * *"}), "invalid_cron"),
        (json!({"cron": "not cron"}), "invalid_cron"),
        (json!({"cron": "0 0 30 2 *"}), "invalid_cron"),
        (json!({"timezone": "Mars/Olympus"}), "invalid_timezone"),
        (json!({"misfire_grace_seconds": 0}), "invalid_field"),
        (json!({"misfire_grace_seconds": -5}), "invalid_field"),
        (json!({"catch_up": "all"}), "invalid_field"),
        (json!({"task_data": [1]}), "invalid_field"),
        (json!({"max_attempts": 0}), "invalid_field"),
        (json!({"queue": ""}), "invalid_field"),
        (json!({"name": ""}), "invalid_field"),
        (json!({"concurrency_key": ""}), "invalid_field"),
        // A task's fields a schedule does not take are refused, not dropped.
        (json!({"idempotency_key": "k"}), "invalid_field"),
        (
            json!({"scheduled_at": "2026-01-01T00:00:00Z"}),
            "invalid_field",
        ),
        (json!({"extra": {"a": 1}}), "invalid_field"),
        (json!({"name": null}), "invalid_field"),
    ];
    for (change, code) in refusals {
        let mut body = base.clone();
        for (key, value) in change.as_object().unwrap() {
            body[key] = value.clone();
        }
        let answer = tasks.post("/api/schedules", &body).await;
        assert_eq!(
            (answer.status, answer.code()),
            (400, code),
            "{body}: {:?}",
            answer.body
        );
        assert!(answer.body["error"].is_string());
    }
    let put = tasks
        .put(
            "/api/schedules/x",
            &json!({"cron": "* * * *", "task_data": {}}),
        )
        .await;
    assert_eq!((put.status, put.code()), (400, "invalid_cron"));
    // A body naming another schedule than the path is refused, not written under the path's.
    let put = tasks
        .put(
            "/api/schedules/a",
            &json!({"name": "b", "cron": "* * * * *", "task_data": {}}),
        )
        .await;
    assert_eq!(
        (put.status, put.code()),
        (400, "name_mismatch"),
        "{:?}",
        put.body
    );
    let put = tasks
        .put(
            "/api/schedules/a",
            &json!({"cron": "* * * * *", "task_data": {}, "scheduled_at": "2026-01-01T00:00:00Z"}),
        )
        .await;
    assert_eq!(
        (put.status, put.code()),
        (400, "invalid_field"),
        "{:?}",
        put.body
    );
    assert_eq!(
        before,
        snapshot(&task_db, "schedules").await,
        "nothing written"
    );
    for path in ["/api/schedules/ghost/pause", "/api/schedules/ghost/resume"] {
        let answer = tasks.send_as(None, "POST", path, None).await;
        assert_eq!((answer.status, answer.code()), (404, "schedule_not_found"));
    }
    let gone = tasks.delete("/api/schedules/ghost", &json!({})).await;
    assert_eq!((gone.status, gone.code()), (404, "schedule_not_found"));

    // The body may name the path's own schedule.
    let same = json!({"name": "a", "cron": "* * * * *", "task_data": {}});
    let put = tasks.put("/api/schedules/a", &same).await;
    assert_eq!(put.status, 201, "{:?}", put.body);
}
