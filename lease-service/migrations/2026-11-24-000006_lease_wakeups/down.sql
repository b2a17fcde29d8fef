DROP TRIGGER leases_notify_released ON leases;
DROP FUNCTION leases_notify_released();
