-- Proof of holding: each new acquisition gets a random secret, returned only in the acquire
-- answer; renew and release may (or, with LEASE_REQUIRE_SECRET, must) present it, so knowing a
-- holder's name is not enough to release its lease. Only its SHA-256 digest is stored, so a
-- read of this table (or a backup) cannot be used to act as a holder. NULL for leases acquired
-- before this migration: no secret matches them, and they simply run out.
ALTER TABLE leases ADD COLUMN secret_hash BYTEA;
