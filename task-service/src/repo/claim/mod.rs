//! Claim rounds: the lapsed tasks, the due tasks, recording claims, and postponing a lapse whose
//! lease still lives.

mod due;
mod lapsed;
mod record;

pub use due::{DUE_BY_KEY, KeyedCandidate, due_by_key, due_sql, lock_candidates, lock_due};
pub use lapsed::{Slots, Taken, cancel_lapsed, postpone_lapse, take_lapsed};
pub use record::{Claim, mark_claimed};

/// Keeps a claim off the tasks of paused queues. The paused queues are read once per statement
/// (an init plan), so the claim keeps walking its ordered index; a paused queue's tasks are
/// stepped over, never locked.
const NOT_PAUSED: &str = "AND queue <> ALL (ARRAY(SELECT q.queue FROM queues q WHERE q.paused))";
