-- The task generator's desired state: one row, changed through any task-service replica and
-- read by every generator replica, so start and stop never need to reach the lease holder.
CREATE TABLE generator_settings (
    id                SMALLINT         PRIMARY KEY DEFAULT 1,
    running           BOOLEAN          NOT NULL DEFAULT false,
    rate_per_second   DOUBLE PRECISION NOT NULL DEFAULT 1,
    min_sleep_seconds DOUBLE PRECISION NOT NULL DEFAULT 1,
    max_sleep_seconds DOUBLE PRECISION NOT NULL DEFAULT 10,
    -- Tasks the generator created (counted when created, so retention does not lower it).
    produced          BIGINT           NOT NULL DEFAULT 0,
    updated_at        TIMESTAMPTZ      NOT NULL DEFAULT now(),
    CONSTRAINT generator_settings_single_row CHECK (id = 1),
    CONSTRAINT generator_settings_sane CHECK (
        rate_per_second > 0 AND min_sleep_seconds >= 0 AND min_sleep_seconds <= max_sleep_seconds)
);
INSERT INTO generator_settings (id) VALUES (1);
