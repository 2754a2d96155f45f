-- Replay refusal for attestors whose evidence is a signed document (cloud-iid): a document is
-- accepted once per (attestor, instance, nonce). A row is needed only while its document is
-- unexpired (an expired one is refused anyway): joins prune the rows past expires_at.
CREATE TABLE IF NOT EXISTS bc_attestation_replay (
  attestor text NOT NULL,
  instance_id text NOT NULL,
  nonce text NOT NULL,
  expires_at timestamptz NOT NULL,
  seen_at timestamptz NOT NULL DEFAULT compute_now(),
  PRIMARY KEY (attestor, instance_id, nonce)
);
CREATE INDEX IF NOT EXISTS bc_attestation_replay_expires ON bc_attestation_replay (expires_at);
