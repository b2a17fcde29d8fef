ALTER TABLE tasks DROP COLUMN lease_secret;
