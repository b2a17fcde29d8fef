//! worker: polls task-service for tasks and heartbeats while it works on them. Filled in by the
//! task-service issue; see `SPEC.md`.
