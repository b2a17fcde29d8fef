//! Leasehold's common library.
//!
//! What lives here is used by more than one crate of the workspace:
//!
//! * [`api`] and [`tasks`]: the JSON shapes lease-service and task-service speak, so the
//!   services and their clients cannot drift.
//! * [`lease_client`]: a typed HTTP client for lease-service with retries for transient failures.
//! * [`lease_guard`]: a held lease that renews itself in the background and says when it is lost,
//!   and [`lease_guard::with_lease`], which runs a future only while the lease is held.
//! * [`singleton`]: a job that runs on exactly one replica of many at a time.
//! * [`telemetry`] and [`shutdown`]: the logging set-up and signal handling every binary shares.
//! * `server` (feature `server`): what the HTTP services share: the error type and its JSON
//!   mapping, extractor configuration, the database pool and migrations, HTTP metrics, paging.

pub mod api;
pub mod deadline;
pub mod generator;
pub mod identity;
pub mod lease_client;
pub mod lease_guard;
#[cfg(feature = "metrics-server")]
pub mod metrics_server;
#[cfg(feature = "server")]
pub mod server;
pub mod shutdown;
pub mod singleton;
pub mod tasks;
pub mod telemetry;

pub use api::{ErrorBody, Lease, LeaseStatus};
pub use deadline::LeaseDeadline;
pub use lease_client::{LeaseClient, LeaseError, RetryPolicy};
pub use lease_guard::{GuardConfig, LeaseGuard, LeaseHandle, LeaseLost, with_lease};
pub use singleton::{Singleton, SingletonEvent};
