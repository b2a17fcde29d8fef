//! `leases show`: one lease by id.

use serde_json::json;

use crate::api::Api;
use crate::out::{Out, lease_table};

pub(super) async fn show(api: &Api, out: &Out, id: i64) -> anyhow::Result<()> {
    let lease = api
        .leases
        .lease(id)
        .await
        .map_err(api.leases_failed("GET", &format!("/api/leases/{id}")))?;
    // The service's answer, which names the lease.
    out.value(&json!({ "lease": lease }), |_| {
        Ok(lease_table(std::slice::from_ref(&lease), out.view()))
    })
}
