// Section "cli": how long `better-compute` takes to answer as an operator types it. Each call is
// spawned BENCH_CLI_RUNS times, one at a time, against a local stack, and its median wall time is
// shown beside curl's for the same request (the API's own time plus a process start): --help
// (which lists the deployment's methods: GET /openapi.json), iam whoami and nodes list. Issue 33's
// target: a CLI call under 0.3 s. The CLI runs as its bin does (node scripts/better-compute.mjs:
// its prebuilt bundle, cli/bundle.mjs), after one unrecorded call that caches the method catalog
// (cli/catalog.ts); npx better-compute is shown once more for what npx itself adds.
//
// It also prints what the web console ships (core/console/assets.ts): its one script and its
// stylesheet, as sent and gzipped.
import { execFile } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { gzipSync } from "node:zlib";
import { CLIENT_JS, CSS } from "../core/console/assets.ts";
import { repoRoot } from "../local/node-store.ts";
import { percentile } from "./load.ts";
import type { BenchSection } from "./run.ts";
import { ms, target, withStack } from "./stack.ts";

const TARGET_MS = 300;
const run = promisify(execFile);

interface Call {
  label: string;
  cli: string[];
  /** curl's arguments for the same request, after the URL's path. */
  curl: { path: string; post?: boolean };
}

const CALLS: Call[] = [
  { label: "--help", cli: ["--help"], curl: { path: "/openapi.json" } },
  { label: "iam whoami", cli: ["iam", "whoami"], curl: { path: "/v1/iam.whoami", post: true } },
  { label: "nodes list", cli: ["nodes", "list"], curl: { path: "/v1/nodes.list", post: true } },
];

export const cliSection: BenchSection = {
  id: "cli",
  title: `CLI: wall time of better-compute beside curl's for the same request (median of BENCH_CLI_RUNS), target under ${TARGET_MS / 1000} s`,
  async run(ctx) {
    const cacheHome = fs.mkdtempSync(path.join(os.tmpdir(), "bc-bench-cli-cache-"));
    try {
      await withStack(ctx, "cli", async (stack) => {
        const env = { ...process.env, BC_URL: stack.url, BC_API_KEY: stack.adminKey, XDG_CACHE_HOME: cacheHome };
        const bin = path.join(repoRoot, "scripts", "better-compute.mjs");
        const cli = (args: string[]) => run(process.execPath, [bin, ...args], { env, cwd: repoRoot });
        const npx = (args: string[]) => run("npx", ["better-compute", ...args], { env, cwd: repoRoot });
        const curl = ({ path: route, post }: Call["curl"]) =>
          run("curl", [
            "-sSf",
            "-o",
            "/dev/null",
            ...(post
              ? ["-X", "POST", "-H", `authorization: Bearer ${stack.adminKey}`, "-H", "content-type: application/json", "-d", "{}"]
              : []),
            `${stack.url}${route}`,
          ]);
        // Unrecorded: builds the bundle if a source changed since, and caches the method catalog.
        const first = await timed(() => cli(["iam", "whoami"]));
        ctx.log(`first call, with nothing cached: ${ms(first)} ms (unrecorded)`);

        const rows: string[][] = [];
        const verdicts: string[] = [];
        for (const call of CALLS) {
          const cliMs = await median(ctx.cli.runs, () => cli(call.cli));
          const curlMs = await median(ctx.cli.runs, () => curl(call.curl));
          rows.push([
            `better-compute ${call.label}`,
            ms(cliMs),
            `${call.curl.post ? "POST" : "GET"} ${call.curl.path}`,
            ms(curlMs),
            ms(cliMs - curlMs),
          ]);
          verdicts.push(
            `better-compute ${call.label}: ${(cliMs / 1000).toFixed(3)} s ${target(`< ${TARGET_MS / 1000} s`, cliMs < TARGET_MS)}`,
          );
        }
        const npxMs = await median(ctx.cli.runs, () => npx(["iam", "whoami"]));
        rows.push(["npx better-compute iam whoami", ms(npxMs), "(npx resolving the bin first)", "", ""]);
        ctx.table(["call", "CLI ms", "curl: the same request", "curl ms", "CLI − curl ms"], rows);
        for (const line of verdicts) ctx.log(line);
      });
      const gz = (text: string) => gzipSync(text).length;
      ctx.log(
        `the web console ships ${CLIENT_JS.length} bytes of JavaScript (${gz(CLIENT_JS)} gzipped) and ${CSS.length} bytes of CSS (${gz(CSS)} gzipped), no framework`,
      );
    } finally {
      fs.rmSync(cacheHome, { recursive: true, force: true });
    }
  },
};

async function timed(fn: () => Promise<unknown>): Promise<number> {
  const started = performance.now();
  await fn();
  return performance.now() - started;
}

/** The median wall time of `runs` calls of fn, one at a time. */
async function median(runs: number, fn: () => Promise<unknown>): Promise<number> {
  const times: number[] = [];
  for (let i = 0; i < runs; i++) times.push(await timed(fn));
  return percentile(
    times.sort((a, b) => a - b),
    0.5,
  );
}
