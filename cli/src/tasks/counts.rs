//! The queues' counts by status, which `list`'s hint, `bulk`'s confirmation and `create --wait`
//! read.

use leasehold::task_client::TaskCounts;

use crate::api::Api;

/// `GET /api/tasks/counts`.
pub(super) async fn counts(api: &Api) -> anyhow::Result<TaskCounts> {
    api.tasks
        .counts()
        .await
        .map_err(api.tasks_failed("GET", "/api/tasks/counts"))
}

/// How many tasks a listing with these filters covers, from the counts: one queue's, or the
/// total over every queue.
pub(super) async fn count_tasks(
    api: &Api,
    status: Option<&str>,
    queue: Option<&str>,
) -> anyhow::Result<i64> {
    let by_status = match queue {
        Some(queue) => queue_counts(api, queue).await?,
        None => counts(api).await?.total,
    };
    let wanted: Vec<&str> = status.map_or_else(Vec::new, |s| s.split(',').map(str::trim).collect());
    Ok(by_status
        .iter()
        .filter(|(status, _)| wanted.is_empty() || wanted.contains(&status.as_str()))
        .map(|(_, n)| n)
        .sum())
}

/// `GET /api/tasks/counts?queue=`: one queue's counts by status.
pub(super) async fn queue_counts(
    api: &Api,
    queue: &str,
) -> anyhow::Result<std::collections::BTreeMap<String, i64>> {
    api.tasks
        .queue_counts(queue)
        .await
        .map_err(api.tasks_failed("GET", "/api/tasks/counts"))
}
