-- The sample's tasks table (its columns keep their meaning) plus what a queue needs: a status,
-- queues and priorities, attempts, the fence of the claim's lease, idempotency, errors.
CREATE TABLE tasks (
    id                    BIGSERIAL   PRIMARY KEY,
    task_data             JSONB       NOT NULL,
    queue                 TEXT        NOT NULL DEFAULT 'default',
    priority              INTEGER     NOT NULL DEFAULT 0,
    status                TEXT        NOT NULL DEFAULT 'pending',
    -- Run no earlier than this (also: when a failed task may be retried).
    scheduled_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    processor             TEXT,
    fence                 BIGINT,
    attempts              INTEGER     NOT NULL DEFAULT 0,
    max_attempts          INTEGER     NOT NULL,
    last_heartbeat_at     TIMESTAMPTZ,
    -- The expiry of the claim's lease, as lease-service reported it: a running task past this
    -- is a candidate for another claim (lease-service has the final word).
    must_heartbeat_before TIMESTAMPTZ,
    started_at            TIMESTAMPTZ,
    processed_at          TIMESTAMPTZ,
    task_output           JSONB,
    last_error            TEXT,
    cancel_requested      BOOLEAN     NOT NULL DEFAULT false,
    idempotency_key       TEXT,
    created_at            TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at            TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT tasks_status_known
        CHECK (status IN ('pending', 'running', 'succeeded', 'dead', 'cancelled')),
    CONSTRAINT tasks_idempotency_key_unique UNIQUE (idempotency_key),
    CONSTRAINT tasks_attempts_sane CHECK (attempts >= 0 AND max_attempts >= 1),
    CONSTRAINT tasks_running_has_owner
        CHECK (status <> 'running' OR (processor IS NOT NULL AND fence IS NOT NULL))
);

-- The claim: due pending tasks, highest priority first, then earliest scheduled; with and
-- without a queue filter.
CREATE INDEX tasks_due_idx ON tasks (priority DESC, scheduled_at, id) WHERE status = 'pending';
CREATE INDEX tasks_due_by_queue_idx ON tasks (queue, priority DESC, scheduled_at, id)
    WHERE status = 'pending';
-- The claim's second source: running tasks whose lease has run out.
CREATE INDEX tasks_lapsed_idx ON tasks (must_heartbeat_before) WHERE status = 'running';
-- Listings by status, and counts by queue and status.
CREATE INDEX tasks_status_id_idx ON tasks (status, id);
CREATE INDEX tasks_queue_status_idx ON tasks (queue, status);
-- Retention.
CREATE INDEX tasks_finished_idx ON tasks (processed_at)
    WHERE status IN ('succeeded', 'dead', 'cancelled');
