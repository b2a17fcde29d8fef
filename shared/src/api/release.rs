//! Renewing and releasing: one lease, or a batch of releases.

use serde::{Deserialize, Serialize};

use super::{ErrorBody, Lease, Secret};

/// `PUT /api/leases/renew`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RenewLease {
    #[schema(value_type = crate::schema::Name)]
    pub resource: String,
    #[schema(value_type = crate::schema::Name)]
    pub holder: String,
    /// When given, the renewal is refused unless it is the current fence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::integers::optional")]
    pub fence: Option<i64>,
    /// When given, the lease's TTL changes to this from now on (within the service's bounds, as
    /// an acquire's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 3600)]
    #[serde(deserialize_with = "crate::integers::optional")]
    pub ttl_seconds: Option<i64>,
    /// The secret the acquire answered with; required when lease-service requires proof.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<Secret>,
    /// When given, replaces the lease's [`Lease::metadata`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::schema::JsonObject>)]
    pub metadata: Option<serde_json::Value>,
}

/// `DELETE /api/leases/release` and `DELETE /api/leases/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReleaseLease {
    #[schema(value_type = crate::schema::Name)]
    pub resource: String,
    #[schema(value_type = crate::schema::Name)]
    pub holder: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::integers::optional")]
    pub fence: Option<i64>,
    /// The secret the acquire answered with; required when lease-service requires proof.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<Secret>,
}

/// `POST /api/leases/batch/release`: many releases in one transaction (one commit), each
/// judged as `DELETE /api/leases/release` would judge it alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReleaseLeases {
    #[schema(value_type = Vec<ReleaseItem>, min_items = 1, max_items = 100)]
    pub leases: Vec<ReleaseLease>,
}

/// A release of a batch as the request's shape takes it: each is then judged as
/// `DELETE /api/leases/release` would judge it alone, a name out of bounds included (that
/// item's 400, in its result). Only in the API documents.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct ReleaseItem {
    resource: String,
    holder: String,
    fence: Option<i64>,
    secret: Option<String>,
}

/// The answer to [`ReleaseLeases`]: one result per release, in the request's order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReleasedLeases {
    pub results: Vec<ReleaseResult>,
}

/// One release's outcome: the released lease (status 200), or the refusal it would have got
/// alone (its status and error body).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReleaseResult {
    pub resource: String,
    #[serde(deserialize_with = "crate::integers::integer")]
    pub status: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<Lease>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}
