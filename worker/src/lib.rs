//! Leasehold's task worker, as a library.
//!
//! A worker claims tasks from task-service (`POST /api/tasks/next`), works on each while
//! heartbeating its lease (`PUT /api/tasks/{id}/heartbeat` with the task's fencing token), and
//! then completes (`PUT /{id}/complete`) or fails (`PUT /{id}/fail`) it. It never answers for a
//! task whose lease it may have lost: a refused heartbeat, or no accepted heartbeat for the
//! lease's TTL minus a safety margin, cancels the work and drops the handler's future. On
//! shutdown it stops claiming, lets in-flight tasks finish within a grace period and hands the
//! rest back, claimable at once. [`runner`] describes the life of a task in detail.
//!
//! Plug in the work by implementing [`TaskHandler`] (see [`handler`] for the design and for
//! `dyn` use), or use [`handler_fn`] with a closure:
//!
//! ```no_run
//! use leasehold_worker::{TaskFailure, WorkerConfig, handler_fn};
//!
//! # async fn example() -> anyhow::Result<()> {
//! let handler = handler_fn(|task, cancel| async move {
//!     let n = task.task_data["n"].as_i64().ok_or_else(|| TaskFailure::permanent("no n"))?;
//!     tokio::select! {
//!         () = cancel.cancelled() => Err(TaskFailure::retryable("cancelled")),
//!         () = tokio::time::sleep(std::time::Duration::from_millis(10)) => {
//!             Ok(serde_json::json!({ "square": n * n }))
//!         }
//!     }
//! });
//! let config = WorkerConfig::new(["http://127.0.0.1:8082"]);
//! leasehold_worker::run(config, handler, leasehold::shutdown::signal()).await
//! # }
//! ```
//!
//! The `worker` binary runs the built-in [`SleepHandler`] (the sample's work), a command for
//! each task ([`exec`]) or a push of each task to an HTTP endpoint ([`push`]), with the
//! configuration of [`config::Cli`] (flags and environment variables).
//!
//! # Layout
//!
//! - [`runner`]: the claim loop, and nothing else;
//! - `task_run`: one task's run, up to its answer; `heartbeat`: keeping its lease, on the
//!   deadline type and the keep-alive loop the lease guard uses ([`leasehold::LeaseDeadline`],
//!   [`leasehold::keep_confirmed`]);
//! - `ctx`: what the three above share (settings, client, slots, load), below them all so that
//!   none imports another's home;
//! - [`completions`]: answers gathered into batch completions;
//! - [`handler`]: the [`TaskHandler`] trait and the built-in handlers; [`exec`] and [`push`],
//!   the handlers for work in any language, and `output`, what both make of their output;
//! - [`config`], [`metrics`], and `chaos`, the fault switches the soak uses.
//!
//! task-service is reached only through [`leasehold::TaskClient`].

mod chaos;
pub mod completions;
pub mod config;
mod ctx;
pub mod exec;
pub mod handler;
mod heartbeat;
pub mod metrics;
mod output;
mod presence;
pub mod push;
pub mod runner;
mod stopping;
mod task_run;

pub use config::{Cli, ConfigError, ExecArgs, PushArgs, Settings, WorkerConfig, default_worker_id};
pub use exec::ExecHandler;
pub use handler::{
    BoxTaskFuture, DynTaskHandler, FnHandler, SleepHandler, TaskFailure, TaskHandler, TaskResult,
    handler_fn,
};
pub use leasehold::task_client::{CallError, TaskClient};
pub use metrics::{Metrics, MetricsServer};
pub use push::{PushHandler, WebhookSecret};
pub use runner::{run, run_with_settings};
