//! Leasehold's black-box tests, one module per area, in one test binary. Each of them used to
//! be a binary of its own, and each linked the whole stack: 47 links made a cold build's target
//! directory 18 GB. One binary links once, starts one private PostgreSQL (each test still gets a
//! fresh database on it), and lets the long tests of one area run beside the short ones of
//! another. `cargo test --workspace --test suite soak::` runs one area.

mod answer_case;
mod architecture;
mod auth;
mod bad_input;
mod bench;
mod bulk_create;
mod bulk_ops;
mod claimant_lease;
mod cli;
mod complete_then_claim;
mod dashboard;
mod database_faults;
mod departed_clients;
mod deploy_files;
mod docs_book;
mod docs_tours;
mod examples;
mod exec_worker;
mod failover;
mod failover_writes;
mod front_door;
mod generator;
mod hostile_input;
mod invariants;
mod lease_api;
mod lease_guard;
mod live_indexes;
mod local_stack;
mod open_reads;
mod openapi;
mod push_worker;
mod python_client;
mod query_plans;
mod queue_limits;
mod queues;
mod sample_compat;
mod schedules;
mod schemathesis;
mod snooze;
mod soak;
mod task_api;
mod task_history;
mod telemetry;
mod throughput_rollup;
mod wakeups;
mod worker_processes;
mod workers;
