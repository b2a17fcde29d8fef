//! Acquiring leases: one (`POST /api/leases`) or a batch (`POST /api/leases/batch`).

use serde::{Deserialize, Serialize};

use super::{HeldLease, Lease, Secret};

/// `POST /api/leases`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AcquireLease {
    #[schema(value_type = crate::schema::Name)]
    pub resource: String,
    #[schema(value_type = crate::schema::Name)]
    pub holder: String,
    /// The lease's length (default 30; the bounds are the service's `LEASE_MIN_TTL_SECONDS` and
    /// `LEASE_MAX_TTL_SECONDS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 3600)]
    #[serde(deserialize_with = "crate::integers::optional")]
    pub ttl_seconds: Option<i64>,
    /// The holder's proof: a reentrant acquire must present the secret of the lease it already
    /// has, and a new acquisition keeps the one presented (instead of drawing one), so that a
    /// holder whose answer was lost can still prove itself. [`MIN_OWN_SECRET_CHARS`] to
    /// [`MAX_NAME_CHARS`](crate::schema::MAX_NAME_CHARS) characters; keep it as secret as one lease-service draws.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, min_length = 32, max_length = 512)]
    pub secret: Option<Secret>,
    /// When another holder has the lease, wait up to this many milliseconds (at most
    /// [`MAX_ACQUIRE_WAIT_MS`]) for it to be released or to expire; without it, answer at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(maximum = 30000)]
    #[serde(deserialize_with = "crate::integers::optional")]
    pub wait_ms: Option<u64>,
    /// The holder's [`Lease::metadata`]: stored by a new acquisition, replacing the old by a
    /// reentrant one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::schema::JsonObject>)]
    pub metadata: Option<serde_json::Value>,
}

/// The shortest secret an acquire may present ([`AcquireLease::secret`]): as many characters
/// as the hex of the 128 random bits that make a secret unguessable.
pub const MIN_OWN_SECRET_CHARS: usize = 32;

/// The longest an acquire may wait for a held lease ([`AcquireLease::wait_ms`]).
pub const MAX_ACQUIRE_WAIT_MS: u64 = 30_000;

/// `POST /api/leases/batch`: acquire many resources in one statement (how task-service claims
/// a batch of tasks with one call and one commit). Each resource is acquired as
/// `POST /api/leases` would acquire it alone; there is no all-or-nothing.
///
/// Either `holder` names one holder for every resource, or `holders` names each resource's
/// holder (same length and order as `resources`): task-service's claims of several workers,
/// gathered into one transaction, take their leases in one call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AcquireLeases {
    /// 1 to 100 resources, each once.
    #[schema(schema_with = crate::schema::resources_once)]
    pub resources: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::schema::Name>)]
    pub holder: Option<String>,
    /// A holder per resource, as many as `resources`, in their order (instead of `holder`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<crate::schema::Name>>, min_items = 1, max_items = 100)]
    pub holders: Option<Vec<String>>,
    /// As `POST /api/leases`'s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 3600)]
    #[serde(deserialize_with = "crate::integers::optional")]
    pub ttl_seconds: Option<i64>,
    /// Every lease's [`Lease::metadata`], as [`AcquireLease::metadata`] is for one: stored by a
    /// new acquisition, replacing the old by a reentrant one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::schema::JsonObject>)]
    pub metadata: Option<serde_json::Value>,
}

/// The answer to [`AcquireLeases`]: which resources were newly acquired (each with its own
/// fence and secret), which the holder already held (extended, fence kept; reentrant, so
/// refused when lease-service requires secrets), and which someone holds. A resource in none
/// of the three changed hands while the statement ran; ask again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AcquiredLeases {
    pub acquired: Vec<Lease>,
    pub extended: Vec<Lease>,
    pub held: Vec<HeldLease>,
}
