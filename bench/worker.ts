// The benchmark Worker (bench/wrangler.toml): the deployment's compute serves the API as in
// production, and GET /bench/select1 is the baseline, a bare hono route that opens the store
// the same way the API does per request, runs SELECT 1 and closes the pool after the response.
// Nothing here is part of the production Worker (workers/api/index.ts).
import { sql } from "drizzle-orm";
import { Hono } from "hono";
import { compute } from "../better-compute.config.ts";

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

export default {
  fetch(request, env, ctx) {
    if (new URL(request.url).pathname.startsWith("/bench/")) return bare.fetch(request, env, ctx);
    return compute.fetch(request, env, ctx);
  },
} satisfies ExportedHandler<Env>;
