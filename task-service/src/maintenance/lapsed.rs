//! Lapsed cancellations: a running task whose cancellation was asked for ends as `cancelled` at
//! its worker's next heartbeat; if that worker has stopped heartbeating, a claim of its queue
//! ends it ([`crate::repo::cancel_lapsed`] in the claim). In a queue no claim comes to, this
//! job ends it once its lease has lapsed, and releases the lease.

use leasehold::server::ApiError;

use crate::context::Context;
use crate::repo::{self, Db};
use crate::tasks;

/// Tasks one statement ends; more are taken by the next, at once.
const BATCH: i64 = 1000;

#[derive(Debug, Clone, Default)]
pub struct LapsedCancellations;

impl LapsedCancellations {
    /// Ends every lapsed cancellation, releasing and counting each as it commits.
    pub async fn run(&self, conn: &mut Db, engine: &Context) -> Result<(), ApiError> {
        loop {
            let cancelled = repo::cancel_lapsed(conn, None, BATCH).await?;
            tasks::end_cancelled(engine, &cancelled).await;
            if i64::try_from(cancelled.len()).unwrap_or(0) < BATCH {
                return Ok(());
            }
        }
    }
}
