-- At most this many of the queue's tasks run at once (NULL: no limit). Claims of a limited
-- queue lock its row here first, so two claims, on any replicas, judge the room left one after
-- the other, each counting the other's claims once they commit. Only limited queues pay for
-- the lock.
ALTER TABLE queues ADD COLUMN concurrency_limit INTEGER CHECK (concurrency_limit >= 0);

-- A task of a limited queue that stops running frees a slot: wake one claim waiting for that
-- queue, as a new task would, instead of leaving it to its re-check. Unlimited queues pay one
-- primary-key probe per finished task.
CREATE FUNCTION tasks_notify_slot_freed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM queues
                WHERE queue = NEW.queue AND concurrency_limit IS NOT NULL) THEN
        PERFORM pg_notify('leasehold_tasks', json_build_array(json_build_object(
            'key', NEW.queue, 'count', 1, 'dueInMs', 0))::text);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER tasks_notify_slot_freed AFTER UPDATE OF status ON tasks
    FOR EACH ROW WHEN (OLD.status = 'running' AND NEW.status <> 'running')
    EXECUTE FUNCTION tasks_notify_slot_freed();

-- Raising a limit (or lifting it) makes room at once: wake the queue's waiting claims.
CREATE FUNCTION queues_notify_room() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('leasehold_tasks', json_build_array(json_build_object(
        'key', NEW.queue,
        'count', coalesce(NEW.concurrency_limit - coalesce(OLD.concurrency_limit, 0), 10000),
        'dueInMs', 0))::text);
    RETURN NULL;
END $$;

CREATE TRIGGER queues_room AFTER UPDATE OF concurrency_limit ON queues
    FOR EACH ROW WHEN (OLD.concurrency_limit IS NOT NULL
                       AND (NEW.concurrency_limit IS NULL
                            OR NEW.concurrency_limit > OLD.concurrency_limit))
    EXECUTE FUNCTION queues_notify_room();
