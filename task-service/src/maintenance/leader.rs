//! The leader: the replica that holds the lease [`LEADER_RESOURCE`] runs the jobs that must run
//! on one replica only ([`LeaderJobs`]: lapsed cancellations, the history rollup, retention), a
//! round every interval.
//!
//! Every replica runs a [`leasehold::Singleton`] on that lease from lease-service (holder: this
//! replica's instance id, TTL three intervals); only the one that holds it runs rounds
//! ([`Singleton::run_periodic`]). When lease-service cannot be reached, nobody runs them, which
//! is always safe.
//!
//! Timing, as `run_periodic` has it: the leader runs a round as soon as it takes the lease, then
//! every interval, measured from the start of one round to the start of the next, without
//! jitter; standbys try to take over every interval, jittered by ±20%. `task_retention_runs_total`
//! counts the rounds run, `swept` or `failed`.
//!
//! A round is never cut short: losing the lease only stops waiting for it, and shutdown waits
//! for it before the lease is released, so cancellations that commit always get their task
//! leases released and counted ([`crate::tasks::end_cancelled`]).

use std::sync::Arc;
use std::time::Duration;

use leasehold::server::ApiError;
use leasehold::server::db::{self, DbPool};
use leasehold::{GuardConfig, Singleton};
use tokio_util::sync::CancellationToken;

use super::lapsed::LapsedCancellations;
use super::retention::Retention;
use super::rollup::Rollup;
use crate::context::Context;

/// The lease the leader holds (named for the job it first had, and kept so that replicas of
/// an older build and this one elect one leader between them).
pub const LEADER_RESOURCE: &str = "leasehold:task-retention-sweeper";

/// Who the leader is and how often it runs its jobs.
pub use leasehold::server::startup::SweeperConfig as LeaderConfig;

/// The leader's jobs, in the order a round runs them.
#[derive(Debug, Clone)]
pub struct LeaderJobs {
    pub lapsed: LapsedCancellations,
    /// Before retention, so that no history is pruned before it is folded.
    pub rollup: Rollup,
    pub retention: Retention,
}

/// Contends for the lease on every replica and runs a round of `jobs` on the one that holds it,
/// until `stop`; a round under way when `stop` comes is finished first.
pub async fn run(
    pool: DbPool,
    engine: Context,
    config: LeaderConfig,
    jobs: LeaderJobs,
    stop: CancellationToken,
) {
    // Long enough to survive one missed renewal, so the same replica keeps leading.
    let ttl = config
        .interval
        .saturating_mul(3)
        .max(Duration::from_secs(1));
    let singleton = Singleton::new(
        engine.leases_retrying(),
        GuardConfig::new(LEADER_RESOURCE, &config.holder).ttl(ttl),
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
    let leading = singleton.run_periodic(contend, config.interval, move |_lease| {
        let (pool, engine, jobs, rounds, stop) = (
            pool.clone(),
            engine.clone(),
            jobs.clone(),
            rounds.clone(),
            stop.clone(),
        );
        async move {
            let busy = rounds.lock_owned().await;
            if stop.is_cancelled() {
                return;
            }
            // Spawned, so that a lease lost mid-round drops only this wait, not the round.
            let round = tokio::spawn(async move {
                let _busy = busy;
                round(&pool, &engine, &jobs).await;
            });
            if round.await.is_err() {
                tracing::warn!("a leader round panicked");
            }
        }
    });
    let leading = async {
        if let Err(err) = leading.await {
            tracing::error!(error = %err, "the leader cannot hold its lease");
        }
    };
    tokio::join!(leading, gate);
}

/// Runs each job once, on one connection, and counts the round.
async fn round(pool: &DbPool, engine: &Context, jobs: &LeaderJobs) {
    let ran = async {
        let mut conn = db::connection(pool).await?;
        jobs.lapsed.run(&mut conn, engine).await?;
        // A fold that fails leaves the charts reading more raw history; retention goes on.
        if let Err(err) = jobs.rollup.run(&mut conn).await {
            tracing::warn!(error = %err, "folding the history into the charts' rollup failed");
        }
        jobs.retention.run(&mut conn).await
    };
    let outcome = match ran.await {
        Ok(deleted) => {
            engine.metrics.swept.inc_by(deleted);
            if deleted > 0 {
                tracing::info!(deleted, "retention deleted finished tasks");
            }
            "swept"
        }
        Err::<_, ApiError>(err) => {
            tracing::warn!(error = %err, "a leader round failed");
            "failed"
        }
    };
    engine.metrics.sweeps.with_label_values(&[outcome]).inc();
}
