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

// Pools of class host (docs/vps.md, "Host pools"): tenant VMs on the deployment's own hosts,
// placed by the capacity module and run by the hosts' node agents through their NodeSpec.
const HOST_POOLS_SQL = `
ALTER TABLE vps_pools ALTER COLUMN account_id DROP NOT NULL;
ALTER TABLE vps_pools DROP CONSTRAINT vps_pools_class_check;
ALTER TABLE vps_pools ADD CONSTRAINT vps_pools_class_check CHECK (class IN ('provider', 'host'));
ALTER TABLE vps_pools
  -- Host pools: the labels a host must carry to be a candidate, the runtime (driver id) guests run
  -- on, the overcommit ratios { cpu, memory }, spread or pack, and the guest image's name.
  ADD COLUMN host_labels jsonb,
  ADD COLUMN runtime text,
  ADD COLUMN overcommit jsonb,
  ADD COLUMN strategy text CHECK (strategy IN ('spread', 'pack')),
  ADD COLUMN image text;
ALTER TABLE vps_pools ADD CONSTRAINT vps_pools_class_fields CHECK (
  CASE class WHEN 'provider' THEN account_id IS NOT NULL AND host_labels IS NULL
             ELSE account_id IS NULL AND host_labels IS NOT NULL AND runtime IS NOT NULL AND overcommit IS NOT NULL
                  AND strategy IS NOT NULL AND image IS NOT NULL END);
-- A host pool's flavor is its sizes alone: no provider offer, the pool's image.
ALTER TABLE vps_flavors ALTER COLUMN offer DROP NOT NULL, ALTER COLUMN image DROP NOT NULL;
ALTER TABLE vps_instances
  -- Host pools only. The user data exactly as the guest gets it, composed once at create, and its sha256.
  ADD COLUMN user_data text,
  ADD COLUMN user_data_sha256 text,
  ADD COLUMN anti_affinity_group text,
  -- The host (node id) it is placed on, and the NodeSpec generation its last entry write made:
  -- the host's observed state counts once the host reports that generation or a later one.
  ADD COLUMN host_node_id text,
  ADD COLUMN spec_generation bigint,
  -- Why it is not placed: { rejections: [{ nodeId, filter, reason }] } (null once placed).
  ADD COLUMN placement jsonb,
  -- What the guest reported once booted (GuestReport: hostname, userDataSha256, hostKeys, address...).
  ADD COLUMN guest jsonb,
  -- Why it stopped or failed without being asked (guest_poweroff, vmm_exited, host_reboot, boot_failed...).
  ADD COLUMN reason text,
  -- Bumped by each reboot asked for; the host reboots a running guest booted for a lower count.
  ADD COLUMN reboot_count integer NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS vps_instances_host ON vps_instances (host_node_id) WHERE state <> 'deleted';`;

// vps.hosts.drain { restart: true } (docs/vps.md, "Cordon and drain"): a running host instance the
// drain stopped to re-place; once stopped, the host reconciler moves it and starts it elsewhere.
const DRAIN_RESTART_SQL = `
ALTER TABLE vps_instances
  -- When a drain stopped it to start it on another host (null: no drain is moving it).
  ADD COLUMN drain_restart_at timestamptz;`;

// GET /metrics counts the live instances by pool and state from this index alone (metrics.ts).
const METRICS_SQL = `
CREATE INDEX IF NOT EXISTS vps_instances_live ON vps_instances (pool_id, state) WHERE state <> 'deleted';`;

export const vpsMigrations: Migration[] = [
  { name: "vps/0001_vps", sql: SCHEMA_SQL },
  { name: "vps/0002_host_pools", sql: HOST_POOLS_SQL },
  { name: "vps/0003_drain_restart", sql: DRAIN_RESTART_SQL },
  { name: "vps/0004_metrics", sql: METRICS_SQL },
];
