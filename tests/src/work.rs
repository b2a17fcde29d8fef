//! What the tests of work in any language share (the worker's exec and push modes, and the
//! examples in other languages): creating a task, waiting for it to settle, a scratch folder,
//! and whether a process is gone.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::{Value, json};

use crate::eventually;

/// Creates a task of `data` with one attempt; its id.
pub async fn create_once(stack: &crate::Stack, data: Value) -> i64 {
    let answer = stack
        .tasks
        .post("/api/tasks", &json!({"task_data": data, "max_attempts": 1}))
        .await;
    assert_eq!(answer.status, 201, "{:?}", answer.body);
    answer.body["id"].as_i64().unwrap()
}

/// An operator's cancel of task `id`, accepted: at once (200) or at its next heartbeat (202).
pub async fn cancel(stack: &crate::Stack, id: i64) {
    let cancelled = stack
        .tasks
        .post(&format!("/api/tasks/{id}/cancel"), &json!({}))
        .await;
    assert!(
        [200, 202].contains(&cancelled.status),
        "{:?}",
        cancelled.body
    );
}

/// Task `id` as `GET /api/tasks/{id}` holds it under `task`.
pub async fn task(stack: &crate::Stack, id: i64) -> Value {
    stack.tasks.get(&format!("/api/tasks/{id}")).await.body["task"].clone()
}

/// Waits until task `id` leaves `running`/`pending` (or, with `snoozed`, is pending again
/// after a run) and returns it.
pub async fn settled(stack: &crate::Stack, id: i64) -> Value {
    eventually(Duration::from_secs(30), "the task to settle", || async {
        let t = task(stack, id).await;
        matches!(
            t["status"].as_str(),
            Some("succeeded" | "dead" | "cancelled")
        ) || (t["status"] == "pending" && t["lastError"].is_string())
    })
    .await;
    task(stack, id).await
}

/// A folder of this test process's own for the commands' pid files; gone when dropped.
#[derive(Debug)]
pub struct Scratch(pub std::path::PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("leasehold-exec-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether process `pid` is gone (or only a zombie, which runs nothing).
pub fn gone(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| stat.contains(") Z "))
}

/// Waits until task `id` is pending again, snoozed (its attempt not charged) more than 10 s
/// past its creation, and returns in how many seconds it is due, by the database's clock.
pub async fn snoozed_for(stack: &crate::Stack, id: i64) -> f64 {
    let snoozed = format!(
        "SELECT EXTRACT(EPOCH FROM scheduled_at - now())::float8 AS seconds FROM tasks \
         WHERE id = {id} AND status = 'pending' AND attempts = 0 \
         AND scheduled_at > created_at + interval '10 seconds'"
    );
    eventually(Duration::from_secs(30), "the snooze", || async {
        !crate::query(&stack.task_db, &snoozed).await.is_empty()
    })
    .await;
    crate::query(&stack.task_db, &snoozed).await[0]["seconds"]
        .as_f64()
        .unwrap()
}
