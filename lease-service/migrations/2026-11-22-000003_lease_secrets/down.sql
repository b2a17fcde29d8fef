ALTER TABLE leases DROP COLUMN secret_hash;
