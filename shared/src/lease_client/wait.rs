//! Acquiring with patience: [`LeaseClient::acquire_with_timeout`] waits in lease-service
//! (`wait_ms`) for a held lease to be released or to expire, for as long as its timeout allows.

use std::time::Duration;

use rand::Rng;

use super::{LeaseClient, LeaseError};
use crate::api::{Lease, MAX_ACQUIRE_WAIT_MS};

impl LeaseClient {
    /// Tries to acquire until it succeeds or `timeout` passes (seed 001's acquire timeout).
    /// Each try waits in lease-service (up to 30 s at a time) for the holder to release or its
    /// lease to expire, so the lease is taken within milliseconds of becoming free. A
    /// lease-service that answers at once (one without `wait_ms`) is asked again with jitter,
    /// at most when the current holder's lease would expire.
    pub async fn acquire_with_timeout(
        &self,
        resource: &str,
        holder: &str,
        ttl: Option<Duration>,
        timeout: Duration,
    ) -> Result<Lease, LeaseError> {
        let started = tokio::time::Instant::now();
        let deadline = started + timeout;
        let mut last_holder = None;
        let mut attempt = 0u32;
        loop {
            attempt = attempt.saturating_add(1);
            let sent = tokio::time::Instant::now();
            let wait = deadline
                .saturating_duration_since(sent)
                .min(Duration::from_millis(MAX_ACQUIRE_WAIT_MS));
            let pause = match self
                .acquire_waiting(resource, holder, ttl, None, wait)
                .await
            {
                Ok((lease, _)) => return Ok(lease),
                Err(LeaseError::Held {
                    holder: current,
                    expires_in,
                    ..
                }) => {
                    last_holder = Some(current);
                    if sent.elapsed() >= wait / 2 {
                        // lease-service waited for us: ask again at once.
                        Duration::ZERO
                    } else {
                        // The database told us how long is left; no host clock is consulted.
                        let until_expiry = expires_in.unwrap_or(Duration::from_millis(500));
                        let jitter = Duration::from_millis(rand::rng().random_range(0..=100));
                        until_expiry.clamp(Duration::from_millis(50), Duration::from_secs(1))
                            + jitter
                    }
                }
                Err(LeaseError::Unavailable(_)) => self.retry.delay(attempt),
                Err(other) => return Err(other),
            };
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Err(LeaseError::AcquireTimeout {
                    resource: resource.to_owned(),
                    waited: now - started,
                    last_holder,
                });
            }
            tokio::time::sleep(pause.min(deadline - now)).await;
        }
    }
}
