-- The bounds a start accepts (shared::generator): a rate of 1e-300 used to be stored, and every
-- generator replica that read it crashed. A value stored before them is brought within them.
UPDATE generator_settings SET
    rate_per_second = CASE WHEN rate_per_second = 'NaN' THEN 1
                           ELSE least(greatest(rate_per_second, 0.001), 1000) END,
    min_sleep_seconds = least(greatest(min_sleep_seconds, 0), 3600),
    max_sleep_seconds = least(greatest(max_sleep_seconds, min_sleep_seconds, 0), 3600);
ALTER TABLE generator_settings DROP CONSTRAINT generator_settings_sane;
ALTER TABLE generator_settings ADD CONSTRAINT generator_settings_sane CHECK (
    rate_per_second BETWEEN 0.001 AND 1000
    AND min_sleep_seconds >= 0 AND min_sleep_seconds <= max_sleep_seconds
    AND max_sleep_seconds <= 3600);
