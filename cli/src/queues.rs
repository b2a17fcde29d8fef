//! `leasehold queues`: list, show, pause, resume and limit.

use clap::Subcommand;
use leasehold::queues::{QueueSettings, RateLimit};
use leasehold::task_client::QueueListing;

use crate::api::Api;
use crate::out::{Out, Shown, WatchArgs, pages, queue_table};

#[derive(Debug, Subcommand)]
pub enum QueueCommand {
    /// The queues with tasks or settings, by name: paused or not, counts, oldest due task.
    List {
        #[command(flatten)]
        watch: WatchArgs,
        /// At most this many (a page is at most 1000).
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Every one: page after page of --limit, until the last.
        #[arg(long, conflicts_with = "cursor")]
        all: bool,
        /// Continue from an earlier page: the cursor its hint (or its `nextCursor`) gave.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// One queue.
    Show {
        /// The queue's name.
        queue: String,
    },
    /// Stop claims from handing out the queue's tasks; running ones finish, creates still
    /// succeed (operator role).
    Pause {
        /// The queue's name.
        queue: String,
    },
    /// Let claims hand out the queue's tasks again (operator role).
    Resume {
        /// The queue's name.
        queue: String,
    },
    /// Set the queue's limits; a limit not given is lifted (operator role).
    Limit {
        /// The queue's name.
        queue: String,
        /// At most this many of its tasks running at once, across all workers and replicas.
        #[arg(long)]
        concurrency: Option<i32>,
        /// At most this many of its running tasks of one concurrency key (`tasks create --key`);
        /// claims take turns across keys.
        #[arg(long)]
        key_concurrency: Option<i32>,
        /// At most this many of its tasks started per second (with --burst).
        #[arg(long, requires = "burst")]
        rate: Option<f64>,
        /// The most tasks started at once before the rate applies (with --rate).
        #[arg(long, requires = "rate")]
        burst: Option<i32>,
    },
}

pub(crate) async fn queues(api: &Api, out: &Out, command: QueueCommand) -> anyhow::Result<()> {
    let client = &api.tasks;
    let state = match command {
        QueueCommand::List {
            watch,
            limit,
            all,
            cursor,
        } => {
            let listing = QueueListing {
                limit: Some(limit),
                cursor,
                descending: false,
            };
            return out
                .watch(&watch, || async {
                    let read = |listing: QueueListing| async move {
                        client
                            .queues(&listing)
                            .await
                            .map_err(api.tasks_failed("GET", "/api/queues"))
                    };
                    let queues = pages(listing.cursor.clone(), all, |cursor| {
                        read(QueueListing {
                            cursor,
                            ..listing.clone()
                        })
                    })
                    .await?;
                    let text = out.render(&queues, |queues| {
                        Ok(queue_table(&queues.queues, out.view()))
                    })?;
                    let hint = queues.next_cursor.as_deref().map(|next| {
                        format!(
                            "showing {} queues, by name; use --limit (up to 1000) or --all, or go \
                             on with --cursor {next}",
                            queues.queues.len()
                        )
                    });
                    Ok(Shown::noted(text, hint.filter(|_| !out.machine())))
                })
                .await;
        }
        QueueCommand::Show { queue } => client
            .queue(&queue)
            .await
            .map_err(api.tasks_failed("GET", &format!("/api/queues/{queue}")))?,
        QueueCommand::Pause { queue } => client
            .set_queue_paused(&queue, true)
            .await
            .map_err(api.tasks_failed("POST", &format!("/api/queues/{queue}/pause")))?,
        QueueCommand::Resume { queue } => client
            .set_queue_paused(&queue, false)
            .await
            .map_err(api.tasks_failed("POST", &format!("/api/queues/{queue}/resume")))?,
        QueueCommand::Limit {
            queue,
            concurrency,
            key_concurrency,
            rate,
            burst,
        } => client
            .set_queue_limits(
                &queue,
                &QueueSettings {
                    concurrency_limit: concurrency,
                    key_concurrency_limit: key_concurrency,
                    rate_limit: rate
                        .zip(burst)
                        .map(|(per_second, burst)| RateLimit { per_second, burst }),
                },
            )
            .await
            .map_err(api.tasks_failed("PUT", &format!("/api/queues/{queue}")))?,
    };
    out.value(&state, |state| {
        Ok(queue_table(std::slice::from_ref(state), out.view()))
    })
}
