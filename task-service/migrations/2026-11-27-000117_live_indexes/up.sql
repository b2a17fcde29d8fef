-- A claim writes only what is live. Moving a task to running is never a HOT update (its status
-- is in the partial indexes' predicates), so every index whose predicate holds for the new row
-- version gets an entry. Until now the running version went into five indexes, and every version
-- into three that held all rows. Now:
--   * the idempotency key's unique index holds only tasks that have a key (a task without one
--     wrote a NULL entry three times);
--   * the listings' (status, id) and the counts' (queue, status) hold pending and finished tasks,
--     not running ones: the running tasks are few (at most the workers' slots), and a listing or
--     count of them reads them through the running indexes below;
--   * the running tasks of a queue, with or without a key, are in one index, which the limits'
--     counts read.
-- A keyless task's life (create, claim, completion) writes 13 index entries where it wrote 17,
-- and the claim writes 3 (primary key, lapsed, running) where it wrote 5. One table stays: a
-- table per state (Solid Queue) pays an insert and a delete per move, and a table of finished
-- tasks apart (two tables) writes the same entries plus a second heap row and a delete.
ALTER TABLE tasks DROP CONSTRAINT tasks_idempotency_key_unique;
CREATE UNIQUE INDEX tasks_idempotency_key_unique ON tasks (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

DROP INDEX tasks_status_id_idx;
CREATE INDEX tasks_status_id_idx ON tasks (status, id) WHERE status <> 'running';
DROP INDEX tasks_queue_status_idx;
CREATE INDEX tasks_queue_status_idx ON tasks (queue, status) WHERE status <> 'running';

DROP INDEX tasks_running_by_key_idx;
CREATE INDEX tasks_running_idx ON tasks (queue, concurrency_key) WHERE status = 'running';
