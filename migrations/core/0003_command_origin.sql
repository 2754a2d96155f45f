-- Who waits for a command's result: "workflow:<id>" is woken when the NodeDO records it.
ALTER TABLE bc_commands ADD COLUMN IF NOT EXISTS origin text;
