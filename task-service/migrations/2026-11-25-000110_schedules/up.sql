-- Periodic tasks. A schedule's state lives here, not in any replica's memory: every replica's
-- ticker locks the due schedules (`FOR UPDATE SKIP LOCKED`), makes each tick's task and moves
-- `next_tick_at` past it in one transaction, so a tick is made once whichever replica makes it,
-- and a replica that dies mid-tick leaves the schedule as it was for another to make.
-- `next_tick_at` is NULL while paused. Times are the database's clock.
CREATE TABLE schedules (
    id                    BIGSERIAL   PRIMARY KEY,
    name                  TEXT        NOT NULL UNIQUE,
    cron                  TEXT        NOT NULL,
    timezone              TEXT        NOT NULL,
    task_data             JSONB       NOT NULL,
    queue                 TEXT        NOT NULL,
    priority              INTEGER     NOT NULL,
    max_attempts          INTEGER     NOT NULL,
    catch_up              TEXT        NOT NULL CHECK (catch_up IN ('one', 'none')),
    misfire_grace_seconds INTEGER     NOT NULL CHECK (misfire_grace_seconds > 0),
    paused                BOOLEAN     NOT NULL DEFAULT false,
    next_tick_at          TIMESTAMPTZ,
    last_tick_at          TIMESTAMPTZ,
    last_task_id          BIGINT,
    created_at            TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at            TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK (paused = (next_tick_at IS NULL))
);

-- The tickers' question: which running schedules are due, earliest first.
CREATE INDEX schedules_due_idx ON schedules (next_tick_at) WHERE next_tick_at IS NOT NULL;
