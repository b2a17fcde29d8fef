-- An append-only history of every task transition (a change of status, owner or fence), written
-- by a trigger in the same transaction, so a checker can prove that no task was completed twice
-- or by a worker whose claim had been superseded. `at` is the statement's `now()`.
CREATE TABLE task_events (
    id          BIGSERIAL   PRIMARY KEY,
    at          TIMESTAMPTZ NOT NULL,
    task_id     BIGINT      NOT NULL,
    from_status TEXT,
    to_status   TEXT        NOT NULL,
    processor   TEXT,
    fence       BIGINT,
    attempts    INTEGER     NOT NULL
);
CREATE INDEX task_events_task_idx ON task_events (task_id, id);

CREATE FUNCTION record_task_event() RETURNS trigger LANGUAGE plpgsql AS $$
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

CREATE TRIGGER tasks_history AFTER INSERT OR UPDATE ON tasks
    FOR EACH ROW EXECUTE FUNCTION record_task_event();
