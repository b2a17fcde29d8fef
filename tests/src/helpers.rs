//! Small helpers the tests assert with: waiting for a condition, and reading metrics and batch
//! answers.

use std::time::{Duration, Instant};

use serde_json::Value;

/// Polls `check` every 100 ms until it holds; panics naming `what` after `timeout`.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The sum of the samples in Prometheus text `metrics` whose line starts with `prefix` (a name,
/// or a name with `{` and leading labels, to pick series).
pub fn metric_sum(metrics: &str, prefix: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Each item of a batch answer's `results`: its status and its error code (`""` when none).
pub fn verdicts(results: &Value) -> Vec<(i64, &str)> {
    results
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["status"].as_i64().unwrap(),
                r["error"]["code"].as_str().unwrap_or(""),
            )
        })
        .collect()
}

/// Whether task-service's counts say no task is pending or running (`false` when it does not
/// answer).
pub async fn all_tasks_final(tasks: &leasehold::TaskClient) -> bool {
    match tasks.counts().await {
        Ok(counts) => ["pending", "running"]
            .iter()
            .all(|status| counts.total.get(*status).copied().unwrap_or(0) == 0),
        Err(_) => false,
    }
}

/// A typed client's refusal as `(status, code)`, to assert on as a raw answer's; panics on a
/// transient failure, which is no answer to assert on.
pub fn refusal(err: &leasehold::CallError) -> (u16, &str) {
    match err {
        leasehold::CallError::Refused { status, code, .. } => (*status, code.as_str()),
        leasehold::CallError::Transient(reason) => panic!("no answer, not a refusal: {reason}"),
    }
}

/// A task to create with `task_data` and task-service's defaults for everything else.
pub fn new_task(task_data: Value) -> leasehold::tasks::CreateTask {
    leasehold::tasks::CreateTask {
        task_data,
        ..leasehold::tasks::CreateTask::default()
    }
}

/// Creates `task` through `tasks` and asserts that task-service stored a new task (201, not
/// the repeat of an idempotent create); the task.
pub async fn create_new(
    tasks: &leasehold::TaskClient,
    task: &leasehold::tasks::CreateTask,
) -> leasehold::tasks::Task {
    match tasks.create(task).await {
        Ok(leasehold::task_client::Created::New(task)) => task,
        other => panic!("expected a new task (201): {other:?}"),
    }
}

/// Whether a pg_auto_failover formation can run here: `pg_autoctl` is found, or installed (as
/// root, with apt). When it cannot be, prints the command to run, for the test to skip; any
/// other trouble fails the test.
pub async fn pg_auto_failover_available() -> bool {
    use leasehold_local::postgres::{PgError, formation};
    match tokio::task::spawn_blocking(formation::ensure_installed)
        .await
        .unwrap()
    {
        Ok(_) => true,
        Err(PgError::AutoFailoverMissing { command }) => {
            println!("skipped: pg_auto_failover is not installed; run `{command}`");
            false
        }
        Err(other) => panic!("{other}"),
    }
}

/// Revokes worker process `id`'s liveness lease (`worker:<id>`) at lease-service `leases`, as an
/// operator would: the lease that covers the process's tasks.
pub async fn revoke_worker_lease(leases: &crate::Service, id: &str) {
    let lease = leases
        .get(&format!("/api/leases/active?resource=worker:{id}"))
        .await
        .body["leases"][0]
        .clone();
    let revoked = leases
        .post(
            &format!("/api/leases/{}/revoke", lease["id"]),
            &serde_json::json!({}),
        )
        .await;
    assert_eq!(revoked.status, 200, "{:?}", revoked.body);
}
