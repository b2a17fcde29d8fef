//! Claiming tasks (`POST /api/tasks/claim`). Claims arrive in bursts from many workers, and each
//! one alone would cost a transaction and a lease-service call; so the claims waiting for one
//! queue are gathered into a group ([`ClaimGroups`]) that takes its tasks in one transaction
//! and their leases in one lease-service batch. Within the group every claim is judged as if
//! it came alone, in arrival order, and lease-service still has the final word on each task.

mod round;
mod standing;
mod taken;

use std::sync::{Mutex, PoisonError};

use leasehold::api::Lease;
use leasehold::server::ApiError;
use leasehold::server::db::Contended;
use leasehold::tasks::{CompleteItem, MAX_CLAIM, MAX_COMPLETE_BATCH};

use super::Transition;
use super::complete::{self, Completion};
use super::limits::Limits;
use crate::context::Context;
use crate::repo::{self, Db, TaskRow};
use round::Round;
use standing::Standing;
use taken::{exhausted, slots, split_lapsed};

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
    engine: &Context,
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
    let granted = Mutex::new(Vec::new());
    // Tried again should it lose to contention: all its locks are taken before it calls
    // lease-service for anything but a read, and its grants are released below.
    let mut retry = Contended::default();
    let outcome = loop {
        let outcome = repo::in_index_order(conn, async |conn| {
            in_transaction(conn, engine, queue, wants, &completions, &granted).await
        })
        .await;
        if outcome.is_err() {
            release_granted(engine, &granted).await;
        }
        if !retry.again(&outcome).await {
            break outcome;
        }
    };
    match outcome {
        Ok(outcome) => {
            outcome.account(engine, wants).await;
            Ok(outcome.answers(wants))
        }
        Err(err) => Err(err),
    }
}

/// Releases the leases a failed claim group's transaction was granted: no task records them.
async fn release_granted(engine: &Context, granted: &Mutex<Vec<(i64, String, Lease)>>) {
    let granted = std::mem::take(&mut *granted.lock().unwrap_or_else(PoisonError::into_inner));
    for (id, holder, lease) in granted {
        engine
            .release_after_commit(id, &holder, lease.proof())
            .await;
    }
}

/// What a claim group's transaction did, to account for and answer once it has committed.
struct Outcome {
    /// Each request's tasks.
    claimed: Vec<Vec<TaskRow>>,
    /// Why no request got a task, if lease-service made it so (the completions still count).
    refused: Option<ApiError>,
    completed: Vec<Result<Transition, ApiError>>,
    exhausted: Vec<(TaskRow, String, Option<Lease>)>,
    cancelled: Vec<TaskRow>,
    /// The limits that held claims back: `(queue, limit)`.
    bound: Vec<(String, &'static str)>,
    /// Whether each request's named lease let it claim.
    verdicts: Vec<Result<(), ApiError>>,
}

/// The transaction of [`claim_group`]: the named leases checked, the completions judged, then
/// the lapsed and due tasks taken and granted within the queues' limits.
async fn in_transaction(
    conn: &mut Db,
    engine: &Context,
    queue: Option<&str>,
    wants: &[Want],
    completions: &[Completion],
    granted: &Mutex<Vec<(i64, String, Lease)>>,
) -> Result<Outcome, ApiError> {
    // The workers' leases the requests name (for their claims and their completions alike)
    // are checked while the transaction's first statements run, so that lease-service's answer
    // costs no round trip of its own; but only once the transaction has begun: a completion is
    // recorded at the transaction's `now()`, and a lease proven held before that moment could
    // have been superseded before it too (the invariant checker's "not superseded" caught
    // that, under load).
    //
    // Those statements take the locks this transaction waits for, in the one order every
    // transaction takes them: the carried completions' tasks by id ([`complete::lock_rows`]),
    // then the limited queues by name. The due and lapsed tasks are taken later with
    // `SKIP LOCKED`, which never waits. A queue this replica last found without limits is
    // locked here, beside the lease check; any other once the completions are judged (see
    // `Unlimited`): its room counts the slots they free.
    let lock_early = queue.is_some_and(|queue| engine.unlimited.known(queue));
    let (standing, locked) = tokio::join!(Standing::read(engine, wants), async {
        let rows = complete::lock_rows(conn, completions).await?;
        let limits = if lock_early {
            Some(Limits::lock(conn, queue).await?)
        } else {
            None
        };
        Ok::<_, ApiError>((rows, limits))
    });
    let (rows, locked) = locked?;
    // A claim that names a lease not held gets nothing (and takes no room).
    let verdicts: Vec<Result<(), ApiError>> = wants
        .iter()
        .map(|want| standing.verdict(engine, want))
        .collect();
    // What the claiming below reads of each request (its completions were taken above).
    let screened: Vec<Want> = wants
        .iter()
        .zip(&verdicts)
        .map(|(want, verdict)| Want {
            processor: want.processor.clone(),
            limit: if verdict.is_ok() { want.limit } else { 0 },
            lease: want.lease.clone().filter(|_| verdict.is_ok()),
            completions: Vec::new(),
        })
        .collect();
    let completed = if completions.is_empty() {
        Vec::new()
    } else {
        complete::judge(conn, engine, completions, &standing.held, rows).await?
    };
    let locked = match locked {
        Some(locked) => locked,
        None => Limits::lock(conn, queue).await?,
    };
    // Counted after the completions, whose slots they free.
    let mut limits = locked.count(conn).await?;
    if let Some(queue) = queue {
        engine.unlimited.learn(queue, limits.is_unlimited());
    }
    let mut round = Round::new(&screened);
    take(conn, engine, queue, &mut round, &mut limits, granted).await?;
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
    Ok(Outcome {
        claimed: round.claimed,
        refused,
        completed,
        exhausted: round.exhausted,
        cancelled: round.cancelled,
        bound: limits.bound,
        verdicts,
    })
}

/// Takes the group's tasks: the lapsed first, then the due, within the room its requests and
/// the queues' limits leave.
///
/// Lapsed tasks that are only to be ended are taken apart from those to claim, so that they
/// never fill the places of claimable ones (nor spend a request's room). One lease-service
/// batch holds the claimable and the exhausted: the exhausted fill what the claimable left of
/// it. A claim of one queue without limits locks its due tasks in the same statement, for the
/// room the claimable lapsed ones leave, and claims those of requests that named their
/// process's lease.
async fn take(
    conn: &mut Db,
    engine: &Context,
    queue: Option<&str>,
    round: &mut Round<'_>,
    limits: &mut Limits,
    granted: &Mutex<Vec<(i64, String, Lease)>>,
) -> Result<(), ApiError> {
    let wants = round.wants;
    let total: i64 = wants.iter().map(|want| want.limit).sum();
    let due_slots =
        (queue.is_some() && limits.is_unlimited()).then(|| slots(wants, engine.lease_ttl));
    let with_due = due_slots.is_some();
    let taken =
        split_lapsed(repo::take_lapsed(conn, queue, total, MAX_CLAIM, due_slots.as_ref()).await?);
    round.cancelled = taken.cancelled;
    let read_due = usize::try_from(total)
        .unwrap_or(0)
        .saturating_sub(taken.lapsed.iter().filter(|task| !exhausted(task)).count());
    let got_due = taken.due.len() + taken.claimed.len();
    // Lapsed tasks taken again keep the slots they held, but spend tokens; due ones need both.
    // The lapsed fill the group's first slots, the due claimed already the slots after them.
    let lapsed = limits.admit_lapsed(taken.lapsed, exhausted);
    round.grant(conn, engine, lapsed, limits, granted).await?;
    round.record(taken.claimed);
    let room = limits.cap(queue, total - round.taken());
    if room <= 0 {
        return Ok(());
    }
    // Read again only when the statement read all the room it had and a lapsed task was then
    // not taken (its lease still held), which left more room: its own rows come back among the
    // first, locked already.
    let more = usize::try_from(room).unwrap_or(0) > taken.due.len() && got_due >= read_due;
    let due = if with_due && !more {
        taken.due
    } else {
        limits.lock_due(conn, queue, room).await?
    };
    let admitted = limits.admit(due);
    round.grant(conn, engine, admitted, limits, granted).await
}

impl Outcome {
    /// After the commit: counts what the group did, and releases the leases of the tasks it
    /// ended (exhausted or cancelled).
    async fn account(&self, engine: &Context, wants: &[Want]) {
        let metrics = &engine.metrics;
        for (queue, limit) in &self.bound {
            metrics
                .limit_waits
                .with_label_values(&[queue.as_str(), limit])
                .inc();
        }
        for (want, rows) in wants.iter().zip(&self.claimed) {
            for row in rows {
                metrics
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
        for (row, holder, lease) in &self.exhausted {
            metrics
                .dead
                .with_label_values(&[row.queue.as_str(), "attempts_exhausted"])
                .inc();
            if let Some(lease) = lease {
                engine
                    .release_after_commit(row.id, holder, lease.proof())
                    .await;
            }
        }
        end_cancelled(engine, &self.cancelled).await;
    }

    /// Each request's answer: its tasks (or why it got none) and its completions' verdicts.
    fn answers(self, wants: &[Want]) -> Vec<Claimed> {
        let refused = self.refused;
        let mut completed = self.completed.into_iter();
        wants
            .iter()
            .zip(self.claimed)
            .zip(self.verdicts)
            .map(|((want, tasks), verdict)| Claimed {
                tasks: match (&refused, verdict) {
                    (_, Err(err)) => Err(err),
                    (Some(err), Ok(())) => Err(err.clone()),
                    (None, Ok(())) => Ok(tasks),
                },
                completed: completed.by_ref().take(want.completions.len()).collect(),
            })
            .collect()
    }
}

/// After the commit that ended lapsed tasks as cancelled: counts them, and releases their
/// leases on their last workers' behalf, should any still be live.
pub async fn end_cancelled(engine: &Context, cancelled: &[TaskRow]) {
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::taken::owner_of;
    use super::*;
    use crate::tasks::fixtures;
    use leasehold::tasks::TaskStatus;

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
