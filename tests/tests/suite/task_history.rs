//! A task's history is written by the statement that moves it, one row per group of tasks that
//! moved alike, never by a trigger per row: a batch's create, claim and completion are one row
//! each, a heartbeat writes nothing, and an upgraded database's history reads as it did.
#![allow(clippy::unwrap_used)]

use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use serde_json::{Value, json};
use tests::{Service, fresh_database, query};

/// The history rows written since `after` (an id), oldest first.
async fn history_since(task_db: &str, after: i64) -> Vec<Value> {
    query(
        task_db,
        &format!(
            "SELECT id, from_status, to_status, claimants, claimant_of, queue, charged,
                    array_to_json(task_ids) AS task_ids, array_to_json(fences) AS fences,
                    array_to_json(attempts) AS attempts, array_to_json(pickup_ms) AS pickup_ms
             FROM task_events WHERE id > {after} ORDER BY id"
        ),
    )
    .await
}

fn last_id(rows: &[Value], before: i64) -> i64 {
    rows.last()
        .map_or(before, |row| row["id"].as_i64().unwrap())
}

fn sorted(ids: &Value) -> Vec<i64> {
    let mut ids: Vec<i64> = ids
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_i64().unwrap())
        .collect();
    ids.sort_unstable();
    ids
}

#[tokio::test]
async fn each_transition_of_a_group_writes_one_history_row_naming_its_tasks() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;

    // No trigger on tasks writes history: the transitions' statements do.
    let writers = query(
        &task_db,
        "SELECT count(*) AS n FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
         WHERE t.tgrelid = 'tasks'::regclass AND p.prosrc ILIKE '%task_events%'",
    )
    .await;
    assert_eq!(
        writers[0]["n"], 0,
        "a trigger on tasks still writes history"
    );

    // A batch of five: one create row.
    let items: Vec<Value> = (0..5).map(|i| json!({"task_data": {"n": i}})).collect();
    let created = tasks
        .post("/api/tasks/batch", &json!({ "tasks": items }))
        .await;
    assert_eq!(created.status, 200, "{:?}", created.body);
    let rows = history_since(&task_db, 0).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["from_status"], Value::Null);
    assert_eq!(rows[0]["to_status"], "pending");
    assert_eq!(rows[0]["queue"], "default");
    let ids = sorted(&rows[0]["task_ids"]);
    assert_eq!(ids.len(), 5);
    let mut seen = last_id(&rows, 0);

    // One claim of all five for one worker: one row, with each task's fence in its place and a
    // pickup for each (never claimed before).
    let claimed = tasks
        .post("/api/tasks/next", &json!({"processor": "w", "limit": 5}))
        .await;
    assert_eq!(claimed.status, 202, "{:?}", claimed.body);
    let claimed = claimed.body.as_array().unwrap().clone();
    assert_eq!(claimed.len(), 5);
    let rows = history_since(&task_db, seen).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let claim = &rows[0];
    assert_eq!(
        (
            &claim["from_status"],
            &claim["to_status"],
            &claim["claimants"],
            &claim["claimant_of"]
        ),
        (
            &json!("pending"),
            &json!("running"),
            &json!(["w"]),
            &Value::Null
        )
    );
    assert_eq!(sorted(&claim["task_ids"]), ids);
    for (place, id) in claim["task_ids"].as_array().unwrap().iter().enumerate() {
        let task = claimed.iter().find(|t| &t["id"] == id).unwrap();
        assert_eq!(claim["fences"][place], task["fence"], "{claim}");
        assert_eq!(claim["attempts"][place], 1, "{claim}");
        assert!(
            claim["pickup_ms"][place].as_f64().unwrap() >= 0.0,
            "{claim}"
        );
    }
    seen = last_id(&rows, seen);

    // A heartbeat moves nothing and records nothing.
    let first = &claimed[0];
    let beat = tasks
        .put(
            &format!("/api/tasks/{}/heartbeat", first["id"]),
            &json!({"processor": "w", "fence": first["fence"]}),
        )
        .await;
    assert_eq!(beat.status, 202, "{:?}", beat.body);
    assert_eq!(history_since(&task_db, seen).await, Vec::<Value>::new());

    // Three completions in one request: one row. A failure charges its attempt; a snooze hands
    // it back; both are running → pending, told apart by `charged`.
    let done: Vec<Value> = claimed[..3]
        .iter()
        .map(|t| json!({"id": t["id"], "fence": t["fence"], "task_output": {}}))
        .collect();
    let completed = tasks
        .put(
            "/api/tasks/complete",
            &json!({"processor": "w", "tasks": done}),
        )
        .await;
    assert_eq!(completed.status, 200, "{:?}", completed.body);
    let rows = history_since(&task_db, seen).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (&rows[0]["from_status"], &rows[0]["to_status"]),
        (&json!("running"), &json!("succeeded"))
    );
    assert_eq!(rows[0]["task_ids"].as_array().unwrap().len(), 3);
    seen = last_id(&rows, seen);

    let (failing, snoozing) = (&claimed[3], &claimed[4]);
    let failed = tasks
        .put(
            &format!("/api/tasks/{}/fail", failing["id"]),
            &json!({"processor": "w", "fence": failing["fence"], "error": "boom"}),
        )
        .await;
    assert_eq!(failed.status, 202, "{:?}", failed.body);
    let snoozed = tasks
        .put(
            &format!("/api/tasks/{}/snooze", snoozing["id"]),
            &json!({"processor": "w", "fence": snoozing["fence"], "seconds": 3600}),
        )
        .await;
    assert_eq!(snoozed.status, 202, "{:?}", snoozed.body);
    let rows = history_since(&task_db, seen).await;
    let moves: Vec<(Value, Value, Value, Value)> = rows
        .iter()
        .map(|r| {
            (
                r["task_ids"][0].clone(),
                r["from_status"].clone(),
                r["to_status"].clone(),
                r["charged"].clone(),
            )
        })
        .collect();
    assert_eq!(
        moves,
        vec![
            (
                failing["id"].clone(),
                json!("running"),
                json!("pending"),
                json!(true)
            ),
            (
                snoozing["id"].clone(),
                json!("running"),
                json!("pending"),
                json!(false)
            ),
        ]
    );

    // The task's own history, through the API, from the group rows.
    let events = tasks
        .get(&format!("/api/tasks/{}/events", failing["id"]))
        .await;
    assert_eq!(events.status, 200, "{:?}", events.body);
    let path: Vec<(Value, Value, Value)> = events.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["fromStatus"].clone(),
                e["toStatus"].clone(),
                e["fence"].clone(),
            )
        })
        .collect();
    assert_eq!(
        path,
        vec![
            (Value::Null, json!("pending"), Value::Null),
            (json!("pending"), json!("running"), failing["fence"].clone()),
            (json!("running"), json!("pending"), failing["fence"].clone()),
        ],
        "{:?}",
        events.body
    );
}

/// The per-task history, through the API, of every task of `task_db`.
async fn every_tasks_history(tasks: &Service, ids: &[i64]) -> Vec<Value> {
    let mut all = Vec::new();
    for id in ids {
        let answer = tasks.get(&format!("/api/tasks/{id}/events")).await;
        assert_eq!(answer.status, 200, "{:?}", answer.body);
        all.push(answer.body["events"].clone());
    }
    all
}

#[tokio::test]
async fn a_database_upgraded_from_per_row_history_answers_as_before() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    task_service::migrate(&task_db).await.unwrap();
    let leases = Service::lease_service(&lease_db, &[]).await;

    // A life for tasks in every status, made by the release before (its history by trigger):
    // the migration is reverted, the service's work replayed by SQL as that release's
    // statements made it, and the database upgraded again.
    tests::revert_tasks_schema(&task_db, "2026-11-27-000116_task_history_per_statement").await;
    let mut conn = AsyncPgConnection::establish(&task_db).await.unwrap();
    conn.batch_execute(
        "INSERT INTO tasks (task_data, queue, max_attempts, requested_scheduled_at)
         SELECT '{}', 'q' || (g % 2), 3, now() FROM generate_series(1, 6) g;
         UPDATE tasks SET status = 'running', processor = 'w', fence = id, attempts = 1,
                started_at = now(), must_heartbeat_before = now() + interval '1 hour'
          WHERE id <= 5;
         UPDATE tasks SET status = 'succeeded', processed_at = now() WHERE id = 1;
         UPDATE tasks SET status = 'dead', processed_at = now(), last_error = 'boom' WHERE id = 2;
         UPDATE tasks SET status = 'cancelled', processed_at = now() WHERE id = 3;
         -- Failed (charged) and snoozed (handed back): both back to pending.
         UPDATE tasks SET status = 'pending', processor = NULL, must_heartbeat_before = NULL
          WHERE id = 4;
         UPDATE tasks SET status = 'pending', processor = NULL, must_heartbeat_before = NULL,
                attempts = 0
          WHERE id = 5;
         -- A task deleted since: its history stays, without a queue.
         INSERT INTO tasks (id, task_data, max_attempts) VALUES (100, '{}', 3);
         DELETE FROM tasks WHERE id = 100;",
    )
    .await
    .unwrap();
    let before_rows = query(
        &task_db,
        "SELECT task_id, from_status, to_status, processor, fence, attempts
         FROM task_events ORDER BY id",
    )
    .await;
    // Seven creates, five claims, five moves on.
    assert_eq!(before_rows.len(), 7 + 5 + 5, "{before_rows:?}");
    task_service::migrate(&task_db).await.unwrap();

    // The same transitions, in the same order, one row each.
    let after_rows = query(
        &task_db,
        "SELECT task_id, from_status, to_status, processor, fence, attempts
         FROM task_transitions ORDER BY id, ord",
    )
    .await;
    assert_eq!(after_rows, before_rows);
    // What the charts used to derive from the event before: the first claims' pickups, and
    // which return to pending charged its attempt.
    let derived = query(
        &task_db,
        "SELECT task_id, charged, pickup_ms IS NOT NULL AS pickup, queue
         FROM task_transitions WHERE to_status IN ('running', 'pending') AND from_status IS NOT NULL
         ORDER BY id",
    )
    .await;
    let derived: Vec<(i64, bool, bool)> = derived
        .iter()
        .map(|r| {
            (
                r["task_id"].as_i64().unwrap(),
                r["charged"].as_bool().unwrap(),
                r["pickup"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        derived,
        vec![
            (1, true, true),
            (2, true, true),
            (3, true, true),
            (4, true, true),
            (5, true, true),
            (4, true, false),
            (5, false, false),
        ]
    );
    let gone = query(
        &task_db,
        "SELECT queue FROM task_transitions WHERE task_id = 100",
    )
    .await;
    assert_eq!(gone, vec![json!({"queue": null})]);

    // The service reads the upgraded history, and writes the new shape beside it.
    let tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    let ids: Vec<i64> = (1..=6).collect();
    let histories = every_tasks_history(&tasks, &ids).await;
    for (id, history) in ids.iter().zip(&histories) {
        let expected = before_rows.iter().filter(|r| r["task_id"] == *id).count();
        assert_eq!(
            history.as_array().unwrap().len(),
            expected,
            "{id}: {history}"
        );
    }
    let chart = tasks
        .get("/api/dashboard/throughput?window_seconds=3600")
        .await;
    assert_eq!(chart.status, 200, "{:?}", chart.body);
    let sum = |field: &str| -> i64 {
        chart.body["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b[field].as_i64().unwrap())
            .sum()
    };
    assert_eq!(
        (
            sum("created"),
            sum("started"),
            sum("succeeded"),
            sum("failed")
        ),
        (7, 5, 1, 2),
        "{:?}",
        chart.body
    );
    let claimed = tasks
        .post("/api/tasks/next", &json!({"processor": "w2", "limit": 5}))
        .await;
    assert_eq!(claimed.status, 202, "{:?}", claimed.body);
    assert_eq!(claimed.body.as_array().unwrap().len(), 3);
    // The claim took the three pending tasks of both queues: a row per queue.
    let rows = query(
        &task_db,
        "SELECT queue, cardinality(task_ids) AS n FROM task_events
         WHERE claimants = ARRAY['w2'] ORDER BY queue",
    )
    .await;
    assert_eq!(
        rows,
        vec![
            json!({"queue": "q0", "n": 2}),
            json!({"queue": "q1", "n": 1})
        ]
    );
}

/// One statement that moves several claimants' tasks alike writes one row, naming each
/// claimant once and each task's by its place; the per-task view, the task's own history and a
/// database taken back to a row per claimant all answer as a row per claimant did.
#[tokio::test]
async fn a_group_of_several_claimants_is_one_row_naming_each_tasks_claimant() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;

    // Three tasks die under two workers: w2 claims the first two, w1 the last.
    let items: Vec<Value> = (0..3)
        .map(|i| json!({"task_data": {"n": i}, "max_attempts": 1}))
        .collect();
    let created = tasks
        .post("/api/tasks/batch", &json!({ "tasks": items }))
        .await;
    assert_eq!(created.status, 200, "{:?}", created.body);
    for (processor, limit) in [("w2", 2), ("w1", 1)] {
        let claimed = tasks
            .post(
                "/api/tasks/next",
                &json!({"processor": processor, "limit": limit}),
            )
            .await;
        assert_eq!(claimed.status, 202, "{:?}", claimed.body);
        for task in claimed.body.as_array().unwrap() {
            let failed = tasks
                .put(
                    &format!("/api/tasks/{}/fail", task["id"]),
                    &json!({"processor": processor, "fence": task["fence"], "error": "boom"}),
                )
                .await;
            assert_eq!(failed.status, 202, "{:?}", failed.body);
            assert_eq!(failed.body["status"], "dead", "{:?}", failed.body);
        }
    }
    let seen = last_id(&history_since(&task_db, 0).await, 0);

    // One retry of all three: the dead tasks keep their last processor, so the statement moves
    // two claimants' tasks alike. One row; w1 first (claimants in name order), the tasks in id
    // order.
    let retried = tasks
        .post("/api/tasks/retry", &json!({"status": "dead"}))
        .await;
    assert_eq!(retried.status, 200, "{:?}", retried.body);
    assert_eq!(retried.body["touched"], 3, "{:?}", retried.body);
    let rows = history_since(&task_db, seen).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (
            &rows[0]["from_status"],
            &rows[0]["to_status"],
            &rows[0]["claimants"],
            &rows[0]["claimant_of"],
            &rows[0]["task_ids"]
        ),
        (
            &json!("dead"),
            &json!("pending"),
            &json!(["w1", "w2"]),
            &json!([2, 2, 1]),
            &json!([1, 2, 3])
        )
    );

    // Each task's transitions, as the checker and the charts read them.
    let transitions = "SELECT task_id, from_status, to_status, processor, fence, attempts,
                              lease_resource
                       FROM task_transitions ORDER BY task_id, at, from_status NULLS FIRST";
    let before = query(&task_db, transitions).await;
    let retries: Vec<(i64, String)> = before
        .iter()
        .filter(|t| t["from_status"] == "dead")
        .map(|t| {
            (
                t["task_id"].as_i64().unwrap(),
                t["processor"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        retries,
        vec![(1, "w2".into()), (2, "w2".into()), (3, "w1".into())]
    );
    // And each task's own history, through the API.
    for (id, processor) in [(1, "w2"), (3, "w1")] {
        let events = tasks.get(&format!("/api/tasks/{id}/events")).await;
        assert_eq!(events.status, 200, "{:?}", events.body);
        let last = events.body["events"].as_array().unwrap().last().unwrap();
        assert_eq!(
            (&last["fromStatus"], &last["processor"]),
            (&json!("dead"), &json!(processor)),
            "{:?}",
            events.body
        );
    }

    // Taken back to a row per claimant, and upgraded again: the same transitions.
    drop(tasks);
    tests::revert_tasks_schema(&task_db, "2026-11-28-000120_history_rows_across_claimants").await;
    let per_claimant = query(
        &task_db,
        "SELECT processor, array_to_json(task_ids) AS task_ids FROM task_events
         WHERE from_status = 'dead' ORDER BY processor",
    )
    .await;
    assert_eq!(
        per_claimant,
        vec![
            json!({"processor": "w1", "task_ids": [3]}),
            json!({"processor": "w2", "task_ids": [1, 2]})
        ]
    );
    assert_eq!(query(&task_db, transitions).await, before);
    task_service::migrate(&task_db).await.unwrap();
    assert_eq!(query(&task_db, transitions).await, before);
}

/// Issue 48: a history row names tasks of one band of 256 ids, found by its first id, where a GIN
/// index took an entry per task. A database whose rows span bands (as every release before wrote
/// them: one row per group, whatever its ids) is cut by band on upgrade, and every task's
/// history reads back exactly, in its order, through SQL and the API; rows written after are
/// cut as they are written.
#[tokio::test]
async fn history_rows_spanning_id_bands_are_cut_on_upgrade_and_every_task_reads_as_before() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    // 600 tasks over three bands.
    let items: Vec<Value> = (0..600).map(|i| json!({"task_data": {"n": i}})).collect();
    let created = tasks
        .post("/api/tasks/batch", &json!({ "tasks": items }))
        .await;
    assert_eq!(created.status, 200, "{:?}", created.body);
    // The schema before (a task-service would migrate it again as it starts).
    drop(tasks);
    tests::revert_tasks_schema(&task_db, "2026-12-07-000122_history_by_id_band").await;

    // Rows as the releases before wrote them, one per group whatever its ids: one naming all
    // 600 (a bulk move, one claimant), one naming every third with two claimants, their leases
    // and pickups, and a later one naming the first 300.
    tests::execute(
        &task_db,
        "INSERT INTO task_events (at, queue, from_status, to_status, charged, claimants,
                                  task_ids, fences, attempts)
         SELECT now(), 'default', 'pending', 'pending', false, ARRAY['mover'],
                array_agg(id ORDER BY id), array_agg(id * 10 ORDER BY id),
                array_agg(0 ORDER BY id)
         FROM tasks",
    )
    .await;
    tests::execute(
        &task_db,
        "INSERT INTO task_events (at, queue, from_status, to_status, charged, claimants,
                                  claimant_leases, claimant_of, task_ids, fences, attempts,
                                  lease_fences, pickup_ms)
         SELECT now(), 'default', 'pending', 'running', true, ARRAY['w1', 'w2'],
                ARRAY['worker:a', 'worker:b'], array_agg(1 + (id % 2)::int ORDER BY id),
                array_agg(id ORDER BY id), array_agg(1::bigint ORDER BY id),
                array_agg(1 ORDER BY id), array_agg(id + 7 ORDER BY id),
                array_agg(id * 1.5 ORDER BY id)
         FROM tasks WHERE id % 3 = 0",
    )
    .await;
    tests::execute(
        &task_db,
        "INSERT INTO task_events (at, queue, from_status, to_status, charged, claimants,
                                  task_ids, fences, attempts)
         SELECT now(), 'default', 'running', 'pending', false, ARRAY['late'],
                array_agg(id ORDER BY id), array_agg(2::bigint ORDER BY id),
                array_agg(1 ORDER BY id)
         FROM tasks WHERE id <= 300",
    )
    .await;
    assert_eq!(spanning_bands(&task_db).await, 3, "the old rows span bands");

    let transitions = "SELECT task_id, from_status, to_status, processor, charged, fence,
                              attempts, lease_fence, lease_resource, pickup_ms, at::text AS at
                       FROM task_transitions ORDER BY task_id, id, ord";
    let before = query(&task_db, transitions).await;
    assert_eq!(before.len(), 600 + 600 + 200 + 300);
    task_service::migrate(&task_db).await.unwrap();
    assert_eq!(query(&task_db, transitions).await, before);
    assert_eq!(
        spanning_bands(&task_db).await,
        0,
        "every row is of one band"
    );
    let gin = query(
        &task_db,
        "SELECT count(*) AS n FROM pg_indexes
         WHERE tablename = 'task_events' AND indexdef ILIKE '%gin%'",
    )
    .await;
    assert_eq!(gin[0]["n"], 0, "the GIN index is gone");

    // Through the API, at each band's edges: the task's transitions in order.
    let tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    for id in [1_i64, 255, 256, 257, 300, 301, 511, 512, 599, 600] {
        let expected: Vec<Value> = before
            .iter()
            .filter(|t| t["task_id"] == id)
            .map(|t| json!([t["from_status"], t["to_status"], t["processor"], t["fence"]]))
            .collect();
        let events = tasks.get(&format!("/api/tasks/{id}/events")).await;
        assert_eq!(events.status, 200, "{:?}", events.body);
        let read: Vec<Value> = events.body["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| json!([e["fromStatus"], e["toStatus"], e["processor"], e["fence"]]))
            .collect();
        assert_eq!(read, expected, "task {id}");
        assert!(read.len() >= 2, "task {id}: {read:?}");
    }

    // What is written from now on is cut as it is written: claims across a band's edge.
    claim_hundreds(&tasks, "later", 3).await;
    let rows = query(
        &task_db,
        "SELECT array_to_json(task_ids) AS ids FROM task_events
         WHERE claimants = ARRAY['later'] ORDER BY id",
    )
    .await;
    assert!(rows.len() >= 2, "{rows:?}");
    for row in &rows {
        let ids = sorted(&row["ids"]);
        assert_eq!(ids[0] / 256, ids[ids.len() - 1] / 256, "{ids:?}");
    }
    let events = tasks.get("/api/tasks/256/events").await;
    assert_eq!(
        events.body["events"].as_array().unwrap().last().unwrap()["processor"],
        "later",
        "{:?}",
        events.body
    );
}

/// `times` claims of 100 tasks each by `processor`, each answered in full.
async fn claim_hundreds(tasks: &Service, processor: &str, times: usize) {
    for _ in 0..times {
        let claimed = tasks
            .post(
                "/api/tasks/next",
                &json!({"processor": processor, "limit": 100}),
            )
            .await;
        assert_eq!(claimed.status, 202, "{:?}", claimed.body);
        assert_eq!(claimed.body.as_array().unwrap().len(), 100);
    }
}

/// How many history rows name tasks of more than one band of 256 ids.
async fn spanning_bands(task_db: &str) -> i64 {
    query(
        task_db,
        "SELECT count(*) AS n FROM task_events
         WHERE task_ids[1] / 256 <> task_ids[cardinality(task_ids)] / 256",
    )
    .await[0]["n"]
        .as_i64()
        .unwrap()
}
