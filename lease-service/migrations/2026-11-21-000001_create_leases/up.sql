-- Fencing tokens come from one sequence, not from a per-row counter: a resource's row may be
-- deleted by retention and created again, and its next fence must still be greater than every
-- fence it ever had. A sequence only rises, so that holds without remembering old rows.
CREATE SEQUENCE leases_fence_seq AS BIGINT;

CREATE TABLE leases (
    id           BIGSERIAL   PRIMARY KEY,
    resource     TEXT        NOT NULL,
    holder       TEXT        NOT NULL,
    fence        BIGINT      NOT NULL,
    ttl_seconds  INTEGER     NOT NULL,
    -- When the current acquisition was made (the sample's name for it).
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    renewed_at   TIMESTAMPTZ,
    released_at  TIMESTAMPTZ,
    expires_at   TIMESTAMPTZ NOT NULL,
    CONSTRAINT leases_resource_key UNIQUE (resource),
    CONSTRAINT leases_resource_length CHECK (octet_length(resource) BETWEEN 1 AND 512),
    CONSTRAINT leases_holder_length CHECK (octet_length(holder) BETWEEN 1 AND 512),
    CONSTRAINT leases_ttl_positive CHECK (ttl_seconds > 0)
);

-- The retention sweeper finds leases by when they ended.
CREATE INDEX leases_ended_at_idx ON leases ((COALESCE(released_at, expires_at)));
