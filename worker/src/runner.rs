//! The worker loop: claim, work while heartbeating, complete or fail; stop gracefully.
//!
//! # A task's life in the worker
//!
//! 1. The claimer asks task-service for as many tasks as there are free slots (no `limit` when
//!    one slot is free, as the sample does), and starts one runner per task.
//! 2. The runner starts the handler and, beside it, a heartbeat loop that sends
//!    `PUT /{id}/heartbeat` with the task's fence every `HEARTBEAT_INTERVAL_SECONDS`.
//! 3. The lease is known to hold until the *send* instant of the last accepted claim or heartbeat
//!    plus `LEASE_TTL_SECONDS` (task-service starts the lease after it receives the request), by
//!    the local monotonic clock. A safety margin of min(TTL/10, 2 s) before that instant, if no
//!    heartbeat has been accepted since, the lease counts as lost.
//! 4. The lease is lost when that deadline passes (heartbeats only erred: 503, timeouts,
//!    connection refused) or at once when a heartbeat is refused (409 `not_owner`,
//!    `lease_lost`, `task_finished`, `cancelled`; 404). The runner then cancels the handler's
//!    token *and drops its future*, so even a handler that ignores the token can never lead to a
//!    completion after the loss.
//! 5. The handler's output is sent with `complete`, its failure with `fail`, each retried on
//!    transient errors until the lease deadline (heartbeats continue meanwhile). A 409/404
//!    answer drops the task. Completions that are ready at the same moment travel together in
//!    one `PUT /api/tasks/complete` ([`crate::completions`]), each still answered on its own.
//! 6. On shutdown the claimer stops at once; runners get `SHUTDOWN_GRACE_SECONDS` to finish;
//!    then the rest are cancelled and handed back with `fail` + `requeue: true`, so they are
//!    claimable again at once and no attempt is charged.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context;
use futures_util::FutureExt;
use prometheus::IntGauge;
use shared::tasks::Task;
use tokio::task::{JoinError, JoinSet};
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::client::{CallError, TaskClient};
use crate::completions::Completer;
use crate::config::{Settings, WorkerConfig};
use crate::handler::{SleepHandler, TaskFailure, TaskHandler};
use crate::metrics::{Metrics, MetricsServer};

/// Most tasks asked for in one claim.
pub const MAX_CLAIM_BATCH: usize = 100;
/// How long a task is offered back to task-service at shutdown before giving up on it (it is
/// then reclaimed when its lease expires).
pub const HAND_BACK_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest error message sent with `fail`.
pub const MAX_ERROR_CHARS: usize = 2_000;

/// Retries of heartbeats, completions and failures: from this...
const RETRY_MIN: Duration = Duration::from_millis(100);
/// ...up to this (or half the heartbeat interval, if shorter).
const RETRY_MAX: Duration = Duration::from_secs(2);

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
        lease_ttl_seconds = settings.lease_ttl.as_secs_f64(),
        "worker started"
    );
    if settings.chaos.crash_probability > 0.0 || settings.chaos.heartbeat_pause_probability > 0.0 {
        tracing::warn!(
            crash_probability = settings.chaos.crash_probability,
            heartbeat_pause_probability = settings.chaos.heartbeat_pause_probability,
            heartbeat_pause_seconds = settings.chaos.heartbeat_pause.as_secs_f64(),
            "chaos testing is on"
        );
    }
    let client = Arc::new(client);
    let completer = Completer::start(client.clone(), settings.worker_id.clone());
    let ctx = Arc::new(Ctx {
        settings,
        client,
        completer,
        metrics,
    });
    claim_loop(ctx, Arc::new(handler), shutdown).await;
    if let Some(server) = metrics_server {
        server.stop().await;
    }
    tracing::info!("worker stopped");
    Ok(())
}

/// What every runner shares.
struct Ctx {
    settings: Settings,
    client: Arc<TaskClient>,
    /// Sends completions, in batches when several are ready at once.
    completer: Completer,
    metrics: Metrics,
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
    let mut idle = Backoff::new(settings.poll_min, settings.poll_max);
    // Lowered if task-service refuses our batch size.
    let mut max_batch = MAX_CLAIM_BATCH;
    loop {
        while let Some(joined) = running.try_join_next() {
            runner_ended(joined);
        }
        let free = settings.concurrency.saturating_sub(running.len());
        if free == 0 {
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                Some(joined) = running.join_next() => {
                    runner_ended(joined);
                    continue;
                }
            }
        }
        let batch = free.min(max_batch);
        let limit = (batch > 1).then(|| i64::try_from(batch).unwrap_or(1));
        let sent = Instant::now();
        let mut claim = std::pin::pin!(ctx.client.claim(
            &settings.worker_id,
            settings.queue.as_deref(),
            limit
        ));
        let mut stopping = false;
        // A claim already sent is finished even when shutdown comes meanwhile: what it claimed
        // is handed back at once rather than left leased.
        let result = tokio::select! {
            biased;
            () = &mut shutdown => {
                stopping = true;
                claim.await
            }
            result = &mut claim => result,
        };
        match result {
            Ok(tasks) if !tasks.is_empty() => {
                ctx.metrics
                    .claim_requests
                    .with_label_values(&["claimed"])
                    .inc();
                idle.reset();
                let already_stopping = CancellationToken::new();
                already_stopping.cancel();
                for task in tasks {
                    ctx.metrics.claimed.inc();
                    let token = if stopping {
                        already_stopping.clone()
                    } else {
                        hand_back.clone()
                    };
                    running.spawn(process(ctx.clone(), handler.clone(), task, sent, token));
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
        let delay = idle.next_delay();
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            Some(joined) = running.join_next() => {
                runner_ended(joined);
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
    drain(&mut running, Instant::now() + settings.shutdown_grace).await;
    if !running.is_empty() {
        tracing::warn!(
            tasks = running.len(),
            "grace period over: cancelling unfinished tasks and handing them back"
        );
        hand_back.cancel();
        drain(
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
async fn drain(running: &mut JoinSet<()>, until: Instant) {
    loop {
        tokio::select! {
            biased;
            joined = running.join_next() => match joined {
                Some(joined) => runner_ended(joined),
                None => return,
            },
            () = sleep_until(until) => return,
        }
    }
}

fn runner_ended(joined: Result<(), JoinError>) {
    if let Err(err) = joined
        && err.is_panic()
    {
        tracing::error!(error = %err, "a task runner panicked");
    }
}

/// How the work on a task ended.
enum Outcome {
    Lost,
    HandBack,
    Done(Result<crate::handler::TaskResult, Box<dyn Any + Send>>),
}

/// Works on one claimed task, from start to its final answer (or loss).
async fn process<H: TaskHandler>(
    ctx: Arc<Ctx>,
    handler: Arc<H>,
    task: Task,
    claim_sent: Instant,
    hand_back: CancellationToken,
) {
    let id = task.id;
    let fence = task.fence;
    let settings = &ctx.settings;
    let processor = settings.worker_id.as_str();
    let _in_flight = InFlight::new(&ctx.metrics.in_flight);
    tracing::debug!(
        task_id = id,
        fence,
        processor,
        queue = %task.queue,
        attempts = task.attempts,
        "claimed task {id}"
    );

    let lease = Arc::new(LeaseState::new(
        settings.lease_ttl.saturating_sub(settings.safety_margin),
        claim_sent,
    ));
    let stop_heartbeats = CancellationToken::new();
    let _stop_heartbeats_on_exit = stop_heartbeats.clone().drop_guard();
    tokio::spawn(keep_alive(
        ctx.clone(),
        id,
        fence,
        lease.clone(),
        stop_heartbeats,
        chaos_pause(settings, claim_sent),
    ));
    let crash_at = chaos_crash_at(settings, &task);

    let cancel = CancellationToken::new();
    let work = AssertUnwindSafe(handler.handle(task, cancel.clone())).catch_unwind();
    let outcome = tokio::select! {
        biased;
        () = lease.lost.cancelled() => Outcome::Lost,
        () = hand_back.cancelled() => Outcome::HandBack,
        () = sleep_until_some(crash_at) => crash(id, fence),
        result = work => Outcome::Done(result),
    };
    // The handler is finished or its future was just dropped; tell anything it started, too.
    cancel.cancel();

    match outcome {
        Outcome::Lost => {
            ctx.metrics.lost.inc();
            tracing::warn!(
                task_id = id,
                fence,
                processor,
                reason = %lease.reason(),
                "lost task {id}: work cancelled; it will not be completed by this worker"
            );
        }
        Outcome::HandBack => hand_back_task(&ctx, id, fence, &lease).await,
        Outcome::Done(result) => {
            if crash_at.is_some() {
                crash(id, fence); // the chosen point lay beyond the end of the work
            }
            match result {
                Ok(Ok(output)) => complete(&ctx, id, fence, &lease, claim_sent, output).await,
                Ok(Err(failure)) => fail(&ctx, id, fence, &lease, failure).await,
                Err(panic) => {
                    let failure = TaskFailure::retryable(format!(
                        "the task handler panicked: {}",
                        panic_message(panic.as_ref())
                    ));
                    fail(&ctx, id, fence, &lease, failure).await;
                }
            }
        }
    }
}

async fn complete(
    ctx: &Ctx,
    id: i64,
    fence: Option<i64>,
    lease: &LeaseState,
    claim_sent: Instant,
    output: serde_json::Value,
) {
    let processor = ctx.settings.worker_id.as_str();
    let delivery = deliver(ctx, id, "complete", lease, None, || {
        ctx.completer.complete(id, fence, output.clone())
    })
    .await;
    match delivery {
        Delivery::Accepted => {
            let elapsed = claim_sent.elapsed();
            ctx.metrics.completed.inc();
            ctx.metrics.claim_to_complete.observe(elapsed.as_secs_f64());
            tracing::debug!(
                task_id = id,
                fence,
                processor,
                elapsed_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
                "completed task {id}"
            );
        }
        Delivery::Refused(err) if err.is_loss() => {
            ctx.metrics.lost.inc();
            tracing::warn!(
                task_id = id,
                fence,
                processor,
                code = err.code().unwrap_or_default(),
                error = %err,
                "task-service refused the completion of task {id}; dropping it"
            );
        }
        Delivery::Refused(err) => {
            // An output task-service will not store (too large, say) would be refused on every
            // attempt: report the task as failed for good instead.
            tracing::error!(
                task_id = id,
                fence,
                processor,
                error = %err,
                "task-service rejected the output of task {id}; reporting it as failed"
            );
            let failure = TaskFailure::permanent(format!("task-service refused the output: {err}"));
            fail(ctx, id, fence, lease, failure).await;
        }
        Delivery::Abandoned(reason) => {
            ctx.metrics.lost.inc();
            tracing::warn!(
                task_id = id,
                fence,
                processor,
                %reason,
                "gave up completing task {id}; it is reclaimed when its lease expires"
            );
        }
    }
}

async fn fail(ctx: &Ctx, id: i64, fence: Option<i64>, lease: &LeaseState, failure: TaskFailure) {
    let processor = ctx.settings.worker_id.as_str();
    let message = truncate(&failure.message, MAX_ERROR_CHARS);
    let delivery = deliver(ctx, id, "fail", lease, None, || {
        ctx.client
            .fail(id, processor, fence, &message, failure.retryable, false)
    })
    .await;
    match delivery {
        Delivery::Accepted => {
            ctx.metrics.failed.inc();
            tracing::info!(
                task_id = id,
                fence,
                processor,
                retryable = failure.retryable,
                error = %message,
                "failed task {id}"
            );
        }
        Delivery::Refused(err) => {
            ctx.metrics.lost.inc();
            tracing::warn!(
                task_id = id,
                fence,
                processor,
                error = %err,
                handler_error = %message,
                "task-service refused the failure of task {id}; dropping it"
            );
        }
        Delivery::Abandoned(reason) => {
            ctx.metrics.lost.inc();
            tracing::warn!(
                task_id = id,
                fence,
                processor,
                %reason,
                handler_error = %message,
                "gave up reporting the failure of task {id}; it is reclaimed when its lease expires"
            );
        }
    }
}

/// Shutdown: hands the task back (`fail` with `requeue: true`) so it can be claimed at once.
async fn hand_back_task(ctx: &Ctx, id: i64, fence: Option<i64>, lease: &LeaseState) {
    let processor = ctx.settings.worker_id.as_str();
    let message = format!("worker {processor} shut down before finishing the task");
    let limit = Instant::now() + HAND_BACK_TIMEOUT;
    let delivery = deliver(ctx, id, "hand back", lease, Some(limit), || {
        ctx.client.fail(id, processor, fence, &message, true, true)
    })
    .await;
    match delivery {
        Delivery::Accepted => {
            ctx.metrics.requeued.inc();
            tracing::info!(
                task_id = id,
                fence,
                processor,
                "handed back task {id} (shutting down)"
            );
        }
        Delivery::Refused(err) => {
            ctx.metrics.lost.inc();
            tracing::warn!(
                task_id = id,
                fence,
                processor,
                error = %err,
                "task-service refused to take back task {id}"
            );
        }
        Delivery::Abandoned(reason) => {
            ctx.metrics.lost.inc();
            tracing::warn!(
                task_id = id,
                fence,
                processor,
                %reason,
                "could not hand back task {id}; it is reclaimed when its lease expires"
            );
        }
    }
}

/// How sending a task's final answer ended.
enum Delivery {
    Accepted,
    Refused(CallError),
    Abandoned(String),
}

/// Sends an answer, retrying transient failures until the lease is lost (its deadline passes or
/// a heartbeat is refused) or until `limit`. Nothing is sent once the deadline has passed. A request already sent is always awaited (it is
/// bounded by the request timeout): task-service judges it by the fence.
async fn deliver<F, Fut>(
    ctx: &Ctx,
    id: i64,
    what: &str,
    lease: &LeaseState,
    limit: Option<Instant>,
    mut call: F,
) -> Delivery
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<Task>, CallError>>,
{
    let mut backoff = retry_backoff(&ctx.settings);
    loop {
        // Checked here too, not only by the heartbeat loop: after a pause of the whole process
        // (SIGSTOP, a VM freeze) this task may run before that loop notices the deadline.
        if Instant::now() >= lease.deadline() {
            lease.lose("no heartbeat confirmed before the lease deadline".to_owned());
        }
        if lease.lost.is_cancelled() {
            return Delivery::Abandoned(lease.reason());
        }
        if limit.is_some_and(|limit| Instant::now() >= limit) {
            return Delivery::Abandoned(format!("{what} not confirmed in time"));
        }
        match call().await {
            Ok(_) => return Delivery::Accepted,
            Err(err @ CallError::Refused { .. }) => return Delivery::Refused(err),
            Err(CallError::Transient(reason)) => {
                tracing::warn!(
                    task_id = id,
                    %reason,
                    "{what} of task {id} failed; retrying until the lease deadline"
                );
            }
        }
        tokio::select! {
            () = lease.lost.cancelled() => {}
            () = sleep_until_some(limit) => {}
            () = sleep(backoff.next_delay()) => {}
        }
    }
}

/// What the runner and the heartbeat loop know about a task's lease.
struct LeaseState {
    /// TTL minus the safety margin.
    valid_for: Duration,
    /// Send instant of the last accepted claim or heartbeat.
    confirmed: Mutex<Instant>,
    reason: Mutex<Option<String>>,
    /// Cancelled when the lease is lost.
    lost: CancellationToken,
}

impl LeaseState {
    fn new(valid_for: Duration, claim_sent: Instant) -> Self {
        Self {
            valid_for,
            confirmed: Mutex::new(claim_sent),
            reason: Mutex::new(None),
            lost: CancellationToken::new(),
        }
    }

    fn confirmed(&self) -> Instant {
        *self
            .confirmed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The instant after which the lease is treated as lost unless confirmed again.
    fn deadline(&self) -> Instant {
        self.confirmed() + self.valid_for
    }

    fn confirm(&self, sent: Instant) {
        let mut confirmed = self
            .confirmed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if sent > *confirmed {
            *confirmed = sent;
        }
    }

    fn lose(&self, reason: String) {
        {
            let mut slot = self.reason.lock().unwrap_or_else(PoisonError::into_inner);
            if slot.is_none() {
                *slot = Some(reason);
            }
        }
        self.lost.cancel();
    }

    fn reason(&self) -> String {
        self.reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .unwrap_or_else(|| "lease lost".to_owned())
    }
}

/// Heartbeats a task until `stop`, or until its lease is lost (refused, or its deadline passed).
async fn keep_alive(
    ctx: Arc<Ctx>,
    id: i64,
    fence: Option<i64>,
    lease: Arc<LeaseState>,
    stop: CancellationToken,
    pause: Option<(Instant, Instant)>,
) {
    let settings = &ctx.settings;
    let processor = settings.worker_id.as_str();
    let mut backoff = retry_backoff(settings);
    let mut next = lease.confirmed() + settings.heartbeat_interval;
    let mut last_error: Option<String> = None;
    let mut paused = false;
    let unconfirmed = |last_error: &Option<String>| match last_error {
        Some(err) => format!("no heartbeat confirmed before the lease deadline; last error: {err}"),
        None => "no heartbeat confirmed before the lease deadline".to_owned(),
    };
    loop {
        let deadline = lease.deadline();
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = sleep_until(deadline) => {
                lease.lose(unconfirmed(&last_error));
                return;
            }
            () = sleep_until(next) => {}
        }
        if let Some((from, until)) = pause {
            let now = Instant::now();
            if now >= from && now < until {
                if !paused {
                    paused = true;
                    tracing::warn!(
                        task_id = id,
                        fence,
                        pause_seconds = (until - now).as_secs_f64(),
                        "chaos: skipping heartbeats of task {id}"
                    );
                }
                next = until;
                continue;
            }
        }
        let sent = Instant::now();
        let result = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = sleep_until(deadline) => {
                lease.lose(unconfirmed(&last_error));
                return;
            }
            result = ctx.client.heartbeat(id, processor, fence) => result,
        };
        match result {
            Ok(task) => {
                ctx.metrics.heartbeats.with_label_values(&["ok"]).inc();
                lease.confirm(sent);
                backoff.reset();
                last_error = None;
                next = sent + settings.heartbeat_interval;
                tracing::debug!(
                    task_id = id,
                    fence,
                    must_heart_beat_before = ?task.and_then(|t| t.must_heart_beat_before),
                    "heartbeat accepted"
                );
            }
            Err(err) if err.is_loss() => {
                ctx.metrics.heartbeats.with_label_values(&["refused"]).inc();
                lease.lose(format!("heartbeat refused: {err}"));
                return;
            }
            Err(err) => {
                ctx.metrics.heartbeats.with_label_values(&["error"]).inc();
                let left = lease.deadline().saturating_duration_since(Instant::now());
                tracing::warn!(
                    task_id = id,
                    fence,
                    error = %err,
                    deadline_in_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
                    "heartbeat of task {id} failed; retrying until the lease deadline"
                );
                last_error = Some(err.to_string());
                next = Instant::now() + backoff.next_delay();
            }
        }
    }
}

fn retry_backoff(settings: &Settings) -> Backoff {
    let max = (settings.heartbeat_interval / 2).min(RETRY_MAX);
    Backoff::new(RETRY_MIN.min(max), max)
}

/// Chaos: with `CHAOS_HEARTBEAT_PAUSE_PROBABILITY`, heartbeats are skipped from the first one on
/// for `CHAOS_HEARTBEAT_PAUSE_SECONDS`.
fn chaos_pause(settings: &Settings, claim_sent: Instant) -> Option<(Instant, Instant)> {
    let chaos = &settings.chaos;
    if chaos.heartbeat_pause_probability <= 0.0
        || chaos.heartbeat_pause.is_zero()
        || rand::random::<f64>() >= chaos.heartbeat_pause_probability
    {
        return None;
    }
    let from = claim_sent + settings.heartbeat_interval;
    Some((from, from + chaos.heartbeat_pause))
}

/// Chaos: with `CHAOS_CRASH_PROBABILITY`, the instant at which the process kills itself: a
/// random point within the task's expected duration (its `sleep_duration_seconds`, else one
/// heartbeat interval). If the work ends first, the crash happens before its answer is sent.
fn chaos_crash_at(settings: &Settings, task: &Task) -> Option<Instant> {
    let probability = settings.chaos.crash_probability;
    if probability <= 0.0 || rand::random::<f64>() >= probability {
        return None;
    }
    let span = SleepHandler::requested_seconds(&task.task_data)
        .ok()
        .and_then(|seconds| Duration::try_from_secs_f64(seconds).ok())
        .unwrap_or(settings.heartbeat_interval)
        .min(Duration::from_secs(3_600));
    Some(Instant::now() + span.mul_f64(rand::random::<f64>()))
}

/// Chaos: dies the way a killed process does (SIGKILL), without answering for the task.
fn crash(id: i64, fence: Option<i64>) -> ! {
    tracing::error!(
        task_id = id,
        fence,
        "chaos: crashing in the middle of task {id} (CHAOS_CRASH_PROBABILITY)"
    );
    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    std::process::abort()
}

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "(no message)".to_owned()
    }
}

fn truncate(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// Counts a task in `worker_tasks_in_flight` while alive.
struct InFlight(IntGauge);

impl InFlight {
    fn new(gauge: &IntGauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_errors_are_truncated_on_a_char_boundary() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("ééééé", 3), "ééé…");
    }

    #[test]
    fn panic_messages_are_read() {
        let Err(panic) = std::panic::catch_unwind(|| panic!("boom {}", 1));
        assert_eq!(panic_message(panic.as_ref()), "boom 1");
        let Err(panic) = std::panic::catch_unwind(|| panic!("static"));
        assert_eq!(panic_message(panic.as_ref()), "static");
    }

    fn chaos_settings(crash: f64, pause: f64) -> Settings {
        let mut config = WorkerConfig::new(["http://127.0.0.1:1"]);
        config.chaos_crash_probability = crash;
        config.chaos_heartbeat_pause_probability = pause;
        config.chaos_heartbeat_pause_seconds = 7.0;
        config.validate().unwrap_or_else(|err| panic!("{err}"))
    }

    #[tokio::test(start_paused = true)]
    async fn chaos_is_off_by_default_and_always_on_at_probability_one() {
        let task =
            crate::handler::tests::task(1, serde_json::json!({ "sleep_duration_seconds": 4 }));
        let off = chaos_settings(0.0, 0.0);
        let now = Instant::now();
        for _ in 0..100 {
            assert!(chaos_crash_at(&off, &task).is_none());
            assert!(chaos_pause(&off, now).is_none());
        }
        let on = chaos_settings(1.0, 1.0);
        for _ in 0..100 {
            let at = chaos_crash_at(&on, &task).unwrap_or_else(|| panic!("no crash"));
            assert!(
                at >= now && at <= now + Duration::from_secs(4),
                "within the task's sleep"
            );
            let (from, until) = chaos_pause(&on, now).unwrap_or_else(|| panic!("no pause"));
            assert_eq!(
                from,
                now + Duration::from_secs(15),
                "from the first heartbeat"
            );
            assert_eq!(until - from, Duration::from_secs(7));
        }
        let no_sleep = crate::handler::tests::task(2, serde_json::json!({}));
        let at = chaos_crash_at(&on, &no_sleep).unwrap_or_else(|| panic!("no crash"));
        assert!(
            at <= now + Duration::from_secs(15),
            "within one heartbeat interval"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_lease_deadline_moves_with_confirmations_only_forward() {
        let start = Instant::now();
        let lease = LeaseState::new(Duration::from_secs(28), start);
        assert_eq!(lease.deadline(), start + Duration::from_secs(28));
        lease.confirm(start + Duration::from_secs(15));
        assert_eq!(lease.deadline(), start + Duration::from_secs(43));
        lease.confirm(start + Duration::from_secs(5)); // a late answer to an older heartbeat
        assert_eq!(lease.deadline(), start + Duration::from_secs(43));
        lease.lose("first".to_owned());
        lease.lose("second".to_owned());
        assert!(lease.lost.is_cancelled());
        assert_eq!(lease.reason(), "first");
    }
}
