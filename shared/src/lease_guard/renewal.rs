//! The renewal loop behind a [`LeaseGuard`](super::LeaseGuard): renew on the interval, retry
//! transient failures until the conservative deadline, and report a loss the moment it is
//! certain.

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{LeaseLost, Shared};
use crate::api::{ErrorCode, Lease, Proof, Secret};
use crate::lease_client::{LeaseClient, LeaseError};
use crate::retry::Backoff;

pub(super) fn lease_ttl(lease: &Lease) -> Duration {
    Duration::from_secs(u64::try_from(lease.ttl_seconds).unwrap_or(1).max(1))
}

/// The renewal loop. `sent` is when the request that produced the current lease was sent.
pub(super) async fn keep_renewed(
    client: LeaseClient,
    shared: Arc<Shared>,
    stop: CancellationToken,
    interval: Duration,
    sent: Instant,
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
    let mut next_renewal = sent + interval;
    let mut last_error: Option<String> = None;
    // After a failed renewal, try again soon, but not in a tight loop, and never so late that
    // two tries cannot fit before the deadline.
    let mut retries = Backoff::new(
        Duration::from_millis(50),
        (interval / 4).clamp(Duration::from_millis(50), Duration::from_secs(1)),
    )
    .waits();
    loop {
        let renewal = async {
            tokio::time::sleep_until(next_renewal).await;
            let sent = Instant::now();
            (sent, client.renew(&resource, &holder, proof, None).await)
        };
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = tokio::time::sleep_until(shared.deadline.at()) => {
                shared.lose(LeaseLost::Unconfirmed { last_error });
                return;
            }
            (sent, result) = renewal => match result {
                Ok(mut lease) => {
                    // Renewals do not repeat the secret; keep the acquire's.
                    lease.secret.clone_from(&secret);
                    shared.deadline.confirm(sent, Some(lease_ttl(&lease)));
                    next_renewal = sent + interval;
                    last_error = None;
                    retries.reset();
                    *shared.lease.lock().unwrap_or_else(PoisonError::into_inner) = lease;
                }
                Err(LeaseError::Lost { code, reason }) => {
                    shared.lose(LeaseLost::Refused { code, reason });
                    return;
                }
                Err(err) if err.is_refusal() => {
                    // Held or rejected: the refusal's own code, so the loss says which.
                    let code = match &err {
                        LeaseError::Rejected { code, .. } => code.clone(),
                        _ => ErrorCode::LeaseHeld,
                    };
                    shared.lose(LeaseLost::Refused { code, reason: err.to_string() });
                    return;
                }
                Err(err) => {
                    tracing::warn!(%resource, error = %err, "lease renewal failed; will retry until the deadline");
                    last_error = Some(err.to_string());
                    next_renewal = Instant::now() + retries.next_delay();
                }
            }
        }
    }
}
