//! Tasks claimed for a client that left before its answer came (a long-poll claim whose client
//! timed out while a task arrived, a complete-then-claim whose client gave up on a slow
//! commit). Nobody will run them, so each goes back to pending at once, its attempt not
//! charged, as a worker shutting down hands back what it cannot finish: otherwise it would sit
//! `running` for its lease's TTL, and one with `max_attempts: 1` would end `dead` untried.

use leasehold::server::db::{self, DbPool};
use leasehold::tasks::FailTask;

use super::fail::fail;
use crate::context::Context;
use crate::repo::TaskRow;

/// Why the history shows the hand-back.
pub const CLIENT_LEFT: &str = "the claim's client left before its answer";

/// Hands `rows`, just claimed for a departed client, back to pending. A task that cannot be
/// handed back (the database or lease-service unavailable) stays claimed, and is claimable
/// again once its lease runs out, as before; the log says which.
pub async fn hand_back(pool: &DbPool, engine: &Context, rows: Vec<TaskRow>) {
    for row in rows {
        let request = FailTask {
            processor: row.processor.clone().unwrap_or_default(),
            error: CLIENT_LEFT.to_owned(),
            fence: row.fence,
            retryable: true,
            requeue: true,
        };
        let handed = match db::connection(pool).await {
            Ok(mut conn) => fail(&mut conn, engine, row.id, &request).await.map(drop),
            Err(err) => Err(err),
        };
        match handed {
            Ok(()) => tracing::info!(
                task.id = row.id,
                "claimed for a client that left; handed back"
            ),
            Err(err) => tracing::warn!(
                task.id = row.id,
                error = %err,
                "claimed for a client that left, and could not be handed back; it is claimable once its lease runs out"
            ),
        }
    }
}
