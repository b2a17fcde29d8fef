//! Transitions of claimed tasks: locking them, heartbeats, completion, the final states, retries,
//! cancellation and requeueing a dead task.

use chrono::{DateTime, Utc};
use diesel::sql_types::{Array, BigInt, Bool, Double, Jsonb, Nullable, Text, Timestamptz};
use diesel::{OptionalExtension, QueryableByName};
use diesel_async::RunQueryDsl;
use leasehold::server::db::{Cache, OneRow};
use leasehold::tasks::TaskStatus;
use tracing::Instrument;

use super::{COLUMNS, Db, Result, TaskRow, before, event, history};

/// The task, locked for the rest of the transaction.
pub async fn lock(conn: &mut Db, id: i64) -> Result<Option<TaskRow>> {
    let span = leasehold::db_span!("SELECT", "tasks");
    async move {
        diesel::sql_query(format!(
            "SELECT {COLUMNS} FROM tasks WHERE id = $1 FOR UPDATE"
        ))
        .bind::<BigInt, _>(id)
        .cached()
        .get_one(conn)
        .await
        .optional()
    }
    .instrument(span)
    .await
}

/// The tasks among `ids`, locked in id order (so that two batches cannot deadlock).
///
/// Kept prepared: it runs only in [`super::in_index_order`]'s transactions (claim groups, and
/// completion groups on their generic plans), whose kept plans walk indexes however the table
/// has grown.
pub async fn lock_many(conn: &mut Db, ids: &[i64]) -> Result<Vec<TaskRow>> {
    let span = leasehold::db_span!("SELECT", "tasks");
    async move {
        diesel::sql_query(format!(
            "SELECT {COLUMNS} FROM tasks WHERE id = ANY($1) ORDER BY id FOR UPDATE"
        ))
        .bind::<Array<BigInt>, _>(ids)
        .cached()
        .load(conn)
        .await
    }
    .instrument(span)
    .await
}

/// Records a heartbeat: the claim lives until `expiry` (its own lease's), or, for a claim under
/// a shared lease, for `hint` from now.
pub async fn record_heartbeat(
    conn: &mut Db,
    id: i64,
    expiry: Option<DateTime<Utc>>,
    hint: std::time::Duration,
) -> Result<TaskRow> {
    let span = leasehold::db_span!("UPDATE", "tasks");
    async move {
        diesel::sql_query(format!(
            "UPDATE tasks SET last_heartbeat_at = now(),
                must_heartbeat_before = coalesce($2, now() + make_interval(secs => $3)),
                updated_at = now()
         WHERE id = $1
         RETURNING {COLUMNS}"
        ))
        .bind::<BigInt, _>(id)
        .bind::<Nullable<Timestamptz>, _>(expiry)
        .bind::<Double, _>(hint.as_secs_f64())
        .cached()
        .get_one(conn)
        .await
    }
    .instrument(span)
    .await
}

/// Marks running tasks succeeded with their outputs, in one statement; each row comes back with
/// the seconds from its claim to its completion, in no particular order. A completion is only
/// ever of a running task (its caller checked the locked row), so the history's `from_status`
/// needs no look at the rows before the update.
///
/// Kept prepared, as [`lock_many`] is and for the same reason.
pub async fn mark_succeeded_many(
    conn: &mut Db,
    done: &[(i64, &serde_json::Value)],
) -> Result<Vec<(TaskRow, f64)>> {
    let span = leasehold::db_span!("UPDATE", "tasks");
    span.record("db.operation.batch.size", done.len());
    async move {
        let ids: Vec<i64> = done.iter().map(|(id, _)| *id).collect();
        let outputs: Vec<&serde_json::Value> = done.iter().map(|(_, output)| *output).collect();
        let rows: Vec<Completed> = diesel::sql_query(succeeded_sql(
            "unnest($1::bigint[], $2::jsonb[]) AS c(done_id, done_output)",
            // Found by id only: a plan kept from a tiny table that reached them through the
            // running tasks' index (which `status = 'running'` here would allow) read every
            // running task once the table had grown (`query_plans`). The caller holds the rows
            // locked, and found them running.
            "id = c.done_id AND id = ANY($1::bigint[])",
        ))
        .bind::<Array<BigInt>, _>(&ids)
        .bind::<Array<Jsonb>, _>(&outputs)
        .cached()
        .load(conn)
        .await?;
        Ok(rows.into_iter().map(|row| (row.task, row.took)).collect())
    }
    .instrument(span)
    .await
}

/// A completion whose claimant's shared lease was already proven held: it may end its task
/// only if the task is still that claimant's, under that lease.
#[derive(Debug)]
pub struct Covered<'a> {
    pub id: i64,
    pub output: &'a serde_json::Value,
    pub processor: &'a str,
    /// The task's fence, when the completion names it.
    pub fence: Option<i64>,
    pub lease_resource: &'a str,
    pub lease_fence: i64,
}

/// Marks succeeded, in one statement and without locking them first, the tasks of `done` that
/// are running, not asked to cancel, claimed by the completion's processor (under its fence, if
/// named) and covered by the lease it names; the rest are left as they were, for the caller to
/// judge one by one. What [`lock_many`] and [`mark_succeeded_many`] do in two round trips, when
/// the ownership check needs nothing but the row: the update's own row lock, with the row
/// re-read should another transaction change it first, makes the check and the write one.
///
/// Kept prepared: it runs only in claim groups, in [`super::in_index_order`]'s transactions.
pub async fn mark_succeeded_covered(
    conn: &mut Db,
    done: &[Covered<'_>],
) -> Result<Vec<(TaskRow, f64)>> {
    let span = leasehold::db_span!("UPDATE", "tasks");
    span.record("db.operation.batch.size", done.len());
    async move {
        let ids: Vec<i64> = done.iter().map(|c| c.id).collect();
        let outputs: Vec<&serde_json::Value> = done.iter().map(|c| c.output).collect();
        let processors: Vec<&str> = done.iter().map(|c| c.processor).collect();
        let fences: Vec<Option<i64>> = done.iter().map(|c| c.fence).collect();
        let resources: Vec<&str> = done.iter().map(|c| c.lease_resource).collect();
        let lease_fences: Vec<i64> = done.iter().map(|c| c.lease_fence).collect();
        // The rows are locked, and judged, in the sub-select, in the order of their ids (as
        // every statement that locks several tasks without skipping does, so that two never
        // wait for each other), read from the primary key's index with no sort (claim groups
        // switch sorting off); a row another transaction changed meanwhile is judged as it is
        // after that change. Both parts find rows only by id: planned once and kept, as a claim
        // group's statements are, a plan that walked an index of all running tasks would read
        // every one of them on each call.
        let rows: Vec<Completed> = diesel::sql_query(succeeded_sql(
            "(SELECT c.* FROM tasks AS locked
                   JOIN unnest($1::bigint[], $2::jsonb[], $3::text[], $4::bigint[], $5::text[],
                               $6::bigint[])
                        AS c(done_id, done_output, done_processor, done_fence, done_resource,
                             done_lease_fence)
                     ON c.done_id = locked.id
                   WHERE locked.id = ANY($1::bigint[]) AND locked.status = 'running'
                     AND locked.processor = c.done_processor
                     AND (c.done_fence IS NULL OR locked.fence = c.done_fence)
                     AND locked.lease_resource = c.done_resource
                     AND locked.lease_fence = c.done_lease_fence
                     AND NOT locked.cancel_requested
                   ORDER BY locked.id FOR UPDATE OF locked) AS c",
            "id = c.done_id AND id = ANY($1::bigint[])",
        ))
        .bind::<Array<BigInt>, _>(&ids)
        .bind::<Array<Jsonb>, _>(&outputs)
        .bind::<Array<Text>, _>(&processors)
        .bind::<Array<Nullable<BigInt>>, _>(&fences)
        .bind::<Array<Text>, _>(&resources)
        .bind::<Array<BigInt>, _>(&lease_fences)
        .cached()
        .load(conn)
        .await?;
        Ok(rows.into_iter().map(|row| (row.task, row.took)).collect())
    }
    .instrument(span)
    .await
}

#[derive(QueryableByName)]
struct Completed {
    #[diesel(embed)]
    task: TaskRow,
    #[diesel(sql_type = Double)]
    took: f64,
}

/// The completion statement over the rows of `input` (`c`, with `done_id` and `done_output`),
/// updating the tasks that meet `filter` (running ones only), with the history of the
/// transition.
fn succeeded_sql(input: &str, filter: &str) -> String {
    format!(
        "WITH moved AS (
             UPDATE tasks SET status = 'succeeded', processed_at = now(),
                    last_heartbeat_at = now(), task_output = c.done_output, updated_at = now()
             FROM {input}
             WHERE {filter}
             RETURNING {COLUMNS}, {from},
                       COALESCE(EXTRACT(EPOCH FROM now() - started_at), 0)::float8 AS took
         ), {history}
         SELECT * FROM moved",
        from = event("'running'"),
        history = history("true"),
    )
}

/// Ends the task in `status` (`dead` or `cancelled`), recording `error` when given.
pub async fn mark_final(
    conn: &mut Db,
    id: i64,
    status: TaskStatus,
    error: Option<&str>,
) -> Result<TaskRow> {
    let span = leasehold::db_span!("UPDATE", "tasks");
    async move {
        diesel::sql_query(format!(
            "WITH moved AS (
                 UPDATE tasks SET status = $2, processed_at = now(),
                        last_error = COALESCE($3, last_error), updated_at = now()
                 FROM {BEFORE}
                 WHERE id = $1 AND before_id = id
                 RETURNING {COLUMNS}, {from}
             ), {history}
             SELECT * FROM moved",
            BEFORE = before("id = $1"),
            from = event("before_status"),
            history = history("true"),
        ))
        .bind::<BigInt, _>(id)
        .bind::<Text, _>(status.as_str())
        .bind::<Nullable<Text>, _>(error)
        .cached()
        .get_one(conn)
        .await
    }
    .instrument(span)
    .await
}

/// Back to pending, due in `delay_seconds`, recording `error` (a snooze records none and keeps
/// the last). `refund_attempt` hands the claim's attempt back.
pub async fn mark_retry(
    conn: &mut Db,
    id: i64,
    error: Option<&str>,
    delay_seconds: f64,
    refund_attempt: bool,
) -> Result<TaskRow> {
    let span = leasehold::db_span!("UPDATE", "tasks");
    async move {
        diesel::sql_query(format!(
            "WITH moved AS (
                 UPDATE tasks SET status = 'pending', processor = NULL,
                        scheduled_at = now() + make_interval(secs => $3),
                        attempts = CASE WHEN $4 THEN greatest(attempts - 1, 0) ELSE attempts END,
                        last_error = coalesce($2, last_error), must_heartbeat_before = NULL,
                        updated_at = now()
                 FROM {BEFORE}
                 WHERE id = $1 AND before_id = id
                 RETURNING {COLUMNS}, before_status AS from_status, now() AS event_at,
                           NOT $4 AS charged, NULL::float8 AS pickup_ms
             ), {history}
             SELECT * FROM moved",
            BEFORE = before("id = $1"),
            history = history("true"),
        ))
        .bind::<BigInt, _>(id)
        .bind::<Nullable<Text>, _>(error)
        .bind::<Double, _>(delay_seconds)
        .bind::<Bool, _>(refund_attempt)
        .cached()
        .get_one(conn)
        .await
    }
    .instrument(span)
    .await
}

pub async fn request_cancel(conn: &mut Db, id: i64) -> Result<TaskRow> {
    let span = leasehold::db_span!("UPDATE", "tasks");
    async move {
        diesel::sql_query(format!(
            "UPDATE tasks SET cancel_requested = true, updated_at = now() WHERE id = $1
         RETURNING {COLUMNS}"
        ))
        .bind::<BigInt, _>(id)
        .cached()
        .get_one(conn)
        .await
    }
    .instrument(span)
    .await
}

/// Puts a dead task back in its queue: due now, with all its attempts again. Its history
/// (processor, fence, last error) stays until a new claim replaces it.
pub async fn requeue_dead(conn: &mut Db, id: i64) -> Result<TaskRow> {
    let span = leasehold::db_span!("UPDATE", "tasks");
    async move {
        diesel::sql_query(format!(
            "WITH moved AS (
                 UPDATE tasks SET status = 'pending', attempts = 0, scheduled_at = now(),
                        processed_at = NULL, must_heartbeat_before = NULL,
                        cancel_requested = false, updated_at = now()
                 FROM {BEFORE}
                 WHERE id = $1 AND before_id = id
                 RETURNING {COLUMNS}, {from}
             ), {history}
             SELECT * FROM moved",
            BEFORE = before("id = $1"),
            from = event("before_status"),
            history = history("true"),
        ))
        .bind::<BigInt, _>(id)
        .cached()
        .get_one(conn)
        .await
    }
    .instrument(span)
    .await
}
