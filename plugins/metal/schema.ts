// The metal module's tables. A migration's text never changes once written (the runner refuses
// an applied migration whose text differs): each spells the states as they were when it was
// written. The lifecycle table (lifecycle.ts) is the truth today; test/metal/lifecycle-table.test.ts
// checks that the database's state CHECK and its metal_nodes_moving index match it, so a new
// state comes with a new migration.
import type { Migration } from "better-compute";

const SCHEMA_SQL = `
CREATE TABLE IF NOT EXISTS metal_sites (
  id text PRIMARY KEY,
  description text,
  created_at timestamptz NOT NULL DEFAULT compute_now()
);
CREATE TABLE IF NOT EXISTS metal_pools (
  id text PRIMARY KEY,
  site_id text NOT NULL REFERENCES metal_sites (id),
  class text NOT NULL CHECK (class IN ('metal')),
  agent text NOT NULL CHECK (agent IN ('bcd', 'none')),
  policy jsonb NOT NULL,
  created_at timestamptz NOT NULL DEFAULT compute_now()
);
CREATE TABLE IF NOT EXISTS metal_nodes (
  id text PRIMARY KEY,
  pool_id text NOT NULL REFERENCES metal_pools (id),
  site_id text NOT NULL REFERENCES metal_sites (id),
  -- The BMC binding: address and username, the password as a secret:// reference only.
  bmc jsonb NOT NULL,
  state text NOT NULL CHECK (state IN ('enrolled', 'commissioning', 'ready', 'deploying', 'deployed', 'releasing', 'failed', 'retired')),
  maintenance boolean NOT NULL DEFAULT false,
  maintenance_reason text,
  role text,
  workflow_id text,
  product_uuid text,
  inventory jsonb,
  last_error jsonb,
  state_changed_at timestamptz NOT NULL DEFAULT compute_now(),
  created_at timestamptz NOT NULL DEFAULT compute_now(),
  updated_at timestamptz NOT NULL DEFAULT compute_now()
);
CREATE INDEX IF NOT EXISTS metal_nodes_moving ON metal_nodes (state) WHERE state IN ('enrolled', 'commissioning', 'deploying', 'releasing');
CREATE UNIQUE INDEX IF NOT EXISTS metal_nodes_bmc ON metal_nodes ((bmc->>'address')) WHERE state <> 'retired';
-- Every change of state, in order: the lifecycle's history.
CREATE TABLE IF NOT EXISTS metal_transitions (
  id bigserial PRIMARY KEY,
  node_id text NOT NULL REFERENCES metal_nodes (id),
  event text NOT NULL,
  from_state text NOT NULL,
  to_state text NOT NULL,
  workflow_id text,
  reason text,
  at timestamptz NOT NULL DEFAULT compute_now()
);
CREATE INDEX IF NOT EXISTS metal_transitions_node ON metal_transitions (node_id, id);`;

// The machine's own IP addresses, as its BMC reported them: the only hosts httpViaSite may reach.
const ADDRESSES_SQL = `ALTER TABLE metal_nodes ADD COLUMN IF NOT EXISTS addresses text[] NOT NULL DEFAULT '{}';`;

// Rescue's states. The index holds the states the reconciler looks for: enrolled (to commission)
// and the transitional states (to settle).
const RESCUE_SQL = `
ALTER TABLE metal_nodes DROP CONSTRAINT IF EXISTS metal_nodes_state_check;
ALTER TABLE metal_nodes ADD CONSTRAINT metal_nodes_state_check CHECK (state IN ('enrolled', 'commissioning', 'ready', 'deploying', 'deployed', 'releasing', 'failed', 'retired', 'rescuing', 'rescue', 'unrescuing'));
DROP INDEX IF EXISTS metal_nodes_moving;
CREATE INDEX metal_nodes_moving ON metal_nodes (state) WHERE state IN ('enrolled', 'commissioning', 'deploying', 'releasing', 'rescuing', 'unrescuing');`;

// One machine per BMC and per product UUID among the machines in service. The BMC's address
// compares without a trailing slash (metal_nodes_bmc compared it as given).
const UNIQUE_MACHINE_SQL = `
DROP INDEX IF EXISTS metal_nodes_bmc;
CREATE UNIQUE INDEX IF NOT EXISTS metal_nodes_bmc_address ON metal_nodes ((rtrim(bmc->>'address', '/'))) WHERE state <> 'retired';
CREATE UNIQUE INDEX IF NOT EXISTS metal_nodes_product_uuid ON metal_nodes ((lower(product_uuid))) WHERE state <> 'retired';`;

// Operators' console sessions (console.ts): who opened which machine's console, until when.
const CONSOLE_SQL = `
CREATE TABLE IF NOT EXISTS metal_console_sessions (
  id text PRIMARY KEY,
  node_id text NOT NULL REFERENCES metal_nodes (id),
  actor text NOT NULL,
  opened_at timestamptz NOT NULL DEFAULT compute_now(),
  expires_at timestamptz NOT NULL
);`;

// GET /metrics counts the machines in service by pool and state from this index alone (metrics.ts).
const METRICS_SQL = `
CREATE INDEX IF NOT EXISTS metal_nodes_in_service ON metal_nodes (pool_id, state) WHERE state <> 'retired';`;

// A workflow's end settles its machine (reconciler.ts): found by its workflow id.
const BY_WORKFLOW_SQL = `CREATE INDEX metal_nodes_by_workflow ON metal_nodes (workflow_id) WHERE workflow_id IS NOT NULL;`;

export const metalMigrations: Migration[] = [
  { name: "metal/0001_metal", sql: SCHEMA_SQL },
  { name: "metal/0002_addresses", sql: ADDRESSES_SQL },
  { name: "metal/0003_rescue", sql: RESCUE_SQL },
  { name: "metal/0004_one_machine_per_bmc_and_uuid", sql: UNIQUE_MACHINE_SQL },
  { name: "metal/0005_console_sessions", sql: CONSOLE_SQL },
  { name: "metal/0006_metrics", sql: METRICS_SQL },
  { name: "metal/0007_nodes_by_workflow", sql: BY_WORKFLOW_SQL },
];
