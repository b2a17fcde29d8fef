//! Revoke: an operator ends lease `id` whoever holds it, for a holder that is stuck or gone.
//! Unlike a holder's release it needs no proof of holding and names the lease by id, so it is a
//! statement of its own rather than a member of the release group. It answers with the lease as
//! it ends up, so a revoke repeated after its first answer was lost, or of a lease that already
//! ended, succeeds: the outcome the operator asked for holds.

use diesel_async::AsyncPgConnection;
use leasehold::api::Lease;

use super::{get, to_api};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::repo;

/// An operator's release of lease `id`, whoever holds it (`POST /api/leases/{id}/revoke`).
/// Revoking a lease that already ended answers it as it is: the outcome asked for holds.
pub async fn revoke(
    conn: &mut AsyncPgConnection,
    metrics: &Metrics,
    id: i64,
) -> Result<Lease, ApiError> {
    if let Some(row) = repo::revoke(conn, id).await? {
        metrics.releases.inc();
        tracing::warn!(lease.id = id, lease.resource = %row.resource, lease.holder = %row.holder, lease.fence = row.fence, "lease revoked by an operator");
        return Ok(to_api(row));
    }
    get(conn, id).await
}
