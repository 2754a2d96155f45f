-- Sinks (docs/sinks.md): the outbox (bc_events, and bc_audit for audit sinks) delivered to every
-- registered sink in order, with a durable cursor per sink and a dead letter for what a sink
-- refuses for good.

-- Delivery order. An id (bigserial) is handed out at insert, not at commit: a transaction that
-- inserted id 10 can commit after one that inserted id 11, and a dispatcher that had moved past
-- 11 would never see 10. So each row gets its outbox_seq as its transaction commits: a deferred
-- trigger takes one advisory lock, held until the commit is visible, and numbers the
-- transaction's rows. Positions are therefore handed out in commit order, and a position a
-- dispatcher sees means every smaller one is committed (or was rolled back, and never appears).
-- The cost: the commits of transactions that write events or audit rows queue on that lock.
CREATE SEQUENCE IF NOT EXISTS bc_events_outbox_seq;
CREATE SEQUENCE IF NOT EXISTS bc_audit_outbox_seq;
ALTER TABLE bc_events ADD COLUMN IF NOT EXISTS outbox_seq bigint;
ALTER TABLE bc_audit ADD COLUMN IF NOT EXISTS outbox_seq bigint;

-- Rows written before this migration keep their id order.
UPDATE bc_events SET outbox_seq = id WHERE outbox_seq IS NULL;
UPDATE bc_audit SET outbox_seq = id WHERE outbox_seq IS NULL;
SELECT setval('bc_events_outbox_seq', greatest((SELECT max(outbox_seq) FROM bc_events), 0) + 1, false);
SELECT setval('bc_audit_outbox_seq', greatest((SELECT max(outbox_seq) FROM bc_audit), 0) + 1, false);

CREATE UNIQUE INDEX IF NOT EXISTS bc_events_outbox ON bc_events (outbox_seq);
CREATE UNIQUE INDEX IF NOT EXISTS bc_audit_outbox ON bc_audit (outbox_seq);

CREATE OR REPLACE FUNCTION bc_outbox_number() RETURNS trigger
  LANGUAGE plpgsql
  AS $$
BEGIN
  -- 0x62636f7574626f78 ("bcoutbox"): one committer at a time from here until its commit is visible.
  PERFORM pg_advisory_xact_lock(7089632788665757560);
  EXECUTE format('UPDATE %I SET outbox_seq = nextval(%L) WHERE id = $1', TG_TABLE_NAME, TG_ARGV[0]) USING NEW.id;
  RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS bc_events_outbox_number ON bc_events;
CREATE CONSTRAINT TRIGGER bc_events_outbox_number AFTER INSERT ON bc_events
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION bc_outbox_number('bc_events_outbox_seq');
DROP TRIGGER IF EXISTS bc_audit_outbox_number ON bc_audit;
CREATE CONSTRAINT TRIGGER bc_audit_outbox_number AFTER INSERT ON bc_audit
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION bc_outbox_number('bc_audit_outbox_seq');

-- One cursor per sink (by its id): the last outbox_seq it received, and its retry state.
CREATE TABLE IF NOT EXISTS bc_sink_cursors (
  sink text PRIMARY KEY,
  source text NOT NULL CHECK (source IN ('events', 'audit')),
  position bigint NOT NULL DEFAULT 0,
  -- Failed deliveries of the batch at the cursor; reset by a success.
  attempts integer NOT NULL DEFAULT 0,
  next_attempt_at timestamptz,
  last_error text,
  last_delivered_at timestamptz,
  created_at timestamptz NOT NULL DEFAULT compute_now()
);

-- What a sink refused for good: kept with its last error until an operator replays it.
CREATE TABLE IF NOT EXISTS bc_sink_dead_letters (
  id bigserial PRIMARY KEY,
  sink text NOT NULL,
  source text NOT NULL CHECK (source IN ('events', 'audit')),
  -- The row's outbox_seq (one dead letter per sink and position) and its id in its table.
  position bigint NOT NULL,
  record_id bigint NOT NULL,
  attempts integer NOT NULL,
  last_error text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT compute_now(),
  replayed_at timestamptz,
  replayed_by text,
  UNIQUE (sink, position)
);
CREATE INDEX IF NOT EXISTS bc_sink_dead_letters_open ON bc_sink_dead_letters (sink, id) WHERE replayed_at IS NULL;
