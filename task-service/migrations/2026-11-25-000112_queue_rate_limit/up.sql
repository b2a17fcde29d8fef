-- A rate limit per queue: at most `rate_per_second` tasks started per second, in bursts of at
-- most `rate_burst`, by the database's clock. A token bucket: `rate_tokens` were left when the
-- last claim that started tasks committed, at `rate_at` (that claim's `now()`). Claims of a
-- rate-limited queue lock its row first, as for a concurrency limit, and refill and spend the
-- bucket under that lock.
ALTER TABLE queues
    ADD COLUMN rate_per_second DOUBLE PRECISION CHECK (rate_per_second > 0),
    ADD COLUMN rate_burst INTEGER CHECK (rate_burst > 0),
    ADD COLUMN rate_tokens DOUBLE PRECISION NOT NULL DEFAULT 0,
    ADD COLUMN rate_at TIMESTAMPTZ,
    ADD CHECK ((rate_per_second IS NULL) = (rate_burst IS NULL));
