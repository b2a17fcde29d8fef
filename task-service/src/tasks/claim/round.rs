//! One claim group's round: candidates handed to the requests with room, their last claims
//! proven over, their leases taken, and the claims recorded.

use std::sync::PoisonError;

use leasehold::ErrorCode;
use leasehold::LeaseError;
use leasehold::api::Lease;
use leasehold::server::ApiError;
use leasehold::tasks::TaskStatus;

use super::Want;
use super::taken::{exhausted, owner_of};
use crate::context::Context;
use crate::repo::{self, Db, TaskRow};
use crate::tasks::cover;
use crate::tasks::limits::Limits;
use crate::tasks::refusal::credentials_refused;

/// What one claim group has taken so far, per request.
pub(super) struct Round<'w> {
    pub(super) wants: &'w [Want],
    pub(super) claimed: Vec<Vec<TaskRow>>,
    /// Tasks each request has claimed.
    taken: Vec<i64>,
    /// Tasks marked dead, with their holder and the lease of their own to release after
    /// commit (none when a shared lease covered the proof).
    pub(super) exhausted: Vec<(TaskRow, String, Option<Lease>)>,
    /// Lapsed tasks whose cancellation was asked for, ended as cancelled.
    pub(super) cancelled: Vec<TaskRow>,
    pub(super) unavailable: Option<String>,
    /// lease-service refused the lease TTL: no claim can succeed until it is fixed.
    pub(super) misconfigured: Option<ApiError>,
}

impl<'w> Round<'w> {
    pub(super) fn new(wants: &'w [Want]) -> Self {
        Round {
            wants,
            claimed: wants.iter().map(|_| Vec::new()).collect(),
            taken: wants.iter().map(|_| 0).collect(),
            exhausted: Vec::new(),
            cancelled: Vec::new(),
            unavailable: None,
            misconfigured: None,
        }
    }

    pub(super) fn taken(&self) -> i64 {
        self.taken.iter().sum()
    }

    /// Records the due tasks [`repo::take_lapsed`] claimed for their slots' requests.
    pub(super) fn record(&mut self, claimed: Vec<(usize, TaskRow)>) {
        for (slot, row) in claimed {
            if let Some(owner) = owner_of(self.wants, slot) {
                self.taken[owner] += 1;
                self.claimed[owner].push(row);
            }
        }
    }

    /// Hands each candidate, in order, to the first request with room left, makes sure the claim
    /// it replaces is over, covers each by a lease and records the claims.
    ///
    /// A request that names its worker process's lease has its tasks covered by that lease: no
    /// lease is taken for them. Any other request takes a lease of each task's own, all in one
    /// lease-service call. A lapsed task (running, its lease's recorded expiry passed) is handed
    /// out only once lease-service says its last claim's lease is over: its own lease is taken
    /// (as a request without a shared lease does anyway), or the lease is checked (when it was a
    /// shared lease, or the new claim needs no lease of the task's own). A lease that still
    /// keeps others off postpones the task to when it may be taken over.
    pub(super) async fn grant(
        &mut self,
        conn: &mut Db,
        engine: &Context,
        candidates: Vec<TaskRow>,
        limits: &Limits,
        granted: &std::sync::Mutex<Vec<(i64, String, Lease)>>,
    ) -> Result<(), ApiError> {
        if candidates.is_empty() {
            return Ok(());
        }
        let mut room: Vec<i64> = self
            .wants
            .iter()
            .zip(&self.taken)
            .map(|(want, taken)| want.limit - taken)
            .collect();
        let mut owned: Vec<(TaskRow, usize)> = Vec::with_capacity(candidates.len());
        for task in candidates {
            let owner = if exhausted(&task) {
                // Its last claim is only proven over, then it is marked dead: no request's room
                // is spent on it.
                room.iter().position(|left| *left > 0).unwrap_or(0)
            } else {
                let Some(owner) = room.iter().position(|left| *left > 0) else {
                    continue;
                };
                room[owner] -= 1;
                owner
            };
            owned.push((task, owner));
        }
        let owned = self.prove_lapsed_over(conn, engine, owned).await?;
        let (shared, own): (Vec<_>, Vec<_>) = owned
            .into_iter()
            .partition(|(_, owner)| self.wants[*owner].lease.is_some());
        let mut to_claim = self
            .take_own_leases(conn, engine, own, limits, granted)
            .await?;
        for (task, owner) in shared {
            let holder = &self.wants[owner].processor;
            if exhausted(&task) {
                let row = mark_exhausted(conn, &task).await?;
                self.exhausted.push((row, holder.clone(), None));
                continue;
            }
            let Some((resource, fence)) = self.wants[owner].lease.clone() else {
                continue;
            };
            self.taken[owner] += 1;
            to_claim.push(ToClaim {
                owner,
                task: (task.id, task.status, task.fence.is_none()),
                cover: Cover::Shared { resource, fence },
                started_at: limits.start_of(&task.queue),
            });
        }
        self.record_claims(conn, engine, &to_claim).await
    }

    /// Records the claims of `to_claim` in one statement, and each request's tasks in the order
    /// the candidates came: priority, then schedule.
    async fn record_claims(
        &mut self,
        conn: &mut Db,
        engine: &Context,
        to_claim: &[ToClaim],
    ) -> Result<(), ApiError> {
        if to_claim.is_empty() {
            return Ok(());
        }
        let claims: Vec<repo::Claim<'_>> = to_claim
            .iter()
            .map(|claim| {
                let (id, from, first) = claim.task;
                let (lease_resource, lease_fence, lease_secret, lease_expiry) = match &claim.cover {
                    Cover::Own(lease) => (
                        None,
                        lease.fence,
                        lease.secret.as_ref(),
                        Some(lease.expires_at),
                    ),
                    Cover::Shared { resource, fence } => {
                        (Some(resource.as_str()), *fence, None, None)
                    }
                };
                repo::Claim {
                    id,
                    from,
                    first,
                    processor: &self.wants[claim.owner].processor,
                    lease_resource,
                    lease_fence,
                    lease_secret,
                    lease_expiry,
                    started_at: claim.started_at,
                }
            })
            .collect();
        let mut rows: std::collections::HashMap<i64, TaskRow> =
            repo::mark_claimed(conn, &claims, engine.lease_ttl)
                .await?
                .into_iter()
                .map(|row| (row.id, row))
                .collect();
        // Each request's tasks in the order the candidates came: priority, then schedule.
        for claim in to_claim {
            if let Some(row) = rows.remove(&claim.task.0) {
                self.claimed[claim.owner].push(row);
            }
        }
        Ok(())
    }

    /// Keeps the candidates whose last claim is over, of those no acquisition of the task's own
    /// lease will prove so: lapsed tasks whose last claim was under a lease of their own and that
    /// go to a request with a shared lease. Their leases are checked in one call; one that still
    /// keeps others off postpones its task. If lease-service cannot answer, they wait for the
    /// next claim.
    ///
    /// A lapsed task whose last claim was under a shared lease (a worker process's) is over
    /// once its heartbeats stopped for a task lease TTL (its recorded expiry passed), whether or
    /// not the process's lease lives: its worker counts its own deadline from the same TTL and
    /// gives the task up by then, and a task whose claim answer never reached its worker would
    /// otherwise be kept for as long as the process lives.
    async fn prove_lapsed_over(
        &mut self,
        conn: &mut Db,
        engine: &Context,
        owned: Vec<(TaskRow, usize)>,
    ) -> Result<Vec<(TaskRow, usize)>, ApiError> {
        let needs_check = |task: &TaskRow, owner: usize| {
            task.status == TaskStatus::Running
                && task.shared_lease().is_none()
                && self.wants[owner].lease.is_some()
        };
        let last_lease = |task: &TaskRow| (engine.resource(task.id), task.lease_fence.unwrap_or(0));
        let leases: Vec<(String, i64)> = owned
            .iter()
            .filter(|(task, owner)| needs_check(task, *owner))
            .map(|(task, _)| last_lease(task))
            .collect();
        if leases.is_empty() {
            return Ok(owned);
        }
        let asked: Vec<(&str, i64)> = leases.iter().map(|(r, f)| (r.as_str(), *f)).collect();
        let checks = match cover::check(engine, &asked).await {
            Ok(checks) => checks,
            Err(err) => {
                self.lease_call_failed(engine, err);
                return Ok(owned
                    .into_iter()
                    .filter(|(task, owner)| !needs_check(task, *owner))
                    .collect());
            }
        };
        let mut checks = checks.into_iter();
        let mut over = Vec::with_capacity(owned.len());
        for (task, owner) in owned {
            if !needs_check(&task, owner) {
                over.push((task, owner));
                continue;
            }
            let Some(check) = checks.next() else { continue };
            if check.standing.keeps_others_off() {
                if let Some(until) = check.takeover_at {
                    repo::postpone_lapse(conn, task.id, until).await?;
                }
                continue;
            }
            over.push((task, owner));
        }
        Ok(over)
    }

    /// Takes a lease of each task's own for the candidates of requests without a shared lease,
    /// in one lease-service call, and says which to claim under which lease; marks dead the
    /// exhausted whose last attempt the acquisition proved over.
    async fn take_own_leases(
        &mut self,
        conn: &mut Db,
        engine: &Context,
        own: Vec<(TaskRow, usize)>,
        limits: &Limits,
        granted: &std::sync::Mutex<Vec<(i64, String, Lease)>>,
    ) -> Result<Vec<ToClaim>, ApiError> {
        let mut to_claim = Vec::new();
        if own.is_empty() {
            return Ok(to_claim);
        }
        // One call and one commit in lease-service for the whole group.
        let resources: Vec<String> = own.iter().map(|(t, _)| engine.resource(t.id)).collect();
        let holders: Vec<String> = own
            .iter()
            .map(|(_, owner)| self.wants[*owner].processor.clone())
            .collect();
        let mut answer = match engine
            .leases
            .acquire_each(&resources, &holders, Some(engine.lease_ttl))
            .await
        {
            Ok(answer) => {
                engine.lease_ttl_verdict.accept();
                answer
            }
            Err(err) => {
                self.lease_call_failed(engine, err);
                return Ok(to_claim);
            }
        };
        for ((task, owner), resource) in own.into_iter().zip(resources) {
            let take = |leases: &mut Vec<Lease>| {
                let at = leases.iter().position(|l| l.resource == resource)?;
                Some(leases.swap_remove(at))
            };
            let lease = if let Some(lease) = take(&mut answer.acquired) {
                lease
            } else if let Some(lease) = take(&mut answer.extended) {
                // The same name already works on it under this fence: not handed out twice.
                if task.lease_fence == Some(lease.fence) {
                    continue;
                }
                lease
            } else {
                if task.status == TaskStatus::Running
                    && let Some(held) = answer.held.iter().find(|h| h.resource == resource)
                {
                    repo::postpone_lapse(conn, task.id, held.expires_at).await?;
                }
                continue;
            };
            let holder = &self.wants[owner].processor;
            granted
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((task.id, holder.clone(), lease.clone()));
            if exhausted(&task) {
                let row = mark_exhausted(conn, &task).await?;
                self.exhausted.push((row, holder.clone(), Some(lease)));
            } else {
                self.taken[owner] += 1;
                to_claim.push(ToClaim {
                    owner,
                    task: (task.id, task.status, task.fence.is_none()),
                    cover: Cover::Own(lease),
                    started_at: limits.start_of(&task.queue),
                });
            }
        }
        Ok(to_claim)
    }

    /// Records why a lease-service call of this round failed: no claim of it succeeds then.
    fn lease_call_failed(&mut self, engine: &Context, err: LeaseError) {
        match err {
            LeaseError::Rejected {
                code: ErrorCode::InvalidTtl,
                error,
                ..
            } => {
                self.misconfigured =
                    Some(engine.lease_ttl_verdict.reject(engine.lease_ttl, &error));
            }
            LeaseError::Unavailable(reason) => self.unavailable = Some(reason),
            err @ LeaseError::Rejected {
                status: 401 | 403, ..
            } => self.unavailable = Some(credentials_refused(&err)),
            other => {
                tracing::warn!(error = %other, "lease-service refused a claim's lease call");
            }
        }
    }
}

/// The lease a claim is recorded under.
enum Cover {
    /// A lease of the task's own, just acquired.
    Own(Lease),
    /// The claiming worker process's lease, as its request named it.
    Shared { resource: String, fence: i64 },
}

/// One claim to record: its request, its task (id, status, never claimed), its lease and start.
struct ToClaim {
    owner: usize,
    task: (i64, TaskStatus, bool),
    cover: Cover,
    started_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// Marks dead a task whose last attempt's lease ran out: it is never handed out again.
async fn mark_exhausted(conn: &mut Db, task: &TaskRow) -> Result<TaskRow, ApiError> {
    let reason = format!(
        "attempts exhausted: the lease of attempt {} of {} ran out (processor {:?} stopped heartbeating)",
        task.attempts,
        task.max_attempts,
        task.processor.as_deref().unwrap_or("?")
    );
    Ok(repo::mark_final(conn, task.id, TaskStatus::Dead, Some(&reason)).await?)
}
