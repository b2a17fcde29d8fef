//! Claim rounds: the lapsed tasks, the due tasks, recording claims, and postponing a lapse whose
//! lease still lives.

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{Array, BigInt, Bool, Double, Integer, Nullable, Text, Timestamptz};
use diesel_async::{AnsiTransactionManager, RunQueryDsl, TransactionManager};
use leasehold::api::Secret;
use leasehold::server::db::Cache;
use leasehold::tasks::TaskStatus;
use tracing::Instrument;

use super::{COLUMNS, Db, Result, TaskRow, event, history};

/// Keeps a claim off the tasks of paused queues. The paused queues are read once per statement
/// (an init plan), so the claim keeps walking its ordered index; a paused queue's tasks are
/// stepped over, never locked.
const NOT_PAUSED: &str = "AND queue <> ALL (ARRAY(SELECT q.queue FROM queues q WHERE q.paused))";

/// Runs `body` in a claim group's transaction, as `conn.transaction(body)` runs it in a plain
/// one (committed if it returns `Ok`, rolled back otherwise), but one that walks indexes:
/// sorting, sequential scans and JIT compilation are switched off for it, first thing in it.
///
/// Sorting: planner statistics lag behind a queue table. Right after a burst of inserts into a
/// queue the statistics have not seen, PostgreSQL estimates one matching row and may prefer
/// reading every pending row of the queue through `tasks_queue_status_idx` and sorting them, a
/// cost that grows with the backlog on every claim (measured: 20 ms a claim at 20,000 pending,
/// against 0.1 ms through the ordered index). A claim reads a `LIMIT` in index order, never a
/// sort.
///
/// JIT: a switched-off sort is priced out, not removed, so a claim that must still sort a
/// handful of rows (the key walk of [`due_by_key`] does) gets a plan whose cost passes every
/// JIT threshold, and compiling it took 600 ms a claim (measured: the benchmark's key-limited
/// queue at 7 claims a second, against 400 without keys).
///
/// Sequential scans, so that the group's statements over sets of tasks can be kept prepared.
/// A kept statement may keep its plan: after five runs PostgreSQL may settle on a generic plan
/// for the rest of the session, made for the table as it was then, and one made while `tasks`
/// was nearly empty would read it whole ([`leasehold::server::db::Cache`]). With sequential
/// scans priced out every plan walks an index whatever the table's size when it was made, as
/// lease-service's sessions do for all of theirs. Kept, the statements are neither parsed and
/// described in a round trip of their own on each call nor, once generic, planned: a claim
/// group's time is its round trips, one after another, and planning took about as much of
/// PostgreSQL's time per task as running the statements.
///
/// The switches travel with `BEGIN`, in one simple-query message: one round trip opens the
/// transaction in index order, where `BEGIN` and a statement of settings took two.
pub async fn in_index_order<R, E>(
    conn: &mut Db,
    body: impl AsyncFnOnce(&mut Db) -> std::result::Result<R, E>,
) -> std::result::Result<R, E>
where
    E: From<diesel::result::Error>,
{
    match AnsiTransactionManager::begin_transaction_sql(conn, BEGIN_IN_INDEX_ORDER).await {
        Ok(()) => {}
        // The caller's own transaction goes on as it was.
        Err(err @ diesel::result::Error::AlreadyInTransaction) => return Err(err.into()),
        Err(err) => {
            // `BEGIN` may have run and a switch failed: a transaction would then be open,
            // aborted, though the connection's manager counts none. Marked in error, the
            // connection is dropped by the pool, never handed out again.
            <AnsiTransactionManager as TransactionManager<Db>>::transaction_manager_status_mut(
                conn,
            )
            .set_in_error();
            return Err(err.into());
        }
    }
    match body(conn).await {
        Ok(value) => {
            <AnsiTransactionManager as TransactionManager<Db>>::commit_transaction(conn).await?;
            Ok(value)
        }
        Err(err) => {
            // The body's error is the one to report; a failed rollback leaves the connection
            // marked broken, and the pool drops it.
            let _ = <AnsiTransactionManager as TransactionManager<Db>>::rollback_transaction(conn)
                .await;
            Err(err)
        }
    }
}

/// [`in_index_order`]'s opening: the transaction, then its switches.
const BEGIN_IN_INDEX_ORDER: &str =
    "BEGIN; SET LOCAL enable_sort = off; SET LOCAL enable_seqscan = off; SET LOCAL jit = off";

/// Makes this transaction's prepared statements use their generic plan (`true`), or choose
/// as PostgreSQL does by default (`false`).
///
/// [`due_by_key`]'s walk takes PostgreSQL 1.5 ms to plan and 0.2 ms to run (measured with 100
/// keys), and the plan depends on no value it is given; by default every call would be planned
/// anew. Only that statement runs under the generic plan: the claim's statements over sets of
/// ids (whose best plan depends on how many there are) are planned on each call, as ever.
#[tracing::instrument(name = "SET LOCAL", level = "debug", skip_all)]
pub async fn plan_generically(conn: &mut Db, generic: bool) -> Result<()> {
    let mode = if generic {
        "force_generic_plan"
    } else {
        "auto"
    };
    diesel::sql_query("SELECT set_config('plan_cache_mode', $1, true)")
        .bind::<Text, _>(mode)
        .execute(conn)
        .await
        .map(drop)
}

/// Everything a claim round does with running tasks whose lease has run out by the recorded
/// expiry, in one statement (one round trip and one plan, where it was three): up to `limit`
/// of them whose cancellation was asked for end as cancelled (their workers stopped
/// heartbeating, so nobody else would end them; they come back with status `cancelled`); up to
/// `limit` that may be tried again are locked to be claimed; and the exhausted (all attempts
/// used, to be marked dead, never handed out) are locked to fill what is left of `batch_room`.
/// Each part is oldest first; rows another transaction holds are skipped, never waited for.
/// Read apart, tasks only to be ended never fill the places of claimable ones.
///
/// With `due` (for a claim of one queue without limits, `queue` given), the same statement also
/// locks the queue's due tasks ([`due_sql`]'s, in its order) for the room the claimable left of
/// `limit`, and numbers them by the group's slots that follow the claimable ones' (the first due
/// task takes slot `claimable + 1`). A due task whose slot's claimant named a shared lease is
/// claimed under it in this statement, as [`mark_claimed`] records a claim, and comes back
/// `running` with its slot; the others come back `pending`, locked, to be claimed once leases
/// of their own are taken. For single claims of workers that name their process's lease, the
/// statement that finds the work is the one that claims it, as graphile-worker's `get_job` is.
pub async fn take_lapsed(
    conn: &mut Db,
    queue: Option<&str>,
    limit: i64,
    batch_room: i64,
    due: Option<&Slots<'_>>,
) -> Result<Vec<Taken>> {
    let span = leasehold::db_span!("UPDATE", "tasks");
    async move {
        let (due_part, moved, due_rows) = if due.is_some() {
            (
                format!(
                    ", due AS (
             {due}
         ), numbered AS (
             SELECT d.id AS slot_id, d.fence IS NULL AS slot_first,
                    (SELECT count(*) FROM claimable)
                    + row_number() OVER (ORDER BY {DUE_ORDER}) AS slot
             FROM due d
         ), slotted AS (
             -- Each slot's claimant read once: an element of an array of text is found by
             -- walking the elements before it.
             SELECT n.*, ($4::text[])[n.slot] AS slot_processor,
                    ($5::text[])[n.slot] AS slot_resource, ($6::bigint[])[n.slot] AS slot_fence
             FROM numbered n
         ), claimed AS (
             UPDATE tasks SET {set}
             FROM slotted s
             WHERE id = s.slot_id AND s.slot_resource IS NOT NULL
             RETURNING {COLUMNS}, {claim}, s.slot AS claim_slot
         ), moved AS (SELECT * FROM cancelled UNION ALL SELECT * FROM claimed)",
                    set = claim_set(&ClaimFrom {
                        processor: "s.slot_processor",
                        fence: "s.slot_fence",
                        secret: "NULL",
                        resource: "s.slot_resource",
                        start: "NULL::timestamptz",
                        expiry: "now() + make_interval(secs => $7)",
                    }),
                    claim = claim_event("'pending'::text", "s.slot_first"),
                    due = lock_due_sql(
                        "AND queue = $1",
                        "GREATEST($2 - (SELECT count(*) FROM claimable), 0)"
                    ),
                ),
                "",
                // The claimed, read once into an array: a join would read them all again for
                // each due task.
                "UNION ALL SELECT d.*, NULL::bigint FROM due d
                   WHERE d.id <> ALL (ARRAY(SELECT slot_id FROM slotted
                                            WHERE slot_resource IS NOT NULL))",
            )
        } else {
            (String::new(), ", moved AS (SELECT * FROM cancelled)", "")
        };
        let query = diesel::sql_query(format!(
            "WITH cancelled AS (
             UPDATE tasks SET status = 'cancelled', processed_at = now(), updated_at = now()
             WHERE id IN (SELECT id FROM tasks
                          WHERE status = 'running' AND must_heartbeat_before <= now()
                            AND ($1::text IS NULL OR queue = $1)
                            AND cancel_requested
                          ORDER BY must_heartbeat_before
                          LIMIT $2
                          FOR UPDATE SKIP LOCKED)
             RETURNING {COLUMNS}, {from_running}, NULL::bigint AS claim_slot
         ), claimable AS (
             SELECT {COLUMNS} FROM tasks
             WHERE status = 'running' AND must_heartbeat_before <= now()
               AND ($1::text IS NULL OR queue = $1) {NOT_PAUSED}
               AND NOT cancel_requested AND attempts < max_attempts
             ORDER BY must_heartbeat_before
             LIMIT $2
             FOR UPDATE SKIP LOCKED
         ), exhausted AS (
             SELECT {COLUMNS} FROM tasks
             WHERE status = 'running' AND must_heartbeat_before <= now()
               AND ($1::text IS NULL OR queue = $1)
               AND NOT cancel_requested AND attempts >= max_attempts
             ORDER BY must_heartbeat_before
             LIMIT GREATEST($3 - (SELECT count(*) FROM claimable), 0)
             FOR UPDATE SKIP LOCKED
         ){due_part}{moved}, {history}
         SELECT {COLUMNS}, claim_slot FROM moved
         UNION ALL SELECT *, NULL::bigint FROM claimable
         UNION ALL SELECT *, NULL::bigint FROM exhausted
         {due_rows}",
            from_running = event("'running'"),
            history = history("true"),
        ))
        .bind::<Nullable<Text>, _>(queue)
        .bind::<BigInt, _>(limit)
        .bind::<BigInt, _>(batch_room);
        match due {
            Some(slots) => {
                query
                    .bind::<Array<Text>, _>(&slots.processors)
                    .bind::<Array<Nullable<Text>>, _>(&slots.resources)
                    .bind::<Array<BigInt>, _>(&slots.fences)
                    .bind::<Double, _>(slots.hint.as_secs_f64())
                    .cached()
                    .load(conn)
                    .await
            }
            None => query.cached().load(conn).await,
        }
    }
    .instrument(span)
    .await
}

/// The claimants of a claim group's slots, in order (slot 1 first): a request with a `limit`
/// of `n` holds `n` slots. A slot whose claimant named a shared lease (`resources`, and
/// `fences`) can be claimed by [`take_lapsed`]; `hint` is what [`mark_claimed`] takes.
#[derive(Debug)]
pub struct Slots<'a> {
    pub processors: Vec<&'a str>,
    pub resources: Vec<Option<&'a str>>,
    pub fences: Vec<i64>,
    pub hint: std::time::Duration,
}

/// A row [`take_lapsed`] came back with, and the slot it was claimed for there, if it was.
#[derive(Debug, QueryableByName)]
pub struct Taken {
    #[diesel(embed)]
    pub task: TaskRow,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub claim_slot: Option<i64>,
}

/// Ends as cancelled up to `batch` running tasks (of `queue`, if given) whose cancellation was
/// asked for and whose lease has run out by the recorded expiry: their workers stopped
/// heartbeating, so nobody else would end them. The retention sweeper runs it for queues nobody
/// claims from ([`take_lapsed`] does the same for a claim's queue). Rows another transaction holds are
/// skipped.
pub async fn cancel_lapsed(conn: &mut Db, queue: Option<&str>, batch: i64) -> Result<Vec<TaskRow>> {
    let span = leasehold::db_span!("UPDATE", "tasks");
    async move {
        diesel::sql_query(format!(
            "WITH moved AS (
                 UPDATE tasks SET status = 'cancelled', processed_at = now(), updated_at = now()
                 WHERE id IN (SELECT id FROM tasks
                              WHERE status = 'running' AND must_heartbeat_before <= now()
                                AND ($1::text IS NULL OR queue = $1)
                                AND cancel_requested
                              ORDER BY must_heartbeat_before
                              LIMIT $2
                              FOR UPDATE SKIP LOCKED)
                 RETURNING {COLUMNS}, {from_running}
             ), {history}
             SELECT * FROM moved",
            from_running = event("'running'"),
            history = history("true"),
        ))
        .bind::<Nullable<Text>, _>(queue)
        .bind::<BigInt, _>(batch)
        .load(conn)
        .await
    }
    .instrument(span)
    .await
}

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
const DUE_ORDER: &str = "priority DESC, scheduled_at, id";

/// Locks up to `limit` (an SQL expression) due tasks that meet `filter`, in [`DUE_ORDER`], for
/// [`lock_due`] and [`take_lapsed`] alike.
fn lock_due_sql(filter: &str, limit: &str) -> String {
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
    (SELECT id, concurrency_key, visit FROM candidates
     WHERE NOT EXISTS (SELECT 1 FROM queues WHERE queue = $1 AND paused)
     ORDER BY turn, priority DESC, visit
     LIMIT $3)
    UNION ALL
    (SELECT NULL, k, visit FROM walked
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

/// One claim to record: the task, its processor, and the lease that covers the claim: the
/// task's own new lease (its fence, secret and expiry), or a shared one (a worker process's,
/// named with its fence; the claim then records a hint of the expiry, [`mark_claimed`]'s
/// `hint`, since lease-service was not asked).
#[derive(Debug)]
pub struct Claim<'a> {
    pub id: i64,
    /// The status the task is claimed from (pending, or running with its lease run out), as
    /// the caller locked it in this transaction: for the history.
    pub from: TaskStatus,
    /// The task was never claimed before: its wait is a pickup, for the charts.
    pub first: bool,
    pub processor: &'a str,
    /// The shared lease that covers the claim; none: the task's own.
    pub lease_resource: Option<&'a str>,
    pub lease_fence: i64,
    pub lease_secret: Option<&'a Secret>,
    /// The task's own lease's expiry; none for a shared lease.
    pub lease_expiry: Option<DateTime<Utc>>,
    /// When the task is recorded to have started; none: the claim's `now()`.
    pub started_at: Option<DateTime<Utc>>,
}

/// Records claims, one statement for all: one more attempt each, and one more claim (the task's
/// fence), owned by its processor under its lease until the lease's expiry (for a shared lease,
/// `hint` from now: past it, a claim asks lease-service whether the lease still lives). Rows
/// come back in no particular order.
pub async fn mark_claimed(
    conn: &mut Db,
    claims: &[Claim<'_>],
    hint: std::time::Duration,
) -> Result<Vec<TaskRow>> {
    let span = leasehold::db_span!("UPDATE", "tasks");
    span.record("db.operation.batch.size", claims.len());
    async move {
        let ids: Vec<i64> = claims.iter().map(|c| c.id).collect();
        let processors: Vec<&str> = claims.iter().map(|c| c.processor).collect();
        let fences: Vec<i64> = claims.iter().map(|c| c.lease_fence).collect();
        let secrets: Vec<Option<&str>> = claims
            .iter()
            .map(|c| c.lease_secret.map(Secret::expose))
            .collect();
        let expiries: Vec<Option<DateTime<Utc>>> = claims.iter().map(|c| c.lease_expiry).collect();
        let resources: Vec<Option<&str>> = claims.iter().map(|c| c.lease_resource).collect();
        let starts: Vec<Option<DateTime<Utc>>> = claims.iter().map(|c| c.started_at).collect();
        let froms: Vec<&str> = claims.iter().map(|c| c.from.as_str()).collect();
        let firsts: Vec<bool> = claims.iter().map(|c| c.first).collect();
        // The claim is recorded at the task's start: the claim's `now()`, except for
        // rate-limited queues, whose claims record the moment they read the bucket (after the
        // queue's lock was granted, so later than `now()`): the history then shows the times the
        // bucket was spent at, and the invariant checker judges the rate by them.
        diesel::sql_query(format!(
            "WITH moved AS (
             UPDATE tasks SET {set}
             FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[], $5::timestamptz[],
                         $6::timestamptz[], $7::text[], $8::bool[], $9::text[])
                  AS c(claim_id, claim_processor, claim_fence, claim_secret, claim_expiry,
                       claim_start, claim_from, claim_first, claim_resource)
             WHERE id = c.claim_id
             RETURNING {COLUMNS}, {claim}
         ), {history}
         SELECT * FROM moved",
            history = history("true"),
            set = claim_set(&ClaimFrom {
                processor: "c.claim_processor",
                fence: "c.claim_fence",
                secret: "c.claim_secret",
                resource: "c.claim_resource",
                start: "c.claim_start",
                expiry: "coalesce(c.claim_expiry, now() + make_interval(secs => $10))",
            }),
            claim = claim_event("c.claim_from", "c.claim_first"),
        ))
        .bind::<Array<BigInt>, _>(&ids)
        .bind::<Array<Text>, _>(&processors)
        .bind::<Array<BigInt>, _>(&fences)
        .bind::<Array<Nullable<Text>>, _>(&secrets)
        .bind::<Array<Nullable<Timestamptz>>, _>(&expiries)
        .bind::<Array<Nullable<Timestamptz>>, _>(&starts)
        .bind::<Array<Text>, _>(&froms)
        .bind::<Array<Bool>, _>(&firsts)
        .bind::<Array<Nullable<Text>>, _>(&resources)
        .bind::<Double, _>(hint.as_secs_f64())
        .cached()
        .load(conn)
        .await
    }
    .instrument(span)
    .await
}

/// Where a claim statement takes each field of a claim from (SQL expressions).
struct ClaimFrom<'a> {
    processor: &'a str,
    fence: &'a str,
    secret: &'a str,
    resource: &'a str,
    /// The recorded start; NULL: the claim's `now()`.
    start: &'a str,
    expiry: &'a str,
}

/// What a claim writes on its task, for [`mark_claimed`] and [`take_lapsed`] alike: one more
/// attempt and one more claim (the task's own fence), its processor, its lease, its start.
fn claim_set(from: &ClaimFrom<'_>) -> String {
    let ClaimFrom {
        processor,
        fence,
        secret,
        resource,
        start,
        expiry,
    } = from;
    format!(
        "status = 'running', processor = {processor},
         fence = coalesce(fence, 0) + 1, lease_fence = {fence},
         lease_secret = {secret}, lease_resource = {resource},
         attempts = attempts + 1, started_at = coalesce({start}, now()),
         last_heartbeat_at = now(), must_heartbeat_before = {expiry}, updated_at = now()"
    )
}

/// The history columns of a claim (see `history` in the parent module): the status it left,
/// its moment (the start), and for a first claim (`first`) the pickup wait the charts show.
fn claim_event(from: &str, first: &str) -> String {
    format!(
        "{from} AS from_status, greatest(now(), started_at) AS event_at, true AS charged,
         CASE WHEN {first} THEN greatest(0, EXTRACT(EPOCH FROM
             greatest(now(), started_at)
             - greatest(created_at, coalesce(requested_scheduled_at, created_at)))
             * 1000)::float8 END AS pickup_ms"
    )
}

/// A lapsed-looking running task whose lease lease-service says is still held: record the
/// holder's expiry, so claims stop picking it up until then.
pub async fn postpone_lapse(conn: &mut Db, id: i64, lease_expiry: DateTime<Utc>) -> Result<()> {
    let span = leasehold::db_span!("UPDATE", "tasks");
    async move {
        diesel::sql_query(
            "UPDATE tasks SET must_heartbeat_before = $2 WHERE id = $1 AND status = 'running'",
        )
        .bind::<BigInt, _>(id)
        .bind::<Timestamptz, _>(lease_expiry)
        .cached()
        .execute(conn)
        .await
        .map(|_| ())
    }
    .instrument(span)
    .await
}
