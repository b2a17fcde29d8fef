//! A worker's requests: claim, heartbeat, complete (one, or many with the next claim), fail
//! and snooze, and their answers.
//!
//! The sample's worker sends claim, heartbeat and single-complete bodies, and the sample's
//! server ignored fields it did not know: those three stay lenient. Every other body refuses an
//! unknown field (400 `invalid_field`, the message naming it), since a misspelt field there is a
//! check the client meant and never got: `"fencing"` for `"fence"` completes whatever claim
//! is current, `"nxt"` completes without claiming.

use serde::{Deserialize, Serialize};

use super::Task;

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
    /// [`MAX_CLAIM_WAIT_MS`](super::MAX_CLAIM_WAIT_MS)) until a task is due; without it, answer at once (the sample's
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
#[serde(deny_unknown_fields)]
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
    /// At most this many tasks (1 to [`MAX_CLAIM`](super::MAX_CLAIM)); one when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::integers::optional")]
    #[schema(minimum = 1, maximum = 100)]
    pub limit: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<crate::workers::ClaimantLease>,
}

/// One completion of a [`CompleteTasks`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
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
#[serde(deny_unknown_fields)]
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

/// The longest snooze: a year.
pub const MAX_SNOOZE_SECONDS: f64 = 365.0 * 24.0 * 3600.0;

/// `PUT /api/tasks/{id}/snooze`: the task's worker puts it back to pending, due in `seconds`
/// (0 to [`MAX_SNOOZE_SECONDS`]), without charging the attempt, and its lease is released.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SnoozeTask {
    #[schema(value_type = crate::schema::Name)]
    pub processor: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::integers::optional")]
    pub fence: Option<i64>,
    #[schema(minimum = 0, maximum = 31536000)]
    pub seconds: f64,
}

pub(super) fn default_true() -> bool {
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
