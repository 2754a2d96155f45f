// Workflow throughput: batches of 1, 10 and 100 workflows of ten control-plane steps started
// at once, timed until the whole batch has finished; and Postgres round trips per step, counted
// at the driver by the bench Worker's round-trip hook (GET /bench/query-stats), on either database.
import { sql } from "drizzle-orm";
import { one } from "../core/store/database.ts";
import { openNodeStore } from "../local/node-store.ts";
import { mergeQueries, printQueryStats, readQueryStats, type QueryKindStats } from "./query-stats.ts";
import type { BenchContext, BenchSection } from "./run.ts";
import { callApi, mapLimit, ms, target, withStack } from "./stack.ts";

const STEPS = 10;
const POLL_MS = 25;
/** Issue 14's target for a step's round trips (begin and finish, plus a command's enqueue). */
const STEP_ROUND_TRIPS_TARGET = 4;

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
        let largest: { size: number; steps: number; queries: QueryKindStats[] } | undefined;
        for (const size of ctx.workflows.batches) {
          const runs = size === 1 ? 5 : 1;
          let completed = 0;
          let elapsed = 0;
          const perRun: QueryKindStats[][] = [];
          for (let r = 0; r < runs; r++) {
            const m = await batch(size);
            completed += size;
            elapsed += m.elapsedMs;
            perRun.push(m.queries);
          }
          const queries = mergeQueries(perRun);
          if (!largest || size >= largest.size) largest = { size, steps: completed * STEPS, queries };
          const perStep = (roundTrips(queries) / (completed * STEPS)).toFixed(1);
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
          "round trips/step: every Postgres round trip of the batch's workflows.start requests and WorkflowDOs (the bench Worker's stores, counted at the driver) per step",
        );
        if (largest) {
          const perStep = roundTrips(largest.queries) / largest.steps;
          ctx.log(
            `a control-plane step, ${largest.size} running at once: ${perStep.toFixed(1)} round trips ${target(`≤ ${STEP_ROUND_TRIPS_TARGET}`, perStep <= STEP_ROUND_TRIPS_TARGET)}`,
          );
          printQueryStats(ctx, `${largest.size} running at once, round trips by query kind`, largest.queries, {
            count: largest.steps,
            unit: "step",
          });
        }
      } finally {
        await observer.close();
      }

      async function batch(size: number): Promise<{ elapsedMs: number; queries: QueryKindStats[] }> {
        await readQueryStats(stack.url, true);
        const started = performance.now();
        const ids = await mapLimit(
          Array.from({ length: size }, (_, i) => i),
          20,
          async (i) => (await callApi<{ id: string }>(stack, "workflows.start", { profile: "bench.tenSteps", target: `bench-${i}` })).id,
        );
        for (;;) {
          const { running, failed } = (await one<{ running: number; failed: number }>(
            observer.db,
            sql`
            SELECT count(*) FILTER (WHERE state = 'running')::int AS running, count(*) FILTER (WHERE state = 'failed')::int AS failed
            FROM workflows WHERE id = ANY(${`{${ids.join(",")}}`}::text[])`,
          ))!;
          if (failed > 0) throw new Error(`${failed} bench workflows failed`);
          if (running === 0) break;
          if (performance.now() - started > 120_000) throw new Error(`${running} of ${size} workflows still running after 120 s`);
          await new Promise((r) => setTimeout(r, POLL_MS));
        }
        const elapsedMs = performance.now() - started;
        return { elapsedMs, queries: await readQueryStats(stack.url, true) };
      }
    });
  },
};

const roundTrips = (queries: QueryKindStats[]) => queries.reduce((n, q) => n + q.count, 0);
