//! The leader's work: read the desired state, and while it says started, create tasks at its
//! pace, each under the leader's fence and an idempotency key of its own.

use std::time::Duration;

use leasehold::generator::GeneratorSettings;
use leasehold::retry::Backoff;
use leasehold::task_client::{self, CallError, TaskClient};
use leasehold::tasks::CreateTask;
use leasehold::{ErrorCode, LeaseHandle};
use tokio::time::Instant;
use tracing::Instrument;

use crate::GeneratorConfig;
use crate::metrics::Metrics;
use crate::pace::Pace;

#[derive(Debug)]
pub(crate) struct Producer {
    pub(crate) tasks: TaskClient,
    pub(crate) holder: String,
    pub(crate) config: GeneratorConfig,
    pub(crate) metrics: Metrics,
}

impl Producer {
    /// The leader's loop: returns only if the lease is in doubt (the singleton then notices the
    /// loss); it is dropped outright when the guard signals loss.
    pub(crate) async fn produce(&self, lease: LeaseHandle) {
        let fence = lease.fence();
        // A holder that lost its lease in doubt may win it back reentrantly, under the same
        // fence: the term's random nonce keeps its keys apart from the previous term's.
        let term: u32 = rand::random();
        let poll = Duration::from_millis(self.config.settings_poll_ms);
        let mut settings: Option<GeneratorSettings> = None;
        let mut polled = Instant::now();
        let mut next = Instant::now();
        let mut sequence: u64 = 0;
        tracing::info!(
            fence,
            "leading: producing tasks while the generator is started"
        );
        loop {
            if settings.is_none() || polled.elapsed() >= poll {
                match self.settings().await {
                    Ok(fresh) => settings = Some(fresh),
                    Err(err) => {
                        tracing::warn!(error = %err, "cannot read the generator's settings")
                    }
                }
                polled = Instant::now();
            }
            let Some(current) = settings.as_ref().filter(|s| s.running) else {
                tokio::time::sleep(poll).await;
                next = Instant::now();
                continue;
            };
            let pace = Pace::of(current);
            tokio::time::sleep_until(next).await;
            match self
                .create(&lease, fence, term, sequence, pace.sleep())
                .await
            {
                Outcome::Done => sequence += 1,
                // Read the settings again at once: production resumes when they say started.
                Outcome::Stopped => {
                    settings = None;
                    continue;
                }
                Outcome::LeadsNoLonger => return,
            }
            // Keep the rate, but never burst to catch up after a stall.
            let after = next.checked_add(pace.period).unwrap_or(next);
            next = match Instant::now().checked_sub(pace.period) {
                Some(floor) => after.max(floor),
                None => after,
            };
        }
    }

    /// One `POST /api/tasks`, as a trace of its own (generator → task-service → database).
    async fn send(
        &self,
        body: &CreateTask,
        fence: i64,
        sequence: u64,
    ) -> Result<task_client::Created, CallError> {
        let root = tracing::info_span!(
            parent: None,
            "generate task",
            generator.holder = %self.holder,
            generator.fence = fence,
            generator.sequence = sequence,
            task.id = tracing::field::Empty,
        );
        let answer = self.tasks.create(body).instrument(root.clone()).await;
        if let Ok(created) = &answer {
            root.record("task.id", created.task().id);
        }
        answer
    }

    async fn settings(&self) -> Result<GeneratorSettings, CallError> {
        self.tasks.generator_settings().await
    }

    /// Creates task `sequence` of this term, retrying transient failures with the same
    /// idempotency key.
    async fn create(
        &self,
        lease: &LeaseHandle,
        fence: i64,
        term: u32,
        sequence: u64,
        sleep: f64,
    ) -> Outcome {
        let body = CreateTask {
            task_data: serde_json::json!({
                "sleep_duration_seconds": sleep,
                "generator": {
                    "holder": self.holder,
                    "fence": fence,
                    "term": format!("{term:08x}"),
                    "sequence": sequence,
                },
            }),
            queue: Some(self.config.queue.clone()),
            idempotency_key: Some(format!(
                "{}:{fence}:{term:08x}:{sequence}",
                self.config.lease_resource
            )),
            generator_fence: Some(fence),
            ..CreateTask::default()
        };
        let mut pauses = Backoff::new(Duration::from_millis(100), Duration::from_secs(2)).waits();
        loop {
            // Never send once the lease is in doubt, whatever woke us.
            if !lease.is_held() {
                return Outcome::LeadsNoLonger;
            }
            let answer = self.send(&body, fence, sequence).await;
            match answer {
                Ok(task_client::Created::New(_)) => {
                    self.metrics.produced.inc();
                    tracing::debug!(fence, sequence, "task created");
                    return Outcome::Done;
                }
                // A retry of a request whose first answer was lost: already created.
                Ok(task_client::Created::Existing(_)) => return Outcome::Done,
                Err(CallError::Refused {
                    status: 409,
                    code: ErrorCode::GeneratorStopped,
                    ..
                }) => {
                    tracing::info!(fence, "the generator was stopped; waiting to be started");
                    return Outcome::Stopped;
                }
                Err(CallError::Refused { status: 409, .. }) => {
                    tracing::warn!(fence, "task-service says this replica no longer leads");
                    return Outcome::LeadsNoLonger;
                }
                Err(err @ CallError::Refused { .. }) => {
                    self.metrics.create_errors.inc();
                    tracing::error!(error = %err, "task-service refused a generated task; skipping it");
                    return Outcome::Done;
                }
                Err(CallError::Transient(reason)) => {
                    self.metrics.create_errors.inc();
                    tracing::warn!(error = %reason, "creating a task failed; retrying");
                }
            }
            tokio::time::sleep(pauses.next_delay()).await;
        }
    }
}

/// How one create ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Created, already created, or skipped for good: on to the next task.
    Done,
    /// task-service refused it because the generator is stopped.
    Stopped,
    /// The lease is in doubt, or task-service says another replica leads: stop producing.
    LeadsNoLonger,
}
