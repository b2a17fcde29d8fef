-- The secret of the task's current lease, as lease-service answered the claim's acquire:
-- heartbeat, complete and fail present it, so only task-service (not whoever knows a worker's
-- name) can renew or release a task's lease. Never shown in the API.
ALTER TABLE tasks ADD COLUMN lease_secret TEXT;
