//! An operator's bulk operations: retry, cancel or delete every task a filter matches.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::TaskStatus;

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
