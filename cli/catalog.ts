// The API's methods as the CLI knows them, cached on disk per API URL with /openapi.json's ETag
// ($XDG_CACHE_HOME/better-compute/cli/, else ~/.cache/...): a command resolves from the cache at
// once while one conditional GET (304 when nothing changed) revalidates it beside the method's own
// request, so a call waits for one round trip. Only a URL never seen (or an API without ETags)
// fetches /openapi.json first.
import { createHash } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import type { Api } from "./api.ts";
import { methodsOf, type MethodSpec } from "./commands.ts";

/** The URLs whose methods are kept; the least recently fetched go first (local stacks on passing ports, tests). */
const MAX_CACHED = 16;

interface CachedCatalog {
  url: string;
  etag: string;
  methods: MethodSpec[];
}

export interface Catalog {
  /** The methods to resolve a command with: the cached ones, else the API's just fetched. */
  methods: MethodSpec[];
  /** The API's methods as it answers now (the cached ones when unchanged, or when it cannot be asked); the cache is updated with them. */
  latest: Promise<MethodSpec[]>;
}

export function catalogDir(env: NodeJS.ProcessEnv = process.env): string {
  return path.join(env.XDG_CACHE_HOME || path.join(os.homedir(), ".cache"), "better-compute", "cli");
}

export async function loadCatalog(api: Api, dir = catalogDir()): Promise<Catalog> {
  const file = path.join(dir, `${createHash("sha256").update(api.url).digest("hex").slice(0, 16)}.json`);
  const cached = readCache(file, api.url);
  const latest = fetchMethods(api, file, cached);
  if (!cached) {
    const methods = await latest;
    return { methods, latest };
  }
  // A revalidation that fails changes nothing: the method's own request says what is wrong.
  return { methods: cached.methods, latest: latest.catch(() => cached.methods) };
}

async function fetchMethods(api: Api, file: string, cached: CachedCatalog | undefined): Promise<MethodSpec[]> {
  const answer = await api.openapi(cached?.etag);
  if (!answer) return cached!.methods;
  const methods = methodsOf(answer.document);
  if (answer.etag) writeCache(file, { url: api.url, etag: answer.etag, methods });
  return methods;
}

function readCache(file: string, url: string): CachedCatalog | undefined {
  try {
    const cached = JSON.parse(fs.readFileSync(file, "utf8")) as CachedCatalog;
    return cached.url === url && typeof cached.etag === "string" && Array.isArray(cached.methods) ? cached : undefined;
  } catch {
    return undefined; // none yet, or unreadable: fetched afresh
  }
}

function writeCache(file: string, catalog: CachedCatalog): void {
  try {
    const dir = path.dirname(file);
    fs.mkdirSync(dir, { recursive: true });
    // Renamed into place whole: another call reads the old copy or the new one.
    const tmp = `${file}.${process.pid}.tmp`;
    fs.writeFileSync(tmp, JSON.stringify(catalog));
    fs.renameSync(tmp, file);
    const cached = fs
      .readdirSync(dir)
      .filter((name) => name.endsWith(".json"))
      .map((name) => ({ name, mtime: fs.statSync(path.join(dir, name)).mtimeMs }))
      .sort((a, b) => b.mtime - a.mtime);
    for (const old of cached.slice(MAX_CACHED)) fs.rmSync(path.join(dir, old.name), { force: true });
  } catch {
    // A cache that cannot be written costs the next call a fetch, nothing else.
  }
}
