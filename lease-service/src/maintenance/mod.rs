//! The background jobs, one module each, composed in one place ([`run`]), as River's
//! `internal/maintenance` (task-service's `maintenance` has the same shape):
//!
//! | job | runs on | what it does |
//! |---|---|---|
//! | [`retention`] | the replica holding the sweeper's lease | deletes ended leases and their history past the retention |
//! | the wake-up listener | every replica | relays `NOTIFY`s to acquires waiting on this replica ([`leasehold::server::wakeups`]) |
//!
//! Every job stops when `stop` is cancelled, and [`run`] returns once all have.

pub mod retention;

use leasehold::server::database::Database;
use leasehold::server::wakeups::{self, Wakeups};
use tokio_util::sync::CancellationToken;

use crate::db::DbPool;
use crate::leases;
use crate::metrics::Metrics;
pub use retention::SweeperConfig;

/// Runs every job until `stop`.
pub async fn run(
    database: Database,
    pool: DbPool,
    wakeups: Wakeups,
    metrics: Metrics,
    retention: SweeperConfig,
    stop: CancellationToken,
) {
    let listener = wakeups::listen(
        database,
        leases::WAKEUP_CHANNEL,
        "lease-service wake-ups",
        wakeups,
        stop.clone(),
    );
    let retention = retention::run(pool, metrics, retention, stop);
    tokio::join!(listener, retention);
}
