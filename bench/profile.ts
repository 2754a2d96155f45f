// A CPU profile of the Worker under `wrangler dev`, taken through wrangler's inspector proxy
// (the Chrome DevTools protocol's Profiler domain), and its self time summed per source module
// of the bundle: which share of workerd's JS time a request spends in zod, hono, drizzle,
// node-postgres or our own code. The bench serves a frozen esbuild bundle, whose `// <path>`
// comments say which module each line came from; a function is charged to the module its
// definition starts in. Time outside JS (the runtime's C++, sockets, GC) shows as the profiler's
// own "(program)" and "(garbage collector)" entries.
import fs from "node:fs";
import { WebSocket } from "ws";

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  hitCount?: number;
}
interface Profile {
  nodes: ProfileNode[];
  samples: number[];
  timeDeltas: number[];
  startTime: number;
  endTime: number;
}

export interface ProfileShare {
  /** A package (`zod`, `drizzle-orm`), a directory of ours (`core/api`), or a profiler entry such as `(idle)`. */
  name: string;
  ms: number;
  share: number;
}

export interface WorkerProfile {
  /** Wall time the profile covers, ms. */
  wallMs: number;
  /** Sampled time not idle, ms. */
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
): Promise<{ result: T; profile: WorkerProfile }> {
  const session = await inspect(inspectorPort);
  try {
    await session.send("Profiler.enable");
    await session.send("Profiler.setSamplingInterval", { interval: 200 }); // µs
    await session.send("Profiler.start");
    const result = await during();
    const { profile } = (await session.send("Profiler.stop")) as { profile: Profile };
    return { result, profile: summarise(profile, moduleOfLine(fs.readFileSync(bundleFile, "utf8"))) };
  } finally {
    session.close();
  }
}

/** The shares as lines for the bench's output, with each one's ms per request served in the window. */
export function profileLines(profile: WorkerProfile, requests: number, top = 12): string[] {
  const perRequest = (ms: number) => (requests ? ms / requests : 0).toFixed(3).padStart(6);
  const pct = (s: ProfileShare) => `${(s.share * 100).toFixed(1).padStart(5)}%  ${perRequest(s.ms)} ms/req  ${s.name}`;
  return [
    `workerd's JS profile: ${profile.busyMs.toFixed(0)} ms busy in ${profile.wallMs.toFixed(0)} ms, ${perRequest(profile.busyMs).trim()} ms per request (shares of the busy time)`,
    "  per module:",
    ...profile.modules.slice(0, top).map((s) => `    ${pct(s)}`),
    "  busiest functions (self time):",
    ...profile.functions.slice(0, top).map((s) => `    ${pct(s)}`),
  ];
}

function summarise(profile: Profile, moduleAt: (line: number) => string): WorkerProfile {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const selfMs = new Map<number, number>();
  profile.samples.forEach((id, i) => selfMs.set(id, (selfMs.get(id) ?? 0) + (profile.timeDeltas[i] ?? 0) / 1000));
  const modules = new Map<string, number>();
  const functions = new Map<string, number>();
  let busy = 0;
  for (const [id, ms] of selfMs) {
    const frame = byId.get(id)!.callFrame;
    if (frame.functionName === "(idle)") continue;
    busy += ms;
    const module = frame.url ? moduleAt(frame.lineNumber) : frame.functionName || "(anonymous)";
    modules.set(module, (modules.get(module) ?? 0) + ms);
    const fn = `${frame.functionName || "(anonymous)"} (${module})`;
    functions.set(fn, (functions.get(fn) ?? 0) + ms);
  }
  const ranked = (m: Map<string, number>) =>
    [...m].map(([name, ms]) => ({ name, ms, share: busy ? ms / busy : 0 })).sort((a, b) => b.ms - a.ms);
  return { wallMs: (profile.endTime - profile.startTime) / 1000, busyMs: busy, modules: ranked(modules), functions: ranked(functions) };
}

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
