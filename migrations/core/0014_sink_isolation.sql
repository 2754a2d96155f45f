-- A sink's batch that failed maxAttempts times is retried one record at a time up to its last
-- position (isolate_through), so a poisoned record deep in a batch is found in one round of
-- attempts instead of one round per record before it.
ALTER TABLE bc_sink_cursors ADD COLUMN IF NOT EXISTS isolate_through bigint;
