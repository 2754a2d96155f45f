-- Live nodes by their labels: revoking a machine's ramdisks when its workflow ends (role and
-- labels) and finding a vps instance's node (its bc.dev/vps-instance label) read only the
-- matching nodes, not every node that ever joined (each ramdisk boot adds one, revoked later).
CREATE INDEX IF NOT EXISTS bc_nodes_live_labels ON bc_nodes USING gin (labels jsonb_path_ops) WHERE revoked_at IS NULL;
