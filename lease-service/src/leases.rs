//! The lease rules: validation, and what each outcome of a statement means for the caller.
//! Plain functions over the repository, so the HTTP layer stays a thin translation.

use std::collections::HashMap;
use std::future::Future;

use diesel_async::AsyncPgConnection;
use rand::Rng;
use shared::api::{
    AcquireLease, AcquireLeases, AcquiredLeases, HeldLease, Lease, LeaseStatus,
    MAX_BATCH_RESOURCES, ReleaseLease, ReleaseResult, RenewLease, Secret,
};
use shared::server::coalesce::{Coalescer, distinct_prefix};
use shared::server::{check_batch_size, first_duplicate, sha256, validate_name};

use crate::db::{self, DbPool};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::repo::{self, AcquireProof, Acquired, LeaseRow, Release, Renewal};

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

/// Serves single acquires, renewals and releases: those that arrive while a statement of their
/// kind is in flight go together as the next one (see [`shared::server::coalesce`]), one
/// statement and one commit for the group, and each gets the answer it would have got alone.
/// A group names each resource once; a second request for a resource waits for the next group.
/// An acquire that presents a secret (a reentrant acquire proving it holds) runs alone.
#[derive(Clone)]
pub struct Groups {
    context: GroupContext,
    acquires: Coalescer<(), Acquisition, Result<AcquireOutcome, ApiError>>,
    renewals: Coalescer<(), Renewal, Result<Lease, ApiError>>,
    releases: Coalescer<(), Release, Result<Lease, ApiError>>,
}

impl std::fmt::Debug for Groups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Groups").finish_non_exhaustive()
    }
}

/// What a group's work needs.
#[derive(Clone)]
struct GroupContext {
    pool: DbPool,
    ttl: TtlPolicy,
    secrets: SecretPolicy,
    metrics: Metrics,
}

/// A single acquire without a secret, checked, waiting for its group.
#[derive(Debug)]
struct Acquisition {
    resource: String,
    holder: String,
    ttl_seconds: i32,
    /// The new secret, handed to the caller if the acquisition is new, and its digest.
    secret: String,
    secret_hash: [u8; 32],
}

impl Groups {
    /// Up to `in_flight` statements of each kind at once, each on a connection of its own from
    /// `pool`.
    pub fn new(
        pool: DbPool,
        ttl: TtlPolicy,
        secrets: SecretPolicy,
        metrics: Metrics,
        in_flight: usize,
    ) -> Groups {
        let context = GroupContext {
            pool,
            ttl,
            secrets,
            metrics,
        };
        Groups {
            acquires: grouped(&context, "acquire", in_flight, acquire_group),
            renewals: grouped(&context, "renew", in_flight, renew_group),
            releases: grouped(&context, "release", in_flight, release_group),
            context,
        }
    }

    /// `POST /api/leases`.
    pub async fn acquire(&self, request: &AcquireLease) -> Result<AcquireOutcome, ApiError> {
        let GroupContext {
            ttl,
            secrets,
            metrics,
            ..
        } = &self.context;
        validate_name("resource", &request.resource)?;
        validate_name("holder", &request.holder)?;
        let ttl_seconds = ttl.resolve(request.ttl_seconds)?;
        let secret = new_secret();
        let secret_hash = sha256(&secret);
        if request.secret.is_none() && !repo::acquire_is_broken() {
            let acquisition = Acquisition {
                resource: request.resource.clone(),
                holder: request.holder.clone(),
                ttl_seconds,
                secret,
                secret_hash,
            };
            return self
                .acquires
                .submit((), acquisition)
                .await
                .unwrap_or_else(group_failed);
        }
        // Only a reentrant acquire needs proof, and whether it is one is known only inside the
        // statement: a wrong secret is refused there, not here.
        let presented = request.secret.as_ref().map(|s| sha256(s.expose()));
        let proof = AcquireProof {
            new_secret_hash: &secret_hash,
            presented_hash: presented.as_ref().map(<[u8; 32]>::as_slice),
            require_secret: secrets.required,
        };
        let mut conn = db::connection(&self.context.pool).await?;
        let acquired = repo::acquire(
            &mut conn,
            &request.resource,
            &request.holder,
            ttl_seconds,
            proof,
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

    /// `PUT /api/leases/renew`.
    pub async fn renew(&self, request: &RenewLease) -> Result<Lease, ApiError> {
        validate_name("resource", &request.resource)?;
        validate_name("holder", &request.holder)?;
        let renewal = Renewal {
            resource: request.resource.clone(),
            holder: request.holder.clone(),
            fence: request.fence,
            secret_hash: self.context.secrets.presented(request.secret.as_ref())?,
            ttl_seconds: request
                .ttl_seconds
                .map(|seconds| self.context.ttl.resolve(Some(seconds)))
                .transpose()?,
        };
        self.renewals
            .submit((), renewal)
            .await
            .unwrap_or_else(group_failed)
    }

    /// `DELETE /api/leases/release` (and `DELETE /api/leases/{id}`, with `id`).
    ///
    /// A release repeated by the same holder, with the same fence if it gave one, after the
    /// lease was already released answers as the first did: its first answer may have been
    /// lost. It reads, and writes nothing, so it can never touch a newer lease. A lease an
    /// operator revoked was never released by its holder, so its holder is refused
    /// (`lease_revoked`): a 200 would tell it that it held the lease to the end.
    pub async fn release(
        &self,
        request: &ReleaseLease,
        id: Option<i64>,
    ) -> Result<Lease, ApiError> {
        let release = check_release(self.context.secrets, request, id)?;
        self.releases
            .submit((), release)
            .await
            .unwrap_or_else(group_failed)
    }
}

/// What a member gets when its group's work panicked.
fn group_failed<T>() -> Result<T, ApiError> {
    Err(ApiError::Internal(
        "the group this request was served in failed".to_owned(),
    ))
}

/// A request of a group, by the resource it touches.
trait OnResource {
    fn resource(&self) -> &str;
}

impl OnResource for Acquisition {
    fn resource(&self) -> &str {
        &self.resource
    }
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

/// The next group: the waiting requests up to the first that names a resource again (one
/// statement may touch a row only once), a batch's worth at most.
fn one_per_resource<I: OnResource>(waiting: &[I]) -> usize {
    distinct_prefix(waiting.iter().map(I::resource), MAX_BATCH_RESOURCES)
}

/// A coalescer of `operation`'s requests whose groups run `serve`; a failure of the group as a
/// whole (no connection, a database error) is every member's answer.
fn grouped<I, T, F, Fut>(
    context: &GroupContext,
    operation: &'static str,
    in_flight: usize,
    serve: F,
) -> Coalescer<(), I, Result<T, ApiError>>
where
    I: OnResource + Send + Sync + 'static,
    T: Send + 'static,
    F: Fn(GroupContext, Vec<I>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<Result<T, ApiError>>, ApiError>> + Send + 'static,
{
    let context = context.clone();
    Coalescer::new(
        in_flight,
        one_per_resource::<I>,
        Box::new(move |(), items: Vec<I>| {
            let members = items.len();
            context
                .metrics
                .group_sizes
                .with_label_values(&[operation])
                .observe(members as f64);
            let served = serve(context.clone(), items);
            Box::pin(async move {
                served
                    .await
                    .unwrap_or_else(|err| (0..members).map(|_| Err(err.clone())).collect())
            })
        }),
    )
}

async fn acquire_group(
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
                Some(row) if row.is_active() => Ok(Acquired::Held(row)),
                // It ended between the two statements: try it again, alone.
                _ => {
                    let proof = AcquireProof {
                        new_secret_hash: want.new_secret_hash,
                        presented_hash: None,
                        require_secret,
                    };
                    repo::acquire(conn, want.resource, want.holder, want.ttl_seconds, proof)
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

async fn renew_group(
    context: GroupContext,
    items: Vec<Renewal>,
) -> Result<Vec<Result<Lease, ApiError>>, ApiError> {
    let mut conn = db::connection(&context.pool).await?;
    let renewed = repo::renew_each(&mut conn, &items).await?;
    // A failure of this read fails only the renewals it was for.
    let mut current = leases_left(&mut conn, &items, &renewed).await;
    let metrics = &context.metrics;
    Ok(items
        .iter()
        .zip(renewed)
        .map(|(item, renewed)| {
            if let Some(row) = renewed {
                metrics.renewals.inc();
                return Ok(to_api(row));
            }
            let current = match &mut current {
                Ok(current) => current.remove(&item.resource),
                Err(err) => return Err(err.clone()),
            };
            let refusal = refusal("renew", current, &item.holder, item.fence, item.secret_hash);
            metrics
                .conflicts
                .with_label_values(&["renew", refusal.code()])
                .inc();
            Err(refusal)
        })
        .collect())
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

async fn release_group(
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
            code: "lease_not_found",
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
        .with_label_values(&["release", refusal.code()])
        .inc();
    Err(refusal)
}

/// Many releases (`POST /api/leases/batch/release`), to run inside one transaction: one
/// statement releases every lease it can, then whatever it did not release is judged alone
/// (a refusal with its reason, or a repeated release answered as the first). Only a database
/// failure fails the whole batch.
pub async fn release_many(
    conn: &mut AsyncPgConnection,
    secrets: SecretPolicy,
    metrics: &Metrics,
    requests: &[ReleaseLease],
) -> Result<Vec<ReleaseResult>, ApiError> {
    use actix_web::ResponseError;
    check_batch_size("leases", "releases", requests.len(), MAX_BATCH_RESOURCES)?;
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
    } else if row.is_revoked() {
        (
            "lease_revoked",
            format!("cannot {operation}: an operator revoked the lease"),
        )
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
            revoked_at: None,
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
    fn refusals_name_the_first_reason_that_applies() {
        let code = |current: Option<LeaseRow>, holder: &str, fence: Option<i64>| {
            refusal("renew", current, holder, fence, Some(sha256("s"))).code()
        };
        assert_eq!(code(None, "h", None), "lease_not_found");
        assert_eq!(code(Some(row(false, 5)), "other", Some(9)), "not_holder");
        assert_eq!(code(Some(row(false, 5)), "h", Some(8)), "stale_fence");
        assert_eq!(code(Some(row(true, 5)), "h", Some(9)), "lease_released");
        let revoked = LeaseRow {
            revoked_at: Some(Utc::now()),
            ..row(true, 5)
        };
        assert_eq!(code(Some(revoked.clone()), "h", Some(9)), "lease_revoked");
        assert_eq!(code(Some(revoked), "other", Some(9)), "not_holder");
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
