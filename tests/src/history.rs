//! Synthetic task history, written straight into task-service's tables: finished tasks spread
//! over a past span with the events their lives would have recorded (create, claim, and a
//! completion; one in ten fails once, is claimed again and completes), at the speed of one
//! `INSERT ... SELECT FROM generate_series`, for the dashboard's charts to read.

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

/// Events each synthetic task records on average: 3, or 5 for the one in ten that fails once.
pub const EVENTS_PER_TASK: f64 = 3.2;

/// Writes `tasks` finished tasks into queues `synthetic-0` to `synthetic-6`, created at random
/// over the `span` (a PostgreSQL interval, such as `1 day`) that ends `until` (another interval)
/// before now, with their history (one row per task and transition), carrying the past times
/// given here. The session replicates, so no notification trigger fires for the insert. Returns the events written.
pub async fn synthesize_history(database_url: &str, tasks: u64, span: &str, until: &str) -> u64 {
    let mut conn = AsyncPgConnection::establish(database_url).await.unwrap();
    diesel::sql_query("SET session_replication_role = replica")
        .execute(&mut conn)
        .await
        .unwrap();
    // Pickup up to 5 s, most of them short; a run up to 2 s.
    let written = diesel::sql_query(format!(
        "WITH made AS (
             INSERT INTO tasks (task_data, queue, status, max_attempts, attempts, processor,
                                fence, created_at, requested_scheduled_at, scheduled_at,
                                started_at, processed_at, updated_at, task_output)
             SELECT '{{}}', 'synthetic-' || (g % 7), 'succeeded', 3,
                    CASE WHEN g % 10 = 0 THEN 2 ELSE 1 END, 'synthetic', g, at0, at0, at0,
                    at0, at0, at0, '{{}}'
             FROM (SELECT g, now() - interval '{until}' - random() * interval '{span}' AS at0
                   FROM generate_series(1, {tasks}) g) s
             RETURNING id, queue, created_at AS at0, attempts
         )
         INSERT INTO task_events (at, queue, from_status, to_status, claimants, charged,
                                  task_ids, fences, attempts, pickup_ms)
         SELECT at0 + ev.after, queue, ev.from_status, ev.to_status,
                CASE WHEN ev.processor IS NOT NULL THEN ARRAY[ev.processor] END, ev.charged,
                ARRAY[id], ARRAY[ev.fence], ARRAY[ev.attempts],
                CASE WHEN ev.first THEN ARRAY[EXTRACT(EPOCH FROM pickup) * 1000] END
         FROM (SELECT id, queue, at0, attempts,
                      make_interval(secs => 5 * random() ^ 3) AS pickup,
                      make_interval(secs => 2 * random()) AS run
               FROM made) m
         CROSS JOIN LATERAL (VALUES
             (interval '0', NULL, 'pending', NULL, NULL::bigint, 0, true, false, true),
             (pickup, 'pending', 'running', 'synthetic', 1, 1, true, true, true),
             (pickup + run, 'running', 'succeeded', 'synthetic', 1, 1, true, false,
              m.attempts = 1),
             (pickup + run, 'running', 'pending', 'synthetic', 1, 1, true, false, m.attempts = 2),
             (pickup + 2 * run, 'pending', 'running', 'synthetic', 2, 2, true, false,
              m.attempts = 2),
             (pickup + 3 * run, 'running', 'succeeded', 'synthetic', 2, 2, true, false,
              m.attempts = 2)
         ) ev(after, from_status, to_status, processor, fence, attempts, charged, first,
              happened)
         WHERE ev.happened
         ORDER BY id, ev.after"
    ))
    .execute(&mut conn)
    .await
    .unwrap();
    u64::try_from(written).unwrap()
}
