//! Completing tasks (`PUT /api/tasks/{id}/complete` and the batch `PUT /api/tasks/complete`).
//! Releasing the task's own lease (or checking the worker process's lease that covers it) is the
//! final proof of ownership, so a completion costs a lease-service call made while the row is
//! locked; single completions are gathered into groups
//! ([`CompletionGroups`]) that share one transaction and one batch release, and a batch request
//! is one such group. Each completion is still judged exactly as it would be alone.

use leasehold::ErrorCode;
use leasehold::LeaseError;
use leasehold::api::Proof;
use leasehold::server::db::Contended;
use leasehold::server::{ApiError, check_batch_size, first_duplicate, validate_name};
use leasehold::tasks::{
    CompleteItem, CompleteTask, CompleteTasks, ItemResult, MAX_COMPLETE_BATCH, Task, TaskStatus,
};
use tracing::field::Empty;

use super::owner::{check_owner, finish};
use super::refusal::{lease_refusal, task_not_found};
use super::validate::check_size;
use super::{CompletionGroups, Transition, cover};
use crate::context::Context;
use crate::repo::{self, Db, TaskRow};

/// One completion in a group: who completes which task, with what output, and the worker
/// process's lease its request named (`next.worker`), which should be the one covering the
/// task: once the group has proven that lease held, the completion is judged in one statement
/// ([`repo::mark_succeeded_covered`]).
#[derive(Debug, Clone)]
pub struct Completion {
    pub processor: String,
    pub item: CompleteItem,
    pub lease: Option<(String, i64)>,
}

/// How many waiting completions, from the front, go in one group: at most [`MAX_COMPLETE_BATCH`], and
/// never one task twice (a repeat waits for the next group, and is judged after the first).
pub fn completions_per_group(waiting: &[Completion]) -> usize {
    leasehold::server::coalesce::distinct_prefix(
        waiting.iter().map(|completion| completion.item.id),
        MAX_COMPLETE_BATCH,
    )
}

/// A worker's completion of one task (`PUT /{id}/complete`), judged in a group with the
/// completions that arrive with it ([`complete_group`]), exactly as it would be alone.
#[tracing::instrument(name = "complete task", skip_all, fields(
    task.id = id,
    task.processor = %request.processor,
    task.fence = request.fence.unwrap_or_default(),
    task.queue = Empty,
    task.status = Empty,
))]
pub async fn complete(
    groups: &CompletionGroups,
    engine: &Context,
    id: i64,
    request: CompleteTask,
) -> Result<Task, ApiError> {
    validate_name("processor", &request.processor)?;
    check_size("task_output", &request.task_output)?;
    let completion = Completion {
        processor: request.processor,
        item: CompleteItem {
            id,
            task_output: request.task_output,
            fence: request.fence,
        },
        lease: None,
    };
    let processor = completion.processor.clone();
    let outcome = groups
        .submit((), completion)
        .await
        .unwrap_or_else(|| Err(ApiError::Internal("the completion group failed".to_owned())));
    answer(engine, outcome, &processor).await
}

/// A worker's completions of several tasks (`PUT /api/tasks/complete`): one group. Each item is
/// answered with its own status; only a request that is wrong as a whole, or a database
/// failure, fails the request. (With `next`, [`super::complete_then_claim`] serves it.)
#[tracing::instrument(name = "complete tasks", skip_all, fields(task.processor = %request.processor))]
pub async fn complete_many(
    conn: &mut Db,
    engine: &Context,
    request: &CompleteTasks,
) -> Result<Vec<ItemResult>, ApiError> {
    let completions = checked(request)?;
    let outcomes = complete_group(conn, engine, &completions).await?;
    Ok(item_results(engine, &completions, outcomes).await)
}

/// A batch completion's completions, once the request as a whole is known to be well formed.
pub(super) fn checked(request: &CompleteTasks) -> Result<Vec<Completion>, ApiError> {
    validate_name("processor", &request.processor)?;
    check_batch_size(
        "tasks",
        "completions",
        request.tasks.len(),
        MAX_COMPLETE_BATCH,
    )?;
    if let Some(id) = first_duplicate(request.tasks.iter().map(|item| item.id)) {
        return Err(ApiError::invalid(
            ErrorCode::DuplicateTask,
            "tasks",
            format!("task {id} is listed twice"),
        ));
    }
    Ok(request
        .tasks
        .iter()
        .map(|item| Completion {
            processor: request.processor.clone(),
            item: item.clone(),
            lease: None,
        })
        .collect())
}

/// Each completion's answer, in order, as `PUT /{id}/complete` would have given it alone.
pub(super) async fn item_results(
    engine: &Context,
    completions: &[Completion],
    outcomes: Vec<Result<Transition, ApiError>>,
) -> Vec<ItemResult> {
    let mut results = Vec::with_capacity(completions.len());
    for (completion, outcome) in completions.iter().zip(outcomes) {
        let id = completion.item.id;
        results.push(match answer(engine, outcome, &completion.processor).await {
            Ok(task) => ItemResult {
                id,
                status: 202,
                task: Some(task),
                error: None,
            },
            Err(err) => ItemResult {
                id,
                status: actix_web::ResponseError::status_code(&err).as_u16(),
                task: None,
                error: Some(err.body()),
            },
        });
    }
    results
}

/// What a completion's transition answers: the task, or the refusal; counts completions.
async fn answer(
    engine: &Context,
    outcome: Result<Transition, ApiError>,
    processor: &str,
) -> Result<Task, ApiError> {
    let transition = outcome?;
    if let Transition::Done(row) = &transition {
        engine
            .metrics
            .completed
            .with_label_values(&[row.queue.as_str()])
            .inc();
    }
    finish(engine, transition, processor).await
}

/// Completions of distinct tasks, each by its own processor: one transaction, one lease-service
/// call (a batch release), one commit. Each is judged as if it came alone: refused unless its
/// processor owns the task (with the fence, if given); ended as cancelled if a cancellation was
/// asked for; else its lease is released, which is the final proof of ownership, and only then
/// is the task marked succeeded.
#[tracing::instrument(name = "complete group", skip_all, fields(
    task.group.size = completions.len(),
    task.ids = Empty,
))]
pub async fn complete_group(
    conn: &mut Db,
    engine: &Context,
    completions: &[Completion],
) -> Result<Vec<Result<Transition, ApiError>>, ApiError> {
    tracing::Span::current().record(
        "task.ids",
        super::span_ids(completions.iter().map(|c| c.item.id)),
    );
    // Its statements over sets of tasks kept prepared, on their generic plans: planned at each
    // call they took a quarter of what running them took.
    let mut retry = Contended::default();
    loop {
        let outcome = repo::in_index_order_generic(conn, async |conn| {
            let locked = lock_rows(conn, completions).await?;
            judge(conn, engine, completions, &[], locked).await
        })
        .await;
        if !retry.again(&outcome).await {
            return outcome;
        }
    }
}

/// The rows of the tasks `completions` name, locked in the order of their ids: the first thing
/// a transaction that judges completions does, and the only place it waits for a task's lock.
///
/// Every transaction that locks tasks without skipping them takes all its task rows this way,
/// at once, before any other lock it will wait for (a claim group's limited queues come after,
/// by name), so no two of them wait for each other. Judged in two steps (the rows a worker's
/// lease covers, then the rest), one request's locks followed no single order, and a stale
/// claimant's completion crossing the holder's deadlocked it.
pub(super) async fn lock_rows(
    conn: &mut Db,
    completions: &[Completion],
) -> Result<Locked, ApiError> {
    if completions.is_empty() {
        return Ok(Locked::default());
    }
    let ids: Vec<i64> = completions.iter().map(|c| c.item.id).collect();
    Ok(Locked(
        repo::lock_many(conn, &ids)
            .await?
            .into_iter()
            .map(|row| (row.id, row))
            .collect(),
    ))
}

/// The rows [`lock_rows`] locked, by id, as they were when locked.
#[derive(Debug, Default)]
pub struct Locked(std::collections::HashMap<i64, TaskRow>);

/// [`complete_group`]'s work inside a transaction that is already open: a claim group that
/// carries completions (`PUT /api/tasks/complete` with `next`) judges them this way before it
/// claims, in its own transaction.
///
/// `locked` are the completions' rows, locked already ([`lock_rows`]); `held` are shared leases
/// lease-service has said are held, asked after this transaction
/// began (its `now()` is the moment the completions are recorded at, and a lease must be held
/// after it) but before any of these rows was read: a completion naming one of them ends its
/// task in one statement if the row still shows that claimant under that lease, which is all
/// the slow path checks for such a task (the lease check proves the same before the row lock as
/// after it: nothing about the row changes what lease-service says). Every other completion,
/// and one the statement left alone, is judged the slow way: row locked, owner checked, lease
/// proven.
pub(super) async fn judge(
    conn: &mut Db,
    engine: &Context,
    completions: &[Completion],
    held: &[(String, i64)],
    locked: Locked,
) -> Result<Vec<Result<Transition, ApiError>>, ApiError> {
    let mut outcomes: Vec<Option<Result<Transition, ApiError>>> =
        completions.iter().map(|_| None).collect();
    judge_covered(conn, engine, completions, held, &mut outcomes).await?;
    let releasing = judge_locked(conn, completions, locked, &mut outcomes).await?;
    if !releasing.is_empty() {
        end_proven(conn, engine, completions, &releasing, &mut outcomes).await?;
    }
    Ok(completions
        .iter()
        .zip(outcomes)
        .map(|(completion, outcome)| {
            outcome.unwrap_or_else(|| {
                Err(ApiError::Internal(format!(
                    "task {} was not judged",
                    completion.item.id
                )))
            })
        })
        .collect())
}

/// The fast path: completions under a lease lease-service has said is `held` end their tasks in
/// one statement, if the rows still show those claimants under those leases.
async fn judge_covered(
    conn: &mut Db,
    engine: &Context,
    completions: &[Completion],
    held: &[(String, i64)],
    outcomes: &mut [Option<Result<Transition, ApiError>>],
) -> Result<(), ApiError> {
    let covered: Vec<repo::Covered<'_>> = completions
        .iter()
        .filter(|c| check_size("task_output", &c.item.task_output).is_ok())
        .filter_map(|c| {
            let (resource, fence) = c.lease.as_ref().filter(|lease| held.contains(lease))?;
            Some(repo::Covered {
                id: c.item.id,
                output: &c.item.task_output,
                processor: &c.processor,
                fence: c.item.fence,
                lease_resource: resource,
                lease_fence: *fence,
            })
        })
        .collect();
    if covered.is_empty() {
        return Ok(());
    }
    let at: std::collections::HashMap<i64, usize> = completions
        .iter()
        .enumerate()
        .map(|(index, c)| (c.item.id, index))
        .collect();
    for (row, took) in repo::mark_succeeded_covered(conn, &covered).await? {
        observe_completed(engine, &row, took);
        if let Some(&index) = at.get(&row.id) {
            outcomes[index] = Some(Ok(Transition::Done(row)));
        }
    }
    Ok(())
}

/// The slow path's first half: the owners of the completions not yet judged are checked on
/// their locked rows (which the fast path left as they were). Refusals and cancellations are
/// judged here; the tasks whose end is still to be proven by lease-service come back, with
/// their completions' places.
async fn judge_locked(
    conn: &mut Db,
    completions: &[Completion],
    Locked(mut locked): Locked,
    outcomes: &mut [Option<Result<Transition, ApiError>>],
) -> Result<Vec<(usize, TaskRow)>, ApiError> {
    let mut releasing: Vec<(usize, TaskRow)> = Vec::new();
    for (index, completion) in completions.iter().enumerate() {
        if outcomes[index].is_some() {
            continue;
        }
        let item = &completion.item;
        let verdict = match check_size("task_output", &item.task_output) {
            Err(err) => Err(err),
            Ok(()) => match locked.remove(&item.id) {
                None => Err(task_not_found(item.id)),
                Some(task) => match check_owner(&task, &completion.processor, item.fence) {
                    Err(err) => Err(err),
                    Ok(()) if task.cancel_requested => Ok(Transition::Cancelled(
                        repo::mark_final(conn, task.id, TaskStatus::Cancelled, None).await?,
                    )),
                    Ok(()) => {
                        releasing.push((index, task));
                        continue;
                    }
                },
            },
        };
        outcomes[index] = Some(verdict);
    }
    Ok(releasing)
}

/// The slow path's second half: lease-service proves each locked task's claim over (its own
/// lease released, or its worker's checked), and the proven ones end in one statement.
async fn end_proven(
    conn: &mut Db,
    engine: &Context,
    completions: &[Completion],
    releasing: &[(usize, TaskRow)],
    outcomes: &mut [Option<Result<Transition, ApiError>>],
) -> Result<(), ApiError> {
    let proofs = prove_ends(engine, completions, releasing).await;
    let mut succeeded: Vec<(usize, i64)> = Vec::new();
    for ((index, task), proof) in releasing.iter().zip(proofs) {
        match proof {
            Ok(()) => succeeded.push((*index, task.id)),
            Err(err) => outcomes[*index] = Some(Err(err)),
        }
    }
    if succeeded.is_empty() {
        return Ok(());
    }
    let done: Vec<(i64, &serde_json::Value)> = succeeded
        .iter()
        .map(|(index, id)| (*id, &completions[*index].item.task_output))
        .collect();
    for (row, took) in repo::mark_succeeded_many(conn, &done).await? {
        observe_completed(engine, &row, took);
        if let Some((index, _)) = succeeded.iter().find(|(_, id)| *id == row.id) {
            outcomes[*index] = Some(Ok(Transition::Done(row)));
        }
    }
    Ok(())
}

fn observe_completed(engine: &Context, row: &TaskRow, took: f64) {
    engine
        .metrics
        .claim_to_complete
        .with_label_values(&[row.queue.as_str()])
        .observe(took);
}

/// The final proof of ownership of each task a group completes, in order: the tasks under a
/// lease of their own release it (one batch), those under a shared lease (their worker
/// process's) have it checked (one read for every such task), both while the rows are locked.
/// Each failed proof is the refusal its completion answers with.
async fn prove_ends(
    engine: &Context,
    completions: &[Completion],
    releasing: &[(usize, TaskRow)],
) -> Vec<Result<(), ApiError>> {
    let refused = |err| lease_refusal(engine, "complete", err);
    let mut proofs: Vec<Option<Result<(), ApiError>>> = releasing.iter().map(|_| None).collect();
    let (shared, own): (Vec<usize>, Vec<usize>) =
        (0..releasing.len()).partition(|at| releasing[*at].1.shared_lease().is_some());
    if !own.is_empty() {
        let leases: Vec<(String, String, Proof<'_>)> = own
            .iter()
            .map(|at| {
                let (index, task) = &releasing[*at];
                (
                    engine.resource(task.id),
                    completions[*index].processor.clone(),
                    task.lease_proof(),
                )
            })
            .collect();
        match engine.leases.release_many(&leases).await {
            Ok(answers) => {
                for (at, answer) in own.iter().zip(answers) {
                    proofs[*at] = Some(answer.map(drop).map_err(refused));
                }
            }
            Err(err) => {
                let refusal = refused(err);
                for at in &own {
                    proofs[*at] = Some(Err(refusal.clone()));
                }
            }
        }
    }
    if !shared.is_empty() {
        let leases: Vec<(&str, i64)> = shared
            .iter()
            .filter_map(|at| releasing[*at].1.shared_lease())
            .collect();
        match cover::check(engine, &leases).await {
            Ok(checks) => {
                for (at, check) in shared.iter().zip(checks) {
                    proofs[*at] = Some(cover::verdict(&check).map_err(refused));
                }
            }
            Err(err) => {
                let refusal = refused(err);
                for at in &shared {
                    proofs[*at] = Some(Err(refusal.clone()));
                }
            }
        }
    }
    proofs
        .into_iter()
        .map(|proof| {
            proof.unwrap_or_else(|| Err(refused(LeaseError::Unavailable("not proven".to_owned()))))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completions(ids: &[i64]) -> Vec<Completion> {
        ids.iter()
            .map(|&id| Completion {
                processor: "w".to_owned(),
                item: CompleteItem {
                    id,
                    task_output: serde_json::json!({}),
                    fence: None,
                },
                lease: None,
            })
            .collect()
    }

    #[test]
    fn a_group_never_judges_one_task_twice() {
        assert_eq!(completions_per_group(&completions(&[1, 2, 3])), 3);
        assert_eq!(completions_per_group(&completions(&[1, 2, 1, 3])), 2);
    }

    #[test]
    fn a_group_holds_at_most_one_batch() {
        let ids: Vec<i64> =
            (0..i64::try_from(MAX_COMPLETE_BATCH).unwrap_or(i64::MAX) + 5).collect();
        assert_eq!(
            completions_per_group(&completions(&ids)),
            MAX_COMPLETE_BATCH
        );
    }
}
