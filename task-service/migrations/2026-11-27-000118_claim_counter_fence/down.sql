DROP VIEW task_transitions;
CREATE VIEW task_transitions AS
SELECT e.id, u.ord, e.at, e.queue, u.task_id, e.from_status, e.to_status, e.processor,
       e.charged, u.fence, u.attempts, u.pickup_ms
FROM task_events e
CROSS JOIN LATERAL unnest(e.task_ids, e.fences, e.attempts, e.pickup_ms)
    WITH ORDINALITY AS u(task_id, fence, attempts, pickup_ms, ord);
ALTER TABLE task_events DROP CONSTRAINT task_events_lease_fences_align;
ALTER TABLE task_events DROP COLUMN lease_fences;
UPDATE tasks SET fence = lease_fence WHERE status = 'running';
ALTER TABLE tasks DROP COLUMN lease_fence;
