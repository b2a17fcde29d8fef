//! Claiming tasks (`POST /api/tasks/claim`). Claims arrive in bursts from many workers, and each
//! one alone would cost a transaction and a lease-service call; so the claims waiting for one
//! queue are gathered into a group ([`ClaimGroups`]) that takes its tasks in one transaction
//! and their leases in one lease-service batch. Within the group every claim is judged as if
//! it came alone, in arrival order, and lease-service still has the final word on each task.

use std::sync::PoisonError;

use leasehold::ErrorCode;
use leasehold::LeaseError;
use leasehold::api::Lease;
use leasehold::server::ApiError;
use leasehold::tasks::{CompleteItem, MAX_CLAIM, MAX_COMPLETE_BATCH, TaskStatus};

use super::complete::{self, Completion};
use super::limits::Limits;
use super::refusal::{credentials_refused, lease_refusal};
use super::{Engine, Transition, cover};
use crate::repo::{self, Db, TaskRow};

/// One claim request's part in a claim group: who claims, at most how many tasks, the worker
/// process's lease that is to cover them (resource and fence), if it named one, and the tasks
/// it completes first (`PUT /api/tasks/complete` with `next`), if any.
#[derive(Debug, Clone)]
pub struct Want {
    pub processor: String,
    pub limit: i64,
    pub lease: Option<(String, i64)>,
    pub completions: Vec<CompleteItem>,
}

/// What one claim request got from its group: its tasks, or why the claim got none as a whole
/// (lease-service unavailable or refusing the TTL), and the verdict on each completion it
/// carried, in its order.
#[derive(Debug)]
pub struct Claimed {
    pub tasks: Result<Vec<TaskRow>, ApiError>,
    pub completed: Vec<Result<Transition, ApiError>>,
}

/// How many waiting claims, from the front, go in one group: their limits add up to at most
/// [`MAX_CLAIM`], one statement's and one lease batch's worth, the completions they carry to
/// at most [`MAX_COMPLETE_BATCH`], and no task is completed twice in one group (a repeat waits
/// for the next group, and is judged after the first).
pub fn claims_per_group(wants: &[Want]) -> usize {
    let (mut total, mut completions) = (0, 0);
    let mut seen = std::collections::HashSet::new();
    wants
        .iter()
        .take_while(|want| {
            total += want.limit;
            completions += want.completions.len();
            let distinct = want.completions.iter().all(|item| seen.insert(item.id));
            total <= MAX_CLAIM && completions <= MAX_COMPLETE_BATCH && distinct
        })
        .count()
}

/// Claims due tasks of `queue` for a group of claim requests in one transaction: each gets up
/// to its `limit`, in the group's order, and the tasks of all of them take their leases in one
/// lease-service call (each under its own claimant's name).
///
/// Candidates are locked with `SKIP LOCKED`: running tasks whose lease ran out by the recorded
/// expiry first, then, for the room left, due pending tasks by priority and schedule, within the
/// room of limited queues ([`Limits`], whose rows are locked first). Each
/// candidate's lease is acquired from lease-service while its row is locked, and lease-service
/// has the final word:
/// * a refusal (another holder) skips the task, and a lapsed task's recorded expiry moves to the
///   holder's, so it stops crowding the claim;
/// * a *reentrant* acquire (this processor name already holds the task's lease) skips it too
///   when the lease's fence is the task's: another worker with the same name has it, and
///   handing it out again would give both one fence. A reentrant lease with any other fence was
///   granted to a claim that never committed (its answer timed out, or its transaction failed):
///   no worker knows that fence, so the task is claimed under it rather than blocked until the
///   stray lease runs out;
/// * a task that has used all its attempts is not handed out but marked dead, once its lease
///   proves the last attempt is over; no request's `limit` is spent on it, and it is read apart
///   from the lapsed tasks to claim (up to the lease batch's size), so it never takes the place
///   of one.
///
/// A lapsed task whose cancellation was asked for is never handed out: it ends as cancelled
/// (its worker stopped heartbeating, so nobody will end it otherwise) in the same statement
/// that reads the lapsed tasks ([`repo::take_lapsed`]), and its lease is released after commit.
///
/// Completions carried by the claims are judged first, in the same transaction, each exactly as
/// [`complete::complete_group`] would judge it: a completed task's place in a limited queue is
/// free for the claim that follows. A claim refused as a whole (lease-service unavailable, or
/// refusing the TTL) takes nothing, but its transaction still commits the completions.
///
/// If the transaction fails after leases were granted, they are released at once.
#[tracing::instrument(name = "claim group", skip_all, fields(
    task.queue = queue.unwrap_or(""),
    task.group.size = wants.len(),
))]
pub async fn claim_group(
    conn: &mut Db,
    engine: &Engine,
    queue: Option<&str>,
    wants: &[Want],
) -> Result<Vec<Claimed>, ApiError> {
    let completions: Vec<Completion> = wants
        .iter()
        .flat_map(|want| {
            want.completions.iter().map(|item| Completion {
                processor: want.processor.clone(),
                item: item.clone(),
                lease: want.lease.clone(),
            })
        })
        .collect();
    // Leases granted inside the transaction, to release should it fail.
    let granted = std::sync::Mutex::new(Vec::new());
    // A queue this replica last found without limits is locked beside the lease check;
    // any other once the completions are judged (see `Unlimited`).
    let lock_early = queue.is_some_and(|queue| engine.unlimited.known(queue));
    let outcome = repo::in_index_order(conn, async |conn| {
        // The workers' leases the requests name (for their claims and their completions alike)
        // are checked beside the transaction's first
        // statement, so that lease-service's answer costs no round trip of its own; but only
        // once the transaction has begun: a completion is recorded at the transaction's
        // `now()`, and a lease proven held before that moment could have been superseded
        // before it too (the invariant checker's "not superseded" caught that, under load).
        let (standing, locked) = if lock_early {
            let (standing, locked) =
                tokio::join!(Standing::read(engine, wants), Limits::lock(conn, queue));
            (standing, Some(locked?))
        } else {
            (Standing::read(engine, wants).await, None)
        };
        let held = &standing.held;
        // A claim that names a lease not held gets nothing (and takes no room).
        let verdicts: Vec<Result<(), ApiError>> = wants
            .iter()
            .map(|want| standing.verdict(engine, want))
            .collect();
        // What the claiming below reads of each request (its completions were taken above).
        let wants: Vec<Want> = wants
            .iter()
            .zip(&verdicts)
            .map(|(want, verdict)| Want {
                processor: want.processor.clone(),
                limit: if verdict.is_ok() { want.limit } else { 0 },
                lease: want.lease.clone().filter(|_| verdict.is_ok()),
                completions: Vec::new(),
            })
            .collect();
        let wants = wants.as_slice();
        let total: i64 = wants.iter().map(|want| want.limit).sum();
        let completed = if completions.is_empty() {
            Vec::new()
        } else {
            complete::judge(conn, engine, &completions, held).await?
        };
        let mut round = Round::new(wants);
        let locked = match locked {
            Some(locked) => locked,
            None => Limits::lock(conn, queue).await?,
        };
        // Counted after the completions, whose slots they free.
        let mut limits = locked.count(conn).await?;
        if let Some(queue) = queue {
            engine.unlimited.learn(queue, limits.is_unlimited());
        }
        // Lapsed tasks that are only to be ended are taken apart from those to claim, so
        // that they never fill the places of claimable ones (nor spend a request's room).
        // One lease-service batch holds the claimable and the exhausted: the exhausted
        // fill what the claimable left of it.
        // A claim of one queue without limits locks its due tasks in the same statement, for
        // the room the claimable lapsed ones leave, and claims those of requests that named
        // their process's lease.
        let due_slots =
            (queue.is_some() && limits.is_unlimited()).then(|| slots(wants, engine.lease_ttl));
        let with_due = due_slots.is_some();
        let taken = split_lapsed(
            repo::take_lapsed(conn, queue, total, MAX_CLAIM, due_slots.as_ref()).await?,
        );
        round.cancelled = taken.cancelled;
        let read_due = usize::try_from(total)
            .unwrap_or(0)
            .saturating_sub(taken.lapsed.iter().filter(|task| !exhausted(task)).count());
        let got_due = taken.due.len() + taken.claimed.len();
        // Lapsed tasks taken again keep the slots they held, but spend tokens; due ones
        // need both. The lapsed fill the group's first slots, the due claimed already
        // the slots after them.
        let lapsed = limits.admit_lapsed(taken.lapsed, exhausted);
        round.grant(conn, engine, lapsed, &limits, &granted).await?;
        round.record(taken.claimed);
        let due = taken.due;
        let room = limits.cap(queue, total - round.taken());
        if room > 0 {
            // Read again only when the statement read all the room it had and a lapsed task
            // was then not taken (its lease still held), which left more room: its own rows
            // come back among the first, locked already.
            let more = usize::try_from(room).unwrap_or(0) > due.len() && got_due >= read_due;
            let due = if with_due && !more {
                due
            } else {
                limits.lock_due(conn, queue, room).await?
            };
            let admitted = limits.admit(due);
            round
                .grant(conn, engine, admitted, &limits, &granted)
                .await?;
        }
        let started: Vec<&TaskRow> = round.claimed.iter().flatten().collect();
        limits.settle(conn, &started).await?;
        let refused = match (round.taken(), round.misconfigured, round.unavailable) {
            (0, Some(err), _) => Some(err),
            (0, None, Some(reason)) => Some(ApiError::Unavailable(format!(
                "lease-service unavailable: {reason}"
            ))),
            _ => None,
        };
        if let Some(err) = refused.as_ref().filter(|_| completions.is_empty()) {
            // Nothing to keep: as if the group had not run.
            return Err(err.clone());
        }
        Ok((
            round.claimed,
            refused,
            completed,
            round.exhausted,
            round.cancelled,
            limits.bound,
            verdicts,
        ))
    })
    .await;
    let (claimed, refused, completed, exhausted, cancelled, bound, verdicts) = match outcome {
        Ok(done) => done,
        Err(err) => {
            let granted =
                std::mem::take(&mut *granted.lock().unwrap_or_else(PoisonError::into_inner));
            for (id, holder, lease) in granted {
                engine
                    .release_after_commit(id, &holder, lease.proof())
                    .await;
            }
            return Err(err);
        }
    };
    for (queue, limit) in &bound {
        engine
            .metrics
            .limit_waits
            .with_label_values(&[queue.as_str(), limit])
            .inc();
    }
    for (want, rows) in wants.iter().zip(&claimed) {
        for row in rows {
            engine
                .metrics
                .claimed
                .with_label_values(&[row.queue.as_str()])
                .inc();
            tracing::debug!(
                task.id = row.id,
                task.fence = row.fence,
                task.attempts = row.attempts,
                task.processor = %want.processor,
                "task claimed"
            );
        }
    }
    for (row, holder, lease) in &exhausted {
        engine
            .metrics
            .dead
            .with_label_values(&[row.queue.as_str(), "attempts_exhausted"])
            .inc();
        if let Some(lease) = lease {
            engine
                .release_after_commit(row.id, holder, lease.proof())
                .await;
        }
    }
    end_cancelled(engine, &cancelled).await;
    let mut completed = completed.into_iter();
    Ok(wants
        .iter()
        .zip(claimed)
        .zip(verdicts)
        .map(|((want, tasks), verdict)| Claimed {
            tasks: match (&refused, verdict) {
                (_, Err(err)) => Err(err),
                (Some(err), Ok(())) => Err(err.clone()),
                (None, Ok(())) => Ok(tasks),
            },
            completed: completed.by_ref().take(want.completions.len()).collect(),
        })
        .collect())
}

/// Where the worker processes' leases a claim group's requests name stand, by lease-service's
/// word, read in one call (`cover::check` asks once per distinct lease). A request's
/// completions are judged under the lease its claim names, so this serves both.
struct Standing {
    /// The leases lease-service says are held.
    held: Vec<(String, i64)>,
    /// Why each other lease is not, when lease-service answered.
    lost: Vec<((String, i64), leasehold::LeaseError)>,
    /// Why lease-service gave no answer, if it did not.
    unanswered: Option<leasehold::LeaseError>,
}

impl Standing {
    async fn read(engine: &Engine, wants: &[Want]) -> Standing {
        let mut named: Vec<&(String, i64)> =
            wants.iter().filter_map(|w| w.lease.as_ref()).collect();
        named.sort_unstable();
        named.dedup();
        let mut standing = Standing {
            held: Vec::new(),
            lost: Vec::new(),
            unanswered: None,
        };
        if named.is_empty() {
            return standing;
        }
        let leases: Vec<(&str, i64)> = named.iter().map(|(r, f)| (r.as_str(), *f)).collect();
        match cover::check(engine, &leases).await {
            Ok(checks) => {
                for (lease, check) in named.into_iter().zip(checks) {
                    match cover::verdict(&check) {
                        Ok(()) => standing.held.push(lease.clone()),
                        Err(err) => standing.lost.push((lease.clone(), err)),
                    }
                }
            }
            Err(err) => standing.unanswered = Some(err),
        }
        standing
    }

    /// Whether `want` may claim: it names no lease, or one that is held. A claim under a lease
    /// that is not (lapsed, superseded, revoked, or never granted) is refused as a heartbeat
    /// under it would be, rather than handed tasks its worker could never complete.
    /// (A completion under such a lease is judged the slow way instead, which asks again and
    /// answers the refusal.)
    fn verdict(&self, engine: &Engine, want: &Want) -> Result<(), ApiError> {
        let Some(lease) = want.lease.as_ref() else {
            return Ok(());
        };
        if self.held.contains(lease) {
            return Ok(());
        }
        let err = self
            .lost
            .iter()
            .find(|(lost, _)| lost == lease)
            .map(|(_, err)| err.clone())
            .or_else(|| self.unanswered.clone())
            .unwrap_or_else(|| leasehold::LeaseError::Unavailable("no answer".to_owned()));
        Err(lease_refusal(engine, "claim", err))
    }
}

/// After the commit that ended lapsed tasks as cancelled: counts them, and releases their
/// leases on their last workers' behalf, should any still be live.
pub async fn end_cancelled(engine: &Engine, cancelled: &[TaskRow]) {
    for row in cancelled {
        engine
            .metrics
            .cancelled
            .with_label_values(&[row.queue.as_str()])
            .inc();
        tracing::info!(
            task.id = row.id,
            "task cancelled: its worker stopped heartbeating after the cancellation was asked for"
        );
        if let Some(processor) = row.processor.as_deref() {
            engine.release_own_after_commit(row, processor).await;
        }
    }
}

/// What one claim group has taken so far, per request.
struct Round<'w> {
    wants: &'w [Want],
    claimed: Vec<Vec<TaskRow>>,
    /// Tasks each request has claimed.
    taken: Vec<i64>,
    /// Tasks marked dead, with their holder and the lease of their own to release after
    /// commit (none when a shared lease covered the proof).
    exhausted: Vec<(TaskRow, String, Option<Lease>)>,
    /// Lapsed tasks whose cancellation was asked for, ended as cancelled.
    cancelled: Vec<TaskRow>,
    unavailable: Option<String>,
    /// lease-service refused the lease TTL: no claim can succeed until it is fixed.
    misconfigured: Option<ApiError>,
}

impl<'w> Round<'w> {
    fn new(wants: &'w [Want]) -> Self {
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

    fn taken(&self) -> i64 {
        self.taken.iter().sum()
    }

    /// Records the due tasks [`repo::take_lapsed`] claimed for their slots' requests.
    fn record(&mut self, claimed: Vec<(usize, TaskRow)>) {
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
    async fn grant(
        &mut self,
        conn: &mut Db,
        engine: &Engine,
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
                started_at: limits.started_at(&task),
            });
        }
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
        for claim in &to_claim {
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
        engine: &Engine,
        owned: Vec<(TaskRow, usize)>,
    ) -> Result<Vec<(TaskRow, usize)>, ApiError> {
        let needs_check = |task: &TaskRow, owner: usize| {
            task.status == TaskStatus::Running
                && cover::shared(task).is_none()
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
        engine: &Engine,
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
                    started_at: limits.started_at(&task),
                });
            }
        }
        Ok(to_claim)
    }

    /// Records why a lease-service call of this round failed: no claim of it succeeds then.
    fn lease_call_failed(&mut self, engine: &Engine, err: LeaseError) {
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

/// A task that has used all its attempts: it is never handed out again.
fn exhausted(task: &TaskRow) -> bool {
    task.attempts >= task.max_attempts
}

/// [`repo::take_lapsed`]'s rows, by what the claim does with them next.
#[derive(Debug, Default)]
struct Taken {
    /// Ended as cancelled.
    cancelled: Vec<TaskRow>,
    /// Lapsed, to be granted: the claimable first, then the exhausted, each oldest first.
    lapsed: Vec<TaskRow>,
    /// Due, locked, in the claim's order, to be granted.
    due: Vec<TaskRow>,
    /// Due, claimed already, with their slots, in slot order.
    claimed: Vec<(usize, TaskRow)>,
}

fn split_lapsed(rows: Vec<repo::Taken>) -> Taken {
    let mut taken = Taken::default();
    for row in rows {
        let repo::Taken { task, claim_slot } = row;
        match (claim_slot, task.status) {
            (Some(slot), _) => taken
                .claimed
                .push((usize::try_from(slot).unwrap_or(0), task)),
            (None, TaskStatus::Pending) => taken.due.push(task),
            (None, TaskStatus::Cancelled) => taken.cancelled.push(task),
            (None, _) => taken.lapsed.push(task),
        }
    }
    // Stable: each kind keeps the statement's order.
    taken.lapsed.sort_by_key(exhausted);
    taken.claimed.sort_by_key(|(slot, _)| *slot);
    taken
}

/// The group's slots, one per task a request may take (a request with a `limit` of `n` holds
/// `n`, in the group's order), for [`repo::take_lapsed`] to claim the due tasks of those
/// whose request named its worker process's lease.
fn slots(wants: &[Want], hint: std::time::Duration) -> repo::Slots<'_> {
    let mut slots = repo::Slots {
        processors: Vec::new(),
        resources: Vec::new(),
        fences: Vec::new(),
        hint,
    };
    let holders = (1..).map_while(|slot| owner_of(wants, slot).map(|owner| &wants[owner]));
    for want in holders {
        slots.processors.push(want.processor.as_str());
        slots
            .resources
            .push(want.lease.as_ref().map(|(resource, _)| resource.as_str()));
        slots
            .fences
            .push(want.lease.as_ref().map_or(0, |(_, fence)| *fence));
    }
    slots
}

/// The request that holds `slot` (from 1) of a group ([`slots`]).
fn owner_of(wants: &[Want], slot: usize) -> Option<usize> {
    let mut end = 0;
    wants.iter().position(|want| {
        end += usize::try_from(want.limit).unwrap_or(0);
        slot <= end
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::tasks::fixtures;

    fn wants(limits: &[i64]) -> Vec<Want> {
        limits
            .iter()
            .map(|&limit| Want {
                processor: "w".to_owned(),
                limit,
                lease: None,
                completions: Vec::new(),
            })
            .collect()
    }

    #[test]
    fn a_group_holds_at_most_one_batch_of_tasks() {
        assert_eq!(claims_per_group(&wants(&[])), 0);
        assert_eq!(claims_per_group(&wants(&[1, 1, 1])), 3);
        assert_eq!(claims_per_group(&wants(&[40, 60, 1])), 2);
        assert_eq!(claims_per_group(&wants(&[100, 1])), 1);
        // The front is kept in order: a small claim behind a large one waits its turn.
        assert_eq!(claims_per_group(&wants(&[50, 51, 1])), 1);
    }

    #[test]
    fn a_task_is_exhausted_once_its_attempts_are_used() {
        let mut task = fixtures::row(TaskStatus::Running, Some("w"), Some(1));
        task.attempts = task.max_attempts - 1;
        assert!(!exhausted(&task));
        task.attempts = task.max_attempts;
        assert!(exhausted(&task));
    }

    #[test]
    fn lapsed_rows_split_into_ended_and_claimable_before_exhausted() {
        let row = |id, status, attempts, claim_slot| {
            let mut task = fixtures::row(status, Some("w"), Some(1));
            task.id = id;
            task.attempts = attempts;
            repo::Taken { task, claim_slot }
        };
        let max = fixtures::row(TaskStatus::Running, None, None).max_attempts;
        let rows = vec![
            row(1, TaskStatus::Cancelled, 1, None),
            row(2, TaskStatus::Running, max, None),
            row(3, TaskStatus::Running, 1, None),
            row(9, TaskStatus::Running, 1, Some(4)),
            row(4, TaskStatus::Running, max, None),
            row(5, TaskStatus::Running, 1, None),
            row(8, TaskStatus::Running, 1, Some(3)),
            row(7, TaskStatus::Pending, 0, None),
            row(6, TaskStatus::Pending, 0, None),
        ];
        let taken = split_lapsed(rows);
        let ids = |rows: &[TaskRow]| rows.iter().map(|t| t.id).collect::<Vec<_>>();
        assert_eq!(ids(&taken.cancelled), [1]);
        assert_eq!(ids(&taken.lapsed), [3, 5, 2, 4]);
        assert_eq!(
            ids(&taken.due),
            [7, 6],
            "the due keep the statement's order"
        );
        let claimed: Vec<(usize, i64)> = taken.claimed.iter().map(|(s, t)| (*s, t.id)).collect();
        assert_eq!(claimed, [(3, 8), (4, 9)], "the claimed come in slot order");
    }

    #[test]
    fn a_slot_belongs_to_the_request_whose_limit_holds_it() {
        let wants = wants(&[1, 3, 1]);
        let owners: Vec<Option<usize>> = (1..=6).map(|slot| owner_of(&wants, slot)).collect();
        assert_eq!(
            owners,
            [Some(0), Some(1), Some(1), Some(1), Some(2), None],
            "slots from 1, a request's as many as its limit"
        );
        let slots = slots(&wants, std::time::Duration::from_secs(1));
        assert_eq!(slots.processors.len(), 5);
        assert!(
            slots.resources.iter().all(Option::is_none),
            "requests without a lease claim nothing in the statement"
        );
    }
}
