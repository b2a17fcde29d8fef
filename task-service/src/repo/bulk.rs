//! Bulk operations by filter: retry, cancel and delete up to a bound of matching tasks in one
//! statement each.

use chrono::{DateTime, Utc};
use diesel::pg::Pg;
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::sql_types::{Array, BigInt, Nullable, Text, Timestamptz};
use diesel_async::RunQueryDsl;
use tracing::Instrument;

use super::{COLUMNS, Db, Result, TaskRow};

/// Which tasks a bulk operation touches: every condition given, oldest id first, at most
/// `limit`, rows another transaction holds skipped (never waited for).
#[derive(Debug)]
pub struct BulkFilter<'a> {
    pub statuses: Vec<&'static str>,
    pub queue: Option<&'a str>,
    pub ids: Option<&'a [i64]>,
    pub created_before: Option<DateTime<Utc>>,
    pub limit: i64,
}

/// The matching ids, locked: `$1` statuses, `$2` queue, `$3` ids, `$4` created before, `$5`
/// limit.
const MATCHING: &str = "SELECT id FROM tasks
     WHERE status = ANY($1) AND ($2::text IS NULL OR queue = $2)
       AND ($3::bigint[] IS NULL OR id = ANY($3))
       AND ($4::timestamptz IS NULL OR created_at < $4)
     ORDER BY id LIMIT $5
     FOR UPDATE SKIP LOCKED";

/// `sql` (which embeds [`MATCHING`]) with the filter's values bound.
fn bound<'f>(sql: String, filter: &'f BulkFilter<'_>) -> BoxedSqlQuery<'f, Pg, SqlQuery> {
    diesel::sql_query(sql)
        .into_boxed::<'f, Pg>()
        .bind::<Array<Text>, _>(filter.statuses.clone())
        .bind::<Nullable<Text>, _>(filter.queue)
        .bind::<Nullable<Array<BigInt>>, _>(filter.ids)
        .bind::<Nullable<Timestamptz>, _>(filter.created_before)
        .bind::<BigInt, _>(filter.limit)
}

/// Dead or cancelled tasks back to pending, due now, with all their attempts again (as one
/// operator's retry does).
pub async fn retry_matching(conn: &mut Db, filter: &BulkFilter<'_>) -> Result<Vec<TaskRow>> {
    let span = leasehold::db_span!("UPDATE", "tasks");
    let query = bound(
        format!(
            "UPDATE tasks SET status = 'pending', attempts = 0, scheduled_at = now(),
             processed_at = NULL, must_heartbeat_before = NULL, cancel_requested = false,
             updated_at = now()
         WHERE id IN ({MATCHING})
         RETURNING {COLUMNS}"
        ),
        filter,
    );
    async move { query.load(conn).await }.instrument(span).await
}

/// Pending tasks cancelled at once; running ones marked, ended by their worker's next
/// heartbeat (as one cancel does). A running task already marked is not touched again.
pub async fn cancel_matching(conn: &mut Db, filter: &BulkFilter<'_>) -> Result<Vec<TaskRow>> {
    let span = leasehold::db_span!("UPDATE", "tasks");
    let query = bound(
        format!(
            "UPDATE tasks SET
             status = CASE WHEN status = 'pending' THEN 'cancelled' ELSE status END,
             processed_at = CASE WHEN status = 'pending' THEN now() ELSE processed_at END,
             cancel_requested = cancel_requested OR status = 'running',
             updated_at = now()
         WHERE id IN ({MATCHING}) AND NOT (status = 'running' AND cancel_requested)
         RETURNING {COLUMNS}"
        ),
        filter,
    );
    async move { query.load(conn).await }.instrument(span).await
}

/// Finished tasks deleted (their history stays until retention prunes it).
pub async fn delete_matching(conn: &mut Db, filter: &BulkFilter<'_>) -> Result<Vec<TaskRow>> {
    let span = leasehold::db_span!("DELETE", "tasks");
    let query = bound(
        format!("DELETE FROM tasks WHERE id IN ({MATCHING}) RETURNING {COLUMNS}"),
        filter,
    );
    async move { query.load(conn).await }.instrument(span).await
}
