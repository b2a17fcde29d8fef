//! Wire types of lease-service's HTTP API (`/api/leases`), and those every service shares: the
//! error body and its codes, secrets, and paging. The acquire, release and check requests are
//! modules of their own; [`crate::tasks`] holds task-service's.
//!
//! Answers name their fields in camelCase, as the sample's Prisma models do (its pages read
//! `lease.createdAt`, `expiresAt`, `releasedAt`); requests keep the sample's snake_case fields
//! (`ttl_seconds`). `fence`, `ttlSeconds`, `status` and `expiresInMs` are Leasehold's additions.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

mod acquire;
mod check;
mod error_code;
mod release;

pub use crate::schema::{MAX_BATCH_RESOURCES, MAX_NAME_CHARS};
pub use acquire::{
    AcquireLease, AcquireLeases, AcquiredLeases, MAX_ACQUIRE_WAIT_MS, MIN_OWN_SECRET_CHARS,
};
pub use check::{CheckLeases, CheckedLeases, HeldLease, LeaseCheck, LeaseRef, LeaseStanding};
pub use error_code::{ErrorCode, UnknownCode};
pub use release::{ReleaseLease, ReleaseLeases, ReleaseResult, ReleasedLeases, RenewLease};

/// The sample's lease length, used when a request names no `ttl_seconds`.
pub const DEFAULT_TTL_SECONDS: i64 = 30;

/// One lease as lease-service reports it.
///
/// `status` and `expires_in_ms` are computed with the database's clock at the moment of the
/// response, so a client never needs a synchronised clock to know how long it has left.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
// Each field also reads its old snake_case name, so that a client of this version works against
// a lease-service of the previous one while a deployment rolls over (see README, Deploy).
#[serde(rename_all = "camelCase")]
pub struct Lease {
    #[serde(deserialize_with = "crate::integers::integer")]
    pub id: i64,
    pub resource: String,
    pub holder: String,
    /// Fencing token: greater for every new acquisition of a resource; renewals keep it.
    #[serde(deserialize_with = "crate::integers::integer")]
    pub fence: i64,
    #[serde(alias = "ttl_seconds")]
    #[serde(deserialize_with = "crate::integers::integer")]
    pub ttl_seconds: i32,
    pub status: LeaseStatus,
    /// When the current acquisition was made (the sample's column name).
    #[serde(alias = "created_at")]
    pub created_at: DateTime<Utc>,
    #[serde(alias = "renewed_at")]
    pub renewed_at: Option<DateTime<Utc>>,
    #[serde(alias = "released_at")]
    pub released_at: Option<DateTime<Utc>>,
    #[serde(alias = "expires_at")]
    pub expires_at: DateTime<Utc>,
    /// Milliseconds until expiry by the database's clock; 0 once expired or released.
    #[serde(alias = "expires_in_ms")]
    #[serde(deserialize_with = "crate::integers::integer")]
    pub expires_in_ms: i64,
    /// Proof of holding, in the answer to a new acquisition only (drawn by lease-service, or the
    /// one its acquire presented) and to a reentrant one that presented it: renew and release
    /// present it, so that a holder's name alone is not enough to release its lease.
    /// lease-service keeps only its digest; keep it secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<Secret>,
    /// What the holder says about itself (a JSON object of at most [`MAX_LEASE_METADATA_BYTES`]),
    /// set by its acquire or renewals; lease-service stores it and never reads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::schema::JsonObject>)]
    pub metadata: Option<serde_json::Value>,
}

/// The largest [`Lease::metadata`], as JSON text.
pub const MAX_LEASE_METADATA_BYTES: usize = 4096;

/// A lease's secret: shown to no `Debug` print and so to no log; [`Secret::expose`] to send it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(secret: impl Into<String>) -> Secret {
        Secret(secret.into())
    }

    /// 256 random bits, hex-encoded: what lease-service draws for a new acquisition, and what a
    /// holder that brings its own ([`AcquireLease::secret`]) should use.
    pub fn random() -> Secret {
        use rand::Rng;
        let bytes: [u8; 32] = rand::rng().random();
        Secret(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// From configuration (a bearer token in an environment variable).
impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(text: &str) -> Result<Secret, Self::Err> {
        Ok(Secret::new(text))
    }
}

impl Secret {
    /// `Authorization: Bearer <this>` as default headers for a client: marked sensitive, so
    /// neither reqwest's nor our own debug output shows it. `None` or empty: no header.
    pub fn bearer_headers(token: Option<&Secret>) -> reqwest::header::HeaderMap {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = token.filter(|t| !t.0.is_empty())
            && let Ok(mut value) =
                reqwest::header::HeaderValue::from_str(&format!("Bearer {}", token.0))
        {
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        headers
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(redacted)")
    }
}

impl Lease {
    /// What renew and release present to prove that they come from this lease's holder.
    pub fn proof(&self) -> Proof<'_> {
        Proof {
            fence: Some(self.fence),
            secret: self.secret.as_ref().map(Secret::expose),
        }
    }
}

/// What a renew or release presents besides the holder's name: the fence, refused unless it is
/// the current one, and the secret the acquire answered with, refused unless it matches.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Proof<'a> {
    pub fence: Option<i64>,
    pub secret: Option<&'a str>,
}

impl std::fmt::Debug for Proof<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proof")
            .field("fence", &self.fence)
            .field("secret", &self.secret.map(|_| "redacted"))
            .finish()
    }
}

impl<'a> Proof<'a> {
    /// The secret as a request field.
    pub fn secret_field(&self) -> Option<Secret> {
        self.secret.map(Secret::new)
    }

    pub fn fence(fence: Option<i64>) -> Proof<'a> {
        Proof {
            fence,
            secret: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LeaseStatus {
    Active,
    Expired,
    /// Released by its holder.
    Released,
    /// Ended by an operator (`POST /api/leases/{id}/revoke`); `releasedAt` says when.
    Revoked,
}

/// A page of a lease listing (`GET /api/leases`, `/active`, ...): the sample's pages read
/// `leases`; `nextCursor` is the next page's `cursor`, `None` on the last page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeasePage {
    pub leases: Vec<Lease>,
    #[serde(default)]
    pub next_cursor: Option<String>,
    /// The database's clock when it read the page, which every lease's `status` and
    /// `expiresInMs` were judged by: a reader times them all from this one reading. None for an
    /// empty page (and from a lease-service before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub now: Option<DateTime<Utc>>,
}

/// The query string of one page of a listing, as both services' listings read it: `order=desc`
/// for newest first, then `limit`, `cursor` and the listing's own filters, each only when given.
pub fn page_query<const N: usize>(
    limit: Option<u32>,
    cursor: Option<&str>,
    newest_first: bool,
    filters: [(&'static str, &Option<String>); N],
) -> Vec<(&'static str, String)> {
    let order = newest_first.then(|| "desc".to_owned());
    let paging = [
        ("order", order),
        ("limit", limit.map(|limit| limit.to_string())),
        ("cursor", cursor.map(str::to_owned)),
    ];
    paging
        .into_iter()
        .chain(filters.map(|(name, value)| (name, value.clone())))
        .filter_map(|(name, value)| Some((name, value?)))
        .collect()
}

/// `GET /api/leases/{id}`: the lease under its name, as the sample's lease page reads it
/// (`data.lease`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OneLease {
    pub lease: Lease,
}

/// Body of every non-2xx answer of every Leasehold service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ErrorBody {
    /// For people: what went wrong, in a sentence.
    pub error: String,
    /// For programs: a stable identifier (`lease_held`, `stale_fence`, ...).
    pub code: ErrorCode,
    /// On `lease_held`: who holds the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// On `lease_held`: when the current holder's lease expires unless renewed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(alias = "expires_at")]
    pub expires_at: Option<DateTime<Utc>>,
    /// On `lease_held`: milliseconds until that expiry, by the database's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(alias = "expires_in_ms")]
    #[serde(deserialize_with = "crate::integers::optional")]
    pub expires_in_ms: Option<i64>,
    /// On input errors: the offending field, where one can be named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

impl ErrorBody {
    pub fn new(code: ErrorCode, error: impl Into<String>) -> Self {
        Self {
            error: error.into(),
            code,
            holder: None,
            expires_at: None,
            expires_in_ms: None,
            field: None,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_answered_in_camel_case_and_read_in_either_case() {
        let old = serde_json::json!({"id": 3, "resource": "r", "holder": "h", "fence": 7,
            "ttl_seconds": 30, "status": "active", "created_at": "2026-11-21T12:36:10Z",
            "renewed_at": null, "released_at": null, "expires_at": "2026-11-21T12:36:40Z",
            "expires_in_ms": 30000});
        let lease: Lease = serde_json::from_value(old).unwrap();
        assert_eq!((lease.ttl_seconds, lease.expires_in_ms), (30, 30000));
        let new = serde_json::to_value(&lease).unwrap();
        assert_eq!(new["expiresInMs"], 30000);
        assert!(new.get("expires_in_ms").is_none());
        assert_eq!(serde_json::from_value::<Lease>(new).unwrap(), lease);
    }
}
