ALTER TABLE generator_settings DROP CONSTRAINT generator_settings_sane;
ALTER TABLE generator_settings ADD CONSTRAINT generator_settings_sane CHECK (
    rate_per_second > 0 AND min_sleep_seconds >= 0 AND min_sleep_seconds <= max_sleep_seconds);
