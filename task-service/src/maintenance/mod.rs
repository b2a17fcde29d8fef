//! The background jobs, one module each, composed in one place ([`run`]), as River's
//! `internal/maintenance`:
//!
//! | job | runs on | what it does |
//! |---|---|---|
//! | [`LapsedCancellations`] | the leader | ends cancelled tasks whose workers stopped heartbeating, in queues no claim comes to |
//! | [`Rollup`] | the leader | folds finished minutes of history into the charts' rollup |
//! | [`Retention`] | the leader | deletes finished tasks, history and rollup past the retention |
//! | [`schedule_ticker`] | every replica | makes due schedules' ticks; a row lock decides which replica makes each |
//! | the wake-up listener | every replica | relays `NOTIFY`s to claims waiting on this replica ([`leasehold::server::wakeups`]) |
//!
//! The [`leader`] is the replica that holds one lease from lease-service; it runs its three
//! jobs in one round, in the table's order. Every job stops when `stop` is cancelled, a round
//! or a tick under way finishing first, and [`run`] returns once all have.

pub mod lapsed;
pub mod leader;
pub mod retention;
pub mod rollup;
pub mod schedule_ticker;

pub use lapsed::LapsedCancellations;
pub use leader::{LEADER_RESOURCE, LeaderConfig, LeaderJobs};
pub use retention::Retention;
pub use rollup::Rollup;

use leasehold::server::database::Database;
use leasehold::server::db::DbPool;
use leasehold::server::wakeups;
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::tasks;

/// Runs every job until `stop`.
pub async fn run(
    database: Database,
    pool: DbPool,
    engine: Context,
    leader: LeaderConfig,
    stop: CancellationToken,
) {
    let jobs = LeaderJobs {
        lapsed: LapsedCancellations,
        rollup: Rollup,
        retention: Retention {
            retention_seconds: leader.retention_seconds,
        },
    };
    let listener = wakeups::listen(
        database,
        tasks::WAKEUP_CHANNEL,
        "task-service wake-ups",
        engine.wakeups.clone(),
        stop.clone(),
    );
    let ticker = schedule_ticker::run(pool.clone(), engine.clone(), stop.clone());
    let leading = leader::run(pool, engine, leader, jobs, stop);
    // Boxed: the jobs' futures are large, and this one is moved onto a task of its own.
    Box::pin(async move {
        tokio::join!(listener, ticker, leading);
    })
    .await;
}
