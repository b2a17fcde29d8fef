//! Groups: concurrent single acquires, renewals and releases are served together, one statement
//! and one commit per group, so that under load the database does one round trip for many
//! requests instead of one each, and each member still gets the answer it would have got alone.
//! Every operation's coalescer (from `leasehold::server::coalesce`) is built here the same way, so
//! grouping is wired once; the operation modules supply only what a group does (`acquire_group`,
//! `renew_group`, `release_group`). A group names each resource once because one `UPDATE` may
//! touch a row only once, and a failure of the group as a whole is every member's answer because
//! no member's statement ran alone.

use std::future::Future;

use leasehold::api::{AcquireLease, Lease, MAX_BATCH_RESOURCES, ReleaseLease, RenewLease};
use leasehold::server::coalesce::{self, Coalescer, distinct_prefix};
use leasehold::server::db::Contended;

use super::acquire::{self, Acquisition, acquire_group};
use super::context::GroupContext;
use super::release::{self, release_group};
use super::renew::{self, renew_group};
use super::{AcquireOutcome, OnResource, SecretPolicy, TtlPolicy};
use crate::db::DbPool;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::repo::{Release, Renewal};

/// Serves single acquires, renewals and releases: those that arrive while a statement of their
/// kind is in flight go together as the next one (see [`leasehold::server::coalesce`]), one
/// statement and one commit for the group, and each gets the answer it would have got alone.
/// A group names each resource once; a second request for a resource waits for the next group.
/// An acquire that presents a secret (a reentrant acquire proving it holds) runs alone.
#[derive(Clone)]
pub struct Groups {
    pub(super) context: GroupContext,
    pub(super) acquires: Coalescer<(), Acquisition, Result<AcquireOutcome, ApiError>>,
    pub(super) renewals: Coalescer<(), Renewal, Result<Lease, ApiError>>,
    pub(super) releases: Coalescer<(), Release, Result<Lease, ApiError>>,
}

impl std::fmt::Debug for Groups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Groups").finish_non_exhaustive()
    }
}

impl Groups {
    /// Up to `in_flight` statements of each kind at once, each on a connection of its own from
    /// `pool`.
    pub fn new(
        pool: DbPool,
        ttl: TtlPolicy,
        secrets: SecretPolicy,
        metrics: Metrics,
        in_flight: usize,
    ) -> Groups {
        let context = GroupContext {
            pool,
            ttl,
            secrets,
            metrics,
        };
        Groups {
            acquires: grouped(&context, "acquire", in_flight, acquire_group),
            renewals: grouped(&context, "renew", in_flight, renew_group),
            releases: grouped(&context, "release", in_flight, release_group),
            context,
        }
    }
}

impl Groups {
    /// `POST /api/leases` (see [`super::acquire`]).
    pub async fn acquire(&self, request: &AcquireLease) -> Result<AcquireOutcome, ApiError> {
        acquire::acquire(&self.acquires, &self.context, request).await
    }

    /// `PUT /api/leases/renew` (see [`super::renew`]).
    pub async fn renew(&self, request: &RenewLease) -> Result<Lease, ApiError> {
        renew::renew(&self.renewals, &self.context, request).await
    }

    /// `DELETE /api/leases/release`, and `DELETE /api/leases/{id}` with `id` (see
    /// [`super::release`]).
    pub async fn release(
        &self,
        request: &ReleaseLease,
        id: Option<i64>,
    ) -> Result<Lease, ApiError> {
        release::release(&self.releases, &self.context, request, id).await
    }
}

/// The next group: the waiting requests up to the first that names a resource again (one
/// statement may touch a row only once), a batch's worth at most.
fn one_per_resource<I: OnResource>(waiting: &[I]) -> usize {
    distinct_prefix(waiting.iter().map(I::resource), MAX_BATCH_RESOURCES)
}

/// A coalescer of `operation`'s requests whose groups run `serve`; a failure of the group as a
/// whole (no connection, a database error) is every member's answer, but a group that lost to
/// contention (a deadlock with another group's statement) runs again first.
fn grouped<I, T, F, Fut>(
    context: &GroupContext,
    operation: &'static str,
    in_flight: usize,
    serve: F,
) -> Coalescer<(), I, Result<T, ApiError>>
where
    I: OnResource + Clone + Send + Sync + 'static,
    T: Send + 'static,
    F: Fn(GroupContext, Vec<I>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<Result<T, ApiError>>, ApiError>> + Send + 'static,
{
    let context = context.clone();
    coalesce::grouped(
        in_flight,
        one_per_resource::<I>,
        move |(), items: Vec<I>| {
            context
                .metrics
                .group_sizes
                .with_label_values(&[operation])
                .observe(items.len() as f64);
            let (context, serve) = (context.clone(), serve.clone());
            async move {
                let mut retry = Contended::default();
                loop {
                    let outcome = serve(context.clone(), items.clone()).await;
                    if !retry.again(&outcome).await {
                        return outcome;
                    }
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(resource: &str) -> Release {
        Release {
            resource: resource.to_owned(),
            holder: "h".to_owned(),
            fence: None,
            secret_hash: None,
            id: None,
        }
    }

    #[test]
    fn a_group_ends_before_a_resource_named_again_and_at_a_batch() {
        let waiting: Vec<Release> = ["a", "b", "a", "c"].into_iter().map(release).collect();
        assert_eq!(one_per_resource(&waiting), 2);
        let many: Vec<Release> = (0..MAX_BATCH_RESOURCES + 5)
            .map(|i| release(&format!("r{i}")))
            .collect();
        assert_eq!(one_per_resource(&many), MAX_BATCH_RESOURCES);
    }
}
