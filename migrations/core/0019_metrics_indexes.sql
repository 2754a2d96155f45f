-- GET /metrics (docs/metrics.md) reads the command round trips completed within its window, the
-- agents connected now and the live hosts (capacity's hosts read, which capacity.hosts.list and
-- placement share): each through an index, so a scrape costs what the window, the live sessions and
-- the hosts hold, not the command history or every ramdisk that ever joined.
CREATE INDEX IF NOT EXISTS bc_commands_completed ON bc_commands (completed_at) WHERE completed_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS bc_nodes_connected ON bc_nodes (role) WHERE state = 'connected';
CREATE INDEX IF NOT EXISTS bc_nodes_live_hosts ON bc_nodes (id) WHERE role = 'node' AND revoked_at IS NULL;
