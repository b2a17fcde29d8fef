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
//! * `hand_back`: tasks claimed for a client that left before its answer, back to pending;
//! * `groups`: how claims and completions are gathered into groups (built once, the same way);
//! * `heartbeat`, `fail`, `snooze`, `cancel`, `retry`: one transition each, and `owner`, the
//!   ownership check they share;
//! * `bulk`: retry, cancel and delete by filter;
//! * `read`: one task, its history, listings, counts, gauges and the dashboard's overview;
//! * `ready`: whether this replica can serve (`/readyz`);
//! * `refusal`: the errors several operations answer with;
//! * `ttl`: whether lease-service accepts the task lease TTL (for `/readyz` and claims).
//!
//! This module keeps what every operation shares (besides [`crate::context`]): how a transition ends, the
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
mod hand_back;
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

use leasehold::server::ApiError;
use leasehold::tasks::Task;

use crate::repo::{self, Db, TaskRow};

pub use bulk::{cancel_many, delete_many, retry_many};
pub use cancel::cancel;
pub use claim::{Claimed, Want, claim_group, claims_per_group, end_cancelled};
pub use complete::{Completion, complete, complete_group, complete_many, completions_per_group};
pub use complete_then_claim::complete_then_claim;
pub use create::{Created, create};
pub use create_many::create_many;
pub use fail::fail;
pub use groups::{
    ClaimGroups, CompletionGroups, CreateGroups, claim_groups, completion_groups, create_groups,
};
pub use heartbeat::heartbeat;
pub use next::{WAKEUP_CHANNEL, claim, want};
pub use read::{counts, events, get};
pub use ready::ready;
pub use retry::retry;
pub use snooze::snooze;
pub use ttl::check_lease_ttl;
pub use validate::{MAX_DATA_BYTES, validate_new};

use refusal::task_not_found;

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
    use std::time::Duration;

    use leasehold::server::wakeups::Wakeups;
    use leasehold::tasks::TaskStatus;
    use leasehold::{Backoff, LeaseClient};

    use super::*;
    use crate::context::Context;
    use crate::metrics::Metrics;

    pub(super) fn engine() -> Context {
        let leases = LeaseClient::new("http://127.0.0.1:9");
        Context {
            leases,
            lease_ttl: Duration::from_secs(30),
            lease_prefix: "task:".to_owned(),
            generator_resource: "generator".to_owned(),
            default_max_attempts: 7,
            retry: Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
            metrics: Metrics::new().unwrap(),
            lease_ttl_verdict: crate::context::TtlVerdict::default(),
            wakeups: Wakeups::new(
                tokio_util::sync::CancellationToken::new(),
                leasehold::server::wakeups::RECHECK,
                prometheus::IntGauge::new("waiting", "waiting").unwrap(),
            ),
            schedules_changed: std::sync::Arc::default(),
            unlimited: crate::context::Unlimited::default(),
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
