// The embedded local stack, as `npm start`, the start test and the benchmarks run it: the data
// dir's lock, PGlite (or DATABASE_URL) → WebSocket bridge → migrations and the admin key →
// `wrangler dev`, then the config's crons fired locally and <dataDir>/local.json for the CLI.
// The Worker reaches the database as in production, through a HYPERDRIVE binding (wrangler dev's
// emulation: TCP straight to the database); BC_LOCAL_DB=websocket keeps the WebSocket bridge path.
import { spawn, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { createInterface } from "node:readline";
import type { Compute } from "../core/compute.ts";
import { redact } from "../core/log.ts";
import type { Store } from "../core/store/database.ts";
import { applyMigrations } from "../core/store/migrate.ts";
import { cronsOfConfig, parseCron, scheduleCrons, type Cron } from "./cron.ts";
import { coreMigrations, openNodeStore, repoRoot } from "./node-store.ts";
import { hyperdriveCanReach, localHyperdrive } from "./hyperdrive.ts";
import { startPglite } from "./pglite-server.ts";
import { pgbouncerBinary, startPooler } from "./pooler.ts";
import { startBridge } from "./ws-bridge.ts";
import { stopChild } from "./child.ts";

export interface StackOptions {
  /** Where PGlite's data, the deployment secret, the admin key and wrangler's state live (e.g. .data). One stack at a time uses it (its lock file). */
  dataDir: string;
  /** Port for the API; default a free one. A given port that is busy refuses the start before anything is written. */
  port?: number;
  /** A real Postgres instead of the embedded PGlite. */
  databaseUrl?: string;
  /**
   * How the Worker reaches the database: "hyperdrive" (default; a HYPERDRIVE binding, as production
   * with Hyperdrive) or "websocket" (DATABASE_URL through the WebSocket bridge, as production without).
   * Default: env BC_LOCAL_DB, else "hyperdrive".
   */
  databasePath?: DatabasePath;
  /**
   * pgbouncer in transaction mode between the HYPERDRIVE binding and DATABASE_URL, pooling as Hyperdrive
   * does (local/pooler.ts). Default: on for DATABASE_URL when pgbouncer is installed, unless env
   * BC_LOCAL_POOLER=off. Not for PGlite (one session, nothing to pool).
   */
  pooler?: boolean;
  /** wrangler config of the Worker to run; default the repository's wrangler.toml. Its `[triggers] crons` are fired locally. */
  wranglerConfig?: string;
  /** The Worker's entry instead of the config's `main` (a deployment with test plugins; its modules' migrations must be the default config's). */
  main?: string;
  /** Start from an empty data dir: everything in it but the lock is removed first (npm run dev). */
  fresh?: boolean;
  /** Mint a new admin key even if the one kept in the data dir still authenticates. */
  newAdminKey?: boolean;
  /**
   * What wrangler dev prints that an operator should see: the Worker's warnings and errors (its JSON
   * log lines rendered as `ERROR message key=value…`, with their request ids) and wrangler's own
   * warnings. Startup chatter, request lines and info logs are dropped. Default: dropped.
   */
  onOutput?: (line: string) => void;
  /** The stack's own notices: a stale lock taken over, a local cron that failed. Default: console.warn. */
  onNotice?: (line: string) => void;
}

export interface Stack {
  url: string;
  adminKey: string;
  /** The admin key is the one kept in <dataDir>/admin-key from an earlier start (false: minted now). */
  adminKeyReused: boolean;
  dataDir: string;
  databaseUrl: string;
  /** Whether the database is the embedded PGlite. */
  embedded: boolean;
  /** How the Worker reaches it (StackOptions.databasePath), and whether through the local pooler. */
  databasePath: DatabasePath;
  pooled: boolean;
  /** The embedded PGlite's counters (round trips, connections); absent on DATABASE_URL. */
  databaseStats?: { connections: number; roundTrips: number };
  /** The config's cron expressions, fired locally on their schedule. */
  crons: string[];
  /** wrangler dev's DevTools inspector (the Worker's debugger and profiler) on 127.0.0.1. */
  inspectorPort: number;
  stop(): Promise<void>;
}

export type DatabasePath = "hyperdrive" | "websocket";
const DATABASE_PATHS: readonly DatabasePath[] = ["hyperdrive", "websocket"];

/** The start was refused before anything was touched (another stack holds the data dir, the port is busy): its message is one line for the operator. */
export class StackRefusedError extends Error {}

export async function startStack(options: StackOptions): Promise<Stack> {
  const dataDir = path.resolve(options.dataDir);
  const notice = options.onNotice ?? ((line: string) => console.warn(line));
  const wranglerConfig = options.wranglerConfig ?? path.join(repoRoot, "wrangler.toml");
  const crons = localCrons(wranglerConfig);
  const requestedPath = options.databasePath ?? (process.env.BC_LOCAL_DB || "hyperdrive");
  if (!DATABASE_PATHS.includes(requestedPath as DatabasePath))
    throw new StackRefusedError(`BC_LOCAL_DB must be one of ${DATABASE_PATHS.join(", ")}, not ${JSON.stringify(requestedPath)}`);
  fs.mkdirSync(dataDir, { recursive: true });
  const cleanup: Array<() => Promise<unknown>> = [];
  const stop = async () => {
    for (const step of cleanup.reverse()) await step().catch(() => {});
    cleanup.length = 0;
  };
  cleanup.push(takeLock(dataDir, notice));
  try {
    if (options.port !== undefined && !(await portIsFree(options.port))) {
      throw new StackRefusedError(
        `port ${options.port} on 127.0.0.1 is already in use (another stack, or another program); stop it or choose another port (--port N, or PORT=N)`,
      );
    }
    if (options.fresh)
      for (const entry of fs.readdirSync(dataDir))
        if (entry !== LOCK_FILE) fs.rmSync(path.join(dataDir, entry), { recursive: true, force: true });

    const pglite = options.databaseUrl ? undefined : await startPglite({ dataDir: path.join(dataDir, "pglite") });
    if (pglite) cleanup.push(() => pglite.stop());
    const databaseUrl = options.databaseUrl ?? pglite!.connectionString;
    const bridge = await startBridge();
    cleanup.push(() => bridge.stop());

    const { compute } = await import("../better-compute.config.ts");
    const store = await openNodeStore(databaseUrl, { bridge: bridge.url });
    let admin: { key: string; reused: boolean };
    try {
      await applyMigrations(store, [...coreMigrations(), ...compute.migrations()]);
      admin = await adminKey(dataDir, options.newAdminKey ?? false, compute, store);
    } finally {
      await store.close();
    }

    // wrangler dev's Hyperdrive emulation needs a password in the URL; a trust-auth URL keeps the bridge.
    let databasePath = requestedPath as DatabasePath;
    if (databasePath === "hyperdrive" && !hyperdriveCanReach(databaseUrl)) {
      notice("DATABASE_URL has no user and password, which the local Hyperdrive binding needs: the Worker uses the WebSocket bridge");
      databasePath = "websocket";
    }
    const pooled =
      databasePath === "hyperdrive" &&
      !!options.databaseUrl &&
      (options.pooler ?? (process.env.BC_LOCAL_POOLER !== "off" && pgbouncerBinary() !== undefined));
    const pooler = pooled ? await startPooler(databaseUrl, await freePort()) : undefined;
    if (pooler) cleanup.push(() => pooler.stop());
    const hyperdrive =
      databasePath === "hyperdrive" ? localHyperdrive(wranglerConfig, dataDir, pooler?.connectionString ?? databaseUrl) : undefined;

    const envFile = path.join(dataDir, "dev.env");
    // DATABASE_URL stays for doctor; without the bridge's address the Worker can only reach it through HYPERDRIVE.
    const vars = {
      DATABASE_URL: databaseUrl,
      ...(hyperdrive ? {} : { BC_DB_WS_PROXY: bridge.url }),
      BC_SECRET: deploymentSecret(dataDir),
    };
    writePrivate(
      envFile,
      Object.entries(vars)
        .map(([k, v]) => `${k}=${v}\n`)
        .join(""),
    );

    const port = options.port ?? (await freePort());
    const inspectorPort = await freePort();
    const wrangler = spawn(
      process.execPath,
      [
        path.join(repoRoot, "node_modules", "wrangler", "bin", "wrangler.js"),
        "dev",
        ...(options.main ? [options.main] : []),
        "--config",
        hyperdrive?.config ?? wranglerConfig,
        "--ip",
        "127.0.0.1",
        "--port",
        String(port),
        "--inspector-port",
        String(inspectorPort),
        "--env-file",
        envFile,
        "--persist-to",
        path.join(dataDir, "wrangler"),
        "--show-interactive-dev-session=false",
        // /__scheduled?cron=… runs the scheduled handler: the local cron below calls it.
        "--test-scheduled",
        // "log", not "warn": the Worker's console.log lines are its JSON logs at every level; workerOutput keeps the warnings and errors.
        "--log-level",
        "log",
      ],
      {
        cwd: repoRoot,
        env: {
          ...process.env,
          ...hyperdrive?.env,
          WRANGLER_SEND_METRICS: "false",
          CLOUDFLARE_CF_FETCH_ENABLED: "false",
          CI: "true",
          NO_COLOR: "1",
        },
        stdio: ["ignore", "pipe", "pipe"],
      },
    );
    // Should this process end without stop() (a crash), wrangler dev must not outlive it.
    const stopOnExit = () => wrangler.kill("SIGTERM");
    process.once("exit", stopOnExit);
    cleanup.push(async () => {
      await stopChild(wrangler);
      process.off("exit", stopOnExit);
    });
    const output: string[] = [];
    for (const stream of [wrangler.stdout!, wrangler.stderr!]) {
      createInterface({ input: stream, crlfDelay: Infinity }).on("line", (raw) => {
        const line = raw.replace(ANSI, "").trimEnd();
        if (!line) return;
        output.push(line);
        if (output.length > 50) output.shift();
        const shown = workerOutput(line);
        if (shown !== undefined) options.onOutput?.(shown);
      });
    }
    const url = `http://127.0.0.1:${port}`;
    await waitForHealth(url, wrangler, output);

    const stopCrons = scheduleCrons(
      crons,
      async (cron) => {
        const res = await fetch(`${url}/__scheduled?cron=${encodeURIComponent(cron)}`, { signal: AbortSignal.timeout(30_000) });
        await res.body?.cancel();
        if (!res.ok) throw new Error(`wrangler dev answered ${res.status}`);
      },
      (cron, err) => notice(`local cron "${cron}" did not run: ${err instanceof Error ? err.message : String(err)}`),
    );
    cleanup.push(async () => stopCrons());

    // How the CLI finds this stack; gone when it stops.
    const localFile = path.join(dataDir, "local.json");
    writePrivate(localFile, `${JSON.stringify({ url, adminKey: admin.key, pid: process.pid }, null, 2)}\n`);
    cleanup.push(async () => fs.rmSync(localFile, { force: true }));

    return {
      url,
      adminKey: admin.key,
      adminKeyReused: admin.reused,
      dataDir,
      databaseUrl,
      embedded: !options.databaseUrl,
      databasePath,
      pooled,
      ...(pglite ? { databaseStats: pglite.stats } : {}),
      crons: crons.map((c) => c.expression),
      inspectorPort,
      stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** The config's crons, parsed; one the local cron cannot read refuses the start. */
function localCrons(wranglerConfig: string): Cron[] {
  try {
    return cronsOfConfig(fs.readFileSync(wranglerConfig, "utf8"), wranglerConfig).map(parseCron);
  } catch (err) {
    throw new StackRefusedError(`${shownPath(wranglerConfig)}: ${err instanceof Error ? err.message : String(err)}`);
  }
}

const LOCK_FILE = "lock";

/**
 * Takes <dataDir>/lock for this process (created exclusively, holding the pid) and answers its
 * release. A lock whose process is gone is taken over; a live one refuses the start.
 */
function takeLock(dataDir: string, notice: (line: string) => void): () => Promise<void> {
  const file = path.join(dataDir, LOCK_FILE);
  for (let attempt = 0; ; attempt++) {
    try {
      const fd = fs.openSync(file, "wx", 0o600);
      fs.writeSync(fd, `${process.pid}\n`);
      fs.closeSync(fd);
      return async () => {
        if (lockHolder(file) === process.pid) fs.rmSync(file, { force: true });
      };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
    }
    const pid = lockHolder(file);
    if ((pid !== undefined && processAlive(pid)) || attempt > 0) {
      throw new StackRefusedError(
        `another Better Compute stack (pid ${pid ?? "unknown"}) is using ${shownPath(dataDir)}; stop it or set BC_DATA_DIR`,
      );
    }
    notice(`taking over ${shownPath(file)}: the stack that held it (pid ${pid ?? "unknown"}) is gone`);
    fs.rmSync(file, { force: true });
  }
}

function lockHolder(file: string): number | undefined {
  try {
    const pid = Number(fs.readFileSync(file, "utf8").trim());
    return Number.isInteger(pid) && pid > 0 ? pid : undefined;
  } catch {
    return undefined;
  }
}

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM"; // it exists, it is just not ours
  }
}

/** A path as the operator typed it: relative to the working directory when inside it. */
export function shownPath(file: string): string {
  const relative = path.relative(process.cwd(), file);
  return relative && !relative.startsWith("..") && !path.isAbsolute(relative) ? relative : file;
}

function portIsFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = net.createServer();
    server.once("error", () => resolve(false));
    server.listen(port, "127.0.0.1", () => server.close(() => resolve(true)));
  });
}

/**
 * The admin key kept in <dataDir>/admin-key (mode 600) when it still authenticates as an admin
 * (the database may have been replaced, the key revoked); else, or when asked, a new one, kept there.
 */
async function adminKey(dataDir: string, forceNew: boolean, compute: Compute, store: Store): Promise<{ key: string; reused: boolean }> {
  const file = path.join(dataDir, "admin-key");
  const kept = forceNew || !fs.existsSync(file) ? "" : fs.readFileSync(file, "utf8").trim();
  if (kept) {
    const principal = await compute.iam
      .authenticate(new Request("http://local/", { headers: { authorization: `Bearer ${kept}` } }), store)
      .catch(() => null);
    if (principal?.roles.includes("admin")) return { key: kept, reused: true };
  }
  const { key } = await compute.mintApiKey(store, { name: "npm start", roles: ["admin"], createdBy: "system:npm-start" });
  writePrivate(file, `${key}\n`);
  return { key, reused: false };
}

/** Writes a file only its owner may read (mode 600, also when it existed with another mode). */
function writePrivate(file: string, content: string): void {
  fs.rmSync(file, { force: true });
  fs.writeFileSync(file, content, { mode: 0o600, flag: "wx" });
}

const ANSI = /\u001b\[[0-9;]*m/g;
const WRANGLER_CHATTER =
  /^\s*(\[wrangler:info\]|⛅️|─+$|⎔ |🪵 |Using (vars|secrets) defined in|Your Worker has access to|Binding\s+Resource\s+Mode|env\.\S+ \(.*\)\s+\S.*\s(local|remote)$|Found a non-empty CLOUDFLARE_HYPERDRIVE_LOCAL_CONNECTION_STRING_)/;

/**
 * What of wrangler dev's output reaches the operator: the Worker's JSON log lines at warn and
 * error (rendered), wrangler's warnings and errors, and anything unexpected; not its startup
 * chatter, request lines or the Worker's info logs.
 */
export function workerOutput(line: string): string | undefined {
  const body = line.trim().replace(/^[✘▲] \[(ERROR|WARNING)\] /, "");
  if (body.startsWith("{")) {
    try {
      const fields = JSON.parse(body) as Record<string, unknown>;
      if (typeof fields.level === "string" && typeof fields.message === "string") {
        return fields.level === "warn" || fields.level === "error" ? formatLogLine(fields) : undefined;
      }
    } catch {
      // not a log line of ours: shown as it is
    }
  }
  return WRANGLER_CHATTER.test(body) ? undefined : body;
}

/** A JSON log line ({level, message, ...fields}) as one readable line: `ERROR message  key=value …` (secret-named fields redacted). */
export function formatLogLine(line: Record<string, unknown>): string {
  const { level, message, time: _time, ...fields } = redact(line) as Record<string, unknown>;
  const rest = Object.entries(fields).map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`);
  return [`${String(level).toUpperCase()} ${String(message)}`, ...rest].join("  ");
}

/** The deployment secret of a local stack: made once, kept in the data dir. */
function deploymentSecret(dataDir: string): string {
  const file = path.join(dataDir, "secret");
  if (!fs.existsSync(file)) writePrivate(file, Buffer.from(crypto.getRandomValues(new Uint8Array(32))).toString("base64url"));
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
