//! An operator's retry of a dead or cancelled task.

use diesel_async::AsyncConnection;
use leasehold::ErrorCode;
use leasehold::server::ApiError;
use leasehold::tasks::{Task, TaskStatus};

use super::{locked, to_api};
use crate::context::Context;
use crate::repo::{self, Db};

/// An operator's retry of a dead task (`POST /{id}/retry`): pending again, due now, with its
/// attempts renewed; any other status is 409 `not_dead`.
pub async fn retry(conn: &mut Db, engine: &Context, id: i64) -> Result<Task, ApiError> {
    let row = conn
        .transaction::<_, ApiError, _>(async |conn| {
            let task = locked(conn, id).await?;
            match task.status {
                TaskStatus::Dead => Ok(repo::requeue_dead(conn, id).await?),
                other => Err(ApiError::Conflict {
                    code: ErrorCode::NotDead,
                    message: format!(
                        "task {id} is {}: only a dead task can be retried",
                        other.as_str()
                    ),
                }),
            }
        })
        .await?;
    engine
        .metrics
        .retried
        .with_label_values(&[row.queue.as_str()])
        .inc();
    tracing::info!(
        task.id = id,
        "dead task put back in its queue by an operator"
    );
    Ok(to_api(row))
}
