DROP FUNCTION lease_takeover_at(timestamptz, integer);
DROP FUNCTION leasehold_timeline();
ALTER TABLE leases DROP COLUMN timeline;
