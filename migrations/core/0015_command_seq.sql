-- A command's seq comes from one sequence instead of its node's row (bc_nodes.command_seq). The
-- row's lock serialised every enqueue to a node until the enqueuing transaction committed, and a
-- site agent takes every BMC command of its site: the fleet's hottest row (issue 14). Seqs still
-- grow with each enqueue, per node and overall, but leave gaps, and a command may commit after
-- one with a higher seq: delivery sends every pending command whatever its seq
-- (core/agents/sessions.ts nextDelivery). New seqs continue above every existing one.
CREATE SEQUENCE IF NOT EXISTS bc_command_seq;
SELECT setval('bc_command_seq', (SELECT coalesce(max(seq), 0) + 1 FROM bc_commands), false);
ALTER TABLE bc_nodes DROP COLUMN IF EXISTS command_seq;
