//! The work itself: the [`TaskHandler`] trait users implement, and the built-in
//! [`SleepHandler`].
//!
//! # Design
//!
//! [`TaskHandler::handle`] is an ordinary method returning `impl Future + Send` (return-position
//! `impl Trait` in traits), so a handler is written as `fn handle(..) -> impl Future<..> + Send {
//! async move { .. } }` with no boxing and no macro. [`crate::run`] is generic over the handler
//! and shares it between tasks in an `Arc`.
//!
//! Such a trait cannot be used as `dyn TaskHandler`. For handlers chosen at run time there is
//! [`DynTaskHandler`], an object-safe twin implemented for every `TaskHandler` (it boxes the
//! future), and `Arc<dyn DynTaskHandler>` is itself a `TaskHandler`:
//!
//! ```
//! use std::sync::Arc;
//! use leasehold_worker::{DynTaskHandler, SleepHandler, handler_fn, TaskFailure};
//!
//! let by_name: Arc<dyn DynTaskHandler> = if std::env::var("SLEEPY").is_ok() {
//!     Arc::new(SleepHandler::default())
//! } else {
//!     Arc::new(handler_fn(|task, _cancel| async move {
//!         Ok::<_, TaskFailure>(serde_json::json!({"echo": task.task_data}))
//!     }))
//! };
//! // `by_name` can be passed to `leasehold_worker::run`.
//! # let _ = by_name;
//! ```
//!
//! # Cancellation
//!
//! The handler gets a [`CancellationToken`] that is cancelled when the task's lease is lost, when
//! task-service cancels the task, or when the grace period of a shutdown runs out. Checking it
//! lets a handler stop cleanly (and release what it holds); ignoring it is safe too: the worker
//! drops the handler's future at that moment, or once its [`TaskHandler::stop_grace`] is over,
//! and never completes the task afterwards.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use leasehold::tasks::Task;
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Why a task was not done now. `retryable: false` makes task-service mark it dead at once;
/// `true` lets it be tried again while attempts remain. With `snooze`, it was not a failure
/// but a "not yet" (River's `JobSnooze`, Oban's `{:snooze, seconds}`): the task goes back to
/// pending, due after that delay, without charging the attempt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TaskFailure {
    pub message: String,
    pub retryable: bool,
    pub snooze: Option<Duration>,
}

impl TaskFailure {
    /// A failure that another attempt may not repeat (a timeout, a busy dependency).
    pub fn retryable(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: true,
            snooze: None,
        }
    }

    /// A failure that every attempt would repeat (bad input).
    pub fn permanent(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: false,
            snooze: None,
        }
    }

    /// Not now: run the task again after `delay` (at most a year), without charging the
    /// attempt.
    pub fn snooze(delay: Duration) -> Self {
        Self {
            message: format!("snoozed for {delay:?}"),
            retryable: true,
            snooze: Some(delay),
        }
    }
}

/// What a task's work produces: its output (stored as `taskOutput`), or why it failed.
pub type TaskResult = Result<Value, TaskFailure>;

/// The work a worker does with each task it claims.
pub trait TaskHandler: Send + Sync + 'static {
    /// Does the work of `task`. Should stop soon after `cancel` is cancelled (the result is then
    /// ignored; the future may also simply be dropped).
    fn handle(
        &self,
        task: Task,
        cancel: CancellationToken,
    ) -> impl Future<Output = TaskResult> + Send;

    /// How long the worker goes on polling `handle`'s future after cancelling it, before it
    /// drops it; none by default. A handler whose work stops in steps (a command sent SIGTERM,
    /// then SIGKILL after a grace) names that time here, so that a stop is as gentle as it
    /// says. The task is never completed after the cancel, whatever the future returns.
    fn stop_grace(&self) -> Duration {
        Duration::ZERO
    }
}

/// A boxed handler future.
pub type BoxTaskFuture<'a> = Pin<Box<dyn Future<Output = TaskResult> + Send + 'a>>;

/// The object-safe form of [`TaskHandler`], implemented for every `TaskHandler`.
pub trait DynTaskHandler: Send + Sync + 'static {
    fn handle_boxed(&self, task: Task, cancel: CancellationToken) -> BoxTaskFuture<'_>;

    /// [`TaskHandler::stop_grace`].
    fn dyn_stop_grace(&self) -> Duration;
}

impl<H: TaskHandler> DynTaskHandler for H {
    fn handle_boxed(&self, task: Task, cancel: CancellationToken) -> BoxTaskFuture<'_> {
        Box::pin(self.handle(task, cancel))
    }

    fn dyn_stop_grace(&self) -> Duration {
        self.stop_grace()
    }
}

impl TaskHandler for Arc<dyn DynTaskHandler> {
    fn handle(
        &self,
        task: Task,
        cancel: CancellationToken,
    ) -> impl Future<Output = TaskResult> + Send {
        self.as_ref().handle_boxed(task, cancel)
    }

    fn stop_grace(&self) -> Duration {
        self.as_ref().dyn_stop_grace()
    }
}

impl<H: TaskHandler> TaskHandler for Arc<H> {
    fn handle(
        &self,
        task: Task,
        cancel: CancellationToken,
    ) -> impl Future<Output = TaskResult> + Send {
        self.as_ref().handle(task, cancel)
    }

    fn stop_grace(&self) -> Duration {
        self.as_ref().stop_grace()
    }
}

/// A handler made of a closure; see [`handler_fn`].
pub struct FnHandler<F>(F);

impl<F> std::fmt::Debug for FnHandler<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FnHandler")
    }
}

/// Makes a handler of `f(task, cancel) -> future`.
pub fn handler_fn<F, Fut>(f: F) -> FnHandler<F>
where
    F: Fn(Task, CancellationToken) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = TaskResult> + Send + 'static,
{
    FnHandler(f)
}

impl<F, Fut> TaskHandler for FnHandler<F>
where
    F: Fn(Task, CancellationToken) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = TaskResult> + Send + 'static,
{
    fn handle(
        &self,
        task: Task,
        cancel: CancellationToken,
    ) -> impl Future<Output = TaskResult> + Send {
        (self.0)(task, cancel)
    }
}

/// The field of `taskData` that [`SleepHandler`] reads.
pub const SLEEP_FIELD: &str = "sleep_duration_seconds";

/// The field of `taskData` that makes [`SleepHandler`] fail on purpose (for tests and demos).
pub const FAIL_FIELD: &str = "fail";

/// The sample's work: sleeps `taskData.sleep_duration_seconds` seconds (fractions allowed,
/// capped at [`SleepHandler::max_sleep`]) and returns `{"slept_seconds": N}`.
///
/// It sleeps in steps of at most [`SleepHandler::step`] and stops as soon as it is cancelled. A
/// missing, non-numeric or negative duration is a permanent failure.
///
/// For testing failure paths, an optional `taskData.fail` makes it fail after the sleep:
/// `"always"` (or `true`) fails every attempt retryably, `"permanent"` fails at once for good
/// (`retryable: false`), a number `p` in 0..=1 fails retryably with probability `p`; absent,
/// `null` or `false` never fails. Any other value is a permanent failure saying so.
#[derive(Debug, Clone)]
pub struct SleepHandler {
    /// Longer requests sleep this long (default one hour).
    pub max_sleep: Duration,
    /// Longest single sleep between checks (default 100 ms).
    pub step: Duration,
}

impl Default for SleepHandler {
    fn default() -> Self {
        Self {
            max_sleep: Duration::from_secs(3_600),
            step: Duration::from_millis(100),
        }
    }
}

impl SleepHandler {
    /// The number of seconds `task_data` asks for, or why it asks for none.
    pub fn requested_seconds(task_data: &Value) -> Result<f64, TaskFailure> {
        let value = task_data.get(SLEEP_FIELD).ok_or_else(|| {
            TaskFailure::permanent(format!(
                "taskData.{SLEEP_FIELD} is missing; the sleep handler needs a number of seconds"
            ))
        })?;
        let seconds = value.as_f64().ok_or_else(|| {
            TaskFailure::permanent(format!(
                "taskData.{SLEEP_FIELD} must be a number of seconds, not {value}"
            ))
        })?;
        if !seconds.is_finite() || seconds < 0.0 {
            return Err(TaskFailure::permanent(format!(
                "taskData.{SLEEP_FIELD} must not be negative, got {seconds}"
            )));
        }
        Ok(seconds)
    }

    /// What `taskData.fail` asks for: `Ok(None)` to succeed, `Ok(Some(failure))` to fail after
    /// the sleep, `Err` when the field itself is invalid.
    fn planned_failure(task_data: &Value) -> Result<Option<TaskFailure>, TaskFailure> {
        let always = || {
            TaskFailure::retryable(format!(
                "failing on purpose: taskData.{FAIL_FIELD} is \"always\""
            ))
        };
        match task_data.get(FAIL_FIELD) {
            None | Some(Value::Null | Value::Bool(false)) => Ok(None),
            Some(Value::Bool(true)) => Ok(Some(always())),
            Some(Value::String(text)) if text == "always" => Ok(Some(always())),
            Some(Value::String(text)) if text == "permanent" => Err(TaskFailure::permanent(
                format!("failing on purpose, for good: taskData.{FAIL_FIELD} is \"permanent\""),
            )),
            Some(Value::Number(p)) if p.as_f64().is_some_and(|p| (0.0..=1.0).contains(&p)) => {
                let p = p.as_f64().unwrap_or(0.0);
                Ok((rand::random::<f64>() < p).then(|| {
                    TaskFailure::retryable(format!(
                        "failing on purpose: taskData.{FAIL_FIELD} is {p} and the dice said so"
                    ))
                }))
            }
            Some(other) => Err(TaskFailure::permanent(format!(
                "taskData.{FAIL_FIELD} must be \"always\", \"permanent\", a probability or false, \
                 not {other}"
            ))),
        }
    }
}

impl TaskHandler for SleepHandler {
    fn handle(
        &self,
        task: Task,
        cancel: CancellationToken,
    ) -> impl Future<Output = TaskResult> + Send {
        let max_sleep = self.max_sleep;
        let step = self.step.max(Duration::from_millis(1));
        async move {
            let requested = Self::requested_seconds(&task.task_data)?;
            let planned_failure = Self::planned_failure(&task.task_data)?;
            let seconds = requested.min(max_sleep.as_secs_f64());
            if seconds < requested {
                tracing::warn!(
                    task_id = task.id,
                    requested,
                    capped = seconds,
                    "sleep duration capped"
                );
            }
            let total = Duration::try_from_secs_f64(seconds).unwrap_or(max_sleep);
            let started = Instant::now();
            let end = started + total;
            loop {
                let now = Instant::now();
                if now >= end {
                    break;
                }
                tokio::select! {
                    biased;
                    () = cancel.cancelled() => {
                        return Err(TaskFailure::retryable(format!(
                            "cancelled after sleeping {:.3} of {seconds} seconds",
                            started.elapsed().as_secs_f64()
                        )));
                    }
                    () = tokio::time::sleep_until((now + step).min(end)) => {}
                }
            }
            match planned_failure {
                Some(failure) => Err(failure),
                None => Ok(json!({ "slept_seconds": seconds })),
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use chrono::Utc;
    use leasehold::tasks::TaskStatus;

    use super::*;

    pub(crate) fn task(id: i64, task_data: Value) -> Task {
        let now = Utc::now();
        Task {
            id,
            task_data,
            scheduled_at: now,
            processor: Some("test".to_owned()),
            last_heart_beat_at: None,
            must_heart_beat_before: None,
            started_at: Some(now),
            processed_at: None,
            task_output: None,
            status: TaskStatus::Running,
            queue: "default".to_owned(),
            priority: 0,
            attempts: 1,
            max_attempts: 3,
            fence: Some(7),
            idempotency_key: None,
            concurrency_key: None,
            last_error: None,
            cancel_requested: false,
            created_at: now,
            updated_at: now,
            lease_ttl_ms: None,
            waited_ms: None,
        }
    }

    async fn sleep_for(data: Value) -> (TaskResult, Duration) {
        let started = Instant::now();
        let result = SleepHandler::default()
            .handle(task(1, data), CancellationToken::new())
            .await;
        (result, started.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn sleeps_fractional_seconds() {
        let (result, elapsed) = sleep_for(json!({ "sleep_duration_seconds": 2.25 })).await;
        assert_eq!(result.unwrap(), json!({ "slept_seconds": 2.25 }));
        assert_eq!(elapsed, Duration::from_millis(2_250));
        let (result, elapsed) = sleep_for(json!({ "sleep_duration_seconds": 3 })).await;
        assert_eq!(result.unwrap(), json!({ "slept_seconds": 3.0 }));
        assert_eq!(elapsed, Duration::from_secs(3));
        let (result, elapsed) = sleep_for(json!({ "sleep_duration_seconds": 0 })).await;
        assert!(result.is_ok());
        assert_eq!(elapsed, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn caps_long_sleeps() {
        let handler = SleepHandler {
            max_sleep: Duration::from_secs(5),
            ..SleepHandler::default()
        };
        let started = Instant::now();
        let result = handler
            .handle(
                task(1, json!({ "sleep_duration_seconds": 1e9 })),
                CancellationToken::new(),
            )
            .await;
        assert_eq!(result.unwrap(), json!({ "slept_seconds": 5.0 }));
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn bad_durations_fail_permanently_with_a_clear_message() {
        for (data, expected) in [
            (json!({}), "missing"),
            (json!(null), "missing"),
            (json!({ "sleep_duration_seconds": "5" }), "must be a number"),
            (
                json!({ "sleep_duration_seconds": null }),
                "must be a number",
            ),
            (json!({ "sleep_duration_seconds": -1 }), "negative"),
            (json!({ "sleep_duration_seconds": -0.5 }), "negative"),
        ] {
            let (result, elapsed) = sleep_for(data.clone()).await;
            let failure = result.unwrap_err();
            assert!(!failure.retryable, "{data}");
            assert!(failure.message.contains(expected), "{data}: {failure}");
            assert!(failure.message.contains(SLEEP_FIELD), "{failure}");
            assert_eq!(elapsed, Duration::ZERO);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn fails_on_purpose_when_asked() {
        let (result, elapsed) =
            sleep_for(json!({ "sleep_duration_seconds": 1, "fail": "always" })).await;
        let failure = result.unwrap_err();
        assert!(failure.retryable);
        assert!(failure.message.contains("always"), "{failure}");
        assert_eq!(elapsed, Duration::from_secs(1), "after the sleep");
        let failure = sleep_for(json!({ "sleep_duration_seconds": 0, "fail": true }))
            .await
            .0
            .unwrap_err();
        assert!(failure.retryable);
        let (result, elapsed) =
            sleep_for(json!({ "sleep_duration_seconds": 5, "fail": "permanent" })).await;
        assert!(!result.unwrap_err().retryable);
        assert_eq!(elapsed, Duration::ZERO, "at once");
        for never in [json!(false), json!(null), json!(0)] {
            let data = json!({ "sleep_duration_seconds": 0, "fail": never });
            assert!(sleep_for(data).await.0.is_ok());
        }
        let failure = sleep_for(json!({ "sleep_duration_seconds": 0, "fail": 1 }))
            .await
            .0
            .unwrap_err();
        assert!(failure.retryable);
        let failure = sleep_for(json!({ "sleep_duration_seconds": 0, "fail": "sometimes" }))
            .await
            .0
            .unwrap_err();
        assert!(!failure.retryable);
        assert!(failure.message.contains("sometimes"), "{failure}");
    }

    #[tokio::test(start_paused = true)]
    async fn cancellation_stops_it_within_a_step() {
        let cancel = CancellationToken::new();
        let token = cancel.clone();
        let handle = tokio::spawn(async move {
            SleepHandler::default()
                .handle(task(1, json!({ "sleep_duration_seconds": 60 })), token)
                .await
        });
        tokio::time::sleep(Duration::from_millis(1_234)).await;
        let cancelled_at = Instant::now();
        cancel.cancel();
        let result = handle.await.unwrap();
        assert!(cancelled_at.elapsed() <= Duration::from_millis(100));
        let failure = result.unwrap_err();
        assert!(failure.message.contains("cancelled"), "{failure}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_handler_behind_dyn_and_arc_still_works() {
        let dynamic: Arc<dyn DynTaskHandler> = Arc::new(SleepHandler::default());
        let result = dynamic
            .handle(
                task(1, json!({ "sleep_duration_seconds": 1 })),
                CancellationToken::new(),
            )
            .await;
        assert_eq!(result.unwrap(), json!({ "slept_seconds": 1.0 }));
        let shared = Arc::new(handler_fn(|task: Task, _cancel| async move {
            Ok(json!({ "id": task.id }))
        }));
        let result = shared
            .handle(task(9, json!({})), CancellationToken::new())
            .await;
        assert_eq!(result.unwrap(), json!({ "id": 9 }));
    }
}
