-- One history row per group transition, whoever the group's claimants are. Until now a row was
-- written per claimant (processor and covering lease) of each group that moved alike: a claim
-- group of sixteen single claims, one per worker, wrote sixteen rows (each with its two index
-- entries and its GIN entries) where one would do, and single claims wrote about two history
-- rows per task. Now a row names its distinct claimants once, in `claimants` with each one's
-- covering lease at the same place in `claimant_leases` (NULL there: the task's own lease;
-- the column NULL when every one is), and gives each task's claimant by its place, in
-- `claimant_of` (1-based; NULL when the row has one claimant, or none: `claimants` NULL, as a
-- create's row). A batch for one worker writes the row it wrote before, with one array of one
-- name where it had a text.
--
-- `task_transitions` still answers one row per task and transition with its processor and
-- covering lease, so the invariant checker, the charts and the soak read what they read.
ALTER TABLE task_events
    ADD COLUMN claimants TEXT[],
    ADD COLUMN claimant_leases TEXT[],
    ADD COLUMN claimant_of INTEGER[];

UPDATE task_events
SET claimants = ARRAY[processor],
    claimant_leases = CASE WHEN lease_resource IS NOT NULL THEN ARRAY[lease_resource] END
WHERE processor IS NOT NULL OR lease_resource IS NOT NULL;

ALTER TABLE task_events ADD CONSTRAINT task_events_claimants_align CHECK (
    (claimant_leases IS NULL OR cardinality(claimant_leases) = cardinality(claimants))
    AND (claimant_of IS NULL
         OR (cardinality(claimant_of) = cardinality(task_ids) AND claimants IS NOT NULL)));

DROP VIEW task_transitions;
ALTER TABLE task_events DROP COLUMN processor, DROP COLUMN lease_resource;

CREATE VIEW task_transitions AS
SELECT e.id, u.ord, e.at, e.queue, u.task_id, e.from_status, e.to_status,
       e.claimants[coalesce(u.claimant, 1)] AS processor,
       e.charged, u.fence, u.attempts, u.pickup_ms, u.lease_fence,
       e.claimant_leases[coalesce(u.claimant, 1)] AS lease_resource
FROM task_events e
CROSS JOIN LATERAL unnest(e.task_ids, e.fences, e.attempts, e.pickup_ms, e.lease_fences,
                          e.claimant_of)
    WITH ORDINALITY AS u(task_id, fence, attempts, pickup_ms, lease_fence, claimant, ord);
