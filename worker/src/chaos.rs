//! The chaos switches: a worker that, by chance, skips a task's heartbeats for a while or kills
//! itself in the middle of a task, so that a test or a soak run can watch the stack reclaim the
//! lease and never complete a task twice. They are plain functions of the settings that answer
//! "when" (an instant, or none), and the runner and heartbeat loop act on the answer: that keeps
//! the dice out of the code that has to be right, and lets a test pin each probability at 0 or 1
//! and check the chosen instants with a paused clock. With both probabilities at 0 (the default)
//! nothing here changes what a worker does.

use std::time::Duration;

use leasehold::tasks::Task;
use tokio::time::Instant;

use crate::config::Settings;
use crate::handler::SleepHandler;

/// Warns at start-up when either switch is on, so a chaotic worker is never mistaken for a
/// broken one.
pub(crate) fn announce(settings: &Settings) {
    if settings.chaos.crash_probability > 0.0 || settings.chaos.heartbeat_pause_probability > 0.0 {
        tracing::warn!(
            crash_probability = settings.chaos.crash_probability,
            heartbeat_pause_probability = settings.chaos.heartbeat_pause_probability,
            heartbeat_pause_seconds = settings.chaos.heartbeat_pause.as_secs_f64(),
            "chaos testing is on"
        );
    }
}

/// Chaos: with `CHAOS_HEARTBEAT_PAUSE_PROBABILITY`, heartbeats are skipped from the first one on
/// for `CHAOS_HEARTBEAT_PAUSE_SECONDS`.
pub(crate) fn chaos_pause(settings: &Settings, claim_sent: Instant) -> Option<(Instant, Instant)> {
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
pub(crate) fn chaos_crash_at(settings: &Settings, task: &Task) -> Option<Instant> {
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
pub(crate) fn crash(id: i64, fence: Option<i64>) -> ! {
    tracing::error!(
        task_id = id,
        fence,
        "chaos: crashing in the middle of task {id} (CHAOS_CRASH_PROBABILITY)"
    );
    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    std::process::abort()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WorkerConfig;

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
}
