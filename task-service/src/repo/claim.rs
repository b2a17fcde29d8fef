//! Claim rounds: the lapsed tasks, the due tasks, recording claims, and postponing a lapse whose
//! lease still lives.

use chrono::{DateTime, Utc};
use diesel::sql_types::{Array, BigInt, Nullable, Text, Timestamptz};
use diesel_async::RunQueryDsl;
use leasehold::api::Secret;
use leasehold::server::db::Cache;
use tracing::Instrument;

use super::{COLUMNS, Db, Result, TaskRow};

/// Keeps a claim off the tasks of paused queues. The paused queues are read once per statement
/// (an init plan), so the claim keeps walking its ordered index; a paused queue's tasks are
/// stepped over, never locked.
const NOT_PAUSED: &str = "AND queue <> ALL (ARRAY(SELECT q.queue FROM queues q WHERE q.paused))";

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
pub async fn take_lapsed(
    conn: &mut Db,
    queue: Option<&str>,
    limit: i64,
    batch_room: i64,
) -> Result<Vec<TaskRow>> {
    let span = leasehold::db_span!("UPDATE", "tasks");
    async move {
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
    .instrument(span)
    .await
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
                    .load(conn)
                    .await
            }
            None => {
                diesel::sql_query(due_sql(false))
                    .bind::<Nullable<Text>, _>(None::<&str>)
                    .bind::<BigInt, _>(limit)
                    .bind::<Array<Text>, _>(full)
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
    format!(
        "SELECT {COLUMNS} FROM tasks
         WHERE status = 'pending' AND scheduled_at <= now() {filter} {NOT_PAUSED}
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
pub async fn mark_claimed(conn: &mut Db, claims: &[Claim<'_>]) -> Result<Vec<TaskRow>> {
    let span = leasehold::db_span!("UPDATE", "tasks");
    span.record("db.operation.batch.size", claims.len());
    async move {
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
    .instrument(span)
    .await
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
