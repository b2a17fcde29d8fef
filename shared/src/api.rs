//! Wire types of lease-service's HTTP API (`/api/leases`).
//!
//! Field names follow the sample's `leases` table (snake_case), so the sample's clients keep
//! working; `fence`, `ttl_seconds`, `status` and `expires_in_ms` are Leasehold's additions.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Longest `resource` or `holder` accepted, in bytes.
pub const MAX_NAME_BYTES: usize = 512;

/// The sample's lease length, used when a request names no `ttl_seconds`.
pub const DEFAULT_TTL_SECONDS: i64 = 30;

/// One lease as lease-service reports it.
///
/// `status` and `expires_in_ms` are computed with the database's clock at the moment of the
/// response, so a client never needs a synchronised clock to know how long it has left.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub id: i64,
    pub resource: String,
    pub holder: String,
    /// Fencing token: greater for every new acquisition of a resource; renewals keep it.
    pub fence: i64,
    pub ttl_seconds: i32,
    pub status: LeaseStatus,
    /// When the current acquisition was made (the sample's column name).
    pub created_at: DateTime<Utc>,
    pub renewed_at: Option<DateTime<Utc>>,
    pub released_at: Option<DateTime<Utc>>,
    pub expires_at: DateTime<Utc>,
    /// Milliseconds until expiry by the database's clock; 0 once expired or released.
    pub expires_in_ms: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseStatus {
    Active,
    Expired,
    Released,
}

/// `POST /api/leases`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcquireLease {
    pub resource: String,
    pub holder: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<i64>,
}

/// `PUT /api/leases/renew`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewLease {
    pub resource: String,
    pub holder: String,
    /// When given, the renewal is refused unless it is the current fence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<i64>,
    /// When given, the lease's TTL changes to this from now on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<i64>,
}

/// `DELETE /api/leases/release` and `DELETE /api/leases/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseLease {
    pub resource: String,
    pub holder: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<i64>,
}

/// Body of every non-2xx answer of every Leasehold service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// For people: what went wrong, in a sentence.
    pub error: String,
    /// For programs: a stable identifier (`lease_held`, `stale_fence`, ...).
    pub code: String,
    /// On `lease_held`: who holds the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// On `lease_held`: when the current holder's lease expires unless renewed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
    /// On `lease_held`: milliseconds until that expiry, by the database's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_ms: Option<i64>,
    /// On input errors: the offending field, where one can be named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

impl ErrorBody {
    pub fn new(code: impl Into<String>, error: impl Into<String>) -> Self {
        Self {
            error: error.into(),
            code: code.into(),
            holder: None,
            expires_at: None,
            expires_in_ms: None,
            field: None,
        }
    }
}
