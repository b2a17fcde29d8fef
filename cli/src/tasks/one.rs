//! `tasks cancel ID` and `tasks retry ID`: one task, by id.

use crate::api::Api;
use crate::out::{Out, task_table};

pub(super) async fn cancel(api: &Api, out: &Out, id: i64) -> anyhow::Result<()> {
    let task = api
        .tasks
        .cancel(id)
        .await
        .map_err(api.tasks_failed("POST", &format!("/api/tasks/{id}/cancel")))?;
    out.value(&task, |task| {
        Ok(task_table(std::slice::from_ref(task), out.view()))
    })
}

pub(super) async fn retry(api: &Api, out: &Out, id: i64) -> anyhow::Result<()> {
    let task = api
        .tasks
        .retry(id)
        .await
        .map_err(api.tasks_failed("POST", &format!("/api/tasks/{id}/retry")))?;
    out.value(&task, |task| {
        Ok(task_table(std::slice::from_ref(task), out.view()))
    })
}
