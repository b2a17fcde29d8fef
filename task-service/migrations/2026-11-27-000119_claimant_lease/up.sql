-- One lease per claimant, not per task. A worker process that announces itself holds a liveness
-- lease `worker:<id>` (task-service acquires and renews it at the process's beats). A claim that
-- names that lease hands its tasks out under it: no lease is taken per task, a heartbeat or a
-- completion proves the one lease (one read in lease-service for all the tasks of a group), and
-- revoking it, or its lapse, fences every task it covers. A claim that names none (the sample's
-- worker, any client that does not announce itself) takes a lease of the task's own,
-- `task:<id>`, as before.
--
-- `lease_resource` names the lease that covers the current claim, with `lease_fence` its fence;
-- NULL: the task's own lease.
ALTER TABLE tasks ADD COLUMN lease_resource TEXT;

-- The history names the lease of each transition (NULL: each task's own): a group is one
-- lease's tasks.
ALTER TABLE task_events ADD COLUMN lease_resource TEXT;

CREATE OR REPLACE VIEW task_transitions AS
SELECT e.id, u.ord, e.at, e.queue, u.task_id, e.from_status, e.to_status, e.processor,
       e.charged, u.fence, u.attempts, u.pickup_ms, u.lease_fence, e.lease_resource
FROM task_events e
CROSS JOIN LATERAL unnest(e.task_ids, e.fences, e.attempts, e.pickup_ms, e.lease_fences)
    WITH ORDINALITY AS u(task_id, fence, attempts, pickup_ms, lease_fence, ord);
