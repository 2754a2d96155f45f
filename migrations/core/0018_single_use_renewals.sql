-- Renewals are single-use: the signed timestamp of the last renewal JoinService accepted for the
-- node. A renewal must carry a later one, so a captured renewal request cannot be replayed to
-- stretch a stolen credential's life (it was accepted again for as long as its timestamp was
-- within the allowed clock skew).
ALTER TABLE bc_nodes ADD COLUMN IF NOT EXISTS renewed_through timestamptz;
