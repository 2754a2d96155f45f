// Workflow throughput: batches of 1, 10 and 100 workflows of ten control-plane steps started
// at once, timed until the whole batch has finished; and Postgres round trips per step, counted
// by the embedded PGlite (each group of client messages answered is one round trip).
import { sql } from "drizzle-orm";
import { openNodeStore } from "../scripts/local/node-store.ts";
import type { BenchContext, BenchSection } from "./run.ts";
import { callApi, mapLimit, ms, withStack } from "./stack.ts";

const STEPS = 10;
const POLL_MS = 25;

export const workflowsSection: BenchSection = {
  id: "workflows",
  title: "Workflow throughput: ten control-plane steps, 1, 10 and 100 running at once",
  async run(ctx: BenchContext) {
    ctx.log(
      "a batch of N workflows is started at once (workflows.start, 20 requests in flight); figures run from the first start to the last finish",
    );
    await withStack(ctx, "workflows", async (stack) => {
      const observer = await openNodeStore(stack.databaseUrl);
      try {
        // Warm-up: one workflow through every path once.
        await batch(1);
        const rows: string[][] = [];
        for (const size of ctx.workflows.batches) {
          const runs = size === 1 ? 5 : 1;
          let completed = 0;
          let elapsed = 0;
          let roundTrips = 0;
          let observerTrips = 0;
          for (let r = 0; r < runs; r++) {
            const m = await batch(size);
            completed += size;
            elapsed += m.elapsedMs;
            roundTrips += m.roundTrips;
            observerTrips += m.polls;
          }
          const perStep = stack.databaseStats ? ((roundTrips - observerTrips) / (completed * STEPS)).toFixed(1) : "-";
          rows.push([
            String(size),
            String(completed),
            ms(elapsed / runs),
            (completed / (elapsed / 1000)).toFixed(1),
            ((completed * STEPS) / (elapsed / 1000)).toFixed(0),
            perStep,
          ]);
        }
        ctx.table(["running at once", "workflows", "batch ms", "workflows/s", "steps/s", "round trips/step"], rows);
        ctx.log(
          "round trips/step: every Postgres round trip of the batch (workflows.start requests and the WorkflowDOs) per step, the bench's own polling subtracted",
        );
        if (!stack.databaseStats) ctx.log("(round trips are counted by the embedded PGlite only; unset DATABASE_URL to see them)");
      } finally {
        await observer.close();
      }

      async function batch(size: number): Promise<{ elapsedMs: number; roundTrips: number; polls: number }> {
        const started = performance.now();
        const tripsAtStart = stack.databaseStats?.roundTrips ?? 0;
        const ids = await mapLimit(
          Array.from({ length: size }, (_, i) => i),
          20,
          async (i) => (await callApi<{ id: string }>(stack, "workflows.start", { profile: "bench.tenSteps", target: `bench-${i}` })).id,
        );
        let polls = 0;
        for (;;) {
          polls++;
          const result = await observer.db.execute(sql`
            SELECT count(*) FILTER (WHERE state = 'running')::int AS running, count(*) FILTER (WHERE state = 'failed')::int AS failed
            FROM workflows WHERE id = ANY(${`{${ids.join(",")}}`}::text[])`);
          const { running, failed } = result.rows[0] as { running: number; failed: number };
          if (failed > 0) throw new Error(`${failed} bench workflows failed`);
          if (running === 0) break;
          if (performance.now() - started > 120_000) throw new Error(`${running} of ${size} workflows still running after 120 s`);
          await new Promise((r) => setTimeout(r, POLL_MS));
        }
        return { elapsedMs: performance.now() - started, roundTrips: (stack.databaseStats?.roundTrips ?? 0) - tripsAtStart, polls };
      }
    });
  },
};
