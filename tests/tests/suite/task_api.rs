//! task-service's HTTP API with real lease-service and task-service processes on PostgreSQL,
//! driven by hand-written worker requests (the worker binary has tests of its own).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tests::{Answer, Service, eventually, execute, fresh_database, metric_sum, snapshot, verdicts};

tests::stack_with_helpers!(Stack);

async fn stack(task_env: &[(&str, &str)]) -> Stack {
    Stack(tests::Stack::start(task_env).await)
}

impl Stack {
    async fn create(&self, body: Value) -> Answer {
        self.tasks.post("/api/tasks", &body).await
    }

    async fn create_id(&self, body: Value) -> i64 {
        let answer = self.create(body).await;
        assert_eq!(answer.status, 201, "{:?}", answer.body);
        answer.body["id"].as_i64().unwrap()
    }

    async fn claim(&self, processor: &str) -> Answer {
        self.tasks
            .post("/api/tasks/next", &json!({ "processor": processor }))
            .await
    }

    async fn heartbeat(&self, id: i64, body: Value) -> Answer {
        self.tasks
            .put(&format!("/api/tasks/{id}/heartbeat"), &body)
            .await
    }

    async fn complete(&self, id: i64, body: Value) -> Answer {
        self.tasks
            .put(&format!("/api/tasks/{id}/complete"), &body)
            .await
    }

    async fn fail(&self, id: i64, body: Value) -> Answer {
        self.tasks
            .put(&format!("/api/tasks/{id}/fail"), &body)
            .await
    }

    async fn task(&self, id: i64) -> Value {
        self.tasks.get(&format!("/api/tasks/{id}")).await.body["task"].clone()
    }
}

#[tokio::test]
async fn the_sample_workers_requests_drive_a_task_from_claim_to_completion() {
    let s = stack(&[]).await;
    let id = s
        .create_id(json!({"task_data": {"sleep_duration_seconds": 1}}))
        .await;

    // Exactly the sample worker's requests: processor only, no fence.
    let claimed = s.claim("sample-worker").await;
    assert_eq!(claimed.status, 202, "{:?}", claimed.body);
    let task = &claimed.body;
    assert_eq!(task["id"].as_i64(), Some(id));
    assert_eq!(task["taskData"]["sleep_duration_seconds"], 1);
    assert_eq!(task["processor"], "sample-worker");
    for field in [
        "scheduledAt",
        "lastHeartBeatAt",
        "mustHeartBeatBefore",
        "startedAt",
    ] {
        assert!(task[field].is_string(), "{field} in {task}");
    }
    assert!(task["processedAt"].is_null() && task["taskOutput"].is_null());
    assert_eq!(
        (task["status"].as_str(), task["attempts"].as_i64()),
        (Some("running"), Some(1))
    );
    assert!(task["fence"].as_i64().is_some());

    let beat = s.heartbeat(id, json!({"processor": "sample-worker"})).await;
    assert_eq!(beat.status, 202, "{:?}", beat.body);
    assert!(beat.body["lastHeartBeatAt"].as_str() >= task["lastHeartBeatAt"].as_str());
    let started = s.tasks.get("/api/tasks/started").await;
    assert_eq!(started.body["tasks"].as_array().unwrap().len(), 1);

    let done = s
        .complete(
            id,
            json!({"processor": "sample-worker", "task_output": {"slept": 1}}),
        )
        .await;
    assert_eq!(done.status, 202, "{:?}", done.body);
    assert_eq!(done.body["status"], "succeeded");
    assert_eq!(done.body["taskOutput"]["slept"], 1);
    assert!(done.body["processedAt"].is_string());

    let none = s.claim("sample-worker").await;
    assert_eq!(none.status, 200);
    assert!(none.body["message"].is_string());
    assert_eq!(
        s.tasks.get("/api/tasks/processed").await.body["tasks"][0]["id"].as_i64(),
        Some(id)
    );
    assert_eq!(
        s.tasks.get("/api/tasks/started").await.body["tasks"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
    // The task's lease was released with the completion.
    let lease = s.leases.get("/api/leases/released").await;
    assert_eq!(lease.body["leases"][0]["resource"], format!("task:{id}"));
}

#[tokio::test]
async fn only_the_owner_with_the_current_fence_may_heartbeat_or_complete() {
    let s = stack(&[]).await;
    let id = s.create_id(json!({"task_data": {}})).await;
    let claimed = s.claim("owner").await;
    let fence = claimed.body["fence"].as_i64().unwrap();
    let before = snapshot(&s.task_db, "tasks").await;

    let cases = [
        ("heartbeat", json!({"processor": "intruder"}), "not_owner"),
        (
            "complete",
            json!({"processor": "intruder", "task_output": {}}),
            "not_owner",
        ),
        (
            "fail",
            json!({"processor": "intruder", "error": "x"}),
            "not_owner",
        ),
        (
            "heartbeat",
            json!({"processor": "owner", "fence": fence - 1}),
            "lease_lost",
        ),
        (
            "complete",
            json!({"processor": "owner", "fence": fence + 1, "task_output": {}}),
            "lease_lost",
        ),
    ];
    for (operation, body, code) in cases {
        let answer = s
            .tasks
            .put(&format!("/api/tasks/{id}/{operation}"), &body)
            .await;
        assert_eq!(
            (answer.status, answer.code()),
            (409, code),
            "{operation} {body}"
        );
    }
    assert_eq!(
        snapshot(&s.task_db, "tasks").await,
        before,
        "refusals wrote nothing"
    );

    let done = s
        .complete(
            id,
            json!({"processor": "owner", "fence": fence, "task_output": 7}),
        )
        .await;
    assert_eq!(done.status, 202);
    for (operation, body) in [
        (
            "complete",
            json!({"processor": "owner", "fence": fence, "task_output": 8}),
        ),
        ("heartbeat", json!({"processor": "owner"})),
        ("fail", json!({"processor": "owner", "error": "late"})),
    ] {
        let answer = s
            .tasks
            .put(&format!("/api/tasks/{id}/{operation}"), &body)
            .await;
        assert_eq!(
            (answer.status, answer.code()),
            (409, "task_finished"),
            "{operation}"
        );
    }
    assert_eq!(s.task(id).await["taskOutput"], 7, "one accepted completion");
    let missing = s.heartbeat(987_654, json!({"processor": "owner"})).await;
    assert_eq!((missing.status, missing.code()), (404, "task_not_found"));
}

#[tokio::test]
async fn a_lapsed_claim_is_taken_over_and_the_first_worker_is_refused() {
    let s = stack(&[("TASK_LEASE_TTL_SECONDS", "1")]).await;
    let id = s.create_id(json!({"task_data": {"n": 1}})).await;
    let first = s.claim("slow").await;
    let first_fence = first.body["fence"].as_i64().unwrap();
    assert_eq!(
        s.claim("fast").await.status,
        200,
        "a running task is not handed out twice"
    );

    tokio::time::sleep(Duration::from_millis(1300)).await;
    let second = s.claim("fast").await;
    assert_eq!(second.status, 202, "{:?}", second.body);
    assert_eq!(second.body["id"].as_i64(), Some(id));
    assert_eq!(second.body["attempts"], 2);
    assert!(second.body["fence"].as_i64().unwrap() > first_fence);

    // The first worker wakes up: refused, with or without its fence.
    let beat = s.heartbeat(id, json!({"processor": "slow"})).await;
    assert_eq!((beat.status, beat.code()), (409, "not_owner"));
    let late = s
        .complete(
            id,
            json!({"processor": "slow", "fence": first_fence, "task_output": "slow"}),
        )
        .await;
    assert_eq!((late.status, late.code()), (409, "lease_lost"));
    let done = s
        .complete(id, json!({"processor": "fast", "task_output": "fast"}))
        .await;
    assert_eq!(done.status, 202);
    assert_eq!(s.task(id).await["taskOutput"], "fast");
}

#[tokio::test]
async fn two_workers_with_one_name_cannot_both_complete_a_task() {
    let s = stack(&[("TASK_LEASE_TTL_SECONDS", "1")]).await;
    let id = s.create_id(json!({"task_data": {}})).await;
    let first = s.claim("twin").await;
    let first_fence = first.body["fence"].as_i64().unwrap();

    // The task row believes the lease ran out, but lease-service knows it did not: a claim by
    // the same name is a reentrant acquire and must not hand the task (and its fence) out again.
    execute(
        &s.task_db,
        "UPDATE tasks SET must_heartbeat_before = now() - interval '1 second'",
    )
    .await;
    assert_eq!(s.claim("twin").await.status, 200);
    assert_eq!(s.claim("other").await.status, 200);

    tokio::time::sleep(Duration::from_millis(1300)).await;
    let second = s.claim("twin").await;
    assert_eq!(second.status, 202);
    let second_fence = second.body["fence"].as_i64().unwrap();
    assert!(second_fence > first_fence);

    let stale = s
        .complete(
            id,
            json!({"processor": "twin", "fence": first_fence, "task_output": "first"}),
        )
        .await;
    assert_eq!((stale.status, stale.code()), (409, "lease_lost"));
    let current = s
        .complete(
            id,
            json!({"processor": "twin", "fence": second_fence, "task_output": "second"}),
        )
        .await;
    assert_eq!(current.status, 202);
    assert_eq!(s.task(id).await["taskOutput"], "second");
}

#[tokio::test]
async fn failures_back_off_then_die_after_max_attempts() {
    let s = stack(&[
        ("TASK_RETRY_BASE_SECONDS", "1"),
        ("TASK_RETRY_MAX_SECONDS", "10"),
    ])
    .await;
    let id = s
        .create_id(json!({"task_data": {}, "max_attempts": 3}))
        .await;
    let mut delays = Vec::new();
    for attempt in 1..=3 {
        let claimed = loop {
            let answer = s.claim("w").await;
            if answer.status == 202 {
                break answer;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(claimed.body["attempts"], attempt);
        let failed = s
            .fail(
                id,
                json!({"processor": "w", "error": format!("boom {attempt}")}),
            )
            .await;
        assert_eq!(failed.status, 202, "{:?}", failed.body);
        assert!(
            failed.body["lastError"]
                .as_str()
                .is_some_and(|e| e.contains(&format!("boom {attempt}")))
        );
        if attempt < 3 {
            assert_eq!(failed.body["status"], "pending");
            let scheduled =
                chrono::DateTime::parse_from_rfc3339(failed.body["scheduledAt"].as_str().unwrap())
                    .unwrap();
            let updated =
                chrono::DateTime::parse_from_rfc3339(failed.body["updatedAt"].as_str().unwrap())
                    .unwrap();
            delays.push((scheduled - updated).num_milliseconds());
            assert_eq!(s.claim("w").await.status, 200, "not due during the backoff");
        } else {
            assert_eq!(failed.body["status"], "dead");
        }
    }
    // Attempt 1 waits 0.5–1 s, attempt 2 waits 1–2 s.
    assert!((450..=1050).contains(&delays[0]), "{delays:?}");
    assert!((950..=2050).contains(&delays[1]), "{delays:?}");

    // Not retryable: dead at once. Requeue: back at once, the attempt not charged.
    let hopeless = s.create_id(json!({"task_data": {"k": 2}})).await;
    assert_eq!(s.claim("w").await.body["id"].as_i64(), Some(hopeless));
    let dead = s
        .fail(
            hopeless,
            json!({"processor": "w", "error": "bad input", "retryable": false}),
        )
        .await;
    assert_eq!(dead.body["status"], "dead");
    let handed_back = s.create_id(json!({"task_data": {"k": 3}})).await;
    assert_eq!(s.claim("w").await.body["id"].as_i64(), Some(handed_back));
    let requeued = s
        .fail(
            handed_back,
            json!({"processor": "w", "error": "shutting down", "requeue": true}),
        )
        .await;
    assert_eq!(
        (
            requeued.body["status"].as_str(),
            requeued.body["attempts"].as_i64()
        ),
        (Some("pending"), Some(0))
    );
    assert_eq!(s.claim("w2").await.body["id"].as_i64(), Some(handed_back));
}

#[tokio::test]
async fn a_task_whose_last_attempt_lapsed_becomes_dead_with_the_reason() {
    let s = stack(&[("TASK_LEASE_TTL_SECONDS", "1")]).await;
    let id = s
        .create_id(json!({"task_data": {}, "max_attempts": 1}))
        .await;
    assert_eq!(s.claim("crashes").await.status, 202);
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(
        s.claim("next").await.status,
        200,
        "no attempts left to hand out"
    );
    let task = s.task(id).await;
    assert_eq!(task["status"], "dead");
    assert!(
        task["lastError"]
            .as_str()
            .unwrap()
            .contains("attempts exhausted"),
        "{task}"
    );
}

#[tokio::test]
async fn cancel_ends_pending_tasks_at_once_and_running_ones_at_their_next_heartbeat() {
    let s = stack(&[]).await;
    let pending = s
        .create_id(json!({"task_data": {"p": 1}, "scheduled_at": "2999-01-01T00:00:00Z"}))
        .await;
    let cancelled = s
        .tasks
        .post(&format!("/api/tasks/{pending}/cancel"), &json!({}))
        .await;
    assert_eq!(
        (cancelled.status, cancelled.body["status"].as_str()),
        (200, Some("cancelled"))
    );
    let again = s
        .tasks
        .post(&format!("/api/tasks/{pending}/cancel"), &json!({}))
        .await;
    assert_eq!((again.status, again.code()), (409, "task_finished"));

    let running = s.create_id(json!({"task_data": {"r": 1}})).await;
    assert_eq!(s.claim("w").await.body["id"].as_i64(), Some(running));
    let marked = s
        .tasks
        .post(&format!("/api/tasks/{running}/cancel"), &json!({}))
        .await;
    assert_eq!(marked.status, 202);
    assert_eq!(marked.body["cancelRequested"], true);
    let beat = s.heartbeat(running, json!({"processor": "w"})).await;
    assert_eq!((beat.status, beat.code()), (409, "cancelled"));
    assert_eq!(s.task(running).await["status"], "cancelled");
    let complete = s
        .complete(running, json!({"processor": "w", "task_output": 1}))
        .await;
    assert_eq!((complete.status, complete.code()), (409, "task_finished"));
    let lease = s.leases.get("/api/leases/released").await;
    assert_eq!(
        lease.body["leases"][0]["resource"],
        format!("task:{running}")
    );
    let unknown = s.tasks.post("/api/tasks/424242/cancel", &json!({})).await;
    assert_eq!(unknown.status, 404);
}

#[tokio::test]
async fn idempotent_create_returns_the_first_task() {
    let s = stack(&[]).await;
    let body = json!({"task_data": {"email": "a@example.com"}, "idempotency_key": "welcome-a"});
    let first = s.create(body.clone()).await;
    assert_eq!(first.status, 201);
    let second = s.create(body).await;
    assert_eq!(second.status, 200);
    assert_eq!(second.body["id"], first.body["id"]);
    let different = s
        .create(json!({"task_data": {"email": "b@example.com"}, "idempotency_key": "welcome-a"}))
        .await;
    assert_eq!(
        (different.status, different.code()),
        (422, "idempotency_key_reused")
    );
    let concurrent = futures_util::future::join_all(
        (0..20).map(|_| s.create(json!({"task_data": {"n": 1}, "idempotency_key": "burst"}))),
    )
    .await;
    assert_eq!(concurrent.iter().filter(|a| a.status == 201).count(), 1);
    assert!(
        concurrent
            .iter()
            .all(|a| a.status == 201 || a.status == 200)
    );
    assert_eq!(snapshot(&s.task_db, "tasks").await.len(), 2);
}

#[tokio::test]
async fn claims_follow_priority_schedule_and_queue_and_can_be_batched() {
    let s = stack(&[]).await;
    let low = s.create_id(json!({"task_data": {}, "priority": -1})).await;
    let normal = s.create_id(json!({"task_data": {}})).await;
    let high = s.create_id(json!({"task_data": {}, "priority": 5})).await;
    let later = s
        .create_id(json!({"task_data": {}, "priority": 9, "scheduled_at": (chrono::Utc::now() + chrono::Duration::seconds(2)).to_rfc3339()}))
        .await;
    let email = s
        .create_id(json!({"task_data": {}, "queue": "emails"}))
        .await;

    let emails = s
        .tasks
        .post(
            "/api/tasks/next",
            &json!({"processor": "w", "queue": "emails"}),
        )
        .await;
    assert_eq!(emails.body["id"].as_i64(), Some(email));
    let batch = s
        .tasks
        .post("/api/tasks/next", &json!({"processor": "w", "limit": 10}))
        .await;
    assert_eq!(batch.status, 202);
    let ids: Vec<i64> = batch
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_i64().unwrap())
        .collect();
    assert_eq!(
        ids,
        vec![high, normal, low],
        "priority first; the delayed task is not due"
    );
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let delayed = s
        .tasks
        .post("/api/tasks/next", &json!({"processor": "w", "limit": 10}))
        .await;
    assert_eq!(delayed.body[0]["id"].as_i64(), Some(later));

    let counts = s.tasks.get("/api/tasks/counts").await;
    assert_eq!(counts.body["queues"]["default"]["running"], 4);
    assert_eq!(counts.body["queues"]["emails"]["running"], 1);
    assert_eq!(counts.body["total"]["pending"], 0);
    let filtered = s.tasks.get("/api/tasks?status=running&queue=emails").await;
    assert_eq!(filtered.body["tasks"].as_array().unwrap().len(), 1);
    let paged = s.tasks.get("/api/tasks?limit=2").await;
    assert_eq!(paged.body["tasks"].as_array().unwrap().len(), 2);
    let cursor = paged
        .headers
        .get("x-next-cursor")
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    let rest = s
        .tasks
        .get(&format!("/api/tasks?limit=10&cursor={cursor}"))
        .await;
    assert_eq!(rest.body["tasks"].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn without_lease_service_claims_and_heartbeats_answer_503_and_change_nothing() {
    let mut s = stack(&[("LEASE_CALL_TIMEOUT_MS", "500")]).await;
    let id = s.create_id(json!({"task_data": {}})).await;
    let claimed = s.claim("w").await;
    assert_eq!(claimed.status, 202);
    s.create_id(json!({"task_data": {"second": true}})).await;
    let before = snapshot(&s.task_db, "tasks").await;

    s.leases.kill();
    let claim = s.claim("w2").await;
    assert_eq!((claim.status, claim.code()), (503, "unavailable"));
    let beat = s.heartbeat(id, json!({"processor": "w"})).await;
    assert_eq!((beat.status, beat.code()), (503, "unavailable"));
    let done = s
        .complete(id, json!({"processor": "w", "task_output": 1}))
        .await;
    assert_eq!(done.status, 503);
    assert_eq!(s.tasks.get("/readyz").await.status, 503);
    assert_eq!(
        snapshot(&s.task_db, "tasks").await,
        before,
        "nothing written"
    );

    s.leases.start_again().await;
    assert_eq!(s.tasks.get("/readyz").await.status, 200);
    let done = s
        .complete(id, json!({"processor": "w", "task_output": 1}))
        .await;
    assert_eq!(done.status, 202, "{:?}", done.body);
}

#[tokio::test]
async fn retention_deletes_only_old_finished_tasks_and_metrics_report() {
    let s = stack(&[
        ("TASK_RETENTION_SECONDS", "60"),
        ("TASK_SWEEP_INTERVAL_SECONDS", "1"),
    ])
    .await;
    let old_done = s.create_id(json!({"task_data": {"a": 1}})).await;
    let new_done = s.create_id(json!({"task_data": {"a": 2}})).await;
    let old_pending = s.create_id(json!({"task_data": {"a": 3}})).await;
    for _ in 0..2 {
        let claimed = s.claim("w").await;
        let id = claimed.body["id"].as_i64().unwrap();
        assert_eq!(
            s.complete(id, json!({"processor": "w", "task_output": 0}))
                .await
                .status,
            202
        );
    }
    execute(
        &s.task_db,
        &format!(
            "UPDATE tasks SET processed_at = now() - interval '2 minutes' WHERE id = {old_done}"
        ),
    )
    .await;
    execute(&s.task_db, &format!("UPDATE tasks SET created_at = now() - interval '30 days', scheduled_at = now() + interval '1 day' WHERE id = {old_pending}")).await;
    let left = || async {
        s.tasks.get("/api/tasks").await.body["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_i64().unwrap())
            .collect::<Vec<i64>>()
    };
    // Deletions only remove, so once the list is right it stays right; wait for the sweep.
    eventually(Duration::from_secs(60), "retention's sweep", || async {
        left().await == vec![new_done, old_pending]
    })
    .await;

    let lines = [
        r#"tasks_claimed_total{queue="default"} 2"#,
        r#"tasks_completed_total{queue="default"} 2"#,
        r#"tasks{queue="default",status="pending"} 1"#,
        r#"tasks{queue="default",status="succeeded"} 1"#,
        "task_claim_to_complete_seconds_count",
        "task_retention_deleted_total 1",
        "http_requests_total",
    ];
    // The counters move after the deletion commits, the gauges on their own schedule.
    eventually(Duration::from_secs(60), "the sweep's metrics", || async {
        let metrics = s.tasks.metrics().await;
        lines.iter().all(|line| metrics.contains(line))
    })
    .await;
}

#[tokio::test]
async fn a_lease_granted_to_a_claim_that_never_committed_does_not_block_its_task() {
    let s = stack(&[]).await;
    let id = s.create_id(json!({"task_data": {}})).await;
    // lease-service granted the task's lease to "w", but the claim's transaction never
    // committed (its answer timed out, or the database failed): the task is still pending.
    let stray = s
        .leases
        .post(
            "/api/leases",
            &json!({"resource": format!("task:{id}"), "holder": "w"}),
        )
        .await;
    assert_eq!(stray.status, 201);
    let stray_fence = stray.body["fence"].as_i64().unwrap();
    assert_eq!(
        s.claim("other").await.status,
        200,
        "another name must wait for the lease"
    );
    let claimed = s.claim("w").await;
    assert_eq!(
        claimed.status, 202,
        "no worker knows the stray fence: claim under it"
    );
    assert_eq!(claimed.body["id"].as_i64(), Some(id));
    assert_eq!(claimed.body["fence"].as_i64(), Some(stray_fence));
    let done = s
        .complete(
            id,
            json!({"processor": "w", "fence": stray_fence, "task_output": 1}),
        )
        .await;
    assert_eq!(done.status, 202);
}

#[tokio::test]
async fn a_lapsed_task_still_leased_does_not_crowd_out_due_ones() {
    let s = stack(&[]).await;
    let first = s.create_id(json!({"task_data": {"n": 1}})).await;
    let second = s.create_id(json!({"task_data": {"n": 2}})).await;
    assert_eq!(s.claim("w1").await.body["id"].as_i64(), Some(first));
    // The task row thinks w1's lease ran out; lease-service knows it did not.
    execute(&s.task_db, &format!("UPDATE tasks SET must_heartbeat_before = now() - interval '1 second' WHERE id = {first}")).await;
    let claimed = s.claim("w2").await;
    assert_eq!(claimed.status, 202, "{:?}", claimed.body);
    assert_eq!(claimed.body["id"].as_i64(), Some(second));
    // And the lapsed task's recorded expiry moved to the holder's, so it is not retried at once.
    let task = s.task(first).await;
    assert_eq!(task["processor"], "w1");
    assert!(
        task["mustHeartBeatBefore"].as_str().unwrap() > task["lastHeartBeatAt"].as_str().unwrap()
    );
}

#[tokio::test]
async fn a_repeat_of_an_idempotent_create_must_ask_for_the_same_task() {
    let s = stack(&[]).await;
    let first = json!({
        "task_data": {"n": 1},
        "idempotency_key": "k1",
        "priority": 3,
        "max_attempts": 4,
        "scheduled_at": "2999-01-01T00:00:00.123456789Z",
    });
    let id = s.create_id(first.clone()).await;
    let same = s.create(first.clone()).await;
    assert_eq!((same.status, same.body["id"].as_i64()), (200, Some(id)));
    let before = snapshot(&s.task_db, "tasks").await;
    for (field, value) in [
        ("priority", json!(4)),
        ("max_attempts", json!(5)),
        ("scheduled_at", json!("2999-01-01T00:00:01Z")),
        ("queue", json!("other")),
    ] {
        let mut repeat = first.clone();
        repeat[field] = value;
        let answer = s.create(repeat).await;
        assert_eq!(
            (answer.status, answer.code()),
            (422, "idempotency_key_reused"),
            "{field}: {:?}",
            answer.body
        );
        assert!(
            answer.body["error"].as_str().unwrap().contains(field),
            "{:?}",
            answer.body
        );
    }
    for omitted in ["priority", "max_attempts", "scheduled_at"] {
        let mut repeat = first.clone();
        repeat.as_object_mut().unwrap().remove(omitted);
        let answer = s.create(repeat).await;
        assert_eq!(
            (answer.status, answer.code()),
            (422, "idempotency_key_reused")
        );
    }
    assert_eq!(
        snapshot(&s.task_db, "tasks").await,
        before,
        "nothing written"
    );

    // A retry moves the stored schedule; a repeat of the create is still the same request.
    let plain = json!({"task_data": {"n": 2}, "idempotency_key": "k2"});
    let retried = s.create_id(plain.clone()).await;
    assert_eq!(s.claim("w").await.body["id"].as_i64(), Some(retried));
    let failed = s
        .fail(retried, json!({"processor": "w", "error": "boom"}))
        .await;
    assert_eq!(failed.status, 202, "{:?}", failed.body);
    let repeat = s.create(plain).await;
    assert_eq!(
        (repeat.status, repeat.body["id"].as_i64()),
        (200, Some(retried)),
        "{:?}",
        repeat.body
    );

    // A schedule finer than the microseconds stored, before 2000: the same request all the same.
    let old = json!({
        "task_data": {"n": 3},
        "idempotency_key": "k3",
        "scheduled_at": "1999-12-31T23:59:59.1234567Z",
    });
    let id = s.create_id(old.clone()).await;
    let repeat = s.create(old).await;
    assert_eq!(
        (repeat.status, repeat.body["id"].as_i64()),
        (200, Some(id)),
        "{:?}",
        repeat.body
    );
}

#[tokio::test]
async fn repeats_of_creates_made_before_the_requested_schedule_was_kept_are_judged_fairly() {
    use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
    let task_db = fresh_database().await;
    // A database as the release before the column left it, with tasks its code made.
    task_service::migrate(&task_db).await.unwrap();
    let mut conn = AsyncPgConnection::establish(&task_db).await.unwrap();
    let columns = "task_data, queue, priority, max_attempts, idempotency_key";
    conn.batch_execute(&format!(
        "{}
         DELETE FROM __diesel_schema_migrations WHERE version = '20261123000106';
         INSERT INTO tasks ({columns}, scheduled_at)
         VALUES ('{{}}', 'default', 0, 10, 'none', now()),
                ('{{}}', 'default', 0, 10, 'named', '2999-01-01T00:00:00.123456Z');
         -- The generator's insert read the clock for the schedule, then for the creation.
         INSERT INTO tasks ({columns}, scheduled_at, created_at)
         VALUES ('{{}}', 'default', 0, 10, 'generated', now(), now() + interval '3 microseconds');
         -- Created for 2999, then claimed and retried: the schedule it was created with is gone.
         INSERT INTO tasks ({columns}, scheduled_at, fence, attempts, last_error)
         VALUES ('{{}}', 'default', 0, 10, 'retried', now() + interval '1 minute', 1, 1, 'boom');",
        include_str!(
            "../../../task-service/migrations/2026-11-23-000106_task_requested_schedule/down.sql"
        )
    ))
    .await
    .unwrap();
    task_service::migrate(&task_db).await.unwrap();
    let lease_db = fresh_database().await;
    let leases = Service::lease_service(&lease_db, &[]).await;
    let tasks = Service::task_service(&task_db, &leases.base_url(), &[]).await;

    let named = "2999-01-01T00:00:00.123456Z";
    let other = "2999-01-01T00:00:01Z";
    let fresh = "fresh";
    assert_eq!(
        tasks
            .post(
                "/api/tasks",
                &json!({"task_data": {}, "idempotency_key": fresh})
            )
            .await
            .status,
        201
    );
    for (key, schedule, same) in [
        ("none", None, true),
        ("none", Some(named), false),
        ("named", Some(named), true),
        ("named", Some(other), false),
        ("named", None, false),
        ("generated", None, true),
        ("retried", Some(named), true),
        ("retried", None, true),
        // Made after the upgrade: whether it named a schedule is known.
        (fresh, None, true),
        (fresh, Some(named), false),
    ] {
        let mut repeat = json!({"task_data": {}, "idempotency_key": key});
        if let Some(at) = schedule {
            repeat["scheduled_at"] = json!(at);
        }
        let answer = tasks.post("/api/tasks", &repeat).await;
        let expected = if same { 200 } else { 422 };
        assert_eq!(answer.status, expected, "{repeat}: {:?}", answer.body);
    }
}

impl Stack {
    /// Waits until lease-service says the task's lease is no longer live: its worker is gone.
    async fn wait_lease_gone(&self, id: i64) {
        tests::eventually(
            Duration::from_secs(10),
            "the task's lease to run out",
            || async {
                let active = self
                    .leases
                    .get(&format!("/api/leases/active?resource=task:{id}"))
                    .await;
                active.status == 200 && active.body["leases"].as_array().is_some_and(Vec::is_empty)
            },
        )
        .await;
    }
}

#[tokio::test]
async fn a_cancelled_task_whose_worker_died_ends_cancelled_and_is_never_claimed_again() {
    let s = stack(&[("TASK_LEASE_TTL_SECONDS", "1")]).await;
    let id = s.create_id(json!({"task_data": {}})).await;
    assert_eq!(s.claim("w1").await.body["id"].as_i64(), Some(id));
    let cancel = s
        .tasks
        .post(&format!("/api/tasks/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(cancel.status, 202, "{:?}", cancel.body);
    // w1 dies without another heartbeat.
    s.wait_lease_gone(id).await;
    let claim = s.claim("w2").await;
    assert_eq!(
        (claim.status, claim.body["message"].as_str()),
        (200, Some("No tasks available")),
        "a cancelled task was handed out again: {:?}",
        claim.body
    );
    let task = s.task(id).await;
    assert_eq!(
        (
            task["status"].as_str(),
            task["attempts"].as_i64(),
            task["processor"].as_str()
        ),
        (Some("cancelled"), Some(1), Some("w1")),
        "{task}"
    );
    assert_eq!(s.claim("w3").await.status, 200);
    let late = s.heartbeat(id, json!({"processor": "w1"})).await;
    assert_eq!((late.status, late.code()), (409, "task_finished"));
}

#[tokio::test]
async fn the_sweeper_ends_a_cancelled_task_whose_worker_died_where_nobody_claims() {
    let s = stack(&[
        ("TASK_LEASE_TTL_SECONDS", "1"),
        ("TASK_SWEEP_INTERVAL_SECONDS", "1"),
    ])
    .await;
    let id = s
        .create_id(json!({"task_data": {}, "queue": "quiet"}))
        .await;
    let claim = s
        .tasks
        .post(
            "/api/tasks/next",
            &json!({"processor": "w1", "queue": "quiet"}),
        )
        .await;
    assert_eq!(claim.body["id"].as_i64(), Some(id), "{:?}", claim.body);
    let cancel = s
        .tasks
        .post(&format!("/api/tasks/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(cancel.status, 202);
    tests::eventually(
        Duration::from_secs(15),
        "the sweeper to end the task",
        || async { s.task(id).await["status"] == "cancelled" },
    )
    .await;
    assert_eq!(s.task(id).await["attempts"], 1);
}

#[tokio::test]
async fn marking_an_exhausted_task_dead_spends_no_claim_slot() {
    let s = stack(&[("TASK_LEASE_TTL_SECONDS", "1")]).await;
    let exhausted = s
        .create_id(json!({"task_data": {"n": 1}, "max_attempts": 1}))
        .await;
    assert_eq!(s.claim("w1").await.body["id"].as_i64(), Some(exhausted));
    let due = s.create_id(json!({"task_data": {"n": 2}})).await;
    s.wait_lease_gone(exhausted).await;
    let claim = s
        .tasks
        .post("/api/tasks/next", &json!({"processor": "w2", "limit": 1}))
        .await;
    assert_eq!(claim.status, 202, "{:?}", claim.body);
    let ids: Vec<i64> = claim
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [due]);
    assert_eq!(s.task(exhausted).await["status"], "dead");
}

#[tokio::test]
async fn lapsed_tasks_that_are_only_ended_never_take_the_place_of_a_claimable_one() {
    let s = stack(&[("TASK_LEASE_TTL_SECONDS", "1")]).await;
    let exhausted = s
        .create_id(json!({"task_data": {"n": 1}, "max_attempts": 1}))
        .await;
    let cancelled = s.create_id(json!({"task_data": {"n": 2}})).await;
    let claimable = s.create_id(json!({"task_data": {"n": 3}})).await;
    for id in [exhausted, cancelled, claimable] {
        assert_eq!(s.claim("w1").await.body["id"].as_i64(), Some(id));
    }
    let cancel = s
        .tasks
        .post(&format!("/api/tasks/{cancelled}/cancel"), &json!({}))
        .await;
    assert_eq!(cancel.status, 202, "{:?}", cancel.body);
    for id in [exhausted, cancelled, claimable] {
        s.wait_lease_gone(id).await;
    }
    // The tasks only to be ended lapsed first; nothing is pending.
    for (id, ago) in [(exhausted, 3), (cancelled, 2), (claimable, 1)] {
        execute(
            &s.task_db,
            &format!(
                "UPDATE tasks SET must_heartbeat_before = now() - interval '{ago} seconds' \
                 WHERE id = {id}"
            ),
        )
        .await;
    }
    let claim = s
        .tasks
        .post("/api/tasks/next", &json!({"processor": "w2", "limit": 1}))
        .await;
    assert_eq!(claim.status, 202, "{:?}", claim.body);
    assert_eq!(
        claim.body[0]["id"].as_i64(),
        Some(claimable),
        "{:?}",
        claim.body
    );
    assert_eq!(s.task(exhausted).await["status"], "dead");
    assert_eq!(s.task(cancelled).await["status"], "cancelled");
}

#[tokio::test]
async fn a_task_lease_ttl_lease_service_refuses_fails_readiness_and_claims_loudly() {
    let lease_db = fresh_database().await;
    let task_db = fresh_database().await;
    let leases = Service::lease_service(
        &lease_db,
        &[
            ("LEASE_MAX_TTL_SECONDS", "10"),
            ("LEASE_DEFAULT_TTL_SECONDS", "10"),
        ],
    )
    .await;
    let tasks = Service::task_service(
        &task_db,
        &leases.base_url(),
        &[("TASK_LEASE_TTL_SECONDS", "60")],
    )
    .await;
    let ready = tasks.get("/readyz").await;
    assert_eq!(
        (ready.status, ready.code()),
        (503, "task_lease_ttl_rejected"),
        "{:?}",
        ready.body
    );
    assert!(
        ready.body["error"]
            .as_str()
            .unwrap()
            .contains("TASK_LEASE_TTL_SECONDS"),
        "{:?}",
        ready.body
    );
    let created = tasks.post("/api/tasks", &json!({"task_data": {}})).await;
    assert_eq!(created.status, 201);
    let claim = tasks
        .post("/api/tasks/next", &json!({"processor": "w"}))
        .await;
    assert_eq!(
        (claim.status, claim.code()),
        (503, "task_lease_ttl_rejected"),
        "{:?}",
        claim.body
    );
    let id = created.body["id"].as_i64().unwrap();
    assert_eq!(
        tasks.get(&format!("/api/tasks/{id}")).await.body["task"]["status"],
        "pending"
    );
    assert_eq!(tasks.get("/readyz").await.status, 503);

    // Within lease-service's bounds, both are fine.
    let fine = Service::task_service(
        &task_db,
        &leases.base_url(),
        &[("TASK_LEASE_TTL_SECONDS", "10")],
    )
    .await;
    assert_eq!(fine.get("/readyz").await.status, 200);
    let claim = fine
        .post("/api/tasks/next", &json!({"processor": "w"}))
        .await;
    assert_eq!(claim.status, 202, "{:?}", claim.body);
}

/// A stand-in for lease-service: `/healthz` answers at once, an acquire answers with a lease
/// while `acquires_answer` is set, and every other call never answers. It stops with the test.
async fn stalling_lease_service(acquires_answer: Arc<AtomicBool>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve_stalling(stream, Arc::clone(&acquires_answer)));
        }
    });
    url
}

async fn serve_stalling(mut stream: tokio::net::TcpStream, acquires_answer: Arc<AtomicBool>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut read = Vec::new();
    loop {
        let mut chunk = [0u8; 4096];
        let request = loop {
            let text = String::from_utf8_lossy(&read).into_owned();
            if let Some(end) = text.find("\r\n\r\n") {
                let length: usize = text[..end]
                    .lines()
                    .find_map(|line| {
                        let (name, value) = line.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse().unwrap())
                    })
                    .unwrap_or(0);
                if read.len() >= end + 4 + length {
                    read.drain(..end + 4 + length);
                    break text[..end].lines().next().unwrap_or("").to_owned();
                }
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read.extend_from_slice(&chunk[..n]),
            }
        };
        let (status, body) = if request.starts_with("GET /healthz ") {
            ("200 OK", json!({"status": "ok"}))
        } else if request.starts_with("POST /api/leases ") && acquires_answer.load(Ordering::SeqCst)
        {
            let lease = json!({
                "id": 1, "resource": "probe", "holder": "probe", "fence": 1, "ttlSeconds": 30,
                "status": "active", "createdAt": "2026-01-01T00:00:00Z", "renewedAt": null,
                "releasedAt": null, "expiresAt": "2026-01-01T00:00:30Z", "expiresInMs": 30000,
            });
            ("201 Created", lease)
        } else {
            return std::future::pending().await;
        };
        let body = body.to_string();
        let answer = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if stream.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

#[tokio::test]
async fn readiness_answers_within_its_budget_however_long_lease_service_stalls() {
    let acquires_answer = Arc::new(AtomicBool::new(false));
    let lease_url = stalling_lease_service(Arc::clone(&acquires_answer)).await;
    let task_db = fresh_database().await;
    // Lease calls may take far longer than a readiness probe waits.
    let tasks =
        Service::task_service(&task_db, &lease_url, &[("LEASE_CALL_TIMEOUT_MS", "60000")]).await;
    // A 2 s budget, and room for a slow machine: far less than a stalled lease call.
    let probe = reqwest::Client::builder()
        .timeout(Duration::from_secs(6))
        .build()
        .unwrap();
    let ready = || async {
        let answer = probe
            .get(tasks.url("/readyz"))
            .send()
            .await
            .unwrap_or_else(|err| panic!("/readyz did not answer in time: {err}"));
        let status = answer.status().as_u16();
        (status, answer.json::<Value>().await.unwrap())
    };
    // The TTL probe's acquire stalls: not ready, said in time.
    let (status, body) = ready().await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("task lease TTL"),
        "{body}"
    );
    // It is granted, and the probe lease's release stalls: ready, without waiting for it.
    acquires_answer.store(true, Ordering::SeqCst);
    let (status, body) = ready().await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn a_batch_of_completions_judges_each_as_alone_in_one_request() {
    let s = stack(&[]).await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(s.create_id(json!({"task_data": {}})).await);
    }
    let claimed = s
        .tasks
        .post("/api/tasks/next", &json!({"processor": "w", "limit": 4}))
        .await;
    assert_eq!(claimed.status, 202);
    let fence_of = |id: i64| {
        claimed
            .body
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["id"] == id)
            .unwrap()["fence"]
            .as_i64()
            .unwrap()
    };
    let [done, stale, cancelled, too_big] = [ids[0], ids[1], ids[2], ids[3]];
    assert_eq!(
        s.tasks
            .post(&format!("/api/tasks/{cancelled}/cancel"), &json!({}))
            .await
            .status,
        202
    );
    let big = "x".repeat(70 * 1024);
    let batch = json!({"processor": "w", "tasks": [
        {"id": done, "fence": fence_of(done), "task_output": {"ok": 1}},
        {"id": stale, "fence": fence_of(stale) + 1000, "task_output": {}},
        {"id": cancelled, "task_output": {}},
        {"id": too_big, "task_output": {"big": big}},
        {"id": 987_654, "task_output": {}},
    ]});
    let answer = s.tasks.put("/api/tasks/complete", &batch).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let results = answer.body["results"].as_array().unwrap();
    assert_eq!(
        verdicts(&answer.body["results"]),
        vec![
            (202, ""),
            (409, "lease_lost"),
            (409, "cancelled"),
            (400, "too_large"),
            (404, "task_not_found"),
        ]
    );
    assert_eq!(results[0]["task"]["status"], "succeeded");
    assert_eq!(results[0]["task"]["taskOutput"], json!({"ok": 1}));
    let status = |id: i64| {
        let tasks = &s.tasks;
        async move { tasks.get(&format!("/api/tasks/{id}")).await.body["task"]["status"].clone() }
    };
    assert_eq!(status(done).await, "succeeded");
    assert_eq!(
        status(stale).await,
        "running",
        "a refused item changes nothing"
    );
    assert_eq!(status(cancelled).await, "cancelled");
    assert_eq!(status(too_big).await, "running");
    // Each completed or cancelled task's lease is released; the others' are kept.
    let active = s.leases.get("/api/leases/active").await.body["leases"].clone();
    let mut held: Vec<String> = active
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["resource"].as_str().unwrap().to_owned())
        .collect();
    held.sort();
    let mut expected = vec![format!("task:{stale}"), format!("task:{too_big}")];
    expected.sort();
    assert_eq!(held, expected);

    // Again: the completed one is finished now; whole-batch errors write nothing.
    let again = s.tasks.put("/api/tasks/complete", &batch).await;
    assert_eq!(again.body["results"][0]["error"]["code"], "task_finished");
    let before = snapshot(&s.task_db, "tasks").await;
    for (body, code) in [
        (json!({"processor": "w", "tasks": []}), "invalid_batch"),
        (
            json!({"processor": "w", "tasks": [{"id": stale}, {"id": stale}]}),
            "duplicate_task",
        ),
        (
            json!({"processor": "", "tasks": [{"id": stale}]}),
            "invalid_field",
        ),
    ] {
        let refused = s.tasks.put("/api/tasks/complete", &body).await;
        assert_eq!((refused.status, refused.code()), (400, code), "{body}");
    }
    assert_eq!(before, snapshot(&s.task_db, "tasks").await);
}

/// Requests a service has answered on one route.
async fn requests_to(service: &Service, method: &str, route: &str) -> f64 {
    let series =
        format!("http_request_duration_seconds_count{{method=\"{method}\",route=\"{route}\"}}");
    metric_sum(&service.metrics().await, &series)
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_single_claims_and_completions_are_served_in_groups_each_as_alone() {
    const WORKERS: usize = 48;
    let s = stack(&[("GROUPS_IN_FLIGHT", "1")]).await;
    for _ in 0..WORKERS {
        s.create_id(json!({"task_data": {"n": 1}})).await;
    }
    let claims = futures_util::future::join_all((0..WORKERS).map(|w| {
        let s = &s;
        async move { (format!("w{w}"), s.claim(&format!("w{w}")).await) }
    }))
    .await;
    // Every claimant got one task of its own, under its own name and fence.
    let active = s.leases.get("/api/leases/active").await.body["leases"].clone();
    let lease_of = |id: i64| {
        active
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["resource"] == format!("task:{id}"))
            .cloned()
            .unwrap_or(Value::Null)
    };
    let mut ids = std::collections::HashSet::new();
    let mut claimed = Vec::new();
    for (processor, answer) in &claims {
        assert_eq!(answer.status, 202, "{:?}", answer.body);
        assert_eq!(answer.body["processor"], *processor);
        let id = answer.body["id"].as_i64().unwrap();
        assert!(ids.insert(id), "task {id} handed out twice");
        let lease = lease_of(id);
        assert_eq!(lease["holder"], *processor, "{lease}");
        // The task's fence counts its claims: this is its first.
        assert_eq!(answer.body["fence"], 1, "{:?}", answer.body);
        claimed.push((id, processor.clone(), answer.body["fence"].clone()));
    }
    // They went to lease-service in fewer calls than there were claims.
    let batches = requests_to(&s.leases, "POST", "/api/leases/batch").await;
    assert!(
        (1.0..WORKERS as f64).contains(&batches),
        "{batches} lease calls for {WORKERS} claims"
    );

    // Completions likewise, each answered as alone: a repeat of one is judged after it, and
    // finds the task finished.
    let (first_id, first_processor, first_fence) = claimed[0].clone();
    let repeat =
        json!({"processor": first_processor, "fence": first_fence, "task_output": {"ok": 1}});
    let completions = futures_util::future::join_all(
        claimed
            .iter()
            .map(|(id, processor, fence)| {
                (
                    *id,
                    json!({"processor": processor, "fence": fence, "task_output": {"ok": 1}}),
                )
            })
            .chain([(first_id, repeat)])
            .map(|(id, body)| {
                let s = &s;
                async move { (id, s.complete(id, body).await) }
            }),
    )
    .await;
    let mut finished_twice = 0;
    for (id, answer) in &completions {
        if *id == first_id && answer.status == 409 {
            assert_eq!(answer.code(), "task_finished", "{:?}", answer.body);
            finished_twice += 1;
        } else {
            assert_eq!(answer.status, 202, "{:?}", answer.body);
            assert_eq!(answer.body["status"], "succeeded");
        }
    }
    assert_eq!(
        finished_twice, 1,
        "one of the two completions of task {first_id} is refused"
    );
    let releases = requests_to(&s.leases, "POST", "/api/leases/batch/release").await
        + requests_to(&s.leases, "DELETE", "/api/leases/release").await;
    assert!(
        (1.0..WORKERS as f64).contains(&releases),
        "{releases} lease calls for {WORKERS} completions"
    );
    // Every lease was released by its own holder.
    let active = s.leases.get("/api/leases/active").await;
    assert_eq!(
        active.body["leases"].as_array().map(Vec::len),
        Some(0),
        "{:?}",
        active.body
    );
}

/// An operator who revokes a running task's lease stops its worker on every route that proves
/// ownership through the lease: heartbeat, complete, fail and batch complete are refused with
/// `lease_revoked`, and none of them finishes the task.
#[tokio::test]
async fn a_revoked_lease_stops_its_worker_on_every_route() {
    let s = stack(&[]).await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(s.create_id(json!({"task_data": {}})).await);
    }
    let claimed = s
        .tasks
        .post("/api/tasks/next", &json!({"processor": "w", "limit": 4}))
        .await;
    assert_eq!(claimed.status, 202, "{:?}", claimed.body);
    assert_eq!(claimed.body.as_array().map(Vec::len), Some(4));
    let fence_of = |id: i64| {
        claimed
            .body
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["id"] == id)
            .unwrap()["fence"]
            .clone()
    };
    for id in &ids {
        let listed = s
            .leases
            .get(&format!("/api/leases/active?resource=task:{id}"))
            .await;
        let lease_id = &listed.body["leases"][0]["id"];
        assert!(lease_id.is_i64(), "{:?}", listed.body);
        let revoked = s
            .leases
            .post(&format!("/api/leases/{lease_id}/revoke"), &json!({}))
            .await;
        assert_eq!(revoked.status, 200, "{:?}", revoked.body);
    }
    let before = snapshot(&s.task_db, "tasks").await;

    let [beat, done, failed, batched] = [ids[0], ids[1], ids[2], ids[3]];
    let beat = s
        .heartbeat(beat, json!({"processor": "w", "fence": fence_of(beat)}))
        .await;
    assert_eq!((beat.status, beat.code()), (409, "lease_revoked"));
    let done = s
        .complete(
            done,
            json!({"processor": "w", "fence": fence_of(done), "task_output": {}}),
        )
        .await;
    assert_eq!((done.status, done.code()), (409, "lease_revoked"));
    let failed = s
        .fail(
            failed,
            json!({"processor": "w", "fence": fence_of(failed), "error": "x"}),
        )
        .await;
    assert_eq!((failed.status, failed.code()), (409, "lease_revoked"));
    let batch = json!({"processor": "w", "tasks": [
        {"id": batched, "fence": fence_of(batched), "task_output": {}},
    ]});
    let batch = s.tasks.put("/api/tasks/complete", &batch).await;
    assert_eq!(batch.status, 200, "{:?}", batch.body);
    assert_eq!(verdicts(&batch.body["results"]), [(409, "lease_revoked")]);

    // The sample worker's requests (no fence) are refused alike.
    let sample = s
        .complete(ids[1], json!({"processor": "w", "task_output": {}}))
        .await;
    assert_eq!((sample.status, sample.code()), (409, "lease_revoked"));
    let after = snapshot(&s.task_db, "tasks").await;
    assert_eq!(after, before, "no refusal wrote anything");
    assert!(
        after.iter().all(|t| t.contains(r#""status":"running""#)),
        "{after:?}"
    );
}

/// Listings filter by who last claimed a task, its concurrency key and when it was created,
/// together with status and queue; a bad filter is 400 and names its field.
#[tokio::test]
async fn listings_filter_by_processor_key_and_creation_time() {
    let s = stack(&[]).await;
    let a = s
        .create_id(json!({"task_data": {}, "queue": "f", "concurrency_key": "acme"}))
        .await;
    let b = s
        .create_id(json!({"task_data": {}, "queue": "f", "concurrency_key": "globex"}))
        .await;
    let c = s.create_id(json!({"task_data": {}, "queue": "f"})).await;
    // Claimed oldest first: alice takes a, bob takes b.
    for processor in ["alice", "bob"] {
        let claimed = s
            .tasks
            .post(
                "/api/tasks/next",
                &json!({"processor": processor, "queue": "f"}),
            )
            .await;
        assert_eq!(claimed.status, 202, "{:?}", claimed.body);
    }
    let tasks = &s.tasks;
    let ids = |query: &str| {
        let path = format!("/api/tasks?queue=f&order=asc&{query}");
        async move {
            let listed = tasks.get(&path).await;
            assert_eq!(listed.status, 200, "{path}: {:?}", listed.body);
            listed.body["tasks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["id"].as_i64().unwrap())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(ids("processor=alice").await, vec![a]);
    assert_eq!(ids("processor=bob&status=running").await, vec![b]);
    assert_eq!(ids("processor=bob&status=pending").await, Vec::<i64>::new());
    assert_eq!(ids("key=globex").await, vec![b]);
    // By the database's own creation times, read back from the tasks.
    let created = |id: i64| {
        let path = format!("/api/tasks/{id}");
        async move {
            tasks.get(&path).await.body["task"]["createdAt"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    };
    let (at_b, at_c) = (created(b).await, created(c).await);
    let encode = |at: &str| at.replace('+', "%2B");
    assert_eq!(
        ids(&format!("created_after={}", encode(&at_b))).await,
        vec![b, c]
    );
    assert_eq!(
        ids(&format!(
            "created_after={}&created_before={}",
            encode(&at_b),
            encode(&at_c)
        ))
        .await,
        vec![b]
    );
    // Bounds beyond the years every task's time lies in (by UTC, as their offsets place
    // them) filter as the first or last instant of those years would.
    for (query, listed) in [
        ("created_after=0000-01-01T00:00:00Z", vec![a, b, c]),
        ("created_after=0001-01-01T00:00:00%2B16:36", vec![a, b, c]),
        ("created_before=0001-01-01T00:00:00%2B16:36", vec![]),
        ("created_after=9999-12-31T23:59:59-23:59", vec![]),
        ("created_before=9999-12-31T23:59:59-23:59", vec![a, b, c]),
    ] {
        assert_eq!(ids(query).await, listed, "{query}");
    }
    for (query, field) in [
        ("processor=", "processor"),
        (&format!("key={}", "k".repeat(256)) as &str, "key"),
    ] {
        let refused = s.tasks.get(&format!("/api/tasks?{query}")).await;
        assert_eq!(
            (refused.status, refused.body["field"].as_str()),
            (400, Some(field)),
            "{query}: {:?}",
            refused.body
        );
    }
    let unreadable = s.tasks.get("/api/tasks?created_after=yesterday").await;
    assert_eq!(
        (unreadable.status, unreadable.code()),
        (400, "invalid_query")
    );
}
