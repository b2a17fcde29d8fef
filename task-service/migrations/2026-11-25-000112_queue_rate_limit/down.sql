ALTER TABLE queues DROP COLUMN rate_per_second, DROP COLUMN rate_burst, DROP COLUMN rate_tokens,
    DROP COLUMN rate_at;
