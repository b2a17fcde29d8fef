//! [`with_lease`]: a future run only while a lease is held (seed 001's `async with`).

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{GuardConfig, LeaseGuard};
use crate::api::Lease;
use crate::lease_client::{LeaseClient, LeaseError};

/// What the work run by [`with_lease`] gets to see of its lease.
#[derive(Debug, Clone)]
pub struct LeaseScope {
    /// The fencing token, to hand to whatever the lease protects.
    pub fence: i64,
    /// The lease when the work started.
    pub lease: Lease,
    /// Cancelled when the lease is lost, for work that wants to notice cooperatively (the
    /// future itself is dropped at that moment anyway).
    pub lost: CancellationToken,
}

/// Runs `work` while holding the lease described by `config`, waiting up to `acquire_timeout`
/// for it. If the lease is lost, `work` is dropped at once (cancelled at its next `.await`) and
/// the result is [`LeaseError::Lost`]; when it finishes, the lease is released.
pub async fn with_lease<F, Fut, T>(
    client: &LeaseClient,
    config: GuardConfig,
    acquire_timeout: Duration,
    work: F,
) -> Result<T, LeaseError>
where
    F: FnOnce(LeaseScope) -> Fut,
    Fut: Future<Output = T>,
{
    let guard = LeaseGuard::acquire_with_timeout(client, config, acquire_timeout).await?;
    let lease = guard.lease();
    let scope = LeaseScope {
        fence: lease.fence,
        lease,
        lost: guard.loss_token(),
    };
    let lost = guard.lost();
    tokio::select! {
        biased;
        why = lost => Err(why.into()),
        output = work(scope) => {
            if let Err(err) = guard.release().await {
                tracing::warn!(error = %err, "could not release the lease after the work finished; it will expire");
            }
            Ok(output)
        }
    }
}
