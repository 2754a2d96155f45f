// The cron sweep runs what modules register: their sweeps (cron-only), then their reconcilers,
// with no module named in the Worker entry. A workflow's end runs the reconcilers only.
import { env } from "cloudflare:workers";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { compute as defaultDeployment } from "../better-compute.config.ts";
import { betterCompute, definePlugin } from "../core/index.ts";
import type { Store } from "../core/store/database.ts";
import { sweep } from "../workers/api/entry.ts";

const ran: string[] = [];
const acmeJanitor = definePlugin({
  id: "acme-janitor",
  sweeps: [
    {
      id: "broken",
      run: async () => {
        ran.push("sweep:broken");
        throw new Error("the janitor tripped");
      },
    },
    {
      id: "expire-leases",
      run: async (ctx) => {
        ran.push(`sweep:expire-leases:${ctx.moduleId}`);
        return 2;
      },
    },
  ],
  reconcilers: [
    {
      id: "tidy",
      run: async () => {
        ran.push("reconciler:tidy");
        return 1;
      },
    },
  ],
});
const compute = betterCompute({ plugins: [acmeJanitor] });

let store: Store;
beforeAll(() => {
  store = compute.openStore(env);
});
afterAll(() => store?.close());

describe("the cron sweep", () => {
  it("runs every module's sweeps, then its reconcilers; a failing one is logged and the rest still run", async () => {
    ran.length = 0;
    const warnings = vi.spyOn(console, "warn").mockImplementation(() => {});
    try {
      // The Worker entry's cron handler, exactly as `scheduled` runs it.
      expect(await sweep(compute, env)).toBe(3);
      expect(ran).toEqual(["sweep:broken", "sweep:expire-leases:acme-janitor", "reconciler:tidy"]);
      const logged = warnings.mock.calls.map((call) => JSON.parse(String(call[0])));
      expect(logged).toEqual([
        expect.objectContaining({ level: "warn", module: "acme-janitor", sweep: "broken", error: "the janitor tripped" }),
      ]);
    } finally {
      warnings.mockRestore();
    }
  });

  it("leaves the sweeps out of compute.reconcile (a workflow's end)", async () => {
    ran.length = 0;
    expect(await compute.reconcile(env, store)).toBe(1);
    expect(ran).toEqual(["reconciler:tidy"]);
  });

  it("has the provision module register its stalled-workflow wake-up as a sweep (the entry names no module)", () => {
    const provision = defaultDeployment.registry.modules.find((m) => m.id === "provision");
    expect(provision?.sweeps?.map((s) => s.id)).toEqual(["wake-stalled-workflows"]);
  });
});
