//! `tasks create`: one task or many, and with --wait the queue's counts until it is drained.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use leasehold::tasks::{CreateTask, MAX_CREATE_BATCH, Task};
use serde_json::Value;

use super::DEFAULT_TASK_DATA;
use super::counts::queue_counts;
use crate::api::Api;
use crate::out::{Out, task_table};

#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    /// The task's data, as a JSON object (the worker sleeps `sleep_duration_seconds`).
    #[arg(long, default_value = DEFAULT_TASK_DATA)]
    data: String,
    /// How many tasks to create.
    #[arg(long, default_value_t = 1)]
    count: u32,
    /// The queue to put them in (`default` when absent).
    #[arg(long)]
    queue: Option<String>,
    /// Higher is claimed first, from -1000 to 1000 (0 when absent).
    #[arg(long)]
    priority: Option<i32>,
    /// Claims a failing task gets before it is dead (the service's default when absent).
    #[arg(long)]
    max_attempts: Option<i32>,
    /// The tenant (customer, account) the tasks work for: held by the queue's limit per key.
    #[arg(long)]
    key: Option<String>,
    /// Wait until the queue has no pending or running task, showing a live count.
    #[arg(long)]
    wait: bool,
    /// Give up waiting after this many seconds (exit 1).
    #[arg(long, default_value_t = 600)]
    timeout_seconds: u64,
}

pub(super) async fn create(api: &Api, out: &Out, args: CreateArgs) -> anyhow::Result<()> {
    let CreateArgs {
        data,
        count,
        queue,
        priority,
        max_attempts,
        key,
        wait,
        timeout_seconds,
    } = args;
    let task_data: Value = serde_json::from_str(&data).context("--data is not valid JSON")?;
    let request = CreateTask {
        task_data,
        queue,
        priority,
        max_attempts,
        concurrency_key: key,
        ..CreateTask::default()
    };
    let created = create_many(api, out, &request, count).await?;
    if out.machine() || created.len() <= 20 {
        out.value(&created, |tasks| Ok(task_table(tasks, out.view())))?;
    } else {
        out.line(&format!("created {} tasks", created.len()))?;
    }
    if wait {
        let queue = created
            .first()
            .map_or("default", |task| task.queue.as_str())
            .to_owned();
        wait_for_queue(api, out, &queue, Duration::from_secs(timeout_seconds)).await?;
    }
    Ok(())
}

/// Creates `count` tasks: one `POST /api/tasks` for one, batches of up to 1,000
/// (`POST /api/tasks/batch`, one commit each) for more, showing the count on standard error.
async fn create_many(
    api: &Api,
    out: &Out,
    request: &CreateTask,
    count: u32,
) -> anyhow::Result<Vec<Task>> {
    if count == 1 {
        let task = api
            .tasks
            .create(request)
            .await
            .map_err(api.tasks_failed("POST", "/api/tasks"))?;
        return Ok(vec![task.into_task()]);
    }
    let mut created = Vec::with_capacity(usize::try_from(count).unwrap_or(0));
    let mut remaining = count;
    while remaining > 0 {
        let wave = remaining.min(u32::try_from(MAX_CREATE_BATCH).unwrap_or(u32::MAX));
        let batch: Vec<CreateTask> = (0..wave).map(|_| request.clone()).collect();
        let results = api
            .tasks
            .create_many(&batch)
            .await
            .map_err(api.tasks_failed("POST", "/api/tasks/batch"))?;
        for result in results {
            match (result.task, result.error) {
                (Some(task), _) => created.push(task),
                (None, error) => anyhow::bail!(
                    "task-service refused a create of the batch ({}): {}",
                    result.status,
                    error.map_or_else(String::new, |e| format!("{} ({})", e.error, e.code))
                ),
            }
        }
        remaining -= wave;
        if count > 1 {
            out.progress(
                &format!("created {}/{count}", created.len()),
                remaining == 0,
            );
        }
    }
    Ok(created)
}

/// Shows the queue's counts until nothing in it is pending or running.
async fn wait_for_queue(
    api: &Api,
    out: &Out,
    queue: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let in_queue = queue_counts(api, queue).await?;
        let of = |status: &str| in_queue.get(status).copied().unwrap_or(0);
        let line = format!(
            "{queue}: pending {}, running {}, succeeded {}, dead {}, cancelled {}",
            of("pending"),
            of("running"),
            of("succeeded"),
            of("dead"),
            of("cancelled")
        );
        if of("pending") == 0 && of("running") == 0 {
            out.progress(&line, true);
            if out.machine() {
                // The queue's counts by status, zeros for a queue with no task.
                out.value(&in_queue, |_| Ok(String::new()))?;
            }
            return Ok(());
        }
        if Instant::now() > deadline {
            out.progress(&line, true);
            bail!("tasks in {queue} still pending or running after {timeout:?}");
        }
        out.progress(&line, false);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
