//! The task rules: creating, claiming, heartbeating, completing, failing and cancelling.
//!
//! Every transition locks the task's row, checks who may make it, and—where a worker is
//! involved—asks lease-service, which has the final word on ownership: a claim acquires the
//! task's lease (only a *new* acquisition counts), a heartbeat renews it with the claim's fence,
//! and a completion or failure releases it with that fence. Release doubles as the ownership
//! proof at the end of the work: it succeeds only for the current holder with the current fence,
//! and, retried after a lost answer, succeeds again, so a worker can safely retry `complete`.
//!
//! # Layout
//!
//! One module per operation, as in mini-redis's `src/cmd/`, so that a change to one rule lands
//! in the file that holds it and nowhere else:
//!
//! * `create`: `POST /api/tasks`, idempotent repeats, and the generator's fence;
//! * `create_many`: `POST /api/tasks/batch`, many creates in one statement and one commit;
//! * `validate`: the limits and the checks of what a request may store;
//! * `next`: one claim request, answered at once or after waiting for work (`wait_ms`);
//! * `claim`: claim requests, gathered by queue into one transaction and one lease batch;
//! * `limits`: the queues' concurrency limits, judged in the claim's transaction;
//! * `complete`: completions, single or batched, judged in groups;
//! * `complete_then_claim`: completions that ask for the next tasks, in one request and one
//!   transaction with the claim;
//! * `cover`: the lease that covers a claim (the task's own, or its worker process's), and its
//!   check;
//! * `groups`: how claims and completions are gathered into groups (built once, the same way);
//! * `transition`: heartbeat, fail, retry and cancel, and the ownership check they share;
//! * `read`: one task, its history, listings, counts, gauges and the dashboard's overview;
//! * `ready`: whether this replica can serve (`/readyz`);
//! * `refusal`: the errors several operations answer with;
//! * `ttl`: whether lease-service accepts the task lease TTL (for `/readyz` and claims).
//!
//! This module keeps what every operation shares: the [`Engine`], how a transition ends, the
//! row lookups, and the mapping of a row to the API's [`Task`].

mod bulk;
mod cancel;
mod claim;
mod complete;
mod complete_then_claim;
mod cover;
mod create;
pub mod create_many;
mod fail;
mod groups;
mod heartbeat;
mod limits;
mod next;
mod owner;
pub mod read;
mod ready;
mod refusal;
mod retry;
mod snooze;
mod ttl;
mod validate;

use std::time::Duration;

use leasehold::api::Proof;
use leasehold::server::ApiError;
use leasehold::tasks::Task;
use leasehold::{Backoff, LeaseClient, RetryPolicy};

use crate::metrics::Metrics;
use crate::repo::{self, Db, TaskRow};
use leasehold::server::wakeups::Wakeups;

pub use bulk::{cancel_many, delete_many, retry_many};
pub use cancel::cancel;
pub use claim::{Claimed, Want, claim_group, claims_per_group, end_cancelled};
pub use complete::{Completion, complete, complete_group, complete_many, completions_per_group};
pub use complete_then_claim::complete_then_claim;
pub use create::{Created, create};
pub use create_many::create_many;
pub use fail::fail;
pub use groups::{ClaimGroups, CompletionGroups, claim_groups, completion_groups};
pub use heartbeat::heartbeat;
pub use limits::Unlimited;
pub use next::{WAKEUP_CHANNEL, claim, want};
pub use read::{counts, events, get, overview};
pub use ready::ready;
pub use retry::retry;
pub use snooze::snooze;
pub use ttl::{TtlVerdict, check_lease_ttl};
pub use validate::{MAX_DATA_BYTES, validate_new};

use refusal::task_not_found;

/// What the task rules need besides a connection.
#[derive(Debug, Clone)]
pub struct Engine {
    /// task-service's one client of lease-service: short timeout, no retries, since most calls
    /// are made while task rows are locked; [`Engine::leases_retrying`] is the same client for
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
    /// Whether lease-service accepts [`Engine::lease_ttl`].
    pub lease_ttl_verdict: TtlVerdict,
    /// The claims waiting for work on this replica.
    pub wakeups: Wakeups,
    /// Wakes this replica's schedule ticker when a rule here changed a schedule.
    pub schedules_changed: std::sync::Arc<tokio::sync::Notify>,
    /// The queues this replica's claims last found without limits.
    pub unlimited: limits::Unlimited,
}

impl Engine {
    fn resource(&self, id: i64) -> String {
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
    async fn release_own_after_commit(&self, row: &TaskRow, processor: &str) {
        if cover::shared(row).is_none() {
            self.release_after_commit(row.id, processor, row.lease_proof())
                .await;
        }
    }

    /// Releases a lease after the transaction that ended its task committed. A failure only
    /// means the lease runs out by itself.
    async fn release_after_commit(&self, id: i64, processor: &str, proof: Proof<'_>) {
        if let Err(err) = self
            .leases_retrying()
            .release(&self.resource(id), processor, proof)
            .await
        {
            tracing::debug!(task = id, error = %err, "lease release after commit failed; it will expire");
        }
    }
}

/// How a locked transition ended: a task to answer with, or a refusal that still committed a
/// change (a cancellation noticed on the way), whose lease must then be released.
#[derive(Debug)]
pub enum Transition {
    Done(TaskRow),
    Cancelled(TaskRow),
}

async fn locked(conn: &mut Db, id: i64) -> Result<TaskRow, ApiError> {
    locked_or_missing(repo::lock(conn, id).await?, id)
}

fn locked_or_missing(row: Option<TaskRow>, id: i64) -> Result<TaskRow, ApiError> {
    row.ok_or_else(|| task_not_found(id))
}

pub fn to_api(row: TaskRow) -> Task {
    Task {
        id: row.id,
        task_data: row.task_data,
        scheduled_at: row.scheduled_at,
        processor: row.processor,
        last_heart_beat_at: row.last_heartbeat_at,
        must_heart_beat_before: row.must_heartbeat_before,
        started_at: row.started_at,
        processed_at: row.processed_at,
        task_output: row.task_output,
        status: row.status,
        queue: row.queue,
        priority: row.priority,
        attempts: row.attempts,
        max_attempts: row.max_attempts,
        fence: row.fence,
        idempotency_key: row.idempotency_key,
        concurrency_key: row.concurrency_key,
        last_error: row.last_error,
        cancel_requested: row.cancel_requested,
        created_at: row.created_at,
        updated_at: row.updated_at,
        lease_ttl_ms: None,
        waited_ms: None,
    }
}

/// Task ids as a span records them (`task.ids`), so that a search by id finds the exchange.
fn span_ids(ids: impl Iterator<Item = i64>) -> String {
    ids.map(|id| id.to_string()).collect::<Vec<_>>().join(",")
}

/// What the operations' unit tests share: an engine whose lease-service is never reached (the
/// pure rules make no call), and a task row in a chosen state.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod fixtures {
    use leasehold::tasks::TaskStatus;

    use super::*;

    pub(super) fn engine() -> Engine {
        let leases = LeaseClient::new("http://127.0.0.1:9");
        Engine {
            leases,
            lease_ttl: Duration::from_secs(30),
            lease_prefix: "task:".to_owned(),
            generator_resource: "generator".to_owned(),
            default_max_attempts: 7,
            retry: Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
            metrics: Metrics::new().unwrap(),
            lease_ttl_verdict: TtlVerdict::default(),
            wakeups: Wakeups::new(
                tokio_util::sync::CancellationToken::new(),
                leasehold::server::wakeups::RECHECK,
                prometheus::IntGauge::new("waiting", "waiting").unwrap(),
            ),
            schedules_changed: std::sync::Arc::default(),
            unlimited: limits::Unlimited::default(),
        }
    }

    pub(super) fn row(status: TaskStatus, processor: Option<&str>, fence: Option<i64>) -> TaskRow {
        let epoch = chrono::DateTime::from_timestamp(0, 0).unwrap();
        TaskRow {
            id: 42,
            task_data: serde_json::json!({"n": 1}),
            queue: "default".to_owned(),
            priority: 0,
            status,
            scheduled_at: epoch,
            processor: processor.map(str::to_owned),
            fence,
            attempts: 1,
            max_attempts: 3,
            last_heartbeat_at: None,
            must_heartbeat_before: None,
            started_at: None,
            processed_at: None,
            task_output: None,
            last_error: None,
            cancel_requested: false,
            idempotency_key: None,
            created_at: epoch,
            updated_at: epoch,
            lease_secret: None,
            concurrency_key: None,
            lease_fence: fence,
            lease_resource: None,
        }
    }
}
