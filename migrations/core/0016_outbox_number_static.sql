-- The outbox's commit-time numbering (0010_sinks.sql) with static statements. The trigger runs once
-- per event and audit row, and its EXECUTE format(...) was parsed and planned each time; a static
-- UPDATE in PL/pgSQL keeps its plan for the session. Same lock, same numbering, same order.
CREATE OR REPLACE FUNCTION bc_outbox_number() RETURNS trigger
  LANGUAGE plpgsql
  AS $$
BEGIN
  -- 0x62636f7574626f78 ("bcoutbox"): one committer at a time from here until its commit is visible.
  PERFORM pg_advisory_xact_lock(7089632788665757560);
  IF TG_TABLE_NAME = 'bc_events' THEN
    UPDATE bc_events SET outbox_seq = nextval('bc_events_outbox_seq') WHERE id = NEW.id;
  ELSE
    UPDATE bc_audit SET outbox_seq = nextval('bc_audit_outbox_seq') WHERE id = NEW.id;
  END IF;
  RETURN NULL;
END $$;
