//! Retention: the sweeper's deletes of old finished tasks and their history.

use diesel::sql_types::{BigInt, Double};
use diesel_async::RunQueryDsl;
use tracing::Instrument;

use super::{Db, Result};

/// Deletes up to `batch` finished tasks that finished more than `retention_seconds` ago.
pub async fn sweep(conn: &mut Db, retention_seconds: i64, batch: i64) -> Result<usize> {
    let span = leasehold::db_span!("DELETE", "tasks");
    async move {
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
    .instrument(span)
    .await
}

/// Deletes history older than the retention age, as the rows it describes are.
pub async fn prune_history(conn: &mut Db, retention_seconds: i64) -> Result<usize> {
    diesel::sql_query("DELETE FROM task_events WHERE at < now() - make_interval(secs => $1)")
        .bind::<diesel::sql_types::Double, _>(retention_seconds as f64)
        .execute(conn)
        .await
}
