// One lane of the fleet section (bench/fleet.ts): a child process running one simulated site
// (createMetalSim: its control plane, engine, emulated BMCs and agents) on a schema it shares with
// the other lanes of the run, driven by the bench process over IPC. A deployment runs many
// Workers and Durable Objects against one database; one Node process running all of a fleet's
// simulation uses one core, so the bench splits the machines into lanes, one site each.
//
// In the fleet-stack section (bench/fleet-stack.ts) a lane runs no control plane: its site's
// agents dial the running stack (wrangler dev) over real WebSockets, and its enroll, deploy and
// undeploy requests go to the stack's HTTP API with the operator's key.
//
// Started by fleet.ts with BENCH_LANE = JSON of LaneConfig; answers each LaneRequest with a
// LaneAnswer carrying the request's id.
import v8 from "node:v8";
import vm from "node:vm";
import { createMetalSim, type MetalSim, type SimStack } from "../testing/metal-sim.ts";
import { mergeProfiles, selfProfiler, type CpuProfile } from "./profile.ts";
import { QueryStats, type QueryKindStats } from "./query-stats.ts";
import { mapLimit } from "./stack.ts";

export interface LaneConfig {
  /** The in-process control plane's database and schema (the fleet section)... */
  databaseUrl?: string;
  schema?: string;
  /** ...or a running stack the lane's agents dial and its operator calls go to (the fleet-stack section). */
  stack?: SimStack;
  siteId: string;
  /** The lane's machines' node ids. */
  ids: string[];
  /** Requests in flight in this lane. */
  inFlight: number;
  /** BENCH_PROFILE=1: the lane profiles itself; its stats carry the profile since the last reset. */
  profile: boolean;
}

export type FleetPhase = "enroll" | "deploy" | "undeploy";

export type LaneRequest =
  | { id: number; op: "phase"; phase: FleetPhase; image: { sha256: string; url: string } }
  | { id: number; op: "stats"; reset: boolean }
  | { id: number; op: "stop" };

export interface LaneStats {
  roundTrips: number;
  queries: QueryKindStats[];
  /** Commands the lane's agents ran, by kind. */
  ran: Record<string, number>;
  /** This process's growth since before its sim started, after a collection. */
  rssBytes: number;
  heapBytes: number;
  /** With profiling on: where this process's CPU went since the last reset. */
  profile?: CpuProfile;
}

export type LaneAnswer = { id: number; ok: true; value?: LaneStats } | { id: number; ok: false; error: string };

// A collection before each reading, so the figures are what is live, not what awaits the collector.
v8.setFlagsFromString("--expose-gc");
const gc = vm.runInNewContext("gc") as () => void;

export function memoryNow(): { rss: number; heapUsed: number } {
  gc();
  const { rss, heapUsed } = process.memoryUsage();
  return { rss, heapUsed };
}

/** A simulated site with the fleet's machines: the phases' requests, and its figures. */
export interface FleetSite {
  sim: MetalSim;
  /** Sends every machine's request of the phase (inFlight at a time); resolves once all are answered. */
  start(phase: FleetPhase, image: { sha256: string; url: string }): Promise<void>;
  stats(reset: boolean): Promise<LaneStats>;
  /** Stops the sim (and the profiler). */
  stop(): Promise<void>;
}

/** Starts a site (createMetalSim) whose machines get the node ids `ids`; on PGlite without a databaseUrl. */
export async function startSite(options: {
  ids: string[];
  inFlight: number;
  databaseUrl?: string;
  databaseSchema?: string;
  stack?: SimStack;
  siteId?: string;
  profile?: boolean;
}): Promise<FleetSite> {
  const base = memoryNow();
  const profiler = options.profile ? await selfProfiler() : undefined;
  let pieces: CpuProfile[] = []; // the profile since the last reset, taken in pieces (one per stats())
  const queries = new QueryStats();
  const sim = await createMetalSim({
    machines: options.ids.length,
    ...(options.databaseUrl ? { databaseUrl: options.databaseUrl, onRoundTrip: queries.record } : {}),
    ...(options.databaseSchema ? { databaseSchema: options.databaseSchema } : {}),
    ...(options.stack ? { stack: options.stack } : {}),
    ...(options.siteId ? { siteId: options.siteId } : {}),
  });
  const each = (fn: (id: string, i: number) => Promise<unknown>) => mapLimit(options.ids, options.inFlight, fn).then(() => undefined);
  return {
    sim,
    async start(phase, image) {
      if (phase === "enroll") await each((id, i) => sim.enroll(sim.machines[i]!, { id }));
      else if (phase === "deploy")
        await each((id) => sim.call("metal.deploy", { node: id, profile: "metal.deploy.image-stream", input: { image } }));
      else await each((id) => sim.call("metal.undeploy", { node: id }));
    },
    async stats(reset) {
      if (profiler) pieces.push(await profiler.take());
      const ran: Record<string, number> = {};
      for (const c of sim.commandsSeen) ran[c.kind] = (ran[c.kind] ?? 0) + 1;
      const now = memoryNow();
      const stats = {
        roundTrips: sim.roundTrips(),
        queries: queries.snapshot(),
        ran,
        rssBytes: now.rss - base.rss,
        heapBytes: now.heapUsed - base.heapUsed,
        ...(profiler ? { profile: mergeProfiles(pieces) } : {}),
      };
      if (reset) {
        queries.reset();
        pieces = [];
      }
      return stats;
    },
    async stop() {
      await profiler?.stop();
      await sim.stop();
    },
  };
}

async function main(config: LaneConfig): Promise<void> {
  const site = await startSite({ ...config, ...(config.schema ? { databaseSchema: config.schema } : {}) });
  const handle = async (request: LaneRequest): Promise<LaneStats | undefined> => {
    switch (request.op) {
      case "phase":
        return void (await site.start(request.phase, request.image));
      case "stats":
        return site.stats(request.reset);
      case "stop":
        return void (await site.stop());
    }
  };
  process.on("message", (request: LaneRequest) => {
    handle(request).then(
      (value) => {
        process.send!({ id: request.id, ok: true, value } satisfies LaneAnswer);
        if (request.op === "stop") process.disconnect();
      },
      (err: unknown) =>
        process.send!({ id: request.id, ok: false, error: err instanceof Error ? err.message : String(err) } satisfies LaneAnswer),
    );
  });
  process.send!({ id: 0, ok: true } satisfies LaneAnswer);
}

if (process.env.BENCH_LANE) {
  main(JSON.parse(process.env.BENCH_LANE) as LaneConfig).catch((err: unknown) => {
    process.send?.({ id: 0, ok: false, error: err instanceof Error ? (err.stack ?? err.message) : String(err) } satisfies LaneAnswer);
    process.exitCode = 1;
    process.disconnect?.();
  });
}
