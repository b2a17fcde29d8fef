//! Retention: deletes leases that ended long ago, and their history, so the tables do not grow
//! forever.
//!
//! Every replica runs the loop, but a round only sweeps on the replica that holds the lease
//! [`SWEEPER_RESOURCE`]; the others stand by. The lease is taken with the same statement
//! clients use (straight through the repository, not over HTTP: this *is* the lease service),
//! and kept by reentrant acquires, so a dead sweeper is replaced once its lease expires.

use rand::Rng;
use tokio_util::sync::CancellationToken;

use crate::db::{self, DbPool};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::repo::{self, Acquired};

/// The lease the sweeping replica holds.
pub const SWEEPER_RESOURCE: &str = "leasehold:lease-retention-sweeper";

/// Rows deleted per statement, so one round never holds many locks for long.
const BATCH: i64 = 1000;

pub use leasehold::server::startup::SweeperConfig;

/// Runs rounds until `stop`, then releases the lease so another replica takes over at once.
pub async fn run(pool: DbPool, metrics: Metrics, config: SweeperConfig, stop: CancellationToken) {
    // Long enough to survive one missed round, so the same replica keeps sweeping.
    let ttl_seconds = i32::try_from(config.interval.as_secs().saturating_mul(3))
        .unwrap_or(i32::MAX)
        .max(1);
    loop {
        // The first round comes one interval after start, like every other: a replica that
        // restarts often must not sweep more often. Jitter keeps replicas from contending.
        let jitter = rand::rng().random_range(0.9..1.1);
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(config.interval.mul_f64(jitter)) => {}
        }
        let outcome = match round(&pool, &config, ttl_seconds).await {
            Ok(Some(deleted)) => {
                metrics.swept.inc_by(deleted);
                if deleted > 0 {
                    tracing::info!(deleted, "retention sweeper deleted ended leases");
                }
                "swept"
            }
            Ok(None) => "standby",
            Err(err) => {
                tracing::warn!(error = %err, "retention sweep failed");
                "failed"
            }
        };
        metrics.sweeps.with_label_values(&[outcome]).inc();
    }
    // A pooled connection may have been opened by an HTTP worker whose runtime has just stopped
    // with the server, taking the connection with it; the pool drops a connection that failed,
    // so a second or third try gets a live one.
    for attempt in 1..=3 {
        match hand_over(&pool, &config.holder).await {
            Ok(()) => return,
            Err(err) => tracing::debug!(
                error = %err,
                attempt,
                "could not release the sweeper lease"
            ),
        }
    }
    tracing::warn!("could not release the sweeper lease; it will expire");
}

/// One round: `Some(deleted)` if this replica holds the sweeper lease, `None` if another does.
async fn round(
    pool: &DbPool,
    config: &SweeperConfig,
    ttl_seconds: i32,
) -> Result<Option<u64>, ApiError> {
    let mut conn = db::connection(pool).await?;
    // In-process and trusted: it proves nothing, and its reentrant acquire needs no secret. The
    // stored digest is of a random secret nobody knows, so the lease cannot be renewed or
    // released through the API by someone who knows only this replica's name.
    let secret_hash = leasehold::server::sha256(&crate::leases::new_secret());
    let proof = repo::AcquireProof {
        new_secret_hash: &secret_hash,
        presented_hash: None,
        require_secret: false,
    };
    match repo::acquire(
        &mut conn,
        SWEEPER_RESOURCE,
        &config.holder,
        ttl_seconds,
        proof,
        None,
    )
    .await?
    {
        Acquired::New(_) | Acquired::Reentrant(_) => {}
        Acquired::Held(_) | Acquired::Contended => return Ok(None),
    }
    repo::prune_history(&mut conn, config.retention_seconds).await?;
    let mut deleted = 0u64;
    loop {
        let batch = repo::sweep(&mut conn, config.retention_seconds, BATCH).await?;
        deleted += u64::try_from(batch).unwrap_or(0);
        if i64::try_from(batch).unwrap_or(0) < BATCH {
            return Ok(Some(deleted));
        }
    }
}

/// Releases the sweeper lease at shutdown, so another replica takes over at its next round.
async fn hand_over(pool: &DbPool, holder: &str) -> Result<(), ApiError> {
    let mut conn = db::connection(pool).await?;
    repo::release(&mut conn, SWEEPER_RESOURCE, holder, None, None, None).await?;
    Ok(())
}
