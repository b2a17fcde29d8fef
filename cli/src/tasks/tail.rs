//! `tasks tail`: each task as it appears and each change of its status.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use leasehold::task_client::TaskListing;
use leasehold::tasks::{Task, TaskStatus};

use super::show::fetch;
use crate::api::Api;
use crate::out::{Out, time};

/// Prints each task as it appears and each change of its status.
pub(super) async fn tail(
    api: &Api,
    out: &Out,
    queue: Option<String>,
    seconds: Option<u64>,
    interval_ms: u64,
) -> anyhow::Result<()> {
    let stop = seconds.map(|s| Instant::now() + Duration::from_secs(s));
    // Tasks not yet final, by id, with the status last printed.
    let mut watching: BTreeMap<i64, TaskStatus> = BTreeMap::new();
    // Start from the newest task: only what happens from now on is printed.
    let newest = TaskListing {
        limit: Some(1),
        newest_first: true,
        ..TaskListing::default()
    };
    let newest = api
        .tasks
        .list(&newest)
        .await
        .map_err(api.tasks_failed("GET", "/api/tasks"))?;
    let mut cursor = newest.tasks.first().map_or(0, |task| task.id);
    loop {
        loop {
            // Oldest first from the cursor on: each task once, in the order it was created.
            let after = TaskListing {
                queue: queue.clone(),
                limit: Some(1000),
                cursor: Some(cursor.to_string()),
                ..TaskListing::default()
            };
            let page = api
                .tasks
                .list(&after)
                .await
                .map_err(api.tasks_failed("GET", "/api/tasks"))?;
            for task in &page.tasks {
                cursor = cursor.max(task.id);
                report(out, task)?;
                if !task.status.is_final() {
                    watching.insert(task.id, task.status);
                }
            }
            if page.next_cursor.is_none() || page.tasks.is_empty() {
                break;
            }
        }
        let ids: Vec<i64> = watching.keys().copied().take(500).collect();
        for id in ids {
            let task = fetch(api, id).await?;
            if watching.get(&id) != Some(&task.status) {
                report(out, &task)?;
            }
            if task.status.is_final() {
                watching.remove(&id);
            } else {
                watching.insert(id, task.status);
            }
        }
        if stop.is_some_and(|stop| Instant::now() >= stop) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(interval_ms)).await;
    }
}

/// One line of `tail`: a JSON object per line with --json.
fn report(out: &Out, task: &Task) -> anyhow::Result<()> {
    if out.machine() {
        return out.line(&serde_json::to_string(task)?);
    }
    out.line(&format!(
        "{}  task {:<8} {:<10} queue={} processor={} attempts={}",
        time(&task.updated_at),
        task.id,
        task.status.as_str(),
        task.queue,
        task.processor.as_deref().unwrap_or("-"),
        task.attempts
    ))
}
