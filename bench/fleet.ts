// Fleet: N simulated machines (createMetalSim: emulated Redfish BMCs, simulated disks, real
// agents, engine, metal module and PGlite, or DATABASE_URL's Postgres) taken from enroll to ready,
// then through one image-stream deploy and one release. Per phase: wall time, lifecycle transitions
// per second, workflow steps per second, and Postgres round trips per transition (counted by the
// embedded PGlite server, or at the driver on Postgres). Then Walkthrough 1's invariants over every
// machine, in SQL (the run fails when one does not hold), and memory per machine.
import v8 from "node:v8";
import vm from "node:vm";
import { sql } from "drizzle-orm";
import { createImageCache } from "../agent/roles/image-cache.ts";
import { createMetalSim, destructiveTwice, transitionsIntoReady, type MetalSim } from "../agent/testing/metal-sim.ts";
import type { BenchContext, BenchSection } from "./run.ts";
import { printQueryStats, QueryStats } from "./query-stats.ts";
import { mapLimit } from "./stack.ts";

const POLL_MS = 250;

export const fleetSection: BenchSection = {
  id: "fleet",
  title: "Fleet: simulated machines from enroll to ready, one deploy (image-stream) and one release",
  async run(ctx: BenchContext) {
    ctx.log(
      `one process: ${ctx.databaseUrl ? "" : "PGlite, "}the engine and metal module, the Redfish emulator, a site agent and one agent per booted machine` +
        (ctx.databaseUrl ? "; DATABASE_URL's Postgres (a schema per run), one pool of 20 connections over TCP (node-postgres)" : ""),
    );
    ctx.log("an enroll, deploy or undeploy request per machine, 16 in flight; a phase ends when every machine is in its target state");
    const rows: string[][] = [];
    const memory: string[][] = [];
    for (const size of ctx.fleet.sizes) {
      const base = memoryNow();
      const cache = createImageCache();
      const image = { sha256: cache.put(new TextEncoder().encode(`simulated disk image for the fleet bench\n`.repeat(256))), url: "" };
      const served = await cache.serve();
      image.url = `${served.url}/images/${image.sha256}`;
      const queries = new QueryStats();
      const sim = await createMetalSim({
        machines: size,
        ...(ctx.databaseUrl ? { databaseUrl: ctx.databaseUrl, onRoundTrip: queries.record } : {}),
      });
      try {
        const ids = sim.machines.map((_, i) => `m-${String(i).padStart(4, "0")}`);
        const phases: [string, () => Promise<void>, string][] = [
          ["enroll → ready", () => each(ids, (id, i) => sim.enroll(sim.machines[i]!, { id })), "ready"],
          [
            "ready → deployed",
            () => each(ids, (id) => sim.call("metal.deploy", { node: id, profile: "metal.deploy.image-stream", input: { image } })),
            "deployed",
          ],
          ["deployed → ready", () => each(ids, (id) => sim.call("metal.undeploy", { node: id })), "ready"],
        ];
        for (const [name, start, target] of phases) {
          const before = await counters(sim);
          queries.reset();
          const t0 = performance.now();
          await start();
          await allIn(sim, size, target, ctx);
          const seconds = (performance.now() - t0) / 1000;
          const after = await counters(sim);
          // Where the database time went (on Postgres, where the driver times each round trip).
          if (ctx.databaseUrl)
            printQueryStats(ctx, `${size} machines, ${name}: round trips by query kind`, queries.snapshot(), {
              count: size,
              unit: "machine",
            });
          // Ready machines are off (no agent); deployed ones each run their installed system's agent.
          memory.push([
            String(size),
            `${target} (${target === "deployed" ? "an agent connected each" : "no agent"})`,
            ...perMachine(base, size),
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
        await checkInvariants(sim, size);
      } finally {
        await sim.stop();
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
      "memory: this process's growth since before the sim started (the emulated BMCs, disks, agents and, on PGlite, the database), per machine",
    );
  },
};

const each = (ids: string[], fn: (id: string, i: number) => Promise<unknown>) => mapLimit(ids, 16, fn).then(() => undefined);

/** Walkthrough 1's checks over every machine: one attested wipe before each ready, no destructive command twice. */
async function checkInvariants(sim: MetalSim, size: number): Promise<void> {
  const intoReady = await transitionsIntoReady(sim.store);
  const wrong = intoReady.filter((t) => t.attested_wipes !== 1);
  // Commissioning and one release per machine.
  if (intoReady.length !== 2 * size || wrong.length)
    throw new Error(
      `${intoReady.length} transitions into ready (want ${2 * size}), ${wrong.length} without exactly one attested wipe: ${JSON.stringify(wrong.slice(0, 3))}`,
    );
  const twice = await destructiveTwice(sim.store);
  if (twice.length) throw new Error(`destructive commands done twice: ${JSON.stringify(twice.slice(0, 3))}`);
  // And the agents ran each destructive command they were sent once.
  const enqueued = await sim.store.db.execute(sql`SELECT kind, count(*)::int AS n FROM bc_commands WHERE destructive GROUP BY kind`);
  for (const { kind, n } of enqueued.rows as { kind: string; n: number }[]) {
    const ran = sim.commandsSeen.filter((c) => c.kind === kind).length;
    if (ran !== n) throw new Error(`${kind}: ${n} enqueued, ${ran} run by the agents`);
  }
}

// A collection before each reading, so the figures are what is live, not what awaits the collector.
v8.setFlagsFromString("--expose-gc");
const gc = vm.runInNewContext("gc") as () => void;

function memoryNow() {
  gc();
  const { rss, heapUsed } = process.memoryUsage();
  return { rss, heapUsed };
}

function perMachine(base: ReturnType<typeof memoryNow>, size: number): string[] {
  const now = memoryNow();
  const rss = now.rss - base.rss;
  const heap = now.heapUsed - base.heapUsed;
  return [(rss / 2 ** 20).toFixed(0), (heap / 2 ** 20).toFixed(0), (rss / 1024 / size).toFixed(0), (heap / 1024 / size).toFixed(0)];
}

let observerTrips = 0;

async function counters(sim: MetalSim) {
  const before = sim.roundTrips();
  const found = await sim.store.db.execute(sql`
    SELECT (SELECT count(*)::int FROM metal_transitions) AS transitions, (SELECT count(*)::int FROM workflow_steps WHERE state = 'succeeded') AS steps`);
  observerTrips += sim.roundTrips() - before;
  const row = found.rows[0] as { transitions: number; steps: number };
  return { ...row, roundTrips: sim.roundTrips(), observerTrips };
}

const PROGRESS_MS = 30_000;

async function allIn(sim: MetalSim, size: number, state: string, ctx: BenchContext): Promise<void> {
  const started = performance.now();
  let reported = started;
  for (;;) {
    const before = sim.roundTrips();
    const found = await sim.store.db.execute(sql`SELECT state, count(*)::int AS n FROM metal_nodes GROUP BY state`);
    observerTrips += sim.roundTrips() - before;
    const counts = Object.fromEntries((found.rows as { state: string; n: number }[]).map((r) => [r.state, r.n]));
    if (counts[state] === size) return;
    // A 1,000-machine phase takes minutes: say where the machines are now and then.
    if (performance.now() - reported >= PROGRESS_MS) {
      reported = performance.now();
      ctx.log(`${size} machines, ${Math.round((reported - started) / 1000)} s: ${JSON.stringify(counts)}`);
    }
    if (counts.failed) {
      // Where the time went: the failed machines' errors, and how long commands waited for delivery and ran.
      const failed = await sim.store.db.execute(sql`SELECT id, last_error FROM metal_nodes WHERE state = 'failed' ORDER BY id LIMIT 3`);
      const commands = await sim.store.db.execute(sql`
        SELECT state, count(*)::int AS n, round(avg(extract(epoch FROM delivered_at - created_at))::numeric, 1)::float8 AS wait_s,
               round(avg(extract(epoch FROM completed_at - delivered_at))::numeric, 1)::float8 AS run_s
        FROM bc_commands GROUP BY state`);
      throw new Error(
        `${counts.failed} machine(s) failed: ${JSON.stringify(counts)}; ${failed.rows.map((r) => JSON.stringify(r)).join("; ")}; commands: ${JSON.stringify(commands.rows)}`,
      );
    }
    if (performance.now() - started > ctx.fleet.timeoutSeconds * 1000)
      throw new Error(`not all ${size} machines reached ${state} in ${ctx.fleet.timeoutSeconds} s: ${JSON.stringify(counts)}`);
    await new Promise((r) => setTimeout(r, POLL_MS));
  }
}
