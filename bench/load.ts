// A small closed-loop load generator: N clients, each sending its next request as soon as
// the previous one answered, over keep-alive connections (Node's fetch keeps them open and
// pools them per origin by default). It runs in a worker thread so that its event loop does
// not share a thread with what the bench process hosts itself (PGlite and the WS bridge).
import { isMainThread, parentPort, Worker, workerData } from "node:worker_threads";
import { processStats } from "./proc.ts";

export interface LoadTarget {
  /** How the figure is labelled, e.g. "POST /v1/iam.whoami". */
  label: string;
  url: string;
  method?: string;
  headers?: Record<string, string>;
  body?: string;
}

export interface LoadOptions {
  concurrency: number;
  /** Requests sent (and not recorded) before measuring, to open connections and warm caches. */
  warmupSeconds: number;
  /** How long the measured window lasts. */
  seconds: number;
}

export interface LoadResult {
  label: string;
  /** Answered requests that started inside the measured window. */
  requests: number;
  /** Of those, the ones that were not a 200 or did not get an answer. */
  errors: number;
  /** Up to 5 distinct error descriptions (status and the start of the body, or the exception). */
  errorSamples: string[];
  /** Measured window: from its start to the last recorded answer. */
  elapsedSeconds: number;
  rps: number;
  /** Latencies in ms, nearest-rank percentiles over every recorded request. */
  p50: number;
  p90: number;
  p99: number;
  max: number;
}

/**
 * Runs the load in a fresh worker thread and resolves with its figures, plus the CPU each
 * process of this process tree spent during the measured window (Linux; empty elsewhere).
 */
export function runLoad(target: LoadTarget, options: LoadOptions): Promise<LoadResult & { cpu: CpuShare[] }> {
  return new Promise((resolve, reject) => {
    const worker = new Worker(new URL(import.meta.url), { workerData: { benchLoad: { target, options } } });
    let before: { at: number; snapshot: CpuSnapshot } | undefined;
    let result: (LoadResult & { cpu: CpuShare[] }) | undefined;
    worker.on("message", (message: { measuring: true } | { result: LoadResult }) => {
      if ("measuring" in message) {
        before = { at: performance.now(), snapshot: cpuSnapshot() };
      } else {
        const cpu = before ? cpuShares(before.snapshot, cpuSnapshot(), (performance.now() - before.at) / 1000) : [];
        result = { ...message.result, cpu };
      }
    });
    worker.once("error", reject);
    worker.once("exit", (code) =>
      result ? resolve(result) : reject(new Error(`the load generator exited with ${code} before reporting`)),
    );
  });
}

/** Nearest-rank percentile of an ascending array. */
export function percentile(sorted: ArrayLike<number>, p: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(p * sorted.length) - 1))]!;
}

async function generate(target: LoadTarget, options: LoadOptions): Promise<LoadResult> {
  const init: RequestInit = { method: target.method ?? "GET", headers: target.headers, body: target.body };
  const start = performance.now();
  const measureFrom = start + options.warmupSeconds * 1000;
  const measureUntil = measureFrom + options.seconds * 1000;
  let latencies = new Float64Array(1 << 16);
  let recorded = 0;
  let errors = 0;
  let lastAnswer = measureFrom;
  const samples = new Set<string>();
  let announced = false;

  const record = (ms: number, ok: boolean, end: number) => {
    if (recorded === latencies.length) {
      const grown = new Float64Array(latencies.length * 2);
      grown.set(latencies);
      latencies = grown;
    }
    latencies[recorded++] = ms;
    if (!ok) errors++;
    if (end > lastAnswer) lastAnswer = end;
  };

  const client = async () => {
    for (;;) {
      const t0 = performance.now();
      if (t0 >= measureUntil) return;
      if (!announced && t0 >= measureFrom) {
        announced = true;
        parentPort?.postMessage({ measuring: true });
      }
      let ok = false;
      let problem: string | undefined;
      try {
        const res = await fetch(target.url, init);
        const text = await res.text();
        ok = res.status === 200;
        if (!ok) problem = `HTTP ${res.status}: ${text.slice(0, 200)}`;
      } catch (err) {
        problem = `${err instanceof Error ? `${err.name}: ${err.message}` : String(err)}${err instanceof Error && err.cause ? ` (${String(err.cause)})` : ""}`;
      }
      const t1 = performance.now();
      if (problem && samples.size < 5) samples.add(problem);
      if (t0 >= measureFrom) record(t1 - t0, ok, t1);
    }
  };
  await Promise.all(Array.from({ length: options.concurrency }, client));

  const sorted = latencies.subarray(0, recorded).sort();
  const elapsedSeconds = (lastAnswer - measureFrom) / 1000;
  return {
    label: target.label,
    requests: recorded,
    errors,
    errorSamples: [...samples],
    elapsedSeconds,
    rps: elapsedSeconds > 0 ? recorded / elapsedSeconds : 0,
    p50: percentile(sorted, 0.5),
    p90: percentile(sorted, 0.9),
    p99: percentile(sorted, 0.99),
    max: recorded ? sorted[recorded - 1]! : NaN,
  };
}

const job = isMainThread ? undefined : (workerData as { benchLoad?: { target: LoadTarget; options: LoadOptions } } | undefined)?.benchLoad;
if (job) {
  parentPort!.postMessage({ result: await generate(job.target, job.options) });
}

export interface CpuShare {
  /** "bench (node)" for this process (load generator, and PGlite and the bridge when embedded), else the process name. */
  name: string;
  /** Of one core: 100 = one core busy for the whole window. */
  percent: number;
}

export type CpuSnapshot = Map<number, { name: string; seconds: number }>;

/** CPU time (user + system, in seconds) of this process and each of its descendants, by pid. Linux only; empty elsewhere. */
export function cpuSnapshot(root = process.pid): CpuSnapshot {
  return new Map(processStats(root).map((p) => [p.pid, { name: p.pid === root ? "bench (node)" : p.name, seconds: p.cpuSeconds }]));
}

/** CPU per process name between two snapshots, busiest first, leaving out those under 1%. */
export function cpuShares(before: CpuSnapshot, after: CpuSnapshot, seconds: number): CpuShare[] {
  if (after.size === 0 || seconds <= 0) return [];
  const byName = new Map<string, number>();
  for (const [pid, now] of after) {
    byName.set(now.name, (byName.get(now.name) ?? 0) + now.seconds - (before.get(pid)?.seconds ?? 0));
  }
  return [...byName]
    .map(([name, used]) => ({ name, percent: (used / seconds) * 100 }))
    .filter((share) => share.percent >= 1)
    .sort((a, b) => b.percent - a.percent);
}

/** One line: each process's share of one core, and the total (e.g. "workerd 80%, bench (node) 45%, total 125%"). */
export function cpuLine(shares: CpuShare[]): string {
  if (shares.length === 0) return "n/a (no /proc)";
  const total = shares.reduce((sum, share) => sum + share.percent, 0);
  return [...shares.map((share) => `${share.name} ${share.percent.toFixed(0)}%`), `total ${total.toFixed(0)}%`].join(", ");
}
