//! The queues' counts by status, which `list`'s hint, `bulk`'s confirmation and `create --wait`
//! read.

use anyhow::Context;
use leasehold::task_client::TaskCounts;

use crate::api::Api;

/// `GET /api/tasks/counts`.
pub(super) async fn counts(api: &Api) -> anyhow::Result<TaskCounts> {
    api.tasks
        .counts()
        .await
        .map_err(api.tasks_failed("GET", "/api/tasks/counts"))
}

/// How many tasks a listing with these filters covers, from the queues' counts.
pub(super) async fn count_tasks(
    api: &Api,
    status: Option<&str>,
    queue: Option<&str>,
) -> anyhow::Result<i64> {
    let counts = counts(api).await?;
    let by_status = match queue {
        Some(queue) => counts.queues.get(queue),
        None => Some(&counts.total),
    };
    let wanted: Vec<&str> = status.map_or_else(Vec::new, |s| s.split(',').map(str::trim).collect());
    let by_status = by_status.context("counts without statuses")?;
    Ok(by_status
        .iter()
        .filter(|(status, _)| wanted.is_empty() || wanted.contains(&status.as_str()))
        .map(|(_, n)| n)
        .sum())
}
