//! The claim group's transaction: one that walks indexes, opened in one round trip.

use diesel::sql_types::Text;
use diesel_async::{AnsiTransactionManager, RunQueryDsl, TransactionManager};

use super::{Db, Result};

/// Runs `body` in a claim group's transaction, as `conn.transaction(body)` runs it in a plain
/// one (committed if it returns `Ok`, rolled back otherwise), but one that walks indexes:
/// sorting, sequential scans and JIT compilation are switched off for it, first thing in it.
///
/// Sorting: planner statistics lag behind a queue table. Right after a burst of inserts into a
/// queue the statistics have not seen, PostgreSQL estimates one matching row and may prefer
/// reading every pending row of the queue through `tasks_queue_status_idx` and sorting them, a
/// cost that grows with the backlog on every claim (measured: 20 ms a claim at 20,000 pending,
/// against 0.1 ms through the ordered index). A claim reads a `LIMIT` in index order, never a
/// sort.
///
/// JIT: a switched-off sort is priced out, not removed, so a claim that must still sort a
/// handful of rows (the key walk of [`due_by_key`] does) gets a plan whose cost passes every
/// JIT threshold, and compiling it took 600 ms a claim (measured: the benchmark's key-limited
/// queue at 7 claims a second, against 400 without keys).
///
/// Sequential scans, so that the group's statements over sets of tasks can be kept prepared.
/// A kept statement may keep its plan: after five runs PostgreSQL may settle on a generic plan
/// for the rest of the session, made for the table as it was then, and one made while `tasks`
/// was nearly empty would read it whole ([`leasehold::server::db::Cache`]). With sequential
/// scans priced out every plan walks an index whatever the table's size when it was made, as
/// lease-service's sessions do for all of theirs. Kept, the statements are neither parsed and
/// described in a round trip of their own on each call nor, once generic, planned: a claim
/// group's time is its round trips, one after another, and planning took about as much of
/// PostgreSQL's time per task as running the statements.
///
/// The switches travel with `BEGIN`, in one simple-query message: one round trip opens the
/// transaction in index order, where `BEGIN` and a statement of settings took two.
pub async fn in_index_order<R, E>(
    conn: &mut Db,
    body: impl AsyncFnOnce(&mut Db) -> std::result::Result<R, E>,
) -> std::result::Result<R, E>
where
    E: From<diesel::result::Error>,
{
    opened_with(conn, BEGIN_IN_INDEX_ORDER, body).await
}

/// [`in_index_order`], with every kept statement run on its generic plan: for a completion
/// group, whose statements over sets find each task by its id, a plan as good for one id as for
/// a hundred. Left to choose, PostgreSQL judged the generic plan dearer than a custom one (it
/// assumes ten ids where a custom plan counts them) and planned both statements at every call:
/// 23 µs a task of a batched completion, against 100 to run them. A claim group keeps choosing
/// (see `performance.md`: generic plans for the whole claim group were measured and left).
pub async fn in_index_order_generic<R, E>(
    conn: &mut Db,
    body: impl AsyncFnOnce(&mut Db) -> std::result::Result<R, E>,
) -> std::result::Result<R, E>
where
    E: From<diesel::result::Error>,
{
    opened_with(conn, BEGIN_IN_INDEX_ORDER_GENERIC, body).await
}

/// Runs `body` in a transaction opened by `begin` (one simple-query message), committed if it
/// returns `Ok`, rolled back otherwise.
async fn opened_with<R, E>(
    conn: &mut Db,
    begin: &str,
    body: impl AsyncFnOnce(&mut Db) -> std::result::Result<R, E>,
) -> std::result::Result<R, E>
where
    E: From<diesel::result::Error>,
{
    match AnsiTransactionManager::begin_transaction_sql(conn, begin).await {
        Ok(()) => {}
        // The caller's own transaction goes on as it was.
        Err(err @ diesel::result::Error::AlreadyInTransaction) => return Err(err.into()),
        Err(err) => {
            // `BEGIN` may have run and a switch failed: a transaction would then be open,
            // aborted, though the connection's manager counts none. Marked in error, the
            // connection is dropped by the pool, never handed out again.
            <AnsiTransactionManager as TransactionManager<Db>>::transaction_manager_status_mut(
                conn,
            )
            .set_in_error();
            return Err(err.into());
        }
    }
    match body(conn).await {
        Ok(value) => {
            <AnsiTransactionManager as TransactionManager<Db>>::commit_transaction(conn).await?;
            Ok(value)
        }
        Err(err) => {
            // The body's error is the one to report; a failed rollback leaves the connection
            // marked broken, and the pool drops it.
            let _ = <AnsiTransactionManager as TransactionManager<Db>>::rollback_transaction(conn)
                .await;
            Err(err)
        }
    }
}

/// The text both openings share, written once so that they keep the same switches (a macro:
/// `concat!` takes literals, not constants).
macro_rules! begin_in_index_order {
    () => {
        "BEGIN; SET LOCAL enable_sort = off; SET LOCAL enable_seqscan = off; SET LOCAL jit = off"
    };
}

/// [`in_index_order`]'s opening: the transaction, then its switches.
const BEGIN_IN_INDEX_ORDER: &str = begin_in_index_order!();

/// [`in_index_order_generic`]'s opening: the same switches, and generic plans.
const BEGIN_IN_INDEX_ORDER_GENERIC: &str = concat!(
    begin_in_index_order!(),
    "; SET LOCAL plan_cache_mode = force_generic_plan"
);

/// Makes this transaction's prepared statements use their generic plan (`true`), or choose
/// as PostgreSQL does by default (`false`).
///
/// [`due_by_key`]'s walk takes PostgreSQL 1.5 ms to plan and 0.2 ms to run (measured with 100
/// keys), and the plan depends on no value it is given; by default every call would be planned
/// anew. Only that statement runs under the generic plan: the claim's statements over sets of
/// ids (whose best plan depends on how many there are) are planned on each call, as ever.
#[tracing::instrument(name = "SET LOCAL", level = "debug", skip_all)]
pub async fn plan_generically(conn: &mut Db, generic: bool) -> Result<()> {
    let mode = if generic {
        "force_generic_plan"
    } else {
        "auto"
    };
    diesel::sql_query("SELECT set_config('plan_cache_mode', $1, true)")
        .bind::<Text, _>(mode)
        .execute(conn)
        .await
        .map(drop)
}
