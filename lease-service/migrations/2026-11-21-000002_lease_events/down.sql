DROP TRIGGER leases_history ON leases;
DROP FUNCTION record_lease_event();
DROP TABLE lease_events;
