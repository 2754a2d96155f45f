-- An operator revokes a join token that was not used (joinTokens.revoke). Revoking also sets
-- consumed_at, so the attestors refuse a revoked token exactly as they refuse a used one.
ALTER TABLE bc_join_tokens ADD COLUMN IF NOT EXISTS revoked_at timestamptz;
-- joinTokens.list pages newest first.
CREATE INDEX IF NOT EXISTS bc_join_tokens_created ON bc_join_tokens (created_at, id);
