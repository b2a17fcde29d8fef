//! The renewal behind a [`LeaseGuard`](super::LeaseGuard): the one keep-alive loop
//! ([`crate::keep_confirmed`]) with lease-service's renewal as its call. What is the guard's own
//! here: its retry pace, which answers are a loss, and what a renewal leaves in the shared lease.

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{LeaseLost, Shared};
use crate::api::{ErrorCode, Lease, Proof, Secret};
use crate::keep_confirmed::{Confirmation, Ended, keep_confirmed};
use crate::lease_client::{LeaseClient, LeaseError};
use crate::retry::Backoff;

pub(super) fn lease_ttl(lease: &Lease) -> Duration {
    Duration::from_secs(u64::try_from(lease.ttl_seconds).unwrap_or(1).max(1))
}

/// Renews the lease every `interval`, counted from the send instant of the request that
/// produced it, until `stop` or its loss.
pub(super) async fn keep_renewed(
    client: LeaseClient,
    shared: Arc<Shared>,
    stop: CancellationToken,
    interval: Duration,
) {
    let Lease {
        resource,
        holder,
        fence,
        secret,
        ..
    } = shared.lease();
    let proof = Proof {
        fence: Some(fence),
        secret: secret.as_ref().map(Secret::expose),
    };
    // After a failed renewal, try again soon, but not in a tight loop, and never so late that
    // two tries cannot fit before the deadline.
    let retries = Backoff::new(
        Duration::from_millis(50),
        (interval / 4).clamp(Duration::from_millis(50), Duration::from_secs(1)),
    );
    let (client, resource, holder, secret, lease) =
        (&client, &resource, &holder, &secret, &shared.lease);
    let renew = move || async move {
        match client.renew(resource, holder, proof, None).await {
            Ok(mut renewed) => {
                // Renewals do not repeat the secret; keep the acquire's.
                renewed.secret.clone_from(secret);
                let ttl = lease_ttl(&renewed);
                *lease.lock().unwrap_or_else(PoisonError::into_inner) = renewed;
                Confirmation::Confirmed { ttl: Some(ttl) }
            }
            Err(LeaseError::Lost { code, reason }) => {
                Confirmation::Lost(LeaseLost::Refused { code, reason })
            }
            Err(err) if err.is_refusal() => {
                // Held or rejected: the refusal's own code, so the loss says which.
                let code = match &err {
                    LeaseError::Rejected { code, .. } => code.clone(),
                    _ => ErrorCode::LeaseHeld,
                };
                Confirmation::Lost(LeaseLost::Refused {
                    code,
                    reason: err.to_string(),
                })
            }
            Err(err) => {
                tracing::warn!(%resource, error = %err, "lease renewal failed; will retry until the deadline");
                Confirmation::Failed(err.to_string())
            }
        }
    };
    match keep_confirmed(&shared.deadline, interval, retries, &stop, renew).await {
        Ended::Stopped => {}
        Ended::Lost(lost) => shared.lose(lost),
        Ended::Unconfirmed { last_error } => shared.lose(LeaseLost::Unconfirmed { last_error }),
    }
}
