-- The schedule a task's creator asked for, NULL when it named none (due when created).
-- `scheduled_at` moves with every retry, so only this tells whether a repeat of an idempotent
-- create asks for the same schedule as the first.
ALTER TABLE tasks ADD COLUMN requested_scheduled_at TIMESTAMPTZ;
