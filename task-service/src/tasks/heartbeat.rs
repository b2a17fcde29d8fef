//! A worker's heartbeat on its task: the lease of the claim proven alive (renewed, or its
//! worker process's checked) while the row is locked, and the task's deadline moved on.

use std::time::Duration;

use diesel_async::AsyncConnection;
use leasehold::LeaseError;
use leasehold::server::{ApiError, validate_name};
use leasehold::tasks::{Heartbeat, Task};
use tracing::field::Empty;

use super::owner::{finish, owned};
use super::refusal::lease_refusal;
use super::{Transition, cover};
use crate::context::Context;
use crate::repo::{self, Db, TaskRow};

#[tracing::instrument(name = "heartbeat task", skip_all, fields(
    task.id = id,
    task.processor = %request.processor,
    task.fence = request.fence.unwrap_or_default(),
    task.queue = Empty,
    task.status = Empty,
))]
pub async fn heartbeat(
    conn: &mut Db,
    engine: &Context,
    id: i64,
    request: &Heartbeat,
) -> Result<Task, ApiError> {
    validate_name("processor", &request.processor)?;
    let processor = request.processor.as_str();
    let (outcome, ttl) = conn
        .transaction::<_, ApiError, _>(async |conn| {
            let task = match owned(conn, id, processor, request.fence, None).await? {
                Ok(task) => task,
                Err(cancelled) => return Ok((cancelled, None)),
            };
            let (expiry, ttl) = keep_alive(engine, &task, processor).await?;
            let row = repo::record_heartbeat(conn, id, expiry, engine.lease_ttl).await?;
            Ok((Transition::Done(row), Some(ttl)))
        })
        .await?;
    let task = finish(engine, outcome, processor).await?;
    // The answer says how long the lease lasts from here, for the worker's deadline.
    Ok(match ttl {
        Some(ttl) => task.with_lease_ttl(ttl),
        None => task,
    })
}

/// A heartbeat's proof that the claim's lease lives, with when the claim runs out (none: the
/// task lease TTL from now, by the database's clock) and how long the worker may count on it
/// from here. The task's own lease is renewed, and the claim runs out with it. A shared lease
/// (its worker process's, which the process's own beats renew) is checked, and the claim runs
/// out a task lease TTL after this heartbeat, or sooner with the shared lease: a process's task
/// stays its own only while both its heartbeats and its process's lease go on, so a task whose
/// claim answer never reached its worker is not kept by the process's lease.
async fn keep_alive(
    engine: &Context,
    task: &TaskRow,
    processor: &str,
) -> Result<(Option<chrono::DateTime<chrono::Utc>>, Duration), ApiError> {
    let refused = |err| lease_refusal(engine, "heartbeat", err);
    let Some(lease) = task.shared_lease() else {
        let lease = engine
            .leases
            .renew(
                &engine.resource(task.id),
                processor,
                task.lease_proof(),
                None,
            )
            .await
            .map_err(refused)?;
        let ttl = Duration::from_secs(u64::try_from(lease.ttl_seconds).unwrap_or(0));
        return Ok((Some(lease.expires_at), ttl));
    };
    let checks = cover::check(engine, &[lease]).await.map_err(refused)?;
    let Some(check) = checks.first() else {
        return Err(refused(LeaseError::Unavailable("no answer".to_owned())));
    };
    cover::verdict(check).map_err(refused)?;
    let lease_left =
        Duration::from_millis(u64::try_from(check.expires_in_ms.unwrap_or(0)).unwrap_or(0));
    Ok((None, engine.lease_ttl.min(lease_left)))
}
