//! Wire types of the generator control API (`/api/generator`, served by task-service).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Bounds of the stored settings: task-service refuses a start outside them, and the
/// generator clamps whatever it reads into them. The slowest rate is one task per 1,000 s.
pub const MIN_RATE_PER_SECOND: f64 = 0.001;
pub const MAX_RATE_PER_SECOND: f64 = 1000.0;
/// The longest `sleep_duration_seconds` a generated task may ask for (an hour).
pub const MAX_SLEEP_SECONDS: f64 = 3600.0;

/// The generator's desired state, as stored by task-service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GeneratorSettings {
    pub running: bool,
    /// Tasks per second the leading replica creates.
    pub rate_per_second: f64,
    /// Each task's `sleep_duration_seconds` is drawn uniformly from this range.
    pub min_sleep_seconds: f64,
    pub max_sleep_seconds: f64,
    /// Tasks the generator has created so far.
    #[serde(deserialize_with = "crate::integers::integer")]
    pub produced: i64,
    pub updated_at: DateTime<Utc>,
}

/// Which replica holds the generator's lease, as lease-service reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GeneratorLeader {
    pub holder: String,
    #[serde(deserialize_with = "crate::integers::integer")]
    pub fence: i64,
    /// When this replica took the lease.
    pub since: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    #[serde(deserialize_with = "crate::integers::integer")]
    pub expires_in_ms: i64,
}

/// `GET /api/generator/status`: the same answer whichever task-service replica gives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GeneratorStatus {
    /// The desired state in the sample's words: `STARTED` or `STOPPED`.
    pub status: String,
    /// The sample's `isRunning`: started (whether or not a replica leads yet).
    pub is_running: bool,
    /// The sample's `message`: the state in a sentence, for its generator page.
    pub message: String,
    pub settings: GeneratorSettings,
    /// The replica holding the lease, if any. A stopped generator keeps its lease (it stays
    /// ready to produce the moment it is started), so a leader can exist while stopped.
    pub leader: Option<GeneratorLeader>,
    /// Started and a replica leads: tasks are being produced.
    pub producing: bool,
    #[serde(deserialize_with = "crate::integers::integer")]
    pub produced: i64,
}

/// Optional body of `POST /api/generator/start`: settings to change while starting.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StartGenerator {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0.001, maximum = 1000)]
    pub rate_per_second: Option<f64>,
    /// At most `max_sleep_seconds` (as given, or as set before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 3600)]
    pub min_sleep_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 3600)]
    pub max_sleep_seconds: Option<f64>,
}
