-- Agents: the nodes that joined, the single-use tokens they joined with, the control plane's
-- credential-signing keys, and the commands sent to them.

CREATE TABLE IF NOT EXISTS bc_nodes (
  id text PRIMARY KEY,
  role text NOT NULL CHECK (role IN ('node', 'site', 'ramdisk')),
  -- The agent's Ed25519 public key (raw, base64url): credentials are bound to it, hellos and
  -- attested results are verified with it.
  public_key text NOT NULL,
  hostname text,
  labels jsonb NOT NULL DEFAULT '{}'::jsonb,
  attestor text NOT NULL,
  state text NOT NULL DEFAULT 'joined' CHECK (state IN ('joined', 'connected', 'disconnected')),
  session_id text,
  boot_id text,
  agent_version text,
  -- Per-node order of commands.
  command_seq bigint NOT NULL DEFAULT 0,
  joined_at timestamptz NOT NULL DEFAULT compute_now(),
  connected_at timestamptz,
  disconnected_at timestamptz,
  revoked_at timestamptz
);

-- Join tokens are single use: consumed_at is set by the first presentation, valid or not.
CREATE TABLE IF NOT EXISTS bc_join_tokens (
  id text PRIMARY KEY,
  attestor text NOT NULL,
  role text NOT NULL CHECK (role IN ('node', 'site', 'ramdisk')),
  secret_sha256 text NOT NULL,
  labels jsonb NOT NULL DEFAULT '{}'::jsonb,
  -- For a token minted for a known machine: the node id it joins as.
  node_id text,
  expect jsonb NOT NULL DEFAULT '{}'::jsonb,
  created_by text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT compute_now(),
  expires_at timestamptz NOT NULL,
  consumed_at timestamptz,
  consumed_by text
);

-- Keys that sign node credentials. The private half is a secret reference (sealed).
CREATE TABLE IF NOT EXISTS bc_signing_keys (
  kid text PRIMARY KEY,
  public_jwk jsonb NOT NULL,
  private_ref text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT compute_now(),
  retired_at timestamptz
);
-- At most one active key; two isolates creating the first key race on this index.
CREATE UNIQUE INDEX IF NOT EXISTS bc_signing_keys_one_active ON bc_signing_keys ((true)) WHERE retired_at IS NULL;

CREATE TABLE IF NOT EXISTS bc_commands (
  id bigserial PRIMARY KEY,
  node_id text NOT NULL REFERENCES bc_nodes (id),
  seq bigint NOT NULL,
  kind text NOT NULL,
  idempotency_key text NOT NULL UNIQUE,
  module text NOT NULL,
  body jsonb NOT NULL,
  -- Secrets the command needs, by reference only; the agent resolves them through the site.
  secret_refs text[] NOT NULL DEFAULT '{}',
  attested boolean NOT NULL DEFAULT false,
  destructive boolean NOT NULL DEFAULT false,
  state text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'succeeded', 'failed', 'expired')),
  attempts integer NOT NULL DEFAULT 0,
  deadline timestamptz,
  result jsonb,
  error jsonb,
  signature text,
  created_at timestamptz NOT NULL DEFAULT compute_now(),
  delivered_at timestamptz,
  completed_at timestamptz,
  UNIQUE (node_id, seq)
);
CREATE INDEX IF NOT EXISTS bc_commands_open ON bc_commands (node_id, seq) WHERE state IN ('pending', 'delivered');
