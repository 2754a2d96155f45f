// npm start: the whole control plane on this machine with no external service. PGlite keeps
// its data under .data/; DATABASE_URL points it at any real Postgres instead.
import path from "node:path";
import { repoRoot } from "./local/node-store.ts";
import { startStack } from "./local/stack.ts";

const port = Number(process.env.PORT ?? 8787);
const databaseUrl = process.env.DATABASE_URL || undefined;
console.log(databaseUrl ? "Better Compute: starting on DATABASE_URL…" : "Better Compute: starting on the embedded PGlite (.data/pglite)…");

const stack = await startStack({
  dataDir: process.env.BC_DATA_DIR ?? path.join(repoRoot, ".data"),
  port,
  databaseUrl,
  onOutput: (line) => console.log(`  [wrangler] ${line}`),
});

console.log(`
Better Compute is running at ${stack.url}

  admin API key (shown once): ${stack.adminKey}

  curl ${stack.url}/v1/health
  curl ${stack.url}/openapi.json
  curl -X POST -H "authorization: Bearer ${stack.adminKey}" ${stack.url}/v1/modules.list

Press Ctrl-C to stop.`);

let stopping = false;
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.on(signal, async () => {
    if (stopping) return;
    stopping = true;
    console.log("\nstopping…");
    await stack.stop();
    process.exit(0);
  });
}
