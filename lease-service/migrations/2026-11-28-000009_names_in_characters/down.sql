ALTER TABLE leases
    DROP CONSTRAINT leases_resource_length,
    ADD CONSTRAINT leases_resource_length CHECK (octet_length(resource) BETWEEN 1 AND 512),
    DROP CONSTRAINT leases_holder_length,
    ADD CONSTRAINT leases_holder_length CHECK (octet_length(holder) BETWEEN 1 AND 512);
