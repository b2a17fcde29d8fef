//! The lapsed tasks a claim round takes again, ends or marks dead (and, for one unlimited
//! queue, the due ones in the same statement), and a lapse postponed while its lease lives.

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{Array, BigInt, Double, Nullable, Text, Timestamptz};
use diesel_async::RunQueryDsl;
use leasehold::server::db::Cache;
use tracing::Instrument;

use super::NOT_PAUSED;
use crate::repo::{COLUMNS, Db, Result, TaskRow, event, history};

use super::due::{DUE_ORDER, lock_due_sql};
use super::record::{ClaimFrom, claim_event, claim_set};

/// Everything a claim round does with running tasks whose lease has run out by the recorded
/// expiry, in one statement (one round trip and one plan, where it was three): up to `limit`
/// of them whose cancellation was asked for end as cancelled (their workers stopped
/// heartbeating, so nobody else would end them; they come back with status `cancelled`); up to
/// `limit` that may be tried again are locked to be claimed; and the exhausted (all attempts
/// used, to be marked dead, never handed out) are locked to fill what is left of `batch_room`.
/// Each part is oldest first; rows another transaction holds are skipped, never waited for.
/// Read apart, tasks only to be ended never fill the places of claimable ones.
///
/// With `due` (for a claim of one queue without limits, `queue` given), the same statement also
/// locks the queue's due tasks ([`due_sql`]'s, in its order) for the room the claimable left of
/// `limit`, and numbers them by the group's slots that follow the claimable ones' (the first due
/// task takes slot `claimable + 1`). A due task whose slot's claimant named a shared lease is
/// claimed under it in this statement, as [`mark_claimed`] records a claim, and comes back
/// `running` with its slot; the others come back `pending`, locked, to be claimed once leases
/// of their own are taken. For single claims of workers that name their process's lease, the
/// statement that finds the work is the one that claims it, as graphile-worker's `get_job` is.
pub async fn take_lapsed(
    conn: &mut Db,
    queue: Option<&str>,
    limit: i64,
    batch_room: i64,
    due: Option<&Slots<'_>>,
) -> Result<Vec<Taken>> {
    let span = leasehold::db_span!("UPDATE", "tasks");
    async move {
        let query = diesel::sql_query(take_lapsed_sql(due.is_some()))
            .bind::<Nullable<Text>, _>(queue)
            .bind::<BigInt, _>(limit)
            .bind::<BigInt, _>(batch_room);
        match due {
            Some(slots) => {
                query
                    .bind::<Array<Text>, _>(&slots.processors)
                    .bind::<Array<Nullable<Text>>, _>(&slots.resources)
                    .bind::<Array<BigInt>, _>(&slots.fences)
                    .bind::<Double, _>(slots.hint.as_secs_f64())
                    .cached()
                    .load(conn)
                    .await
            }
            None => query.cached().load(conn).await,
        }
    }
    .instrument(span)
    .await
}

/// [`take_lapsed`]'s statement, with the part that takes due tasks when `with_due`.
fn take_lapsed_sql(with_due: bool) -> String {
    let (due_part, moved, due_rows) = if with_due {
        (
            format!(
                ", due AS (
     {due}
 ), numbered AS (
     SELECT d.id AS slot_id, d.fence IS NULL AS slot_first,
            (SELECT count(*) FROM claimable)
            + row_number() OVER (ORDER BY {DUE_ORDER}) AS slot
     FROM due d
 ), slotted AS (
     -- Each slot's claimant read once: an element of an array of text is found by
     -- walking the elements before it.
     SELECT n.*, ($4::text[])[n.slot] AS slot_processor,
            ($5::text[])[n.slot] AS slot_resource, ($6::bigint[])[n.slot] AS slot_fence
     FROM numbered n
 ), claimed AS (
     UPDATE tasks SET {set}
     FROM slotted s
     WHERE id = s.slot_id AND s.slot_resource IS NOT NULL
     RETURNING {COLUMNS}, {claim}, s.slot AS claim_slot
 ), moved AS (SELECT * FROM cancelled UNION ALL SELECT * FROM claimed)",
                set = claim_set(&ClaimFrom {
                    processor: "s.slot_processor",
                    fence: "s.slot_fence",
                    secret: "NULL",
                    resource: "s.slot_resource",
                    start: "NULL::timestamptz",
                    expiry: "now() + make_interval(secs => $7)",
                }),
                claim = claim_event("'pending'::text", "s.slot_first"),
                due = lock_due_sql(
                    "AND queue = $1",
                    "GREATEST($2 - (SELECT count(*) FROM claimable), 0)"
                ),
            ),
            "",
            // The claimed, read once into an array: a join would read them all again for
            // each due task.
            "UNION ALL SELECT d.*, NULL::bigint FROM due d
           WHERE d.id <> ALL (ARRAY(SELECT slot_id FROM slotted
                                    WHERE slot_resource IS NOT NULL))",
        )
    } else {
        (String::new(), ", moved AS (SELECT * FROM cancelled)", "")
    };
    format!(
        "WITH cancelled AS (
     {CANCEL_LAPSED}
     RETURNING {COLUMNS}, {from_running}, NULL::bigint AS claim_slot
 ), claimable AS (
     SELECT {COLUMNS} FROM tasks
     WHERE status = 'running' AND must_heartbeat_before <= now()
       AND ($1::text IS NULL OR queue = $1) {NOT_PAUSED}
       AND NOT cancel_requested AND attempts < max_attempts
     ORDER BY must_heartbeat_before
     LIMIT $2
     FOR UPDATE SKIP LOCKED
 ), exhausted AS (
     SELECT {COLUMNS} FROM tasks
     WHERE status = 'running' AND must_heartbeat_before <= now()
       AND ($1::text IS NULL OR queue = $1)
       AND NOT cancel_requested AND attempts >= max_attempts
     ORDER BY must_heartbeat_before
     LIMIT GREATEST($3 - (SELECT count(*) FROM claimable), 0)
     FOR UPDATE SKIP LOCKED
 ){due_part}{moved}, {history}
 SELECT {COLUMNS}, claim_slot FROM moved
 UNION ALL SELECT *, NULL::bigint FROM claimable
 UNION ALL SELECT *, NULL::bigint FROM exhausted
 {due_rows}",
        from_running = event("'running'"),
        history = history("true"),
    )
}

/// The claimants of a claim group's slots, in order (slot 1 first): a request with a `limit`
/// of `n` holds `n` slots. A slot whose claimant named a shared lease (`resources`, and
/// `fences`) can be claimed by [`take_lapsed`]; `hint` is what [`mark_claimed`] takes.
#[derive(Debug)]
pub struct Slots<'a> {
    pub processors: Vec<&'a str>,
    pub resources: Vec<Option<&'a str>>,
    pub fences: Vec<i64>,
    pub hint: std::time::Duration,
}

/// A row [`take_lapsed`] came back with, and the slot it was claimed for there, if it was.
#[derive(Debug, QueryableByName)]
pub struct Taken {
    #[diesel(embed)]
    pub task: TaskRow,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub claim_slot: Option<i64>,
}

/// Ends as cancelled up to `$2` running tasks (of queue `$1`, if given) whose cancellation was
/// asked for and whose lease has run out by the recorded expiry, oldest first, skipping rows
/// another transaction holds: the claim's statement and the sweeper's share it.
const CANCEL_LAPSED: &str = "\
UPDATE tasks SET status = 'cancelled', processed_at = now(), updated_at = now()
     WHERE id IN (SELECT id FROM tasks
                  WHERE status = 'running' AND must_heartbeat_before <= now()
                    AND ($1::text IS NULL OR queue = $1)
                    AND cancel_requested
                  ORDER BY must_heartbeat_before
                  LIMIT $2
                  FOR UPDATE SKIP LOCKED)";

/// Ends as cancelled up to `batch` running tasks (of `queue`, if given) whose cancellation was
/// asked for and whose lease has run out by the recorded expiry: their workers stopped
/// heartbeating, so nobody else would end them. The retention sweeper runs it for queues nobody
/// claims from ([`take_lapsed`] does the same for a claim's queue). Rows another transaction holds are
/// skipped.
pub async fn cancel_lapsed(conn: &mut Db, queue: Option<&str>, batch: i64) -> Result<Vec<TaskRow>> {
    let span = leasehold::db_span!("UPDATE", "tasks");
    async move {
        diesel::sql_query(format!(
            "WITH moved AS (
                 {CANCEL_LAPSED}
                 RETURNING {COLUMNS}, {from_running}
             ), {history}
             SELECT * FROM moved",
            from_running = event("'running'"),
            history = history("true"),
        ))
        .bind::<Nullable<Text>, _>(queue)
        .bind::<BigInt, _>(batch)
        .load(conn)
        .await
    }
    .instrument(span)
    .await
}

/// A lapsed-looking running task whose lease lease-service says is still held: record the
/// holder's expiry, so claims stop picking it up until then.
pub async fn postpone_lapse(conn: &mut Db, id: i64, lease_expiry: DateTime<Utc>) -> Result<()> {
    let span = leasehold::db_span!("UPDATE", "tasks");
    async move {
        diesel::sql_query(
            "UPDATE tasks SET must_heartbeat_before = $2 WHERE id = $1 AND status = 'running'",
        )
        .bind::<BigInt, _>(id)
        .bind::<Timestamptz, _>(lease_expiry)
        .cached()
        .execute(conn)
        .await
        .map(|_| ())
    }
    .instrument(span)
    .await
}
