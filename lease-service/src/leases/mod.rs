//! The lease rules: validation, and what each outcome of a statement means for the caller.
//! Plain functions over the repository, so the HTTP layer stays a thin translation.
//!
//! One module per operation, as mini-redis's `src/cmd/` has one per command, so that a change to
//! how a lease is renewed is made, reviewed and tested in `renew` without reading how one is
//! acquired: `acquire` (single, reentrant, batch), `renew`, `release` (single, by id, batch),
//! `revoke`, `check` (where acquisitions stand, for a lease covering many pieces of work) and `read` (one lease, a listing, the database's health). What they share lives here (the policies, the API view of a row, the read a
//! statement's leftovers are judged against), in `refusal` (why a row a statement did not change
//! refuses the request) and in `groups` (the coalescers single requests are served through). The
//! re-exports keep the paths the HTTP layer and the sweeper use, so the split changes no caller.

mod acquire;
mod check;
mod context;
mod groups;
pub mod read;
mod refusal;
mod release;
mod renew;
mod revoke;
mod wait;

use std::collections::HashMap;

use diesel_async::AsyncPgConnection;
use leasehold::ErrorCode;
use leasehold::api::{Lease, LeaseStatus, MAX_LEASE_METADATA_BYTES, Secret};
use leasehold::server::sha256;

use crate::error::ApiError;
use crate::repo::{self, LeaseRow, Release, Renewal};

pub use acquire::acquire_many;
pub use check::check_many;
pub use groups::Groups;
pub use read::get;
pub use release::release_many;
pub use revoke::revoke;
pub use wait::WAKEUP_CHANNEL;

use refusal::secret_required;

/// Whether renew, release and a reentrant acquire must present the lease's secret
/// (`LEASE_REQUIRE_SECRET`). When not required, a secret that is presented is still checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SecretPolicy {
    pub required: bool,
}

impl SecretPolicy {
    /// The digest of the presented secret, or a 400 when one is required and missing.
    fn presented(self, secret: Option<&Secret>) -> Result<Option<[u8; 32]>, ApiError> {
        match secret {
            Some(secret) => Ok(Some(sha256(secret.expose()))),
            None if self.required => Err(secret_required()),
            None => Ok(None),
        }
    }
}

/// A new acquisition's secret: 256 random bits, hex-encoded.
pub(crate) fn new_secret() -> String {
    Secret::random().expose().to_owned()
}

/// The TTLs a request may ask for, and the one it gets when it names none.
#[derive(Debug, Clone, Copy)]
pub struct TtlPolicy {
    pub default_seconds: i64,
    pub min_seconds: i64,
    pub max_seconds: i64,
}

impl TtlPolicy {
    fn resolve(self, requested: Option<i64>) -> Result<i32, ApiError> {
        let seconds = requested.unwrap_or(self.default_seconds);
        if !(self.min_seconds..=self.max_seconds).contains(&seconds) {
            return Err(ApiError::invalid(
                ErrorCode::InvalidTtl,
                "ttl_seconds",
                format!(
                    "ttl_seconds must be between {} and {}, got {seconds}",
                    self.min_seconds, self.max_seconds
                ),
            ));
        }
        i32::try_from(seconds).map_err(|_| {
            ApiError::invalid(
                ErrorCode::InvalidTtl,
                "ttl_seconds",
                "ttl_seconds is too large",
            )
        })
    }
}

/// A new acquisition answers 201, a reentrant one 200.
#[derive(Debug)]
pub enum AcquireOutcome {
    Acquired(Lease),
    Extended(Lease),
}

/// A request of a group, by the resource it touches.
trait OnResource {
    fn resource(&self) -> &str;
}

impl OnResource for Renewal {
    fn resource(&self) -> &str {
        &self.resource
    }
}

impl OnResource for Release {
    fn resource(&self) -> &str {
        &self.resource
    }
}

impl OnResource for repo::Want<'_> {
    fn resource(&self) -> &str {
        self.resource
    }
}

/// The leases now on the resources of the requests a group statement did nothing for
/// (`done[i]` is `None`), in any state, by resource: what those requests are judged against.
async fn leases_left<I: OnResource, D>(
    conn: &mut AsyncPgConnection,
    requests: &[I],
    done: &[Option<D>],
) -> Result<HashMap<String, LeaseRow>, ApiError> {
    let resources: Vec<&str> = requests
        .iter()
        .zip(done)
        .filter(|(_, done)| done.is_none())
        .map(|(request, _)| request.resource())
        .collect();
    if resources.is_empty() {
        return Ok(HashMap::new());
    }
    Ok(repo::find_by_resources(conn, &resources)
        .await?
        .into_iter()
        .map(|row| (row.resource.clone(), row))
        .collect())
}

/// Refuses metadata that is not a JSON object of at most [`MAX_LEASE_METADATA_BYTES`].
pub(crate) fn check_metadata(metadata: Option<&serde_json::Value>) -> Result<(), ApiError> {
    let Some(metadata) = metadata else {
        return Ok(());
    };
    if !metadata.is_object() {
        return Err(ApiError::invalid(
            ErrorCode::InvalidMetadata,
            "metadata",
            "metadata must be a JSON object",
        ));
    }
    if leasehold::server::contains_nul(metadata) {
        return Err(ApiError::invalid(
            ErrorCode::InvalidMetadata,
            "metadata",
            "metadata must not contain NUL characters",
        ));
    }
    let bytes = metadata.to_string().len();
    if bytes > MAX_LEASE_METADATA_BYTES {
        return Err(ApiError::invalid(
            ErrorCode::InvalidMetadata,
            "metadata",
            format!("metadata is {bytes} bytes of JSON; at most {MAX_LEASE_METADATA_BYTES}"),
        ));
    }
    Ok(())
}

/// The API's view of a row, with status and time left judged by the database's clock.
pub fn to_api(row: LeaseRow) -> Lease {
    let status = if row.is_revoked() {
        LeaseStatus::Revoked
    } else if row.is_released() {
        LeaseStatus::Released
    } else if row.is_expired() {
        LeaseStatus::Expired
    } else {
        LeaseStatus::Active
    };
    let expires_in_ms = match status {
        LeaseStatus::Active => (row.expires_at - row.db_now).num_milliseconds().max(0),
        LeaseStatus::Expired | LeaseStatus::Released | LeaseStatus::Revoked => 0,
    };
    Lease {
        id: row.id,
        resource: row.resource,
        holder: row.holder,
        fence: row.fence,
        ttl_seconds: row.ttl_seconds,
        status,
        created_at: row.created_at,
        renewed_at: row.renewed_at,
        released_at: row.released_at,
        expires_at: row.expires_at,
        expires_in_ms,
        secret: None,
        metadata: row.metadata,
    }
}

#[cfg(test)]
mod tests {
    use chrono::{Duration, Utc};
    use leasehold::server::validate_name;

    use super::*;

    /// A lease on `r` held by `h` with fence 9 and the secret `s`, judged at its own `db_now`.
    pub(super) fn row(released: bool, expires_in_seconds: i64) -> LeaseRow {
        let now = Utc::now();
        LeaseRow {
            id: 1,
            resource: "r".to_owned(),
            holder: "h".to_owned(),
            fence: 9,
            ttl_seconds: 30,
            created_at: now,
            renewed_at: None,
            released_at: released.then_some(now),
            revoked_at: None,
            expires_at: now + Duration::seconds(expires_in_seconds),
            db_now: now,
            secret_hash: Some(sha256("s").to_vec()),
            metadata: None,
            takeover_at: now + Duration::seconds(expires_in_seconds),
        }
    }

    #[test]
    fn names_must_be_non_empty_short_and_printable() {
        assert!(validate_name("resource", "task-1").is_ok());
        // Counted in characters, as JSON Schema's maxLength counts them.
        assert!(validate_name("resource", &"é".repeat(512)).is_ok());
        for bad in ["", "a\u{0}b", "line\nbreak", &"é".repeat(513)] {
            let err = validate_name("holder", bad).err();
            assert!(
                matches!(
                    err,
                    Some(ApiError::Invalid {
                        code: ErrorCode::InvalidField,
                        field: Some("holder"),
                        ..
                    })
                ),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn status_and_time_left_come_from_the_database_clock() {
        let active = to_api(row(false, 5));
        assert_eq!(
            (active.status, active.expires_in_ms),
            (LeaseStatus::Active, 5000)
        );
        let expired = to_api(row(false, 0));
        assert_eq!(
            (expired.status, expired.expires_in_ms),
            (LeaseStatus::Expired, 0)
        );
        let released = to_api(row(true, 5));
        assert_eq!(
            (released.status, released.expires_in_ms),
            (LeaseStatus::Released, 0)
        );
        let revoked = to_api(LeaseRow {
            revoked_at: Some(Utc::now()),
            ..row(true, 5)
        });
        assert_eq!(
            (revoked.status, revoked.expires_in_ms),
            (LeaseStatus::Revoked, 0)
        );
    }

    #[test]
    fn a_required_secret_must_be_presented_and_a_presented_one_is_always_hashed() {
        let required = SecretPolicy { required: true };
        let optional = SecretPolicy { required: false };
        assert_eq!(
            required.presented(None).err().as_ref().map(ApiError::code),
            Some(ErrorCode::SecretRequired)
        );
        assert_eq!(optional.presented(None).ok(), Some(None));
        let secret = Secret::new("s");
        for policy in [required, optional] {
            assert_eq!(
                policy.presented(Some(&secret)).ok(),
                Some(Some(sha256("s")))
            );
        }
    }

    #[test]
    fn ttl_defaults_and_bounds() {
        let policy = TtlPolicy {
            default_seconds: 30,
            min_seconds: 1,
            max_seconds: 3600,
        };
        assert_eq!(policy.resolve(None).ok(), Some(30));
        assert_eq!(policy.resolve(Some(1)).ok(), Some(1));
        assert_eq!(policy.resolve(Some(3600)).ok(), Some(3600));
        assert!(policy.resolve(Some(0)).is_err());
        assert!(policy.resolve(Some(3601)).is_err());
        assert!(policy.resolve(Some(i64::MAX)).is_err());
    }
}
