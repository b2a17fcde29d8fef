-- Wake-ups: task-service LISTENs on `leasehold_tasks`, and claims waiting for work (`wait_ms`)
-- are woken when tasks become pending, instead of polling. A notification names, per queue, how
-- many tasks became pending and in how many milliseconds (by this database's clock) the
-- earliest of them is due, so the listener wakes that many waiters, now or by a timer.
--
-- An insert notifies once per statement (a bulk insert is one notification). An update notifies
-- only for rows it makes pending (a retry, a requeue): the row trigger's WHEN skips heartbeats,
-- claims and completions without calling anything. pg_notify is transactional: a rolled-back
-- insert wakes nobody, and waiters are woken only once the rows are visible to them.
CREATE FUNCTION tasks_notify_pending() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    payload text;
BEGIN
    SELECT json_agg(json_build_object(
               'key', queue,
               'count', n,
               'dueInMs', due_in_ms))::text
      INTO payload
      FROM (SELECT queue, count(*) AS n,
                   greatest(0, ceil(extract(epoch FROM min(scheduled_at) - now()) * 1000))::bigint
                       AS due_in_ms
              FROM pending_rows WHERE status = 'pending' GROUP BY queue) per_queue;
    IF payload IS NOT NULL THEN
        -- A notification carries at most 8000 bytes; `null` asks every waiter to look.
        IF octet_length(payload) > 7900 THEN
            payload := 'null';
        END IF;
        PERFORM pg_notify('leasehold_tasks', payload);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER tasks_notify_insert AFTER INSERT ON tasks
    REFERENCING NEW TABLE AS pending_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tasks_notify_pending();

CREATE FUNCTION tasks_notify_repending() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('leasehold_tasks', json_build_array(json_build_object(
        'key', NEW.queue,
        'count', 1,
        'dueInMs', greatest(0, ceil(extract(epoch FROM NEW.scheduled_at - now()) * 1000))::bigint
    ))::text);
    RETURN NULL;
END $$;

CREATE TRIGGER tasks_notify_update AFTER UPDATE OF status, scheduled_at ON tasks
    FOR EACH ROW WHEN (NEW.status = 'pending')
    EXECUTE FUNCTION tasks_notify_repending();
