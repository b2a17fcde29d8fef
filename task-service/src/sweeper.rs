//! Retention: deletes tasks that finished long ago, so the table does not grow forever; ends as
//! cancelled the running tasks whose cancellation was asked for and whose workers then stopped
//! heartbeating, in queues no claim comes to end them in; and folds the history's finished
//! minutes into the per-minute rollup the dashboard's hour and day charts read
//! (`repo::fold_history`), pruning it with the history.
//!
//! Every replica runs a [`leasehold::Singleton`] on the lease [`SWEEPER_RESOURCE`] from
//! lease-service (holder: this replica's instance id, TTL three intervals); only the one that
//! holds it runs rounds ([`Singleton::run_periodic`]). When lease-service cannot be reached,
//! nobody sweeps, which is always safe.
//!
//! Timing, as `run_periodic` has it: the leader sweeps as soon as it takes the lease, then every
//! interval, measured from the start of one round to the start of the next, without jitter;
//! standbys try to take over every interval, jittered by ±20%. (The hand-written loop this
//! replaces slept the interval ±10% after each round, on every replica, before acquiring the
//! lease reentrantly and sweeping, so its first round came one interval after start, and it
//! counted a `standby` round each time another replica held the lease: the singleton does not
//! report those tries, so `task_retention_runs_total` now counts only the rounds run, `swept`
//! or `failed`.)
//!
//! A round is never cut short: losing the lease only stops waiting for it, and shutdown waits
//! for it before the lease is released, so cancellations that commit always get their task
//! leases released and counted ([`tasks::end_cancelled`]).

use std::sync::Arc;
use std::time::Duration;

use leasehold::server::ApiError;
use leasehold::server::db::{self, DbPool};
use leasehold::{GuardConfig, Singleton};
use tokio_util::sync::CancellationToken;

use crate::repo;
use crate::tasks::{self, Engine};

pub const SWEEPER_RESOURCE: &str = "leasehold:task-retention-sweeper";
const BATCH: i64 = 1000;

pub use leasehold::server::startup::SweeperConfig;

pub async fn run(pool: DbPool, engine: Engine, config: SweeperConfig, stop: CancellationToken) {
    // Long enough to survive one missed renewal, so the same replica keeps sweeping.
    let ttl = config
        .interval
        .saturating_mul(3)
        .max(Duration::from_secs(1));
    let singleton = Singleton::new(
        engine.leases_retrying(),
        GuardConfig::new(SWEEPER_RESOURCE, &config.holder).ttl(ttl),
        config.interval,
    );
    // The singleton drops its job the moment it is told to stop, which could cut a round between
    // committing cancellations and releasing their leases. So it is told only once no round
    // runs, and no round starts once `stop` is cancelled.
    let rounds = Arc::new(tokio::sync::Mutex::new(()));
    let contend = CancellationToken::new();
    let gate = {
        let (rounds, contend, stop) = (rounds.clone(), contend.clone(), stop.clone());
        async move {
            stop.cancelled().await;
            let _idle = rounds.lock().await;
            contend.cancel();
        }
    };
    let retention_seconds = config.retention_seconds;
    let sweeping = singleton.run_periodic(contend, config.interval, move |_lease| {
        let (pool, engine, rounds, stop) =
            (pool.clone(), engine.clone(), rounds.clone(), stop.clone());
        async move {
            let busy = rounds.lock_owned().await;
            if stop.is_cancelled() {
                return;
            }
            // Spawned, so that a lease lost mid-round drops only this wait, not the round.
            let round = tokio::spawn(async move {
                let _busy = busy;
                round(&pool, &engine, retention_seconds).await;
            });
            if round.await.is_err() {
                tracing::warn!("a retention sweeper round panicked");
            }
        }
    });
    let sweeping = async {
        if let Err(err) = sweeping.await {
            tracing::error!(error = %err, "the retention sweeper cannot hold its lease");
        }
    };
    tokio::join!(sweeping, gate);
}

async fn round(pool: &DbPool, engine: &Engine, retention_seconds: i64) {
    let metrics = &engine.metrics;
    let outcome = match sweep(pool, engine, retention_seconds).await {
        Ok(deleted) => {
            metrics.swept.inc_by(deleted);
            if deleted > 0 {
                tracing::info!(deleted, "retention sweeper deleted finished tasks");
            }
            "swept"
        }
        Err(err) => {
            tracing::warn!(error = %err, "task retention sweep failed");
            "failed"
        }
    };
    metrics.sweeps.with_label_values(&[outcome]).inc();
}

/// Folds the history's finished minutes into the charts' per-minute rollup
/// ([`repo::fold_history`]), a chunk a transaction, until it is caught up: the charts then read
/// raw history only since the last round, at most one interval and a minute or two.
async fn fold(conn: &mut repo::Db) -> Result<(), ApiError> {
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

async fn sweep(pool: &DbPool, engine: &Engine, retention_seconds: i64) -> Result<u64, ApiError> {
    let mut conn = db::connection(pool).await?;
    loop {
        let cancelled = repo::cancel_lapsed(&mut conn, None, BATCH).await?;
        tasks::end_cancelled(engine, &cancelled).await;
        if i64::try_from(cancelled.len()).unwrap_or(0) < BATCH {
            break;
        }
    }
    // Before the history is pruned, so that no event is pruned unfolded; a fold that fails
    // leaves the charts reading more raw history, and retention goes on.
    if let Err(err) = fold(&mut conn).await {
        tracing::warn!(error = %err, "folding the history into the charts' rollup failed");
    }
    repo::prune_history(&mut conn, retention_seconds).await?;
    repo::prune_rollup(&mut conn, retention_seconds).await?;
    let mut deleted = 0u64;
    loop {
        let batch = repo::sweep(&mut conn, retention_seconds, BATCH).await?;
        deleted += u64::try_from(batch).unwrap_or(0);
        if i64::try_from(batch).unwrap_or(0) < BATCH {
            return Ok(deleted);
        }
    }
}
