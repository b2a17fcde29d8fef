//! The worker's graceful stop, after its claim loop: tasks claimed ahead go back at once,
//! in-flight ones get the grace period, and what is left is cancelled and handed back.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::task::{JoinError, JoinSet};
use tokio::time::{Instant, sleep_until};

use crate::ctx::{Ctx, HAND_BACK_TIMEOUT};
use crate::task_run::HandBack;

/// After the claim loop: lets in-flight tasks finish within the grace period, then hands back
/// the rest, each once its handler has had its `stop_grace` to stop.
pub(crate) async fn stop(
    ctx: &Ctx,
    hand_back: &HandBack,
    running: &mut JoinSet<()>,
    stop_grace: Duration,
) {
    let settings = &ctx.settings;
    // Tasks claimed ahead that have not started go back at once: nobody here will start them.
    hand_back.unstarted.cancel();
    tracing::info!(
        in_flight = running.len(),
        grace_seconds = settings.shutdown_grace.as_secs_f64(),
        "shutting down: no longer claiming; letting in-flight tasks finish"
    );
    drain(ctx, running, Instant::now() + settings.shutdown_grace).await;
    if !running.is_empty() {
        tracing::warn!(
            tasks = running.len(),
            "grace period over: cancelling unfinished tasks and handing them back"
        );
        hand_back.all.cancel();
        drain(
            ctx,
            running,
            Instant::now() + stop_grace + HAND_BACK_TIMEOUT + settings.request_timeout * 2,
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

/// Counts a runner that ended, and says so if it panicked.
pub(crate) fn runner_ended(ctx: &Ctx, joined: Result<(), JoinError>) {
    ctx.load.done.fetch_add(1, Ordering::Relaxed);
    if let Err(err) = joined
        && err.is_panic()
    {
        tracing::error!(error = %err, "a task runner panicked");
    }
}
