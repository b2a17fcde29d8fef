DROP TRIGGER tasks_notify_update ON tasks;
DROP FUNCTION tasks_notify_repending();
DROP TRIGGER tasks_notify_insert ON tasks;
DROP FUNCTION tasks_notify_pending();
