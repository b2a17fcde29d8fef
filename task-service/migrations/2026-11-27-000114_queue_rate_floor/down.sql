ALTER TABLE queues DROP CONSTRAINT queues_rate_per_second_range;
