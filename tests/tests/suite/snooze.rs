//! Snooze: a worker puts its task off (`PUT /api/tasks/{id}/snooze`) without charging the
//! attempt; the task is pending again, due after the delay, its lease released with the fence.
//! Against real lease-service and task-service processes, and through the worker library's
//! `TaskFailure::snooze`.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_worker::{TaskFailure, WorkerConfig, handler_fn, run};
use serde_json::json;
use tests::{eventually, execute, snapshot};

tests::stack_with_helpers!(Stack);

async fn stack() -> Stack {
    Stack(tests::Stack::start(&[]).await)
}

impl Stack {
    /// A new task, claimed by `w`: its id and fence.
    async fn claimed(&self) -> (i64, i64) {
        let created = self
            .tasks
            .post("/api/tasks", &json!({"task_data": {}}))
            .await;
        assert_eq!(created.status, 201);
        let claim = self
            .tasks
            .post("/api/tasks/next", &json!({"processor": "w"}))
            .await;
        assert_eq!(claim.status, 202, "{:?}", claim.body);
        (
            claim.body["id"].as_i64().unwrap(),
            claim.body["fence"].as_i64().unwrap(),
        )
    }

    async fn snooze(&self, id: i64, body: serde_json::Value) -> tests::Answer {
        self.tasks
            .put(&format!("/api/tasks/{id}/snooze"), &body)
            .await
    }
}

#[tokio::test]
async fn a_snoozed_task_waits_its_delay_uncharged_and_its_lease_is_released() {
    let s = stack().await;
    let (id, fence) = s.claimed().await;
    let active = format!("/api/leases/active?resource=task:{id}");
    let held = s.leases.get(&active).await.body["leases"].clone();
    assert_eq!(held.as_array().map(Vec::len), Some(1), "{held}");
    let snoozed = s
        .snooze(
            id,
            json!({"processor": "w", "fence": fence, "seconds": 3600}),
        )
        .await;
    assert_eq!(snoozed.status, 202, "{:?}", snoozed.body);
    assert_eq!(
        (&snoozed.body["status"], &snoozed.body["attempts"]),
        (&json!("pending"), &json!(0)),
        "{:?}",
        snoozed.body
    );
    // Due in an hour by the database's clock, and not claimable before.
    let later = format!(
        "SELECT 1 FROM tasks WHERE id = {id} AND scheduled_at > now() + interval '3500 seconds'"
    );
    assert_eq!(execute(&s.task_db, &later).await, 1);
    let claim = s
        .tasks
        .post("/api/tasks/next", &json!({"processor": "w2"}))
        .await;
    assert_eq!(claim.status, 200, "{:?}", claim.body);
    // The lease was released: nothing is active under the task's resource.
    let released = s.leases.get(&active).await;
    assert_eq!(released.body["leases"], json!([]), "{:?}", released.body);
    // The snoozing worker's fence no longer completes it.
    let late = s
        .tasks
        .put(
            &format!("/api/tasks/{id}/complete"),
            &json!({"processor": "w", "fence": fence, "task_output": {}}),
        )
        .await;
    assert_eq!(late.status, 409, "{:?}", late.body);
}

#[tokio::test]
async fn a_zero_second_snooze_is_claimable_at_once_as_the_same_attempt() {
    let s = stack().await;
    let (id, fence) = s.claimed().await;
    let snoozed = s
        .snooze(id, json!({"processor": "w", "fence": fence, "seconds": 0}))
        .await;
    assert_eq!(snoozed.status, 202, "{:?}", snoozed.body);
    let claim = s
        .tasks
        .post("/api/tasks/next", &json!({"processor": "w2"}))
        .await;
    assert_eq!(claim.status, 202, "{:?}", claim.body);
    assert_eq!(claim.body["id"].as_i64(), Some(id));
    assert_eq!(claim.body["attempts"], 1, "the snooze charged no attempt");
}

#[tokio::test]
async fn a_bad_snooze_is_refused_and_writes_nothing() {
    let s = stack().await;
    let (id, fence) = s.claimed().await;
    let before = snapshot(&s.task_db, "tasks").await;
    for (body, status, code) in [
        (
            json!({"processor": "w", "fence": fence, "seconds": -1}),
            400,
            "invalid_snooze",
        ),
        (
            json!({"processor": "w", "fence": fence, "seconds": 1e12}),
            400,
            "invalid_snooze",
        ),
        (
            json!({"processor": "w", "fence": fence}),
            400,
            "missing_field",
        ),
        (
            json!({"processor": "w", "fence": fence + 1, "seconds": 1}),
            409,
            "lease_lost",
        ),
        (
            json!({"processor": "other", "seconds": 1}),
            409,
            "not_owner",
        ),
    ] {
        let answer = s.snooze(id, body.clone()).await;
        assert_eq!(
            (answer.status, answer.body["code"].as_str()),
            (status, Some(code)),
            "{body}: {:?}",
            answer.body
        );
    }
    assert_eq!(snapshot(&s.task_db, "tasks").await, before);
}

/// The worker library: a handler that answers `TaskFailure::snooze` puts its task off; the next
/// claim runs it, as the same attempt.
#[tokio::test]
async fn a_handler_snoozes_through_the_worker_library() {
    let s = stack().await;
    let created = s
        .tasks
        .post("/api/tasks", &json!({"task_data": {"n": 1}}))
        .await;
    let id = created.body["id"].as_i64().unwrap();
    let seen: Arc<Mutex<HashSet<i64>>> = Arc::default();
    let handler = handler_fn(move |task, _cancel| {
        let first = seen.lock().unwrap().insert(task.id);
        async move {
            if first {
                Err(TaskFailure::snooze(Duration::from_millis(300)))
            } else {
                Ok(json!({"done": true}))
            }
        }
    });
    let mut config = WorkerConfig::new([s.tasks.base_url()]);
    config.worker_id = Some("snoozer".to_owned());
    config.claim_wait_ms = 1_000;
    let stop = tokio_util::sync::CancellationToken::new();
    let worker = tokio::spawn(run(config, handler, stop.clone().cancelled_owned()));
    eventually(Duration::from_secs(20), "the task to succeed", || async {
        s.tasks.get(&format!("/api/tasks/{id}")).await.body["task"]["status"] == "succeeded"
    })
    .await;
    stop.cancel();
    worker.await.unwrap().unwrap();
    let task = s.tasks.get(&format!("/api/tasks/{id}")).await.body["task"].clone();
    assert_eq!(task["attempts"], 1, "{task}");
    let events = s.tasks.get(&format!("/api/tasks/{id}/events")).await.body["events"].clone();
    let path: Vec<&str> = events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["toStatus"].as_str().unwrap())
        .collect();
    assert_eq!(
        path,
        ["pending", "running", "pending", "running", "succeeded"]
    );
}

/// The dashboard's charts count a failure only when it charged its attempt: a snooze moves the
/// task back to pending without counting as failed, and the claim after it does not count as a
/// first pickup; a failure that charges its attempt does count.
#[tokio::test]
async fn the_charts_tell_a_snooze_from_a_failure() {
    let s = stack().await;
    let (id, fence) = s.claimed().await;
    let snoozed = s
        .snooze(id, json!({"processor": "w", "fence": fence, "seconds": 0}))
        .await;
    assert_eq!(snoozed.status, 202, "{:?}", snoozed.body);
    let again = s
        .tasks
        .post("/api/tasks/next", &json!({"processor": "w"}))
        .await;
    assert_eq!(again.status, 202, "{:?}", again.body);
    let sums = async || {
        let series = s
            .tasks
            .get("/api/dashboard/throughput?window_seconds=300")
            .await;
        assert_eq!(series.status, 200, "{:?}", series.body);
        let buckets = series.body["buckets"].as_array().unwrap().clone();
        let sum = |field: &str| {
            buckets
                .iter()
                .map(|b| b[field].as_i64().unwrap())
                .sum::<i64>()
        };
        let pickups = buckets
            .iter()
            .filter(|b| b["pickupP50Ms"].is_number())
            .count();
        (sum("started"), sum("failed"), pickups)
    };
    // Two claims, no failure, and one first pickup (the same bucket, or two buckets each with
    // one claim of which only the first is a first pickup).
    let (started, failed, pickups) = sums().await;
    assert_eq!((started, failed), (2, 0));
    assert!(pickups <= 1, "{pickups}");
    let failed_now = s
        .tasks
        .put(
            &format!("/api/tasks/{id}/fail"),
            &json!({"processor": "w", "fence": again.body["fence"], "error": "boom"}),
        )
        .await;
    assert_eq!(failed_now.status, 202, "{:?}", failed_now.body);
    let (_, failed, _) = sums().await;
    assert_eq!(failed, 1);
}
