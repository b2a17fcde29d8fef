//! Acquire: take the lease on a resource for a holder, or extend it when that holder already
//! holds it and proves so (reentrant). A single acquire presenting no secret joins the acquire
//! group; one presenting a secret runs alone, because whether it is reentrant, and so whether its
//! secret must match, is known only inside its statement. The batch (`POST /api/leases/batch`)
//! goes through the same `acquire_each` as a group, so a batch member and a lone request get the
//! same answer for the same row: one statement takes every row it may, one read finds who holds
//! the rest, and only a lease that ended between the two is tried again alone, so a lease that is
//! just ending is never reported as held.

use diesel_async::AsyncPgConnection;
use leasehold::ErrorCode;
use leasehold::api::{
    AcquireLease, AcquireLeases, AcquiredLeases, HeldLease, MAX_BATCH_RESOURCES, MAX_NAME_CHARS,
    MIN_OWN_SECRET_CHARS, Secret,
};
use leasehold::server::coalesce::Coalescer;
use leasehold::server::{check_batch_size, first_duplicate, sha256, validate_name};

use super::context::{GroupContext, group_failed};
use super::refusal::{held, secret_required, wrong_secret};
use super::{
    AcquireOutcome, OnResource, SecretPolicy, TtlPolicy, check_metadata, leases_left, new_secret,
    to_api,
};
use crate::db;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::repo::{self, AcquireProof, Acquired};

/// A single acquire without a secret, checked, waiting for its group.
#[derive(Debug, Clone)]
pub(super) struct Acquisition {
    resource: String,
    holder: String,
    ttl_seconds: i32,
    /// The new secret, handed to the caller if the acquisition is new, and its digest.
    secret: String,
    secret_hash: [u8; 32],
}

impl OnResource for Acquisition {
    fn resource(&self) -> &str {
        &self.resource
    }
}

/// `POST /api/leases`.
pub(super) async fn acquire(
    acquires: &Coalescer<(), Acquisition, Result<AcquireOutcome, ApiError>>,
    context: &GroupContext,
    request: &AcquireLease,
) -> Result<AcquireOutcome, ApiError> {
    let GroupContext {
        ttl,
        secrets,
        metrics,
        ..
    } = context;
    validate_name("resource", &request.resource)?;
    validate_name("holder", &request.holder)?;
    let ttl_seconds = ttl.resolve(request.ttl_seconds)?;
    check_metadata(request.metadata.as_ref())?;
    // A presented secret is the holder's own: a reentrant acquire must match it, and a new
    // acquisition keeps it, so a holder whose answer was lost still holds its proof.
    let secret = match &request.secret {
        Some(presented) => {
            check_own_secret(presented)?;
            presented.expose().to_owned()
        }
        None => new_secret(),
    };
    let secret_hash = sha256(&secret);
    // The group statement carries no metadata: an acquire that sets some runs alone.
    if request.secret.is_none() && request.metadata.is_none() && !repo::acquire_is_broken() {
        let acquisition = Acquisition {
            resource: request.resource.clone(),
            holder: request.holder.clone(),
            ttl_seconds,
            secret,
            secret_hash,
        };
        return acquires
            .submit((), acquisition)
            .await
            .unwrap_or_else(group_failed);
    }
    // Only a reentrant acquire needs proof, and whether it is one is known only inside the
    // statement: a wrong secret is refused there, not here.
    let proof = AcquireProof {
        new_secret_hash: &secret_hash,
        presented_hash: request.secret.is_some().then_some(secret_hash.as_slice()),
        require_secret: secrets.required,
    };
    let mut conn = db::connection(&context.pool).await?;
    let acquired = repo::acquire(
        &mut conn,
        &request.resource,
        &request.holder,
        ttl_seconds,
        proof,
        request.metadata.as_ref(),
    )
    .await?;
    answer_acquire(
        *secrets,
        metrics,
        (&request.resource, &request.holder),
        request.secret.as_ref(),
        secret,
        acquired,
    )
}

/// A secret an acquire presents may become the lease's (a new acquisition keeps it), so it must
/// be as hard to guess as one lease-service draws: at least [`MIN_OWN_SECRET_CHARS`].
fn check_own_secret(secret: &Secret) -> Result<(), ApiError> {
    let chars = secret.expose().chars().count();
    if (MIN_OWN_SECRET_CHARS..=MAX_NAME_CHARS).contains(&chars) {
        return Ok(());
    }
    Err(ApiError::invalid(
        ErrorCode::InvalidSecret,
        "secret",
        format!(
            "an acquire's secret must be {MIN_OWN_SECRET_CHARS} to {MAX_NAME_CHARS} characters, got {chars}"
        ),
    ))
}

pub(super) async fn acquire_group(
    context: GroupContext,
    items: Vec<Acquisition>,
) -> Result<Vec<Result<AcquireOutcome, ApiError>>, ApiError> {
    let mut conn = db::connection(&context.pool).await?;
    let wants: Vec<repo::Want<'_>> = items
        .iter()
        .map(|a| repo::Want {
            resource: &a.resource,
            holder: &a.holder,
            ttl_seconds: a.ttl_seconds,
            new_secret_hash: &a.secret_hash,
            metadata: None,
        })
        .collect();
    let acquired = acquire_each(&mut conn, &wants, context.secrets.required).await?;
    Ok(items
        .iter()
        .zip(acquired)
        .map(|(item, acquired)| {
            answer_acquire(
                context.secrets,
                &context.metrics,
                (&item.resource, &item.holder),
                None,
                item.secret.clone(),
                acquired?,
            )
        })
        .collect())
}

/// Acquires each want (distinct resources) as [`repo::acquire`] would alone: one statement takes
/// every row it may, one read finds who holds the rest, and only a resource whose lease ended
/// in between is tried again alone. Once the statement has committed, a want it served keeps its
/// answer even if the read for the others fails: only those fail.
async fn acquire_each(
    conn: &mut AsyncPgConnection,
    wants: &[repo::Want<'_>],
    require_secret: bool,
) -> Result<Vec<Result<Acquired, ApiError>>, ApiError> {
    let taken = repo::take_each(conn, wants, require_secret).await?;
    let mut current = leases_left(conn, wants, &taken).await;
    let mut answers = Vec::with_capacity(wants.len());
    for (want, taken) in wants.iter().zip(taken) {
        answers.push(match (taken, &mut current) {
            (Some(acquired), _) => Ok(acquired),
            (None, Err(err)) => Err(err.clone()),
            (None, Ok(current)) => match current.remove(want.resource) {
                Some(row) if row.keeps_others_out() => Ok(Acquired::Held(row)),
                // It ended between the two statements: try it again, alone.
                _ => {
                    let proof = AcquireProof {
                        new_secret_hash: want.new_secret_hash,
                        presented_hash: None,
                        require_secret,
                    };
                    repo::acquire(
                        conn,
                        want.resource,
                        want.holder,
                        want.ttl_seconds,
                        proof,
                        want.metadata,
                    )
                    .await
                    .map_err(ApiError::from)
                }
            },
        });
    }
    Ok(answers)
}

/// An acquire's answer, given what its statement did: `presented` is the secret the request
/// proved a reentrant acquire with (if any), `secret` the one a new acquisition gets.
fn answer_acquire(
    secrets: SecretPolicy,
    metrics: &Metrics,
    (resource, holder): (&str, &str),
    presented: Option<&Secret>,
    secret: String,
    acquired: Acquired,
) -> Result<AcquireOutcome, ApiError> {
    match acquired {
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
            lease.secret = presented.cloned();
            Ok(AcquireOutcome::Extended(lease))
        }
        Acquired::Held(current) if current.holder == holder => {
            // The holder's own live lease, without proof of holding it.
            let refusal = if presented.is_none() && secrets.required {
                secret_required()
            } else {
                wrong_secret("acquire")
            };
            metrics
                .conflicts
                .with_label_values(&["acquire", refusal.code().as_str()])
                .inc();
            Err(refusal)
        }
        Acquired::Held(current) => {
            metrics
                .conflicts
                .with_label_values(&["acquire", ErrorCode::LeaseHeld.as_str()])
                .inc();
            Err(held(current))
        }
        Acquired::Contended => Err(ApiError::Unavailable(format!(
            "lease on {resource:?} is changing hands; try again"
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
    let holders = batch_holders(request)?;
    let ttl_seconds = ttl.resolve(request.ttl_seconds)?;
    check_metadata(request.metadata.as_ref())?;
    let new_secrets: Vec<String> = request.resources.iter().map(|_| new_secret()).collect();
    let hashes: Vec<[u8; 32]> = new_secrets.iter().map(|s| sha256(s)).collect();
    let wants: Vec<repo::Want<'_>> = request
        .resources
        .iter()
        .zip(&holders)
        .zip(&hashes)
        .map(|((resource, holder), hash)| repo::Want {
            resource,
            holder,
            ttl_seconds,
            new_secret_hash: hash,
            metadata: request.metadata.as_ref(),
        })
        .collect();
    let acquired = acquire_each(conn, &wants, secrets.required).await?;
    let mut answer = AcquiredLeases {
        acquired: Vec::new(),
        extended: Vec::new(),
        held: Vec::new(),
    };
    // One answer for the batch: a member that failed fails it.
    for (acquired, secret) in acquired.into_iter().zip(new_secrets) {
        match acquired? {
            Acquired::New(row) => {
                let mut lease = to_api(row);
                lease.secret = Some(Secret::new(secret));
                answer.acquired.push(lease);
            }
            Acquired::Reentrant(row) => answer.extended.push(to_api(row)),
            Acquired::Held(row) => answer.held.push(HeldLease {
                expires_in_ms: (row.expires_at - row.db_now).num_milliseconds().max(0),
                resource: row.resource,
                holder: row.holder,
                expires_at: row.expires_at,
            }),
            // Changing hands as we looked: in none of the lists, as the answer's docs allow.
            Acquired::Contended => {}
        }
    }
    count_batch(metrics, &answer);
    Ok(answer)
}

/// A batch acquire's resources checked (names, no repeats) and its holder for each: `holder`
/// for all, or `holders` one per resource.
fn batch_holders(request: &AcquireLeases) -> Result<Vec<&str>, ApiError> {
    for resource in &request.resources {
        validate_name("resource", resource)?;
    }
    if let Some(resource) = first_duplicate(&request.resources) {
        return Err(ApiError::invalid(
            ErrorCode::DuplicateResource,
            "resources",
            format!("resource {resource:?} is listed twice"),
        ));
    }
    Ok(match (&request.holder, &request.holders) {
        (Some(holder), None) => {
            validate_name("holder", holder)?;
            request.resources.iter().map(|_| holder.as_str()).collect()
        }
        (None, Some(holders)) => {
            if holders.len() != request.resources.len() {
                return Err(ApiError::invalid(
                    ErrorCode::InvalidBatch,
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
                ErrorCode::MissingField,
                "holder",
                "missing field `holder` (or `holders`, one per resource)",
            ));
        }
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                ErrorCode::InvalidBatch,
                "holders",
                "give either `holder` or `holders`, not both",
            ));
        }
    })
}

/// Counts a batch's acquisitions, reentrant acquires and refusals.
fn count_batch(metrics: &Metrics, answer: &AcquiredLeases) {
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
        .with_label_values(&["acquire", ErrorCode::LeaseHeld.as_str()])
        .inc_by(count(answer.held.len()));
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::leases::tests::row;

    /// The answer to an acquire of `r` by `holder` whose statement did `acquired`: its kind and
    /// the secret it hands back (a new acquisition's is "new"), or the refusal's code.
    fn answer(
        required: bool,
        holder: &str,
        presented: Option<&str>,
        acquired: Acquired,
    ) -> Result<(&'static str, Option<String>), ErrorCode> {
        let metrics = Metrics::new().unwrap();
        let presented = presented.map(Secret::new);
        answer_acquire(
            SecretPolicy { required },
            &metrics,
            ("r", holder),
            presented.as_ref(),
            "new".to_owned(),
            acquired,
        )
        .map(|outcome| match outcome {
            AcquireOutcome::Acquired(lease) => {
                ("acquired", lease.secret.map(|s| s.expose().to_owned()))
            }
            AcquireOutcome::Extended(lease) => {
                ("extended", lease.secret.map(|s| s.expose().to_owned()))
            }
        })
        .map_err(|err| err.code())
    }

    #[test]
    fn a_new_lease_gets_the_new_secret_and_a_reentrant_one_keeps_its_own() {
        assert_eq!(
            answer(false, "h", None, Acquired::New(row(false, 5))),
            Ok(("acquired", Some("new".to_owned())))
        );
        assert_eq!(
            answer(true, "h", Some("s"), Acquired::Reentrant(row(false, 5))),
            Ok(("extended", Some("s".to_owned())))
        );
    }

    #[test]
    fn a_live_lease_refuses_by_whose_it_is_and_what_was_presented() {
        let live = || Acquired::Held(row(false, 5));
        assert_eq!(
            answer(false, "other", None, live()),
            Err(ErrorCode::LeaseHeld)
        );
        assert_eq!(
            answer(true, "h", None, live()),
            Err(ErrorCode::SecretRequired)
        );
        assert_eq!(
            answer(false, "h", None, live()),
            Err(ErrorCode::WrongSecret)
        );
        assert_eq!(
            answer(true, "h", Some("x"), live()),
            Err(ErrorCode::WrongSecret)
        );
        assert_eq!(
            answer(false, "h", None, Acquired::Contended),
            Err(ErrorCode::Unavailable)
        );
    }
}
