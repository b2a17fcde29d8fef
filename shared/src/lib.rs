//! Leasehold's common library.
//!
//! # Layout
//!
//! What lives here is used by more than one crate of the workspace:
//!
//! * [`api`], [`tasks`], [`queues`] and [`schedules`]: the JSON shapes lease-service and
//!   task-service speak, so the services and their clients cannot drift.
//! * [`lease_client`]: a typed HTTP client for lease-service with retries for transient failures.
//! * [`task_client`]: the typed HTTP client of task-service that the worker, the generator and
//!   the command line share.
//! * [`lease_guard`]: a held lease that renews itself in the background and says when it is lost,
//!   and [`lease_guard::with_lease`], which runs a future only while the lease is held.
//! * [`singleton`]: a job that runs on exactly one replica of many at a time.
//! * [`telemetry`] and [`shutdown`]: the logging set-up and signal handling every binary shares.
//! * [`keep_alive`]: how long idle connections live, so a client never reuses one the server
//!   is closing.
//! * [`retry`]: the one backoff every retry loop paces itself by; [`deadline`]: the one
//!   conservative lease deadline, and [`keep_confirmed`]: the one loop that keeps it confirmed,
//!   for the guard's renewals and the worker's heartbeats.
//! * `server` (feature `server`): what the HTTP services share: the error type and its JSON
//!   mapping, the start-up and command line, extractor configuration, the database pool and
//!   migrations, group commit (`coalesce`), HTTP metrics, paging.
//!
//! Creating a task and reading it back through [`TaskClient`]: every call is one exchange, a
//! refusal carries task-service's `code`, and anything that says "try later" is transient.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use leasehold::tasks::CreateTask;
//! use leasehold::{CallError, TaskClient};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let client = TaskClient::new(["http://127.0.0.1:8082"]).with_timeout(Duration::from_secs(5));
//! let request = CreateTask {
//!     task_data: serde_json::json!({ "sleep_duration_seconds": 1 }),
//!     idempotency_key: Some("example-1".to_owned()),
//!     ..CreateTask::default()
//! };
//! let task = client.create(&request).await?.into_task();
//! match client.task(task.id).await {
//!     Ok(task) => println!("task {} is {}", task.id, task.status.as_str()),
//!     Err(CallError::Refused { code, .. }) => println!("refused: {code}"),
//!     Err(CallError::Transient(reason)) => println!("try again later: {reason}"),
//! }
//! # Ok(())
//! # }
//! ```

pub mod api;
#[cfg(feature = "server")]
pub mod closed_set;
pub mod deadline;
pub mod flags;
pub mod generator;
pub mod identity;
pub mod integers;
pub mod keep_alive;
pub mod keep_confirmed;
pub mod lease_client;
pub mod lease_guard;
#[cfg(feature = "metrics-server")]
pub mod metrics_server;
pub mod percent;
pub mod queues;
pub mod retry;
pub mod schedules;
pub mod schema;
#[cfg(feature = "server")]
pub mod server;
mod service_error;
pub mod shutdown;
pub mod singleton;
pub mod strict;
pub mod task_client;
pub mod tasks;
pub mod telemetry;
mod transport;
pub mod workers;

pub use api::{ErrorBody, ErrorCode, Lease, LeaseStatus};
pub use deadline::LeaseDeadline;
pub use flags::{float_within, service_url};
pub use lease_client::{LeaseClient, LeaseError};
pub use lease_guard::{GuardConfig, LeaseGuard, LeaseHandle, LeaseLost, with_lease};
pub use retry::{Backoff, RetryPolicy};
pub use service_error::ServiceError;
pub use singleton::{Singleton, SingletonEvent};
pub use task_client::{CallError, TaskClient};
pub use transport::describe as describe_http_error;
