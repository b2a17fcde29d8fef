//! Every SQL statement of task-service, and nothing else. Times are the database's `now()`.

use chrono::{DateTime, Utc};
use diesel::sql_types::{Array, BigInt, Bool, Double, Integer, Jsonb, Nullable, Text, Timestamptz};
use diesel::{OptionalExtension, QueryableByName};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use leasehold::api::{Proof, Secret};
use leasehold::server::db::Cache;
use leasehold::server::http::Page;
use leasehold::tasks::TaskStatus;

pub type Db = AsyncPgConnection;
type Result<T> = std::result::Result<T, diesel::result::Error>;

/// A task row.
#[derive(Debug, Clone, QueryableByName)]
pub struct TaskRow {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = Jsonb)]
    pub task_data: serde_json::Value,
    #[diesel(sql_type = Text)]
    pub queue: String,
    #[diesel(sql_type = Integer)]
    pub priority: i32,
    #[diesel(sql_type = Text)]
    pub status: TaskStatus,
    #[diesel(sql_type = Timestamptz)]
    pub scheduled_at: DateTime<Utc>,
    #[diesel(sql_type = Nullable<Text>)]
    pub processor: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub fence: Option<i64>,
    #[diesel(sql_type = Integer)]
    pub attempts: i32,
    #[diesel(sql_type = Integer)]
    pub max_attempts: i32,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub last_heartbeat_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub must_heartbeat_before: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub started_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub processed_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Jsonb>)]
    pub task_output: Option<serde_json::Value>,
    #[diesel(sql_type = Nullable<Text>)]
    pub last_error: Option<String>,
    #[diesel(sql_type = Bool)]
    pub cancel_requested: bool,
    #[diesel(sql_type = Nullable<Text>)]
    pub idempotency_key: Option<String>,
    #[diesel(sql_type = Timestamptz)]
    pub created_at: DateTime<Utc>,
    #[diesel(sql_type = Timestamptz)]
    pub updated_at: DateTime<Utc>,
    /// The secret of the lease of the claim in `fence` (see the migration that added it).
    #[diesel(sql_type = Nullable<Text>)]
    pub lease_secret: Option<Secret>,
}

impl TaskRow {
    /// What renew and release present for this task's current lease.
    pub fn lease_proof(&self) -> Proof<'_> {
        Proof {
            fence: self.fence,
            secret: self.lease_secret.as_ref().map(Secret::expose),
        }
    }
}

/// What `POST /api/tasks` inserts, validated.
#[derive(Debug, Clone)]
pub struct NewTask {
    pub task_data: serde_json::Value,
    pub scheduled_at: Option<DateTime<Utc>>,
    pub queue: String,
    pub priority: i32,
    pub max_attempts: i32,
    pub idempotency_key: Option<String>,
}

const COLUMNS: &str = "id, task_data, queue, priority, status, scheduled_at, processor, fence, \
    attempts, max_attempts, last_heartbeat_at, must_heartbeat_before, started_at, processed_at, \
    task_output, last_error, cancel_requested, idempotency_key, created_at, updated_at, \
    lease_secret";

/// Inserts the task, or nothing if its idempotency key is taken (then `None`).
#[tracing::instrument(name = "INSERT tasks", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "INSERT", db.collection.name = "tasks"))]
pub async fn insert(conn: &mut Db, task: &NewTask) -> Result<Option<TaskRow>> {
    diesel::sql_query(format!(
        "INSERT INTO tasks (task_data, scheduled_at, requested_scheduled_at, queue, priority,
                            max_attempts, idempotency_key)
         VALUES ($1, COALESCE($2, now()), COALESCE($2, now()), $3, $4, $5, $6)
         ON CONFLICT (idempotency_key) DO NOTHING
         RETURNING {COLUMNS}"
    ))
    .bind::<Jsonb, _>(&task.task_data)
    .bind::<Nullable<Timestamptz>, _>(task.scheduled_at)
    .bind::<Text, _>(&task.queue)
    .bind::<Integer, _>(task.priority)
    .bind::<Integer, _>(task.max_attempts)
    .bind::<Nullable<Text>, _>(task.idempotency_key.as_deref())
    .cached()
    .get_result(conn)
    .await
    .optional()
}

/// Inserts a generator's task and counts it, in one statement (so its own commit), only while
/// the generator is started and the database's clock is before `deadline`; `None` if the key is
/// taken, the generator is stopped or the deadline passed.
///
/// The statement first locks the settings row (`FOR NO KEY UPDATE`, the lock its count takes
/// anyway, so two creates never deadlock upgrading a shared lock): a stop waits for a create
/// that holds it, and a create that comes after reads the stop. So once a stop is answered no
/// generator task is stored. The task's `created_at` is the moment of the insert, not of the
/// transaction's start, and its schedule, when omitted, that same moment.
#[tracing::instrument(name = "INSERT tasks", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "INSERT", db.collection.name = "tasks"))]
pub async fn insert_generated(
    conn: &mut Db,
    task: &NewTask,
    deadline: DateTime<Utc>,
) -> Result<Option<TaskRow>> {
    diesel::sql_query(format!(
        "WITH gate AS (
             SELECT running FROM generator_settings WHERE id = 1 FOR NO KEY UPDATE
         ), at AS (
             SELECT clock_timestamp() AS now FROM gate WHERE gate.running
         ), inserted AS (
             INSERT INTO tasks (task_data, scheduled_at, requested_scheduled_at, queue, priority,
                                max_attempts, idempotency_key, created_at, updated_at)
             SELECT $1, COALESCE($2, at.now), COALESCE($2, at.now), $3, $4, $5, $6, at.now,
                    at.now
             FROM at WHERE at.now < $7
             ON CONFLICT (idempotency_key) DO NOTHING
             RETURNING {COLUMNS}
         ), counted AS (
             UPDATE generator_settings SET produced = produced + (SELECT count(*) FROM inserted)
             WHERE id = 1
         )
         SELECT {COLUMNS} FROM inserted"
    ))
    .bind::<Jsonb, _>(&task.task_data)
    .bind::<Nullable<Timestamptz>, _>(task.scheduled_at)
    .bind::<Text, _>(&task.queue)
    .bind::<Integer, _>(task.priority)
    .bind::<Integer, _>(task.max_attempts)
    .bind::<Nullable<Text>, _>(task.idempotency_key.as_deref())
    .bind::<Timestamptz, _>(deadline)
    .cached()
    .get_result(conn)
    .await
    .optional()
}

#[derive(QueryableByName)]
struct Clock {
    #[diesel(sql_type = Timestamptz)]
    now: DateTime<Utc>,
}

/// The database's clock right now (`clock_timestamp()`, not the transaction's `now()`).
#[tracing::instrument(name = "SELECT clock_timestamp", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "SELECT"))]
pub async fn clock(conn: &mut Db) -> Result<DateTime<Utc>> {
    diesel::sql_query("SELECT clock_timestamp() AS now")
        .cached()
        .get_result::<Clock>(conn)
        .await
        .map(|row| row.now)
}

/// The task an idempotency key names, and whether a create asking for `scheduled_at` asks for
/// the schedule its creator asked for.
#[derive(Debug, QueryableByName)]
pub struct KeyedTask {
    // Not `row`: the derive's own code names its row so.
    #[diesel(embed)]
    pub task: TaskRow,
    #[diesel(sql_type = Bool)]
    pub same_schedule: bool,
}

/// The task `key` names. Its schedule is compared in the database with `scheduled_at` bound
/// exactly as [`insert`] binds it: a time carries more precision than the column keeps, and
/// only the same conversion rounds it the same way (before 2000 chrono's truncation is not
/// diesel's). A create that names none asks for its task's creation time, as [`insert`] stores
/// it; a task whose requested schedule is not known (see its migration) matches any.
#[tracing::instrument(name = "SELECT tasks", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "SELECT", db.collection.name = "tasks"))]
pub async fn find_by_idempotency_key(
    conn: &mut Db,
    key: &str,
    scheduled_at: Option<DateTime<Utc>>,
) -> Result<Option<KeyedTask>> {
    diesel::sql_query(format!(
        "SELECT {COLUMNS},
                (requested_scheduled_at IS NULL
                 OR requested_scheduled_at = COALESCE($2, created_at)) AS same_schedule
         FROM tasks WHERE idempotency_key = $1"
    ))
    .bind::<Text, _>(key)
    .bind::<Nullable<Timestamptz>, _>(scheduled_at)
    .cached()
    .get_result(conn)
    .await
    .optional()
}

#[tracing::instrument(name = "SELECT tasks", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "SELECT", db.collection.name = "tasks"))]
pub async fn find(conn: &mut Db, id: i64) -> Result<Option<TaskRow>> {
    diesel::sql_query(format!("SELECT {COLUMNS} FROM tasks WHERE id = $1"))
        .bind::<BigInt, _>(id)
        .cached()
        .get_result(conn)
        .await
        .optional()
}

/// The task, locked for the rest of the transaction.
#[tracing::instrument(name = "SELECT tasks", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "SELECT", db.collection.name = "tasks"))]
pub async fn lock(conn: &mut Db, id: i64) -> Result<Option<TaskRow>> {
    diesel::sql_query(format!(
        "SELECT {COLUMNS} FROM tasks WHERE id = $1 FOR UPDATE"
    ))
    .bind::<BigInt, _>(id)
    .cached()
    .get_result(conn)
    .await
    .optional()
}

/// The tasks among `ids`, locked in id order (so that two batches cannot deadlock).
#[tracing::instrument(name = "SELECT tasks", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "SELECT", db.collection.name = "tasks"))]
pub async fn lock_many(conn: &mut Db, ids: &[i64]) -> Result<Vec<TaskRow>> {
    diesel::sql_query(format!(
        "SELECT {COLUMNS} FROM tasks WHERE id = ANY($1) ORDER BY id FOR UPDATE"
    ))
    .bind::<Array<BigInt>, _>(ids)
    .load(conn)
    .await
}

/// Makes the rest of this transaction's claim queries walk their ordered partial index.
///
/// Planner statistics lag behind a queue table: right after a burst of inserts into a queue
/// the statistics have not seen, PostgreSQL estimates one matching row and may prefer reading
/// every pending row of the queue through `tasks_queue_status_idx` and sorting them, a cost that
/// grows with the backlog on every claim (measured: 20 ms a claim at 20,000 pending, against
/// 0.1 ms through the ordered index). A claim reads a `LIMIT` in index order, never a sort, so
/// sorting is switched off for the claim's transaction only.
#[tracing::instrument(name = "SET LOCAL", level = "debug", skip_all)]
pub async fn claim_by_index_order(conn: &mut Db) -> Result<()> {
    diesel::sql_query("SET LOCAL enable_sort = off")
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
#[tracing::instrument(name = "UPDATE tasks", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "UPDATE", db.collection.name = "tasks"))]
pub async fn take_lapsed(
    conn: &mut Db,
    queue: Option<&str>,
    limit: i64,
    batch_room: i64,
) -> Result<Vec<TaskRow>> {
    diesel::sql_query(format!(
        "WITH cancelled AS (
             UPDATE tasks SET status = 'cancelled', processed_at = now(), updated_at = now()
             WHERE id IN (SELECT id FROM tasks
                          WHERE status = 'running' AND must_heartbeat_before <= now()
                            AND ($1::text IS NULL OR queue = $1)
                            AND cancel_requested
                          ORDER BY must_heartbeat_before
                          LIMIT $2
                          FOR UPDATE SKIP LOCKED)
             RETURNING {COLUMNS}
         ), claimable AS (
             SELECT {COLUMNS} FROM tasks
             WHERE status = 'running' AND must_heartbeat_before <= now()
               AND ($1::text IS NULL OR queue = $1)
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
         )
         SELECT * FROM cancelled
         UNION ALL SELECT * FROM claimable
         UNION ALL SELECT * FROM exhausted"
    ))
    .bind::<Nullable<Text>, _>(queue)
    .bind::<BigInt, _>(limit)
    .bind::<BigInt, _>(batch_room)
    .load(conn)
    .await
}

/// Ends as cancelled up to `batch` running tasks (of `queue`, if given) whose cancellation was
/// asked for and whose lease has run out by the recorded expiry: their workers stopped
/// heartbeating, so nobody else would end them. The retention sweeper runs it for queues nobody
/// claims from ([`take_lapsed`] does the same for a claim's queue). Rows another transaction holds are
/// skipped.
#[tracing::instrument(name = "UPDATE tasks", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "UPDATE", db.collection.name = "tasks"))]
pub async fn cancel_lapsed(conn: &mut Db, queue: Option<&str>, batch: i64) -> Result<Vec<TaskRow>> {
    diesel::sql_query(format!(
        "UPDATE tasks SET status = 'cancelled', processed_at = now(), updated_at = now()
         WHERE id IN (SELECT id FROM tasks
                      WHERE status = 'running' AND must_heartbeat_before <= now()
                        AND ($1::text IS NULL OR queue = $1)
                        AND cancel_requested
                      ORDER BY must_heartbeat_before
                      LIMIT $2
                      FOR UPDATE SKIP LOCKED)
         RETURNING {COLUMNS}"
    ))
    .bind::<Nullable<Text>, _>(queue)
    .bind::<BigInt, _>(batch)
    .load(conn)
    .await
}

/// Due pending tasks, highest priority then earliest scheduled, locked with `SKIP LOCKED`
/// (never the sample's `OFFSET` scan). The two statements let each use its partial index.
#[tracing::instrument(name = "SELECT tasks", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "SELECT", db.collection.name = "tasks"))]
pub async fn lock_due(conn: &mut Db, queue: Option<&str>, limit: i64) -> Result<Vec<TaskRow>> {
    diesel::sql_query(due_sql(queue.is_some()))
        .bind::<Nullable<Text>, _>(queue)
        .bind::<BigInt, _>(limit)
        .load(conn)
        .await
}

/// [`lock_due`]'s statement (`$1` the queue, `$2` the limit), for plans to be checked.
pub fn due_sql(by_queue: bool) -> String {
    let filter = if by_queue {
        "AND queue = $1"
    } else {
        "AND $1::text IS NULL"
    };
    format!(
        "SELECT {COLUMNS} FROM tasks
         WHERE status = 'pending' AND scheduled_at <= now() {filter}
         ORDER BY priority DESC, scheduled_at, id
         LIMIT $2
         FOR UPDATE SKIP LOCKED"
    )
}

/// One claim to record: the task, its processor, the fence and secret of its new lease, the
/// lease's expiry.
#[derive(Debug)]
pub struct Claim<'a> {
    pub id: i64,
    pub processor: &'a str,
    pub fence: i64,
    pub lease_secret: Option<&'a Secret>,
    pub lease_expiry: DateTime<Utc>,
}

/// Records claims, one statement for all: one more attempt each, owned by its processor under
/// its fence until its lease's expiry. Rows come back in no particular order.
#[tracing::instrument(name = "UPDATE tasks", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "UPDATE", db.collection.name = "tasks", db.operation.batch.size = claims.len()))]
pub async fn mark_claimed(conn: &mut Db, claims: &[Claim<'_>]) -> Result<Vec<TaskRow>> {
    let ids: Vec<i64> = claims.iter().map(|c| c.id).collect();
    let processors: Vec<&str> = claims.iter().map(|c| c.processor).collect();
    let fences: Vec<i64> = claims.iter().map(|c| c.fence).collect();
    let secrets: Vec<Option<&str>> = claims
        .iter()
        .map(|c| c.lease_secret.map(Secret::expose))
        .collect();
    let expiries: Vec<DateTime<Utc>> = claims.iter().map(|c| c.lease_expiry).collect();
    diesel::sql_query(format!(
        "UPDATE tasks SET status = 'running', processor = c.claim_processor, fence = c.claim_fence,
                lease_secret = c.claim_secret, attempts = attempts + 1,
                started_at = now(), last_heartbeat_at = now(),
                must_heartbeat_before = c.claim_expiry, updated_at = now()
         FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[], $5::timestamptz[])
              AS c(claim_id, claim_processor, claim_fence, claim_secret, claim_expiry)
         WHERE id = c.claim_id
         RETURNING {COLUMNS}"
    ))
    .bind::<Array<BigInt>, _>(&ids)
    .bind::<Array<Text>, _>(&processors)
    .bind::<Array<BigInt>, _>(&fences)
    .bind::<Array<Nullable<Text>>, _>(&secrets)
    .bind::<Array<Timestamptz>, _>(&expiries)
    .load(conn)
    .await
}

/// A lapsed-looking running task whose lease lease-service says is still held: record the
/// holder's expiry, so claims stop picking it up until then.
#[tracing::instrument(name = "UPDATE tasks", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "UPDATE", db.collection.name = "tasks"))]
pub async fn postpone_lapse(conn: &mut Db, id: i64, lease_expiry: DateTime<Utc>) -> Result<()> {
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

#[tracing::instrument(name = "UPDATE tasks", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "UPDATE", db.collection.name = "tasks"))]
pub async fn record_heartbeat(
    conn: &mut Db,
    id: i64,
    lease_expiry: DateTime<Utc>,
) -> Result<TaskRow> {
    diesel::sql_query(format!(
        "UPDATE tasks SET last_heartbeat_at = now(), must_heartbeat_before = $2, updated_at = now()
         WHERE id = $1
         RETURNING {COLUMNS}"
    ))
    .bind::<BigInt, _>(id)
    .bind::<Timestamptz, _>(lease_expiry)
    .cached()
    .get_result(conn)
    .await
}

/// Marks tasks succeeded with their outputs, in one statement; each row comes back with the
/// seconds from its claim to its completion, in no particular order.
#[tracing::instrument(name = "UPDATE tasks", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "UPDATE", db.collection.name = "tasks", db.operation.batch.size = done.len()))]
pub async fn mark_succeeded_many(
    conn: &mut Db,
    done: &[(i64, &serde_json::Value)],
) -> Result<Vec<(TaskRow, f64)>> {
    #[derive(QueryableByName)]
    struct Completed {
        #[diesel(embed)]
        task: TaskRow,
        #[diesel(sql_type = Double)]
        took: f64,
    }
    let ids: Vec<i64> = done.iter().map(|(id, _)| *id).collect();
    let outputs: Vec<&serde_json::Value> = done.iter().map(|(_, output)| *output).collect();
    let rows: Vec<Completed> = diesel::sql_query(format!(
        "UPDATE tasks SET status = 'succeeded', processed_at = now(), last_heartbeat_at = now(),
                task_output = c.done_output, updated_at = now()
         FROM unnest($1::bigint[], $2::jsonb[]) AS c(done_id, done_output)
         WHERE id = c.done_id
         RETURNING {COLUMNS},
                   COALESCE(EXTRACT(EPOCH FROM now() - started_at), 0)::float8 AS took"
    ))
    .bind::<Array<BigInt>, _>(&ids)
    .bind::<Array<Jsonb>, _>(&outputs)
    .load(conn)
    .await?;
    Ok(rows.into_iter().map(|row| (row.task, row.took)).collect())
}

/// Ends the task in `status` (`dead` or `cancelled`), recording `error` when given.
#[tracing::instrument(name = "UPDATE tasks", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "UPDATE", db.collection.name = "tasks"))]
pub async fn mark_final(
    conn: &mut Db,
    id: i64,
    status: TaskStatus,
    error: Option<&str>,
) -> Result<TaskRow> {
    diesel::sql_query(format!(
        "UPDATE tasks SET status = $2, processed_at = now(),
                last_error = COALESCE($3, last_error), updated_at = now()
         WHERE id = $1
         RETURNING {COLUMNS}"
    ))
    .bind::<BigInt, _>(id)
    .bind::<Text, _>(status.as_str())
    .bind::<Nullable<Text>, _>(error)
    .cached()
    .get_result(conn)
    .await
}

/// Back to pending, due in `delay_seconds`. `refund_attempt` hands the claim's attempt back.
#[tracing::instrument(name = "UPDATE tasks", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "UPDATE", db.collection.name = "tasks"))]
pub async fn mark_retry(
    conn: &mut Db,
    id: i64,
    error: &str,
    delay_seconds: f64,
    refund_attempt: bool,
) -> Result<TaskRow> {
    diesel::sql_query(format!(
        "UPDATE tasks SET status = 'pending', processor = NULL,
                scheduled_at = now() + make_interval(secs => $3),
                attempts = CASE WHEN $4 THEN greatest(attempts - 1, 0) ELSE attempts END,
                last_error = $2, must_heartbeat_before = NULL, updated_at = now()
         WHERE id = $1
         RETURNING {COLUMNS}"
    ))
    .bind::<BigInt, _>(id)
    .bind::<Text, _>(error)
    .bind::<Double, _>(delay_seconds)
    .bind::<Bool, _>(refund_attempt)
    .cached()
    .get_result(conn)
    .await
}

#[tracing::instrument(name = "UPDATE tasks", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "UPDATE", db.collection.name = "tasks"))]
pub async fn request_cancel(conn: &mut Db, id: i64) -> Result<TaskRow> {
    diesel::sql_query(format!(
        "UPDATE tasks SET cancel_requested = true, updated_at = now() WHERE id = $1
         RETURNING {COLUMNS}"
    ))
    .bind::<BigInt, _>(id)
    .cached()
    .get_result(conn)
    .await
}

/// Puts a dead task back in its queue: due now, with all its attempts again. Its history
/// (processor, fence, last error) stays until a new claim replaces it.
#[tracing::instrument(name = "UPDATE tasks", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "UPDATE", db.collection.name = "tasks"))]
pub async fn requeue_dead(conn: &mut Db, id: i64) -> Result<TaskRow> {
    diesel::sql_query(format!(
        "UPDATE tasks SET status = 'pending', attempts = 0, scheduled_at = now(),
                processed_at = NULL, must_heartbeat_before = NULL, cancel_requested = false,
                updated_at = now()
         WHERE id = $1
         RETURNING {COLUMNS}"
    ))
    .bind::<BigInt, _>(id)
    .cached()
    .get_result(conn)
    .await
}

/// A listing row with the number of rows its page query read, to tell a page cut by size.
#[derive(Debug, QueryableByName)]
struct SizedRow {
    // Not `row`: the derive's own code names its row so.
    #[diesel(embed)]
    task: TaskRow,
    #[diesel(sql_type = BigInt)]
    page_rows: i64,
}

/// A listing page in `page`'s order past its cursor, filtered by statuses and queue, and cut
/// where its JSON would pass `max_bytes` (its first row always comes). Counting in the database
/// is what bounds memory: a page of large tasks is never loaded into this process only to be cut
/// here. Answers the rows and whether the size bound cut the page short.
#[tracing::instrument(name = "SELECT tasks", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "SELECT", db.collection.name = "tasks"))]
pub async fn list(
    conn: &mut Db,
    statuses: &[TaskStatus],
    queue: Option<&str>,
    page: Page,
    max_bytes: i64,
) -> Result<(Vec<TaskRow>, bool)> {
    let statuses: Vec<&str> = statuses.iter().map(|s| s.as_str()).collect();
    let (order, past) = page.order.sql();
    let sized: Vec<SizedRow> = diesel::sql_query(format!(
        "SELECT {COLUMNS}, page_rows FROM (
             SELECT page.*, count(*) OVER () AS page_rows,
                    sum(octet_length(task_data::text)
                        + coalesce(octet_length(task_output::text), 0)
                        + coalesce(octet_length(last_error), 0)) OVER (w) AS upto,
                    row_number() OVER (w) AS n
             FROM (SELECT {COLUMNS} FROM tasks
                   WHERE status = ANY($1) AND ($2::text IS NULL OR queue = $2) AND id {past} $3
                   {order} LIMIT $4) AS page
             WINDOW w AS ({order})
         ) AS sized
         WHERE n = 1 OR upto <= $5 {order}"
    ))
    .bind::<Array<Text>, _>(statuses)
    .bind::<Nullable<Text>, _>(queue)
    .bind::<BigInt, _>(page.past_id())
    .bind::<BigInt, _>(page.fetch())
    .bind::<BigInt, _>(max_bytes)
    .load(conn)
    .await?;
    let read = sized.as_slice().first().map_or(0, |first| first.page_rows);
    let cut = i64::try_from(sized.len()).unwrap_or(i64::MAX) < read;
    Ok((sized.into_iter().map(|sized| sized.task).collect(), cut))
}

#[derive(Debug, Clone, QueryableByName, serde::Serialize)]
pub struct QueueCount {
    #[diesel(sql_type = Text)]
    pub queue: String,
    #[diesel(sql_type = Text)]
    pub status: TaskStatus,
    #[diesel(sql_type = BigInt)]
    pub count: i64,
}

#[tracing::instrument(name = "SELECT tasks", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "SELECT", db.collection.name = "tasks"))]
pub async fn counts(conn: &mut Db) -> Result<Vec<QueueCount>> {
    diesel::sql_query(
        "SELECT queue, status, count(*) AS count FROM tasks GROUP BY queue, status ORDER BY queue",
    )
    .load(conn)
    .await
}

#[derive(Debug, Clone, QueryableByName, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OldestDue {
    #[diesel(sql_type = Text)]
    pub queue: String,
    #[diesel(sql_type = Double)]
    pub age_seconds: f64,
}

/// Per queue, how long the oldest due pending task has waited.
#[tracing::instrument(name = "SELECT tasks", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "SELECT", db.collection.name = "tasks"))]
pub async fn oldest_due(conn: &mut Db) -> Result<Vec<OldestDue>> {
    diesel::sql_query(
        "SELECT queue, EXTRACT(EPOCH FROM now() - min(scheduled_at))::float8 AS age_seconds
         FROM tasks WHERE status = 'pending' AND scheduled_at <= now() GROUP BY queue",
    )
    .load(conn)
    .await
}

/// Deletes up to `batch` finished tasks that finished more than `retention_seconds` ago.
#[tracing::instrument(name = "DELETE tasks", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "DELETE", db.collection.name = "tasks"))]
pub async fn sweep(conn: &mut Db, retention_seconds: i64, batch: i64) -> Result<usize> {
    diesel::sql_query(
        "DELETE FROM tasks
         WHERE id IN (SELECT id FROM tasks
                      WHERE status IN ('succeeded', 'dead', 'cancelled')
                        AND processed_at < now() - make_interval(secs => $1)
                      LIMIT $2)
           AND status IN ('succeeded', 'dead', 'cancelled')",
    )
    .bind::<Double, _>(retention_seconds as f64)
    .bind::<BigInt, _>(batch)
    .execute(conn)
    .await
}

/// Deletes history older than the retention age, as the rows it describes are.
pub async fn prune_history(conn: &mut Db, retention_seconds: i64) -> Result<usize> {
    diesel::sql_query("DELETE FROM task_events WHERE at < now() - make_interval(secs => $1)")
        .bind::<diesel::sql_types::Double, _>(retention_seconds as f64)
        .execute(conn)
        .await
}

pub async fn ping(conn: &mut Db) -> Result<()> {
    diesel::sql_query("SELECT 1")
        .cached()
        .execute(conn)
        .await
        .map(|_| ())
}

/// The generator's desired state (one row).
#[derive(Debug, Clone, QueryableByName)]
pub struct GeneratorRow {
    #[diesel(sql_type = Bool)]
    pub running: bool,
    #[diesel(sql_type = Double)]
    pub rate_per_second: f64,
    #[diesel(sql_type = Double)]
    pub min_sleep_seconds: f64,
    #[diesel(sql_type = Double)]
    pub max_sleep_seconds: f64,
    #[diesel(sql_type = BigInt)]
    pub produced: i64,
    #[diesel(sql_type = Timestamptz)]
    pub updated_at: DateTime<Utc>,
}

const GENERATOR_COLUMNS: &str =
    "running, rate_per_second, min_sleep_seconds, max_sleep_seconds, produced, updated_at";

pub async fn generator(conn: &mut Db) -> Result<GeneratorRow> {
    diesel::sql_query(format!(
        "SELECT {GENERATOR_COLUMNS} FROM generator_settings WHERE id = 1"
    ))
    .cached()
    .get_result(conn)
    .await
}

/// Sets the desired state; `None` leaves a setting as it is.
pub async fn set_generator(
    conn: &mut Db,
    running: bool,
    rate_per_second: Option<f64>,
    min_sleep_seconds: Option<f64>,
    max_sleep_seconds: Option<f64>,
) -> Result<GeneratorRow> {
    diesel::sql_query(format!(
        "UPDATE generator_settings SET running = $1,
                rate_per_second = COALESCE($2, rate_per_second),
                min_sleep_seconds = COALESCE($3, min_sleep_seconds),
                max_sleep_seconds = COALESCE($4, max_sleep_seconds),
                updated_at = now()
         WHERE id = 1
         RETURNING {GENERATOR_COLUMNS}"
    ))
    .bind::<Bool, _>(running)
    .bind::<Nullable<Double>, _>(rate_per_second)
    .bind::<Nullable<Double>, _>(min_sleep_seconds)
    .bind::<Nullable<Double>, _>(max_sleep_seconds)
    .cached()
    .get_result(conn)
    .await
}

/// Claims and completions per `bucket_seconds` over the last `window_seconds`, by the history
/// table; bucket 0 is the newest.
#[derive(Debug, Clone, QueryableByName, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ThroughputBucket {
    #[diesel(sql_type = BigInt)]
    pub seconds_ago: i64,
    #[diesel(sql_type = BigInt)]
    pub claimed: i64,
    #[diesel(sql_type = BigInt)]
    pub completed: i64,
}

#[tracing::instrument(name = "SELECT task_events", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "SELECT", db.collection.name = "task_events"))]
pub async fn throughput(
    conn: &mut Db,
    window_seconds: i64,
    bucket_seconds: i64,
) -> Result<Vec<ThroughputBucket>> {
    diesel::sql_query(
        "SELECT (floor(EXTRACT(EPOCH FROM now() - at) / $2) * $2)::bigint AS seconds_ago,
                count(*) FILTER (WHERE to_status = 'running') AS claimed,
                count(*) FILTER (WHERE to_status = 'succeeded') AS completed
         FROM task_events WHERE at > now() - make_interval(secs => $1)
         GROUP BY 1 ORDER BY 1",
    )
    .bind::<BigInt, _>(window_seconds)
    .bind::<BigInt, _>(bucket_seconds)
    .load(conn)
    .await
}

/// A processor with tasks in flight.
#[derive(Debug, Clone, QueryableByName, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Processor {
    #[diesel(sql_type = Text)]
    pub processor: String,
    #[diesel(sql_type = BigInt)]
    pub running: i64,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub last_heartbeat_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Double)]
    pub since_heartbeat_seconds: f64,
}

#[tracing::instrument(name = "SELECT tasks", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "SELECT", db.collection.name = "tasks"))]
pub async fn processors(conn: &mut Db) -> Result<Vec<Processor>> {
    diesel::sql_query(
        "SELECT processor, count(*) AS running, max(last_heartbeat_at) AS last_heartbeat_at,
                COALESCE(EXTRACT(EPOCH FROM now() - max(last_heartbeat_at)), 0)::float8
                    AS since_heartbeat_seconds
         FROM tasks WHERE status = 'running' AND processor IS NOT NULL
         GROUP BY processor ORDER BY processor",
    )
    .load(conn)
    .await
}

/// One entry of a task's history, for its detail view.
#[derive(Debug, Clone, QueryableByName, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskEvent {
    #[diesel(sql_type = Timestamptz)]
    pub at: DateTime<Utc>,
    #[diesel(sql_type = Nullable<Text>)]
    pub from_status: Option<TaskStatus>,
    #[diesel(sql_type = Text)]
    pub to_status: TaskStatus,
    #[diesel(sql_type = Nullable<Text>)]
    pub processor: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub fence: Option<i64>,
    #[diesel(sql_type = Integer)]
    pub attempts: i32,
}

#[tracing::instrument(name = "SELECT task_events", level = "info", skip_all, fields(otel.kind = "client", db.system.name = "postgresql", db.operation.name = "SELECT", db.collection.name = "task_events"))]
pub async fn events(conn: &mut Db, task_id: i64) -> Result<Vec<TaskEvent>> {
    diesel::sql_query(
        "SELECT at, from_status, to_status, processor, fence, attempts
         FROM task_events WHERE task_id = $1 ORDER BY id LIMIT 1000",
    )
    .bind::<BigInt, _>(task_id)
    .load(conn)
    .await
}
