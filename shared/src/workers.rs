//! Wire types of worker processes as task-service shows them (`/api/workers`).
//!
//! A worker process makes itself known while it lives by a lease of its own, `worker:<id>` in
//! lease-service, which task-service acquires and renews on its behalf at each beat
//! (`PUT /api/workers/{id}`) with what the process says about itself ([`WorkerInfo`]) as the
//! lease's metadata. A process that dies stops beating, its lease lapses, and it shows as gone;
//! one that stops releases it. Liveness is the lease's, judged by lease-service's clock.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::api::Secret;

/// The resource of a worker process's liveness lease.
pub fn resource(id: &str) -> String {
    format!("{RESOURCE_PREFIX}{id}")
}

/// A worker process's liveness lease, as a claim names it (`POST /api/tasks/next`, field
/// `worker`) to have the tasks it gets covered by that lease rather than by a lease each: the
/// process's id and the fence its last beat was answered with. Its heartbeats and completions
/// then prove that one lease, and once it lapses, is taken anew or is revoked, every task it
/// covers is lost to the process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimantLease {
    /// The worker process's id (as in `PUT /api/workers/{id}`).
    #[schema(
        min_length = 1,
        max_length = 505,
        pattern = r"^[^\u0000-\u001F\u007F-\u009F]*$"
    )]
    pub id: String,
    #[serde(deserialize_with = "crate::integers::integer")]
    #[schema(minimum = 1)]
    pub fence: i64,
}

/// What every worker liveness lease's resource starts with.
pub const RESOURCE_PREFIX: &str = "worker:";

/// The longest [`WorkerBeat::ttl_seconds`] task-service grants: a process may go at most this
/// long between beats and still count as alive.
pub const MAX_TTL_SECONDS: i64 = 300;

/// What a worker process says about itself, kept as its lease's metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerInfo {
    /// The machine (or container) it runs on.
    #[schema(value_type = crate::schema::WorkerLabel)]
    pub host: String,
    /// Its release.
    #[schema(value_type = crate::schema::WorkerLabel)]
    pub version: String,
    /// The one queue it claims from; none for every queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::schema::QueueName>)]
    pub queue: Option<String>,
    /// Tasks it runs at once.
    #[serde(deserialize_with = "crate::integers::integer")]
    pub concurrency: u32,
    /// Tasks it is running now.
    #[serde(deserialize_with = "crate::integers::integer")]
    pub busy: u32,
    /// Tasks it has finished since it started (completed, failed or handed back).
    #[serde(deserialize_with = "crate::integers::integer")]
    pub done: u64,
}

/// `PUT /api/workers/{id}`: a worker process's beat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WorkerBeat {
    /// This run of the process, unique per start: the liveness lease's holder, so that a second
    /// process started under a live one's id is refused (409 `worker_id_in_use`) rather than
    /// sharing its lease.
    #[schema(value_type = crate::schema::Name)]
    pub instance: String,
    pub info: WorkerInfo,
    /// How long the process counts as alive without another beat (seconds).
    #[serde(deserialize_with = "crate::integers::integer")]
    #[schema(minimum = 1, maximum = 300)]
    pub ttl_seconds: i64,
    /// The lease's fence from the previous beat's answer; none on the first beat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::integers::optional")]
    pub fence: Option<i64>,
    /// The process's proof of holding its lease: its own secret, drawn once per run
    /// ([`Secret::random`]) and sent at every beat, the first included; every acquisition of
    /// the lease keeps it, so a beat whose answer was lost leaves nothing the next beat cannot
    /// prove. (A process that sends none at first gets lease-service's in
    /// [`WorkerLease::secret`], and must send that back.) At least
    /// [`crate::api::MIN_OWN_SECRET_CHARS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, min_length = 32, max_length = 512)]
    pub secret: Option<Secret>,
}

/// The answer to a beat: the liveness lease to present at the next one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerLease {
    #[serde(deserialize_with = "crate::integers::integer")]
    pub fence: i64,
    /// Given when the beat took the lease anew without a secret of its own; the next beats
    /// present it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<Secret>,
    /// Milliseconds until the process counts as gone without another beat.
    #[serde(deserialize_with = "crate::integers::integer")]
    pub expires_in_ms: i64,
}

/// `DELETE /api/workers/{id}`: a worker process that stops says so, with its lease's proof.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WorkerGone {
    /// The [`WorkerBeat::instance`] that holds the lease.
    #[schema(value_type = crate::schema::Name)]
    pub instance: String,
    #[serde(deserialize_with = "crate::integers::integer")]
    pub fence: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<Secret>,
}

/// Whether a worker process is alive, by its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum WorkerLiveness {
    /// Its lease is live: it beat within its TTL.
    Alive,
    /// Its lease is still live, but more than half its TTL has passed since its last beat (by
    /// lease-service's clock): it missed beats, and is lost when the lease lapses unless one
    /// comes. A process that died without saying so (killed, or its machine gone) shows so
    /// here, well before its lease lapses.
    Late,
    /// It stopped and said so (its lease was released).
    Stopped,
    /// It stopped beating: its lease lapsed (the process died, hangs or is cut off).
    Lost,
}

/// One worker process, as `GET /api/workers` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerState {
    pub id: String,
    pub liveness: WorkerLiveness,
    pub info: Option<WorkerInfo>,
    /// When its lease was taken: alive since (by lease-service's clock).
    pub since: DateTime<Utc>,
    /// Its last beat (by lease-service's clock).
    pub last_beat_at: DateTime<Utc>,
    /// When it stops counting as alive without another beat; when it stopped, for one gone.
    pub until: DateTime<Utc>,
}

/// `GET /api/workers`: the live processes first, then those gone that lease-service still
/// remembers; each group newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Workers {
    pub workers: Vec<WorkerState>,
}
