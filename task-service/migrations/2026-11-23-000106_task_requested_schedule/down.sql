ALTER TABLE tasks DROP COLUMN requested_scheduled_at;
