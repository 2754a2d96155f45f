// What every bench section does around its measurements: start the local stack (PGlite or
// DATABASE_URL → WebSocket bridge → migrations → `wrangler dev` → an admin key) in a temp dir
// of its own, keep the last lines wrangler printed for error reports, and stop it all
// afterwards, also on Ctrl-C. Each section gets a fresh stack so its figures (and workerd's
// memory) do not carry what an earlier section left behind.
//
// The Worker is bundled once per run (`wrangler deploy --dry-run --outdir`) and every section's
// `wrangler dev` serves that frozen bundle (no_bundle): a source file saved during the run
// (an editor, a concurrent checkout) neither rebuilds nor restarts the Worker mid-measurement,
// which would drop every agent's socket. All sections run the same code.
import { execFile } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import pg from "pg";
import { callApi as callAsAdmin } from "../testing/metal-sim-control-plane.ts";
import { repoRoot } from "../local/node-store.ts";
import { startStack, type Stack } from "../local/stack.ts";
import type { BenchContext } from "./run.ts";

const here = path.dirname(fileURLToPath(import.meta.url));

let bundled: Promise<string> | undefined;

/**
 * One deployment secret for every section's stack: on DATABASE_URL the sections share one
 * database, and what one seals (the credential-signing key) the next must be able to open.
 */
const runSecret = Buffer.from(crypto.getRandomValues(new Uint8Array(32))).toString("base64url");

/** Bundles bench/wrangler.toml's Worker once; resolves with a wrangler config serving that bundle as is. */
function frozenConfig(): Promise<string> {
  return (bundled ??= (async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "bc-bench-bundle-"));
    process.once("exit", () => fs.rmSync(dir, { recursive: true, force: true }));
    const source = path.join(here, "wrangler.toml");
    await promisify(execFile)(
      process.execPath,
      [
        path.join(repoRoot, "node_modules", "wrangler", "bin", "wrangler.js"),
        "deploy",
        "--dry-run",
        "--outdir",
        path.join(dir, "bundle"),
        "--config",
        source,
      ],
      { cwd: repoRoot, env: { ...process.env, WRANGLER_SEND_METRICS: "false", CI: "true" }, maxBuffer: 16 * 2 ** 20 },
    );
    const main = path.join(dir, "bundle", "worker.js");
    if (!fs.existsSync(main)) throw new Error(`wrangler deploy --dry-run wrote no ${main}`);
    // Same config (bindings, migrations), pointed at the bundle and told not to bundle again.
    const toml = fs.readFileSync(source, "utf8");
    if (!/^main = "worker\.ts"$/m.test(toml)) throw new Error(`${source}: expected the line main = "worker.ts"`);
    const config = path.join(dir, "wrangler.toml");
    fs.writeFileSync(config, toml.replace(/^main = "worker\.ts"$/m, 'main = "bundle/worker.js"\nno_bundle = true'));
    return config;
  })());
}

export interface BenchStack extends Stack {
  /** The bundle wrangler dev serves (bench/profile.ts maps a profile's lines to modules with it). */
  bundleFile: string;
  /** The last lines wrangler dev printed (warnings and errors: it runs with --log-level warn). */
  wranglerTail(): string[];
}

/** A section's stack's data dir (temporary), holding the run's deployment secret. */
export function benchDataDir(name: string): string {
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), `bc-bench-${name}-`));
  fs.writeFileSync(path.join(dataDir, "secret"), runSecret, { mode: 0o600 });
  return dataDir;
}

export async function withStack<T>(
  ctx: BenchContext,
  name: string,
  fn: (stack: BenchStack) => Promise<T>,
  options: { onOutput?: (line: string) => void } = {},
): Promise<T> {
  const dataDir = benchDataDir(name);
  const lines: string[] = [];
  let stack: Stack | undefined;
  const interrupted = async () => {
    await stack?.stop();
    fs.rmSync(dataDir, { recursive: true, force: true });
    process.exit(130);
  };
  process.once("SIGINT", interrupted);
  try {
    const first = !bundled;
    const bundling = performance.now();
    const wranglerConfig = await frozenConfig();
    if (first)
      ctx.log(`Worker bundled in ${((performance.now() - bundling) / 1000).toFixed(1)} s (once per run; every section serves this bundle)`);
    const started = performance.now();
    stack = await startStack({
      dataDir,
      databaseUrl: ctx.databaseUrl,
      wranglerConfig,
      onOutput: (line) => {
        options.onOutput?.(line);
        lines.push(line);
        if (lines.length > 20) lines.shift();
      },
    });
    ctx.log(
      `stack up in ${((performance.now() - started) / 1000).toFixed(1)} s (wrangler dev at ${stack.url} → ${stack.databasePath === "hyperdrive" ? `HYPERDRIVE binding (local: TCP${stack.pooled ? " to pgbouncer, transaction pooling" : ""})` : "WebSocket bridge"} → ${stack.embedded ? "PGlite" : "DATABASE_URL"})`,
    );
    const bundleFile = path.join(path.dirname(wranglerConfig), "bundle", "worker.js");
    return await fn({ ...stack, bundleFile, wranglerTail: () => [...lines] });
  } finally {
    process.off("SIGINT", interrupted);
    await stack?.stop();
    fs.rmSync(dataDir, { recursive: true, force: true });
  }
}

/** Calls an API method with the stack's admin key; anything but a 200 throws with the API's code. */
export const callApi = <T = Record<string, unknown>>(stack: Stack, method: string, input: Record<string, unknown>): Promise<T> =>
  callAsAdmin<T>(stack.url, stack.adminKey, method, input);

/** Runs fn over items with at most `limit` at a time; the first rejection rejects (the rest still settle). */
export async function mapLimit<I, O>(items: readonly I[], limit: number, fn: (item: I, index: number) => Promise<O>): Promise<O[]> {
  const out = new Array<O>(items.length);
  let next = 0;
  let failed: { error: unknown } | undefined;
  const worker = async () => {
    while (!failed && next < items.length) {
      const i = next++;
      try {
        out[i] = await fn(items[i]!, i);
      } catch (error) {
        failed ??= { error };
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  if (failed) throw failed.error;
  return out;
}

export const ms = (value: number) => (Number.isFinite(value) ? value.toFixed(2) : "-");
/** Issue 14's verdict on a figure, printed beside it: "(target ≤ 2×: met)". */
export const target = (goal: string, met: boolean) => `(target ${goal}: ${met ? "met" : "not met"})`;
export const seconds = (fromMs: number) => ((performance.now() - fromMs) / 1000).toFixed(1);

/** Drops and recreates DATABASE_URL's public schema: a run's own (run.ts claimed it), emptied for the next stack's migrations. */
export async function emptyPublicSchema(url: string): Promise<void> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    await client.query("DROP SCHEMA public CASCADE; CREATE SCHEMA public");
  } finally {
    await client.end();
  }
}
