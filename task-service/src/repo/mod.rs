//! Every SQL statement of task-service, and nothing else, one module per operation:
//! `create.rs` (inserts and the idempotency key's lookup), `claim.rs` (the claim round's
//! statements), `transition.rs` (heartbeat, complete, fail, cancel, retry), `read.rs` (lookups,
//! listings, counts, the dashboard's reads), `retention.rs` (the sweeper's deletes),
//! `rollup.rs` (the history's per-minute rollup: the sweeper's fold and the charts' read of it),
//! `generator.rs` (its desired state), `queues.rs` (pause, resume and limits), `schedules.rs`
//! (periodic tasks and the tickers' lock) and `bulk.rs` (retry, cancel and delete by filter).
//! The modules are private; their items are re-exported here, where the rules find them. Times are the
//! database's `now()`; every statement runs in a client span from [`leasehold::db_span!`].

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Bool, Integer, Jsonb, Nullable, Text, Timestamptz};
use diesel_async::AsyncPgConnection;
use leasehold::api::{Proof, Secret};
use leasehold::tasks::TaskStatus;

mod bulk;
mod claim;
mod create;
mod generator;
mod queues;
mod read;
mod retention;
mod rollup;
mod schedules;
mod transaction;
mod transition;

pub use bulk::{BulkFilter, cancel_matching, delete_matching, retry_matching};
pub use claim::{
    Claim, DUE_BY_KEY, KeyedCandidate, Slots, Taken, cancel_lapsed, due_by_key, due_sql,
    lock_candidates, lock_due, mark_claimed, postpone_lapse, take_lapsed,
};
pub use create::{
    Inserted, KeyedTask, NewTask, clock, find_by_idempotency_key, insert, insert_generated,
    insert_many,
};
pub use generator::{GeneratorRow, generator, set_generator};
pub use queues::{
    NewLimits, QueueLimit, QueueRow, Running, Tokens, exclude_claims, lock_limits, move_key_cursor,
    queue_names, queue_rows, queue_rows_of, running_counts, set_limits, set_paused, spend_tokens,
    tokens, wake_later,
};
pub use read::{
    OldestDue, Processor, QueueCount, QueueMoves, TaskEvent, TaskFilter, ThroughputBucket, counts,
    counts_of, events, find, list, oldest_due, oldest_due_of, processors, status_totals,
    throughput,
};
pub use retention::{prune_history, sweep};
pub use rollup::{
    Fold, MinuteCounts, PICKUP_BINS_PER_DOUBLING, fold_history, prune_rollup, throughput_minutes,
};
pub use schedules::{
    DueSchedule, IDLE_IN_ROUND, NewSchedule, Replaced, ScheduleRow, advance_schedule,
    bound_idle_in_transaction, delete_schedule, insert_schedule, lock_due_schedules, next_tick_in,
    replace_schedule, schedule, schedules, set_schedule_paused,
};
pub use transaction::{in_index_order, in_index_order_generic, plan_generically};
pub use transition::{
    Covered, lock, lock_many, mark_final, mark_retry, mark_succeeded_covered, mark_succeeded_many,
    record_heartbeat, request_cancel, requeue_dead,
};

pub type Db = AsyncPgConnection;
type Result<T> = std::result::Result<T, diesel::result::Error>;

/// A task row.
#[derive(Debug, Clone, QueryableByName)]
pub struct TaskRow {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = Jsonb)]
    pub task_data: serde_json::Value,
    #[diesel(sql_type = Text)]
    pub queue: String,
    #[diesel(sql_type = Integer)]
    pub priority: i32,
    #[diesel(sql_type = Text)]
    pub status: TaskStatus,
    #[diesel(sql_type = Timestamptz)]
    pub scheduled_at: DateTime<Utc>,
    #[diesel(sql_type = Nullable<Text>)]
    pub processor: Option<String>,
    /// The task's own fence: its claim counter, one higher for every claim of the task.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub fence: Option<i64>,
    #[diesel(sql_type = Integer)]
    pub attempts: i32,
    #[diesel(sql_type = Integer)]
    pub max_attempts: i32,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub last_heartbeat_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub must_heartbeat_before: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub started_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub processed_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Jsonb>)]
    pub task_output: Option<serde_json::Value>,
    #[diesel(sql_type = Nullable<Text>)]
    pub last_error: Option<String>,
    #[diesel(sql_type = Bool)]
    pub cancel_requested: bool,
    #[diesel(sql_type = Nullable<Text>)]
    pub idempotency_key: Option<String>,
    #[diesel(sql_type = Timestamptz)]
    pub created_at: DateTime<Utc>,
    #[diesel(sql_type = Timestamptz)]
    pub updated_at: DateTime<Utc>,
    /// The secret of the lease of the current claim (see the migration that added it).
    #[diesel(sql_type = Nullable<Text>)]
    pub lease_secret: Option<Secret>,
    /// The fence of the lease of the current claim.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub lease_fence: Option<i64>,
    /// The lease that covers the current claim when it is shared (a worker process's
    /// `worker:<id>`); none: the task's own lease.
    #[diesel(sql_type = Nullable<Text>)]
    pub lease_resource: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub concurrency_key: Option<String>,
}

impl TaskRow {
    /// What renew and release present for this task's current lease.
    pub fn lease_proof(&self) -> Proof<'_> {
        Proof {
            fence: self.lease_fence,
            secret: self.lease_secret.as_ref().map(Secret::expose),
        }
    }

    /// The shared lease this task's current claim is under (its worker process's), with its
    /// fence; none: the task's own lease.
    pub fn shared_lease(&self) -> Option<(&str, i64)> {
        Some((self.lease_resource.as_deref()?, self.lease_fence?))
    }
}

/// What a transition's statement returns after [`COLUMNS`] for its history ([`history`]), with
/// the status its tasks left (`from`, an SQL expression; NULL for a create): the moment the
/// transition is recorded at, whether a return to pending charged the attempt, and the pickup
/// wait of a first claim. A statement that records more than this writes its own.
fn event(from: &str) -> String {
    format!(
        "{from}::text AS from_status, now() AS event_at, true AS charged, \
         NULL::float8 AS pickup_ms"
    )
}

/// The statuses of the tasks `which` keeps (a condition on `id`) before the
/// statement that reads them, as `before_id` and `before_status`: a transition joins it to
/// record the status its tasks left. A statement reads one snapshot, so this sees the rows as
/// they were before its own update (they are locked by the caller's transaction, so nothing
/// else changed them since it checked them).
fn before(which: &str) -> String {
    format!("(SELECT id AS before_id, status AS before_status FROM tasks WHERE {which}) b")
}

/// The history of the transition the CTE `moved` made: one `task_events` row per group of its
/// rows that moved alike (moment, queue, from and to status, whether charged), naming the
/// group's tasks with their fences, attempts and lease fences, for the rows `only` (a condition
/// on them) keeps. Each task's claimant (processor and covering lease) is named by its place in
/// the row's distinct `claimants`: a claim group of one task for each of sixteen workers writes
/// one row, not sixteen, and a group for one worker stores its name once (`claimant_of` NULL:
/// every task's claimant is the first). The statement that makes a transition writes it as one
/// more CTE, so history costs a row per group, not a trigger call per task, and nothing else (a
/// heartbeat) pays for it. `moved` returns [`COLUMNS`] and the columns of [`event`].
///
/// A group's tasks are written a row per band of [`HISTORY_BAND`] consecutive ids they fall in,
/// so that a task's rows are found by their first id ([`events`]): one btree entry per row where
/// a GIN index took one per task.
fn history(only: &str) -> String {
    format!(
        "history AS (
             INSERT INTO task_events (at, queue, from_status, to_status, charged, claimants,
                                      claimant_leases, claimant_of, task_ids, fences, attempts,
                                      lease_fences, pickup_ms)
             SELECT event_at, queue, from_status, status, charged,
                    CASE WHEN bool_or(processor IS NOT NULL OR lease_resource IS NOT NULL)
                         THEN array_agg(processor ORDER BY claimant) FILTER (WHERE leads) END,
                    CASE WHEN bool_or(lease_resource IS NOT NULL)
                         THEN array_agg(lease_resource ORDER BY claimant) FILTER (WHERE leads)
                    END,
                    CASE WHEN max(claimant) > 1 THEN array_agg(claimant ORDER BY id) END,
                    array_agg(id ORDER BY id), array_agg(fence ORDER BY id),
                    array_agg(attempts ORDER BY id), array_agg(lease_fence ORDER BY id),
                    CASE WHEN bool_or(pickup_ms IS NOT NULL)
                         THEN array_agg(pickup_ms ORDER BY id) END
             FROM (SELECT moved.*,
                          dense_rank() OVER (PARTITION BY event_at, queue, from_status, status,
                                                          charged, id / {HISTORY_BAND}
                                             ORDER BY processor, lease_resource)::int
                              AS claimant,
                          row_number() OVER (PARTITION BY event_at, queue, from_status, status,
                                                          charged, id / {HISTORY_BAND},
                                                          processor, lease_resource)
                              = 1 AS leads
                   FROM moved WHERE {only}) moved
             GROUP BY event_at, queue, from_status, status, charged, id / {HISTORY_BAND}
         )"
    )
}

/// How many consecutive task ids a history row may name at most: its tasks are of one band
/// (`id / HISTORY_BAND`), which the table checks (`task_events_one_band`, in the migration that
/// explains the choice).
pub const HISTORY_BAND: i64 = 256;

const COLUMNS: &str = "id, task_data, queue, priority, status, scheduled_at, processor, fence, \
    attempts, max_attempts, last_heartbeat_at, must_heartbeat_before, started_at, processed_at, \
    task_output, last_error, cancel_requested, idempotency_key, created_at, updated_at, \
    lease_secret, concurrency_key, lease_fence, lease_resource";
