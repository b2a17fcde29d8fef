//! The retention sweeper's deletes: ended leases, and history, past the retention age.

use diesel::result::Error as DieselError;
use diesel::sql_types::BigInt;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use leasehold::server::db::Cache;
use tracing::Instrument;

use super::{Op, span};

/// Deletes a batch of leases that ended more than `$1` seconds ago. The age test is repeated on
/// the target rows (not only in the subquery) so that a row re-acquired while the statement
/// waits for its lock is rechecked on its new version and kept.
const SWEEP: &str = "\
DELETE FROM leases
WHERE id IN (SELECT id FROM leases
             WHERE COALESCE(released_at, expires_at) < now() - make_interval(secs => $1)
             LIMIT $2)
  AND COALESCE(released_at, expires_at) < now() - make_interval(secs => $1)";

/// Deletes up to `batch` leases that ended more than `retention_seconds` ago.
pub async fn sweep(
    conn: &mut AsyncPgConnection,
    retention_seconds: i64,
    batch: i64,
) -> Result<usize, DieselError> {
    diesel::sql_query(SWEEP)
        .bind::<BigInt, _>(retention_seconds)
        .bind::<BigInt, _>(batch)
        .cached()
        .execute(conn)
        .instrument(span(Op::Delete, None))
        .await
}

/// Deletes history older than the retention age, as the rows it describes are.
pub async fn prune_history(
    conn: &mut AsyncPgConnection,
    retention_seconds: i64,
) -> Result<usize, DieselError> {
    diesel::sql_query("DELETE FROM lease_events WHERE at < now() - make_interval(secs => $1)")
        .bind::<diesel::sql_types::Double, _>(retention_seconds as f64)
        .cached()
        .execute(conn)
        .await
}
