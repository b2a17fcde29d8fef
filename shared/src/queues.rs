//! Wire types of the queue control API (`/api/queues`, served by task-service).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// One queue: `GET /api/queues/{queue}`, each entry of `GET /api/queues`, and the answer of a
/// pause or resume. A queue exists for this API once it has tasks or an operator has set
/// something on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueState {
    pub queue: String,
    /// Claims skip a paused queue's tasks; its running tasks finish, creates still succeed.
    pub paused: bool,
    /// At most this many of its tasks run at once; none: no limit.
    #[serde(default)]
    #[serde(deserialize_with = "crate::integers::optional")]
    pub concurrency_limit: Option<i32>,
    /// At most this many of its tasks with one `concurrencyKey` run at once; none: no limit.
    #[serde(default)]
    #[serde(deserialize_with = "crate::integers::optional")]
    pub key_concurrency_limit: Option<i32>,
    /// At most this many of its tasks started per second; none: no limit.
    #[serde(default)]
    pub rate_limit: Option<RateLimit>,
    /// Its tasks in each status (every status named, zeros included).
    pub counts: BTreeMap<String, i64>,
    /// How long its oldest due pending task has waited (database clock); none when none is due.
    pub oldest_due_age_seconds: Option<f64>,
    /// When an operator last changed its settings; none if never.
    pub updated_at: Option<DateTime<Utc>>,
}

/// `PUT /api/queues/{queue}`: the queue's limits, all of them (a limit left out is lifted).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QueueSettings {
    /// At most this many of the queue's tasks running at any instant, across every worker and
    /// replica (0 to 1,000,000).
    #[serde(default, alias = "concurrencyLimit")]
    #[serde(deserialize_with = "crate::integers::optional")]
    #[schema(minimum = 0, maximum = 1000000)]
    pub concurrency_limit: Option<i32>,
    /// At most this many running tasks of one `concurrency_key` (0 to 1,000,000); claims take
    /// turns across keys, so one key's backlog never keeps another's tasks waiting. Tasks without
    /// a key are held by the queue's other limits only.
    #[serde(default, alias = "keyConcurrencyLimit")]
    #[serde(deserialize_with = "crate::integers::optional")]
    #[schema(minimum = 0, maximum = 1000000)]
    pub key_concurrency_limit: Option<i32>,
    /// At most `per_second` of the queue's tasks started per second (claims of tasks whose
    /// lease lapsed included), in bursts of at most `burst`, by the database's clock.
    #[serde(default, alias = "rateLimit")]
    pub rate_limit: Option<RateLimit>,
}

/// A rate limit: a token bucket of `burst` tokens, refilled at `per_second`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// `perSecond` in answers, as every answer's fields are camelCase; a request may write
    /// either.
    #[serde(rename = "perSecond", alias = "per_second")]
    #[schema(minimum = 0.000011574074074074073, maximum = 1000000)]
    pub per_second: f64,
    #[serde(deserialize_with = "crate::integers::integer")]
    #[schema(minimum = 1, maximum = 1000000)]
    pub burst: i32,
}

/// Largest rate (tasks per second) and burst accepted.
pub const MAX_RATE: f64 = 1_000_000.0;

/// Smallest rate accepted: one task a day. Below it a bucket's refill (rate × seconds) can
/// underflow the database's float8, which raises instead of rounding to zero; task-service's
/// `queues` table holds the same bound as a constraint.
pub const MIN_RATE: f64 = 1.0 / 86_400.0;

/// Largest concurrency limit accepted.
pub const MAX_CONCURRENCY_LIMIT: i32 = 1_000_000;

/// `GET /api/queues`: a page of the queues, by name (`limit`, `cursor` and `order` as the task
/// listings take them); `nextCursor` is the next page's `cursor`, `None` on the last page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Queues {
    pub queues: Vec<QueueState>,
    #[serde(default)]
    pub next_cursor: Option<String>,
}
