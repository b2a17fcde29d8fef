DROP VIEW task_transitions;
ALTER TABLE task_events RENAME TO task_events_v2;
ALTER INDEX task_events_pkey RENAME TO task_events_v2_pkey;
ALTER INDEX task_events_at_idx RENAME TO task_events_v2_at_idx;
ALTER SEQUENCE task_events_id_seq RENAME TO task_events_v2_id_seq;

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
INSERT INTO task_events (at, task_id, from_status, to_status, processor, fence, attempts)
SELECT e.at, u.task_id, e.from_status, e.to_status, e.processor, u.fence, u.attempts
FROM task_events_v2 e
CROSS JOIN LATERAL unnest(e.task_ids, e.fences, e.attempts) WITH ORDINALITY AS u(task_id, fence, attempts, ord)
ORDER BY e.id, u.ord;
DROP TABLE task_events_v2;
CREATE INDEX task_events_task_idx ON task_events (task_id, id);
CREATE INDEX task_events_at_idx ON task_events (at);

CREATE FUNCTION record_task_event() RETURNS trigger LANGUAGE plpgsql AS $$
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
CREATE TRIGGER tasks_history AFTER INSERT OR UPDATE ON tasks
    FOR EACH ROW EXECUTE FUNCTION record_task_event();
