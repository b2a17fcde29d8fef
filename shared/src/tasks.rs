//! Wire types of task-service's HTTP API (`/api/tasks`).
//!
//! Task objects keep the sample's camelCase field names (`taskData`, `scheduledAt`,
//! `lastHeartBeatAt`, `mustHeartBeatBefore`, ...) so that its clients read them unchanged;
//! request bodies keep the sample's snake_case fields (`processor`, `task_output`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Longest queue name task-service accepts, in characters. The worker checks its `WORKER_QUEUE`
/// against it at startup, so a bad setting fails there rather than on every claim.
pub const MAX_QUEUE_CHARS: usize = 128;

/// Longest idempotency or concurrency key, in characters.
pub const MAX_KEY_CHARS: usize = 255;

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
        let text = <String as diesel::deserialize::FromSql<
            diesel::sql_types::Text,
            diesel::pg::Pg,
        >>::from_sql(value)?;
        Self::parse(&text).ok_or_else(|| format!("unknown task status {text:?}").into())
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

/// `GET /api/tasks/counts`: per queue, and in all, the number of tasks in each status (every
/// status named, zeros included).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TaskCounts {
    pub queues: BTreeMap<String, BTreeMap<String, i64>>,
    pub total: BTreeMap<String, i64>,
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
        };
        for (queue, status, count) in rows {
            let per_queue = counts.queues.entry(queue.to_owned()).or_insert_with(zeros);
            *per_queue.entry(status.as_str().to_owned()).or_default() += count;
            *counts.total.entry(status.as_str().to_owned()).or_default() += count;
        }
        counts
    }
}

/// `POST /api/tasks`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CreateTask {
    /// A JSON object (at most 64 KiB).
    #[schema(value_type = crate::schema::JsonObject)]
    pub task_data: serde_json::Value,
    /// Run no earlier than this (RFC 3339, years 1 to 9999).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        pattern = r"^(000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"
    )]
    pub scheduled_at: Option<DateTime<Utc>>,
    /// Default `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::schema::QueueName>)]
    pub queue: Option<String>,
    /// Higher first; default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::integers::optional")]
    #[schema(minimum = -1000, maximum = 1000)]
    pub priority: Option<i32>,
    /// Default the service's `TASK_MAX_ATTEMPTS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::integers::optional")]
    #[schema(minimum = 1, maximum = 1000)]
    pub max_attempts: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::schema::Key>)]
    pub idempotency_key: Option<String>,
    /// The tenant, customer or account the task works for: a queue's `key_concurrency_limit`
    /// lets at most that many tasks of one key run at once, and claims take turns across keys.
    #[serde(
        default,
        alias = "concurrencyKey",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<crate::schema::Key>)]
    pub concurrency_key: Option<String>,
    /// Sent by task-generator only: the fence of the generator lease it creates under. The task
    /// is stored only while that fence holds the lease and the generator is started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::integers::optional")]
    pub generator_fence: Option<i64>,
}

/// Most tasks one `POST /api/tasks/batch` may create ([`CreateTasks`]).
pub const MAX_CREATE_BATCH: usize = 1_000;

/// `POST /api/tasks/batch`: up to [`MAX_CREATE_BATCH`] creates in one statement and one commit.
/// Each is judged as it would be alone (its own validation, its own idempotency key), except
/// that a batch cannot carry a generator's fenced create.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CreateTasks {
    pub tasks: Vec<CreateTask>,
}

/// The answer of `POST /api/tasks/batch`: one result per create, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CreatedTasks {
    pub results: Vec<CreateResult>,
}

/// One create's outcome: the task (status 201 when new, 200 when its idempotency key named it
/// already), or the refusal it would have got alone (its status and error body).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CreateResult {
    #[serde(deserialize_with = "crate::integers::integer")]
    pub status: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<Task>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<crate::api::ErrorBody>,
}

/// `POST /api/tasks/next`. Without `limit` the answer is one task; with it, a list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ClaimTasks {
    #[schema(value_type = crate::schema::Name)]
    pub processor: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::schema::QueueName>)]
    pub queue: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::integers::optional")]
    #[schema(minimum = 1, maximum = 100)]
    pub limit: Option<i64>,
    /// With nothing due, hold the request up to this many milliseconds (at most
    /// [`MAX_CLAIM_WAIT_MS`]) until a task is due; without it, answer at once (the sample's
    /// clients send none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::integers::optional")]
    #[schema(maximum = 30000)]
    pub wait_ms: Option<u64>,
    /// The claiming worker process's liveness lease, to cover the tasks it gets (see
    /// [`crate::workers::ClaimantLease`]); without it, each task takes a lease of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<crate::workers::ClaimantLease>,
}

/// `PUT /api/tasks/{id}/heartbeat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Heartbeat {
    #[schema(value_type = crate::schema::Name)]
    pub processor: String,
    /// When given, must be the task's current fence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::integers::optional")]
    pub fence: Option<i64>,
}

/// `PUT /api/tasks/{id}/complete`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CompleteTask {
    #[schema(value_type = crate::schema::Name)]
    pub processor: String,
    #[serde(default)]
    pub task_output: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::integers::optional")]
    pub fence: Option<i64>,
}

/// `PUT /api/tasks/complete`: a worker's completions of several tasks in one request (one
/// transaction and one lease-service call). Each is judged as `PUT /{id}/complete` would judge
/// it alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CompleteTasks {
    #[schema(value_type = crate::schema::Name)]
    pub processor: String,
    #[schema(min_items = 1, max_items = 100)]
    pub tasks: Vec<CompleteItem>,
    /// Claim the next tasks in the same request and transaction, as `POST /api/tasks/next`
    /// would with these fields (it never waits): a worker that finishes a task and wants another
    /// makes one request, not two. The answer's `claimed` holds them; a task-service that
    /// predates this field answers without `claimed`, and the worker then claims on its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<ClaimNext>,
}

/// What a [`CompleteTasks`] claims after its completions: the fields of a [`ClaimTasks`] but
/// the wait, for the same processor.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimNext {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::schema::QueueName>)]
    pub queue: Option<String>,
    /// At most this many tasks (1 to [`MAX_CLAIM`]); one when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::integers::optional")]
    #[schema(minimum = 1, maximum = 100)]
    pub limit: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<crate::workers::ClaimantLease>,
}

/// One completion of a [`CompleteTasks`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CompleteItem {
    #[serde(deserialize_with = "crate::integers::integer")]
    pub id: i64,
    #[serde(default)]
    pub task_output: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::integers::optional")]
    pub fence: Option<i64>,
}

/// The answer to [`CompleteTasks`]: one result per completion, in the request's order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CompletedTasks {
    pub results: Vec<ItemResult>,
    /// The tasks claimed after the completions, when the request asked for them (`next`):
    /// possibly none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed: Option<Vec<Task>>,
    /// Why that claim got nothing, when it was refused as a whole (lease-service unavailable,
    /// say) while the completions were judged.
    #[serde(
        default,
        rename = "claimRefused",
        skip_serializing_if = "Option::is_none"
    )]
    pub claim_refused: Option<ItemError>,
}

/// A refusal inside a 200 answer: the status the request would have got alone, and its body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ItemError {
    #[serde(deserialize_with = "crate::integers::integer")]
    pub status: u16,
    pub error: crate::api::ErrorBody,
}

/// One completion's outcome: the task (status 202), or the refusal it would have got alone
/// (its status and error body).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ItemResult {
    #[serde(deserialize_with = "crate::integers::integer")]
    pub id: i64,
    #[serde(deserialize_with = "crate::integers::integer")]
    pub status: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<Task>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<crate::api::ErrorBody>,
}

/// `PUT /api/tasks/{id}/fail`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FailTask {
    #[schema(value_type = crate::schema::Name)]
    pub processor: String,
    pub error: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::integers::optional")]
    pub fence: Option<i64>,
    /// `false`: the task can never succeed; it goes dead now, whatever attempts are left.
    #[serde(default = "default_true")]
    pub retryable: bool,
    /// Hand the task back without charging the attempt, claimable at once (a worker shutting
    /// down gracefully does this with work it could not finish).
    #[serde(default)]
    pub requeue: bool,
}

/// Most tasks one bulk operation (`POST /api/tasks/retry`, `/cancel`, `/delete`) touches.
pub const MAX_BULK: i64 = 1_000;

/// The filter of a bulk operation: the tasks that match every field given, oldest id first, at
/// most `limit` ([`MAX_BULK`] by default) per call. Each field the task listings take narrows
/// it exactly as it narrows a listing, and a field it does not know is refused (400), never
/// ignored: an ignored filter widens an irreversible operation to every task. Tasks that
/// another request holds at that moment (a claim, a completion) are skipped, so an operator
/// repeats the call until it touches none.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkTasks {
    /// One status the operation allows (each has its own set and default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<TaskStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::schema::QueueName>)]
    pub queue: Option<String>,
    /// Only tasks last claimed by this processor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::schema::Name>)]
    pub processor: Option<String>,
    /// Only tasks with this concurrency key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::schema::Key>)]
    pub key: Option<String>,
    /// At most [`MAX_BULK`] ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::integers::optional_list")]
    #[schema(max_items = 1000)]
    pub ids: Option<Vec<i64>>,
    /// Only tasks created at or after this instant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_after: Option<DateTime<Utc>>,
    /// Only tasks created before this instant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_before: Option<DateTime<Utc>>,
    /// At most this many tasks (default and most: 1,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::integers::optional")]
    #[schema(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
}

/// The answer of a bulk operation: how many tasks it touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BulkResult {
    #[serde(deserialize_with = "crate::integers::integer")]
    pub touched: u64,
}

/// The longest snooze: a year.
pub const MAX_SNOOZE_SECONDS: f64 = 365.0 * 24.0 * 3600.0;

/// `PUT /api/tasks/{id}/snooze`: the task's worker puts it back to pending, due in `seconds`
/// (0 to [`MAX_SNOOZE_SECONDS`]), without charging the attempt, and its lease is released.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SnoozeTask {
    #[schema(value_type = crate::schema::Name)]
    pub processor: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::integers::optional")]
    pub fence: Option<i64>,
    #[schema(minimum = 0, maximum = 31536000)]
    pub seconds: f64,
}

fn default_true() -> bool {
    true
}

/// The 200 answer of `POST /api/tasks/next` when no task is due (the sample's shape).
/// The answer to a claim that got tasks (`POST /api/tasks/next`, 202): the task alone (the
/// sample's answer) when the request named no `limit`, a list when it did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum ClaimAnswer {
    One(Box<Task>),
    Many(Vec<Task>),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NoTask {
    pub message: String,
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
