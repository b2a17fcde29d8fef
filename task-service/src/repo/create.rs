//! Creating tasks: the plain insert, the generator's fenced insert, and the idempotency key's
//! lookup.

use chrono::{DateTime, Utc};
use diesel::sql_types::{Array, BigInt, Bool, Integer, Jsonb, Nullable, Text, Timestamptz};
use diesel::{OptionalExtension, QueryableByName};
use diesel_async::RunQueryDsl;
use leasehold::server::db::{Cache, OneRow};
use tracing::Instrument;

use super::{COLUMNS, Db, Result, TaskRow, event, history};

/// What `POST /api/tasks` inserts, validated.
#[derive(Debug, Clone)]
pub struct NewTask {
    pub task_data: serde_json::Value,
    pub scheduled_at: Option<DateTime<Utc>>,
    pub queue: String,
    pub priority: i32,
    pub max_attempts: i32,
    pub idempotency_key: Option<String>,
    pub concurrency_key: Option<String>,
}

/// What an insert of tasks with an idempotency key adds: a taken key stores nothing.
///
/// Only such an insert carries it. Every row of an `INSERT ... ON CONFLICT` is inserted
/// speculatively (a speculative-insertion lock taken and released, and a second WAL record to
/// confirm the row), whether or not the row could conflict; a row without a key never can, as
/// the key's unique index holds only rows that have one.
fn on_taken_key(keyed: bool) -> &'static str {
    if keyed {
        "ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING"
    } else {
        ""
    }
}

/// Inserts the task, or nothing if its idempotency key is taken (then `None`).
pub async fn insert(conn: &mut Db, task: &NewTask) -> Result<Option<TaskRow>> {
    let span = leasehold::db_span!("INSERT", "tasks");
    async move {
        diesel::sql_query(format!(
            "WITH moved AS (
                 INSERT INTO tasks (task_data, scheduled_at, requested_scheduled_at, queue,
                                    priority, max_attempts, idempotency_key, concurrency_key)
                 VALUES ($1, COALESCE($2, now()), COALESCE($2, now()), $3, $4, $5, $6, $7)
                 {on_taken_key}
                 RETURNING {COLUMNS}, {created}
             ), {history}
             SELECT * FROM moved",
            on_taken_key = on_taken_key(task.idempotency_key.is_some()),
            created = event("NULL"),
            history = history("true"),
        ))
        .bind::<Jsonb, _>(&task.task_data)
        .bind::<Nullable<Timestamptz>, _>(task.scheduled_at)
        .bind::<Text, _>(&task.queue)
        .bind::<Integer, _>(task.priority)
        .bind::<Integer, _>(task.max_attempts)
        .bind::<Nullable<Text>, _>(task.idempotency_key.as_deref())
        .bind::<Nullable<Text>, _>(task.concurrency_key.as_deref())
        .cached()
        .get_one(conn)
        .await
        .optional()
    }
    .instrument(span)
    .await
}

/// A row [`insert_many`] stored, with the place (from 1) of its task in the input.
#[derive(Debug, QueryableByName)]
pub struct Inserted {
    #[diesel(sql_type = BigInt)]
    pub ord: i64,
    #[diesel(embed)]
    pub row: TaskRow,
}

/// Inserts `tasks` in one statement: those whose idempotency key is taken are left out of the
/// answer, which names each stored row's place in `tasks`. Ids are drawn in input order, so a
/// batch's tasks keep their order among equals in the queue.
pub async fn insert_many(conn: &mut Db, tasks: &[&NewTask]) -> Result<Vec<Inserted>> {
    let span = leasehold::db_span!("INSERT", "tasks");
    span.record("db.operation.batch.size", tasks.len());
    let data: Vec<&serde_json::Value> = tasks.iter().map(|t| &t.task_data).collect();
    let scheduled: Vec<Option<DateTime<Utc>>> = tasks.iter().map(|t| t.scheduled_at).collect();
    let queues: Vec<&str> = tasks.iter().map(|t| t.queue.as_str()).collect();
    let priorities: Vec<i32> = tasks.iter().map(|t| t.priority).collect();
    let attempts: Vec<i32> = tasks.iter().map(|t| t.max_attempts).collect();
    let keys: Vec<Option<&str>> = tasks.iter().map(|t| t.idempotency_key.as_deref()).collect();
    let concurrency_keys: Vec<Option<&str>> =
        tasks.iter().map(|t| t.concurrency_key.as_deref()).collect();
    async move {
        diesel::sql_query(format!(
            "WITH input AS (
                 SELECT nextval('tasks_id_seq') AS id, i.*
                 FROM unnest($1::jsonb[], $2::timestamptz[], $3::text[], $4::int[], $5::int[],
                             $6::text[], $7::text[])
                      WITH ORDINALITY AS i(task_data, scheduled_at, queue, priority,
                                           max_attempts, idempotency_key, concurrency_key, ord)
                 ORDER BY i.ord
             ),
             moved AS (
                 INSERT INTO tasks (id, task_data, scheduled_at, requested_scheduled_at, queue,
                                    priority, max_attempts, idempotency_key, concurrency_key)
                 SELECT id, task_data, COALESCE(scheduled_at, now()), COALESCE(scheduled_at, now()),
                        queue, priority, max_attempts, idempotency_key, concurrency_key
                 FROM input ORDER BY ord
                 {on_taken_key}
                 RETURNING {COLUMNS}, {created}
             ), {history}
             SELECT input.ord, moved.* FROM moved JOIN input USING (id)",
            on_taken_key = on_taken_key(tasks.iter().any(|t| t.idempotency_key.is_some())),
            created = event("NULL"),
            history = history("true"),
        ))
        .bind::<Array<Jsonb>, _>(data)
        .bind::<Array<Nullable<Timestamptz>>, _>(scheduled)
        .bind::<Array<Text>, _>(queues)
        .bind::<Array<Integer>, _>(priorities)
        .bind::<Array<Integer>, _>(attempts)
        .bind::<Array<Nullable<Text>>, _>(keys)
        .bind::<Array<Nullable<Text>>, _>(concurrency_keys)
        .load(conn)
        .await
    }
    .instrument(span)
    .await
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
pub async fn insert_generated(
    conn: &mut Db,
    task: &NewTask,
    deadline: DateTime<Utc>,
) -> Result<Option<TaskRow>> {
    let span = leasehold::db_span!("INSERT", "tasks");
    async move {
        diesel::sql_query(format!(
            "WITH gate AS (
             SELECT running FROM generator_settings WHERE id = 1 FOR NO KEY UPDATE
         ), at AS (
             SELECT clock_timestamp() AS now FROM gate WHERE gate.running
         ), moved AS (
             INSERT INTO tasks (task_data, scheduled_at, requested_scheduled_at, queue, priority,
                                max_attempts, idempotency_key, concurrency_key, created_at,
                                updated_at)
             SELECT $1, COALESCE($2, at.now), COALESCE($2, at.now), $3, $4, $5, $6, $8, at.now,
                    at.now
             FROM at WHERE at.now < $7
             ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
             RETURNING {COLUMNS}, {created}
         ), {history}, counted AS (
             UPDATE generator_settings SET produced = produced + (SELECT count(*) FROM moved)
             WHERE id = 1
         )
         SELECT * FROM moved",
            created = event("NULL"),
            history = history("true"),
        ))
        .bind::<Jsonb, _>(&task.task_data)
        .bind::<Nullable<Timestamptz>, _>(task.scheduled_at)
        .bind::<Text, _>(&task.queue)
        .bind::<Integer, _>(task.priority)
        .bind::<Integer, _>(task.max_attempts)
        .bind::<Nullable<Text>, _>(task.idempotency_key.as_deref())
        .bind::<Timestamptz, _>(deadline)
        .bind::<Nullable<Text>, _>(task.concurrency_key.as_deref())
        .cached()
        .get_one(conn)
        .await
        .optional()
    }
    .instrument(span)
    .await
}

#[derive(QueryableByName)]
struct Clock {
    #[diesel(sql_type = Timestamptz)]
    now: DateTime<Utc>,
}

/// The database's clock right now (`clock_timestamp()`, not the transaction's `now()`).
pub async fn clock(conn: &mut Db) -> Result<DateTime<Utc>> {
    let span = leasehold::db_span!("SELECT", "clock_timestamp");
    async move {
        diesel::sql_query("SELECT clock_timestamp() AS now")
            .cached()
            .get_one::<Clock>(conn)
            .await
            .map(|row| row.now)
    }
    .instrument(span)
    .await
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
pub async fn find_by_idempotency_key(
    conn: &mut Db,
    key: &str,
    scheduled_at: Option<DateTime<Utc>>,
) -> Result<Option<KeyedTask>> {
    let span = leasehold::db_span!("SELECT", "tasks");
    async move {
        diesel::sql_query(format!(
            "SELECT {COLUMNS},
                (requested_scheduled_at IS NULL
                 OR requested_scheduled_at = COALESCE($2, created_at)) AS same_schedule
         FROM tasks WHERE idempotency_key = $1"
        ))
        .bind::<Text, _>(key)
        .bind::<Nullable<Timestamptz>, _>(scheduled_at)
        .cached()
        .get_one(conn)
        .await
        .optional()
    }
    .instrument(span)
    .await
}
