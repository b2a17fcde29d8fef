-- Back to a row per claimant: a row naming several claimants becomes one row per claimant
-- (its tasks in the order they had), after the rows that were there.
DROP VIEW task_transitions;
ALTER TABLE task_events ADD COLUMN processor TEXT, ADD COLUMN lease_resource TEXT;

INSERT INTO task_events (at, queue, from_status, to_status, processor, charged, lease_resource,
                         task_ids, fences, attempts, lease_fences, pickup_ms)
SELECT e.at, e.queue, e.from_status, e.to_status, e.claimants[u.claimant], e.charged,
       e.claimant_leases[u.claimant], array_agg(u.task_id ORDER BY u.ord),
       array_agg(u.fence ORDER BY u.ord), array_agg(u.attempts ORDER BY u.ord),
       CASE WHEN e.lease_fences IS NOT NULL THEN array_agg(u.lease_fence ORDER BY u.ord) END,
       CASE WHEN e.pickup_ms IS NOT NULL THEN array_agg(u.pickup_ms ORDER BY u.ord) END
FROM task_events e
CROSS JOIN LATERAL unnest(e.task_ids, e.fences, e.attempts, e.pickup_ms, e.lease_fences,
                          e.claimant_of)
    WITH ORDINALITY AS u(task_id, fence, attempts, pickup_ms, lease_fence, claimant, ord)
WHERE e.claimant_of IS NOT NULL
GROUP BY e.id, u.claimant
ORDER BY e.id, u.claimant;
DELETE FROM task_events WHERE claimant_of IS NOT NULL;
UPDATE task_events SET processor = claimants[1], lease_resource = claimant_leases[1]
WHERE processor IS NULL AND claimants IS NOT NULL;

ALTER TABLE task_events DROP CONSTRAINT task_events_claimants_align;
ALTER TABLE task_events
    DROP COLUMN claimants, DROP COLUMN claimant_leases, DROP COLUMN claimant_of;

CREATE VIEW task_transitions AS
SELECT e.id, u.ord, e.at, e.queue, u.task_id, e.from_status, e.to_status, e.processor,
       e.charged, u.fence, u.attempts, u.pickup_ms, u.lease_fence, e.lease_resource
FROM task_events e
CROSS JOIN LATERAL unnest(e.task_ids, e.fences, e.attempts, e.pickup_ms, e.lease_fences)
    WITH ORDINALITY AS u(task_id, fence, attempts, pickup_ms, lease_fence, ord);
