//! Do work only while holding a lease: the run-on-one-replica pattern with the leases client.
//! Start the stack (`cargo run -p leasehold-local`), then run this twice side by side:
//!
//! ```text
//! cargo run -p leasehold --example hold_a_lease -- http://127.0.0.1:8081
//! ```
//!
//! One copy holds `example:report` and works; the other waits its turn, and takes over within a
//! lease's TTL when the first is stopped (even with kill -9).

use std::time::Duration;

use leasehold::{GuardConfig, LeaseClient, Singleton, SingletonEvent};

#[tokio::main]
async fn main() -> Result<(), leasehold::LeaseError> {
    let _telemetry = leasehold::telemetry::init("hold-a-lease");
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:8081".to_owned());
    let holder = format!("example-{}", std::process::id());
    let guard = GuardConfig::new("example:report", holder).ttl(Duration::from_secs(6));
    Singleton::new(LeaseClient::new(url), guard, Duration::from_secs(1))
        .on_event(|event| match event {
            SingletonEvent::Acquired { fence } => tracing::info!(fence, "now holding the lease"),
            SingletonEvent::Lost { fence, reason } => {
                tracing::warn!(fence, %reason, "lost the lease: stopped working");
            }
            SingletonEvent::Released { fence } => tracing::info!(fence, "handed the lease over"),
        })
        .run_periodic(
            leasehold::shutdown::token(),
            Duration::from_secs(2),
            |lease| async move {
                // Only while the lease holds; a write elsewhere would present `lease.fence()`.
                tracing::info!(fence = lease.fence(), "doing this round's work");
            },
        )
        .await
}
