DROP TABLE task_rollup;
DROP TABLE task_queue_minutes;
DROP TABLE task_throughput_minutes;
