-- What a workflow sent, found without scanning every command (httpViaSite reads its relayed requests).
CREATE INDEX IF NOT EXISTS bc_commands_origin ON bc_commands (origin) WHERE origin IS NOT NULL;
