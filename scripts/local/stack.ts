// The embedded local stack, as `npm start`, the start test and the benchmarks run it:
// PGlite (or DATABASE_URL) → WebSocket bridge → migrations → `wrangler dev`, then an admin key.
import { spawn, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { applyMigrations } from "../../core/store/migrate.ts";
import { coreMigrations, openNodeStore, repoRoot } from "./node-store.ts";
import { startPglite } from "./pglite-server.ts";
import { startBridge } from "./ws-bridge.ts";

export interface StackOptions {
  /** Where PGlite's data, the deployment secret and wrangler's state live (e.g. .data). */
  dataDir: string;
  /** Port for the API; default a free one. */
  port?: number;
  /** A real Postgres instead of the embedded PGlite. */
  databaseUrl?: string;
  /** wrangler config of the Worker to run; default the repository's wrangler.toml. */
  wranglerConfig?: string;
  /** The Worker's entry instead of the config's `main` (a deployment with test plugins; its modules' migrations must be the default config's). */
  main?: string;
  /** Lines wrangler prints (default: dropped). */
  onOutput?: (line: string) => void;
}

export interface Stack {
  url: string;
  adminKey: string;
  databaseUrl: string;
  /** Whether the database is the embedded PGlite. */
  embedded: boolean;
  /** The embedded PGlite's counters (round trips, connections); absent on DATABASE_URL. */
  databaseStats?: { connections: number; roundTrips: number };
  stop(): Promise<void>;
}

export async function startStack(options: StackOptions): Promise<Stack> {
  const dataDir = path.resolve(options.dataDir);
  fs.mkdirSync(dataDir, { recursive: true });
  const cleanup: Array<() => Promise<unknown>> = [];
  const stop = async () => {
    for (const step of cleanup.reverse()) await step().catch(() => {});
    cleanup.length = 0;
  };
  try {
    const pglite = options.databaseUrl ? undefined : await startPglite({ dataDir: path.join(dataDir, "pglite") });
    if (pglite) cleanup.push(() => pglite.stop());
    const databaseUrl = options.databaseUrl ?? pglite!.connectionString;
    const bridge = await startBridge();
    cleanup.push(() => bridge.stop());

    const { compute } = await import("../../better-compute.config.ts");
    const store = await openNodeStore(databaseUrl, { bridge: bridge.url });
    let adminKey: string;
    try {
      await applyMigrations(store, [...coreMigrations(), ...compute.migrations()]);
      adminKey = (await compute.mintApiKey(store, { name: "npm start", roles: ["admin"], createdBy: "system:npm-start" })).key;
    } finally {
      await store.close();
    }

    const envFile = path.join(dataDir, "dev.env");
    const vars = { DATABASE_URL: databaseUrl, BC_DB_WS_PROXY: bridge.url, BC_SECRET: deploymentSecret(dataDir) };
    fs.writeFileSync(envFile, Object.entries(vars).map(([k, v]) => `${k}=${v}\n`).join(""), { mode: 0o600 });

    const port = options.port ?? (await freePort());
    const wrangler = spawn(
      process.execPath,
      [
        path.join(repoRoot, "node_modules", "wrangler", "bin", "wrangler.js"),
        "dev",
        ...(options.main ? [options.main] : []),
        "--config", options.wranglerConfig ?? path.join(repoRoot, "wrangler.toml"),
        "--ip", "127.0.0.1",
        "--port", String(port),
        "--inspector-port", String(await freePort()),
        "--env-file", envFile,
        "--persist-to", path.join(dataDir, "wrangler"),
        "--show-interactive-dev-session=false",
        "--log-level", "warn",
      ],
      { cwd: repoRoot, env: { ...process.env, WRANGLER_SEND_METRICS: "false", CLOUDFLARE_CF_FETCH_ENABLED: "false", CI: "true" }, stdio: ["ignore", "pipe", "pipe"] },
    );
    cleanup.push(() => stopProcess(wrangler));
    const output: string[] = [];
    for (const stream of [wrangler.stdout!, wrangler.stderr!]) {
      stream.setEncoding("utf8");
      stream.on("data", (chunk: string) => {
        for (const line of chunk.split("\n").filter(Boolean)) {
          output.push(line);
          if (output.length > 50) output.shift();
          options.onOutput?.(line);
        }
      });
    }
    const url = `http://127.0.0.1:${port}`;
    await waitForHealth(url, wrangler, output);
    return { url, adminKey, databaseUrl, embedded: !options.databaseUrl, ...(pglite ? { databaseStats: pglite.stats } : {}), stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** The deployment secret of a local stack: made once, kept in the data dir. */
function deploymentSecret(dataDir: string): string {
  const file = path.join(dataDir, "secret");
  if (!fs.existsSync(file)) {
    fs.writeFileSync(file, Buffer.from(crypto.getRandomValues(new Uint8Array(32))).toString("base64url"), { mode: 0o600 });
  }
  return fs.readFileSync(file, "utf8").trim();
}

async function waitForHealth(url: string, child: ChildProcess, output: string[]): Promise<void> {
  const deadline = Date.now() + 90_000;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`wrangler dev exited with ${child.exitCode}:\n${output.join("\n")}`);
    try {
      const res = await fetch(`${url}/v1/health`, { signal: AbortSignal.timeout(5_000) });
      if (res.status === 200) return;
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 250));
  }
  throw new Error(`wrangler dev did not become healthy within 90 s:\n${output.join("\n")}`);
}

function stopProcess(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const force = setTimeout(() => child.kill("SIGKILL"), 5_000);
    child.once("exit", () => {
      clearTimeout(force);
      resolve();
    });
    child.kill("SIGTERM");
  });
}

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}
