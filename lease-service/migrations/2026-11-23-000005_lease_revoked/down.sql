CREATE OR REPLACE FUNCTION record_lease_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.fence <> OLD.fence THEN
        INSERT INTO lease_events (at, kind, resource, holder, fence, expires_at, released_at)
        VALUES (clock_timestamp(), 'acquired', NEW.resource, NEW.holder, NEW.fence, NEW.expires_at, NEW.released_at);
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
ALTER TABLE leases DROP CONSTRAINT leases_revoked_is_released;
ALTER TABLE leases DROP COLUMN revoked_at;
