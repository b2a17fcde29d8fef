//! Queues as operators see them: pause and resume, limits, and each queue's state with its
//! counts. (Limits are enforced where claims take tasks: [`crate::tasks`]' `limits`.)
//!
//! A pause is a row in `queues`, read by every claim statement (`repo::lock_due`,
//! `repo::take_lapsed`), so it holds across replicas from the moment it commits: no claim that
//! starts after the pause is answered hands out the queue's tasks. Tasks already running
//! finish; creates still succeed. A resume wakes as many waiting claims as the queue has due
//! tasks (the table's trigger notifies `leasehold_tasks`).

use std::collections::BTreeMap;

use leasehold::ErrorCode;
use leasehold::queues::{
    MAX_CONCURRENCY_LIMIT, MAX_RATE, MIN_RATE, QueueSettings, QueueState, RateLimit,
};
use leasehold::server::http::{NamePage, Order};
use leasehold::server::{ApiError, validate_name_within};
use leasehold::tasks::{MAX_QUEUE_CHARS, TaskCounts};

use diesel_async::AsyncConnection;

use crate::repo::{self, Db, QueueRow};

/// `POST /api/queues/{queue}/pause` (`paused`) and `/resume`: the queue's state after.
pub async fn set_paused(conn: &mut Db, queue: &str, paused: bool) -> Result<QueueState, ApiError> {
    validate_name_within("queue", queue, MAX_QUEUE_CHARS)?;
    let row = repo::set_paused(conn, queue, paused).await?;
    tracing::info!(
        queue,
        paused,
        "queue {}",
        if paused { "paused" } else { "resumed" }
    );
    let mut states = states(conn, vec![row]).await?;
    Ok(states.remove(queue).unwrap_or_else(|| untouched(queue)))
}

/// `PUT /api/queues/{queue}`: sets the queue's limits; the queue's state after. A limit lowered
/// below the tasks running now lets them finish and hands out no more until they fit. Every
/// claim answered after this answer judges by the new limits.
pub async fn set_limits(
    conn: &mut Db,
    queue: &str,
    settings: &QueueSettings,
) -> Result<QueueState, ApiError> {
    validate_name_within("queue", queue, MAX_QUEUE_CHARS)?;
    for (field, limit) in [
        ("concurrency_limit", settings.concurrency_limit),
        ("key_concurrency_limit", settings.key_concurrency_limit),
    ] {
        if let Some(limit) = limit
            && !(0..=MAX_CONCURRENCY_LIMIT).contains(&limit)
        {
            return Err(ApiError::invalid(
                ErrorCode::InvalidField,
                field,
                format!("{field} must be between 0 and {MAX_CONCURRENCY_LIMIT}, got {limit}"),
            ));
        }
    }
    if let Some(rate) = settings.rate_limit {
        if !(MIN_RATE..=MAX_RATE).contains(&rate.per_second) {
            return Err(ApiError::invalid(
                ErrorCode::InvalidField,
                "rate_limit",
                format!(
                    "rate_limit.per_second must be between {MIN_RATE:e} (one task a day) and \
                     {MAX_RATE}, got {}",
                    rate.per_second
                ),
            ));
        }
        if !(1.0..=MAX_RATE).contains(&f64::from(rate.burst)) {
            return Err(ApiError::invalid(
                ErrorCode::InvalidField,
                "rate_limit",
                format!(
                    "rate_limit.burst must be between 1 and {MAX_RATE}, got {}",
                    rate.burst
                ),
            ));
        }
    }
    let limits = repo::NewLimits {
        concurrency_limit: settings.concurrency_limit,
        key_concurrency_limit: settings.key_concurrency_limit,
        rate: settings.rate_limit.map(|r| (r.per_second, r.burst)),
    };
    // A claim that read the queue's settings before the new limit committed judges by the old
    // ones; one that reads them after counts only committed claims. Were both in flight at
    // once, together they could pass the new limit. So the new limit waits for every claim in
    // flight to commit (each holds a row-share lock on `queues` from `repo::lock_limits` on),
    // and claims after it wait for it.
    let row = conn
        .transaction::<_, ApiError, _>(async |conn| {
            repo::exclude_claims(conn).await?;
            Ok(repo::set_limits(conn, queue, limits).await?)
        })
        .await?;
    tracing::info!(
        queue,
        concurrency_limit = ?row.concurrency_limit,
        key_concurrency_limit = ?row.key_concurrency_limit,
        rate_per_second = ?row.rate_per_second,
        "queue limits set"
    );
    let mut states = states(conn, vec![row]).await?;
    Ok(states.remove(queue).unwrap_or_else(|| untouched(queue)))
}

/// `GET /api/queues`: a page of the queues that have tasks or settings, by name, and whether
/// another page follows. Only the page's queues are counted.
pub async fn list(conn: &mut Db, page: &NamePage) -> Result<(Vec<QueueState>, bool), ApiError> {
    let (names, more) = names_page(conn, page).await?;
    let rows = repo::queue_rows_of(conn, &names).await?;
    let mut states = states_of(conn, &names, rows).await?;
    let queues = names
        .iter()
        .map(|name| states.remove(name).unwrap_or_else(|| untouched(name)))
        .collect();
    Ok((queues, more))
}

/// A page of the names of the queues that have tasks, and whether another page follows: what
/// the queues' listing and the counts page by.
pub async fn names_page(conn: &mut Db, page: &NamePage) -> Result<(Vec<String>, bool), ApiError> {
    let mut names = repo::queue_names(
        conn,
        page.cursor.as_deref(),
        page.order == Order::Desc,
        page.fetch(),
    )
    .await?;
    let more = i64::try_from(names.len()).unwrap_or(i64::MAX) > page.limit;
    names.truncate(usize::try_from(page.limit).unwrap_or(usize::MAX));
    Ok((names, more))
}

/// `GET /api/queues/{queue}`: a queue nobody has used reads as running and empty. Reads this
/// queue's row and counts only.
pub async fn get(conn: &mut Db, queue: &str) -> Result<QueueState, ApiError> {
    validate_name_within("queue", queue, MAX_QUEUE_CHARS)?;
    let names = [queue.to_owned()];
    let rows = repo::queue_rows_of(conn, &names).await?;
    let mut states = states_of(conn, &names, rows).await?;
    Ok(states.remove(queue).unwrap_or_else(|| untouched(queue)))
}

/// The queues of `rows`, with their counts and oldest due task.
async fn states(
    conn: &mut Db,
    rows: Vec<QueueRow>,
) -> Result<BTreeMap<String, QueueState>, ApiError> {
    let names: Vec<String> = rows.iter().map(|row| row.queue.clone()).collect();
    states_of(conn, &names, rows).await
}

/// The `queues` named, with their settings from `rows`, their counts and oldest due task.
async fn states_of(
    conn: &mut Db,
    queues: &[String],
    rows: Vec<QueueRow>,
) -> Result<BTreeMap<String, QueueState>, ApiError> {
    let counts = repo::counts_of(conn, queues).await?;
    let oldest = repo::oldest_due_of(conn, queues).await?;
    let mut tally =
        TaskCounts::tally(counts.iter().map(|c| (c.queue.as_str(), c.status, c.count))).queues;
    let mut states: BTreeMap<String, QueueState> = queues
        .iter()
        .map(|queue| {
            let counts = tally.remove(queue).unwrap_or_else(zeros);
            (queue.clone(), empty(queue, counts))
        })
        .collect();
    for row in rows {
        let state = states
            .entry(row.queue.clone())
            .or_insert_with(|| empty(&row.queue, zeros()));
        state.paused = row.paused;
        state.concurrency_limit = row.concurrency_limit;
        state.key_concurrency_limit = row.key_concurrency_limit;
        state.rate_limit = row
            .rate_per_second
            .zip(row.rate_burst)
            .map(|(per_second, burst)| RateLimit { per_second, burst });
        state.updated_at = Some(row.updated_at);
    }
    for due in oldest {
        if let Some(state) = states.get_mut(&due.queue) {
            state.oldest_due_age_seconds = Some(due.age_seconds.max(0.0));
        }
    }
    Ok(states)
}

fn empty(queue: &str, counts: BTreeMap<String, i64>) -> QueueState {
    QueueState {
        queue: queue.to_owned(),
        paused: false,
        concurrency_limit: None,
        key_concurrency_limit: None,
        rate_limit: None,
        counts,
        oldest_due_age_seconds: None,
        updated_at: None,
    }
}

/// A queue with neither tasks nor settings: running, every count zero.
fn untouched(queue: &str) -> QueueState {
    empty(queue, zeros())
}

fn zeros() -> BTreeMap<String, i64> {
    TaskCounts::tally(std::iter::empty()).total
}
