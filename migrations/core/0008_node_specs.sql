-- NodeSpec: each node's desired state, versioned, and what its agent reports it reached.
-- `sections` maps a section name (registered by a module: access, instances...) to a map of
-- entries keyed by name; every change bumps `generation`. The observed columns are written by
-- the node's current session only (its status frames).
CREATE TABLE IF NOT EXISTS bc_node_specs (
  node_id text PRIMARY KEY REFERENCES bc_nodes(id) ON DELETE CASCADE,
  generation bigint NOT NULL DEFAULT 0,
  sections jsonb NOT NULL DEFAULT '{}'::jsonb,
  updated_at timestamptz NOT NULL DEFAULT compute_now(),
  -- The agent's last status: { section: { entries, error? } }.
  observed jsonb,
  -- The generation that status converged.
  observed_generation bigint,
  observed_at timestamptz,
  -- The agent boot (hello bootId) that reported it.
  observed_boot_id text
);
