-- A task's history is found through one btree entry per history row, not a GIN entry per task
-- the row names. The GIN index over `task_ids` took an entry for every task of every row: three
-- per task (create, claim, completion), 301 of the 2,600 WAL bytes a task wrote in the bench's
-- batched run (2026-12-07, "where the WAL goes" by table and index), each insert with its CPU.
--
-- Now a row names tasks of one band of 256 consecutive ids only: a group transition writes a
-- row for each band its tasks fall in (a claim of 32 consecutive tasks writes one row, or two
-- where it crosses a band's end), with its ids in order. A task's rows are then those whose
-- first id lies between the start of the task's band and the task's own id, which a btree over
-- the first id finds; the array's containment picks, among those, the rows that name it. A band
-- holds at most 256 tasks, so a lookup reads at most the rows of 256 tasks' histories.
--
-- Rows already written may span bands: each is cut into one row per band, and every row is
-- renumbered id * 2^20 + its cut's place, so that a task's history keeps its order (by id)
-- across the cut rows and the rows after them. Ids later drawn come after them all.
INSERT INTO task_events (id, at, queue, from_status, to_status, charged, claimants,
                         claimant_leases, claimant_of, task_ids, fences, attempts, lease_fences,
                         pickup_ms)
SELECT id, at, queue, from_status, to_status, charged, claimants, claimant_leases, claimant_of,
       task_ids, fences, attempts, lease_fences, pickup_ms
FROM (
    SELECT -(e.id * 1048576
             + dense_rank() OVER (PARTITION BY e.id ORDER BY u.task_id / 256) - 1) AS id,
           e.at, e.queue, e.from_status, e.to_status, e.charged, e.claimants,
           e.claimant_leases,
           CASE WHEN e.claimant_of IS NOT NULL THEN array_agg(u.claimant) OVER w END
               AS claimant_of,
           array_agg(u.task_id) OVER w AS task_ids, array_agg(u.fence) OVER w AS fences,
           array_agg(u.attempts) OVER w AS attempts,
           CASE WHEN e.lease_fences IS NOT NULL THEN array_agg(u.lease_fence) OVER w END
               AS lease_fences,
           CASE WHEN e.pickup_ms IS NOT NULL THEN array_agg(u.pickup_ms) OVER w END
               AS pickup_ms,
           -- The window gives every task of a cut the cut's arrays; the first one's row is kept.
           row_number() OVER w AS place
    FROM task_events e
    CROSS JOIN LATERAL unnest(e.task_ids, e.fences, e.attempts, e.pickup_ms, e.lease_fences,
                              e.claimant_of)
        AS u(task_id, fence, attempts, pickup_ms, lease_fence, claimant)
    WINDOW w AS (PARTITION BY e.id, u.task_id / 256 ORDER BY u.task_id
                 ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
) cut
WHERE place = 1;
DELETE FROM task_events WHERE id > 0;
UPDATE task_events SET id = -id;
SELECT setval('task_events_id_seq', coalesce((SELECT max(id) FROM task_events), 0) + 1, false);

ALTER TABLE task_events ADD CONSTRAINT task_events_one_band CHECK (
    task_ids[1] / 256 = task_ids[cardinality(task_ids)] / 256);

DROP INDEX task_events_task_ids_idx;
CREATE INDEX task_events_first_task_idx ON task_events ((task_ids[1]));
