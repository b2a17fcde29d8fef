//! What every part of a running worker shares ([`Ctx`]): the claim loop (`runner`), each
//! task's run (`task_run`) and its heartbeat (`heartbeat`) read it, and none of them owns it,
//! so it lives below all three.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use leasehold::TaskClient;
use tokio::sync::Semaphore;

use crate::completions::Completer;
use crate::config::Settings;
use crate::metrics::Metrics;
use crate::presence::Load;

/// How long a task is offered back to task-service at shutdown before giving up on it (it is
/// then reclaimed when its lease expires).
pub const HAND_BACK_TIMEOUT: Duration = Duration::from_secs(5);

/// What every runner shares.
pub(crate) struct Ctx {
    pub(crate) settings: Settings,
    pub(crate) client: Arc<TaskClient>,
    /// Sends completions, in batches when several are ready at once.
    pub(crate) completer: Completer,
    pub(crate) metrics: Metrics,
    /// Busy slots and tasks done, for the process's beats (`presence`).
    pub(crate) load: Arc<Load>,
    /// The slots (`WORKER_CONCURRENCY`): a claimed task's work starts once it holds one, and
    /// frees it when the work is over, before its answer is sent.
    pub(crate) slots: Arc<Semaphore>,
    /// Claimed tasks whose work has not started: waiting for a slot (claimed ahead), or just
    /// claimed.
    pub(crate) unstarted: AtomicUsize,
}
