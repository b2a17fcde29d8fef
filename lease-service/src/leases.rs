//! The lease rules: validation, and what each outcome of a statement means for the caller.
//! Plain functions over the repository, so the HTTP layer stays a thin translation.

use diesel_async::AsyncPgConnection;
use rand::Rng;
use shared::api::{
    AcquireLease, AcquireLeases, AcquiredLeases, HeldLease, Lease, LeaseStatus,
    MAX_BATCH_RESOURCES, ReleaseLease, ReleaseResult, RenewLease, Secret,
};
use shared::server::{check_batch_size, first_duplicate, sha256, validate_name};

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::repo::{self, AcquireProof, Acquired, LeaseRow};

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

fn secret_required() -> ApiError {
    ApiError::invalid(
        "secret_required",
        "secret",
        "this lease-service requires proof of holding: send the `secret` your acquire answered with",
    )
}

/// A new acquisition's secret: 256 random bits, hex-encoded.
pub(crate) fn new_secret() -> String {
    let bytes: [u8; 32] = rand::rng().random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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
                "invalid_ttl",
                "ttl_seconds",
                format!(
                    "ttl_seconds must be between {} and {}, got {seconds}",
                    self.min_seconds, self.max_seconds
                ),
            ));
        }
        i32::try_from(seconds).map_err(|_| {
            ApiError::invalid("invalid_ttl", "ttl_seconds", "ttl_seconds is too large")
        })
    }
}

/// A new acquisition answers 201, a reentrant one 200.
#[derive(Debug)]
pub enum AcquireOutcome {
    Acquired(Lease),
    Extended(Lease),
}

pub async fn acquire(
    conn: &mut AsyncPgConnection,
    ttl: TtlPolicy,
    secrets: SecretPolicy,
    metrics: &Metrics,
    request: &AcquireLease,
) -> Result<AcquireOutcome, ApiError> {
    validate_name("resource", &request.resource)?;
    validate_name("holder", &request.holder)?;
    let ttl_seconds = ttl.resolve(request.ttl_seconds)?;
    let secret = new_secret();
    let new_secret_hash = sha256(&secret);
    // Only a reentrant acquire needs proof, and whether it is one is known only inside the
    // statement: a missing secret is refused there, not here.
    let presented = request.secret.as_ref().map(|s| sha256(s.expose()));
    let proof = AcquireProof {
        new_secret_hash: &new_secret_hash,
        presented_hash: presented.as_ref().map(<[u8; 32]>::as_slice),
        require_secret: secrets.required,
    };
    match repo::acquire(conn, &request.resource, &request.holder, ttl_seconds, proof).await? {
        Acquired::New(row) => {
            metrics.acquisitions.with_label_values(&["new"]).inc();
            let mut lease = to_api(row);
            lease.secret = Some(Secret::new(secret));
            Ok(AcquireOutcome::Acquired(lease))
        }
        Acquired::Reentrant(row) => {
            metrics.acquisitions.with_label_values(&["reentrant"]).inc();
            let mut lease = to_api(row);
            // The statement checked it, so handing it back tells the caller nothing new.
            lease.secret.clone_from(&request.secret);
            Ok(AcquireOutcome::Extended(lease))
        }
        Acquired::Held(current) if current.holder == request.holder => {
            // The holder's own live lease, without proof of holding it.
            let refusal = if request.secret.is_none() && secrets.required {
                secret_required()
            } else {
                wrong_secret("acquire")
            };
            metrics
                .conflicts
                .with_label_values(&["acquire", refusal.code()])
                .inc();
            Err(refusal)
        }
        Acquired::Held(current) => {
            metrics
                .conflicts
                .with_label_values(&["acquire", "lease_held"])
                .inc();
            Err(held(current))
        }
        Acquired::Contended => Err(ApiError::Unavailable(format!(
            "lease on {:?} is changing hands; try again",
            request.resource
        ))),
    }
}

/// Acquires many resources in one statement (`POST /api/leases/batch`), for one holder or for
/// a holder each.
pub async fn acquire_many(
    conn: &mut AsyncPgConnection,
    ttl: TtlPolicy,
    secrets: SecretPolicy,
    metrics: &Metrics,
    request: &AcquireLeases,
) -> Result<AcquiredLeases, ApiError> {
    check_batch_size(
        "resources",
        "resources",
        request.resources.len(),
        MAX_BATCH_RESOURCES,
    )?;
    for resource in &request.resources {
        validate_name("resource", resource)?;
    }
    if let Some(resource) = first_duplicate(&request.resources) {
        return Err(ApiError::invalid(
            "duplicate_resource",
            "resources",
            format!("resource {resource:?} is listed twice"),
        ));
    }
    let holders: Vec<&str> = match (&request.holder, &request.holders) {
        (Some(holder), None) => {
            validate_name("holder", holder)?;
            request.resources.iter().map(|_| holder.as_str()).collect()
        }
        (None, Some(holders)) => {
            if holders.len() != request.resources.len() {
                return Err(ApiError::invalid(
                    "invalid_batch",
                    "holders",
                    format!(
                        "holders must name one holder per resource: {} holders for {} resources",
                        holders.len(),
                        request.resources.len()
                    ),
                ));
            }
            for holder in holders {
                validate_name("holders", holder)?;
            }
            holders.iter().map(String::as_str).collect()
        }
        (None, None) => {
            return Err(ApiError::invalid(
                "missing_field",
                "holder",
                "missing field `holder` (or `holders`, one per resource)",
            ));
        }
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "invalid_batch",
                "holders",
                "give either `holder` or `holders`, not both",
            ));
        }
    };
    let ttl_seconds = ttl.resolve(request.ttl_seconds)?;
    let new_secrets: Vec<String> = request.resources.iter().map(|_| new_secret()).collect();
    let hashes: Vec<Vec<u8>> = new_secrets.iter().map(|s| sha256(s).to_vec()).collect();
    let rows = repo::acquire_many(
        conn,
        &request.resources,
        &holders,
        ttl_seconds,
        &hashes,
        secrets.required,
    )
    .await?;
    let mut answer = AcquiredLeases {
        acquired: Vec::new(),
        extended: Vec::new(),
        held: Vec::new(),
    };
    for (row, fresh) in rows {
        if fresh {
            let index = request.resources.iter().position(|r| *r == row.resource);
            let mut lease = to_api(row);
            lease.secret = index
                .and_then(|i| new_secrets.get(i))
                .cloned()
                .map(Secret::new);
            answer.acquired.push(lease);
        } else {
            answer.extended.push(to_api(row));
        }
    }
    let taken = answer.acquired.len() + answer.extended.len();
    if taken < request.resources.len() {
        let missing: Vec<String> = request
            .resources
            .iter()
            .filter(|r| {
                !answer.acquired.iter().any(|l| l.resource == **r)
                    && !answer.extended.iter().any(|l| l.resource == **r)
            })
            .cloned()
            .collect();
        for row in repo::find_active(conn, &missing).await? {
            answer.held.push(HeldLease {
                expires_in_ms: (row.expires_at - row.db_now).num_milliseconds().max(0),
                resource: row.resource,
                holder: row.holder,
                expires_at: row.expires_at,
            });
        }
    }
    let count = |n: usize| u64::try_from(n).unwrap_or(0);
    metrics
        .acquisitions
        .with_label_values(&["new"])
        .inc_by(count(answer.acquired.len()));
    metrics
        .acquisitions
        .with_label_values(&["reentrant"])
        .inc_by(count(answer.extended.len()));
    metrics
        .conflicts
        .with_label_values(&["acquire", "lease_held"])
        .inc_by(count(answer.held.len()));
    Ok(answer)
}

pub async fn renew(
    conn: &mut AsyncPgConnection,
    ttl: TtlPolicy,
    secrets: SecretPolicy,
    metrics: &Metrics,
    request: &RenewLease,
) -> Result<Lease, ApiError> {
    validate_name("resource", &request.resource)?;
    validate_name("holder", &request.holder)?;
    let presented = secrets.presented(request.secret.as_ref())?;
    let ttl_seconds = request
        .ttl_seconds
        .map(|seconds| ttl.resolve(Some(seconds)))
        .transpose()?;
    let renewed = repo::renew(
        conn,
        &request.resource,
        &request.holder,
        request.fence,
        presented.as_ref().map(<[u8; 32]>::as_slice),
        ttl_seconds,
    )
    .await?;
    if let Some(row) = renewed {
        metrics.renewals.inc();
        return Ok(to_api(row));
    }
    let current = repo::find_by_resource(conn, &request.resource).await?;
    let refusal = refusal("renew", current, &request.holder, request.fence, presented);
    metrics
        .conflicts
        .with_label_values(&["renew", refusal.code()])
        .inc();
    Err(refusal)
}

/// Releases the holder's lease (by resource, and by id when `id` is given).
///
/// A release repeated by the same holder, with the same fence if it gave one, after the lease
/// was already released answers as the first did: its first answer may have been lost. It reads,
/// and writes nothing, so it can never touch a newer lease.
pub async fn release(
    conn: &mut AsyncPgConnection,
    secrets: SecretPolicy,
    metrics: &Metrics,
    request: &ReleaseLease,
    id: Option<i64>,
) -> Result<Lease, ApiError> {
    validate_name("resource", &request.resource)?;
    validate_name("holder", &request.holder)?;
    let presented = secrets.presented(request.secret.as_ref())?;
    let released = repo::release(
        conn,
        &request.resource,
        &request.holder,
        request.fence,
        presented.as_ref().map(<[u8; 32]>::as_slice),
        id,
    )
    .await?;
    if let Some(row) = released {
        metrics.releases.inc();
        return Ok(to_api(row));
    }
    let current = repo::find_by_resource(conn, &request.resource).await?;
    if let (Some(id), Some(row)) = (id, &current)
        && row.id != id
    {
        return Err(ApiError::NotFound {
            code: "lease_not_found",
            message: format!("lease {id} is not the lease on {:?}", request.resource),
        });
    }
    if let Some(row) = &current
        && row.holder == request.holder
        && row.is_released()
        && request.fence.is_none_or(|fence| fence == row.fence)
        && secret_matches(row, presented)
    {
        return Ok(to_api(row.clone()));
    }
    let refusal = refusal(
        "release",
        current,
        &request.holder,
        request.fence,
        presented,
    );
    metrics
        .conflicts
        .with_label_values(&["release", refusal.code()])
        .inc();
    Err(refusal)
}

/// Many releases (`POST /api/leases/batch/release`), to run inside one transaction: one
/// statement releases every lease it can, then whatever it did not release is judged alone by
/// [`release`] (a refusal with its reason, or a repeated release answered as the first). Only a
/// database failure fails the whole batch.
pub async fn release_many(
    conn: &mut AsyncPgConnection,
    secrets: SecretPolicy,
    metrics: &Metrics,
    requests: &[ReleaseLease],
) -> Result<Vec<ReleaseResult>, ApiError> {
    use actix_web::ResponseError;
    check_batch_size("leases", "releases", requests.len(), MAX_BATCH_RESOURCES)?;
    let refused = |request: &ReleaseLease, err: &ApiError| ReleaseResult {
        resource: request.resource.clone(),
        status: err.status_code().as_u16(),
        lease: None,
        error: Some(err.body()),
    };
    let released = |request: &ReleaseLease, lease: Lease| ReleaseResult {
        resource: request.resource.clone(),
        status: 200,
        lease: Some(lease),
        error: None,
    };
    let mut results: Vec<Option<ReleaseResult>> = requests.iter().map(|_| None).collect();
    let mut eligible: Vec<(usize, Option<[u8; 32]>)> = Vec::new();
    for (index, request) in requests.iter().enumerate() {
        let checked = validate_name("resource", &request.resource)
            .and_then(|()| validate_name("holder", &request.holder))
            .and_then(|()| secrets.presented(request.secret.as_ref()));
        match checked {
            Ok(digest) => eligible.push((index, digest)),
            Err(err) => results[index] = Some(refused(request, &err)),
        }
    }
    let resources: Vec<&str> = eligible
        .iter()
        .map(|(i, _)| requests[*i].resource.as_str())
        .collect();
    let holders: Vec<&str> = eligible
        .iter()
        .map(|(i, _)| requests[*i].holder.as_str())
        .collect();
    let fences: Vec<Option<i64>> = eligible.iter().map(|(i, _)| requests[*i].fence).collect();
    let digests: Vec<Option<Vec<u8>>> = eligible
        .iter()
        .map(|(_, digest)| digest.map(|d| d.to_vec()))
        .collect();
    if !eligible.is_empty() {
        for row in repo::release_many(conn, &resources, &holders, &fences, &digests).await? {
            let matching = eligible.iter().find(|(i, _)| {
                results[*i].is_none()
                    && requests[*i].resource == row.resource
                    && requests[*i].holder == row.holder
            });
            if let Some((index, _)) = matching {
                metrics.releases.inc();
                results[*index] = Some(released(&requests[*index], to_api(row)));
            }
        }
    }
    for (index, _) in &eligible {
        if results[*index].is_some() {
            continue;
        }
        let request = &requests[*index];
        results[*index] = Some(match release(conn, secrets, metrics, request, None).await {
            Ok(lease) => released(request, lease),
            Err(err) if err.status_code().is_client_error() => refused(request, &err),
            Err(err) => return Err(err),
        });
    }
    Ok(results
        .into_iter()
        .zip(requests)
        .map(|(result, request)| {
            result.unwrap_or_else(|| refused(request, &ApiError::Internal("not judged".to_owned())))
        })
        .collect())
}

/// An operator's release of lease `id`, whoever holds it (`POST /api/leases/{id}/revoke`).
/// Revoking a lease that already ended answers it as it is: the outcome asked for holds.
pub async fn revoke(
    conn: &mut AsyncPgConnection,
    metrics: &Metrics,
    id: i64,
) -> Result<Lease, ApiError> {
    if let Some(row) = repo::revoke(conn, id).await? {
        metrics.releases.inc();
        tracing::warn!(lease.id = id, lease.resource = %row.resource, lease.holder = %row.holder, lease.fence = row.fence, "lease revoked by an operator");
        return Ok(to_api(row));
    }
    get(conn, id).await
}

pub async fn get(conn: &mut AsyncPgConnection, id: i64) -> Result<Lease, ApiError> {
    repo::find_by_id(conn, id)
        .await?
        .map(to_api)
        .ok_or_else(|| ApiError::NotFound {
            code: "lease_not_found",
            message: format!("no lease with id {id}"),
        })
}

/// Whether the presented secret's digest (if any) is the lease's.
fn secret_matches(row: &LeaseRow, presented: Option<[u8; 32]>) -> bool {
    presented.is_none_or(|hash| row.secret_hash.as_deref() == Some(hash.as_slice()))
}

fn wrong_secret(operation: &str) -> ApiError {
    ApiError::Conflict {
        code: "wrong_secret",
        message: format!("cannot {operation}: the secret is not this lease's"),
    }
}

/// Why a renew or release by `holder` (with `fence` and a secret's digest) changed nothing,
/// given the lease as it is.
fn refusal(
    operation: &str,
    current: Option<LeaseRow>,
    holder: &str,
    fence: Option<i64>,
    presented: Option<[u8; 32]>,
) -> ApiError {
    let Some(row) = current else {
        return ApiError::NotFound {
            code: "lease_not_found",
            message: "no lease exists for that resource".to_owned(),
        };
    };
    let (code, message) = if row.holder != holder {
        (
            "not_holder",
            format!("cannot {operation}: the lease is held by {:?}", row.holder),
        )
    } else if fence.is_some_and(|fence| fence != row.fence) {
        (
            "stale_fence",
            format!(
                "cannot {operation}: fence {} is not the current fence {}",
                fence.unwrap_or_default(),
                row.fence
            ),
        )
    } else if !secret_matches(&row, presented) {
        return wrong_secret(operation);
    } else if row.is_released() {
        (
            "lease_released",
            format!("cannot {operation}: the lease was released"),
        )
    } else {
        (
            "lease_expired",
            format!("cannot {operation}: the lease expired"),
        )
    };
    ApiError::Conflict { code, message }
}

fn held(current: LeaseRow) -> ApiError {
    let expires_in_ms = (current.expires_at - current.db_now)
        .num_milliseconds()
        .max(0);
    ApiError::Held {
        resource: current.resource,
        holder: current.holder,
        expires_at: current.expires_at,
        expires_in_ms,
    }
}

/// The API's view of a row, with status and time left judged by the database's clock.
pub fn to_api(row: LeaseRow) -> Lease {
    let status = if row.is_released() {
        LeaseStatus::Released
    } else if row.is_expired() {
        LeaseStatus::Expired
    } else {
        LeaseStatus::Active
    };
    let expires_in_ms = match status {
        LeaseStatus::Active => (row.expires_at - row.db_now).num_milliseconds().max(0),
        LeaseStatus::Expired | LeaseStatus::Released => 0,
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
    }
}

#[cfg(test)]
mod tests {
    use chrono::{Duration, Utc};

    use super::*;

    fn row(released: bool, expires_in_seconds: i64) -> LeaseRow {
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
            expires_at: now + Duration::seconds(expires_in_seconds),
            db_now: now,
            secret_hash: Some(sha256("s").to_vec()),
        }
    }

    #[test]
    fn names_must_be_non_empty_short_and_printable() {
        assert!(validate_name("resource", "task-1").is_ok());
        assert!(validate_name("resource", &"é".repeat(256)).is_ok()); // 512 bytes
        for bad in ["", "a\u{0}b", "line\nbreak", &"é".repeat(257)] {
            let err = validate_name("holder", bad).err();
            assert!(
                matches!(
                    err,
                    Some(ApiError::Invalid {
                        code: "invalid_field",
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
    }

    #[test]
    fn refusals_name_the_first_reason_that_applies() {
        let code = |current: Option<LeaseRow>, holder: &str, fence: Option<i64>| {
            refusal("renew", current, holder, fence, Some(sha256("s"))).code()
        };
        assert_eq!(code(None, "h", None), "lease_not_found");
        assert_eq!(code(Some(row(false, 5)), "other", Some(9)), "not_holder");
        assert_eq!(code(Some(row(false, 5)), "h", Some(8)), "stale_fence");
        assert_eq!(code(Some(row(true, 5)), "h", Some(9)), "lease_released");
        assert_eq!(code(Some(row(false, -1)), "h", None), "lease_expired");
        let wrong = refusal(
            "renew",
            Some(row(false, 5)),
            "h",
            Some(9),
            Some(sha256("x")),
        );
        assert_eq!(wrong.code(), "wrong_secret");
        let stale_first = refusal(
            "renew",
            Some(row(false, 5)),
            "h",
            Some(8),
            Some(sha256("x")),
        );
        assert_eq!(stale_first.code(), "stale_fence");
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
