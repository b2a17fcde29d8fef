//! Reads: one task, its history, a page of a listing, the counts per queue and status, and the
//! gauges. (The dashboard's charts and overview are `crate::charts`.) Nothing here locks a row
//! or writes.

use leasehold::ErrorCode;
use leasehold::server::http::{NamePage, Page};
use leasehold::server::{ApiError, validate_name_within};
use leasehold::tasks::{MAX_QUEUE_CHARS, OneTask, TaskCounts, TaskStatus};
use serde::Serialize;

use super::refusal::task_not_found;
use super::to_api;
use crate::repo::{self, Db, OldestDue, QueueCount, TaskEvent, TaskFilter};

/// `GET /api/tasks/{id}`.
pub async fn get(conn: &mut Db, id: i64) -> Result<OneTask, ApiError> {
    let row = repo::find(conn, id)
        .await?
        .ok_or_else(|| task_not_found(id))?;
    Ok(OneTask { task: to_api(row) })
}

/// `GET /api/tasks/{id}/events`: the task's history, oldest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TaskHistory {
    pub events: Vec<TaskEvent>,
}

pub async fn events(conn: &mut Db, id: i64) -> Result<TaskHistory, ApiError> {
    Ok(TaskHistory {
        events: repo::events(conn, id).await?,
    })
}

/// What a listing asks for: the statuses it may show, narrowed by its `status` filter
/// (comma-separated), and a `queue`.
#[derive(Debug)]
pub struct Listing<'a> {
    pub within: &'a [TaskStatus],
    pub status: Option<&'a str>,
    pub queue: Option<&'a str>,
    /// Only tasks last claimed by this processor.
    pub processor: Option<&'a str>,
    /// Only tasks with this concurrency key.
    pub key: Option<&'a str>,
    /// Only tasks created in `[created_after, created_before)`.
    pub created_after: Option<chrono::DateTime<chrono::Utc>>,
    pub created_before: Option<chrono::DateTime<chrono::Utc>>,
    pub page: Page,
}

/// The statuses a listing shows: those of `within` that the `wanted` filter names (all of
/// them without a filter).
pub fn statuses(within: &[TaskStatus], wanted: Option<&str>) -> Result<Vec<TaskStatus>, ApiError> {
    let mut statuses = within.to_vec();
    if let Some(wanted) = wanted.filter(|s| !s.is_empty()) {
        let mut chosen = Vec::new();
        for name in wanted.split(',') {
            chosen.push(TaskStatus::parse(name.trim()).ok_or_else(|| {
                ApiError::invalid(
                    ErrorCode::InvalidStatus,
                    "status",
                    format!(
                        "unknown status {name:?}; known: pending, running, succeeded, dead, \
                         cancelled"
                    ),
                )
            })?);
        }
        statuses.retain(|s| chosen.contains(s));
    }
    Ok(statuses)
}

/// Checks a listing before it waits for its turn, so bad input is refused at once.
pub fn check_listing(listing: &Listing<'_>) -> Result<Vec<TaskStatus>, ApiError> {
    let statuses = statuses(listing.within, listing.status)?;
    check_filter(&listing.filter(statuses.clone()))?;
    Ok(statuses)
}

/// Checks the fields of a task filter, a listing's or a bulk operation's alike.
pub fn check_filter(filter: &TaskFilter<'_>) -> Result<(), ApiError> {
    if let Some(queue) = filter.queue {
        validate_name_within("queue", queue, MAX_QUEUE_CHARS)?;
    }
    if let Some(processor) = filter.processor {
        leasehold::server::validate_name("processor", processor)?;
    }
    if let Some(key) = filter.key {
        validate_name_within("key", key, super::validate::MAX_KEY_CHARS)?;
    }
    Ok(())
}

/// A creation-time bound of a filter, within the years 1 to 9999 that every task's creation
/// time lies in. Any instant RFC 3339 can write is a bound a client may send: with its offset,
/// `0001-01-01T00:00:00+16:36` is in year 0 by UTC, and filters exactly as the first instant of
/// year 1 does, since no task was created before either; likewise past the end of 9999. So a
/// bound is moved to the nearest instant the tasks' times can take, never refused.
pub fn creation_bound(
    at: Option<chrono::DateTime<chrono::Utc>>,
) -> Option<chrono::DateTime<chrono::Utc>> {
    use chrono::{TimeZone, Utc};
    let first = Utc.with_ymd_and_hms(1, 1, 1, 0, 0, 0).single()?;
    let last = Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 59).single()?;
    at.map(|at| at.clamp(first, last))
}

impl Listing<'_> {
    /// The tasks this listing shows, of `statuses`.
    fn filter(&self, statuses: Vec<TaskStatus>) -> TaskFilter<'_> {
        TaskFilter {
            statuses,
            queue: self.queue,
            processor: self.processor,
            key: self.key,
            created_after: creation_bound(self.created_after),
            created_before: creation_bound(self.created_before),
        }
    }
}

/// One page of a listing, at most `max_bytes` of task JSON; `true` when the page was cut there.
pub async fn list(
    conn: &mut Db,
    listing: &Listing<'_>,
    statuses: &[TaskStatus],
    max_bytes: i64,
) -> Result<(Vec<leasehold::tasks::Task>, bool), ApiError> {
    let filter = listing.filter(statuses.to_vec());
    let (rows, cut) = repo::list(conn, &filter, listing.page, max_bytes).await?;
    Ok((rows.into_iter().map(to_api).collect(), cut))
}

/// `GET /api/tasks/counts`: one queue's counts; or a page of the queues, by name, beside the
/// total over every queue. Returns the counts and the page's last queue when another follows.
pub async fn counts(
    conn: &mut Db,
    queue: Option<&str>,
    page: &NamePage,
) -> Result<(TaskCounts, Option<String>), ApiError> {
    let tally = |rows: &[repo::QueueCount]| {
        TaskCounts::tally(
            rows.iter()
                .map(|row| (row.queue.as_str(), row.status, row.count)),
        )
    };
    if let Some(queue) = queue {
        validate_name_within("queue", queue, MAX_QUEUE_CHARS)?;
        let rows = repo::counts_of(conn, &[queue.to_owned()]).await?;
        let mut counts = tally(&rows);
        // Asked by name, a queue is answered even when it has no task.
        counts
            .queues
            .entry(queue.to_owned())
            .or_insert_with(|| counts.total.clone());
        return Ok((counts, None));
    }
    let (names, more) = crate::queues::names_page(conn, page).await?;
    let mut counts = tally(&repo::counts_of(conn, &names).await?);
    counts.total = tally(&repo::status_totals(conn).await?).total;
    Ok((counts, names.last().filter(|_| more).cloned()))
}

/// What the task gauges of `/metrics` show: the counts and the oldest due task per queue, and
/// which queues are paused.
pub async fn gauges(conn: &mut Db) -> Result<Gauges, ApiError> {
    Ok(Gauges {
        counts: repo::counts(conn).await?,
        oldest_due: repo::oldest_due(conn).await?,
        queues: repo::queue_rows(conn).await?,
    })
}

/// The database's side of `/metrics`.
#[derive(Debug)]
pub struct Gauges {
    pub counts: Vec<QueueCount>,
    pub oldest_due: Vec<OldestDue>,
    pub queues: Vec<repo::QueueRow>,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_status_filter_narrows_and_unknown_names_are_refused() {
        let all = TaskStatus::ALL;
        assert_eq!(statuses(&all, None).unwrap(), all.to_vec());
        assert_eq!(statuses(&all, Some("")).unwrap(), all.to_vec());
        assert_eq!(
            statuses(&all, Some("dead, pending")).unwrap(),
            vec![TaskStatus::Pending, TaskStatus::Dead]
        );
        let ended = [TaskStatus::Succeeded, TaskStatus::Dead];
        assert!(statuses(&ended, Some("running")).unwrap().is_empty());
        let err = statuses(&all, Some("pending,finished")).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidStatus);
    }
}
