// npm run bench: runs the benchmark sections in order and prints their figures. Not a test:
// nothing here asserts a timing; a section fails only when requests fail.
//
//   BENCH_CONCURRENCY   concurrent closed-loop clients (default 8)
//   BENCH_SECONDS       measured window per target, seconds (default 10)
//   BENCH_WARMUP        unrecorded warm-up per target, seconds (default 2)
//   DATABASE_URL        bench a real Postgres instead of the embedded PGlite
import os from "node:os";
import { apiSection } from "./api.ts";

export interface BenchContext {
  concurrency: number;
  seconds: number;
  warmupSeconds: number;
  /** DATABASE_URL when set; otherwise the section uses the embedded PGlite. */
  databaseUrl?: string;
  log(line: string): void;
  table(header: string[], rows: string[][]): void;
}

export interface BenchSection {
  title: string;
  /** Prints its figures through ctx; throws when the run is not valid (e.g. failed requests). */
  run(ctx: BenchContext): Promise<void>;
}

/** Sections in the order they run; later issues append theirs. */
const sections: BenchSection[] = [apiSection];

const ctx: BenchContext = {
  concurrency: positiveInt("BENCH_CONCURRENCY", 8),
  seconds: positiveNumber("BENCH_SECONDS", 10),
  warmupSeconds: positiveNumber("BENCH_WARMUP", 2, true),
  databaseUrl: process.env.DATABASE_URL || undefined,
  log: (line) => console.log(`  ${line}`),
  table(header, rows) {
    const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
    const line = (cells: string[]) => cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join("  ");
    console.log(`  ${line(header)}`);
    for (const row of rows) console.log(`  ${line(row)}`);
  },
};

const cpus = os.cpus();
const models = [...new Set(cpus.map((c) => c.model.trim()))].join(" / ") || "unknown model";
console.log("Better Compute bench");
console.log(`  node ${process.version} on ${os.platform()} ${os.arch()} (${os.release()})`);
console.log(`  ${os.availableParallelism()} CPUs: ${models}; ${(os.totalmem() / 2 ** 30).toFixed(1)} GiB RAM`);
console.log(`  database: ${ctx.databaseUrl ? `DATABASE_URL host ${databaseHost(ctx.databaseUrl)}` : "PGlite (embedded, in this process)"}`);
console.log(`  load: ${ctx.concurrency} concurrent clients (BENCH_CONCURRENCY), ${ctx.warmupSeconds} s warm-up (BENCH_WARMUP) + ${ctx.seconds} s measured (BENCH_SECONDS) per target`);
console.log(
  `  note: the load generator shares this machine's ${os.availableParallelism()} CPUs with wrangler dev (workerd) and the WebSocket bridge` +
    (ctx.databaseUrl ? "" : " and PGlite") +
    "; compare figures within one run, not as capacity.",
);

let failures = 0;
for (const [i, section] of sections.entries()) {
  console.log(`\n[${i + 1}/${sections.length}] ${section.title}`);
  const started = performance.now();
  try {
    await section.run(ctx);
  } catch (err) {
    failures++;
    console.log(`  FAILED: ${err instanceof Error ? err.message : String(err)}`);
  }
  console.log(`  (${((performance.now() - started) / 1000).toFixed(1)} s)`);
}
if (failures) {
  console.log(`\n${failures} of ${sections.length} section(s) failed`);
  process.exitCode = 1;
}

function databaseHost(url: string): string {
  try {
    return new URL(url).host || "(none)";
  } catch {
    return "(unparsable URL)";
  }
}

function positiveNumber(name: string, fallback: number, allowZero = false): number {
  const raw = process.env[name];
  if (raw === undefined || raw === "") return fallback;
  const value = Number(raw);
  if (!Number.isFinite(value) || value < 0 || (!allowZero && value === 0)) throw new Error(`${name} must be a ${allowZero ? "non-negative" : "positive"} number, got ${JSON.stringify(raw)}`);
  return value;
}

function positiveInt(name: string, fallback: number): number {
  const value = positiveNumber(name, fallback);
  if (!Number.isInteger(value)) throw new Error(`${name} must be a whole number, got ${JSON.stringify(process.env[name])}`);
  return value;
}
