//! Creating tasks: one (`POST /api/tasks`) or a batch (`POST /api/tasks/batch`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::Task;

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
