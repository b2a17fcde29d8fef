-- What a holder says about itself with its lease (as a Kubernetes Lease's annotations, or the
-- value of an etcd key bound to a lease): a JSON object, set by the acquire that takes the
-- lease and replaced by the renewals that carry one, gone with the holder. Worker processes keep
-- their host, version, queues and slots here; lease-service never reads it.
ALTER TABLE leases ADD COLUMN metadata JSONB
    CONSTRAINT leases_metadata_is_object CHECK (metadata IS NULL OR jsonb_typeof(metadata) = 'object');
