//! The worker loop: claim, work while heartbeating, complete or fail; stop gracefully.
//!
//! # A task's life in the worker
//!
//! 1. The claimer asks task-service for as many tasks as there are free slots (no `limit` when
//!    one slot is free, as the sample does), and starts one runner per task.
//! 2. The runner starts the handler and, beside it, a heartbeat loop that sends
//!    `PUT /{id}/heartbeat` with the task's fence every `HEARTBEAT_INTERVAL_SECONDS`, or every
//!    half lease TTL if that is shorter.
//! 3. The lease is known to hold until the *send* instant of the last accepted claim or heartbeat
//!    plus the lease TTL that answer carries (`leaseTtlMs`: task-service starts the lease after
//!    it receives the request), by the local monotonic clock. A safety margin of a tenth of the
//!    TTL (100 ms to 2 s) before that instant, if no heartbeat has been accepted since, the lease
//!    counts as lost. The worker has no TTL setting of its own: task-service's is the one.
//! 4. The lease is lost when that deadline passes (heartbeats only erred: 503, timeouts,
//!    connection refused) or at once when a heartbeat is refused (409 `not_owner`,
//!    `lease_lost`, `task_finished`, `cancelled`; 404). The runner then cancels the handler's
//!    token *and drops its future*, so even a handler that ignores the token can never lead to a
//!    completion after the loss.
//! 5. The handler's output is sent with `complete`, its failure with `fail`, each retried on
//!    transient errors until the lease deadline (heartbeats continue meanwhile). A 409/404
//!    answer drops the task. Completions that are ready at the same moment travel together in
//!    one `PUT /api/tasks/complete` ([`crate::completions`]), each still answered on its own.
//! 6. On shutdown the claimer sends no new claim; one already sent is awaited (at most
//!    `CLAIM_WAIT_MS`) and its tasks run like the others. Runners get `SHUTDOWN_GRACE_SECONDS`
//!    to finish; then the rest are cancelled and handed back with `fail` + `requeue: true`, so
//!    they are claimable again at once and no attempt is charged.
//!
//! This module keeps only the claim loop and its wiring. A task's run (`task_run`), the heartbeat
//! loop (`heartbeat`) and the chaos switches (`chaos`) are modules of their own, so that each part
//! of the life above can be read, and changed, without the others in view.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use tokio::task::{JoinError, JoinSet};
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::chaos;
use crate::completions::Completer;
use crate::config::{Settings, WorkerConfig};
use crate::handler::TaskHandler;
use crate::metrics::{Metrics, MetricsServer};
use crate::presence::{self, Load};
use crate::task_run::process;
use leasehold::retry::Backoff;
use leasehold::task_client::{CallError, TaskClient};

// Kept reachable where it always was: it is part of the worker's public surface.
pub use crate::task_run::MAX_ERROR_CHARS;

/// Most tasks asked for in one claim: task-service's limit ([`leasehold::tasks::MAX_CLAIM`]).
pub const MAX_CLAIM_BATCH: usize = leasehold::tasks::MAX_CLAIM as usize;
/// How long a task is offered back to task-service at shutdown before giving up on it (it is
/// then reclaimed when its lease expires).
pub const HAND_BACK_TIMEOUT: Duration = Duration::from_secs(5);

/// Validates `config`, then runs the worker until `shutdown` resolves and in-flight tasks are
/// finished or handed back. Returns an error only when it cannot start (invalid configuration,
/// the metrics address cannot be bound).
pub async fn run<H: TaskHandler>(
    config: WorkerConfig,
    handler: H,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let settings = config.validate()?;
    run_with_settings(settings, handler, shutdown).await
}

/// [`run`] with an already validated configuration.
pub async fn run_with_settings<H: TaskHandler>(
    settings: Settings,
    handler: H,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let metrics = Metrics::new().context("registering metrics")?;
    let client = TaskClient::new(
        settings.task_service_urls.clone(),
        settings.request_timeout,
        settings.auth_token.as_ref(),
    )
    .context("building the HTTP client")?;
    let metrics_server = match settings.metrics_addr {
        Some(address) => Some(MetricsServer::start(address, metrics.registry())?),
        None => None,
    };
    tracing::info!(
        processor = %settings.worker_id,
        task_service = ?settings.task_service_urls,
        queue = settings.queue.as_deref().unwrap_or("(any)"),
        concurrency = settings.concurrency,
        heartbeat_interval_seconds = settings.heartbeat_interval.as_secs_f64(),
        "worker started"
    );
    chaos::announce(&settings);
    let client = Arc::new(client);
    let completer = Completer::start(client.clone(), settings.worker_id.clone());
    let load = Arc::new(Load::default());
    let stop_presence = CancellationToken::new();
    let presence = tokio::spawn(presence::announce(
        client.clone(),
        settings.clone(),
        load.clone(),
        stop_presence.clone(),
    ));
    let ctx = Arc::new(Ctx {
        settings,
        client,
        completer,
        metrics,
        load,
    });
    claim_loop(ctx, Arc::new(handler), shutdown).await;
    // Said once every task is finished or handed back: the process is gone.
    stop_presence.cancel();
    let _ = presence.await;
    if let Some(server) = metrics_server {
        server.stop().await;
    }
    tracing::info!("worker stopped");
    Ok(())
}

/// What every runner shares.
pub(crate) struct Ctx {
    pub(crate) settings: Settings,
    pub(crate) client: Arc<TaskClient>,
    /// Sends completions, in batches when several are ready at once.
    pub(crate) completer: Completer,
    pub(crate) metrics: Metrics,
    /// Busy slots and tasks done, for the process's beats ([`presence`]).
    pub(crate) load: Arc<Load>,
}

async fn claim_loop<H: TaskHandler>(
    ctx: Arc<Ctx>,
    handler: Arc<H>,
    shutdown: impl Future<Output = ()>,
) {
    let settings = &ctx.settings;
    let mut shutdown = std::pin::pin!(shutdown);
    let hand_back = CancellationToken::new();
    let mut running: JoinSet<()> = JoinSet::new();
    let mut idle = Backoff::new(settings.poll_min, settings.poll_max).waits();
    // Lowered if task-service refuses our batch size.
    let mut max_batch = MAX_CLAIM_BATCH;
    // The first claim waits for the process's first beat (answered or failed), so that its
    // tasks are covered by the process's lease whenever task-service grants one.
    tokio::select! {
        biased;
        () = &mut shutdown => return,
        () = ctx.load.first_beat_over() => {}
    }
    loop {
        while let Some(joined) = running.try_join_next() {
            runner_ended(&ctx, joined);
        }
        ctx.load.set_busy(running.len());
        let free = settings.concurrency.saturating_sub(running.len());
        if free == 0 {
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                Some(joined) = running.join_next() => {
                    runner_ended(&ctx, joined);
                    continue;
                }
            }
        }
        let batch = free.min(max_batch);
        let limit = (batch > 1).then(|| i64::try_from(batch).unwrap_or(1));
        let sent = Instant::now();
        let covered_by = ctx.load.claimant_lease(&settings.worker_id);
        let mut claim = std::pin::pin!(ctx.client.claim_covered(
            &settings.worker_id,
            settings.queue.as_deref(),
            limit,
            settings.claim_wait,
            covered_by.as_ref(),
        ));
        let mut stopping = false;
        // A claim already sent is finished even when shutdown comes meanwhile, and what it
        // brings is run within the grace period like any task in flight: dropping the request
        // could leave a task leased to nobody until its lease lapsed, and handing it back would
        // make a stop bounce work that a moment earlier it would have done.
        let result = tokio::select! {
            biased;
            () = &mut shutdown => {
                stopping = true;
                tracing::info!(
                    wait_ms = u64::try_from(settings.claim_wait.as_millis()).unwrap_or(u64::MAX),
                    "shutting down: waiting for the claim in flight, whose tasks will still run"
                );
                claim.await
            }
            result = &mut claim => result,
        };
        let answered = result.is_ok();
        match result {
            Ok(tasks) if !tasks.is_empty() => {
                ctx.metrics
                    .claim_requests
                    .with_label_values(&["claimed"])
                    .inc();
                idle.reset();
                for task in tasks {
                    ctx.metrics.claimed.inc();
                    if let Some(ttl) = task.lease_ttl() {
                        ctx.load.learn_task_lease_ttl(ttl);
                    }
                    // The lease was taken no earlier than the round that claimed the task, which
                    // began `waited` after task-service received the claim.
                    let leased_from = (sent + task.waited()).min(Instant::now());
                    running.spawn(process(
                        ctx.clone(),
                        handler.clone(),
                        task,
                        leased_from,
                        hand_back.clone(),
                    ));
                }
                if stopping {
                    break;
                }
                continue; // poll again at once
            }
            Ok(_) => {
                ctx.metrics
                    .claim_requests
                    .with_label_values(&["empty"])
                    .inc();
                tracing::debug!("no task due");
            }
            Err(err) if err.code() == Some("invalid_limit") && batch > 1 && !stopping => {
                max_batch = batch / 2;
                tracing::warn!(
                    error = %err,
                    limit = batch,
                    next_limit = max_batch,
                    "task-service refused the claim's limit; asking for fewer tasks at a time"
                );
                continue;
            }
            Err(err) => {
                ctx.metrics
                    .claim_requests
                    .with_label_values(&["error"])
                    .inc();
                match &err {
                    CallError::Transient(_) => {
                        tracing::warn!(error = %err, "claim failed; backing off");
                    }
                    CallError::Refused { .. } => {
                        tracing::error!(error = %err, "task-service refused the claim; backing off");
                    }
                }
            }
        }
        if stopping {
            break;
        }
        // An empty answer after a long wait is news enough: claim again at once. One that came
        // at once (a task-service without wake-ups, or one stopping) or a failure backs off.
        if answered && !settings.claim_wait.is_zero() && sent.elapsed() >= settings.claim_wait / 2 {
            idle.reset();
            continue;
        }
        let delay = idle.next_delay();
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            Some(joined) = running.join_next() => {
                runner_ended(&ctx, joined);
                idle.reset(); // a slot is free: poll again at once
            }
            () = sleep(delay) => {}
        }
    }

    tracing::info!(
        in_flight = running.len(),
        grace_seconds = settings.shutdown_grace.as_secs_f64(),
        "shutting down: no longer claiming; letting in-flight tasks finish"
    );
    drain(&ctx, &mut running, Instant::now() + settings.shutdown_grace).await;
    if !running.is_empty() {
        tracing::warn!(
            tasks = running.len(),
            "grace period over: cancelling unfinished tasks and handing them back"
        );
        hand_back.cancel();
        drain(
            &ctx,
            &mut running,
            Instant::now() + HAND_BACK_TIMEOUT + settings.request_timeout * 2,
        )
        .await;
        if !running.is_empty() {
            tracing::warn!(
                tasks = running.len(),
                "abandoning tasks that could not be handed back; they are reclaimed when their \
                 leases expire"
            );
            running.shutdown().await;
        }
    }
}

/// Waits for runners to end, until `until`.
async fn drain(ctx: &Ctx, running: &mut JoinSet<()>, until: Instant) {
    loop {
        tokio::select! {
            biased;
            joined = running.join_next() => match joined {
                Some(joined) => runner_ended(ctx, joined),
                None => return,
            },
            () = sleep_until(until) => return,
        }
    }
}

fn runner_ended(ctx: &Ctx, joined: Result<(), JoinError>) {
    ctx.load.done.fetch_add(1, Ordering::Relaxed);
    if let Err(err) = joined
        && err.is_panic()
    {
        tracing::error!(error = %err, "a task runner panicked");
    }
}
