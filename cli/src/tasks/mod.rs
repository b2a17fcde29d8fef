//! `leasehold tasks`: create, list, show, cancel, retry (one or all matching) and tail.
//!
//! This file holds the subcommands and sends each to its module: `create`, `list`, `show`,
//! `one` (cancel or retry one task by id), `bulk` (cancel, retry or delete every task a
//! filter matches) and `tail`; `counts` is the read of the queues' counts that several share.

mod bulk;
mod counts;
mod create;
mod list;
mod one;
mod show;
mod tail;

use clap::Subcommand;
use leasehold::task_client::Bulk;

use self::bulk::BulkArgs;
use self::create::CreateArgs;
use self::list::ListArgs;
use crate::api::Api;
use crate::out::{Out, WatchArgs};

/// What `tasks create` asks for when given no `--data`: work the worker finishes, so that a
/// first try (`--count 50 --wait`) shows tasks succeeding.
pub const DEFAULT_TASK_DATA: &str = r#"{"sleep_duration_seconds": 1}"#;

#[derive(Debug, Subcommand)]
pub enum TaskCommand {
    /// Create tasks; with --wait, watch them until none is pending or running.
    Create(CreateArgs),
    /// List tasks, newest first.
    List(ListArgs),
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
    match command {
        TaskCommand::Create(args) => create::create(api, out, args).await,
        TaskCommand::List(args) => list::list(api, out, args).await,
        TaskCommand::Show { id, watch } => show::show(api, out, id, &watch).await,
        TaskCommand::Cancel { id: Some(id), .. } => one::cancel(api, out, id).await,
        TaskCommand::Retry { id: Some(id), .. } => one::retry(api, out, id).await,
        TaskCommand::Retry {
            id: None,
            filter,
            yes,
        } => bulk::bulk(api, out, Bulk::Retry, filter, yes).await,
        TaskCommand::Cancel {
            id: None,
            filter,
            yes,
        } => bulk::bulk(api, out, Bulk::Cancel, filter, yes).await,
        TaskCommand::Delete { filter, yes } => {
            bulk::bulk(api, out, Bulk::Delete, filter, yes).await
        }
        TaskCommand::RetryAll { filter } => bulk::bulk(api, out, Bulk::Retry, filter, true).await,
        TaskCommand::CancelAll { filter } => bulk::bulk(api, out, Bulk::Cancel, filter, true).await,
        TaskCommand::Tail {
            queue,
            seconds,
            interval_ms,
        } => tail::tail(api, out, queue, seconds, interval_ms).await,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

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
