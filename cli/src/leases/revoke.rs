//! `leases revoke`: ends a lease whoever holds it.

use crate::api::Api;
use crate::out::Out;

pub(super) async fn revoke(api: &Api, out: &Out, id: i64) -> anyhow::Result<()> {
    let lease = api
        .leases
        .revoke(id)
        .await
        .map_err(api.leases_failed("POST", &format!("/api/leases/{id}/revoke")))?;
    super::print(out, &lease)
}
