// The vps module's tables. A migration's text never changes once written (the runner refuses an
// applied migration whose text differs): a change comes as a new migration.
//
// Instances reference their tenant, pool and flavor by id without foreign keys: a deleted
// instance's row (and its history) outlives the pool or tenant it was in, as a record.
import type { Migration } from "better-compute";

const SCHEMA_SQL = `
CREATE TABLE IF NOT EXISTS vps_accounts (
  id text PRIMARY KEY,
  provider text NOT NULL,
  provider_version text NOT NULL,
  -- The account's configuration as given, its secret fields replaced by secret:// references.
  config jsonb NOT NULL,
  -- The provider's rate limit is spent: no call for any instance of the account before this.
  paused_until timestamptz,
  created_at timestamptz NOT NULL DEFAULT compute_now()
);
CREATE TABLE IF NOT EXISTS vps_tenants (
  id text PRIMARY KEY,
  name text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT compute_now()
);
-- A principal ("apikey:<id>", "jwt:<sub>") acts for one tenant at most.
CREATE TABLE IF NOT EXISTS vps_tenant_members (
  principal text PRIMARY KEY,
  tenant_id text NOT NULL REFERENCES vps_tenants (id) ON DELETE CASCADE,
  created_at timestamptz NOT NULL DEFAULT compute_now()
);
CREATE INDEX IF NOT EXISTS vps_tenant_members_tenant ON vps_tenant_members (tenant_id);
CREATE TABLE IF NOT EXISTS vps_pools (
  id text PRIMARY KEY,
  account_id text NOT NULL REFERENCES vps_accounts (id),
  class text NOT NULL CHECK (class = 'provider'),
  agent text NOT NULL CHECK (agent IN ('none', 'bcd')),
  location text,
  created_at timestamptz NOT NULL DEFAULT compute_now()
);
-- A pool is offered to a tenant by giving the tenant a quota in it.
CREATE TABLE IF NOT EXISTS vps_quotas (
  tenant_id text NOT NULL REFERENCES vps_tenants (id) ON DELETE CASCADE,
  pool_id text NOT NULL REFERENCES vps_pools (id) ON DELETE CASCADE,
  instances integer NOT NULL CHECK (instances >= 0),
  vcpus integer NOT NULL CHECK (vcpus >= 0),
  memory_mib integer NOT NULL CHECK (memory_mib >= 0),
  disk_gib integer NOT NULL CHECK (disk_gib >= 0),
  PRIMARY KEY (tenant_id, pool_id)
);
CREATE TABLE IF NOT EXISTS vps_flavors (
  id text PRIMARY KEY,
  pool_id text NOT NULL REFERENCES vps_pools (id) ON DELETE CASCADE,
  name text NOT NULL,
  -- The provider's ids (ProviderOffers): the server type and the image.
  offer text NOT NULL,
  image text NOT NULL,
  vcpus integer NOT NULL,
  memory_mib integer NOT NULL,
  disk_gib integer NOT NULL,
  created_at timestamptz NOT NULL DEFAULT compute_now()
);
CREATE TABLE IF NOT EXISTS vps_ssh_keys (
  id text PRIMARY KEY,
  tenant_id text NOT NULL REFERENCES vps_tenants (id) ON DELETE CASCADE,
  name text NOT NULL,
  public_key text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT compute_now(),
  UNIQUE (tenant_id, name)
);
CREATE TABLE IF NOT EXISTS vps_instances (
  id text PRIMARY KEY,
  tenant_id text NOT NULL,
  pool_id text NOT NULL,
  flavor_id text NOT NULL,
  name text NOT NULL,
  -- The tenant's keys as they were at create: [{ name, publicKey }].
  ssh_keys jsonb NOT NULL,
  state text NOT NULL CHECK (state IN ('pending', 'creating', 'starting', 'running', 'stopping', 'stopped', 'deleting', 'deleted', 'failed')),
  desired text NOT NULL CHECK (desired IN ('running', 'stopped', 'deleted')),
  provider_id text,
  addresses text[] NOT NULL DEFAULT '{}',
  -- The provider's job in flight: { id, call, startedAt }.
  pending_op jsonb,
  -- A reboot asked for and not yet made.
  reboot_requested_at timestamptz,
  -- A reconciler pass holds the instance until then; every write of the pass is guarded by it.
  lease_until timestamptz,
  attempts integer NOT NULL DEFAULT 0,
  next_attempt_at timestamptz,
  last_error jsonb,
  vcpus integer NOT NULL,
  memory_mib integer NOT NULL,
  disk_gib integer NOT NULL,
  created_at timestamptz NOT NULL DEFAULT compute_now(),
  updated_at timestamptz NOT NULL DEFAULT compute_now(),
  state_changed_at timestamptz NOT NULL DEFAULT compute_now()
);
CREATE INDEX IF NOT EXISTS vps_instances_tenant ON vps_instances (tenant_id, pool_id) WHERE state <> 'deleted';
CREATE INDEX IF NOT EXISTS vps_instances_due ON vps_instances (next_attempt_at) WHERE state <> 'deleted';
-- Every provider call made for an instance and its outcome, in order. Never user data or a credential.
CREATE TABLE IF NOT EXISTS vps_instance_history (
  id bigserial PRIMARY KEY,
  instance_id text NOT NULL,
  at timestamptz NOT NULL DEFAULT compute_now(),
  call text NOT NULL,
  outcome text NOT NULL CHECK (outcome IN ('ok', 'error')),
  detail jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS vps_instance_history_instance ON vps_instance_history (instance_id, id);`;

export const vpsMigrations: Migration[] = [{ name: "vps/0001_vps", sql: SCHEMA_SQL }];
