-- Core tables of Better Compute: business time, migrations, the events outbox, work items,
-- audit, IAM and sealed secrets. Module migrations come after this one.

-- Business time comes from the database. compute_now() is the only place a bare now() is
-- allowed; bc_clock lets a test (or an operator replaying history) skew it.
CREATE TABLE IF NOT EXISTS bc_clock (
  id boolean PRIMARY KEY DEFAULT true CHECK (id),
  skew interval NOT NULL DEFAULT interval '0'
);
INSERT INTO bc_clock (id) VALUES (true) ON CONFLICT DO NOTHING;

CREATE OR REPLACE FUNCTION compute_now() RETURNS timestamptz
  LANGUAGE sql STABLE
  AS $$ SELECT now() + coalesce((SELECT skew FROM bc_clock WHERE id), interval '0') $$; -- bc:allow-now

-- The events outbox: written in the same transaction as the state it describes; sinks drain
-- it by id with durable cursors.
CREATE TABLE IF NOT EXISTS bc_events (
  id bigserial PRIMARY KEY,
  event_id uuid NOT NULL UNIQUE,
  type text NOT NULL,
  module text NOT NULL,
  subject text,
  data jsonb NOT NULL DEFAULT '{}'::jsonb,
  actor text,
  request_id text,
  occurred_at timestamptz NOT NULL DEFAULT compute_now()
);
CREATE INDEX IF NOT EXISTS bc_events_subject ON bc_events (subject, id);

-- Work items for level-triggered reconcilers: one row per (queue, key), so enqueueing twice
-- changes nothing.
CREATE TABLE IF NOT EXISTS bc_work_items (
  id bigserial PRIMARY KEY,
  queue text NOT NULL,
  key text NOT NULL,
  module text NOT NULL,
  payload jsonb NOT NULL DEFAULT '{}'::jsonb,
  state text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'running', 'done', 'dead')),
  attempts integer NOT NULL DEFAULT 0,
  run_at timestamptz NOT NULL DEFAULT compute_now(),
  last_error text,
  created_at timestamptz NOT NULL DEFAULT compute_now(),
  updated_at timestamptz NOT NULL DEFAULT compute_now(),
  UNIQUE (queue, key)
);
CREATE INDEX IF NOT EXISTS bc_work_items_due ON bc_work_items (state, run_at);

-- Audit: one row per mutating API call, in the call's own transaction.
CREATE TABLE IF NOT EXISTS bc_audit (
  id bigserial PRIMARY KEY,
  actor text NOT NULL,
  action text NOT NULL,
  resource text NOT NULL,
  method text NOT NULL,
  request_id text NOT NULL,
  at timestamptz NOT NULL DEFAULT compute_now()
);

-- API keys: only a SHA-256 of the secret half is stored; the key is shown once.
CREATE TABLE IF NOT EXISTS bc_api_keys (
  id text PRIMARY KEY,
  name text NOT NULL,
  secret_sha256 text NOT NULL,
  roles text[] NOT NULL,
  created_by text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT compute_now(),
  revoked_at timestamptz
);

-- Secrets travel by reference; the value is sealed (AES-GCM) under the deployment secret.
CREATE TABLE IF NOT EXISTS bc_secrets (
  id text PRIMARY KEY,
  module text NOT NULL,
  name text NOT NULL,
  sealed text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT compute_now()
);
