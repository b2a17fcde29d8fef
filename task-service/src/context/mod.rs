//! task-service's context: what its rules (`tasks/`, `schedules/`, the generator, the worker
//! registry, the background jobs) need besides a database connection, built once by `lib.rs`.
//! One floor below the rules: it imports none of them, so each rule reaches down to it and
//! nothing reaches back up.

mod ttl_verdict;
mod unlimited;

use std::time::Duration;

use leasehold::api::Proof;
use leasehold::server::wakeups::Wakeups;
use leasehold::{Backoff, LeaseClient, RetryPolicy};

use crate::metrics::Metrics;
use crate::repo::TaskRow;
pub use ttl_verdict::TtlVerdict;
pub use unlimited::Unlimited;

/// What task-service's rules need besides a connection: its one lease-service client and the
/// settings and state every replica keeps (metrics, waiting claims, what lease-service said of
/// the TTL, the queues known unlimited).
#[derive(Debug, Clone)]
pub struct Context {
    /// task-service's one client of lease-service: short timeout, no retries, since most calls
    /// are made while task rows are locked; [`Context::leases_retrying`] is the same client for
    /// calls nothing is locked for.
    pub leases: LeaseClient,
    pub lease_ttl: Duration,
    pub lease_prefix: String,
    /// The generator's lease resource: a create naming a `generator_fence` is checked against it.
    pub generator_resource: String,
    pub default_max_attempts: i32,
    /// How long a failed task waits before its next attempt, counted by its attempts.
    pub retry: Backoff,
    pub metrics: Metrics,
    /// Whether lease-service accepts [`Context::lease_ttl`].
    pub lease_ttl_verdict: TtlVerdict,
    /// The claims waiting for work on this replica.
    pub wakeups: Wakeups,
    /// Wakes this replica's schedule ticker when a rule here changed a schedule.
    pub schedules_changed: std::sync::Arc<tokio::sync::Notify>,
    /// The queues this replica's claims last found without limits.
    pub unlimited: Unlimited,
}

impl Context {
    pub(crate) fn resource(&self, id: i64) -> String {
        format!("{}{id}", self.lease_prefix)
    }

    /// The wait, in seconds, before the next attempt of a task that failed `attempts` times.
    pub fn retry_delay(&self, attempts: i32) -> f64 {
        let attempts = u32::try_from(attempts).unwrap_or(0);
        self.retry.delay(attempts).as_secs_f64()
    }

    /// The lease-service client, retrying transient failures: for calls made while no task row
    /// is locked (releases after commit, the generator's lease, the sweeper's singleton).
    pub fn leases_retrying(&self) -> LeaseClient {
        self.leases.clone().with_retry(RetryPolicy::default())
    }

    /// Releases the task's own lease after the transaction that ended it committed (a shared
    /// lease, its worker process's, is the process's to end). A failure only means the lease
    /// runs out by itself.
    pub(crate) async fn release_own_after_commit(&self, row: &TaskRow, processor: &str) {
        if row.shared_lease().is_none() {
            self.release_after_commit(row.id, processor, row.lease_proof())
                .await;
        }
    }

    /// Releases a lease after the transaction that ended its task committed. A failure only
    /// means the lease runs out by itself.
    pub(crate) async fn release_after_commit(&self, id: i64, processor: &str, proof: Proof<'_>) {
        if let Err(err) = self
            .leases_retrying()
            .release(&self.resource(id), processor, proof)
            .await
        {
            tracing::debug!(task = id, error = %err, "lease release after commit failed; it will expire");
        }
    }
}
