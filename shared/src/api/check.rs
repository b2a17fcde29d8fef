//! Where acquisitions stand (`POST /api/leases/batch/check`), read without changing them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// `POST /api/leases/batch/check`: where each of several acquisitions stands, each named by its
/// resource and fence (fences are never reused, so the pair names one acquisition). It reads
/// and writes nothing: a lease that covers many pieces of work (a worker process's, covering
/// its tasks) is proven once for all of them, where a lease per piece would be released.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckLeases {
    #[schema(min_items = 1, max_items = 100)]
    pub leases: Vec<LeaseRef>,
}

/// One acquisition: the lease on `resource` that was granted under `fence`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseRef {
    #[schema(value_type = crate::schema::Name)]
    pub resource: String,
    #[serde(deserialize_with = "crate::integers::integer")]
    pub fence: i64,
}

/// The answer to [`CheckLeases`]: one result per acquisition, in the request's order, all
/// judged by one statement's clock (the database's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CheckedLeases {
    pub results: Vec<LeaseCheck>,
}

/// Where one acquisition stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaseCheck {
    pub resource: String,
    #[serde(deserialize_with = "crate::integers::integer")]
    pub fence: i64,
    pub standing: LeaseStanding,
    /// Its expiry, while the acquisition is still the lease's (held, lapsed or expired).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
    /// Until when no one else may take the resource: its expiry, or later for a lease an
    /// earlier primary set (the clock-skew bound). Only while held or lapsed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub takeover_at: Option<DateTime<Utc>>,
    /// Milliseconds until its expiry by the database's clock, while held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(deserialize_with = "crate::integers::optional")]
    pub expires_in_ms: Option<i64>,
}

/// Where an acquisition stands: only a `held` one lets its holder act (renew and release
/// succeed); a `held` or `lapsed` one still keeps everyone else off the resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LeaseStanding {
    /// Unexpired and unreleased: its holder may act.
    Held,
    /// Expired, but not yet to be taken over (a lease an earlier primary set, within the clock-
    /// skew bound): its holder may not act, and no one else may take it yet.
    Lapsed,
    /// Expired, and free to be taken over.
    Expired,
    /// Its holder released it.
    Released,
    /// An operator revoked it.
    Revoked,
    /// The resource has been acquired again since, under a newer fence.
    Superseded,
    /// The resource has no lease (never acquired, or its row was swept), or an older fence.
    Missing,
}

impl LeaseStanding {
    /// Its holder may act on it.
    pub fn held(self) -> bool {
        self == LeaseStanding::Held
    }

    /// No one else may take the resource yet.
    pub fn keeps_others_off(self) -> bool {
        matches!(self, LeaseStanding::Held | LeaseStanding::Lapsed)
    }
}

/// Someone else's live lease, as a refused acquire reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeldLease {
    pub resource: String,
    pub holder: String,
    #[serde(alias = "expires_at")]
    pub expires_at: DateTime<Utc>,
    #[serde(alias = "expires_in_ms")]
    #[serde(deserialize_with = "crate::integers::integer")]
    pub expires_in_ms: i64,
}
