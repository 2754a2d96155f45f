-- Workflows waiting for an agent to connect (a ramdisk after PXE, an installed system): the
-- agent's hello fires the matching waits and wakes their workflows instead of their next poll.
CREATE TABLE IF NOT EXISTS bc_agent_waits (
  workflow_id text PRIMARY KEY,
  role text NOT NULL,
  -- The connecting agent's labels must include all of these.
  labels jsonb NOT NULL,
  fired_at timestamptz,
  created_at timestamptz NOT NULL DEFAULT compute_now()
);
CREATE INDEX IF NOT EXISTS bc_agent_waits_open ON bc_agent_waits (role) WHERE fired_at IS NULL;
