DROP INDEX task_events_at_idx;
