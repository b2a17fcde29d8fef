-- History per group transition. Until now a row trigger wrote one `task_events` row per task per
-- transition, in the plpgsql call of every UPDATE of a task (heartbeats included, to find that
-- nothing moved). Now the statement that makes a transition writes its history itself, one row
-- per group of tasks that moved alike (same moment, queue, from and to status, processor): a
-- claim of 100 tasks for one worker is one row, not 100, and a heartbeat costs the history
-- nothing. The peers (graphile-worker, River, Oban) dropped their job-table triggers for the
-- same cost.
--
-- A row names its tasks in `task_ids`, with each task's fence and attempts after the transition
-- at the same place in `fences` and `attempts`. What the charts used to derive by looking up each
-- task's previous event is recorded when it is known, by the transition itself:
--   * `charged`: a return from running to pending charged the attempt (a failure), or handed it
--     back (a snooze, or a prefetched task returned);
--   * `pickup_ms`: a claim's wait, for each task claimed for the first time, from when it was due
--     (created, or its requested schedule if later) to the claim; NULL for the others.
-- `task_transitions` unnests the rows into one per task and transition, the shape the invariant
-- checker and the per-task history read.
DROP TRIGGER tasks_history ON tasks;
DROP FUNCTION record_task_event();

ALTER TABLE task_events RENAME TO task_events_v1;
ALTER INDEX task_events_pkey RENAME TO task_events_v1_pkey;
ALTER INDEX task_events_task_idx RENAME TO task_events_v1_task_idx;
ALTER INDEX task_events_at_idx RENAME TO task_events_v1_at_idx;
ALTER SEQUENCE task_events_id_seq RENAME TO task_events_v1_id_seq;

CREATE TABLE task_events (
    id          BIGSERIAL   PRIMARY KEY,
    at          TIMESTAMPTZ NOT NULL,
    -- NULL only for events recorded before this shape whose task was already gone.
    queue       TEXT,
    from_status TEXT,
    to_status   TEXT        NOT NULL,
    processor   TEXT,
    charged     BOOLEAN     NOT NULL DEFAULT true,
    task_ids    BIGINT[]    NOT NULL,
    fences      BIGINT[]    NOT NULL,
    attempts    INTEGER[]   NOT NULL,
    pickup_ms   FLOAT8[],
    CONSTRAINT task_events_arrays_align CHECK (
        cardinality(task_ids) > 0
        AND cardinality(fences) = cardinality(task_ids)
        AND cardinality(attempts) = cardinality(task_ids)
        AND (pickup_ms IS NULL OR cardinality(pickup_ms) = cardinality(task_ids)))
);

-- The existing history, one row per old event, with what the charts derived from the previous
-- event recorded as the new rows record it.
INSERT INTO task_events (at, queue, from_status, to_status, processor, charged, task_ids, fences,
                         attempts, pickup_ms)
SELECT e.at, t.queue, e.from_status, e.to_status, e.processor,
       CASE WHEN e.from_status = 'running' AND e.to_status = 'pending'
            THEN coalesce(e.attempts >= prev.attempts, false) ELSE true END,
       ARRAY[e.task_id], ARRAY[e.fence], ARRAY[e.attempts],
       CASE WHEN e.to_status = 'running' AND prev.from_status IS NULL AND prev.at IS NOT NULL
                 AND t.id IS NOT NULL
            THEN ARRAY[greatest(0, EXTRACT(EPOCH FROM e.at - greatest(prev.at,
                     coalesce(t.requested_scheduled_at, prev.at))) * 1000)::float8] END
FROM task_events_v1 e
LEFT JOIN tasks t ON t.id = e.task_id
LEFT JOIN LATERAL (
    SELECT b.at, b.from_status, b.attempts FROM task_events_v1 b
    WHERE b.task_id = e.task_id AND b.id < e.id
    ORDER BY b.id DESC LIMIT 1
) prev ON true
ORDER BY e.id;

DROP TABLE task_events_v1;

-- The charts, the rollup's fold and retention read by time.
CREATE INDEX task_events_at_idx ON task_events (at);
-- A task's own history (its detail view): the rows that name it. `fastupdate` off: an insert
-- writes its entries at once, so no claim ever pays for merging a pending list.
CREATE INDEX task_events_task_ids_idx ON task_events USING gin (task_ids) WITH (fastupdate = off);

CREATE VIEW task_transitions AS
SELECT e.id, u.ord, e.at, e.queue, u.task_id, e.from_status, e.to_status, e.processor,
       e.charged, u.fence, u.attempts, u.pickup_ms
FROM task_events e
CROSS JOIN LATERAL unnest(e.task_ids, e.fences, e.attempts, e.pickup_ms)
    WITH ORDINALITY AS u(task_id, fence, attempts, pickup_ms, ord);
