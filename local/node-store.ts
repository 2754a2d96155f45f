// Opening the store from Node (migrations, npm start, benchmarks): the same driver and
// code as the Worker, with ws as the WebSocket and, for a Postgres on this machine, a
// WebSocket-to-TCP bridge started in-process.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";
import { neonConfig } from "@neondatabase/serverless";
import type { Migration } from "../core/contracts.ts";
import { postgres, type Store } from "../core/store/database.ts";
import { startBridge } from "./ws-bridge.ts";

// Loaded through require: under vitest the workers project resolves "ws" to its browser stub.
neonConfig.webSocketConstructor = createRequire(import.meta.url)("ws");

export const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

export interface NodeStore extends Store {
  /** host:port of the bridge in use, for a Worker that must reach the same database. */
  bridge?: string;
}

export async function openNodeStore(url: string, options: { bridge?: string } = {}): Promise<NodeStore> {
  let bridge = options.bridge ?? process.env.BC_DB_WS_PROXY;
  let stopBridge: (() => Promise<void>) | undefined;
  if (!bridge && isLoopback(new URL(url).hostname)) {
    const started = await startBridge();
    bridge = started.url;
    stopBridge = started.stop;
  }
  const store = postgres({ url, wsProxy: bridge }).open({});
  return {
    db: store.db,
    transaction: (fn) => store.transaction(fn),
    write: (statement) => store.write(statement),
    bridge,
    async close() {
      await store.close();
      await stopBridge?.();
    },
  };
}

function isLoopback(host: string): boolean {
  return host === "localhost" || host === "[::1]" || host === "::1" || /^127\./.test(host);
}

/** Core migrations: migrations/core/*.sql in file name order, named "core/<file>". */
export function coreMigrations(): Migration[] {
  const dir = path.join(repoRoot, "migrations", "core");
  return fs
    .readdirSync(dir)
    .filter((f) => f.endsWith(".sql"))
    .sort()
    .map((f) => ({ name: `core/${f.replace(/\.sql$/, "")}`, sql: fs.readFileSync(path.join(dir, f), "utf8") }));
}
