//! The black-box test harness: a private PostgreSQL per test process, a fresh database per test,
//! and Leasehold's services started as real processes and spoken to over HTTP.
//!
//! ```no_run
//! # async fn example() {
//! let db = tests::fresh_database().await;
//! let leases = tests::Service::lease_service(&db, &[]).await;
//! // Ordinary traffic through the shared typed client, as every other caller speaks it...
//! let lease = leases.lease_client().acquire("r", "h", None).await.unwrap();
//! assert_eq!(lease.holder, "h");
//! // ...and raw requests only where the wire itself is under test.
//! let answer = leases.post("/api/leases", &serde_json::json!({"resource": "r", "holder": "x"})).await;
//! assert_eq!((answer.status, answer.code()), (409, "lease_held"));
//! # }
//! ```
//!
//! # Layout
//!
//! The everyday items are re-exported here, so a test writes `tests::Service`, whatever module
//! holds it:
//!
//! - `postgres`: the test process's PostgreSQL ([`cluster`]) and [`fresh_database`].
//! - `process`: finding the workspace's [`binary`], the [`ChildGuard`] that ties a child to its
//!   test, and killing a whole process tree ([`descendants`], [`kill_process_tree`]).
//! - `service`: [`Service`], a binary running on a [`free_port`] with its log in [`log_dir`], its
//!   raw HTTP helpers returning an [`Answer`] (for tests of the wire itself), its typed clients
//!   ([`Service::task_client`], [`Service::lease_client`]; [`task_client`] and [`lease_client`]
//!   for a bare URL) for everything else, and its signals.
//! - `sql`: [`snapshot`] and [`execute`], direct SQL on a test's database.
//! - `history`: [`synthesize_history`], a day (or any span) of finished tasks' history written
//!   straight into task-service's tables, for the charts' tests and benchmark.
//! - `helpers`: [`eventually`], [`metric_sum`], [`verdicts`] and [`pg_auto_failover_available`]; and for the typed clients
//!   [`new_task`], [`create_new`], [`all_tasks_final`] and [`refusal`].
//!
//! And the public modules, for the tests that need them:
//!
//! - [`checker`]: the invariant checker over the recorded lease and task history.
//! - [`soak`]: the whole stack under seeded random faults, then the checker.
//! - [`bench`](mod@bench): the benchmark harness (the `bench` binary and the quick CI mode).
//! - [`proxy`]: the round-robin proxy the soak puts in front of the replicas.
//! - [`gate`]: a forwarder in front of PostgreSQL that freezes, for a database host that
//!   accepts connections and never answers.
//! - [`browser`]: a headless browser for the dashboard's tests.
//! - [`otlp`]: an OTLP receiver, to see the spans the services export.
//! - [`tools`]: the offline validators the deploy checks run, installed from PyPI on first use.
//! - [`work`]: what the tests of work in any language share (exec, push, the examples).
#![allow(clippy::unwrap_used, clippy::print_stdout)]

pub mod bench;
pub mod browser;
pub mod checker;
pub mod gate;
pub mod otlp;
pub mod proxy;
pub mod soak;
pub mod tools;
pub mod work;

mod helpers;
mod history;
mod postgres;
mod process;
mod service;
mod sql;
mod stack;

pub use helpers::{
    all_tasks_final, create_new, eventually, metric_sum, new_task, pg_auto_failover_available,
    refusal, revoke_worker_lease, verdicts,
};
pub use history::{EVENTS_PER_TASK, synthesize_history};
pub use postgres::{cluster, fresh_database};
pub use process::{ChildGuard, binary, descendants, kill_process_tree, target_dir};
pub use service::{
    Answer, Service, discard_log, free_port, free_port_block, keep_logs, lease_client, log_dir,
    open_log, task_client,
};
pub use sql::{
    execute, query, revert_tasks_schema, snapshot, try_execute, until_waiting_for_locks,
};
pub use stack::Stack;
