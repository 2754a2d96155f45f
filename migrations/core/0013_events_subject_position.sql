-- events.list by subject (a machine's or a workflow's history) pages in commit order (outbox_seq).
CREATE INDEX IF NOT EXISTS bc_events_subject_position ON bc_events (subject, outbox_seq);
