ALTER TABLE leases DROP COLUMN metadata;
