//! Retention: deletes tasks that finished long ago, so the table does not grow forever; and
//! ends as cancelled the running tasks whose cancellation was asked for and whose workers then
//! stopped heartbeating, in queues no claim comes to end them in.
//!
//! Every replica runs the loop; a round sweeps only on the replica that holds the lease
//! [`SWEEPER_RESOURCE`] from lease-service, kept by reentrant acquires round after round. When
//! lease-service cannot be reached, nobody sweeps, which is always safe.

use std::time::Duration;

use rand::Rng;
use shared::LeaseError;
use shared::api::{Proof, Secret};
use shared::server::ApiError;
use shared::server::db::{self, DbPool};
use tokio_util::sync::CancellationToken;

use crate::repo;
use crate::tasks::{self, Engine};

pub const SWEEPER_RESOURCE: &str = "leasehold:task-retention-sweeper";
const BATCH: i64 = 1000;

#[derive(Debug, Clone)]
pub struct SweeperConfig {
    pub holder: String,
    pub interval: Duration,
    pub retention_seconds: i64,
}

pub async fn run(pool: DbPool, engine: Engine, config: SweeperConfig, stop: CancellationToken) {
    let leases = &engine.leases_retrying;
    let metrics = &engine.metrics;
    // Long enough to survive one missed round, so the same replica keeps sweeping.
    let ttl = config
        .interval
        .saturating_mul(3)
        .max(Duration::from_secs(1));
    // The secret of the sweeper lease while this replica holds it: its next round's reentrant
    // acquire, and its release, must present it when lease-service requires proof.
    let mut secret: Option<Secret> = None;
    loop {
        let jitter = rand::rng().random_range(0.9..1.1);
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(config.interval.mul_f64(jitter)) => {}
        }
        let outcome = match leases
            .acquire_proving(SWEEPER_RESOURCE, &config.holder, Some(ttl), secret.as_ref())
            .await
        {
            Ok((lease, _)) => {
                if lease.secret.is_some() {
                    secret = lease.secret;
                }
                match sweep(&pool, &engine, config.retention_seconds).await {
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
                }
            }
            Err(LeaseError::Held { .. }) => {
                secret = None;
                "standby"
            }
            Err(err) => {
                tracing::debug!(error = %err, "could not take the sweeper lease");
                "failed"
            }
        };
        metrics.sweeps.with_label_values(&[outcome]).inc();
    }
    let proof = Proof {
        fence: None,
        secret: secret.as_ref().map(Secret::expose),
    };
    if let Err(err) = leases
        .release(SWEEPER_RESOURCE, &config.holder, proof)
        .await
    {
        tracing::debug!(error = %err, "sweeper lease not released; it will expire");
    }
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
    repo::prune_history(&mut conn, retention_seconds).await?;
    let mut deleted = 0u64;
    loop {
        let batch = repo::sweep(&mut conn, retention_seconds, BATCH).await?;
        deleted += u64::try_from(batch).unwrap_or(0);
        if i64::try_from(batch).unwrap_or(0) < BATCH {
            return Ok(deleted);
        }
    }
}
