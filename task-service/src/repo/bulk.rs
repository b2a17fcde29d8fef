//! Bulk operations by filter: retry, cancel and delete up to a bound of matching tasks in one
//! statement each.

use diesel::pg::Pg;
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::sql_types::{Array, BigInt, Nullable};
use diesel_async::RunQueryDsl;
use tracing::Instrument;

use super::{COLUMNS, Db, Result, TaskFilter, TaskRow, event, history};

/// Which tasks a bulk operation touches: those its [`TaskFilter`] keeps (as a listing with the
/// same filter shows them) and, given `ids`, of those ids; oldest id first, at most `limit`,
/// rows another transaction holds skipped (never waited for).
#[derive(Debug)]
pub struct BulkFilter<'a> {
    pub tasks: TaskFilter<'a>,
    pub ids: Option<&'a [i64]>,
    pub limit: i64,
}

/// The matching tasks' `columns`, locked: the task filter's values, then the ids and the
/// limit.
fn matching(columns: &str) -> String {
    let conditions = TaskFilter::sql(1);
    let [ids, limit] = [0, 1].map(|i| format!("${}", TaskFilter::VALUES + 1 + i));
    format!(
        "SELECT {columns} FROM tasks
         WHERE {conditions} AND ({ids}::bigint[] IS NULL OR id = ANY({ids}))
         ORDER BY id LIMIT {limit}
         FOR UPDATE SKIP LOCKED"
    )
}

/// `sql` (which embeds [`matching`]) with the filter's values bound.
fn bound<'f>(sql: String, filter: &'f BulkFilter<'_>) -> BoxedSqlQuery<'f, Pg, SqlQuery> {
    filter
        .tasks
        .bind(diesel::sql_query(sql).into_boxed::<'f, Pg>())
        .bind::<Nullable<Array<BigInt>>, _>(filter.ids)
        .bind::<BigInt, _>(filter.limit)
}

/// Dead or cancelled tasks back to pending, due now, with all their attempts again (as one
/// operator's retry does).
pub async fn retry_matching(conn: &mut Db, filter: &BulkFilter<'_>) -> Result<Vec<TaskRow>> {
    let span = leasehold::db_span!("UPDATE", "tasks");
    let matching = matching("id, status");
    let query = bound(
        format!(
            "WITH b(before_id, before_status) AS ({matching}),
             moved AS (
                 UPDATE tasks SET status = 'pending', attempts = 0, scheduled_at = now(),
                        processed_at = NULL, must_heartbeat_before = NULL,
                        cancel_requested = false, updated_at = now()
                 FROM b WHERE id = before_id
                 RETURNING {COLUMNS}, {from}
             ), {history}
             SELECT * FROM moved",
            from = event("before_status"),
            history = history("true"),
        ),
        filter,
    );
    async move { query.load(conn).await }.instrument(span).await
}

/// Pending tasks cancelled at once; running ones marked, ended by their worker's next
/// heartbeat (as one cancel does). A running task already marked is not touched again.
pub async fn cancel_matching(conn: &mut Db, filter: &BulkFilter<'_>) -> Result<Vec<TaskRow>> {
    let span = leasehold::db_span!("UPDATE", "tasks");
    let matching = matching("id, status");
    let query = bound(
        format!(
            "WITH b(before_id, before_status) AS ({matching}),
             moved AS (
                 UPDATE tasks SET
                        status = CASE WHEN status = 'pending' THEN 'cancelled' ELSE status END,
                        processed_at = CASE WHEN status = 'pending' THEN now()
                                            ELSE processed_at END,
                        cancel_requested = cancel_requested OR status = 'running',
                        updated_at = now()
                 FROM b WHERE id = before_id AND NOT (status = 'running' AND cancel_requested)
                 RETURNING {COLUMNS}, {from}
             ), {history}
             SELECT * FROM moved",
            from = event("before_status"),
            // A running task is only marked: it has not moved.
            history = history("from_status IS DISTINCT FROM status"),
        ),
        filter,
    );
    async move { query.load(conn).await }.instrument(span).await
}

/// Finished tasks deleted (their history stays until retention prunes it).
pub async fn delete_matching(conn: &mut Db, filter: &BulkFilter<'_>) -> Result<Vec<TaskRow>> {
    let span = leasehold::db_span!("DELETE", "tasks");
    let matching = matching("id");
    let query = bound(
        format!("DELETE FROM tasks WHERE id IN ({matching}) RETURNING {COLUMNS}"),
        filter,
    );
    async move { query.load(conn).await }.instrument(span).await
}
