// The capacity module's tables. A migration's text never changes once written (the runner refuses
// an applied migration whose text differs): a change comes as a new migration.
//
// Hosts themselves are bc_nodes rows (role 'node'); their resources are what the agent reports.
// capacity_hosts keeps the operator's settings and is the row a reserve locks (FOR UPDATE) while it
// re-checks the host's sums, so two reserves racing for a host's last slot never both get it.
import type { Migration } from "better-compute";

const SCHEMA_SQL = `
CREATE TABLE IF NOT EXISTS capacity_hosts (
  node_id text PRIMARY KEY,
  cordoned boolean NOT NULL DEFAULT false,
  maintenance boolean NOT NULL DEFAULT false,
  -- The operator's words for the cordon or the maintenance.
  reason text,
  updated_at timestamptz NOT NULL DEFAULT compute_now()
);
-- One row per live reservation: released ones are deleted, expired holds count for nothing and
-- are deleted by the module's sweep (or when their owner books again).
CREATE TABLE IF NOT EXISTS capacity_reservations (
  id text PRIMARY KEY,
  node_id text NOT NULL,
  owner text NOT NULL UNIQUE,
  pool text,
  vcpus integer NOT NULL CHECK (vcpus >= 0),
  memory_mib integer NOT NULL CHECK (memory_mib >= 0),
  disk_gib integer NOT NULL CHECK (disk_gib >= 0),
  -- The device ids the atom picker chose.
  devices text[] NOT NULL DEFAULT '{}',
  anti_affinity_group text,
  state text NOT NULL CHECK (state IN ('held', 'active')),
  -- Holds only: the hold counts until then.
  expires_at timestamptz,
  created_at timestamptz NOT NULL DEFAULT compute_now(),
  CHECK ((state = 'held') = (expires_at IS NOT NULL))
);
CREATE INDEX IF NOT EXISTS capacity_reservations_node ON capacity_reservations (node_id);
CREATE INDEX IF NOT EXISTS capacity_reservations_holds ON capacity_reservations (expires_at) WHERE state = 'held';
`;

export const capacityMigrations: Migration[] = [{ name: "capacity/0001_capacity", sql: SCHEMA_SQL }];
