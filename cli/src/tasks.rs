//! `leasehold tasks`: create, list, show, cancel, retry (one or all matching) and tail.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Subcommand;
use leasehold::task_client::{Bulk, TaskCounts, TaskListing};
use leasehold::tasks::{BulkTasks, CreateTask, MAX_CREATE_BATCH, Task, TaskStatus};
use serde_json::{Value, json};

use crate::api::Api;
use crate::out::{Out, PageArgs, WatchArgs, more_hint, pages, task_detail, task_table, time};

/// What `tasks create` asks for when given no `--data`: work the worker finishes, so that a
/// first try (`--count 50 --wait`) shows tasks succeeding.
pub const DEFAULT_TASK_DATA: &str = r#"{"sleep_duration_seconds": 1}"#;

/// The filter of `retry-all` and `cancel-all`.
#[derive(Debug, Clone, clap::Args)]
pub struct BulkArgs {
    /// Only tasks of this queue.
    #[arg(long)]
    queue: Option<String>,
    /// Only tasks in this status (retry-all: dead or cancelled; cancel-all: pending or
    /// running).
    #[arg(long)]
    status: Option<TaskStatusArg>,
    /// Only tasks created before this instant (RFC 3339).
    #[arg(long)]
    created_before: Option<chrono::DateTime<chrono::Utc>>,
}

/// A status named on the command line.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum TaskStatusArg {
    Pending,
    Running,
    Succeeded,
    Dead,
    Cancelled,
}

impl From<TaskStatusArg> for TaskStatus {
    fn from(arg: TaskStatusArg) -> Self {
        match arg {
            TaskStatusArg::Pending => TaskStatus::Pending,
            TaskStatusArg::Running => TaskStatus::Running,
            TaskStatusArg::Succeeded => TaskStatus::Succeeded,
            TaskStatusArg::Dead => TaskStatus::Dead,
            TaskStatusArg::Cancelled => TaskStatus::Cancelled,
        }
    }
}

/// What a bulk verb does, in words, and the statuses it takes when none is named (the
/// service's own defaults).
fn bulk_words(operation: Bulk) -> (&'static str, &'static str, &'static str) {
    match operation {
        Bulk::Retry => ("retry", "dead", "put back in their queues"),
        Bulk::Cancel => (
            "cancel",
            "pending,running",
            "cancelled (running ones at their next heartbeat)",
        ),
        Bulk::Delete => ("delete", "succeeded,dead,cancelled", "deleted"),
    }
}

/// A bulk verb over every task matching `filter`: says how many match, asks before touching
/// them (unless `yes`), then touches them a thousand per request until none is left.
async fn bulk(
    api: &Api,
    out: &Out,
    operation: Bulk,
    filter: BulkArgs,
    yes: bool,
) -> anyhow::Result<()> {
    let (verb, default_statuses, done_words) = bulk_words(operation);
    let statuses = filter.status.map_or(default_statuses.to_owned(), |status| {
        TaskStatus::from(status).as_str().to_owned()
    });
    let matching = count_tasks(api, Some(&statuses), filter.queue.as_deref()).await?;
    let what = format!(
        "{}{matching} {statuses} tasks{}",
        if filter.created_before.is_some() {
            "at most "
        } else {
            ""
        },
        filter
            .queue
            .as_deref()
            .map_or_else(String::new, |queue| format!(" of queue {queue}")),
    );
    if matching == 0 {
        out.note(&format!("no {statuses} tasks match; nothing to {verb}"));
    } else if !yes {
        confirm(&format!("{verb} {what}?"))?;
    }
    let touched = if matching == 0 {
        0
    } else {
        bulk_until_done(api, operation, filter, u64::try_from(matching).unwrap_or(0)).await?
    };
    out.value(&json!({ bulk_key(operation): touched }), |_| {
        Ok(format!("{touched} tasks {done_words}"))
    })
}

/// The field of a bulk verb's JSON answer (`{"retried": 3}`).
fn bulk_key(operation: Bulk) -> &'static str {
    match operation {
        Bulk::Retry => "retried",
        Bulk::Cancel => "cancelled",
        Bulk::Delete => "deleted",
    }
}

/// Asks on the terminal; anything but yes is no. Without a terminal to ask on, refuses: a
/// script says `--yes`.
fn confirm(question: &str) -> anyhow::Result<()> {
    use std::io::{BufRead, IsTerminal, Write};
    if !std::io::stdin().is_terminal() {
        return Err(crate::api::usage(format!(
            "{question} Not asked: standard input is not a terminal; add --yes to go ahead"
        )));
    }
    let mut stderr = std::io::stderr().lock();
    write!(stderr, "{question} [y/N] ")?;
    stderr.flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    if is_yes(&answer) {
        Ok(())
    } else {
        Err(crate::api::usage(
            "not confirmed; nothing was changed".to_owned(),
        ))
    }
}

fn is_yes(answer: &str) -> bool {
    matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

/// One read of `tasks list`: the page (or with --all every page), rendered, and the hint of
/// what was left out.
async fn list(
    api: &Api,
    out: &Out,
    listing: &TaskListing,
    page: &PageArgs,
) -> anyhow::Result<(String, Option<String>)> {
    let client = &api.tasks;
    let first = client
        .list(listing)
        .await
        .map_err(api.tasks_failed("GET", "/api/tasks"))?;
    let listed = pages(first, page.all, |cursor| {
        let listing = TaskListing {
            cursor: Some(cursor),
            ..listing.clone()
        };
        async move {
            client
                .list(&listing)
                .await
                .map_err(api.tasks_failed("GET", "/api/tasks"))
        }
    })
    .await?;
    let text = out.render(&listed, |listed| Ok(task_table(&listed.tasks, out.view())))?;
    let mut hint = None;
    if !out.machine() && !page.watch.watch && listed.next_cursor.is_some() {
        // Only to say how many there are: a failure here costs the count, not the list. The
        // counts are by queue and status, so with any other filter the total is not known.
        let counted = listing.processor.is_none()
            && listing.key.is_none()
            && listing.created_after.is_none()
            && listing.created_before.is_none();
        let total = if counted {
            count_tasks(api, listing.status.as_deref(), listing.queue.as_deref())
                .await
                .ok()
        } else {
            None
        };
        hint = more_hint(
            listed.tasks.len(),
            total,
            "tasks",
            page.sort,
            listed.next_cursor.as_deref(),
        );
    }
    Ok((text, hint))
}

/// Runs `operation` until a call touches nothing or `at_most` (the count that was confirmed)
/// are touched, so that tasks matching only since (a producer still creating them) are left
/// alone; the total touched.
async fn bulk_until_done(
    api: &Api,
    operation: Bulk,
    args: BulkArgs,
    at_most: u64,
) -> anyhow::Result<u64> {
    let mut filter = BulkTasks {
        status: args.status.map(TaskStatus::from),
        queue: args.queue,
        created_before: args.created_before,
        ..BulkTasks::default()
    };
    let mut total = 0;
    while total < at_most {
        filter.limit = Some(i64::try_from((at_most - total).min(1000)).unwrap_or(1000));
        let done = api
            .tasks
            .bulk(operation, &filter)
            .await
            .map_err(api.tasks_failed("POST", operation.path()))?;
        if done.touched == 0 {
            break;
        }
        total += done.touched;
    }
    Ok(total)
}

#[derive(Debug, Subcommand)]
pub enum TaskCommand {
    /// Create tasks; with --wait, watch them until none is pending or running.
    Create {
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
    },
    /// List tasks, newest first.
    List {
        /// Comma-separated statuses: pending, running, succeeded, dead, cancelled.
        #[arg(long)]
        status: Option<String>,
        /// Only tasks of this queue.
        #[arg(long)]
        queue: Option<String>,
        /// Only tasks last claimed by this processor (a worker's id).
        #[arg(long)]
        processor: Option<String>,
        /// Only tasks with this concurrency key.
        #[arg(long)]
        key: Option<String>,
        /// Only tasks created at or after this instant (RFC 3339).
        #[arg(long)]
        created_after: Option<chrono::DateTime<chrono::Utc>>,
        /// Only tasks created before this instant (RFC 3339).
        #[arg(long)]
        created_before: Option<chrono::DateTime<chrono::Utc>>,
        #[command(flatten)]
        page: PageArgs,
    },
    /// One task by id.
    Show {
        /// The task's id.
        id: i64,
        #[command(flatten)]
        watch: WatchArgs,
    },
    /// Cancel a task, or with no id every pending and running task matching the filter
    /// (operator role).
    Cancel {
        /// The task's id; without it, every task the filter matches (after a confirmation).
        #[arg(conflicts_with_all = ["queue", "status", "created_before"])]
        id: Option<i64>,
        #[command(flatten)]
        filter: BulkArgs,
        /// Go ahead without asking (for scripts; needed when standard input is not a
        /// terminal).
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// Put a dead task back in its queue, or with no id every dead task (or cancelled, with
    /// --status) matching the filter (operator role).
    Retry {
        /// The task's id; without it, every task the filter matches (after a confirmation).
        #[arg(conflicts_with_all = ["queue", "status", "created_before"])]
        id: Option<i64>,
        #[command(flatten)]
        filter: BulkArgs,
        /// Go ahead without asking (for scripts; needed when standard input is not a
        /// terminal).
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// Delete every finished task (succeeded, dead, cancelled; or one --status) matching the
    /// filter, after a confirmation (operator role).
    Delete {
        #[command(flatten)]
        filter: BulkArgs,
        /// Go ahead without asking (for scripts; needed when standard input is not a
        /// terminal).
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// `retry` with a filter and --yes, as earlier releases spelled it.
    #[command(hide = true)]
    RetryAll {
        #[command(flatten)]
        filter: BulkArgs,
    },
    /// `cancel` with a filter and --yes, as earlier releases spelled it.
    #[command(hide = true)]
    CancelAll {
        #[command(flatten)]
        filter: BulkArgs,
    },
    /// Print tasks as they are created and change status, until Ctrl-C (or --seconds).
    Tail {
        /// Only tasks of this queue.
        #[arg(long)]
        queue: Option<String>,
        /// Stop after this many seconds.
        #[arg(long)]
        seconds: Option<u64>,
        /// How often to look, in milliseconds.
        #[arg(long, default_value_t = 500)]
        interval_ms: u64,
    },
}

pub(crate) async fn tasks(api: &Api, out: &Out, command: TaskCommand) -> anyhow::Result<()> {
    let client = &api.tasks;
    match command {
        TaskCommand::Create {
            data,
            count,
            queue,
            priority,
            max_attempts,
            key,
            wait,
            timeout_seconds,
        } => {
            let task_data: Value =
                serde_json::from_str(&data).context("--data is not valid JSON")?;
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
        TaskCommand::List {
            status,
            queue,
            processor,
            key,
            created_after,
            created_before,
            page,
        } => {
            let listing = TaskListing {
                status,
                queue,
                limit: Some(page.limit),
                cursor: page.cursor.clone(),
                newest_first: page.sort.newest_first(),
                processor,
                key,
                created_after,
                created_before,
            };
            out.watch(&page.watch, || list(api, out, &listing, &page))
                .await
        }
        TaskCommand::Show { id, watch } => {
            out.watch(&watch, || async move {
                let task = show(api, id).await?;
                // The service's answer, which names the task.
                let text = out.render(&json!({ "task": task }), |_| Ok(task_detail(&task)))?;
                Ok((text, None))
            })
            .await
        }
        TaskCommand::Cancel { id: Some(id), .. } => {
            let task = client
                .cancel(id)
                .await
                .map_err(api.tasks_failed("POST", &format!("/api/tasks/{id}/cancel")))?;
            out.value(&task, |task| {
                Ok(task_table(std::slice::from_ref(task), out.view()))
            })
        }
        TaskCommand::Retry { id: Some(id), .. } => {
            let task = client
                .retry(id)
                .await
                .map_err(api.tasks_failed("POST", &format!("/api/tasks/{id}/retry")))?;
            out.value(&task, |task| {
                Ok(task_table(std::slice::from_ref(task), out.view()))
            })
        }
        TaskCommand::Retry {
            id: None,
            filter,
            yes,
        } => bulk(api, out, Bulk::Retry, filter, yes).await,
        TaskCommand::Cancel {
            id: None,
            filter,
            yes,
        } => bulk(api, out, Bulk::Cancel, filter, yes).await,
        TaskCommand::Delete { filter, yes } => bulk(api, out, Bulk::Delete, filter, yes).await,
        TaskCommand::RetryAll { filter } => bulk(api, out, Bulk::Retry, filter, true).await,
        TaskCommand::CancelAll { filter } => bulk(api, out, Bulk::Cancel, filter, true).await,
        TaskCommand::Tail {
            queue,
            seconds,
            interval_ms,
        } => tail(api, out, queue, seconds, interval_ms).await,
    }
}

/// `GET /api/tasks/{id}`.
async fn show(api: &Api, id: i64) -> anyhow::Result<Task> {
    api.tasks
        .task(id)
        .await
        .map_err(api.tasks_failed("GET", &format!("/api/tasks/{id}")))
}

/// `GET /api/tasks/counts`.
async fn counts(api: &Api) -> anyhow::Result<TaskCounts> {
    api.tasks
        .counts()
        .await
        .map_err(api.tasks_failed("GET", "/api/tasks/counts"))
}

/// How many tasks a listing with these filters covers, from the queues' counts.
pub(crate) async fn count_tasks(
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

/// Creates `count` tasks: one `POST /api/tasks` for one, batches of up to 1,000
/// (`POST /api/tasks/batch`, one commit each) for more, showing the count on standard error.
pub(crate) async fn create_many(
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
pub(crate) async fn wait_for_queue(
    api: &Api,
    out: &Out,
    queue: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let counts = counts(api).await?;
        let in_queue = counts.queues.get(queue);
        let of = |status: &str| {
            in_queue
                .and_then(|by_status| by_status.get(status))
                .copied()
                .unwrap_or(0)
        };
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
                // `null` for a queue with no tasks at all, as the counts' JSON has it.
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

/// Prints each task as it appears and each change of its status.
pub(crate) async fn tail(
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
            let task = show(api, id).await?;
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
pub(crate) fn report(out: &Out, task: &Task) -> anyhow::Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_yes_confirms() {
        for answer in ["y\n", "Y", " yes \n", "YES"] {
            assert!(is_yes(answer), "{answer:?}");
        }
        for answer in ["", "\n", "n", "no", "yess", "ok"] {
            assert!(!is_yes(answer), "{answer:?}");
        }
    }

    #[test]
    fn default_task_data_is_work_the_worker_finishes() {
        let data: Value = serde_json::from_str(DEFAULT_TASK_DATA).expect("JSON");
        assert!(
            data["sleep_duration_seconds"]
                .as_f64()
                .is_some_and(|s| s >= 0.0)
        );
    }
}
