//! The history's per-minute rollup: the sweeper folds finished minutes of `task_events` into
//! `task_throughput_minutes` and `task_queue_minutes`, and the dashboard's hour and day charts
//! read those, plus only the unfolded tail of the history.
//!
//! Why a fold by the sweeper, not a rollup row written by the history's trigger: every claim and
//! completion of a minute would update that minute's row, in its own transaction, so they would
//! all queue on one row lock. The sweeper runs on one replica (by its lease) and writes each
//! minute once, outside every claim.
//!
//! When a minute may be folded: an event's `at` is its transaction's `now()` (its start; a
//! claim's may be later, never earlier), and the event is seen only once that transaction
//! commits, which may be long after. So a minute is folded only once every transaction open now
//! started after it ended: [`fold_history`] reads the oldest open transaction's start from
//! `pg_stat_activity` first, and folds, in statements of their own (each with a newer snapshot),
//! only the minutes before it. A transaction that starts later has a later `now()`, so no event
//! can arrive in a folded minute. (PostgreSQL shows `xact_start` only for sessions of the same
//! role or to roles with `pg_read_all_stats`: the services' sessions share their role.) Each
//! minute is folded in the transaction that moves `folded_through` past it, so it is counted
//! exactly once, and a read sees either the minute's rollup or its events, never both.

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{Array, BigInt, Double, Integer, Nullable, Text, Timestamptz};
use diesel_async::{AsyncConnection, RunQueryDsl};
use leasehold::server::db::OneRow;
use tracing::Instrument;

use super::read::{
    QueueMoves, THROUGHPUT_TIMEOUT, TRANSITION_COUNTS, history_sql, queue_moves_sql,
};
use super::{Db, Result};

/// The pickup histogram's resolution: bins per doubling of `1 + ms`. Reading a bin as its
/// geometric middle is within 2^(1/32) - 1 = 2.2% of any latency in it (plus 0.02 ms).
pub const PICKUP_BINS_PER_DOUBLING: i32 = 16;

/// How far back the first fold starts, and the furthest a fold catches up to: the charts' longest
/// window.
const FOLD_SPAN: &str = "1 day";

/// Most minutes one fold transaction covers, so that catching up on a busy day's history never
/// runs one statement into the timeout.
const FOLD_CHUNK_MINUTES: i32 = 15;

/// How far before the oldest open transaction's start the fold stops: a transaction's start
/// is stamped a moment before `pg_stat_activity` shows it.
const HORIZON_MARGIN: &str = "5 seconds";

/// The charts' counts per minute of the history in `[$1, $2)` (`$2` NULL: to its end), as
/// `task_throughput_minutes` holds them: the raw read's walk and counts
/// ([`history_sql`], [`TRANSITION_COUNTS`]), with the first claims' pickups in histograms.
fn minutes_sql() -> String {
    format!(
        "WITH e AS MATERIALIZED ({}),
         bins AS (
             SELECT minute, array_agg(bin ORDER BY bin) AS pickup_bins,
                    array_agg(n ORDER BY bin) AS pickup_counts
             FROM (SELECT bucket AS minute,
                          floor({PICKUP_BINS_PER_DOUBLING} * ln(1 + ms) / ln(2))::int AS bin,
                          count(*) AS n
                   FROM e WHERE ms IS NOT NULL GROUP BY 1, 2) b
             GROUP BY minute
         )
         SELECT c.minute, c.created, c.started, c.succeeded, c.failed,
                COALESCE(b.pickup_bins, '{{}}') AS pickup_bins,
                COALESCE(b.pickup_counts, '{{}}') AS pickup_counts
         FROM (SELECT bucket AS minute, {TRANSITION_COUNTS} FROM e GROUP BY bucket) c
         LEFT JOIN bins b USING (minute)",
        history_sql(MINUTE, FOLDED)
    )
}

/// A fold's bucket: the event's minute.
const MINUTE: &str = "date_trunc('minute', e.at)";
/// A fold's events: those in `[$1, $2)` (`$2` NULL: to the history's end).
const FOLDED: &str = "e.at >= $1 AND ($2::timestamptz IS NULL OR e.at < $2)";

/// Each queue's net moves per minute of the history in `[$1, $2)`, as `task_queue_minutes`
/// holds them.
fn queue_minutes_sql() -> String {
    format!(
        "SELECT bucket AS minute, queue, pending, running FROM ({}) moved",
        queue_moves_sql(MINUTE, FOLDED)
    )
}

#[derive(QueryableByName)]
struct Bounds {
    /// Where this fold starts: the last fold's end, or a day back.
    #[diesel(sql_type = Timestamptz)]
    start: DateTime<Utc>,
    /// The start of the minute of the oldest open transaction (or of now): nothing before it
    /// can change any more.
    #[diesel(sql_type = Timestamptz)]
    horizon: DateTime<Utc>,
}

/// What one fold did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fold {
    /// Minutes folded (with or without events).
    pub minutes: i64,
    /// More minutes wait: the fold stopped at its chunk, short of the horizon.
    pub more: bool,
}

/// Folds up to [`FOLD_CHUNK_MINUTES`] finished minutes of the history into the rollup, in one
/// transaction (see the module's comment for which minutes are finished). Run it until
/// [`Fold::more`] is false.
pub async fn fold_history(conn: &mut Db) -> Result<Fold> {
    let span = leasehold::db_span!("INSERT", "task_throughput_minutes");
    async move {
        conn.transaction(async |conn| {
            // The row lock keeps two folds (an old sweeper and its successor) from folding the
            // same minutes.
            diesel::sql_query("SELECT 1 FROM task_rollup FOR UPDATE")
                .execute(conn)
                .await?;
            let bounds: Bounds = diesel::sql_query(format!(
                "SELECT greatest(r.folded_through,
                                 date_trunc('minute', now() - interval '{FOLD_SPAN}')) AS start,
                        date_trunc('minute',
                            least(statement_timestamp(),
                                  (SELECT min(xact_start) FROM pg_stat_activity
                                   WHERE datname = current_database()
                                     AND pid <> pg_backend_pid()
                                     AND backend_type = 'client backend'))
                            - interval '{HORIZON_MARGIN}') AS horizon
                 FROM task_rollup r"
            ))
            .get_one(conn)
            .await?;
            if bounds.horizon <= bounds.start {
                return Ok(Fold {
                    minutes: 0,
                    more: false,
                });
            }
            let through = bounds
                .horizon
                .min(bounds.start + chrono::TimeDelta::minutes(i64::from(FOLD_CHUNK_MINUTES)));
            diesel::sql_query(format!(
                "INSERT INTO task_throughput_minutes (minute, created, started, succeeded,
                                                      failed, pickup_bins, pickup_counts)
                 {}",
                minutes_sql()
            ))
            .bind::<Timestamptz, _>(bounds.start)
            .bind::<Nullable<Timestamptz>, _>(Some(through))
            .execute(conn)
            .await?;
            diesel::sql_query(format!(
                "INSERT INTO task_queue_minutes (minute, queue, pending, running) {}",
                queue_minutes_sql()
            ))
            .bind::<Timestamptz, _>(bounds.start)
            .bind::<Nullable<Timestamptz>, _>(Some(through))
            .execute(conn)
            .await?;
            diesel::sql_query("UPDATE task_rollup SET folded_through = $1")
                .bind::<Timestamptz, _>(through)
                .execute(conn)
                .await?;
            Ok(Fold {
                minutes: (through - bounds.start).num_minutes(),
                more: through < bounds.horizon,
            })
        })
        .await
    }
    .instrument(span)
    .await
}

/// Deletes the rollup's minutes older than the retention age, as the history they count is.
pub async fn prune_rollup(conn: &mut Db, retention_seconds: i64) -> Result<usize> {
    let span = leasehold::db_span!("DELETE", "task_throughput_minutes");
    let counts = async {
        diesel::sql_query(
            "DELETE FROM task_throughput_minutes WHERE minute < now() - make_interval(secs => $1)",
        )
        .bind::<Double, _>(retention_seconds as f64)
        .execute(conn)
        .await
    }
    .instrument(span)
    .await?;
    let span = leasehold::db_span!("DELETE", "task_queue_minutes");
    let moves = async {
        diesel::sql_query(
            "DELETE FROM task_queue_minutes WHERE minute < now() - make_interval(secs => $1)",
        )
        .bind::<Double, _>(retention_seconds as f64)
        .execute(conn)
        .await
    }
    .instrument(span)
    .await?;
    Ok(counts + moves)
}

/// One minute's counts of the history, `minutes_ago` whole minutes before the current one
/// (0: the current minute, so far).
#[derive(Debug, Clone, QueryableByName)]
pub struct MinuteCounts {
    #[diesel(sql_type = BigInt)]
    pub minutes_ago: i64,
    #[diesel(sql_type = BigInt)]
    pub created: i64,
    #[diesel(sql_type = BigInt)]
    pub started: i64,
    #[diesel(sql_type = BigInt)]
    pub succeeded: i64,
    #[diesel(sql_type = BigInt)]
    pub failed: i64,
    /// The pickup histogram's bins (see [`PICKUP_BINS_PER_DOUBLING`]), ascending, and their
    /// counts.
    #[diesel(sql_type = Array<Integer>)]
    pub pickup_bins: Vec<i32>,
    #[diesel(sql_type = Array<BigInt>)]
    pub pickup_counts: Vec<i64>,
}

#[derive(QueryableByName)]
struct Window {
    /// The first minute of the window.
    #[diesel(sql_type = Timestamptz)]
    start: DateTime<Utc>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    folded_through: Option<DateTime<Utc>>,
}

/// The current minute and the `window_minutes - 1` before it, minute by minute: the folded
/// minutes from the rollup (at most one row each), the rest from the history; and with
/// `bucket_minutes`, each queue's moves per bucket of that many minutes, with its counts now
/// (as [`super::throughput`] gives them). One transaction, so the rollup and the history are
/// read at one `folded_through`, each statement bounded.
pub async fn throughput_minutes(
    conn: &mut Db,
    window_minutes: i32,
    bucket_minutes: i32,
) -> Result<(Vec<MinuteCounts>, Vec<QueueMoves>)> {
    conn.transaction(async |conn| {
        diesel::sql_query("SELECT set_config('statement_timeout', $1, true)")
            .bind::<Text, _>(THROUGHPUT_TIMEOUT)
            .execute(conn)
            .await?;
        let window: Window = diesel::sql_query(
            "SELECT date_trunc('minute', now()) - make_interval(mins => $1 - 1) AS start,
                    folded_through
             FROM task_rollup",
        )
        .bind::<Integer, _>(window_minutes)
        .get_one(conn)
        .await?;
        // The history from where the rollup stops (or the window starts, if later).
        let tail = window
            .folded_through
            .map_or(window.start, |folded| folded.max(window.start));
        let minutes_ago = "greatest(0, EXTRACT(EPOCH FROM date_trunc('minute', now()) - minute)
                                       / 60)::bigint";
        let span = leasehold::db_span!("SELECT", "task_throughput_minutes");
        let counts: Vec<MinuteCounts> = diesel::sql_query(format!(
            "SELECT {minutes_ago} AS minutes_ago, created, started, succeeded, failed,
                    pickup_bins, pickup_counts
             FROM task_throughput_minutes WHERE minute >= $3 AND minute < $4
             UNION ALL
             SELECT {minutes_ago}, created, started, succeeded, failed, pickup_bins,
                    pickup_counts
             FROM ({}) tail",
            minutes_sql()
        ))
        .bind::<Timestamptz, _>(tail)
        .bind::<Nullable<Timestamptz>, _>(None::<DateTime<Utc>>)
        .bind::<Timestamptz, _>(window.start)
        .bind::<Nullable<Timestamptz>, _>(window.folded_through)
        .load(conn)
        .instrument(span)
        .await?;
        let span = leasehold::db_span!("SELECT", "task_queue_minutes");
        let queue_minutes = queue_minutes_sql();
        let moves: Vec<QueueMoves> = diesel::sql_query(format!(
            "SELECT queue, (minutes_ago / $5 * $5 * 60)::bigint AS seconds_ago,
                    sum(pending)::bigint AS pending, sum(running)::bigint AS running
             FROM (SELECT queue, {minutes_ago} AS minutes_ago, pending, running
                   FROM task_queue_minutes WHERE minute >= $3 AND minute < $4
                   UNION ALL
                   SELECT queue, {minutes_ago}, pending, running FROM ({queue_minutes}) tail
                  ) m
             GROUP BY 1, 2
             UNION ALL
             SELECT queue, NULL, count(*) FILTER (WHERE status = 'pending'),
                    count(*) FILTER (WHERE status = 'running')
             FROM tasks WHERE status IN ('pending', 'running') GROUP BY queue"
        ))
        .bind::<Timestamptz, _>(tail)
        .bind::<Nullable<Timestamptz>, _>(None::<DateTime<Utc>>)
        .bind::<Timestamptz, _>(window.start)
        .bind::<Nullable<Timestamptz>, _>(window.folded_through)
        .bind::<BigInt, _>(i64::from(bucket_minutes))
        .load(conn)
        .instrument(span)
        .await?;
        Ok((counts, moves))
    })
    .await
}
