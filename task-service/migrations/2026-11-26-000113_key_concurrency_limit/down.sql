CREATE OR REPLACE FUNCTION record_task_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT'
       OR NEW.status IS DISTINCT FROM OLD.status
       OR NEW.fence IS DISTINCT FROM OLD.fence
       OR NEW.processor IS DISTINCT FROM OLD.processor THEN
        INSERT INTO task_events (at, task_id, from_status, to_status, processor, fence, attempts)
        VALUES (now(), NEW.id, CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END, NEW.status,
                NEW.processor, NEW.fence, NEW.attempts);
    END IF;
    RETURN NEW;
END;
$$;
DROP TRIGGER queues_rate_raised ON queues;
DROP TRIGGER queues_key_room ON queues;
DROP FUNCTION queues_notify_raised();
CREATE OR REPLACE FUNCTION tasks_notify_slot_freed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM queues
                WHERE queue = NEW.queue AND concurrency_limit IS NOT NULL) THEN
        PERFORM pg_notify('leasehold_tasks', json_build_array(json_build_object(
            'key', NEW.queue, 'count', 1, 'dueInMs', 0))::text);
    END IF;
    RETURN NULL;
END $$;
DROP INDEX tasks_running_by_key_idx;
DROP INDEX tasks_due_by_key_idx;
ALTER TABLE queues DROP COLUMN key_cursor, DROP COLUMN key_concurrency_limit;
ALTER TABLE schedules DROP COLUMN concurrency_key;
ALTER TABLE tasks DROP COLUMN concurrency_key;
