// Where the CPU goes, per module (zod, hono, drizzle-orm, pg, our directories) and per function:
// V8's sampling profiler, read through the DevTools protocol's Profiler domain. For the Worker under
// `wrangler dev` through wrangler's inspector proxy, with the frozen esbuild bundle's `// <path>`
// comments saying which module each line came from (a function counts for the module its
// definition starts in); for a Node process (a fleet lane) through node:inspector in the process
// itself, by each frame's file. Time in native code and Node's internals counts for the module
// that called it (summariseProfile).
import fs from "node:fs";
import inspector from "node:inspector/promises";
import { WebSocket } from "ws";

interface CallFrame {
  functionName: string;
  url: string;
  lineNumber: number;
}
interface ProfileNode {
  id: number;
  callFrame: CallFrame;
  children?: number[];
}
/** V8's sampled profile, as the DevTools protocol's Profiler.stop returns it (Worker and Node alike). */
export interface V8Profile {
  nodes: ProfileNode[];
  samples: number[];
  timeDeltas: number[];
  startTime: number;
  endTime: number;
}

export interface ProfileShare {
  /** A package (`zod`, `drizzle-orm`), a directory of ours (`core/api`), or a profiler entry such as `(program)`. */
  name: string;
  ms: number;
  share: number;
}

export interface CpuProfile {
  /** Wall time the profile covers, ms (the longest, for profiles of processes side by side). */
  wallMs: number;
  /** Sampled time not idle, ms (summed over the processes). */
  busyMs: number;
  /** Per module, busiest first; idle left out. */
  modules: ProfileShare[];
  /** The busiest functions, "name (module)". */
  functions: ProfileShare[];
}

/** Profiles the Worker while `during` runs; the bundle file maps the profile's lines to modules. */
export async function profileWorker<T>(
  inspectorPort: number,
  bundleFile: string,
  during: () => Promise<T>,
): Promise<{ result: T; profile: CpuProfile }> {
  const session = await inspect(inspectorPort);
  try {
    await session.send("Profiler.enable");
    await session.send("Profiler.setSamplingInterval", { interval: SAMPLING_INTERVAL_US });
    await session.send("Profiler.start");
    const result = await during();
    const { profile } = (await session.send("Profiler.stop")) as { profile: V8Profile };
    const moduleAt = moduleOfLine(fs.readFileSync(bundleFile, "utf8"));
    return { result, profile: summariseProfile(profile, (frame) => (frame.url ? moduleAt(frame.lineNumber) : undefined)) };
  } finally {
    session.close();
  }
}

export const SAMPLING_INTERVAL_US = 200;

/** The shares as lines for the bench's output, with each one's ms per unit of work (a request, a machine). */
export function profileLines(profile: CpuProfile, count: number, unit: string, top = 12): string[] {
  const per = (ms: number) => (count ? ms / count : 0).toFixed(3).padStart(6);
  const pct = (s: ProfileShare) => `${(s.share * 100).toFixed(1).padStart(5)}%  ${per(s.ms)} ms/${unit}  ${s.name}`;
  return [
    `JS profile: ${profile.busyMs.toFixed(0)} ms busy in ${profile.wallMs.toFixed(0)} ms, ${per(profile.busyMs).trim()} ms per ${unit} (shares of the busy time)`,
    "  per module:",
    ...profile.modules.slice(0, top).map((s) => `    ${pct(s)}`),
    "  busiest functions (self time):",
    ...profile.functions.slice(0, top).map((s) => `    ${pct(s)}`),
  ];
}

/**
 * Self time per module and per function. Time in a frame `moduleOf` does not place (the runtime's
 * native functions, Node's own modules) is charged to the nearest caller it places: a socket's
 * `writev` under node-postgres's `submit` counts for `pg`, so a module's share is the work it
 * caused. What has no such caller (`(program)`, `(garbage collector)`, the event loop's own
 * ticks) keeps its own name.
 */
export function summariseProfile(profile: V8Profile, moduleOf: (frame: CallFrame) => string | undefined): CpuProfile {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of profile.nodes) for (const child of n.children ?? []) parent.set(child, n.id);
  const owner = new Map<number, string | undefined>();
  const ownerOf = (id: number): string | undefined => {
    if (owner.has(id)) return owner.get(id);
    const above = parent.get(id);
    const found = moduleOf(byId.get(id)!.callFrame) ?? (above === undefined ? undefined : ownerOf(above));
    owner.set(id, found);
    return found;
  };
  const selfMs = new Map<number, number>();
  profile.samples.forEach((id, i) => selfMs.set(id, (selfMs.get(id) ?? 0) + (profile.timeDeltas[i] ?? 0) / 1000));
  const modules = new Map<string, number>();
  const functions = new Map<string, number>();
  for (const [id, ms] of selfMs) {
    const frame = byId.get(id)!.callFrame;
    if (frame.functionName === "(idle)") continue;
    const module = ownerOf(id) ?? (frame.url.startsWith("node:") ? "node:internal" : frame.functionName || "(anonymous)");
    add(modules, module, ms);
    add(functions, `${frame.functionName || "(anonymous)"} (${module})`, ms);
  }
  return ranked((profile.endTime - profile.startTime) / 1000, modules, functions);
}

/** Profiles of processes that ran side by side (or one after another), as one. */
export function mergeProfiles(profiles: CpuProfile[]): CpuProfile {
  const modules = new Map<string, number>();
  const functions = new Map<string, number>();
  for (const p of profiles) {
    for (const s of p.modules) add(modules, s.name, s.ms);
    for (const s of p.functions) add(functions, s.name, s.ms);
  }
  return ranked(Math.max(0, ...profiles.map((p) => p.wallMs)), modules, functions);
}

function add(into: Map<string, number>, name: string, ms: number): void {
  into.set(name, (into.get(name) ?? 0) + ms);
}

function ranked(wallMs: number, modules: Map<string, number>, functions: Map<string, number>): CpuProfile {
  const busyMs = [...modules.values()].reduce((a, b) => a + b, 0);
  const rank = (m: Map<string, number>) =>
    [...m].map(([name, ms]) => ({ name, ms, share: busyMs ? ms / busyMs : 0 })).sort((a, b) => b.ms - a.ms);
  return { wallMs, busyMs, modules: rank(modules), functions: rank(functions) };
}

/**
 * A Node process's frame → module: a package under node_modules by its name, our files by their
 * directory under the repository; Node's own modules and native functions are left to their caller.
 */
export function nodeModuleOf(frame: CallFrame): string | undefined {
  if (!frame.url || frame.url.startsWith("node:")) return undefined;
  return moduleName(
    frame.url
      .replace(/^file:\/\//, "")
      .replace(/\?.*$/, "")
      .replace(REPO_ROOT, ""),
  );
}

const REPO_ROOT = new URL("../", import.meta.url).pathname;

/**
 * Line (0-based, as the profiler counts) → module, from esbuild's `// <path>` comments: a
 * package under node_modules by its name, our files by their directory.
 */
function moduleOfLine(bundle: string): (line: number) => string {
  const starts: { line: number; name: string }[] = [];
  bundle.split("\n").forEach((text, line) => {
    const match = /^\/\/ ((?:\.\.\/)*[\w@.-][\w@./-]*\.(?:[cm]?js|ts|json))$/.exec(text);
    if (match) starts.push({ line, name: moduleName(match[1]!) });
  });
  return (line) => {
    let lo = 0;
    let hi = starts.length - 1;
    let found = "(bundle prelude)";
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (starts[mid]!.line <= line) {
        found = starts[mid]!.name;
        lo = mid + 1;
      } else hi = mid - 1;
    }
    return found;
  };
}

function moduleName(file: string): string {
  const inPackage = /node_modules\/((?:@[^/]+\/)?[^/]+)\//.exec(file);
  if (inPackage) return inPackage[1]!;
  const parts = file.replace(/^(\.\.\/)+/, "").split("/");
  return parts.length > 2 ? parts.slice(0, 2).join("/") : parts.slice(0, -1).join("/") || file;
}

interface InspectorSession {
  send(method: string, params?: Record<string, unknown>): Promise<unknown>;
  close(): void;
}

/**
 * This Node process's own profiler, for a process that profiles itself in pieces (a fleet lane:
 * each `take()` stops the current piece, summarises it and starts the next).
 */
export async function selfProfiler(): Promise<{ take(): Promise<CpuProfile>; stop(): Promise<void> }> {
  const session = new inspector.Session();
  session.connect();
  await session.post("Profiler.enable");
  await session.post("Profiler.setSamplingInterval", { interval: SAMPLING_INTERVAL_US });
  await session.post("Profiler.start");
  return {
    async take() {
      const { profile } = (await session.post("Profiler.stop")) as { profile: V8Profile };
      await session.post("Profiler.start");
      return summariseProfile(profile, nodeModuleOf);
    },
    async stop() {
      await session.post("Profiler.stop");
      session.disconnect();
    },
  };
}

/** A DevTools protocol session with the Worker, through wrangler dev's inspector proxy. */
async function inspect(port: number): Promise<InspectorSession> {
  const targets = (await (await fetch(`http://127.0.0.1:${port}/json`)).json()) as { webSocketDebuggerUrl?: string }[];
  const url = targets.find((t) => t.webSocketDebuggerUrl)?.webSocketDebuggerUrl;
  if (!url) throw new Error(`wrangler dev's inspector on port ${port} lists no Worker to profile`);
  // The proxy refuses a DevTools socket whose Origin is not a local one (a web page's guard).
  const socket = new WebSocket(url, { origin: "http://localhost" });
  await new Promise<void>((resolve, reject) => {
    socket.once("open", () => resolve());
    socket.once("error", (error) => reject(new Error(`could not open the inspector session ${url}: ${error.message}`)));
  });
  let nextId = 1;
  const pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  socket.on("message", (data) => {
    const message = JSON.parse(String(data)) as { id?: number; result?: unknown; error?: { message: string } };
    const waiter = message.id === undefined ? undefined : pending.get(message.id);
    if (!waiter) return;
    pending.delete(message.id!);
    if (message.error) waiter.reject(new Error(`inspector: ${message.error.message}`));
    else waiter.resolve(message.result);
  });
  return {
    send: (method, params = {}) =>
      new Promise((resolve, reject) => {
        const id = nextId++;
        pending.set(id, { resolve, reject });
        socket.send(JSON.stringify({ id, method, params }));
      }),
    close: () => socket.close(),
  };
}
