//! Leasehold's common library.
//!
//! What lives here is used by more than one crate of the workspace:
//!
//! * [`api`]: the JSON shapes lease-service speaks, so the service and its clients cannot drift.
//! * [`lease_client`]: a typed HTTP client for lease-service with retries for transient failures.
//! * [`lease_guard`]: a held lease that renews itself in the background and says when it is lost,
//!   and [`lease_guard::with_lease`], which runs a future only while the lease is held.
//! * [`telemetry`] and [`shutdown`]: the logging set-up and signal handling every binary shares.

pub mod api;
pub mod lease_client;
pub mod lease_guard;
pub mod shutdown;
pub mod telemetry;

pub use api::{ErrorBody, Lease, LeaseStatus};
pub use lease_client::{LeaseClient, LeaseError, RetryPolicy};
pub use lease_guard::{GuardConfig, LeaseGuard, LeaseLost, with_lease};
