// Fleet: N simulated machines (createMetalSim: emulated Redfish BMCs, simulated disks, real
// agents, engine, metal module and PGlite, or DATABASE_URL's Postgres) taken from enroll to ready,
// then through one image-stream deploy and one release. Per phase: wall time, lifecycle transitions
// per second, workflow steps per second, and Postgres round trips per transition (counted by the
// embedded PGlite server, or at the driver on Postgres). Then Walkthrough 1's invariants over every
// machine, in SQL (the run fails when one does not hold), and memory per machine.
//
// On Postgres the machines are split into lanes (BENCH_FLEET_LANES, default one per CPU): each a
// child process (bench/fleet-lane.ts) simulating one site with a control plane of its own, all on
// one schema, as a deployment's Workers and Durable Objects share its database. On PGlite, whose
// database lives in the simulating process, the fleet runs in this process.
import { fork, type ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";
import { sql, type SQL } from "drizzle-orm";
import { postgres } from "../core/store/database.ts";
import { createImageCache, simulatedDiskImage } from "../testing/image-server.ts";
import { createSimSchema, destructiveTwice, inSchema, transitionsIntoReady } from "../testing/metal-sim.ts";
import type { NodeStore } from "../local/node-store.ts";
import type { BenchContext, BenchSection } from "./run.ts";
import { startSite, type FleetPhase, type LaneAnswer, type LaneConfig, type LaneRequest, type LaneStats } from "./fleet-lane.ts";
import { mergeProfiles, profileLines } from "./profile.ts";
import { mergeQueries, printQueryStats, type QueryKindStats } from "./query-stats.ts";
import { target } from "./stack.ts";

const POLL_MS = 250;
/** Enroll, deploy and undeploy requests in flight, over all lanes. */
export const IN_FLIGHT = 16;

/** The three phases both fleet sections run: name, the request each machine gets, the state all must reach. */
export const FLEET_PHASES: readonly (readonly [string, FleetPhase, string])[] = [
  ["enroll → ready", "enroll", "ready"],
  ["ready → deployed", "deploy", "deployed"],
  ["deployed → ready", "undeploy", "ready"],
];

/** The fleet's node ids: m-0000, m-0001, ... */
export function machineIds(size: number): string[] {
  const width = Math.max(4, String(size - 1).length);
  return Array.from({ length: size }, (_, i) => `m-${String(i).padStart(width, "0")}`);
}

/** The small disk image every deploy writes, served over HTTP. */
export async function serveFleetImage(): Promise<{ image: { sha256: string; url: string }; stop(): Promise<void> }> {
  const cache = createImageCache();
  const sha256 = cache.put(simulatedDiskImage(`simulated disk image for the fleet bench\n`.repeat(256)));
  const served = await cache.serve();
  return { image: { sha256, url: `${served.url}/images/${sha256}` }, stop: () => served.stop() };
}

export const fleetSection: BenchSection = {
  id: "fleet",
  title: "Fleet: simulated machines from enroll to ready, one deploy (image-stream) and one release",
  async run(ctx: BenchContext) {
    const lanes = ctx.databaseUrl ? ctx.fleet.lanes : 1;
    if (!ctx.databaseUrl && ctx.fleet.lanes > 1) ctx.log("BENCH_FLEET_LANES is ignored on PGlite: its database lives in the one process");
    ctx.log(
      lanes > 1
        ? `${lanes} lanes: child processes, each one site (the engine and metal module, the Redfish emulator, a site agent and one agent per booted machine) with its own pool of 20 connections over TCP (node-postgres) to DATABASE_URL's Postgres, all on one schema made for the run`
        : `one process: ${ctx.databaseUrl ? "" : "PGlite, "}the engine and metal module, the Redfish emulator, a site agent and one agent per booted machine` +
            (ctx.databaseUrl ? "; DATABASE_URL's Postgres (a schema per run), one pool of 20 connections over TCP (node-postgres)" : ""),
    );
    ctx.log(
      `an enroll, deploy or undeploy request per machine, ${IN_FLIGHT} in flight; a phase ends when every machine is in its target state`,
    );
    const rows: string[][] = [];
    const memory: string[][] = [];
    const phaseSeconds = new Map<number, number[]>();
    for (const size of ctx.fleet.sizes) {
      const served = await serveFleetImage();
      const { image } = served;
      const ids = machineIds(size);
      const fleet =
        lanes > 1 ? await laneFleet(ctx.databaseUrl!, ids, lanes, ctx.profile) : await inProcessFleet(ctx.databaseUrl, ids, ctx.profile);
      try {
        phaseSeconds.set(size, []);
        for (const [name, phase, into] of FLEET_PHASES) {
          const before = await counters(fleet);
          await fleet.stats(true);
          const t0 = performance.now();
          await fleet.start(phase, image);
          await allIn(fleet, size, into, ctx);
          const seconds = (performance.now() - t0) / 1000;
          phaseSeconds.get(size)!.push(seconds);
          const after = await counters(fleet);
          const stats = await fleet.stats(false);
          // Where the database time went (on Postgres, where the driver times each round trip).
          if (ctx.databaseUrl)
            printQueryStats(ctx, `${size} machines, ${name}: round trips by query kind`, stats.queries, { count: size, unit: "machine" });
          if (stats.profile) {
            ctx.log(
              `${size} machines, ${name}: where the simulating process${lanes > 1 ? "es'" : "'s"} CPU went (profiled: slower than unprofiled)`,
            );
            for (const line of profileLines(stats.profile, size, "machine")) ctx.log(`  ${line}`);
          }
          // Ready machines are off (no agent); deployed ones each run their installed system's agent.
          memory.push([
            String(size),
            `${into} (${into === "deployed" ? "an agent connected each" : "no agent"})`,
            ...perMachine(stats, size),
          ]);
          const transitions = after.transitions - before.transitions;
          const steps = after.steps - before.steps;
          const trips = after.roundTrips - before.roundTrips - (after.observerTrips - before.observerTrips);
          rows.push([
            String(size),
            name,
            seconds.toFixed(1),
            String(transitions),
            (transitions / seconds).toFixed(1),
            (steps / seconds).toFixed(1),
            (trips / transitions).toFixed(0),
            (trips / steps).toFixed(1),
          ]);
        }
        await checkInvariants(fleet, size);
      } finally {
        await fleet.stop();
        await served.stop();
      }
    }
    ctx.table(
      ["machines", "phase", "wall s", "transitions", "transitions/s", "steps/s", "round trips/transition", "round trips/step"],
      rows,
    );
    ctx.log(
      "a transition is one change of a machine's lifecycle state (metal_transitions); each phase is two per machine, and each rides on a workflow of 5 to 10 steps",
    );
    ctx.log(
      "round trips count everything the phase did (API requests, joins, sessions, the engine, the reconciler), the bench's own polling subtracted",
    );
    ctx.log("Walkthrough 1's invariants held over every machine: one attested wipe before each ready, no destructive command twice");
    ctx.table(["machines", "after the phase into", "RSS MiB", "heap MiB", "RSS KiB/machine", "heap KiB/machine"], memory);
    ctx.log(
      `memory: the growth of the simulating process${lanes > 1 ? "es (summed over the lanes)" : ""} since before the sim started (the emulated BMCs, disks, agents and, on PGlite, the database), per machine`,
    );
    for (const line of targetLines(phaseSeconds)) ctx.log(line);
  },
};

/** Issue 14's fleet targets beside this run's figures: 1,000 machines enroll → ready in under 60 s, 10,000 through all three phases in under 20 minutes. */
function targetLines(phaseSeconds: Map<number, number[]>): string[] {
  const thousand = phaseSeconds.get(1000)?.[0];
  const tenThousand = phaseSeconds.get(10_000)?.reduce((sum, s) => sum + s, 0);
  return [
    `1000 machines, enroll → ready: ${thousand === undefined ? "not run (BENCH_FLEET=1000)" : `${thousand.toFixed(1)} s ${target("< 60 s", thousand < 60)}`}`,
    `10000 machines, enroll → ready → deployed → ready: ${tenThousand === undefined ? "not run (BENCH_FLEET=10000 BENCH_FLEET_TIMEOUT=3000 runs it)" : `${(tenThousand / 60).toFixed(1)} min ${target("< 20 min", tenThousand < 20 * 60)}`}`,
  ];
}

/** The simulated machines, in this process or in lanes; the bench's own reads are not in its round trips. */
export interface Fleet {
  /** A store on the fleet's database, for Walkthrough 1's checks. */
  store: NodeStore;
  /** The bench's own reads (progress, counters): their round trips are subtracted from the fleet's. */
  read(query: SQL): Promise<Record<string, unknown>[]>;
  /** Sends every machine's request of the phase; resolves once all are answered. */
  start(phase: FleetPhase, image: { sha256: string; url: string }): Promise<void>;
  /** The control planes' round trips so far, per query kind since the last reset, and the simulating processes' memory. */
  stats(reset: boolean): Promise<LaneStats>;
  /** The round trips of read() so far that the fleet's count includes (PGlite counts every statement at its server). */
  observerTrips(): number;
  stop(): Promise<void>;
}

/** The whole fleet in this process: one site, one control plane. */
async function inProcessFleet(databaseUrl: string | undefined, ids: string[], profile: boolean): Promise<Fleet> {
  const site = await startSite({ ids, inFlight: IN_FLIGHT, profile, ...(databaseUrl ? { databaseUrl } : {}) });
  const { sim } = site;
  let observed = 0;
  return {
    store: sim.store,
    async read(query) {
      const before = sim.roundTrips();
      try {
        return (await sim.store.db.execute(query)).rows;
      } finally {
        observed += sim.roundTrips() - before;
      }
    },
    start: (phase, image) => site.start(phase, image),
    stats: (reset) => site.stats(reset),
    observerTrips: () => observed,
    stop: () => site.stop(),
  };
}

/** The fleet split into lanes: child processes (bench/fleet-lane.ts), a site each, on one schema. */
async function laneFleet(databaseUrl: string, ids: string[], lanes: number, profile: boolean): Promise<Fleet> {
  const made = await createSimSchema(databaseUrl);
  const store = postgres({ hyperdrive: { connectionString: inSchema(databaseUrl, made.schema) }, maxConnections: 2 }).open({});
  return laneProcesses(ids, lanes, { databaseUrl, schema: made.schema, profile }, store, async () => {
    await store.close();
    await made.drop();
  });
}

/**
 * The machines split over `lanes` child processes (bench/fleet-lane.ts), a site each, started one
 * after another (the first may make the tables and the deployment's keys), and the fleet over them.
 * `store` reads the fleet's database; `release` undoes what the caller set up, once the lanes stopped.
 */
export async function laneProcesses(
  ids: string[],
  lanes: number,
  common: Omit<LaneConfig, "siteId" | "ids" | "inFlight">,
  store: NodeStore,
  release: () => Promise<void>,
): Promise<Fleet & { pids: number[] }> {
  const children: Lane[] = [];
  const stop = async () => {
    await Promise.all(children.map((lane) => lane.stop()));
    await release();
  };
  try {
    for (let k = 0; k < lanes; k++) {
      children.push(
        await startLane({
          ...common,
          siteId: `sim-site-${k + 1}`,
          ids: ids.filter((_, i) => i % lanes === k),
          inFlight: Math.ceil(IN_FLIGHT / lanes),
        }),
      );
    }
  } catch (err) {
    await stop();
    throw err;
  }
  return {
    pids: children.map((lane) => lane.pid),
    store,
    read: async (query) => (await store.db.execute(query)).rows,
    start: (phase, image) => Promise.all(children.map((lane) => lane.ask({ op: "phase", phase, image }))).then(() => undefined),
    async stats(reset) {
      const all = (await Promise.all(children.map((lane) => lane.ask({ op: "stats", reset })))) as LaneStats[];
      const ran: Record<string, number> = {};
      for (const s of all) for (const [kind, n] of Object.entries(s.ran)) ran[kind] = (ran[kind] ?? 0) + n;
      return {
        roundTrips: all.reduce((n, s) => n + s.roundTrips, 0),
        queries: mergeQueries(all.map((s) => s.queries)),
        ran,
        rssBytes: all.reduce((n, s) => n + s.rssBytes, 0),
        heapBytes: all.reduce((n, s) => n + s.heapBytes, 0),
        ...(common.profile ? { profile: mergeProfiles(all.map((s) => s.profile!)) } : {}),
      };
    },
    observerTrips: () => 0,
    stop,
  };
}

interface Lane {
  /** The lane's process id (its CPU time is read from /proc). */
  pid: number;
  ask(request: DistributiveOmit<LaneRequest, "id">): Promise<LaneStats | undefined>;
  stop(): Promise<void>;
}
type DistributiveOmit<T, K extends keyof T> = T extends unknown ? Omit<T, K> : never;

const LANE_ENTRY = fileURLToPath(new URL("./fleet-lane.ts", import.meta.url));

/** Forks a lane and waits until its sim is up; a lane that dies fails what was asked of it. */
async function startLane(config: LaneConfig): Promise<Lane> {
  const child: ChildProcess = fork(LANE_ENTRY, [], {
    execArgv: ["--import", "tsx"],
    env: { ...process.env, BENCH_LANE: JSON.stringify(config) },
    stdio: ["ignore", "inherit", "inherit", "ipc"],
  });
  const waiting = new Map<number, { resolve(v: LaneStats | undefined): void; reject(e: Error): void }>();
  let nextId = 1;
  let exited: Error | undefined;
  child.on("message", (answer: LaneAnswer) => {
    const waiter = waiting.get(answer.id);
    waiting.delete(answer.id);
    if (answer.ok) waiter?.resolve(answer.value);
    else waiter?.reject(new Error(`lane ${config.siteId}: ${answer.error}`));
  });
  child.on("exit", (code, signal) => {
    exited = new Error(`lane ${config.siteId} exited (${signal ?? `code ${code}`})`);
    for (const waiter of waiting.values()) waiter.reject(exited);
    waiting.clear();
  });
  const answer = (id: number) =>
    new Promise<LaneStats | undefined>((resolve, reject) => {
      if (exited) return reject(exited);
      waiting.set(id, { resolve, reject });
    });
  await answer(0);
  const ask = (request: DistributiveOmit<LaneRequest, "id">) => {
    const id = nextId++;
    const answered = answer(id);
    child.send({ ...request, id });
    return answered;
  };
  return {
    pid: child.pid!,
    ask,
    async stop() {
      if (exited) return;
      const gone = new Promise((resolve) => child.once("exit", resolve));
      await ask({ op: "stop" }).catch(() => {});
      const killed = setTimeout(() => child.kill("SIGKILL"), 10_000);
      await gone;
      clearTimeout(killed);
    },
  };
}

/** Walkthrough 1's checks over every machine: one attested wipe before each ready, no destructive command twice. */
export async function checkInvariants(fleet: Fleet, size: number): Promise<void> {
  const intoReady = await transitionsIntoReady(fleet.store);
  const wrong = intoReady.filter((t) => t.attested_wipes !== 1);
  // Commissioning and one release per machine.
  if (intoReady.length !== 2 * size || wrong.length)
    throw new Error(
      `${intoReady.length} transitions into ready (want ${2 * size}), ${wrong.length} without exactly one attested wipe: ${JSON.stringify(wrong.slice(0, 3))}`,
    );
  const twice = await destructiveTwice(fleet.store);
  if (twice.length) throw new Error(`destructive commands done twice: ${JSON.stringify(twice.slice(0, 3))}`);
  // And the agents ran each destructive command they were sent once.
  const { ran } = await fleet.stats(false);
  const enqueued = await fleet.read(sql`SELECT kind, count(*)::int AS n FROM bc_commands WHERE destructive GROUP BY kind`);
  for (const { kind, n } of enqueued as { kind: string; n: number }[]) {
    if ((ran[kind] ?? 0) !== n) throw new Error(`${kind}: ${n} enqueued, ${ran[kind] ?? 0} run by the agents`);
  }
}

export function perMachine(stats: LaneStats, size: number): string[] {
  const { rssBytes: rss, heapBytes: heap } = stats;
  return [(rss / 2 ** 20).toFixed(0), (heap / 2 ** 20).toFixed(0), (rss / 1024 / size).toFixed(0), (heap / 1024 / size).toFixed(0)];
}

export async function counters(fleet: Fleet) {
  const [row] = (await fleet.read(sql`
    SELECT (SELECT count(*)::int FROM metal_transitions) AS transitions, (SELECT count(*)::int FROM workflow_steps WHERE state = 'succeeded') AS steps`)) as {
    transitions: number;
    steps: number;
  }[];
  return { ...row!, roundTrips: (await fleet.stats(false)).roundTrips, observerTrips: fleet.observerTrips() };
}

const PROGRESS_MS = 30_000;

export async function allIn(fleet: Fleet, size: number, state: string, ctx: BenchContext): Promise<void> {
  const started = performance.now();
  let reported = started;
  for (;;) {
    const found = await fleet.read(sql`SELECT state, count(*)::int AS n FROM metal_nodes GROUP BY state`);
    const counts = Object.fromEntries((found as { state: string; n: number }[]).map((r) => [r.state, r.n]));
    if (counts[state] === size) return;
    // A 1,000-machine phase takes minutes: say where the machines are now and then.
    if (performance.now() - reported >= PROGRESS_MS) {
      reported = performance.now();
      ctx.log(`${size} machines, ${Math.round((reported - started) / 1000)} s: ${JSON.stringify(counts)}`);
    }
    if (counts.failed) {
      // Where the time went: the failed machines' errors, and how long commands waited for delivery and ran.
      const failed = await fleet.read(sql`SELECT id, last_error FROM metal_nodes WHERE state = 'failed' ORDER BY id LIMIT 3`);
      const commands = await fleet.read(sql`
        SELECT state, count(*)::int AS n, round(avg(extract(epoch FROM delivered_at - created_at))::numeric, 1)::float8 AS wait_s,
               round(avg(extract(epoch FROM completed_at - delivered_at))::numeric, 1)::float8 AS run_s
        FROM bc_commands GROUP BY state`);
      throw new Error(
        `${counts.failed} machine(s) failed: ${JSON.stringify(counts)}; ${failed.map((r) => JSON.stringify(r)).join("; ")}; commands: ${JSON.stringify(commands)}`,
      );
    }
    if (performance.now() - started > ctx.fleet.timeoutSeconds * 1000)
      throw new Error(`not all ${size} machines reached ${state} in ${ctx.fleet.timeoutSeconds} s: ${JSON.stringify(counts)}`);
    await new Promise((r) => setTimeout(r, POLL_MS));
  }
}
