-- What operators set on a queue: for now whether it is paused. A queue without a row runs;
-- tasks never create rows, the first pause does. Claims skip a paused queue's tasks (due and
-- lapsed alike); its running tasks finish and creates still succeed.
CREATE TABLE queues (
    queue      TEXT        PRIMARY KEY,
    paused     BOOLEAN     NOT NULL DEFAULT false,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- A resume makes the queue's due tasks claimable again without any task changing, so it wakes
-- as many waiting claims as there are such tasks (counted up to a bound far above any number of
-- waiters), once the resume commits.
CREATE FUNCTION queues_notify_resume() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    claimable bigint;
BEGIN
    SELECT count(*) INTO claimable FROM (
        SELECT 1 FROM tasks
         WHERE queue = NEW.queue
           AND ((status = 'pending' AND scheduled_at <= now())
                OR (status = 'running' AND must_heartbeat_before <= now()))
         LIMIT 10000) due;
    IF claimable > 0 THEN
        PERFORM pg_notify('leasehold_tasks', json_build_array(json_build_object(
            'key', NEW.queue, 'count', claimable, 'dueInMs', 0))::text);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER queues_resume AFTER UPDATE OF paused ON queues
    FOR EACH ROW WHEN (OLD.paused AND NOT NEW.paused)
    EXECUTE FUNCTION queues_notify_resume();
