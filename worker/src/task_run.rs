//! One claimed task's run, from the handler's start to its final answer: the handler races the
//! lease's loss, the shutdown's hand-back and the chaos crash, and whatever wins decides what is
//! sent (`complete`, `fail`, a hand-back) or that nothing is. It is one async function per task,
//! spawned by the claim loop, so that a task's whole life reads top to bottom in one place and a
//! panic or a dropped future stays inside that task. Every answer goes through [`deliver`], the
//! one place that retries and that refuses to send once the lease may be lost: a worker must
//! never answer for a task someone else may now hold.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::FutureExt;
use leasehold::ErrorCode;
use leasehold::tasks::Task;
use prometheus::IntGauge;
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::chaos::{chaos_crash_at, chaos_pause, crash};
use crate::ctx::{Ctx, HAND_BACK_TIMEOUT};
use crate::handler::{TaskFailure, TaskHandler};
use crate::heartbeat::{LeaseState, keep_alive, lease_ttl, retry_backoff};
use leasehold::task_client::CallError;
use tracing::Instrument as _;

/// Longest error message sent with `fail`: what task-service keeps.
pub use leasehold::tasks::MAX_ERROR_CHARS;

/// Where a message is cut, so that with its "…" it is still all kept.
const CUT_AT: usize = MAX_ERROR_CHARS - 1;

/// How the work on a task ended.
enum Outcome {
    Lost,
    HandBack,
    Done(Result<crate::handler::TaskResult, Box<dyn Any + Send>>),
}

/// When a claimed task is handed back instead of finished.
#[derive(Clone, Default)]
pub(crate) struct HandBack {
    /// The grace period is over: every unfinished task.
    pub(crate) all: CancellationToken,
    /// Shutdown began: the tasks claimed ahead that have not started.
    pub(crate) unstarted: CancellationToken,
}

/// Works on one claimed task, from its claim to its final answer (or loss). It starts once one
/// of the process's slots is free: at once, unless it was claimed ahead (`WORKER_PREFETCH`);
/// meanwhile it is heartbeaten like a running one.
pub(crate) async fn process<H: TaskHandler>(
    ctx: Arc<Ctx>,
    handler: Arc<H>,
    task: Task,
    claim_sent: Instant,
    hand_back: HandBack,
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
        lease_ttl(&task),
        settings.heartbeat_interval,
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
    // A free slot comes before a stop: a task a claim brings while the worker stops runs if a
    // slot is free for it, and only one that would wait for a slot goes back.
    let mut unstarted = Some(Unstarted(&ctx.unstarted));
    let outcome = tokio::select! {
        biased;
        () = lease.lost.cancelled() => Outcome::Lost,
        slot = ctx.slots.clone().acquire_owned() => match slot {
            Ok(slot) => {
                unstarted.take();
                // The task's span: what the work does (an exec command's `TRACEPARENT`, a push's
                // `traceparent`, a Rust handler's own spans) joins its trace.
                let span = tracing::info_span!(
                    "run task",
                    otel.kind = "consumer",
                    task.id = id,
                    task.queue = %task.queue,
                    task.attempt = task.attempts,
                );
                let work = AssertUnwindSafe(handler.handle(task, cancel.clone()))
                    .catch_unwind()
                    .instrument(span);
                let mut work = std::pin::pin!(work);
                let outcome = tokio::select! {
                    biased;
                    () = lease.lost.cancelled() => Outcome::Lost,
                    () = hand_back.all.cancelled() => Outcome::HandBack,
                    () = sleep_until_some(crash_at) => crash(id, fence),
                    result = &mut work => Outcome::Done(result),
                };
                let grace = handler.stop_grace();
                if !matches!(outcome, Outcome::Done(_)) && !grace.is_zero() {
                    // Stopped: the handler is told, and given its own grace to stop before its
                    // future is dropped. Its result is not used: the task is not this
                    // worker's to complete any more.
                    cancel.cancel();
                    let _ = tokio::time::timeout(grace, &mut work).await;
                }
                // The work is over: the slot goes to the next task while this one's answer
                // travels.
                drop(slot);
                outcome
            }
            Err(_) => Outcome::HandBack,
        },
        () = hand_back.all.cancelled() => Outcome::HandBack,
        () = hand_back.unstarted.cancelled() => Outcome::HandBack,
    };
    drop(unstarted);
    // The handler is finished or its future was just dropped; tell anything it started, too.
    cancel.cancel();

    answer(
        &ctx,
        id,
        fence,
        &lease,
        claim_sent,
        crash_at.is_some(),
        outcome,
    )
    .await;
}

/// What the worker does once the task's work is over: a loss is logged (and the lease given up,
/// unless task-service refused it), a task handed back goes back, and a finished one is
/// completed, snoozed or failed. `crash_pending`: a chaos crash was due beyond the work's end.
async fn answer(
    ctx: &Arc<Ctx>,
    id: i64,
    fence: Option<i64>,
    lease: &LeaseState,
    claim_sent: Instant,
    crash_pending: bool,
    outcome: Outcome,
) {
    match outcome {
        Outcome::Lost => {
            ctx.metrics.lost.inc();
            tracing::warn!(
                task_id = id,
                fence,
                processor = ctx.settings.worker_id.as_str(),
                reason = %lease.reason(),
                "lost task {id}: work cancelled; it will not be completed by this worker"
            );
            if !lease.was_refused() {
                give_up(ctx, id, fence, &lease.reason()).await;
            }
        }
        Outcome::HandBack => hand_back_task(ctx, id, fence, lease).await,
        Outcome::Done(result) => {
            if crash_pending {
                crash(id, fence); // the chosen point lay beyond the end of the work
            }
            match result {
                Ok(Ok(output)) => complete(ctx, id, fence, lease, claim_sent, output).await,
                Ok(Err(failure)) => match failure.snooze {
                    Some(delay) => snooze(ctx, id, fence, lease, delay).await,
                    None => fail(ctx, id, fence, lease, failure).await,
                },
                Err(panic) => {
                    let failure = TaskFailure::retryable(format!(
                        "the task handler panicked: {}",
                        panic_message(panic.as_ref())
                    ));
                    fail(ctx, id, fence, lease, failure).await;
                }
            }
        }
    }
}

/// Counts a claimed task as not started until dropped (its work starts, or it never will).
struct Unstarted<'a>(&'a AtomicUsize);

impl Drop for Unstarted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Hands back a task this worker gave up because no heartbeat was confirmed in time, as a
/// failure of the attempt, with one request. A task covered by the process's liveness lease is
/// kept from every other worker while the process lives, so it would otherwise wait for the
/// process to end; a task under a lease of its own gets it back sooner than its lease's expiry.
/// If task-service cannot be reached, the process's beats fail too and its lease lapses; if the
/// claim is no longer this worker's, the request is refused and changes nothing.
async fn give_up(ctx: &Ctx, id: i64, fence: Option<i64>, reason: &str) {
    let processor = ctx.settings.worker_id.as_str();
    let message = truncate(&format!("the worker gave the task up: {reason}"), CUT_AT);
    match ctx
        .client
        .fail(id, processor, fence, &message, true, false)
        .await
    {
        Ok(_) => tracing::info!(task_id = id, fence, "handed task {id} back as failed"),
        Err(err) => tracing::debug!(task_id = id, error = %err, "could not hand task {id} back"),
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
    let delivery = deliver(id, "complete", lease, None, || {
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
            lost(ctx, id, fence, "completion", Delivery::Refused(err), None);
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
        abandoned @ Delivery::Abandoned(_) => {
            lost(ctx, id, fence, "completion", abandoned, None);
        }
    }
}

async fn fail(ctx: &Ctx, id: i64, fence: Option<i64>, lease: &LeaseState, failure: TaskFailure) {
    let processor = ctx.settings.worker_id.as_str();
    let message = truncate(&failure.message, CUT_AT);
    let delivery = deliver(id, "fail", lease, None, || {
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
        not_delivered => lost(ctx, id, fence, "failure", not_delivered, Some(&message)),
    }
}

/// The handler's "not yet": the task back to pending, due after `delay`, the attempt not
/// charged.
async fn snooze(ctx: &Ctx, id: i64, fence: Option<i64>, lease: &LeaseState, delay: Duration) {
    let processor = ctx.settings.worker_id.as_str();
    let seconds = delay.as_secs_f64();
    let delivery = deliver(id, "snooze", lease, None, || {
        ctx.client.snooze(id, processor, fence, seconds)
    })
    .await;
    match delivery {
        Delivery::Accepted => {
            ctx.metrics.snoozed.inc();
            tracing::debug!(task_id = id, fence, processor, seconds, "snoozed task {id}");
        }
        not_delivered => lost(ctx, id, fence, "snooze", not_delivered, None),
    }
}

/// Shutdown: hands the task back (`fail` with `requeue: true`) so it can be claimed at once.
async fn hand_back_task(ctx: &Ctx, id: i64, fence: Option<i64>, lease: &LeaseState) {
    let processor = ctx.settings.worker_id.as_str();
    let message = format!("worker {processor} shut down before finishing the task");
    let limit = Instant::now() + HAND_BACK_TIMEOUT;
    let delivery = deliver(id, "hand back", lease, Some(limit), || {
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
        not_delivered => lost(ctx, id, fence, "hand-back", not_delivered, None),
    }
}

/// A final answer (`answer`: completion, failure, hand-back) that did not land: refused by
/// task-service, or given up on at the lease deadline. The task counts as lost to this worker;
/// `handler_error` is the failure that was being reported, if any.
fn lost(
    ctx: &Ctx,
    id: i64,
    fence: Option<i64>,
    answer: &str,
    delivery: Delivery,
    handler_error: Option<&str>,
) {
    let processor = ctx.settings.worker_id.as_str();
    match delivery {
        Delivery::Accepted => return,
        Delivery::Refused(_) | Delivery::Abandoned(_) => ctx.metrics.lost.inc(),
    }
    match delivery {
        Delivery::Accepted => {}
        Delivery::Refused(err) => tracing::warn!(
            task_id = id,
            fence,
            processor,
            code = err.code().map_or("", ErrorCode::as_str),
            error = %err,
            handler_error,
            "task-service refused the {answer} of task {id}; dropping it"
        ),
        Delivery::Abandoned(reason) => tracing::warn!(
            task_id = id,
            fence,
            processor,
            %reason,
            handler_error,
            "gave up delivering the {answer} of task {id}; it is reclaimed when its lease expires"
        ),
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
    let mut backoff = retry_backoff(lease.interval()).waits();
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
}
