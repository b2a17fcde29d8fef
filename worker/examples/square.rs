//! A worker with work of its own: squares `task_data.n`, claiming from a queue of its own,
//! `square`, so that it takes only the work it knows. Start the stack without its bundled sleep
//! workers (they claim from every queue, and know only sleep tasks), then
//!
//! ```text
//! cargo run -p leasehold-local -- --workers 0
//! cargo run -p leasehold-worker --example square -- http://127.0.0.1:8082
//! leasehold tasks create --queue square --data '{"n": 12}'
//! ```
//!
//! and the task ends `succeeded` with `{"square": 144}`. Ctrl-C stops claiming, lets the task in
//! hand finish and hands back what cannot.

use std::time::Duration;

use leasehold_worker::{TaskFailure, WorkerConfig, handler_fn};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _telemetry = leasehold::telemetry::init("square-worker");
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:8082".to_owned());
    let handler = handler_fn(|task, cancel| async move {
        let n = task.task_data["n"]
            .as_i64()
            .ok_or_else(|| TaskFailure::permanent("task_data.n must be an integer"))?;
        tokio::select! {
            // The lease was lost or the worker is stopping: nothing of this run will be stored.
            () = cancel.cancelled() => Err(TaskFailure::retryable("cancelled")),
            () = tokio::time::sleep(Duration::from_millis(100)) => {
                Ok(serde_json::json!({ "square": n.saturating_mul(n) }))
            }
        }
    });
    let mut config = WorkerConfig::new([url]);
    config.worker_id = Some(format!("square-{}", std::process::id()));
    config.queue = Some("square".to_owned());
    leasehold_worker::run(config, handler, leasehold::shutdown::signal()).await
}
