-- A task's fence is its own claim counter: every claim of the task, whoever makes it and under
-- whichever lease, sets it one above the last, so it rises strictly with every claim of that
-- task. Until now it was the fence of the task's own lease (`task:<id>`), which rose the same way
-- only because every claim took a lease of that one resource; a claim covered by a lease shared
-- by many tasks (a worker process's) has no per-task lease fence to record. The fence of the
-- lease that covers the claim is kept apart, in `lease_fence`, for the calls that renew, release
-- or check that lease.
--
-- Fences already handed out keep their values (a running task's worker presents it), and the
-- next claim of any task counts on from its last fence, so none repeats.
ALTER TABLE tasks ADD COLUMN lease_fence BIGINT;
UPDATE tasks SET lease_fence = fence WHERE status = 'running';

-- The history records the claim's lease fence beside the task's, for the invariant checker to
-- judge each completion against its lease's term.
ALTER TABLE task_events ADD COLUMN lease_fences BIGINT[];
UPDATE task_events SET lease_fences = fences WHERE to_status <> 'pending' OR from_status IS NOT NULL;
ALTER TABLE task_events ADD CONSTRAINT task_events_lease_fences_align
    CHECK (lease_fences IS NULL OR cardinality(lease_fences) = cardinality(task_ids));

CREATE OR REPLACE VIEW task_transitions AS
SELECT e.id, u.ord, e.at, e.queue, u.task_id, e.from_status, e.to_status, e.processor,
       e.charged, u.fence, u.attempts, u.pickup_ms, u.lease_fence
FROM task_events e
CROSS JOIN LATERAL unnest(e.task_ids, e.fences, e.attempts, e.pickup_ms, e.lease_fences)
    WITH ORDINALITY AS u(task_id, fence, attempts, pickup_ms, lease_fence, ord);
