//! The due tasks a claim takes: in priority and schedule order, or fairly across the keys of
//! a key-limited queue.

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{Array, BigInt, Integer, Nullable, Text, Timestamptz};
use diesel_async::RunQueryDsl;
use leasehold::server::db::Cache;
use tracing::Instrument;

use super::NOT_PAUSED;
use crate::repo::{COLUMNS, Db, Result, TaskRow};

/// Due pending tasks of queues not paused, highest priority then earliest scheduled, locked
/// with `SKIP LOCKED` (never the sample's `OFFSET` scan). A claim of every queue also steps over
/// the queues in `full` (limited queues with no room left). The two statements let each use
/// its partial index.
pub async fn lock_due(
    conn: &mut Db,
    queue: Option<&str>,
    limit: i64,
    full: &[&str],
) -> Result<Vec<TaskRow>> {
    let span = leasehold::db_span!("SELECT", "tasks");
    async move {
        match queue {
            Some(queue) => {
                diesel::sql_query(due_sql(true))
                    .bind::<Nullable<Text>, _>(Some(queue))
                    .bind::<BigInt, _>(limit)
                    .cached()
                    .load(conn)
                    .await
            }
            None => {
                diesel::sql_query(due_sql(false))
                    .bind::<Nullable<Text>, _>(None::<&str>)
                    .bind::<BigInt, _>(limit)
                    .bind::<Array<Text>, _>(full)
                    .cached()
                    .load(conn)
                    .await
            }
        }
    }
    .instrument(span)
    .await
}

/// [`lock_due`]'s statement (`$1` the queue, `$2` the limit; of every queue, `$3` the full
/// queues), for plans to be checked.
pub fn due_sql(by_queue: bool) -> String {
    let filter = if by_queue {
        "AND queue = $1"
    } else {
        "AND $1::text IS NULL AND queue <> ALL($3::text[])"
    };
    lock_due_sql(filter, "$2")
}

/// The order claims take due tasks in: priority, then schedule.
pub(super) const DUE_ORDER: &str = "priority DESC, scheduled_at, id";

/// Locks up to `limit` (an SQL expression) due tasks that meet `filter`, in [`DUE_ORDER`], for
/// [`lock_due`] and [`take_lapsed`] alike.
pub(super) fn lock_due_sql(filter: &str, limit: &str) -> String {
    format!(
        "SELECT {COLUMNS} FROM tasks
         WHERE status = 'pending' AND scheduled_at <= now() {filter} {NOT_PAUSED}
         ORDER BY {DUE_ORDER}
         LIMIT {limit}
         FOR UPDATE SKIP LOCKED"
    )
}

/// A due task a claim of a key-limited queue may take, in the order claims take them
/// ([`due_by_key`]).
#[derive(Debug, Clone, QueryableByName)]
pub struct KeyedCandidate {
    /// None: not a task, but a key with due tasks that its limit held back.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub id: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    pub concurrency_key: Option<String>,
    /// Where the walk found its key: the furthest served becomes the queue's cursor.
    #[diesel(sql_type = BigInt)]
    pub visit: i64,
    /// The database's clock as the statement ran, so after the snapshot its counts of each
    /// key's running tasks were read from: a start recorded then comes after every end those
    /// counts saw.
    #[diesel(sql_type = Timestamptz)]
    pub counted_at: DateTime<Utc>,
}

/// Up to `room` due tasks of the key-limited `queue` (not paused), fairly across keys and
/// within each key's room (`key_limit` less its running tasks), without locking them (the
/// caller holds the queue's row, so no other claim chooses from the queue meanwhile; lock them
/// with [`lock_candidates`]).
///
/// The keys with due tasks are walked from the one after `cursor` (the key the queue's last
/// claim served; `""` for the tasks without a key) round to it, one index probe per key (a
/// loose index scan, so the cost is that of the keys visited, never of a key's backlog of due
/// tasks), until `room` keys with room were found (stepping over up to 64 at their limit).
/// Each key offers its first tasks by priority and schedule; the tasks without a key offer
/// theirs as one more key, which comes after the last key and before the first. Candidates come back by turn (every key's first task, then every key's
/// second...), then priority, then the walk's order: a key with a million tasks gets one turn
/// like a key with one. One more row, with no id, names the furthest key the walk found with
/// due tasks but no room, if there was one.
pub async fn due_by_key(
    conn: &mut Db,
    queue: &str,
    key_limit: i32,
    cursor: Option<&str>,
    room: i64,
) -> Result<Vec<KeyedCandidate>> {
    let span = leasehold::db_span!("SELECT", "tasks");
    async move {
        diesel::sql_query(DUE_BY_KEY)
            .bind::<Text, _>(queue)
            .bind::<Nullable<Text>, _>(cursor)
            .bind::<BigInt, _>(room)
            .bind::<Integer, _>(key_limit)
            .cached()
            .load(conn)
            .await
    }
    .instrument(span)
    .await
}

/// [`due_by_key`]'s statement: `$1` the queue, `$2` the cursor, `$3` the room, `$4` the limit
/// per key.
pub const DUE_BY_KEY: &str = "
    -- The walk: from the key after the cursor to the last key, then (wrapped) from the first
    -- key to the cursor, one loose-index-scan probe per key and one count of its running tasks.
    -- It stops once it found as many keys with room as the claim wants tasks, or stepped over 64
    -- keys at their limit besides: full keys ahead never hide the keys behind them, and a walk
    -- costs the keys it needs, however many keys there are.
    WITH RECURSIVE walk(k, wrapped, n, room, opened) AS (
        -- The walk starts at the cursor itself (step 0, not a key it visits).
        SELECT coalesce($2::text, ''), false, 0::bigint, 0::bigint, 0
      UNION ALL
        SELECT nxt.k, nxt.wrapped, w.n + 1, nxt.room, w.opened + (nxt.room > 0)::int
        FROM walk w CROSS JOIN LATERAL (SELECT c.k, c.wrapped,
                   $4 - (SELECT count(*) FROM tasks r
                         WHERE r.status = 'running' AND r.queue = $1
                           AND r.concurrency_key = c.k) AS room
            FROM (SELECT coalesce(a.k, b.k) AS k, (w.wrapped OR a.k IS NULL) AS wrapped
                  FROM (SELECT CASE WHEN w.wrapped
                       THEN (SELECT t.concurrency_key FROM tasks t
                              WHERE t.status = 'pending' AND t.queue = $1
                                AND t.concurrency_key > w.k
                                AND t.concurrency_key <= $2::text AND t.scheduled_at <= now()
                              ORDER BY t.concurrency_key LIMIT 1)
                       ELSE (SELECT t.concurrency_key FROM tasks t
                              WHERE t.status = 'pending' AND t.queue = $1
                                AND t.concurrency_key > w.k AND t.scheduled_at <= now()
                              ORDER BY t.concurrency_key LIMIT 1)
                       END AS k
                        -- OFFSET 0: probed once, not once per mention below.
                        OFFSET 0) a,
                  LATERAL (SELECT CASE WHEN a.k IS NULL AND NOT w.wrapped
                       THEN (SELECT t.concurrency_key FROM tasks t
                              WHERE t.status = 'pending' AND t.queue = $1
                                AND t.concurrency_key > ''
                                AND t.concurrency_key <= $2::text AND t.scheduled_at <= now()
                              ORDER BY t.concurrency_key LIMIT 1)
                       END AS k) b) c
            WHERE c.k IS NOT NULL) nxt
        WHERE w.opened < $3 AND w.n < $3 + 64
    ), walked AS (
        -- Where each key comes in the walk; the tasks without a key come between the last key
        -- and the first (1,000,000).
        SELECT k, room, CASE WHEN wrapped THEN 1000000 + n ELSE n END AS visit FROM walk
        WHERE n > 0
    ), candidates AS (
        SELECT c.id, c.concurrency_key, c.priority, c.turn, walked.visit
        FROM walked CROSS JOIN LATERAL (
            SELECT t.id, t.concurrency_key, t.priority,
                   row_number() OVER (ORDER BY t.priority DESC, t.scheduled_at, t.id) AS turn
            FROM tasks t
            WHERE t.status = 'pending' AND t.queue = $1 AND t.concurrency_key = walked.k
              AND t.scheduled_at <= now()
            ORDER BY t.priority DESC, t.scheduled_at, t.id
            LIMIT least($3, greatest(walked.room, 0))
        ) c
      UNION ALL
        SELECT u.id, NULL, u.priority,
               row_number() OVER (ORDER BY u.priority DESC, u.scheduled_at, u.id),
               1000000
        FROM (SELECT id, priority, scheduled_at FROM tasks
               WHERE status = 'pending' AND queue = $1 AND concurrency_key IS NULL
                 AND scheduled_at <= now()
               -- Leading with the key (NULL throughout) lets the planner read the keys' index
               -- in order, as for a key, never walk the queue past every keyed task.
               ORDER BY concurrency_key, priority DESC, scheduled_at, id
               LIMIT $3) u
    )
    (SELECT id, concurrency_key, visit, clock_timestamp() AS counted_at FROM candidates
     WHERE NOT EXISTS (SELECT 1 FROM queues WHERE queue = $1 AND paused)
     ORDER BY turn, priority DESC, visit
     LIMIT $3)
    UNION ALL
    (SELECT NULL, k, visit, clock_timestamp() FROM walked
     WHERE room <= 0 AND NOT EXISTS (SELECT 1 FROM queues WHERE queue = $1 AND paused)
     ORDER BY visit DESC LIMIT 1)";

/// Locks the pending due tasks among `ids` (with `SKIP LOCKED`: one another transaction holds,
/// to cancel or delete it, is left), in no particular order.
pub async fn lock_candidates(conn: &mut Db, ids: &[i64]) -> Result<Vec<TaskRow>> {
    let span = leasehold::db_span!("SELECT", "tasks");
    async move {
        diesel::sql_query(format!(
            "SELECT {COLUMNS} FROM tasks
             WHERE id = ANY($1) AND status = 'pending' AND scheduled_at <= now()
             FOR UPDATE SKIP LOCKED"
        ))
        .bind::<Array<BigInt>, _>(ids)
        .load(conn)
        .await
    }
    .instrument(span)
    .await
}
