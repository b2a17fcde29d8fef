-- A rate of 5e-324 tasks per second was accepted, and its bucket's refill
-- (rate_per_second × seconds since the last spend) then underflowed float8, so every claim that
-- read the bucket, of any queue, answered 500. The API now refuses rates below one task a day;
-- this keeps the table to what the API accepts, so that no stored row can make the refill raise
-- (the bounds are float8 arithmetic, as the service's own check is).
UPDATE queues SET rate_per_second = least(greatest(rate_per_second, 1::float8 / 86400), 1000000)
 WHERE rate_per_second IS NOT NULL;
ALTER TABLE queues ADD CONSTRAINT queues_rate_per_second_range
    CHECK (rate_per_second BETWEEN 1::float8 / 86400 AND 1000000);
