//! An operator's cancellation: a pending task at once, a running one once its worker hears.

use diesel_async::AsyncConnection;
use leasehold::server::ApiError;
use leasehold::tasks::{Task, TaskStatus};

use super::refusal::finished;
use super::{locked, to_api};
use crate::context::Context;
use crate::repo::{self, Db};

/// A pending task is cancelled at once (200, `Ok(true)`); a running one is marked, and its
/// worker's next heartbeat or completion ends it (202, `Ok(false)`).
pub async fn cancel(conn: &mut Db, engine: &Context, id: i64) -> Result<(Task, bool), ApiError> {
    let (row, immediate) = conn
        .transaction::<_, ApiError, _>(async |conn| {
            let task = locked(conn, id).await?;
            match task.status {
                TaskStatus::Pending => Ok((
                    repo::mark_final(conn, id, TaskStatus::Cancelled, None).await?,
                    true,
                )),
                TaskStatus::Running => Ok((repo::request_cancel(conn, id).await?, false)),
                done => Err(finished(id, done)),
            }
        })
        .await?;
    if immediate {
        engine
            .metrics
            .cancelled
            .with_label_values(&[row.queue.as_str()])
            .inc();
    }
    Ok((to_api(row), immediate))
}
