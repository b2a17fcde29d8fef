-- An acquisition is recorded at the moment it took the row (`clock_timestamp()`, read after the
-- row lock is held), not at its transaction's start (`now()`). A takeover of a released lease
-- waits for the release to commit, but its statement may have started before the release's did:
-- recorded at `now()`, the new term then began on paper before the old one ended (the soak found
-- 1.3 ms of such "overlap" between two generators). Renewals and releases keep `now()`: a
-- release recorded early only ends the old term early on paper, never inside the new one.
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
