// Section "API": requests per second and p50/p99 latency of an authenticated read method
// (POST /v1/iam.whoami: API key lookup, IAM, an empty read-only transaction, zod on both
// sides) under `wrangler dev`, beside a bare hono route on the same Worker that opens the
// store the same way and runs one SELECT 1 (GET /bench/select1). The ratio between them is
// what the platform's envelope costs over the cheapest possible database round trip; the ratio
// to the no-database route (GET /bench/noop) is what the database path costs at all.
import { cpuLine, runLoad, type LoadResult, type LoadTarget } from "./load.ts";
import { profileLines, profileWorker } from "./profile.ts";
import { printQueryStats, readQueryStats, type QueryKindStats } from "./query-stats.ts";
import type { BenchSection } from "./run.ts";
import { ms, target, withStack } from "./stack.ts";

export const apiSection: BenchSection = {
  id: "api",
  title: "API under wrangler dev: authenticated read vs bare SELECT 1",
  async run(ctx) {
    await withStack(ctx, "api", async (stack) => {
      const api: LoadTarget = {
        label: "POST /v1/iam.whoami (API)",
        url: `${stack.url}/v1/iam.whoami`,
        method: "POST",
        headers: { authorization: `Bearer ${stack.adminKey}`, "content-type": "application/json" },
        body: "{}",
      };
      const bare: LoadTarget = { label: "GET /bench/select1 (bare)", url: `${stack.url}/bench/select1` };
      const floor: LoadTarget = { label: "GET /bench/noop (no database)", url: `${stack.url}/bench/noop` };
      await expectOk(api, (body) => typeof (body as { principal?: unknown }).principal === "string");
      await expectOk(bare, (body) => (body as { one?: unknown }).one === 1);
      await expectOk(floor, (body) => (body as { ok?: unknown }).ok === true);

      const results: LoadResult[] = [];
      const cpu: string[] = [];
      const queries: [string, QueryKindStats[]][] = [];
      // The floor, the baseline, then the API: each gets its own warm-up and measured window.
      for (const target of [floor, bare, api]) {
        await readQueryStats(stack.url, true);
        const result = await runLoad(target, { concurrency: ctx.concurrency, warmupSeconds: ctx.warmupSeconds, seconds: ctx.seconds });
        cpu.push(`${target.label}: ${cpuLine(result.cpu)}`);
        queries.push([target.label, await readQueryStats(stack.url, true)]);
        results.push(result);
      }
      const [floorResult, bareResult, apiResult] = results as [LoadResult, LoadResult, LoadResult];

      ctx.table(
        ["target", "requests", "errors", "req/s", "p50 ms", "p90 ms", "p99 ms", "max ms"],
        [apiResult, bareResult, floorResult].map((r) => [
          r.label,
          String(r.requests),
          String(r.errors),
          r.rps.toFixed(0),
          ms(r.p50),
          ms(r.p90),
          ms(r.p99),
          ms(r.max),
        ]),
      );
      ctx.log(
        `ratio API / bare: req/s ${(apiResult.rps / bareResult.rps).toFixed(2)}×, p50 ${(apiResult.p50 / bareResult.p50).toFixed(2)}×, p99 ${(apiResult.p99 / bareResult.p99).toFixed(2)}×` +
          ` (p50 ${signed(apiResult.p50 - bareResult.p50)} ms; the bare route's p50 is ${signed(bareResult.p50 - floorResult.p50)} ms over no database)`,
      );
      // Issue 14's target: the authenticated read within 2× the no-database route's p50, at 0.5× its req/s or more.
      const p50Ratio = apiResult.p50 / floorResult.p50;
      const rpsRatio = apiResult.rps / floorResult.rps;
      ctx.log(
        `ratio API / no database: req/s ${rpsRatio.toFixed(2)}× ${target("≥ 0.5×", rpsRatio >= 0.5)}, ` +
          `p50 ${p50Ratio.toFixed(2)}× ${target("≤ 2×", p50Ratio <= 2)}, p99 ${(apiResult.p99 / floorResult.p99).toFixed(2)}×`,
      );
      ctx.log(
        `database path: ${stack.databasePath === "hyperdrive" ? `HYPERDRIVE binding (TCP${stack.pooled ? ", pgbouncer transaction pooling" : ", a connection per request"})` : "WebSocket bridge (a connection per request)"}`,
      );
      ctx.log("CPU during each measured window (100% = one core):");
      for (const line of cpu) ctx.log(`  ${line}`);
      ctx.log("where the database time goes, per query kind (the Worker's round trips, warm-up and window; ms from send to answer):");
      for (const [label, stats] of queries.slice(1)) printQueryStats(ctx, label, stats);

      // Not in the figures above: the profiler slows what it samples.
      if (ctx.profile) {
        for (const target of [floor, api]) {
          const { result, profile } = await profileWorker(stack.inspectorPort, stack.bundleFile, () =>
            runLoad(target, { concurrency: ctx.concurrency, warmupSeconds: 0, seconds: ctx.seconds }),
          );
          ctx.log(`profiled window, ${target.label}: ${result.requests} requests`);
          for (const line of profileLines(profile, result.requests, "req")) ctx.log(`  ${line}`);
        }
      }

      const failed = results.filter((r) => r.errors > 0 || r.requests === 0);
      if (failed.length) {
        for (const r of failed) {
          ctx.log(
            `ERROR ${r.label}: ${r.errors} of ${r.requests} requests failed${r.errorSamples.length ? `; e.g.\n    ${r.errorSamples.join("\n    ")}` : ""}`,
          );
        }
        const tail = stack.wranglerTail();
        if (tail.length) ctx.log(`last wrangler output:\n    ${tail.join("\n    ")}`);
        throw new Error("requests failed under load (see above)");
      }
    });
  },
};

/** One request before the load: the route answers 200 with the expected body. */
async function expectOk(target: LoadTarget, check: (body: unknown) => boolean): Promise<void> {
  const res = await fetch(target.url, { method: target.method, headers: target.headers, body: target.body });
  const text = await res.text();
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    body = undefined;
  }
  if (res.status !== 200 || !check(body)) throw new Error(`${target.label} answered ${res.status}: ${text.slice(0, 300)}`);
}

function signed(value: number): string {
  return `${value >= 0 ? "+" : ""}${value.toFixed(2)}`;
}
