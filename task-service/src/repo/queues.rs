//! What operators set on queues (the `queues` table): pause and resume, and the concurrency
//! limit with the statements a claim judges it by.

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{Array, BigInt, Bool, Integer, Nullable, Text, Timestamptz};
use diesel_async::RunQueryDsl;
use leasehold::server::db::Cache;
use tracing::Instrument;

use super::{Db, Result};

/// A queue an operator has set something on.
#[derive(Debug, Clone, QueryableByName)]
pub struct QueueRow {
    #[diesel(sql_type = Text)]
    pub queue: String,
    #[diesel(sql_type = Bool)]
    pub paused: bool,
    /// At most this many of its tasks run at once; none: no limit.
    #[diesel(sql_type = Nullable<Integer>)]
    pub concurrency_limit: Option<i32>,
    /// When its settings last changed.
    #[diesel(sql_type = Timestamptz)]
    pub updated_at: DateTime<Utc>,
}

/// Pauses or resumes `queue`. Setting what is already set changes nothing, not even the time.
/// A resume wakes the waiting claims (the table's trigger notifies, on commit).
pub async fn set_paused(conn: &mut Db, queue: &str, paused: bool) -> Result<QueueRow> {
    let span = leasehold::db_span!("INSERT", "queues");
    async move {
        diesel::sql_query(
            "INSERT INTO queues (queue, paused) VALUES ($1, $2)
             ON CONFLICT (queue) DO UPDATE SET paused = EXCLUDED.paused,
                 updated_at = CASE WHEN queues.paused = EXCLUDED.paused THEN queues.updated_at
                                   ELSE now() END
             RETURNING queue, paused, concurrency_limit, updated_at",
        )
        .bind::<Text, _>(queue)
        .bind::<Bool, _>(paused)
        .cached()
        .get_result(conn)
        .await
    }
    .instrument(span)
    .await
}

/// Every queue an operator has set something on, by name.
pub async fn queue_rows(conn: &mut Db) -> Result<Vec<QueueRow>> {
    let span = leasehold::db_span!("SELECT", "queues");
    async move {
        diesel::sql_query(
            "SELECT queue, paused, concurrency_limit, updated_at FROM queues ORDER BY queue",
        )
        .cached()
        .load(conn)
        .await
    }
    .instrument(span)
    .await
}

/// Sets `queue`'s concurrency limit (none: no limit). Setting what is already set changes
/// nothing, not even the time.
pub async fn set_limits(
    conn: &mut Db,
    queue: &str,
    concurrency_limit: Option<i32>,
) -> Result<QueueRow> {
    let span = leasehold::db_span!("INSERT", "queues");
    async move {
        diesel::sql_query(
            "INSERT INTO queues (queue, concurrency_limit) VALUES ($1, $2)
             ON CONFLICT (queue) DO UPDATE SET concurrency_limit = EXCLUDED.concurrency_limit,
                 updated_at = CASE
                     WHEN queues.concurrency_limit IS NOT DISTINCT FROM EXCLUDED.concurrency_limit
                     THEN queues.updated_at ELSE now() END
             RETURNING queue, paused, concurrency_limit, updated_at",
        )
        .bind::<Text, _>(queue)
        .bind::<Nullable<Integer>, _>(concurrency_limit)
        .cached()
        .get_result(conn)
        .await
    }
    .instrument(span)
    .await
}

/// A limited queue's limit, its row locked by the calling claim.
#[derive(Debug, Clone, QueryableByName)]
pub struct QueueLimit {
    #[diesel(sql_type = Text)]
    pub queue: String,
    #[diesel(sql_type = Integer)]
    pub concurrency_limit: i32,
}

/// Locks the rows of those of `queues` (all limited queues when none are named) that have a
/// concurrency limit, in name order (so claims locking several never deadlock), and returns
/// their limits. A claim holds the locks to its commit: any other claim of these queues waits,
/// then counts this one's tasks. Unlimited queues are neither returned nor locked.
///
/// This must be its own statement, before [`running_counts`]: under READ COMMITTED a statement
/// that waited for a lock still reads from the snapshot it started with, so only the next
/// statement sees what the claim that held the lock committed.
pub async fn lock_limits(conn: &mut Db, queues: Option<&[&str]>) -> Result<Vec<QueueLimit>> {
    let span = leasehold::db_span!("SELECT", "queues");
    async move {
        diesel::sql_query(
            "SELECT queue, concurrency_limit FROM queues
             WHERE concurrency_limit IS NOT NULL AND ($1::text[] IS NULL OR queue = ANY($1))
             ORDER BY queue
             FOR NO KEY UPDATE",
        )
        .bind::<Nullable<Array<Text>>, _>(queues)
        .cached()
        .load(conn)
        .await
    }
    .instrument(span)
    .await
}

/// Tasks of a queue that hold a slot: every running one, whether or not its lease lapsed (a
/// lapsed task keeps its slot until a claim takes it again, or ends it).
#[derive(Debug, Clone, QueryableByName)]
pub struct Running {
    #[diesel(sql_type = Text)]
    pub queue: String,
    #[diesel(sql_type = BigInt)]
    pub running: i64,
}

/// The running tasks of each of `queues`.
pub async fn running_counts(conn: &mut Db, queues: &[&str]) -> Result<Vec<Running>> {
    let span = leasehold::db_span!("SELECT", "tasks");
    async move {
        diesel::sql_query(
            "SELECT queue, count(*) AS running FROM tasks
             WHERE queue = ANY($1) AND status = 'running'
             GROUP BY queue",
        )
        .bind::<Array<Text>, _>(queues)
        .cached()
        .load(conn)
        .await
    }
    .instrument(span)
    .await
}
