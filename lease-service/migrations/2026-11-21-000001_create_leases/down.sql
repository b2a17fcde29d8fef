DROP TABLE leases;
DROP SEQUENCE leases_fence_seq;
