//! `tasks show`: one task by id.

use leasehold::tasks::Task;
use serde_json::json;

use crate::api::Api;
use crate::out::{Out, Shown, WatchArgs, task_detail};

pub(super) async fn show(api: &Api, out: &Out, id: i64, watch: &WatchArgs) -> anyhow::Result<()> {
    out.watch(watch, || async move {
        let task = fetch(api, id).await?;
        // The service's answer, which names the task.
        let text = out.render(&json!({ "task": task }), |_| Ok(task_detail(&task)))?;
        Ok(Shown::new(text).last(task.status.is_final()))
    })
    .await
}

/// `GET /api/tasks/{id}`.
pub(super) async fn fetch(api: &Api, id: i64) -> anyhow::Result<Task> {
    api.tasks
        .task(id)
        .await
        .map_err(api.tasks_failed("GET", &format!("/api/tasks/{id}")))
}
