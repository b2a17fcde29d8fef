//! Periodic tasks (the `schedules` table): definitions, pause and resume, and the tickers'
//! lock on the due ones.

use chrono::{DateTime, Utc};
use diesel::pg::Pg;
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::sql_types::{BigInt, Bool, Integer, Jsonb, Nullable, Text, Timestamptz};
use diesel::{OptionalExtension, QueryableByName};
use diesel_async::RunQueryDsl;
use leasehold::schedules::CatchUp;
use leasehold::server::db::{Cache, OneRow};
use tracing::Instrument;

use super::{Db, Result};

/// A schedule row.
#[derive(Debug, Clone, QueryableByName)]
pub struct ScheduleRow {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = Text)]
    pub name: String,
    #[diesel(sql_type = Text)]
    pub cron: String,
    #[diesel(sql_type = Text)]
    pub timezone: String,
    #[diesel(sql_type = Jsonb)]
    pub task_data: serde_json::Value,
    #[diesel(sql_type = Text)]
    pub queue: String,
    #[diesel(sql_type = Integer)]
    pub priority: i32,
    #[diesel(sql_type = Integer)]
    pub max_attempts: i32,
    #[diesel(sql_type = Text)]
    pub catch_up: CatchUp,
    #[diesel(sql_type = Integer)]
    pub misfire_grace_seconds: i32,
    #[diesel(sql_type = Bool)]
    pub paused: bool,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub next_tick_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub last_tick_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub last_task_id: Option<i64>,
    #[diesel(sql_type = Timestamptz)]
    pub created_at: DateTime<Utc>,
    #[diesel(sql_type = Timestamptz)]
    pub updated_at: DateTime<Utc>,
    #[diesel(sql_type = Nullable<Text>)]
    pub concurrency_key: Option<String>,
}

const SCHEDULE_COLUMNS: &str = "id, name, cron, timezone, task_data, queue, priority, \
    max_attempts, catch_up, misfire_grace_seconds, paused, next_tick_at, last_tick_at, \
    last_task_id, created_at, updated_at, concurrency_key";

/// A definition, validated: what a create or a replace stores.
#[derive(Debug, Clone)]
pub struct NewSchedule {
    pub name: String,
    pub cron: String,
    pub timezone: String,
    pub task_data: serde_json::Value,
    pub queue: String,
    pub priority: i32,
    pub max_attempts: i32,
    pub catch_up: CatchUp,
    pub misfire_grace_seconds: i32,
    pub concurrency_key: Option<String>,
}

/// A replace's row, and whether it created the schedule.
#[derive(Debug, QueryableByName)]
pub struct Replaced {
    #[diesel(embed)]
    pub schedule: ScheduleRow,
    #[diesel(sql_type = Bool)]
    pub created: bool,
}

/// The insert both a create and a replace start with; `s` is the stored row.
const INSERT: &str = "INSERT INTO schedules AS s (name, cron, timezone, task_data, queue, priority,
                                  max_attempts, catch_up, misfire_grace_seconds, next_tick_at,
                                  concurrency_key)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)";

/// `sql` (which starts with [`INSERT`]) with the definition and its next tick bound.
fn bound<'a>(
    sql: String,
    schedule: &'a NewSchedule,
    next_tick_at: DateTime<Utc>,
) -> BoxedSqlQuery<'a, Pg, SqlQuery> {
    diesel::sql_query(sql)
        .into_boxed::<'a, Pg>()
        .bind::<Text, _>(&schedule.name)
        .bind::<Text, _>(&schedule.cron)
        .bind::<Text, _>(&schedule.timezone)
        .bind::<Jsonb, _>(&schedule.task_data)
        .bind::<Text, _>(&schedule.queue)
        .bind::<Integer, _>(schedule.priority)
        .bind::<Integer, _>(schedule.max_attempts)
        .bind::<Text, _>(schedule.catch_up.as_str())
        .bind::<Integer, _>(schedule.misfire_grace_seconds)
        .bind::<Timestamptz, _>(next_tick_at)
        .bind::<Nullable<Text>, _>(schedule.concurrency_key.as_deref())
}

/// Stores a new schedule, first due at `next_tick_at`; `None` if the name is taken.
pub async fn insert_schedule(
    conn: &mut Db,
    schedule: &NewSchedule,
    next_tick_at: DateTime<Utc>,
) -> Result<Option<ScheduleRow>> {
    let span = leasehold::db_span!("INSERT", "schedules");
    async move {
        bound(
            format!("{INSERT} ON CONFLICT (name) DO NOTHING RETURNING {SCHEDULE_COLUMNS}"),
            schedule,
            next_tick_at,
        )
        .get_one(conn)
        .await
        .optional()
    }
    .instrument(span)
    .await
}

/// Creates or replaces the schedule `schedule.name`. A replaced schedule keeps its pause and
/// its history; it keeps its next tick too unless its cron expression or zone changed (then it
/// is due at `next_tick_at`), so re-applying the same definition never skips a due tick.
pub async fn replace_schedule(
    conn: &mut Db,
    schedule: &NewSchedule,
    next_tick_at: DateTime<Utc>,
) -> Result<Replaced> {
    let span = leasehold::db_span!("INSERT", "schedules");
    async move {
        bound(
            format!(
                "{INSERT} ON CONFLICT (name) DO UPDATE SET
                 cron = EXCLUDED.cron, timezone = EXCLUDED.timezone,
                 task_data = EXCLUDED.task_data, queue = EXCLUDED.queue,
                 priority = EXCLUDED.priority, max_attempts = EXCLUDED.max_attempts,
                 concurrency_key = EXCLUDED.concurrency_key, catch_up = EXCLUDED.catch_up,
                 misfire_grace_seconds = EXCLUDED.misfire_grace_seconds,
                 next_tick_at = CASE
                     WHEN s.paused THEN NULL
                     WHEN s.cron = EXCLUDED.cron AND s.timezone = EXCLUDED.timezone
                         THEN s.next_tick_at
                     ELSE EXCLUDED.next_tick_at END,
                 updated_at = now()
             RETURNING {SCHEDULE_COLUMNS}, (xmax = 0) AS created"
            ),
            schedule,
            next_tick_at,
        )
        .get_one(conn)
        .await
    }
    .instrument(span)
    .await
}

/// The schedule `name`.
pub async fn schedule(conn: &mut Db, name: &str) -> Result<Option<ScheduleRow>> {
    let span = leasehold::db_span!("SELECT", "schedules");
    async move {
        diesel::sql_query(format!(
            "SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE name = $1"
        ))
        .bind::<Text, _>(name)
        .cached()
        .get_one(conn)
        .await
        .optional()
    }
    .instrument(span)
    .await
}

/// Every schedule, by name.
pub async fn schedules(conn: &mut Db) -> Result<Vec<ScheduleRow>> {
    let span = leasehold::db_span!("SELECT", "schedules");
    async move {
        diesel::sql_query(format!(
            "SELECT {SCHEDULE_COLUMNS} FROM schedules ORDER BY name"
        ))
        .cached()
        .load(conn)
        .await
    }
    .instrument(span)
    .await
}

/// Deletes the schedule `name` (its tasks stay); the row it was, if any.
pub async fn delete_schedule(conn: &mut Db, name: &str) -> Result<Option<ScheduleRow>> {
    let span = leasehold::db_span!("DELETE", "schedules");
    async move {
        diesel::sql_query(format!(
            "DELETE FROM schedules WHERE name = $1 RETURNING {SCHEDULE_COLUMNS}"
        ))
        .bind::<Text, _>(name)
        .cached()
        .get_one(conn)
        .await
        .optional()
    }
    .instrument(span)
    .await
}

/// Pauses the schedule `name`, or resumes it, due again at `resume_at`. Setting what is already
/// set changes nothing, not even the time.
pub async fn set_schedule_paused(
    conn: &mut Db,
    name: &str,
    paused: bool,
    resume_at: Option<DateTime<Utc>>,
) -> Result<Option<ScheduleRow>> {
    let span = leasehold::db_span!("UPDATE", "schedules");
    async move {
        diesel::sql_query(format!(
            "UPDATE schedules SET
                 next_tick_at = CASE WHEN $2 THEN NULL
                                     WHEN paused THEN $3 ELSE next_tick_at END,
                 updated_at = CASE WHEN paused = $2 THEN updated_at ELSE now() END,
                 paused = $2
             WHERE name = $1
             RETURNING {SCHEDULE_COLUMNS}"
        ))
        .bind::<Text, _>(name)
        .bind::<Bool, _>(paused)
        .bind::<Nullable<Timestamptz>, _>(resume_at)
        .cached()
        .get_one(conn)
        .await
        .optional()
    }
    .instrument(span)
    .await
}

/// A due schedule, locked, with the transaction's `now()`.
#[derive(Debug, QueryableByName)]
pub struct DueSchedule {
    #[diesel(embed)]
    pub schedule: ScheduleRow,
    #[diesel(sql_type = Timestamptz)]
    pub now: DateTime<Utc>,
}

/// Locks up to `limit` due schedules, earliest first, skipping those another replica's ticker
/// holds: that one is making their ticks, and they are not due any more when it commits.
pub async fn lock_due_schedules(conn: &mut Db, limit: i64) -> Result<Vec<DueSchedule>> {
    let span = leasehold::db_span!("SELECT", "schedules");
    async move {
        diesel::sql_query(format!(
            "SELECT {SCHEDULE_COLUMNS}, now() AS now FROM schedules
             WHERE next_tick_at <= now()
             ORDER BY next_tick_at LIMIT $1
             FOR UPDATE SKIP LOCKED"
        ))
        .bind::<BigInt, _>(limit)
        .cached()
        .load(conn)
        .await
    }
    .instrument(span)
    .await
}

/// Moves a locked schedule on to `next_tick_at` (none: it never fires again, so it is paused),
/// recording the latest tick that made a task.
pub async fn advance_schedule(
    conn: &mut Db,
    id: i64,
    next_tick_at: Option<DateTime<Utc>>,
    last: Option<(DateTime<Utc>, i64)>,
) -> Result<usize> {
    let span = leasehold::db_span!("UPDATE", "schedules");
    async move {
        diesel::sql_query(
            "UPDATE schedules SET next_tick_at = $2, paused = ($2 IS NULL),
                 last_tick_at = COALESCE($3, last_tick_at),
                 last_task_id = COALESCE($4, last_task_id)
             WHERE id = $1",
        )
        .bind::<BigInt, _>(id)
        .bind::<Nullable<Timestamptz>, _>(next_tick_at)
        .bind::<Nullable<Timestamptz>, _>(last.map(|(tick, _)| tick))
        .bind::<Nullable<BigInt>, _>(last.map(|(_, task)| task))
        .cached()
        .execute(conn)
        .await
    }
    .instrument(span)
    .await
}

/// How long a ticker's transaction may wait on its replica before PostgreSQL ends it.
pub const IDLE_IN_ROUND: &str = "5s";

/// Within a transaction: PostgreSQL ends it (and the session) if it waits on this client for
/// longer than [`IDLE_IN_ROUND`], so a frozen replica cannot hold rows locked.
pub async fn bound_idle_in_transaction(conn: &mut Db) -> Result<usize> {
    diesel::sql_query(format!(
        "SET LOCAL idle_in_transaction_session_timeout = '{IDLE_IN_ROUND}'"
    ))
    .execute(conn)
    .await
}

#[derive(QueryableByName)]
struct Wait {
    #[diesel(sql_type = Nullable<diesel::sql_types::Double>)]
    seconds: Option<f64>,
}

/// Seconds from now to the earliest tick of a running schedule (negative when one is due);
/// none without running schedules.
pub async fn next_tick_in(conn: &mut Db) -> Result<Option<f64>> {
    let span = leasehold::db_span!("SELECT", "schedules");
    async move {
        diesel::sql_query(
            "SELECT EXTRACT(EPOCH FROM min(next_tick_at) - clock_timestamp())::float8 AS seconds
             FROM schedules WHERE next_tick_at IS NOT NULL",
        )
        .cached()
        .get_one::<Wait>(conn)
        .await
        .map(|w| w.seconds)
    }
    .instrument(span)
    .await
}
