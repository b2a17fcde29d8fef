//! Whether lease-service accepts task-service's lease TTL. The TTL is task-service's setting but
//! lease-service's bounds judge it, and a refused TTL refuses every claim's lease, which would
//! otherwise look like an empty queue. So the verdict is remembered where both the claim round
//! and `/readyz` see it: a refusal turns claims into a 503 that names the setting, and fails
//! readiness, until a claim or a probe sees the TTL accepted.

use leasehold::ErrorCode;
use leasehold::LeaseError;
use leasehold::server::ApiError;

use crate::context::Context;

/// Whether lease-service accepts task-service's lease TTL, for `/readyz`: once a claim or this
/// probe has seen it accepted, no call is made; otherwise a lease is taken with that TTL on a
/// resource of its own and released in the background (a refused TTL writes nothing in
/// lease-service).
/// When lease-service cannot be asked, this says nothing: its health check reports that.
pub async fn check_lease_ttl(engine: &Context) -> Result<(), ApiError> {
    if engine.lease_ttl_verdict.get() == Some(Ok(())) {
        return Ok(());
    }
    let probe: u64 = rand::random();
    let resource = format!("leasehold:task-lease-ttl-probe:{probe:016x}");
    let holder = format!("task-service-probe-{probe:016x}");
    match engine
        .leases
        .acquire(&resource, &holder, Some(engine.lease_ttl))
        .await
    {
        Ok(lease) => {
            engine.lease_ttl_verdict.accept();
            // The verdict is in: the answer (a readiness probe's, on a short budget) does not
            // wait for the release, which nothing depends on.
            let leases = engine.leases.clone();
            tokio::spawn(async move {
                if let Err(err) = leases.release(&resource, &holder, lease.proof()).await {
                    tracing::debug!(error = %err, "TTL probe lease not released; it will expire");
                }
            });
            Ok(())
        }
        Err(LeaseError::Rejected {
            code: ErrorCode::InvalidTtl,
            error,
            ..
        }) => Err(engine.lease_ttl_verdict.reject(engine.lease_ttl, &error)),
        Err(err) => {
            tracing::debug!(error = %err, "could not probe the task lease TTL");
            Ok(())
        }
    }
}
