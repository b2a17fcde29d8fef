-- A concurrency limit per key: a task may carry a `concurrency_key` (a tenant, a customer, an
-- account), and a queue's `key_concurrency_limit` lets at most that many of one key's tasks run
-- at once. Tasks without a key are held only by the queue's own limits.
ALTER TABLE tasks ADD COLUMN concurrency_key TEXT;
-- A schedule gives its tasks a key too.
ALTER TABLE schedules ADD COLUMN concurrency_key TEXT;
ALTER TABLE queues
    ADD COLUMN key_concurrency_limit INTEGER CHECK (key_concurrency_limit >= 0),
    -- The key a claim of the queue last served: the next claim starts after it, so claims go
    -- round the keys in turn and no key's backlog keeps another key's tasks waiting.
    ADD COLUMN key_cursor TEXT;

-- A claim of a key-limited queue walks the keys with due tasks one index probe each (a loose
-- index scan), then takes each key's first tasks in claim order. Every pending task is in it,
-- those without a key too (a probe for them is then one `IS NULL` descent, not a walk past every
-- keyed task of the queue).
CREATE INDEX tasks_due_by_key_idx ON tasks (queue, concurrency_key, priority DESC, scheduled_at, id)
    WHERE status = 'pending';
-- Each key's running tasks, counted under the queue's lock.
CREATE INDEX tasks_running_by_key_idx ON tasks (queue, concurrency_key)
    WHERE status = 'running' AND concurrency_key IS NOT NULL;

-- A task that stops running frees its key's slot as well as its queue's: wake a waiting claim
-- for key-limited queues too.
CREATE OR REPLACE FUNCTION tasks_notify_slot_freed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM queues
                WHERE queue = NEW.queue
                  AND (concurrency_limit IS NOT NULL OR key_concurrency_limit IS NOT NULL)) THEN
        PERFORM pg_notify('leasehold_tasks', json_build_array(json_build_object(
            'key', NEW.queue, 'count', 1, 'dueInMs', 0))::text);
    END IF;
    RETURN NULL;
END $$;

-- Raising a key limit or a rate (or lifting either) makes room at once: wake the queue's
-- waiting claims, instead of leaving them to their re-check or to a token's timer set for the
-- old rate.
CREATE FUNCTION queues_notify_raised() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('leasehold_tasks', json_build_array(json_build_object(
        'key', NEW.queue, 'count', 10000, 'dueInMs', 0))::text);
    RETURN NULL;
END $$;

CREATE TRIGGER queues_key_room AFTER UPDATE OF key_concurrency_limit ON queues
    FOR EACH ROW WHEN (OLD.key_concurrency_limit IS NOT NULL
                       AND (NEW.key_concurrency_limit IS NULL
                            OR NEW.key_concurrency_limit > OLD.key_concurrency_limit))
    EXECUTE FUNCTION queues_notify_raised();

CREATE TRIGGER queues_rate_raised AFTER UPDATE OF rate_per_second, rate_burst ON queues
    FOR EACH ROW WHEN (OLD.rate_per_second IS NOT NULL
                       AND (NEW.rate_per_second IS NULL
                            OR NEW.rate_per_second > OLD.rate_per_second
                            OR NEW.rate_burst > OLD.rate_burst))
    EXECUTE FUNCTION queues_notify_raised();

-- A claim's event is recorded at the task's start. That is the claim's `now()`, except for
-- rate-limited queues, whose claims record the moment they read the bucket (after the queue's
-- lock was granted, so later than `now()`): the history then shows the times the bucket was
-- spent at, and the invariant checker judges the rate by them.
CREATE OR REPLACE FUNCTION record_task_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT'
       OR NEW.status IS DISTINCT FROM OLD.status
       OR NEW.fence IS DISTINCT FROM OLD.fence
       OR NEW.processor IS DISTINCT FROM OLD.processor THEN
        INSERT INTO task_events (at, task_id, from_status, to_status, processor, fence, attempts)
        VALUES (CASE WHEN NEW.status = 'running' THEN greatest(now(), NEW.started_at)
                     ELSE now() END,
                NEW.id, CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END, NEW.status,
                NEW.processor, NEW.fence, NEW.attempts);
    END IF;
    RETURN NEW;
END;
$$;
