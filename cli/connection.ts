// Where the CLI's API is: --url/--api-key, else BC_URL/BC_API_KEY, else a running local stack
// (`npm start` writes <dataDir>/local.json while it runs). Nothing here prints a key.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

/** The repository this CLI is in (cli/bundle.mjs keeps each module's import.meta.url in the bundle). */
const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

export interface Connection {
  url: string;
  apiKey: string;
  /** Where url and key came from, for messages ("BC_URL", "local stack at .data/local.json"). */
  source: string;
}

/** What a running local stack writes to <dataDir>/local.json (mode 600). */
export interface LocalStackFile {
  url: string;
  adminKey: string;
  pid: number;
}

export class UsageError extends Error {}

/**
 * The data directories a local stack may use, npm start's and then npm run dev's (<dir>/dev):
 * under $BC_DATA_DIR alone when it is set (as npm start then uses it alone), otherwise under
 * .data in the working directory and in the repository.
 */
export function dataDirCandidates(env: NodeJS.ProcessEnv = process.env, cwd = process.cwd()): string[] {
  const bases = env.BC_DATA_DIR ? [path.resolve(cwd, env.BC_DATA_DIR)] : [path.join(cwd, ".data"), path.join(repoRoot, ".data")];
  return [...new Set(bases.flatMap((base) => [path.resolve(base), path.resolve(base, "dev")]))];
}

/** The first candidate whose local.json names a live process, with what it says. */
export function findRunningStack(candidates = dataDirCandidates()): { dataDir: string; file: LocalStackFile } | undefined {
  for (const dataDir of candidates) {
    const file = readLocalStackFile(dataDir);
    if (file && processAlive(file.pid)) return { dataDir, file };
  }
  return undefined;
}

function readLocalStackFile(dataDir: string): LocalStackFile | undefined {
  try {
    const parsed = JSON.parse(fs.readFileSync(path.join(dataDir, "local.json"), "utf8")) as Partial<LocalStackFile>;
    if (typeof parsed.url === "string" && typeof parsed.adminKey === "string" && Number.isInteger(parsed.pid))
      return parsed as LocalStackFile;
  } catch {
    // absent or half-written: not a running stack
  }
  return undefined;
}

export function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    // EPERM: it exists, it is just not ours.
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

export function resolveConnection(flags: { url?: string; apiKey?: string }, env: NodeJS.ProcessEnv = process.env): Connection {
  const url = flags.url ?? (env.BC_URL || undefined);
  const apiKey = flags.apiKey ?? (env.BC_API_KEY || undefined);
  if (url && apiKey) return { url: trimSlash(url), apiKey, source: flags.url ? "--url" : "BC_URL" };

  const candidates = dataDirCandidates(env);
  const stack = findRunningStack(candidates);
  // A local stack fills in what is missing: its URL for a key given alone (another key than its
  // admin's), its admin key only for its own URL.
  if (stack && (!url || trimSlash(url) === trimSlash(stack.file.url))) {
    const at = `the local stack in ${relative(stack.dataDir)} (pid ${stack.file.pid})`;
    return {
      url: trimSlash(stack.file.url),
      apiKey: apiKey ?? stack.file.adminKey,
      source: apiKey ? `${at}, with ${flags.apiKey ? "--api-key" : "BC_API_KEY"}` : at,
    };
  }
  if (url && !apiKey) throw new UsageError(`no API key for ${url}: set BC_API_KEY (or pass --api-key)`);
  if (apiKey && !url)
    throw new UsageError(
      "an API key but no URL, and no running local stack: set BC_URL (or pass --url), e.g. BC_URL=https://compute.example.com",
    );
  throw new UsageError(
    [
      "no Better Compute API to talk to.",
      "  set BC_URL and BC_API_KEY (or pass --url and --api-key), e.g.",
      "    export BC_URL=https://compute.example.com BC_API_KEY=bck_…",
      "  or start the local stack with `npm start` (or `npx better-compute dev`) and run this again;",
      `  no running stack's local.json was found in: ${candidates.map(relative).join(", ")}`,
    ].join("\n"),
  );
}

const trimSlash = (url: string) => url.replace(/\/+$/, "");

export function relative(p: string): string {
  const rel = path.relative(process.cwd(), p);
  return rel === "" ? "." : rel.startsWith("..") ? p : rel;
}
