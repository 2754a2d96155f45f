-- Challenges of challenge-response attestors (tpm): issued at POST /join/v1/challenge, consumed
-- by the join that answers them. Single-use (consumed_at), short-lived, bound to the agent's key.
-- state is what the attestor keeps for verify(): digests and public values, never a secret.
CREATE TABLE IF NOT EXISTS bc_attestation_challenges (
  id text PRIMARY KEY,
  attestor text NOT NULL,
  public_key text NOT NULL,
  state jsonb NOT NULL,
  created_at timestamptz NOT NULL DEFAULT compute_now(),
  expires_at timestamptz NOT NULL,
  consumed_at timestamptz
);
-- Issuing a challenge deletes the long-expired ones.
CREATE INDEX IF NOT EXISTS bc_attestation_challenges_expires ON bc_attestation_challenges (expires_at);
