-- What a node agent reports about its machine in its hello (CPU, memory, disk, devices): the
-- capacity module derives a host's allocatable resources from it. Replaced by every hello.
ALTER TABLE bc_nodes ADD COLUMN IF NOT EXISTS resources jsonb;
