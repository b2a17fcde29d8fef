-- Runs once, when the PostgreSQL volume is first created: one database per service.
CREATE DATABASE leasehold_leases;
CREATE DATABASE leasehold_tasks;
