//! `PUT /api/tasks/complete` with `next`: a worker's completions and its claim of the next
//! tasks in one request and one transaction. A one-slot worker that finishes a task and wants
//! another makes one request where it made two, and task-service commits once where it
//! committed twice. The claim joins its queue's claim group like any claim ([`super::claim`]),
//! and the group judges the completions it carries before it claims, each exactly as
//! `PUT /{id}/complete` would judge it alone. It never waits: the completions' answers must not
//! wait for work to come.

use leasehold::server::ApiError;
use leasehold::server::db::DbPool;
use leasehold::server::peer::Peer;
use leasehold::tasks::{ClaimNext, CompleteTasks, CompletedTasks, ItemError};
use tracing::field::Empty;

use super::complete::{checked, item_results};
use super::hand_back::hand_back;
use super::next::{answered, submit, want_of};
use super::{ClaimGroups, span_ids as ids};
use crate::context::Context;

/// Judges `request`'s completions, then claims what `next` asks for, in one transaction.
#[tracing::instrument(name = "complete tasks and claim", skip_all, fields(
    task.processor = %request.processor,
    task.queue = next.queue.as_deref().unwrap_or(""),
    task.ids = Empty,
    task.claimed = Empty,
))]
pub async fn complete_then_claim(
    (claims, pool): (&ClaimGroups, &DbPool),
    engine: &Context,
    request: &CompleteTasks,
    next: &ClaimNext,
    client: &Peer,
) -> Result<CompletedTasks, ApiError> {
    let completions = checked(request)?;
    let span = tracing::Span::current();
    span.record("task.ids", ids(completions.iter().map(|c| c.item.id)));
    let mut want = want_of(
        &request.processor,
        next.queue.as_deref(),
        next.limit,
        next.worker.as_ref(),
    )?;
    want.completions = completions.iter().map(|c| c.item.clone()).collect();
    let claimed = submit(claims, next.queue.clone(), want).await?;
    let results = item_results(engine, &completions, claimed.completed).await;
    let (claimed, claim_refused) = match claimed.tasks {
        // The client gave up on the answer (a timeout on a slow commit): its completions
        // stand, as they would have had the answer been lost on its way; the tasks go back.
        Ok(rows) if client.is_gone() && !rows.is_empty() => {
            hand_back(pool, engine, rows).await;
            (Vec::new(), None)
        }
        Ok(rows) => {
            span.record("task.claimed", ids(rows.iter().map(|row| row.id)));
            (answered(engine, rows, None), None)
        }
        Err(err) => (
            Vec::new(),
            Some(ItemError {
                status: actix_web::ResponseError::status_code(&err).as_u16(),
                error: err.body(),
            }),
        ),
    };
    Ok(CompletedTasks {
        results,
        claimed: Some(claimed),
        claim_refused,
    })
}
