DROP VIEW task_transitions;
CREATE VIEW task_transitions AS
SELECT e.id, u.ord, e.at, e.queue, u.task_id, e.from_status, e.to_status, e.processor,
       e.charged, u.fence, u.attempts, u.pickup_ms, u.lease_fence
FROM task_events e
CROSS JOIN LATERAL unnest(e.task_ids, e.fences, e.attempts, e.pickup_ms, e.lease_fences)
    WITH ORDINALITY AS u(task_id, fence, attempts, pickup_ms, lease_fence, ord);
ALTER TABLE task_events DROP COLUMN lease_resource;
ALTER TABLE tasks DROP COLUMN lease_resource;
