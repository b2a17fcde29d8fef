//! Every task a filter matches, at once: `tasks cancel` and `retry` without an id, `delete`,
//! and the older spellings `retry-all` and `cancel-all`.

use leasehold::task_client::Bulk;
use leasehold::tasks::{BulkTasks, TaskStatus};
use serde_json::json;

use super::counts::count_tasks;
use crate::api::Api;
use crate::out::Out;

/// The filter of a bulk verb: every filter the bulk routes take (`BulkTasks`).
#[derive(Debug, Clone, clap::Args)]
pub struct BulkArgs {
    /// Only tasks of this queue.
    #[arg(long)]
    queue: Option<String>,
    /// Only tasks in this status (retry: dead or cancelled; cancel: pending or running;
    /// delete: succeeded, dead or cancelled).
    #[arg(long)]
    status: Option<TaskStatusArg>,
    /// Only tasks last claimed by this processor (a worker's name).
    #[arg(long)]
    processor: Option<String>,
    /// Only tasks with this concurrency key.
    #[arg(long)]
    key: Option<String>,
    /// Only these tasks (comma-separated ids, at most 1,000).
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    ids: Option<Vec<i64>>,
    /// Only tasks created at or after this instant (RFC 3339).
    #[arg(long)]
    created_after: Option<chrono::DateTime<chrono::Utc>>,
    /// Only tasks created before this instant (RFC 3339).
    #[arg(long)]
    created_before: Option<chrono::DateTime<chrono::Utc>>,
    /// At most this many tasks in all.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    limit: Option<u64>,
}

impl BulkArgs {
    /// Whether a filter narrows the match below what the counts by queue and status tell:
    /// the confirmation then says "at most".
    fn narrower_than_counts(&self) -> bool {
        self.processor.is_some()
            || self.key.is_some()
            || self.ids.is_some()
            || self.created_after.is_some()
            || self.created_before.is_some()
            || self.limit.is_some()
    }

    /// The filters beside queue and status, in words, for the confirmation.
    fn words(&self) -> String {
        let mut words = String::new();
        if let Some(queue) = &self.queue {
            words.push_str(&format!(" of queue {queue}"));
        }
        if let Some(processor) = &self.processor {
            words.push_str(&format!(" last claimed by {processor}"));
        }
        if let Some(key) = &self.key {
            words.push_str(&format!(" with key {key}"));
        }
        if let Some(ids) = &self.ids {
            words.push_str(&format!(" among {} ids", ids.len()));
        }
        if let Some(after) = &self.created_after {
            words.push_str(&format!(" created at or after {}", after.to_rfc3339()));
        }
        if let Some(before) = &self.created_before {
            words.push_str(&format!(" created before {}", before.to_rfc3339()));
        }
        words
    }
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
pub(super) async fn bulk(
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
    let counted = count_tasks(api, Some(&statuses), filter.queue.as_deref()).await?;
    let counted = u64::try_from(counted).unwrap_or(0);
    let bounds = [
        Some(counted),
        filter.ids.as_ref().map(|ids| ids.len() as u64),
        filter.limit,
    ];
    let matching = bounds.into_iter().flatten().min().unwrap_or(counted);
    let what = format!(
        "{}{matching} {statuses} tasks{}",
        if filter.narrower_than_counts() {
            "at most "
        } else {
            ""
        },
        filter.words(),
    );
    if matching == 0 {
        out.note(&format!("no {statuses} tasks match; nothing to {verb}"));
    } else if !yes {
        confirm(&format!("{verb} {what}?"))?;
    }
    let touched = if matching == 0 {
        0
    } else {
        bulk_until_done(api, operation, filter, matching).await?
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
        processor: args.processor,
        key: args.key,
        ids: args.ids,
        created_after: args.created_after,
        created_before: args.created_before,
        limit: None,
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
}
