//! Retention: deletes tasks that finished long ago, with their history and its rollup, so the
//! tables do not grow forever.

use leasehold::server::ApiError;

use crate::repo::{self, Db};

/// Rows one statement deletes, so that one round never holds many locks for long.
const BATCH: i64 = 1000;

#[derive(Debug, Clone)]
pub struct Retention {
    /// Finished tasks, and history, older than this go.
    pub retention_seconds: i64,
}

impl Retention {
    /// Prunes the history and the rollup, then deletes finished tasks a batch at a time: how
    /// many tasks went.
    pub async fn run(&self, conn: &mut Db) -> Result<u64, ApiError> {
        repo::prune_history(conn, self.retention_seconds).await?;
        repo::prune_rollup(conn, self.retention_seconds).await?;
        let mut deleted = 0u64;
        loop {
            let batch = repo::sweep(conn, self.retention_seconds, BATCH).await?;
            deleted += u64::try_from(batch).unwrap_or(0);
            if i64::try_from(batch).unwrap_or(0) < BATCH {
                return Ok(deleted);
            }
        }
    }
}
