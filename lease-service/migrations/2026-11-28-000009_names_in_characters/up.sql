-- Names are bounded in characters, as the API's documents state them (JSON Schema's maxLength
-- counts characters): 512 of them may take up to 2,048 bytes, well within a btree entry.
ALTER TABLE leases
    DROP CONSTRAINT leases_resource_length,
    ADD CONSTRAINT leases_resource_length CHECK (char_length(resource) BETWEEN 1 AND 512),
    DROP CONSTRAINT leases_holder_length,
    ADD CONSTRAINT leases_holder_length CHECK (char_length(holder) BETWEEN 1 AND 512);
