//! A worker's snooze: its task back to pending, due later, the attempt not charged.

use diesel_async::AsyncConnection;
use leasehold::ErrorCode;
use leasehold::server::{ApiError, validate_name};
use leasehold::tasks::{MAX_SNOOZE_SECONDS, SnoozeTask, Task};
use tracing::field::Empty;

use super::Transition;
use super::owner::{finish, owned, prove_end};
use crate::context::Context;
use crate::repo::{self, Db};

/// The worker's snooze: its task back to pending, due in `seconds`, the attempt not charged
/// (the task was not tried, only put off), and its lease released in the same transaction, with
/// the fence. A cancellation asked for meanwhile wins, as for a failure.
#[tracing::instrument(name = "snooze task", skip_all, fields(
    task.id = id,
    task.processor = %request.processor,
    task.fence = request.fence.unwrap_or_default(),
    task.queue = Empty,
    task.status = Empty,
))]
pub async fn snooze(
    conn: &mut Db,
    engine: &Context,
    id: i64,
    request: &SnoozeTask,
) -> Result<Task, ApiError> {
    validate_name("processor", &request.processor)?;
    if !request.seconds.is_finite() || !(0.0..=MAX_SNOOZE_SECONDS).contains(&request.seconds) {
        return Err(ApiError::invalid(
            ErrorCode::InvalidSnooze,
            "seconds",
            format!(
                "seconds must be between 0 and {MAX_SNOOZE_SECONDS}, got {}",
                request.seconds
            ),
        ));
    }
    let processor = request.processor.as_str();
    let outcome = conn
        .transaction::<_, ApiError, _>(async |conn| {
            let task = match owned(conn, id, processor, request.fence, None).await? {
                Ok(task) => task,
                Err(cancelled) => return Ok(cancelled),
            };
            prove_end(engine, &task, processor, "snooze").await?;
            Ok(Transition::Done(
                repo::mark_retry(conn, id, None, request.seconds, true).await?,
            ))
        })
        .await?;
    finish(engine, outcome, processor).await
}
