//! Get: one lease by id, in any state, as the API shows it. Listing (`GET /api/leases`) is a
//! filter over the repository in `http.rs`; the single read is here because revoke answers with
//! it too, and both must say "not found" the same way.

use diesel_async::AsyncPgConnection;
use leasehold::api::Lease;

use super::to_api;
use crate::error::ApiError;
use crate::repo;

pub async fn get(conn: &mut AsyncPgConnection, id: i64) -> Result<Lease, ApiError> {
    repo::find_by_id(conn, id)
        .await?
        .map(to_api)
        .ok_or_else(|| ApiError::NotFound {
            code: "lease_not_found",
            message: format!("no lease with id {id}"),
        })
}
