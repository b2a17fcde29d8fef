//! The tasks table's secondary indexes hold what their reads need and a claim writes only live
//! ones: a database upgraded to them, holding tasks in every status, answers every read as it
//! did, and idempotency keys stay unique.
#![allow(clippy::unwrap_used)]

use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use serde_json::{Value, json};
use tests::{Service, fresh_database, query};

/// Every read a user makes of the tasks: each listing by status and queue, the counts, the
/// queues page, each task by id, and a repeat of each idempotent create.
async fn reads(tasks: &Service, ids: &[i64]) -> Vec<(String, Value)> {
    let mut paths: Vec<String> = vec![
        "/api/tasks".into(),
        "/api/tasks?order=asc&limit=3".into(),
        "/api/tasks/counts".into(),
        "/api/queues".into(),
        "/api/queues/a".into(),
        "/api/tasks/processed".into(),
        "/api/tasks/started".into(),
    ];
    for status in [
        "pending",
        "running",
        "succeeded",
        "dead",
        "cancelled",
        "pending,running",
    ] {
        paths.push(format!("/api/tasks?status={status}"));
        paths.push(format!("/api/tasks?status={status}&queue=b"));
    }
    paths.extend(ids.iter().map(|id| format!("/api/tasks/{id}")));
    let mut answers = Vec::new();
    for path in paths {
        let answer = tasks.get(&path).await;
        assert_eq!(answer.status, 200, "{path}: {:?}", answer.body);
        answers.push((path, answer.body));
    }
    for key in ["k-pending", "k-done"] {
        let repeat = tasks
            .post(
                "/api/tasks",
                &json!({"task_data": {}, "queue": "a", "idempotency_key": key}),
            )
            .await;
        assert_eq!(repeat.status, 200, "{key}: {:?}", repeat.body);
        answers.push((key.to_owned(), repeat.body["id"].clone()));
    }
    answers
}

/// `answer` without the ages it reports, which grow between two reads.
fn timeless(answer: &Value) -> Value {
    match answer {
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .filter(|(name, _)| name.as_str() != "oldestDueAgeSeconds")
                .map(|(name, value)| (name.clone(), timeless(value)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(timeless).collect()),
        other => other.clone(),
    }
}

#[tokio::test]
async fn a_database_upgraded_to_live_indexes_answers_every_read_as_before() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    task_service::migrate(&task_db).await.unwrap();
    // The indexes as the release before had them (the later migrations do not touch them,
    // and the services of this release need them: only this one is undone).
    let mut conn = AsyncPgConnection::establish(&task_db).await.unwrap();
    conn.batch_execute(&format!(
        "{}
         DELETE FROM __diesel_schema_migrations WHERE version = '20261127000117';",
        include_str!("../../../task-service/migrations/2026-11-27-000117_live_indexes/down.sql")
    ))
    .await
    .unwrap();
    let leases = Service::lease_service(&lease_db, &[]).await;
    let tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;

    // Tasks in every status, in two queues, with keys and without.
    let mut ids = Vec::new();
    for (queue, key) in [
        ("a", Some("k-pending")),
        ("a", Some("k-done")),
        ("a", None),
        ("b", None),
        ("b", None),
        ("b", None),
    ] {
        let mut body = json!({"task_data": {}, "queue": queue});
        if let Some(key) = key {
            body["idempotency_key"] = json!(key);
        }
        let created = tasks.post("/api/tasks", &body).await;
        assert_eq!(created.status, 201, "{:?}", created.body);
        ids.push(created.body["id"].as_i64().unwrap());
    }
    let claim = |queue: &'static str| {
        let tasks = &tasks;
        async move {
            let claimed = tasks
                .post(
                    "/api/tasks/next",
                    &json!({"processor": "w", "queue": queue}),
                )
                .await;
            assert_eq!(claimed.status, 202, "{:?}", claimed.body);
            claimed.body
        }
    };
    // k-pending stays pending; k-done succeeds; the third of `a` runs.
    let first = claim("a").await;
    let second = claim("a").await;
    assert_eq!(first["id"], ids[0]);
    let retried = tasks
        .put(
            &format!("/api/tasks/{}/snooze", ids[0]),
            &json!({"processor": "w", "fence": first["fence"], "seconds": 3600}),
        )
        .await;
    assert_eq!(retried.status, 202, "{:?}", retried.body);
    let done = tasks
        .put(
            &format!("/api/tasks/{}/complete", ids[1]),
            &json!({"processor": "w", "fence": second["fence"], "task_output": {}}),
        )
        .await;
    assert_eq!(done.status, 202, "{:?}", done.body);
    claim("a").await;
    // In `b`: one dead, one cancelled, one pending.
    let dying = claim("b").await;
    let dead = tasks
        .put(
            &format!("/api/tasks/{}/fail", dying["id"]),
            &json!({"processor": "w", "fence": dying["fence"], "error": "boom", "retryable": false}),
        )
        .await;
    assert_eq!(dead.status, 202, "{:?}", dead.body);
    let cancelled = tasks
        .post(&format!("/api/tasks/{}/cancel", ids[4]), &json!({}))
        .await;
    assert_eq!(cancelled.status, 200, "{:?}", cancelled.body);
    let statuses = query(
        &task_db,
        "SELECT DISTINCT status FROM tasks ORDER BY status",
    )
    .await;
    assert_eq!(
        statuses,
        ["cancelled", "dead", "pending", "running", "succeeded"]
            .map(|s| json!({"status": s}))
            .to_vec(),
        "every status is held"
    );

    let before = reads(&tasks, &ids).await;
    drop(tasks);
    task_service::migrate(&task_db).await.unwrap();
    let indexes = query(
        &task_db,
        "SELECT indexname FROM pg_indexes WHERE tablename = 'tasks' AND indexname = 'tasks_running_idx'",
    )
    .await;
    assert_eq!(indexes.len(), 1, "upgraded");
    let tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;
    let after = reads(&tasks, &ids).await;
    for ((path, was), (_, is)) in before.iter().zip(&after) {
        assert_eq!(timeless(was), timeless(is), "{path}");
    }

    // Keys stay unique; tasks without one are many.
    let again = tasks
        .post(
            "/api/tasks",
            &json!({"task_data": {}, "queue": "a", "idempotency_key": "k-done"}),
        )
        .await;
    assert_eq!(again.status, 200, "{:?}", again.body);
    assert_eq!(again.body["id"], ids[1]);
    let refused = tests::try_execute(
        &task_db,
        "INSERT INTO tasks (task_data, max_attempts, idempotency_key) VALUES ('{}', 1, 'k-done')",
    )
    .await;
    assert!(
        refused
            .unwrap_err()
            .contains("tasks_idempotency_key_unique")
    );
    tests::execute(
        &task_db,
        "INSERT INTO tasks (task_data, max_attempts) VALUES ('{}', 1), ('{}', 1)",
    )
    .await;
}

/// Which of the tasks table's indexes hold a row in `status`, by their predicates: what a row
/// version in that status writes.
async fn indexes_holding(task_db: &str, status: &str, key: bool) -> Vec<String> {
    let key = if key { "'k'" } else { "NULL" };
    let candidates = query(
        task_db,
        "SELECT indexname, coalesce(pg_get_expr(i.indpred, i.indrelid), 'true') AS predicate
         FROM pg_indexes JOIN pg_class c ON c.relname = indexname
         JOIN pg_index i ON i.indexrelid = c.oid
         WHERE tablename = 'tasks' ORDER BY indexname",
    )
    .await;
    let mut holding = Vec::new();
    for index in candidates {
        let predicate = index["predicate"].as_str().unwrap();
        let holds = query(
            task_db,
            &format!(
                "SELECT ({predicate}) AS holds FROM (SELECT '{status}'::text AS status,
                        {key}::text AS idempotency_key, {key}::text AS concurrency_key) t"
            ),
        )
        .await;
        if holds[0]["holds"] == json!(true) {
            holding.push(index["indexname"].as_str().unwrap().to_owned());
        }
    }
    holding
}

#[tokio::test]
async fn a_claim_writes_only_the_live_indexes() {
    let task_db = fresh_database().await;
    task_service::migrate(&task_db).await.unwrap();
    // A claim's new row version (running) goes into the primary key, the lapsed tasks' index
    // and the running tasks' index: none that listings of finished work read.
    assert_eq!(
        indexes_holding(&task_db, "running", false).await,
        ["tasks_lapsed_idx", "tasks_pkey", "tasks_running_idx"]
    );
    // A keyless task's life writes 13 index entries: 6 pending, 3 running, 4 finished.
    let mut entries = 0;
    for status in ["pending", "running", "succeeded"] {
        entries += indexes_holding(&task_db, status, false).await.len();
    }
    assert_eq!(entries, 13);
}
