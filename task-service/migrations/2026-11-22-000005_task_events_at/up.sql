-- The dashboard's throughput chart reads the last minutes of history, and retention prunes it by
-- age: both by `at`.
CREATE INDEX task_events_at_idx ON task_events (at);
