//! task-generator: the replica holding the `task-generator` lease produces fake sleep tasks.
//! Filled in by the generator issue; see `SPEC.md`.
