DROP TRIGGER queues_room ON queues;
DROP FUNCTION queues_notify_room();
DROP TRIGGER tasks_notify_slot_freed ON tasks;
DROP FUNCTION tasks_notify_slot_freed();
ALTER TABLE queues DROP COLUMN concurrency_limit;
