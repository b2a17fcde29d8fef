-- Wake-ups: an acquire may wait for a held lease (`wait_ms`), as etcd's Lock blocks. lease-service
-- LISTENs on `leasehold_leases`, and a release or revocation notifies it with the resource, so
-- the oldest waiter for that resource tries at once instead of polling. (An expiry needs no
-- notification: a waiter knows from the refusal, by the database's clock, when the lease runs
-- out, and tries then.) pg_notify is transactional: a waiter is woken only once the release is
-- visible to it.
CREATE FUNCTION leases_notify_released() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('leasehold_leases', json_build_array(json_build_object(
        'key', NEW.resource, 'count', 1, 'dueInMs', 0))::text);
    RETURN NULL;
END $$;

CREATE TRIGGER leases_notify_released AFTER UPDATE OF released_at ON leases
    FOR EACH ROW WHEN (NEW.released_at IS NOT NULL AND OLD.released_at IS NULL)
    EXECUTE FUNCTION leases_notify_released();
