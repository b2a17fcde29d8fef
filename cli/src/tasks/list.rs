//! `tasks list`: a page of tasks (or with --all every page), and how many more there are.

use leasehold::task_client::TaskListing;

use super::counts::count_tasks;
use crate::api::Api;
use crate::out::{Out, PageArgs, Shown, more_hint, pages, task_table};

#[derive(Debug, clap::Args)]
pub struct ListArgs {
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
}

pub(super) async fn list(api: &Api, out: &Out, args: ListArgs) -> anyhow::Result<()> {
    let ListArgs {
        status,
        queue,
        processor,
        key,
        created_after,
        created_before,
        page,
    } = args;
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
    out.watch(&page.watch, || read(api, out, &listing, &page))
        .await
}

/// One read of `tasks list`: the page (or with --all every page), rendered, and the hint of
/// what was left out.
async fn read(
    api: &Api,
    out: &Out,
    listing: &TaskListing,
    page: &PageArgs,
) -> anyhow::Result<Shown> {
    let client = &api.tasks;
    let listed = pages(listing.cursor.clone(), page.all, |cursor| {
        let listing = TaskListing {
            cursor,
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
    Ok(Shown::noted(text, hint))
}
