//! task-service: owns the `tasks` table and hands tasks to workers under leases acquired from
//! lease-service. Filled in by the task-service issue; see `SPEC.md`.
