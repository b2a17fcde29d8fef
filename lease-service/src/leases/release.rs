//! Release: the holder ends its lease early, so the next holder need not wait out the TTL.
//! Single releases (by resource, or `DELETE /api/leases/{id}` by id) go through the release
//! group, the batch (`POST /api/leases/batch/release`) through the same `release_each` inside
//! its transaction. Unlike renew, a release may be a repeat whose first answer was lost: a
//! release that changed nothing is first checked, by reading only, for being such a repeat (so
//! it can never touch a newer lease), and refused with its reason only otherwise.

use diesel_async::{AsyncConnection, AsyncPgConnection};
use leasehold::ErrorCode;
use leasehold::api::{Lease, MAX_BATCH_RESOURCES, ReleaseLease, ReleaseResult};
use leasehold::server::coalesce::Coalescer;
use leasehold::server::{check_batch_size, validate_name};

use super::context::{GroupContext, group_failed};
use super::refusal::{refusal, secret_matches};
use super::{SecretPolicy, leases_left, to_api};
use crate::db;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::repo::{self, LeaseRow, Release};

/// `DELETE /api/leases/release` (and `DELETE /api/leases/{id}`, with `id`).
///
/// A release repeated by the same holder, with the same fence if it gave one, after the
/// lease was already released answers as the first did: its first answer may have been
/// lost. It reads, and writes nothing, so it can never touch a newer lease. A lease an
/// operator revoked was never released by its holder, so its holder is refused
/// (`lease_revoked`): a 200 would tell it that it held the lease to the end.
pub(super) async fn release(
    releases: &Coalescer<(), Release, Result<Lease, ApiError>>,
    context: &GroupContext,
    request: &ReleaseLease,
    id: Option<i64>,
) -> Result<Lease, ApiError> {
    let release = check_release(context.secrets, request, id)?;
    releases
        .submit((), release)
        .await
        .unwrap_or_else(group_failed)
}

/// A release's names and proof, checked.
fn check_release(
    secrets: SecretPolicy,
    request: &ReleaseLease,
    id: Option<i64>,
) -> Result<Release, ApiError> {
    validate_name("resource", &request.resource)?;
    validate_name("holder", &request.holder)?;
    Ok(Release {
        resource: request.resource.clone(),
        holder: request.holder.clone(),
        fence: request.fence,
        secret_hash: secrets.presented(request.secret.as_ref())?,
        id,
    })
}

pub(super) async fn release_group(
    context: GroupContext,
    items: Vec<Release>,
) -> Result<Vec<Result<Lease, ApiError>>, ApiError> {
    let mut conn = db::connection(&context.pool).await?;
    release_each(&mut conn, &context.metrics, &items).await
}

/// Releases in one statement, then judges each release that released nothing against the lease
/// as it now is: a repeat of a release that already happened (or of another release in the same
/// statement) answers as the first did, anything else is refused with its reason.
async fn release_each(
    conn: &mut AsyncPgConnection,
    metrics: &Metrics,
    items: &[Release],
) -> Result<Vec<Result<Lease, ApiError>>, ApiError> {
    let released = repo::release_each(conn, items).await?;
    // A failure of this read fails only the releases it was for.
    let current = leases_left(conn, items, &released).await;
    Ok(items
        .iter()
        .zip(released)
        .map(|(item, released)| {
            if let Some(row) = released {
                metrics.releases.inc();
                return Ok(to_api(row));
            }
            match &current {
                Ok(current) => {
                    judge_unreleased(metrics, item, current.get(&item.resource).cloned())
                }
                Err(err) => Err(err.clone()),
            }
        })
        .collect())
}

/// Why a release released nothing, given the lease on its resource as it is now.
fn judge_unreleased(
    metrics: &Metrics,
    item: &Release,
    current: Option<LeaseRow>,
) -> Result<Lease, ApiError> {
    if let (Some(id), Some(row)) = (item.id, &current)
        && row.id != id
    {
        return Err(ApiError::NotFound {
            code: ErrorCode::LeaseNotFound,
            message: format!("lease {id} is not the lease on {:?}", item.resource),
        });
    }
    if let Some(row) = &current
        && row.holder == item.holder
        && row.is_released()
        && !row.is_revoked()
        && item.fence.is_none_or(|fence| fence == row.fence)
        && secret_matches(row, item.secret_hash)
    {
        return Ok(to_api(row.clone()));
    }
    let refusal = refusal(
        "release",
        current,
        &item.holder,
        item.fence,
        item.secret_hash,
    );
    metrics
        .conflicts
        .with_label_values(&["release", refusal.code().as_str()])
        .inc();
    Err(refusal)
}

/// Many releases (`POST /api/leases/batch/release`) in one transaction, so one commit: one
/// statement releases every lease it can, then whatever it did not release is judged alone
/// (a refusal with its reason, or a repeated release answered as the first). Only a database
/// failure fails the whole batch, and then nothing was released.
pub async fn release_many(
    conn: &mut AsyncPgConnection,
    secrets: SecretPolicy,
    metrics: &Metrics,
    requests: &[ReleaseLease],
) -> Result<Vec<ReleaseResult>, ApiError> {
    check_batch_size("leases", "releases", requests.len(), MAX_BATCH_RESOURCES)?;
    let mut retry = leasehold::server::db::Contended::default();
    loop {
        let outcome = conn
            .transaction::<_, ApiError, _>(async |conn| {
                release_checked(conn, secrets, metrics, requests).await
            })
            .await;
        if !retry.again(&outcome).await {
            return outcome;
        }
    }
}

async fn release_checked(
    conn: &mut AsyncPgConnection,
    secrets: SecretPolicy,
    metrics: &Metrics,
    requests: &[ReleaseLease],
) -> Result<Vec<ReleaseResult>, ApiError> {
    use actix_web::ResponseError;
    let checked: Vec<Result<Release, ApiError>> = requests
        .iter()
        .map(|request| check_release(secrets, request, None))
        .collect();
    let eligible: Vec<Release> = checked
        .iter()
        .filter_map(|c| c.as_ref().ok().cloned())
        .collect();
    let mut outcomes = if eligible.is_empty() {
        Vec::new()
    } else {
        release_each(conn, metrics, &eligible).await?
    }
    .into_iter();
    Ok(requests
        .iter()
        .zip(checked)
        .map(|(request, checked)| {
            let outcome = match checked {
                Ok(_) => outcomes
                    .next()
                    .unwrap_or_else(|| Err(ApiError::Internal("not judged".to_owned()))),
                Err(err) => Err(err),
            };
            match outcome {
                Ok(lease) => ReleaseResult {
                    resource: request.resource.clone(),
                    status: 200,
                    lease: Some(lease),
                    error: None,
                },
                Err(err) => ReleaseResult {
                    resource: request.resource.clone(),
                    status: err.status_code().as_u16(),
                    lease: None,
                    error: Some(err.body()),
                },
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use chrono::Utc;
    use leasehold::api::{LeaseStatus, Secret};
    use leasehold::server::sha256;

    use super::*;
    use crate::leases::tests::row;

    fn release(fence: Option<i64>, secret: &str, id: Option<i64>) -> Release {
        Release {
            resource: "r".to_owned(),
            holder: "h".to_owned(),
            fence,
            secret_hash: Some(sha256(secret)),
            id,
        }
    }

    fn judged(item: &Release, current: Option<LeaseRow>) -> Result<LeaseStatus, ErrorCode> {
        let metrics = Metrics::new().unwrap();
        judge_unreleased(&metrics, item, current)
            .map(|lease| lease.status)
            .map_err(|err| err.code())
    }

    #[test]
    fn a_repeated_release_answers_as_the_first_did() {
        let released = Some(row(true, 5));
        assert_eq!(
            judged(&release(Some(9), "s", None), released.clone()),
            Ok(LeaseStatus::Released)
        );
        assert_eq!(
            judged(&release(None, "s", Some(1)), released),
            Ok(LeaseStatus::Released)
        );
    }

    #[test]
    fn a_release_that_is_not_a_repeat_is_refused_with_its_reason() {
        let released = Some(row(true, 5));
        let revoked = Some(LeaseRow {
            revoked_at: Some(Utc::now()),
            ..row(true, 5)
        });
        let cases = [
            (
                release(Some(9), "s", None),
                revoked,
                ErrorCode::LeaseRevoked,
            ),
            (
                release(Some(8), "s", None),
                released.clone(),
                ErrorCode::StaleFence,
            ),
            (
                release(Some(9), "x", None),
                released.clone(),
                ErrorCode::WrongSecret,
            ),
            (
                release(Some(9), "s", Some(2)),
                released,
                ErrorCode::LeaseNotFound,
            ),
            (
                release(Some(9), "s", None),
                Some(row(false, -1)),
                ErrorCode::LeaseExpired,
            ),
            (release(Some(9), "s", None), None, ErrorCode::LeaseNotFound),
        ];
        for (item, current, code) in cases {
            assert_eq!(judged(&item, current), Err(code), "{item:?}");
        }
    }

    #[test]
    fn a_refused_release_is_counted_by_its_reason() {
        let metrics = Metrics::new().unwrap();
        let refused = judge_unreleased(&metrics, &release(Some(8), "s", None), Some(row(true, 5)));
        assert!(refused.is_err());
        let counted = |code| {
            metrics
                .conflicts
                .with_label_values(&["release", code])
                .get()
        };
        assert_eq!((counted("stale_fence"), counted("not_holder")), (1, 0));
    }

    #[test]
    fn a_release_is_checked_before_it_reaches_the_database() {
        let request = |secret: Option<&str>| ReleaseLease {
            resource: "r".to_owned(),
            holder: "h".to_owned(),
            fence: Some(9),
            secret: secret.map(Secret::new),
        };
        let required = SecretPolicy { required: true };
        assert_eq!(
            check_release(required, &request(None), None)
                .err()
                .as_ref()
                .map(ApiError::code),
            Some(ErrorCode::SecretRequired)
        );
        let checked = check_release(required, &request(Some("s")), Some(4)).unwrap();
        assert_eq!(
            (checked.secret_hash, checked.id, checked.fence),
            (Some(sha256("s")), Some(4), Some(9))
        );
        let empty_holder = ReleaseLease {
            holder: String::new(),
            ..request(Some("s"))
        };
        assert!(check_release(required, &empty_holder, None).is_err());
    }
}
