DROP TRIGGER tasks_history ON tasks;
DROP FUNCTION record_task_event();
DROP TABLE task_events;
