//! What operators set on queues (the `queues` table): pause and resume, and the concurrency
//! and rate limits with the statements a claim judges them by.

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{Array, BigInt, Bool, Double, Integer, Nullable, Text, Timestamptz};
use diesel_async::RunQueryDsl;
use leasehold::server::db::{Cache, OneRow};
use tracing::Instrument;

use super::{Db, Result};

const QUEUE_COLUMNS: &str = "queue, paused, concurrency_limit, key_concurrency_limit, \
    rate_per_second, rate_burst, updated_at";

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
    /// At most this many of its tasks of one concurrency key run at once; none: no limit.
    #[diesel(sql_type = Nullable<Integer>)]
    pub key_concurrency_limit: Option<i32>,
    /// At most this many of its tasks started per second, in bursts of `rate_burst`.
    #[diesel(sql_type = Nullable<Double>)]
    pub rate_per_second: Option<f64>,
    #[diesel(sql_type = Nullable<Integer>)]
    pub rate_burst: Option<i32>,
    /// When its settings last changed.
    #[diesel(sql_type = Timestamptz)]
    pub updated_at: DateTime<Utc>,
}

/// Pauses or resumes `queue`. Setting what is already set changes nothing, not even the time.
/// A resume wakes the waiting claims (the table's trigger notifies, on commit).
pub async fn set_paused(conn: &mut Db, queue: &str, paused: bool) -> Result<QueueRow> {
    let span = leasehold::db_span!("INSERT", "queues");
    async move {
        diesel::sql_query(format!(
            "INSERT INTO queues (queue, paused) VALUES ($1, $2)
             ON CONFLICT (queue) DO UPDATE SET paused = EXCLUDED.paused,
                 updated_at = CASE WHEN queues.paused = EXCLUDED.paused THEN queues.updated_at
                                   ELSE now() END
             RETURNING {QUEUE_COLUMNS}",
        ))
        .bind::<Text, _>(queue)
        .bind::<Bool, _>(paused)
        .cached()
        .get_one(conn)
        .await
    }
    .instrument(span)
    .await
}

/// Every queue an operator has set something on, by name.
pub async fn queue_rows(conn: &mut Db) -> Result<Vec<QueueRow>> {
    let span = leasehold::db_span!("SELECT", "queues");
    async move {
        diesel::sql_query(format!("SELECT {QUEUE_COLUMNS} FROM queues ORDER BY queue"))
            .cached()
            .load(conn)
            .await
    }
    .instrument(span)
    .await
}

/// The rows of those of `queues` an operator has set something on.
pub async fn queue_rows_of(conn: &mut Db, queues: &[String]) -> Result<Vec<QueueRow>> {
    let span = leasehold::db_span!("SELECT", "queues");
    async move {
        diesel::sql_query(format!(
            "SELECT {QUEUE_COLUMNS} FROM queues WHERE queue = ANY($1)"
        ))
        .bind::<Array<Text>, _>(queues)
        .cached()
        .load(conn)
        .await
    }
    .instrument(span)
    .await
}

#[derive(QueryableByName)]
struct QueueName {
    #[diesel(sql_type = Text)]
    queue: String,
}

/// Up to `limit` names of queues that have tasks or settings, past `after` in name order
/// (backwards when `descending`). The tasks' queues are found by a loose index scan of
/// `tasks_queue_status_idx` and `tasks_running_idx` side by side (the first holds the tasks not
/// running, the second the running ones; one descent of each per queue, however many tasks
/// each has), so a page costs its own length, not the number of tasks or of queues.
pub async fn queue_names(
    conn: &mut Db,
    after: Option<&str>,
    descending: bool,
    limit: i64,
) -> Result<Vec<String>> {
    let span = leasehold::db_span!("SELECT", "tasks");
    let (past, order, next) = if descending {
        ("<", "DESC", "greatest")
    } else {
        (">", "ASC", "least")
    };
    // The next queue name past `$from`: of the tasks not running and of the running ones, the
    // nearer (`least`/`greatest` pass over a side that has none).
    let step = |from: &str| {
        format!(
            "{next}((SELECT t.queue FROM tasks t WHERE t.status <> 'running' AND {from}
                     ORDER BY t.queue {order} LIMIT 1),
                    (SELECT t.queue FROM tasks t WHERE t.status = 'running' AND {from}
                     ORDER BY t.queue {order} LIMIT 1))"
        )
    };
    let first = step(&format!("($1::text IS NULL OR t.queue {past} $1)"));
    let then = step(&format!("t.queue {past} used.queue"));
    async move {
        // Planned with its parameters (not cached), so that without a cursor the `IS NULL`
        // branch folds away and each probe is a plain index descent.
        let names: Vec<QueueName> = diesel::sql_query(format!(
            "WITH RECURSIVE used(queue) AS (
                 SELECT {first}
                 UNION ALL
                 SELECT {then}
                 FROM used WHERE used.queue IS NOT NULL
             )
             SELECT queue FROM (
                 (SELECT queue FROM used WHERE queue IS NOT NULL LIMIT $2)
                 UNION
                 (SELECT queue FROM queues WHERE $1::text IS NULL OR queue {past} $1
                  ORDER BY queue {order} LIMIT $2)
             ) names
             ORDER BY queue {order} LIMIT $2"
        ))
        .bind::<Nullable<Text>, _>(after)
        .bind::<BigInt, _>(limit)
        .load(conn)
        .await?;
        Ok(names.into_iter().map(|name| name.queue).collect())
    }
    .instrument(span)
    .await
}

/// The limits an operator sets on a queue (none: no limit).
#[derive(Debug, Clone, Copy)]
pub struct NewLimits {
    pub concurrency_limit: Option<i32>,
    pub key_concurrency_limit: Option<i32>,
    /// Tasks per second, and the burst.
    pub rate: Option<(f64, i32)>,
}

/// Sets `queue`'s limits. Setting what is already set changes nothing, not even the time; a
/// changed rate starts with a full bucket.
pub async fn set_limits(conn: &mut Db, queue: &str, limits: NewLimits) -> Result<QueueRow> {
    let span = leasehold::db_span!("INSERT", "queues");
    async move {
        diesel::sql_query(format!(
            "INSERT INTO queues (queue, concurrency_limit, rate_per_second, rate_burst,
                                 key_concurrency_limit)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (queue) DO UPDATE SET concurrency_limit = EXCLUDED.concurrency_limit,
                 key_concurrency_limit = EXCLUDED.key_concurrency_limit,
                 rate_per_second = EXCLUDED.rate_per_second, rate_burst = EXCLUDED.rate_burst,
                 rate_at = CASE
                     WHEN (queues.rate_per_second, queues.rate_burst)
                          IS NOT DISTINCT FROM (EXCLUDED.rate_per_second, EXCLUDED.rate_burst)
                     THEN queues.rate_at END,
                 updated_at = CASE
                     WHEN (queues.concurrency_limit, queues.rate_per_second, queues.rate_burst,
                           queues.key_concurrency_limit)
                          IS NOT DISTINCT FROM (EXCLUDED.concurrency_limit,
                                                EXCLUDED.rate_per_second, EXCLUDED.rate_burst,
                                                EXCLUDED.key_concurrency_limit)
                     THEN queues.updated_at ELSE now() END
             RETURNING {QUEUE_COLUMNS}"
        ))
        .bind::<Text, _>(queue)
        .bind::<Nullable<Integer>, _>(limits.concurrency_limit)
        .bind::<Nullable<Double>, _>(limits.rate.map(|(rate, _)| rate))
        .bind::<Nullable<Integer>, _>(limits.rate.map(|(_, burst)| burst))
        .bind::<Nullable<Integer>, _>(limits.key_concurrency_limit)
        .get_one(conn)
        .await
    }
    .instrument(span)
    .await
}

/// Waits for every claim in flight to commit, and makes new ones wait for this transaction:
/// claims hold a row-share lock on `queues` from [`lock_limits`] to their commit, which this
/// table lock conflicts with. Plain reads of `queues` (the pause filter) go on.
pub async fn exclude_claims(conn: &mut Db) -> Result<usize> {
    let span = leasehold::db_span!("LOCK", "queues");
    async move {
        diesel::sql_query("LOCK TABLE queues IN EXCLUSIVE MODE")
            .execute(conn)
            .await
    }
    .instrument(span)
    .await
}

/// A limited queue's limits, its row locked by the calling claim.
#[derive(Debug, Clone, QueryableByName)]
pub struct QueueLimit {
    #[diesel(sql_type = Text)]
    pub queue: String,
    #[diesel(sql_type = Nullable<Integer>)]
    pub concurrency_limit: Option<i32>,
    #[diesel(sql_type = Nullable<Integer>)]
    pub key_concurrency_limit: Option<i32>,
    /// The key its last claim served (see [`super::due_by_key`]).
    #[diesel(sql_type = Nullable<Text>)]
    pub key_cursor: Option<String>,
    #[diesel(sql_type = Bool)]
    pub rate_limited: bool,
}

/// Locks the row of `queue` (of every limited queue when none is named) if it has a
/// concurrency or rate limit, in name order (so claims locking several never deadlock), and
/// returns their limits. A claim holds the locks to its commit: any other claim of these queues
/// waits, then counts this one's tasks. Unlimited queues are neither returned nor locked.
///
/// This must be its own statement, before [`running_counts`]: under READ COMMITTED a statement
/// that waited for a lock still reads from the snapshot it started with, so only the next
/// statement sees what the claim that held the lock committed.
pub async fn lock_limits(conn: &mut Db, queue: Option<&str>) -> Result<Vec<QueueLimit>> {
    let span = leasehold::db_span!("SELECT", "queues");
    // Two statements, not one with `$1 IS NULL OR ...`: a kept plan of that one cannot use the
    // name's index, so PostgreSQL judged it dearer than planning anew and planned it at every
    // call (about 100 µs each, twelve times what running it took).
    let sql = |filter: &str| {
        format!(
            "SELECT queue, concurrency_limit, key_concurrency_limit, key_cursor,
                    rate_per_second IS NOT NULL AS rate_limited
             FROM queues
             WHERE (concurrency_limit IS NOT NULL OR rate_per_second IS NOT NULL
                    OR key_concurrency_limit IS NOT NULL) {filter}
             ORDER BY queue
             FOR NO KEY UPDATE"
        )
    };
    async move {
        match queue {
            Some(queue) => {
                diesel::sql_query(sql("AND queue = $1"))
                    .bind::<Text, _>(queue)
                    .cached()
                    .load(conn)
                    .await
            }
            None => diesel::sql_query(sql("")).cached().load(conn).await,
        }
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

/// How many tasks a rate-limited queue may start now: its bucket refilled up to `at`.
#[derive(Debug, Clone, QueryableByName)]
pub struct Tokens {
    #[diesel(sql_type = Text)]
    pub queue: String,
    /// Whole or not; negative when the bucket was last spent later than `at` (the database's
    /// clock went back, as after a failover): it may start none, so that starts spend the
    /// bucket in the order of their times.
    #[diesel(sql_type = Double)]
    pub available: f64,
    #[diesel(sql_type = Double)]
    pub per_second: f64,
    /// When the bucket was read: the start of this statement, which comes after the claim was
    /// granted the queue's lock, so after the commit of the claim that spent from it before.
    #[diesel(sql_type = Timestamptz)]
    pub at: DateTime<Utc>,
}

/// The buckets of the rate-limited `queues`, read after [`lock_limits`] locked them (in a
/// statement of its own, for the reason given there). They are judged at the statement's
/// start, not the transaction's (`now()`): a claim that waited for the lock behind another
/// must not count the time it waited as time the bucket refilled.
///
/// float8 arithmetic raises on underflow and overflow rather than rounding, and one raise here
/// fails every claim that reads the bucket, of any queue. So the refill multiplies a rate of at
/// least one a day (the table's constraint) by at most the seconds that fill the burst: the
/// product is 0 or above 1e-11 (timestamps count microseconds), and never above the burst.
pub async fn tokens(conn: &mut Db, queues: &[&str]) -> Result<Vec<Tokens>> {
    let span = leasehold::db_span!("SELECT", "queues");
    async move {
        diesel::sql_query(
            "SELECT queue, rate_per_second AS per_second, statement_timestamp() AS at,
                    CASE WHEN rate_at IS NULL THEN rate_burst::float8
                         WHEN statement_timestamp() < rate_at THEN -1
                         ELSE least(rate_burst::float8,
                                    rate_tokens
                                    + rate_per_second
                                      * least(extract(epoch FROM statement_timestamp()
                                                                 - rate_at)::float8,
                                              rate_burst / rate_per_second))
                    END AS available
             FROM queues WHERE queue = ANY($1) AND rate_per_second IS NOT NULL",
        )
        .bind::<Array<Text>, _>(queues)
        .cached()
        .load(conn)
        .await
    }
    .instrument(span)
    .await
}

/// Records that a claim started tasks from `queue`'s bucket: `left` tokens remain, as of `at`
/// (when the claim read the bucket).
pub async fn spend_tokens(
    conn: &mut Db,
    queue: &str,
    left: f64,
    at: DateTime<Utc>,
) -> Result<usize> {
    let span = leasehold::db_span!("UPDATE", "queues");
    async move {
        diesel::sql_query("UPDATE queues SET rate_tokens = $2, rate_at = $3 WHERE queue = $1")
            .bind::<Text, _>(queue)
            .bind::<Double, _>(left)
            .bind::<Timestamptz, _>(at)
            .cached()
            .execute(conn)
            .await
    }
    .instrument(span)
    .await
}

/// Records the key a claim of the key-limited `queue` served furthest along its walk: the next
/// claim starts after it.
pub async fn move_key_cursor(conn: &mut Db, queue: &str, key: &str) -> Result<usize> {
    let span = leasehold::db_span!("UPDATE", "queues");
    async move {
        diesel::sql_query("UPDATE queues SET key_cursor = $2 WHERE queue = $1")
            .bind::<Text, _>(queue)
            .bind::<Text, _>(key)
            .cached()
            .execute(conn)
            .await
    }
    .instrument(span)
    .await
}

/// Asks the waiting claims of `queue` to look again in `due_in_ms` (the listener's timer), when
/// its bucket will hold a token again. Sent when this transaction commits.
pub async fn wake_later(conn: &mut Db, queue: &str, due_in_ms: i64) -> Result<usize> {
    diesel::sql_query(
        "SELECT pg_notify('leasehold_tasks', json_build_array(json_build_object(
             'key', $1::text, 'count', 1, 'dueInMs', $2::bigint))::text)",
    )
    .bind::<Text, _>(queue)
    .bind::<BigInt, _>(due_in_ms)
    .execute(conn)
    .await
}
