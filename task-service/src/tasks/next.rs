//! `POST /api/tasks/next`: one claim request, answered at once, or, when it asks to wait
//! (`wait_ms`) and nothing is due, as soon as a task is due or the wait ends. The claiming
//! itself is the claim group's ([`super::claim`]); the waiting is
//! [`leasehold::server::wakeups`]'s, on news the tasks table's triggers send to
//! [`WAKEUP_CHANNEL`] (see the migration `task_wakeups`).

use std::time::Duration;

use leasehold::ErrorCode;
use leasehold::server::db::DbPool;
use leasehold::server::peer::Peer;
use leasehold::server::{ApiError, validate_name, validate_name_within};
use leasehold::tasks::{ClaimTasks, MAX_CLAIM, MAX_CLAIM_WAIT_MS, MAX_QUEUE_CHARS, Task};
use leasehold::workers::ClaimantLease;
use tokio::time::Instant;
use tracing::field::Empty;

use super::claim::{Claimed, Want};
use super::hand_back::hand_back;
use super::{ClaimGroups, to_api};
use crate::context::Context;
use crate::repo::TaskRow;

/// The channel the tasks table notifies when tasks become pending (key: the queue).
pub const WAKEUP_CHANNEL: &str = "leasehold_tasks";

/// Checks a claim request; what it wants, and how long it may wait for it.
pub fn want(request: &ClaimTasks) -> Result<(Want, Duration), ApiError> {
    let want = want_of(
        &request.processor,
        request.queue.as_deref(),
        request.limit,
        request.worker.as_ref(),
    )?;
    let wait_ms = request.wait_ms.unwrap_or(0);
    if wait_ms > MAX_CLAIM_WAIT_MS {
        return Err(ApiError::invalid(
            ErrorCode::InvalidWait,
            "wait_ms",
            format!("wait_ms must be at most {MAX_CLAIM_WAIT_MS}, got {wait_ms}"),
        ));
    }
    Ok((want, Duration::from_millis(wait_ms)))
}

/// Checks what a claim asks for, whether it comes alone or after completions
/// ([`leasehold::tasks::ClaimNext`]).
pub fn want_of(
    processor: &str,
    queue: Option<&str>,
    limit: Option<i64>,
    worker: Option<&ClaimantLease>,
) -> Result<Want, ApiError> {
    validate_name("processor", processor)?;
    if let Some(queue) = queue {
        validate_name_within("queue", queue, MAX_QUEUE_CHARS)?;
    }
    let limit = limit.unwrap_or(1);
    if !(1..=MAX_CLAIM).contains(&limit) {
        return Err(ApiError::invalid(
            ErrorCode::InvalidLimit,
            "limit",
            format!("limit must be between 1 and {MAX_CLAIM}, got {limit}"),
        ));
    }
    let lease = match worker {
        None => None,
        Some(worker) => {
            crate::workers::check_id(&worker.id)?;
            if worker.fence < 1 {
                return Err(ApiError::invalid(
                    ErrorCode::InvalidFence,
                    "worker.fence",
                    format!("a lease's fence is at least 1, got {}", worker.fence),
                ));
            }
            Some((leasehold::workers::resource(&worker.id), worker.fence))
        }
    };
    Ok(Want {
        processor: processor.to_owned(),
        limit,
        lease,
        completions: Vec::new(),
    })
}

/// Claims due tasks for one request, in a group with the claims that arrive with it. With
/// nothing due and a wait asked for, it waits for news of a task of its queue (or looks again
/// every [`Wakeups::recheck`](leasehold::server::wakeups::Wakeups::recheck), should news be
/// lost) and claims again, until it gets tasks, the wait ends, the service stops, or its client
/// leaves: a client gone by the time its tasks are taken gets them handed back at once
/// ([`hand_back`]). Each answer carries the task lease's TTL (the engine's), so that the worker
/// counts its deadline from what task-service asked lease-service for.
#[tracing::instrument(name = "claim tasks", skip_all, fields(
    task.processor = %request.processor,
    task.queue = request.queue.as_deref().unwrap_or(""),
    task.id = Empty,
    task.ids = Empty,
    task.fence = Empty,
))]
pub async fn claim(
    (claims, pool): (&ClaimGroups, &DbPool),
    engine: &Context,
    request: &ClaimTasks,
    client: &Peer,
) -> Result<Vec<Task>, ApiError> {
    let (want, wait) = want(request)?;
    let arrived = Instant::now();
    let deadline = arrived + wait;
    let (claimed, waited) = loop {
        // In line before looking, so news that comes while the claim runs is not missed.
        let ticket = (!wait.is_zero()).then(|| engine.wakeups.ticket(request.queue.as_deref()));
        let waited = arrived.elapsed();
        let claimed = (claim_once(claims, request, want.clone()).await?, waited);
        let now = Instant::now();
        let Some(ticket) = ticket.filter(|_| claimed.0.is_empty() && now < deadline) else {
            break claimed;
        };
        // A client that leaves while its claim waits takes nothing: the wait ends with it.
        let woken = tokio::select! {
            woken = engine.wakeups.wait(ticket, deadline) => woken,
            () = client.gone() => false,
        };
        if !woken || client.is_gone() {
            break claimed;
        }
    };
    // It left while the round that took these ran: nobody will run them.
    let claimed = if client.is_gone() && !claimed.is_empty() {
        hand_back(pool, engine, claimed).await;
        Vec::new()
    } else {
        claimed
    };
    let span = tracing::Span::current();
    if let [row] = claimed.as_slice() {
        span.record("task.id", row.id);
        span.record("task.fence", row.fence.unwrap_or_default());
    }
    span.record(
        "task.ids",
        super::span_ids(claimed.iter().map(|row| row.id)),
    );
    // A holder counts its lease from its request's send instant: one that waited must count
    // from the round that took the task, which began this long after arrival.
    Ok(answered(
        engine,
        claimed,
        (!wait.is_zero()).then_some(waited),
    ))
}

/// The claimed rows as the API answers them: each with the task lease's TTL and, for a claim
/// that waited, how long it waited before the round that took it.
pub fn answered(engine: &Context, rows: Vec<TaskRow>, waited: Option<Duration>) -> Vec<Task> {
    rows.into_iter()
        .map(|row| {
            let task = to_api(row).with_lease_ttl(engine.lease_ttl);
            match waited {
                Some(waited) => task.with_waited(waited),
                None => task,
            }
        })
        .collect()
}

async fn claim_once(
    claims: &ClaimGroups,
    request: &ClaimTasks,
    want: Want,
) -> Result<Vec<TaskRow>, ApiError> {
    submit(claims, request.queue.clone(), want).await?.tasks
}

/// Hands one claim to its queue's group and waits for its part of the answer.
pub async fn submit(
    claims: &ClaimGroups,
    queue: Option<String>,
    want: Want,
) -> Result<Claimed, ApiError> {
    claims
        .submit(queue, want)
        .await
        .unwrap_or_else(|| Err(ApiError::Internal("the claim group failed".to_owned())))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn claim_request(limit: Option<i64>, wait_ms: Option<u64>) -> ClaimTasks {
        ClaimTasks {
            processor: "w".to_owned(),
            queue: None,
            limit,
            wait_ms,
            worker: None,
        }
    }

    #[test]
    fn a_claim_wants_one_task_at_once_unless_it_says_otherwise() {
        let (want_one, wait) = want(&claim_request(None, None)).unwrap();
        assert_eq!((want_one.limit, wait), (1, Duration::ZERO));
        let (most, _) = want(&claim_request(Some(MAX_CLAIM), None)).unwrap();
        assert_eq!(most.limit, MAX_CLAIM);
        for bad in [0, -1, MAX_CLAIM + 1] {
            let err = want(&claim_request(Some(bad), None)).unwrap_err();
            assert_eq!(err.code(), ErrorCode::InvalidLimit, "limit {bad}");
        }
    }

    #[test]
    fn a_claim_waits_at_most_thirty_seconds() {
        let (_, wait) = want(&claim_request(None, Some(MAX_CLAIM_WAIT_MS))).unwrap();
        assert_eq!(wait, Duration::from_secs(30));
        let err = want(&claim_request(None, Some(MAX_CLAIM_WAIT_MS + 1))).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidWait);
    }
}
