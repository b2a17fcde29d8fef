//! An acquire that waits (`POST /api/leases` with `wait_ms`), as etcd's `Lock` blocks: while
//! another holder has the lease, the request is held until the lease is released (the leases
//! table's trigger notifies [`WAKEUP_CHANNEL`]), or expires (the refusal says when, by the
//! database's clock), or the wait ends; then the acquire is tried again. Waiters for one
//! resource are woken one at a time, oldest first, so they get the lease in arrival order unless
//! an acquire that does not wait comes in between. At most `LEASE_MAX_WAITERS` wait on a
//! replica at once; one more answers at once, as if it had not asked to wait.

use std::time::Duration;

use leasehold::ErrorCode;
use leasehold::api::{AcquireLease, MAX_ACQUIRE_WAIT_MS};
use leasehold::server::wakeups::Wakeups;
use tokio::time::Instant;

use super::{AcquireOutcome, Groups};
use crate::error::ApiError;

/// The channel the leases table notifies when a lease is released (key: the resource).
pub const WAKEUP_CHANNEL: &str = "leasehold_leases";

/// How long `request` may wait; bad input is refused before anything is written.
pub fn wait(request: &AcquireLease) -> Result<Duration, ApiError> {
    let wait_ms = request.wait_ms.unwrap_or(0);
    if wait_ms > MAX_ACQUIRE_WAIT_MS {
        return Err(ApiError::invalid(
            ErrorCode::InvalidWait,
            "wait_ms",
            format!("wait_ms must be at most {MAX_ACQUIRE_WAIT_MS}, got {wait_ms}"),
        ));
    }
    Ok(Duration::from_millis(wait_ms))
}

impl Groups {
    /// `POST /api/leases`, waiting up to `wait_ms` for a held lease.
    pub async fn acquire_waiting(
        &self,
        wakeups: &Wakeups,
        request: &AcquireLease,
    ) -> Result<AcquireOutcome, ApiError> {
        let wait = wait(request)?;
        if wait.is_zero() {
            return self.acquire(request).await;
        }
        // Each waiting request holds memory: past the bound, answer as if it had not asked.
        let Some(_admitted) = wakeups.admit() else {
            self.context.metrics.waits_refused.inc();
            return self.acquire(request).await;
        };
        let deadline = Instant::now() + wait;
        loop {
            // In line before trying, so a release meanwhile is not missed.
            let ticket = wakeups.ticket(Some(&request.resource));
            let answer = self.acquire(request).await;
            let now = Instant::now();
            let expires_in = match &answer {
                Err(ApiError::Held { expires_in_ms, .. }) if now < deadline => *expires_in_ms,
                _ => return answer,
            };
            // The holder's lease runs out this long after the database answered: try then (a
            // millisecond late, so that it has), unless news comes first.
            let expiry = now + Duration::from_millis(u64::try_from(expires_in).unwrap_or(0) + 1);
            if !wakeups.wait(ticket, deadline.min(expiry)).await {
                return answer;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn an_acquire_waits_at_most_thirty_seconds() {
        let request = |wait_ms| AcquireLease {
            resource: "r".to_owned(),
            holder: "h".to_owned(),
            ttl_seconds: None,
            secret: None,
            wait_ms,
            metadata: None,
        };
        assert_eq!(wait(&request(None)).unwrap(), Duration::ZERO);
        assert_eq!(
            wait(&request(Some(MAX_ACQUIRE_WAIT_MS))).unwrap(),
            Duration::from_secs(30)
        );
        let err = wait(&request(Some(MAX_ACQUIRE_WAIT_MS + 1))).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidWait);
    }
}
