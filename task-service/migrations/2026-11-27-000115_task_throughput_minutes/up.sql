-- The dashboard's hour and day charts read a per-minute rollup of the history, not the history
-- itself: a day of a busy system is a million events, and reading them all ran past the
-- statement timeout. The sweeper (one replica, by its lease) folds each minute of
-- `task_events` into these tables once no transaction that could still record an event in that
-- minute is open; a chart then reads at most 1,440 folded minutes here and, from the history,
-- only the tail not folded yet (see task-service's repo/rollup.rs).
--
-- The sweeper writes them, not the history's trigger: a row per minute that every claim and
-- completion updated would be one hot row all of them queue on, in the claim's transaction.

-- The history's transitions per minute, as the charts count them.
CREATE TABLE task_throughput_minutes (
    minute        TIMESTAMPTZ PRIMARY KEY,
    created       BIGINT      NOT NULL,
    started       BIGINT      NOT NULL,
    succeeded     BIGINT      NOT NULL,
    failed        BIGINT      NOT NULL,
    -- First claims' pickup latency as a histogram (percentiles of minutes cannot be combined;
    -- counts of bins add up): bin b counts the latencies of ms milliseconds with
    -- floor(16 * log2(1 + ms)) = b, the bins in ascending order, `pickup_counts` beside them.
    pickup_bins   INTEGER[]   NOT NULL,
    pickup_counts BIGINT[]    NOT NULL
);

-- Each queue's net moves into pending and running per minute, for the charts' queue series.
CREATE TABLE task_queue_minutes (
    minute  TIMESTAMPTZ NOT NULL,
    queue   TEXT        NOT NULL,
    pending BIGINT      NOT NULL,
    running BIGINT      NOT NULL,
    PRIMARY KEY (minute, queue)
);

-- How far the history is folded: every event before `folded_through` is counted in the tables
-- above, none at or after it. NULL until the first fold, which starts a day back.
CREATE TABLE task_rollup (
    id             BOOLEAN PRIMARY KEY DEFAULT true CHECK (id),
    folded_through TIMESTAMPTZ
);
INSERT INTO task_rollup (id) VALUES (true);
