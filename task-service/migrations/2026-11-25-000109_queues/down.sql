DROP TABLE queues;
DROP FUNCTION queues_notify_resume();
