// The benchmark Worker (bench/wrangler.toml): the deployment's compute serves the API, the
// JoinService and the agent gateway as in production (with NodeDO bound as NODE), and the
// /bench/* routes are the baselines:
//   GET /bench/noop      no database at all;
//   GET /bench/select1   a bare hono route that opens the store the same way the API does per
//                        request, runs SELECT 1 and closes the pool after the response;
//   GET /bench/echo      (Upgrade: websocket) the EchoDO: one Postgres INSERT and an echo per message;
//   GET /__scheduled     the cron trigger, as wrangler dev --test-scheduled serves it;
//   GET /bench/query-stats  every round trip of the Worker's and its Durable Objects' stores since the
//                        last read, per query kind (count, total ms); ?reset=1 starts again.
// Nothing here is part of the production Worker (workers/api/index.ts).
import { sql } from "drizzle-orm";
import { Hono } from "hono";
import { betterCompute, postgres } from "better-compute";
import { metalModule } from "better-compute/metal";
import { provisionModule } from "better-compute/provision";
import { deploymentEntry } from "../workers/api/entry.ts";
import { QueryStats } from "./query-stats.ts";
import { benchSteps } from "./workflow-steps.ts";

/** Round trips of every store the Worker and its Durable Objects open (wrangler dev runs them in one isolate). */
const queryStats = new QueryStats();

/** The deployment's provisioning and metal modules plus the workflow bench's ten-step profile. */
const compute = betterCompute({
  modules: [provisionModule(), metalModule()],
  plugins: [benchSteps],
  database: postgres({ onRoundTrip: queryStats.record }),
});

const entry = deploymentEntry(compute);
export const NodeDO = entry.NodeDO;
export { EchoDO } from "./echo-do.ts";
export const WorkflowDO = entry.WorkflowDO;
export const SinkDO = entry.SinkDO;

type Env = Record<string, unknown>;

const bare = new Hono<{ Bindings: Env }>();

// The floor: wrangler dev, workerd and the HTTP round trip, with no database at all.
bare.get("/bench/noop", (c) => c.json({ ok: true }));

bare.get("/bench/select1", async (c) => {
  const store = compute.openStore(c.env);
  try {
    const result = await store.db.execute(sql`SELECT 1 AS one`);
    return c.json({ one: result.rows[0]?.one ?? null });
  } finally {
    c.executionCtx.waitUntil(store.close());
  }
});

bare.get("/bench/query-stats", (c) => {
  const stats = queryStats.snapshot();
  if (c.req.query("reset")) queryStats.reset();
  return c.json({ stats });
});

// One EchoDO for the whole bench: the section measures one socket, sequentially.
bare.get("/bench/echo", (c) => {
  const ns = c.env.ECHO as DurableObjectNamespace;
  return ns.get(ns.idFromName("echo")).fetch(c.req.raw);
});

export default {
  fetch(request, env, ctx) {
    const url = new URL(request.url);
    if (url.pathname.startsWith("/bench/")) return bare.fetch(request, env, ctx);
    // wrangler dev's --test-scheduled route, which it adds only to a Worker it bundles itself (the
    // bench serves a frozen bundle): the local cron (local/cron.ts) asks for it every minute.
    if (url.pathname === "/__scheduled") {
      const controller = { cron: url.searchParams.get("cron") ?? "", scheduledTime: Date.now(), noRetry() {} };
      entry.handler.scheduled(controller, env, ctx);
      return new Response("Ran scheduled event");
    }
    return entry.handler.fetch!(request, env, ctx);
  },
  // The cron trigger (bench/wrangler.toml), as deployed: the modules' sweeps.
  scheduled: entry.handler.scheduled,
} satisfies ExportedHandler<Env>;
