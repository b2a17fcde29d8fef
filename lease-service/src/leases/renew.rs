//! Renew: the holder pushes its lease's expiry out, optionally with a new TTL, to keep working
//! past the TTL it asked for. Names, the TTL's bounds and the secret (when required) are checked
//! before the request joins a group, so bad input never reaches the database and never fails the
//! other members. The statement renews only a live lease whose holder, fence and secret match; it
//! can say only that nothing matched, so a renewal it did not change is judged afterwards
//! against the lease as it now is (see `refusal`).

use leasehold::api::{Lease, RenewLease};
use leasehold::server::coalesce::Coalescer;
use leasehold::server::validate_name;

use super::context::{GroupContext, group_failed};
use super::refusal::refusal;
use super::{leases_left, to_api};
use crate::db;
use crate::error::ApiError;
use crate::repo::{self, Renewal};

/// `PUT /api/leases/renew`.
pub(super) async fn renew(
    renewals: &Coalescer<(), Renewal, Result<Lease, ApiError>>,
    context: &GroupContext,
    request: &RenewLease,
) -> Result<Lease, ApiError> {
    validate_name("resource", &request.resource)?;
    validate_name("holder", &request.holder)?;
    super::check_metadata(request.metadata.as_ref())?;
    let renewal = Renewal {
        resource: request.resource.clone(),
        holder: request.holder.clone(),
        fence: request.fence,
        secret_hash: context.secrets.presented(request.secret.as_ref())?,
        ttl_seconds: request
            .ttl_seconds
            .map(|seconds| context.ttl.resolve(Some(seconds)))
            .transpose()?,
        metadata: request.metadata.clone(),
    };
    renewals
        .submit((), renewal)
        .await
        .unwrap_or_else(group_failed)
}

pub(super) async fn renew_group(
    context: GroupContext,
    items: Vec<Renewal>,
) -> Result<Vec<Result<Lease, ApiError>>, ApiError> {
    let mut conn = db::connection(&context.pool).await?;
    let renewed = repo::renew_each(&mut conn, &items).await?;
    // A failure of this read fails only the renewals it was for.
    let mut current = leases_left(&mut conn, &items, &renewed).await;
    let metrics = &context.metrics;
    Ok(items
        .iter()
        .zip(renewed)
        .map(|(item, renewed)| {
            if let Some(row) = renewed {
                metrics.renewals.inc();
                return Ok(to_api(row));
            }
            let current = match &mut current {
                Ok(current) => current.remove(&item.resource),
                Err(err) => return Err(err.clone()),
            };
            let refusal = refusal("renew", current, &item.holder, item.fence, item.secret_hash);
            metrics
                .conflicts
                .with_label_values(&["renew", refusal.code().as_str()])
                .inc();
            Err(refusal)
        })
        .collect())
}
