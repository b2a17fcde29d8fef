//! The history rollup: folds the history's finished minutes into the per-minute rollup the
//! dashboard's hour and day charts read ([`crate::repo::fold_history`]), so that the charts read
//! raw history only since the last round, at most one interval and a minute or two.

use leasehold::server::ApiError;

use crate::repo::{self, Db};

#[derive(Debug, Clone, Default)]
pub struct Rollup;

impl Rollup {
    /// Folds a chunk a transaction until it is caught up.
    pub async fn run(&self, conn: &mut Db) -> Result<(), ApiError> {
        let mut minutes = 0;
        loop {
            let fold = repo::fold_history(conn).await?;
            minutes += fold.minutes;
            if !fold.more {
                break;
            }
        }
        tracing::debug!(minutes, "history folded into the charts' rollup");
        Ok(())
    }
}
