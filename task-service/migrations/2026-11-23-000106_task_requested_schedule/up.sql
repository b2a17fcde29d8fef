-- The schedule a task was created with: the one its creator asked for, or the moment it was
-- created when it asked for none. `scheduled_at` moves with every retry, so only this tells
-- whether a repeat of an idempotent create asks for the same schedule as the first.
-- NULL: not known; a repeat is then not compared by its schedule, as before this column.
ALTER TABLE tasks ADD COLUMN requested_scheduled_at TIMESTAMPTZ;

-- Tasks made before this column. One never claimed (no fence) still has the schedule it was
-- created with, as no retry moved it, and one created without a schedule has its creation
-- time there. Except that a generator's task read the clock twice, once for each: a schedule
-- just before its creation is either one asked for or none, and stays unknown, like that of a
-- task claimed since (a retry may have moved it).
UPDATE tasks SET requested_scheduled_at = scheduled_at
WHERE fence IS NULL
  AND NOT (scheduled_at < created_at AND scheduled_at > created_at - interval '1 second');
