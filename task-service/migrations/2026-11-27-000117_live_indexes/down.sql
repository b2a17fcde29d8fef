DROP INDEX tasks_running_idx;
CREATE INDEX tasks_running_by_key_idx ON tasks (queue, concurrency_key)
    WHERE status = 'running' AND concurrency_key IS NOT NULL;
DROP INDEX tasks_queue_status_idx;
CREATE INDEX tasks_queue_status_idx ON tasks (queue, status);
DROP INDEX tasks_status_id_idx;
CREATE INDEX tasks_status_id_idx ON tasks (status, id);
DROP INDEX tasks_idempotency_key_unique;
ALTER TABLE tasks ADD CONSTRAINT tasks_idempotency_key_unique UNIQUE (idempotency_key);
