//! Reads: one task, listings, counts and gauges, the dashboard's throughput and workers, a task's
//! history, and the health ping.

use chrono::{DateTime, Utc};
use diesel::pg::Pg;
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::sql_types::{Array, BigInt, Double, Integer, Nullable, Text, Timestamptz};
use diesel::{OptionalExtension, QueryableByName};
use diesel_async::RunQueryDsl;
use leasehold::server::db::{Cache, OneRow};
use leasehold::server::http::Page;
use leasehold::tasks::TaskStatus;
use tracing::Instrument;

use super::{COLUMNS, Db, HISTORY_BAND, Result, TaskRow};

pub async fn find(conn: &mut Db, id: i64) -> Result<Option<TaskRow>> {
    let span = leasehold::db_span!("SELECT", "tasks");
    async move {
        diesel::sql_query(format!("SELECT {COLUMNS} FROM tasks WHERE id = $1"))
            .bind::<BigInt, _>(id)
            .cached()
            .get_one(conn)
            .await
            .optional()
    }
    .instrument(span)
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

/// Which tasks a listing shows and a bulk operation touches: every field given must match. One
/// type and one piece of SQL for both, so that an operator's "retry what this listing shows"
/// touches exactly what it showed (a bulk delete once ignored the processor it was given, and
/// deleted every processor's tasks).
#[derive(Debug, Clone)]
pub struct TaskFilter<'a> {
    pub statuses: Vec<TaskStatus>,
    pub queue: Option<&'a str>,
    /// Only tasks last claimed by this processor.
    pub processor: Option<&'a str>,
    /// Only tasks with this concurrency key.
    pub key: Option<&'a str>,
    /// Only tasks created in `[created_after, created_before)`.
    pub created_after: Option<DateTime<Utc>>,
    pub created_before: Option<DateTime<Utc>>,
}

impl TaskFilter<'_> {
    /// How many values [`TaskFilter::bind`] binds.
    pub const VALUES: usize = 6;

    /// The filter's conditions on `tasks`, with its values bound as `$first` and the
    /// [`TaskFilter::VALUES`] after it, in [`TaskFilter::bind`]'s order.
    pub fn sql(first: usize) -> String {
        let [status, queue, processor, key, after, before] =
            [0, 1, 2, 3, 4, 5].map(|i| format!("${}", first + i));
        format!(
            "status = ANY({status}) AND ({queue}::text IS NULL OR queue = {queue})
             AND ({processor}::text IS NULL OR processor = {processor})
             AND ({key}::text IS NULL OR concurrency_key = {key})
             AND ({after}::timestamptz IS NULL OR created_at >= {after})
             AND ({before}::timestamptz IS NULL OR created_at < {before})"
        )
    }

    /// `query` with the filter's values bound next, in the order [`TaskFilter::sql`] names them.
    pub fn bind<'f>(
        &'f self,
        query: BoxedSqlQuery<'f, Pg, SqlQuery>,
    ) -> BoxedSqlQuery<'f, Pg, SqlQuery> {
        let statuses: Vec<&'static str> = self.statuses.iter().map(|s| s.as_str()).collect();
        query
            .bind::<Array<Text>, _>(statuses)
            .bind::<Nullable<Text>, _>(self.queue)
            .bind::<Nullable<Text>, _>(self.processor)
            .bind::<Nullable<Text>, _>(self.key)
            .bind::<Nullable<Timestamptz>, _>(self.created_after)
            .bind::<Nullable<Timestamptz>, _>(self.created_before)
    }
}

/// A listing page in `page`'s order past its cursor, of the tasks `filter` keeps, and cut
/// where its JSON would pass `max_bytes` (its first row always comes). Counting in the database
/// is what bounds memory: a page of large tasks is never loaded into this process only to be cut
/// here. Answers the rows and whether the size bound cut the page short.
pub async fn list(
    conn: &mut Db,
    filter: &TaskFilter<'_>,
    page: Page,
    max_bytes: i64,
) -> Result<(Vec<TaskRow>, bool)> {
    let span = leasehold::db_span!("SELECT", "tasks");
    async move {
        let (order, past) = page.order.sql();
        let matching = TaskFilter::sql(1);
        let [past_id, fetch, bytes] = [0, 1, 2].map(|i| format!("${}", TaskFilter::VALUES + 1 + i));
        let query = diesel::sql_query(format!(
            "SELECT {COLUMNS}, page_rows FROM (
             SELECT page.*, count(*) OVER () AS page_rows,
                    sum(octet_length(task_data::text)
                        + coalesce(octet_length(task_output::text), 0)
                        + coalesce(octet_length(last_error), 0)) OVER (w) AS upto,
                    row_number() OVER (w) AS n
             FROM (SELECT {COLUMNS} FROM tasks
                   WHERE {matching} AND id {past} {past_id}
                   {order} LIMIT {fetch}) AS page
             WINDOW w AS ({order})
         ) AS sized
         WHERE n = 1 OR upto <= {bytes} {order}"
        ))
        .into_boxed::<Pg>();
        let sized: Vec<SizedRow> = filter
            .bind(query)
            .bind::<BigInt, _>(page.past_id())
            .bind::<BigInt, _>(page.fetch())
            .bind::<BigInt, _>(max_bytes)
            .load(conn)
            .await?;
        let read = sized.as_slice().first().map_or(0, |first| first.page_rows);
        let cut = i64::try_from(sized.len()).unwrap_or(i64::MAX) < read;
        Ok((sized.into_iter().map(|sized| sized.task).collect(), cut))
    }
    .instrument(span)
    .await
}

#[derive(Debug, Clone, QueryableByName, serde::Serialize, utoipa::ToSchema)]
pub struct QueueCount {
    #[diesel(sql_type = Text)]
    pub queue: String,
    #[diesel(sql_type = Text)]
    pub status: TaskStatus,
    #[diesel(sql_type = BigInt)]
    pub count: i64,
}

pub async fn counts(conn: &mut Db) -> Result<Vec<QueueCount>> {
    let span = leasehold::db_span!("SELECT", "tasks");
    async move {
        diesel::sql_query(
        "SELECT queue, status, count(*) AS count FROM tasks GROUP BY queue, status ORDER BY queue",
    )
    .load(conn)
    .await
    }
    .instrument(span)
    .await
}

/// The number of tasks in each status, over every queue: the total beside a page of
/// [`counts_of`].
pub async fn status_totals(conn: &mut Db) -> Result<Vec<QueueCount>> {
    let span = leasehold::db_span!("SELECT", "tasks");
    async move {
        diesel::sql_query(
            "SELECT ''::text AS queue, status, count(*) AS count FROM tasks GROUP BY status",
        )
        .load(conn)
        .await
    }
    .instrument(span)
    .await
}

/// [`counts`] of the named queues only: one index range each of `tasks_queue_status_idx` (the
/// tasks not running) and `tasks_running_idx` (the running ones).
pub async fn counts_of(conn: &mut Db, queues: &[String]) -> Result<Vec<QueueCount>> {
    let span = leasehold::db_span!("SELECT", "tasks");
    async move {
        diesel::sql_query(
            "SELECT queue, status, count(*) AS count FROM tasks
             WHERE queue = ANY($1) AND status <> 'running'
             GROUP BY queue, status
             UNION ALL
             SELECT queue, 'running', count(*) FROM tasks
             WHERE queue = ANY($1) AND status = 'running'
             GROUP BY queue",
        )
        .bind::<Array<Text>, _>(queues)
        .load(conn)
        .await
    }
    .instrument(span)
    .await
}

#[derive(Debug, Clone, QueryableByName, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OldestDue {
    #[diesel(sql_type = Text)]
    pub queue: String,
    #[diesel(sql_type = Double)]
    pub age_seconds: f64,
}

/// Per queue, how long the oldest due pending task has waited.
pub async fn oldest_due(conn: &mut Db) -> Result<Vec<OldestDue>> {
    let span = leasehold::db_span!("SELECT", "tasks");
    async move {
        diesel::sql_query(
            "SELECT queue, EXTRACT(EPOCH FROM now() - min(scheduled_at))::float8 AS age_seconds
         FROM tasks WHERE status = 'pending' AND scheduled_at <= now() GROUP BY queue",
        )
        .load(conn)
        .await
    }
    .instrument(span)
    .await
}

/// [`oldest_due`] of the named queues only.
pub async fn oldest_due_of(conn: &mut Db, queues: &[String]) -> Result<Vec<OldestDue>> {
    let span = leasehold::db_span!("SELECT", "tasks");
    async move {
        diesel::sql_query(
            "SELECT queue, EXTRACT(EPOCH FROM now() - min(scheduled_at))::float8 AS age_seconds
             FROM tasks
             WHERE queue = ANY($1) AND status = 'pending' AND scheduled_at <= now()
             GROUP BY queue",
        )
        .bind::<Array<Text>, _>(queues)
        .load(conn)
        .await
    }
    .instrument(span)
    .await
}

/// Transitions per `bucket_seconds` over the last `window_seconds`, by the history table;
/// bucket 0 is the newest. Buckets of seconds end now; buckets of whole minutes are whole
/// minutes, bucket 0 the one holding the current minute. `claimed` and `completed` are `started` and `succeeded` under the
/// names the first dashboard read.
#[derive(Debug, Clone, QueryableByName, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ThroughputBucket {
    #[diesel(sql_type = BigInt)]
    pub seconds_ago: i64,
    #[diesel(sql_type = BigInt)]
    pub claimed: i64,
    #[diesel(sql_type = BigInt)]
    pub completed: i64,
    /// New tasks.
    #[diesel(sql_type = BigInt)]
    pub created: i64,
    /// Claims (a task going to running).
    #[diesel(sql_type = BigInt)]
    pub started: i64,
    #[diesel(sql_type = BigInt)]
    pub succeeded: i64,
    /// Failures: a running task sent back to pending to retry, or dead.
    #[diesel(sql_type = BigInt)]
    pub failed: i64,
    /// Pickup latency of the first claims in the bucket, from the moment each task was due
    /// (created, or its requested schedule if later) to its claim: median and 99th percentile,
    /// in milliseconds; none without a first claim. Buckets of whole minutes (the hour's and the
    /// day's charts) take them from the per-minute histograms of the rollup: within 2.2% (and
    /// 0.02 ms) of the latency at that rank (`percentile_disc`).
    #[diesel(sql_type = Nullable<Double>)]
    pub pickup_p50_ms: Option<f64>,
    #[diesel(sql_type = Nullable<Double>)]
    pub pickup_p99_ms: Option<f64>,
}

/// How long the charts' read may take: a day of history on a busy system is many rows, and a
/// chart is not worth holding the database for. Past it the read is refused (503).
pub(super) const THROUGHPUT_TIMEOUT: &str = "5s";

/// The history's transitions per bucket, and with `per_queue` each queue's moves in and out of
/// pending and running per bucket: one transaction, each statement bounded.
pub async fn throughput(
    conn: &mut Db,
    window_seconds: i64,
    bucket_seconds: i64,
    per_queue: bool,
) -> Result<(Vec<ThroughputBucket>, Vec<QueueMoves>)> {
    use diesel_async::AsyncConnection;
    conn.transaction(async |conn| {
        diesel::sql_query("SELECT set_config('statement_timeout', $1, true)")
            .bind::<Text, _>(THROUGHPUT_TIMEOUT)
            .execute(conn)
            .await?;
        let buckets = throughput_read(conn, window_seconds, bucket_seconds).await?;
        let moves = if per_queue {
            queue_moves(conn, window_seconds, bucket_seconds).await?
        } else {
            Vec::new()
        };
        Ok((buckets, moves))
    })
    .await
}

/// One queue's net moves into pending and running in one bucket (bucket 0 the newest), and its
/// counts now: from them the counts at the end of every bucket follow, newest to oldest.
#[derive(Debug, Clone, QueryableByName)]
pub struct QueueMoves {
    #[diesel(sql_type = Text)]
    pub queue: String,
    /// `None` for the row that carries the queue's counts now.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub seconds_ago: Option<i64>,
    #[diesel(sql_type = BigInt)]
    pub pending: i64,
    #[diesel(sql_type = BigInt)]
    pub running: i64,
}

/// Each queue with tasks pending or running now, or moved in the window: its counts now, and
/// per bucket the net number of tasks that entered pending and running (entered minus left), by
/// the history (which names each move's queue, so a task deleted since still counts: it was
/// there then).
async fn queue_moves(
    conn: &mut Db,
    window_seconds: i64,
    bucket_seconds: i64,
) -> Result<Vec<QueueMoves>> {
    let span = leasehold::db_span!("SELECT", "task_events");
    async move {
        diesel::sql_query(format!(
            "SELECT queue, bucket AS seconds_ago, pending, running FROM ({}) moved
                 UNION ALL
                 SELECT queue, NULL, count(*) FILTER (WHERE status = 'pending'),
                        count(*) FILTER (WHERE status = 'running')
                 FROM tasks WHERE status IN ('pending', 'running') GROUP BY queue",
            queue_moves_sql(SECONDS_AGO, RECENT)
        ))
        .bind::<BigInt, _>(window_seconds)
        .bind::<BigInt, _>(bucket_seconds)
        .load(conn)
        .await
    }
    .instrument(span)
    .await
}

/// The bucket of a raw read's event: whole `$2` seconds before now.
const SECONDS_AGO: &str = "(floor(EXTRACT(EPOCH FROM now() - e.at) / $2) * $2)::bigint";
/// A raw read's events: those of the last `$1` seconds.
const RECENT: &str = "e.at > now() - make_interval(secs => $1)";

/// The history's transitions, one per task ([`task_transitions`]), that `window` keeps (a
/// condition on `e`), each in its `bucket` (an expression of `e.at`), with what the charts
/// count them by: their statuses, whether a return to pending charged the attempt, and a first
/// claim's pickup wait (`ms`). The transitions record all of it themselves, so no event is
/// looked up by another. One walk for the raw read and the rollup's fold ([`super::rollup`]),
/// so that a folded minute counts what a raw read of it would.
///
/// [`task_transitions`]: ../../../migrations/2026-11-27-000116_task_history_per_statement/up.sql
pub(super) fn history_sql(bucket: &str, window: &str) -> String {
    format!(
        "SELECT {bucket} AS bucket, e.from_status, e.to_status, e.charged, e.pickup_ms AS ms
         FROM task_transitions e
         WHERE {window}"
    )
}

/// The charts' counts over [`history_sql`]'s rows. A failure charges its attempt, so a snooze
/// or a hand-back (which refund it) are not failures.
pub(super) const TRANSITION_COUNTS: &str = "
    count(*) FILTER (WHERE from_status IS NULL) AS created,
    count(*) FILTER (WHERE to_status = 'running') AS started,
    count(*) FILTER (WHERE to_status = 'succeeded') AS succeeded,
    count(*) FILTER (WHERE to_status = 'dead'
                        OR (from_status = 'running' AND to_status = 'pending' AND charged))
        AS failed";

/// Each queue's net moves into pending and running (entered minus left) per `bucket` of the
/// history that `window` keeps: each history row counts as many moves as it names tasks.
/// Shared by the raw read and the rollup's fold.
pub(super) fn queue_moves_sql(bucket: &str, window: &str) -> String {
    format!(
        "SELECT {bucket} AS bucket, e.queue,
                sum(cardinality(e.task_ids) * ((e.to_status = 'pending')::int
                    - (e.from_status IS NOT DISTINCT FROM 'pending')::int))::bigint AS pending,
                sum(cardinality(e.task_ids) * ((e.to_status = 'running')::int
                    - (e.from_status IS NOT DISTINCT FROM 'running')::int))::bigint AS running
         FROM task_events e
         WHERE {window} AND e.queue IS NOT NULL
         GROUP BY 1, 2"
    )
}

async fn throughput_read(
    conn: &mut Db,
    window_seconds: i64,
    bucket_seconds: i64,
) -> Result<Vec<ThroughputBucket>> {
    let span = leasehold::db_span!("SELECT", "task_events");
    async move {
        diesel::sql_query(format!(
            "SELECT bucket AS seconds_ago,
                        count(*) FILTER (WHERE to_status = 'running') AS claimed,
                        count(*) FILTER (WHERE to_status = 'succeeded') AS completed,
                        {TRANSITION_COUNTS},
                        percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) AS pickup_p50_ms,
                        percentile_cont(0.99) WITHIN GROUP (ORDER BY ms) AS pickup_p99_ms
                 FROM ({}) e
                 GROUP BY 1 ORDER BY 1",
            history_sql(SECONDS_AGO, RECENT)
        ))
        .bind::<BigInt, _>(window_seconds)
        .bind::<BigInt, _>(bucket_seconds)
        .load(conn)
        .await
    }
    .instrument(span)
    .await
}

/// A processor with tasks in flight.
#[derive(Debug, Clone, QueryableByName, serde::Serialize, utoipa::ToSchema)]
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

pub async fn processors(conn: &mut Db) -> Result<Vec<Processor>> {
    let span = leasehold::db_span!("SELECT", "tasks");
    async move {
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
    .instrument(span)
    .await
}

/// One entry of a task's history, for its detail view.
#[derive(Debug, Clone, QueryableByName, serde::Serialize, utoipa::ToSchema)]
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

pub async fn events(conn: &mut Db, task_id: i64) -> Result<Vec<TaskEvent>> {
    let span = leasehold::db_span!("SELECT", "task_events");
    async move {
        // A row names tasks of one band only, in order: the task's rows are among those whose
        // first id is between its band's start and its own id (the index over the first id
        // finds them), the containment keeps those that name it, the unnest picks its place.
        diesel::sql_query(format!(
            "SELECT e.at, e.from_status, e.to_status,
                    e.claimants[coalesce(u.claimant, 1)] AS processor, u.fence, u.attempts
             FROM task_events e
             CROSS JOIN LATERAL unnest(e.task_ids, e.fences, e.attempts, e.claimant_of)
                 AS u(task_id, fence, attempts, claimant)
             WHERE e.task_ids[1] BETWEEN $1 - $1 % {HISTORY_BAND} AND $1
               AND e.task_ids @> ARRAY[$1::bigint] AND u.task_id = $1
             ORDER BY e.id LIMIT 1000"
        ))
        .bind::<BigInt, _>(task_id)
        .load(conn)
        .await
    }
    .instrument(span)
    .await
}
