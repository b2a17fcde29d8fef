//! Wire types of task-service's HTTP API (`/api/tasks`).
//!
//! Task objects keep the sample's camelCase field names (`taskData`, `scheduledAt`,
//! `lastHeartBeatAt`, `mustHeartBeatBefore`, ...) so that its clients read them unchanged;
//! request bodies keep the sample's snake_case fields (`processor`, `task_output`).

mod bulk;
mod create;
mod work;

pub use bulk::{BulkResult, BulkTasks, MAX_BULK};
pub use create::{CreateResult, CreateTask, CreateTasks, CreatedTasks, MAX_CREATE_BATCH};
pub use work::{
    ClaimAnswer, ClaimNext, ClaimTasks, CompleteItem, CompleteTask, CompleteTasks, CompletedTasks,
    FailTask, Heartbeat, ItemError, ItemResult, MAX_SNOOZE_SECONDS, NoTask, SnoozeTask,
};

pub use crate::schema::{MAX_KEY_CHARS, MAX_QUEUE_CHARS};

/// Largest `taskData` (and `taskOutput`) task-service stores, serialised: task-service refuses
/// more, and the worker's exec mode cuts a command's output to fit.
pub const MAX_DATA_BYTES: usize = 64 * 1024;

/// Longest failure message task-service keeps (a fail's `error`), in characters; it drops the
/// rest. The worker cuts its messages to fit, so that what it marks as cut, or keeps of a
/// command's stderr, is what is stored.
pub const MAX_ERROR_CHARS: usize = 1024;
use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Most tasks one claim (`POST /api/tasks/next` with `limit`) may take. Each claimed task takes
/// a lease in one lease-service batch, so it may not exceed that batch's limit.
pub const MAX_CLAIM: i64 = 100;

/// The longest a claim may wait for work ([`ClaimTasks::wait_ms`]).
pub const MAX_CLAIM_WAIT_MS: u64 = 30_000;

/// Most completions one `PUT /api/tasks/complete` may carry ([`CompleteTasks`]); task-service
/// also gathers single completions into groups of at most this many. Their leases are released
/// in one lease-service batch.
pub const MAX_COMPLETE_BATCH: usize = 100;

// A claim's leases are acquired, and a completion group's released, in one lease-service batch.
const _: () = assert!(MAX_CLAIM as usize <= crate::api::MAX_BATCH_RESOURCES);
const _: () = assert!(MAX_COMPLETE_BATCH <= crate::api::MAX_BATCH_RESOURCES);

/// Where a task is in its life. `succeeded`, `dead` and `cancelled` are final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    Pending,
    Running,
    Succeeded,
    Dead,
    Cancelled,
}

impl TaskStatus {
    pub const ALL: [TaskStatus; 5] = [
        TaskStatus::Pending,
        TaskStatus::Running,
        TaskStatus::Succeeded,
        TaskStatus::Dead,
        TaskStatus::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Pending => "pending",
            TaskStatus::Running => "running",
            TaskStatus::Succeeded => "succeeded",
            TaskStatus::Dead => "dead",
            TaskStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == text)
    }

    pub fn is_final(self) -> bool {
        matches!(
            self,
            TaskStatus::Succeeded | TaskStatus::Dead | TaskStatus::Cancelled
        )
    }
}

/// A status read from task-service's `status` column. A word this enum does not know is an
/// error, never a guess: the column's CHECK constraint allows only these five.
#[cfg(feature = "server")]
impl diesel::deserialize::FromSql<diesel::sql_types::Text, diesel::pg::Pg> for TaskStatus {
    fn from_sql(value: diesel::pg::PgValue<'_>) -> diesel::deserialize::Result<Self> {
        crate::closed_set::from_sql(value, "task status", Self::parse)
    }
}

/// One task as task-service reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    #[serde(deserialize_with = "crate::integers::integer")]
    pub id: i64,
    pub task_data: serde_json::Value,
    pub scheduled_at: DateTime<Utc>,
    pub processor: Option<String>,
    pub last_heart_beat_at: Option<DateTime<Utc>>,
    pub must_heart_beat_before: Option<DateTime<Utc>>,
    pub started_at: Option<DateTime<Utc>>,
    pub processed_at: Option<DateTime<Utc>>,
    pub task_output: Option<serde_json::Value>,
    // Leasehold's additions.
    pub status: TaskStatus,
    pub queue: String,
    #[serde(deserialize_with = "crate::integers::integer")]
    pub priority: i32,
    /// Claims so far (each claim is an attempt).
    #[serde(deserialize_with = "crate::integers::integer")]
    pub attempts: i32,
    #[serde(deserialize_with = "crate::integers::integer")]
    pub max_attempts: i32,
    /// The fencing token of the current (or last) claim's lease.
    #[serde(default, deserialize_with = "crate::integers::optional")]
    pub fence: Option<i64>,
    pub idempotency_key: Option<String>,
    /// What the task was created with ([`CreateTask::concurrency_key`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
    pub last_error: Option<String>,
    /// Cancellation was asked for while the task ran; its next heartbeat ends it.
    pub cancel_requested: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Only in the answers to a claim and a heartbeat: the length of the task's lease, which
    /// runs from when task-service received the request. The worker counts its deadline from
    /// this, so it has no TTL setting of its own to keep equal to task-service's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::integers::optional")]
    pub lease_ttl_ms: Option<u64>,
    /// Only in the answer to a claim that asked to wait (`wait_ms`): how long task-service held
    /// the request before the claim round that took this task began. The lease runs from after
    /// that, so the worker counts its deadline from its request's send instant plus this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::integers::optional")]
    pub waited_ms: Option<u64>,
}

impl Task {
    /// This answer, telling the holder its lease lasts `ttl`.
    pub fn with_lease_ttl(mut self, ttl: std::time::Duration) -> Self {
        self.lease_ttl_ms = Some(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// This claim answer, telling the holder its request waited `waited` before it was claimed.
    pub fn with_waited(mut self, waited: std::time::Duration) -> Self {
        self.waited_ms = Some(u64::try_from(waited.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// How long the claim that answered with this task waited before claiming it (zero when it
    /// did not say).
    pub fn waited(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.waited_ms.unwrap_or(0))
    }

    /// The lease TTL the answer carries, if it carries one.
    pub fn lease_ttl(&self) -> Option<std::time::Duration> {
        self.lease_ttl_ms.map(std::time::Duration::from_millis)
    }
}

/// A page of a task listing (`GET /api/tasks`, `/processed`, `/started`): the sample's pages
/// read `tasks`; `nextCursor` is the next page's `cursor`, `None` on the last page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskPage {
    pub tasks: Vec<Task>,
    #[serde(default)]
    pub next_cursor: Option<String>,
}

/// `GET /api/tasks/{id}`: the task under its name, as the sample answers it and its task page
/// reads it (`data.task`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OneTask {
    pub task: Task,
}

/// `GET /api/tasks/counts`: per queue (a page of them), and over every queue, the number of
/// tasks in each status (every status named, zeros included).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskCounts {
    pub queues: BTreeMap<String, BTreeMap<String, i64>>,
    pub total: BTreeMap<String, i64>,
    /// The cursor of the next page of queues; none on the last.
    #[serde(default)]
    pub next_cursor: Option<String>,
}

impl TaskCounts {
    /// The counts of `(queue, status, count)` rows: every status named in every queue and in
    /// the total, zeros included.
    pub fn tally<'a>(rows: impl IntoIterator<Item = (&'a str, TaskStatus, i64)>) -> Self {
        let zeros = || -> BTreeMap<String, i64> {
            TaskStatus::ALL
                .iter()
                .map(|s| (s.as_str().to_owned(), 0))
                .collect()
        };
        let mut counts = TaskCounts {
            queues: BTreeMap::new(),
            total: zeros(),
            next_cursor: None,
        };
        for (queue, status, count) in rows {
            let per_queue = counts.queues.entry(queue.to_owned()).or_insert_with(zeros);
            *per_queue.entry(status.as_str().to_owned()).or_default() += count;
            *counts.total.entry(status.as_str().to_owned()).or_default() += count;
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_name_every_status_in_every_queue() {
        let counts = TaskCounts::tally([
            ("a", TaskStatus::Pending, 3),
            ("b", TaskStatus::Dead, 1),
            ("a", TaskStatus::Succeeded, 2),
        ]);
        assert_eq!(counts.queues.len(), 2);
        for per_queue in counts.queues.values() {
            assert_eq!(per_queue.len(), TaskStatus::ALL.len());
        }
        assert_eq!(counts.queues["a"]["pending"], 3);
        assert_eq!(counts.queues["a"]["dead"], 0);
        assert_eq!(counts.queues["b"]["dead"], 1);
        assert_eq!(counts.total["pending"], 3);
        assert_eq!(counts.total["succeeded"], 2);
        assert_eq!(counts.total["running"], 0);
        assert_eq!(TaskCounts::tally([]).total.len(), TaskStatus::ALL.len());
    }
}
