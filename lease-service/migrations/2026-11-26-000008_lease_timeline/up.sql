-- Expiry is judged by the primary's clock (now()), and after a failover now() comes from
-- another machine. If the new primary's clock runs ahead of the old one's by d, every lease the
-- old primary granted looks expired d early there, and could be taken over while its holder,
-- counting its TTL from its own request, still acts on it. So each lease records the WAL
-- timeline of the primary that last set its expiry (one more at every promotion), and a lease
-- set on an earlier timeline may be taken over only `leasehold.max_clock_skew_ms` (lease-
-- service's LEASE_MAX_CLOCK_SKEW_MS, 1000 unless set) after it expired: skew below that bound
-- then cannot shorten a lease. Leases set on the current primary pay nothing.
ALTER TABLE leases ADD COLUMN timeline integer NOT NULL DEFAULT 0;

-- The current primary's timeline: the first eight hex digits of its WAL file's name.
CREATE FUNCTION leasehold_timeline() RETURNS integer LANGUAGE sql VOLATILE AS $$
    SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::integer
$$;

-- When a lease that expires at `expires_at`, set on `timeline`, may be taken over.
CREATE FUNCTION lease_takeover_at(expires_at timestamptz, timeline integer)
RETURNS timestamptz LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN timeline >= leasehold_timeline() THEN expires_at
                ELSE expires_at + make_interval(secs => coalesce(
                    nullif(current_setting('leasehold.max_clock_skew_ms', true), '')::integer,
                    1000) / 1000.0)
           END
$$;
