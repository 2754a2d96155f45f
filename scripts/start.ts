// npm start (and `better-compute dev`): the whole control plane on this machine with no
// external service. PGlite keeps its data under .data/; DATABASE_URL points it at any real
// Postgres instead. --sim N joins N simulated agents (FakeDaemon, role node) to it.
import path from "node:path";
import { parseArgs } from "node:util";
import { nodeTransport } from "../agent/node-transport.ts";
import { FakeDaemon } from "../agent/testing.ts";
import { repoRoot } from "./local/node-store.ts";
import { startStack, type Stack } from "./local/stack.ts";

const { values } = parseArgs({ options: { sim: { type: "string", default: "0" }, port: { type: "string" } } });
const simulated = Number(values.sim);
if (!Number.isInteger(simulated) || simulated < 0 || simulated > 1000) {
  console.error("--sim takes a whole number of agents from 0 to 1000");
  process.exit(2);
}
const port = Number(values.port ?? process.env.PORT ?? 8787);
const databaseUrl = process.env.DATABASE_URL || undefined;
console.log(databaseUrl ? "Better Compute: starting on DATABASE_URL…" : "Better Compute: starting on the embedded PGlite (.data/pglite)…");

const stack = await startStack({
  dataDir: process.env.BC_DATA_DIR ?? path.join(repoRoot, ".data"),
  port,
  databaseUrl,
  onOutput: (line) => console.log(`  [wrangler] ${line}`),
});
const daemons = await simulate(stack, simulated);

console.log(`
Better Compute is running at ${stack.url}

  admin API key (shown once): ${stack.adminKey}

  curl ${stack.url}/v1/health
  curl ${stack.url}/openapi.json
  curl -X POST -H "authorization: Bearer ${stack.adminKey}" ${stack.url}/v1/modules.list
${daemons.length ? `\n  ${daemons.length} simulated agents connected: ${daemons.map((d) => d.nodeId).join(", ")}\n` : ""}
Press Ctrl-C to stop.`);

let stopping = false;
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.on(signal, async () => {
    if (stopping) return;
    stopping = true;
    console.log("\nstopping…");
    await Promise.all(daemons.map((d) => d.stop()));
    await stack.stop();
    process.exit(0);
  });
}

/** Joins N FakeDaemons with join tokens minted over the API, as an operator would. */
async function simulate(stack: Stack, count: number): Promise<FakeDaemon[]> {
  const daemons: FakeDaemon[] = [];
  for (let i = 0; i < count; i++) {
    const res = await fetch(`${stack.url}/v1/joinTokens.create`, {
      method: "POST",
      headers: { authorization: `Bearer ${stack.adminKey}`, "content-type": "application/json" },
      body: JSON.stringify({ role: "node", labels: { "bc.dev/simulated": "true" } }),
    });
    if (!res.ok) throw new Error(`could not mint a join token for a simulated agent: ${res.status} ${await res.text()}`);
    const { token } = (await res.json()) as { token: string };
    const daemon = new FakeDaemon({
      baseUrl: stack.url,
      transport: nodeTransport(),
      role: "node",
      hostname: `sim-${i + 1}`,
      handlers: { "agent.ping": () => ({ pong: true, simulated: true }) },
    });
    await daemon.join(token);
    await daemon.connect();
    daemons.push(daemon);
  }
  return daemons;
}
