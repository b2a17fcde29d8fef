-- An append-only history of every lease change, written by a trigger in the same transaction
-- as the change, so an invariant checker can prove from it that no two holders' lease intervals
-- overlapped and that fences only rose. `at` is the changing statement's `now()`: the time the
-- change took effect by the database's clock.
CREATE TABLE lease_events (
    id          BIGSERIAL   PRIMARY KEY,
    at          TIMESTAMPTZ NOT NULL,
    kind        TEXT        NOT NULL,
    resource    TEXT        NOT NULL,
    holder      TEXT        NOT NULL,
    fence       BIGINT      NOT NULL,
    expires_at  TIMESTAMPTZ NOT NULL,
    released_at TIMESTAMPTZ
);
CREATE INDEX lease_events_resource_idx ON lease_events (resource, id);

CREATE FUNCTION record_lease_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.fence <> OLD.fence THEN
        INSERT INTO lease_events (at, kind, resource, holder, fence, expires_at, released_at)
        VALUES (now(), 'acquired', NEW.resource, NEW.holder, NEW.fence, NEW.expires_at, NEW.released_at);
    ELSIF NEW.released_at IS NOT NULL AND OLD.released_at IS NULL THEN
        INSERT INTO lease_events (at, kind, resource, holder, fence, expires_at, released_at)
        VALUES (now(), 'released', NEW.resource, NEW.holder, NEW.fence, NEW.expires_at, NEW.released_at);
    ELSIF NEW.expires_at <> OLD.expires_at THEN
        INSERT INTO lease_events (at, kind, resource, holder, fence, expires_at, released_at)
        VALUES (now(), 'renewed', NEW.resource, NEW.holder, NEW.fence, NEW.expires_at, NEW.released_at);
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER leases_history AFTER INSERT OR UPDATE ON leases
    FOR EACH ROW EXECUTE FUNCTION record_lease_event();
