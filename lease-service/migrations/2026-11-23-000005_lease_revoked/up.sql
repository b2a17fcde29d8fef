-- An operator's revoke ends a lease as its holder's release does (`released_at`), and also says
-- so here. The two must be told apart: a release repeated by the holder (its first answer may
-- have been lost) is answered 200 as the first was, and task-service takes that 200 as proof
-- that a worker still owned its task. A revoked lease's holder is refused instead (409
-- `lease_revoked`). Cleared when a new acquisition takes the row.
ALTER TABLE leases ADD COLUMN revoked_at TIMESTAMPTZ;
ALTER TABLE leases ADD CONSTRAINT leases_revoked_is_released
    CHECK (revoked_at IS NULL OR revoked_at = released_at);

-- The history names a revoke as such: the term ends as a release's does (`released_at`).
CREATE OR REPLACE FUNCTION record_lease_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.fence <> OLD.fence THEN
        INSERT INTO lease_events (at, kind, resource, holder, fence, expires_at, released_at)
        VALUES (clock_timestamp(), 'acquired', NEW.resource, NEW.holder, NEW.fence, NEW.expires_at, NEW.released_at);
    ELSIF NEW.released_at IS NOT NULL AND OLD.released_at IS NULL THEN
        INSERT INTO lease_events (at, kind, resource, holder, fence, expires_at, released_at)
        VALUES (now(), CASE WHEN NEW.revoked_at IS NULL THEN 'released' ELSE 'revoked' END,
                NEW.resource, NEW.holder, NEW.fence, NEW.expires_at, NEW.released_at);
    ELSIF NEW.expires_at <> OLD.expires_at THEN
        INSERT INTO lease_events (at, kind, resource, holder, fence, expires_at, released_at)
        VALUES (now(), 'renewed', NEW.resource, NEW.holder, NEW.fence, NEW.expires_at, NEW.released_at);
    END IF;
    RETURN NEW;
END;
$$;
