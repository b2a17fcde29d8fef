//! The worker loop: claim, work while heartbeating, complete or fail; stop gracefully.
//!
//! # A task's life in the worker
//!
//! 1. The claimer asks task-service for as many tasks as there are free slots (no `limit` when
//!    one slot is free, as the sample does), and starts one runner per task. Under load (the
//!    last claim got all it asked for) it also claims up to `WORKER_PREFETCH` tasks ahead: their
//!    runners heartbeat at once and start the work when a slot frees, with no claim between.
//!    A claim due while every slot is busy rides on the next completion ([`crate::completions`]).
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
//!    `CLAIM_WAIT_MS`) and its tasks run like the others. Tasks claimed ahead that have not
//!    started are handed back at once (`fail` + `requeue: true`, no attempt charged). Runners get `SHUTDOWN_GRACE_SECONDS`
//!    to finish; then the rest are cancelled and handed back with `fail` + `requeue: true`, so
//!    they are claimable again at once and no attempt is charged.
//!
//! This module keeps only the claim loop and its wiring. A task's run (`task_run`), the heartbeat
//! loop (`heartbeat`) and the chaos switches (`chaos`) are modules of their own, so that each part
//! of the life above can be read, and changed, without the others in view.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

use crate::chaos;
use crate::completions::{Completer, Pending, Riders};
use crate::config::{Settings, WorkerConfig};
use crate::ctx::Ctx;
use crate::handler::TaskHandler;
use crate::metrics::{Metrics, MetricsServer};
use crate::presence::{self, Load};
use crate::stopping::{runner_ended, stop};
use crate::task_run::{HandBack, process};
use leasehold::ErrorCode;
use leasehold::retry::Backoff;
use leasehold::task_client::{CallError, TaskClient};
use leasehold::tasks::{ClaimNext, Task};

// Kept reachable where it always was: it is part of the worker's public surface.
pub use crate::task_run::MAX_ERROR_CHARS;

/// Most tasks asked for in one claim: task-service's limit ([`leasehold::tasks::MAX_CLAIM`]).
pub const MAX_CLAIM_BATCH: usize = leasehold::tasks::MAX_CLAIM as usize;
pub use crate::ctx::HAND_BACK_TIMEOUT;

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
    let client = TaskClient::new(settings.task_service_urls.clone())
        .with_timeout(settings.request_timeout)
        .with_bearer_token(
            settings
                .auth_token
                .as_ref()
                .map(leasehold::api::Secret::expose),
        );
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
    let (completer, riders) = Completer::start(client.clone(), settings.worker_id.clone());
    let load = Arc::new(Load::default());
    let stop_presence = CancellationToken::new();
    let presence = tokio::spawn(presence::announce(
        client.clone(),
        settings.clone(),
        load.clone(),
        stop_presence.clone(),
    ));
    let ctx = Arc::new(Ctx {
        slots: Arc::new(Semaphore::new(settings.concurrency)),
        unstarted: AtomicUsize::new(0),
        settings,
        client,
        completer,
        metrics,
        load,
    });
    claim_loop(ctx, Arc::new(handler), riders, shutdown).await;
    // Said once every task is finished or handed back: the process is gone.
    stop_presence.cancel();
    let _ = presence.await;
    if let Some(server) = metrics_server {
        server.stop().await;
    }
    tracing::info!("worker stopped");
    Ok(())
}

/// What the claim loop keeps between its claims.
struct Claiming<H> {
    ctx: Arc<Ctx>,
    handler: Arc<H>,
    running: JoinSet<()>,
    /// When claimed tasks are handed back: those not started at shutdown, the rest once the
    /// grace period is over.
    hand_back: HandBack,
    /// Lowered if task-service refuses our batch size.
    max_batch: usize,
    /// The last claim came back with all it asked for: there is more work than slots, so
    /// tasks are claimed ahead (`WORKER_PREFETCH`).
    under_load: bool,
}

impl<H: TaskHandler> Claiming<H> {
    /// The tasks to claim now: the slots no task works in or waits for, plus the tasks claimed
    /// ahead while under load. A task whose work is over holds no slot, even while its answer
    /// travels (the next claim may carry it).
    fn free(&self) -> usize {
        let ctx = &self.ctx;
        let settings = &ctx.settings;
        let ahead = if self.under_load {
            settings.prefetch
        } else {
            0
        };
        let idle = ctx.slots.available_permits().min(settings.concurrency);
        let working = settings.concurrency - idle;
        let unstarted = ctx.unstarted.load(Ordering::Acquire);
        (settings.concurrency + ahead).saturating_sub(working + unstarted)
    }

    /// Notes whether a claim for `limit` tasks that got `got` shows more work than slots.
    fn answered(&mut self, limit: Option<i64>, got: usize) {
        let asked = limit.and_then(|l| usize::try_from(l).ok()).unwrap_or(1);
        self.under_load = got >= asked;
    }

    /// A claim's `limit` for `free` slots: none for one, as the sample asks.
    fn limit(&self, free: usize) -> Option<i64> {
        let batch = free.min(self.max_batch);
        (batch > 1).then(|| i64::try_from(batch).unwrap_or(1))
    }

    /// Starts a runner for each claimed task; `sent` is when the claim was sent.
    fn start(&mut self, tasks: Vec<Task>, sent: Instant) {
        let ctx = &self.ctx;
        ctx.metrics
            .claim_requests
            .with_label_values(&["claimed"])
            .inc();
        for task in tasks {
            ctx.metrics.claimed.inc();
            if let Some(ttl) = task.lease_ttl() {
                ctx.load.learn_task_lease_ttl(ttl);
            }
            // The lease was taken no earlier than the round that claimed the task, which began
            // `waited` after task-service received the claim.
            let leased_from = (sent + task.waited()).min(Instant::now());
            ctx.unstarted.fetch_add(1, Ordering::AcqRel);
            self.running.spawn(process(
                ctx.clone(),
                self.handler.clone(),
                task,
                leased_from,
                self.hand_back.clone(),
            ));
        }
    }

    fn reap(&mut self) {
        while let Some(joined) = self.running.try_join_next() {
            runner_ended(&self.ctx, joined);
        }
        self.ctx.load.set_busy(self.running.len());
    }

    /// Sends `first` and the completions waiting behind it (of runners whose work is over) with
    /// a claim for the slots free once they end. True when it claimed (tasks or none); false when the claim must be
    /// made as usual (the exchange failed, or task-service does not claim with completions).
    async fn carry(&mut self, waiting: &mut Riders, first: Pending) -> bool {
        let riders = waiting.gather(first);
        let settings = &self.ctx.settings;
        let free = self.free();
        if free == 0 {
            // Tasks claimed ahead fill the slots these free: nothing to claim.
            for rider in riders {
                waiting.send_alone(rider);
            }
            return false;
        }
        let next = ClaimNext {
            queue: settings.queue.clone(),
            limit: self.limit(free),
            worker: self.ctx.load.claimant_lease(&settings.worker_id),
        };
        let sent = Instant::now();
        let claimed = waiting
            .carry(&self.ctx.client, &settings.worker_id, riders, next.clone())
            .await;
        if let Some(Ok(tasks)) = &claimed {
            self.answered(next.limit, tasks.len());
        }
        match claimed {
            Some(Ok(tasks)) if !tasks.is_empty() => {
                self.start(tasks, sent);
                true
            }
            Some(Ok(_)) => {
                self.ctx
                    .metrics
                    .claim_requests
                    .with_label_values(&["empty"])
                    .inc();
                true
            }
            Some(Err(err)) => {
                self.refused(&err, next.limit);
                false
            }
            None => false,
        }
    }

    /// Records a failed claim. True when what made it fail is mended here, so the next claim
    /// may go at once: a limit task-service refused is lowered, and a process lease it no
    /// longer holds is left out until the next beat takes it anew.
    fn refused(&mut self, err: &CallError, limit: Option<i64>) -> bool {
        if matches!(
            err.code(),
            Some(ErrorCode::LeaseLost | ErrorCode::LeaseRevoked)
        ) {
            tracing::warn!(
                error = %err,
                "the process's lease is no longer held; claiming without it until the next beat"
            );
            self.ctx.load.lease_refused();
            return true;
        }
        let batch = limit.and_then(|l| usize::try_from(l).ok()).unwrap_or(1);
        if matches!(err.code(), Some(ErrorCode::InvalidLimit)) && batch > 1 {
            self.max_batch = batch / 2;
            tracing::warn!(
                error = %err,
                limit = batch,
                next_limit = self.max_batch,
                "task-service refused the claim's limit; asking for fewer tasks at a time"
            );
            return true;
        }
        self.ctx
            .metrics
            .claim_requests
            .with_label_values(&["error"])
            .inc();
        match err {
            CallError::Transient(_) => {
                tracing::warn!(error = %err, "claim failed; backing off");
            }
            CallError::Refused { .. } => {
                tracing::error!(error = %err, "task-service refused the claim; backing off");
            }
        }
        false
    }
}

async fn claim_loop<H: TaskHandler>(
    ctx: Arc<Ctx>,
    handler: Arc<H>,
    mut riders: Riders,
    shutdown: impl Future<Output = ()>,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut idle = Backoff::new(ctx.settings.poll_min, ctx.settings.poll_max).waits();
    let mut claiming = Claiming {
        ctx: ctx.clone(),
        handler,
        running: JoinSet::new(),
        hand_back: HandBack::default(),
        max_batch: MAX_CLAIM_BATCH,
        under_load: false,
    };
    // The first claim waits for the process's first beat (answered or failed), so that its
    // tasks are covered by the process's lease whenever task-service grants one.
    tokio::select! {
        biased;
        () = &mut shutdown => {
            riders.close();
            return;
        }
        () = ctx.load.first_beat_over() => {}
    }
    loop {
        claiming.reap();
        // A completion already waiting carries the claim, rather than go alone beside it.
        if let Some(first) = riders.try_next() {
            if claiming.carry(&mut riders, first).await {
                idle.reset();
            }
            continue;
        }
        if claiming.free() == 0 {
            // Every slot is busy (and the tasks claimed ahead wait): the next completion frees
            // one, and carries the next claim.
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                Some(joined) = claiming.running.join_next() => runner_ended(&ctx, joined),
                first = riders.next() => {
                    if claiming.carry(&mut riders, first).await {
                        idle.reset();
                    }
                }
            }
            continue;
        }
        match claim(&mut claiming, &mut riders, &mut shutdown).await {
            Claim::Stopping => break,
            Claim::Again => {
                idle.reset();
                continue;
            }
            Claim::BackOff => {}
        }
        let delay = idle.next_delay();
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            Some(joined) = claiming.running.join_next() => {
                runner_ended(&ctx, joined);
                idle.reset(); // a slot is free: poll again at once
            }
            first = riders.next() => {
                if claiming.carry(&mut riders, first).await {
                    idle.reset();
                }
            }
            () = sleep(delay) => {}
        }
    }
    riders.close();
    let stop_grace = claiming.handler.stop_grace();
    stop(&ctx, &claiming.hand_back, &mut claiming.running, stop_grace).await;
}

/// What the claim loop does after a claim.
enum Claim {
    /// Claim again at once.
    Again,
    /// Wait a little (an empty answer that came at once, or a failure).
    BackOff,
    /// Shutdown came: claim no more.
    Stopping,
}

/// One claim for the free slots, waiting for work up to `CLAIM_WAIT_MS`. Completions that come
/// meanwhile go on their own: the claim may wait long.
async fn claim<H: TaskHandler>(
    claiming: &mut Claiming<H>,
    riders: &mut Riders,
    shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
) -> Claim {
    let ctx = claiming.ctx.clone();
    let settings = &ctx.settings;
    let limit = claiming.limit(claiming.free());
    let sent = Instant::now();
    let covered_by = ctx.load.claimant_lease(&settings.worker_id);
    let mut request = std::pin::pin!(ctx.client.claim_covered(
        &settings.worker_id,
        settings.queue.as_deref(),
        limit,
        settings.claim_wait,
        covered_by.as_ref(),
    ));
    // A stop abandons a claim that is still waiting: its wait (up to `CLAIM_WAIT_MS`, 30 s at
    // most) would otherwise hold every Ctrl-C. Dropping the request closes its connection;
    // task-service sees its client gone, ends the wait taking nothing, and hands back at once,
    // uncharged, anything it took as the client left (`tasks::hand_back`). Tasks whose answer
    // was already on the wire stay covered by this process's lease, which the stop releases:
    // they go back as after a crash.
    let result = loop {
        tokio::select! {
            biased;
            () = shutdown.as_mut() => {
                tracing::info!(
                    "shutting down: abandoning the waiting claim; task-service hands back \
                     anything it took"
                );
                return Claim::Stopping;
            }
            result = &mut request => break result,
            pending = riders.next() => riders.send_alone(pending),
        }
    };
    let answered = result.is_ok();
    if let Ok(tasks) = &result {
        claiming.answered(limit, tasks.len());
    }
    match result {
        Ok(tasks) if !tasks.is_empty() => {
            claiming.start(tasks, sent);
            return Claim::Again;
        }
        Ok(_) => {
            ctx.metrics
                .claim_requests
                .with_label_values(&["empty"])
                .inc();
            tracing::debug!("no task due");
        }
        Err(err) => {
            if claiming.refused(&err, limit) {
                return Claim::Again;
            }
        }
    }
    // An empty answer after a long wait is news enough: claim again at once. One that came at
    // once (a task-service without wake-ups, or one stopping) or a failure backs off.
    if answered && !settings.claim_wait.is_zero() && sent.elapsed() >= settings.claim_wait / 2 {
        return Claim::Again;
    }
    Claim::BackOff
}
