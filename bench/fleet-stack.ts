// Fleet through the deployed shape: the fleet section's three phases (enroll → ready, one
// image-stream deploy, one release) run against `wrangler dev`'s workerd serving the API Worker,
// the JoinService, the agent gateway, the NodeDOs, the WorkflowDOs and the SinkDO, as a local
// deployment runs them. The simulated machines live in their own processes (bench/fleet-lane.ts
// without a control plane): their emulated Redfish BMCs and simulated disks, and their site agent,
// ramdisk agents and installed-OS agents, which join with real credentials, dial real WebSockets
// to the gateway and sign their results. Enroll, deploy and undeploy go through the HTTP API with
// the operator's key, as a script would. The database is PGlite (served from this process) or
// DATABASE_URL's Postgres through the HYPERDRIVE binding (and pgbouncer), the deployed driver path.
//
// Per phase: wall time, transitions and workflow steps per second, round trips per transition
// (counted at the Worker's driver: every store the Worker and its Durable Objects open), CPU seconds
// per process, and memory per machine in workerd and in the database apart from the simulators.
// Then where the round trips went, per query kind, and (BENCH_PROFILE=1) where workerd's CPU went,
// per module. Walkthrough 1's invariants are checked over every machine, as in the fleet section.
import { openNodeStore } from "../local/node-store.ts";
import type { BenchContext, BenchSection } from "./run.ts";
import { allIn, checkInvariants, counters, FLEET_PHASES, IN_FLIGHT, laneProcesses, machineIds, serveFleetImage } from "./fleet.ts";
import { printQueryStats, readQueryStats } from "./query-stats.ts";
import { collectGarbage, processesNamed, processStats, processTree, type ProcessStat } from "./proc.ts";
import { profileLines, profileWorker } from "./profile.ts";
import { emptyPublicSchema, target, withStack, type BenchStack } from "./stack.ts";

/** OpenStack Ironic's fake-hardware conductor on this machine: 1,000 machines enroll → available → active → available (issue 34). */
const IRONIC_FAKE_HARDWARE_1000_S = 376;

export const fleetStackSection: BenchSection = {
  id: "fleet-stack",
  title:
    "Fleet through the deployed shape: workerd (API Worker, NodeDOs, WorkflowDOs), machines simulated in their own processes over real WebSockets",
  async run(ctx: BenchContext) {
    const lanes = ctx.fleet.stackLanes;
    ctx.log(
      `wrangler dev's workerd serves the API Worker and its Durable Objects; ${lanes} simulating process${lanes > 1 ? "es" : ""} (BENCH_FLEET_STACK_LANES), a site each: emulated Redfish BMCs and simulated disks (SIMULATED), the site agent, ramdisk and installed-OS agents (real AgentClients: real join tokens, real WebSockets to the gateway, signed results)`,
    );
    ctx.log(
      `the operator's requests go to the HTTP API (${IN_FLIGHT} in flight over all processes); the database: ${ctx.databaseUrl ? "DATABASE_URL's Postgres through the HYPERDRIVE binding, as deployed" : "PGlite, served from the bench's own process"}; a fresh stack for each fleet size`,
    );
    const rows: string[][] = [];
    const cpuRows: string[][] = [];
    const memoryRows: string[][] = [];
    const totals = new Map<number, number>();
    for (const size of ctx.fleet.sizes) {
      if (ctx.databaseUrl) await emptyPublicSchema(ctx.databaseUrl);
      await withStack(ctx, `fleet-stack-${size}`, async (stack) => {
        // Hyperdrive pools a deployment's connections; without pgbouncer standing in for it, every
        // Durable Object opens its own, and Postgres refused them ("too many clients") at 100 machines.
        if (!stack.embedded && !stack.pooled)
          ctx.log(
            "warning: no pgbouncer between the Worker and DATABASE_URL (apt-get install pgbouncer): every Durable Object opens connections of its own, not as deployed behind Hyperdrive; Postgres may refuse them (too many clients)",
          );
        const served = await serveFleetImage();
        const { image } = served;
        const before = controlPlaneMemory(stack);
        const store = await openNodeStore(stack.databaseUrl);
        // The lanes' agents dial the stack and their operator calls go to its API; this process follows them in the database.
        const stackForLanes = { url: stack.url, adminKey: stack.adminKey, databaseUrl: stack.databaseUrl };
        const fleet = await laneProcesses(machineIds(size), lanes, { stack: stackForLanes, profile: false }, store, () => store.close());
        try {
          let total = 0;
          for (const [name, phase, into] of FLEET_PHASES) {
            const counted = await counters(fleet);
            await readQueryStats(stack.url, true);
            const cpu0 = cpuNow(fleet.pids, stack.embedded);
            const t0 = performance.now();
            let answered = 0;
            const running = async () => {
              await fleet.start(phase, image);
              answered = (performance.now() - t0) / 1000;
              await allIn(fleet, size, into, ctx);
            };
            if (ctx.profile) {
              const { profile } = await profileWorker(stack.inspectorPort, stack.bundleFile, running);
              ctx.log(`${size} machines, ${name}: where workerd's CPU went (profiled: slower than unprofiled)`);
              for (const line of profileLines(profile, size, "machine")) ctx.log(`  ${line}`);
            } else await running();
            const seconds = (performance.now() - t0) / 1000;
            total += seconds;
            const cpu = cpuSince(cpu0, cpuNow(fleet.pids, stack.embedded));
            const queries = await readQueryStats(stack.url);
            printQueryStats(ctx, `${size} machines, ${name}: the Worker's round trips by query kind`, queries, {
              count: size,
              unit: "machine",
            });
            const after = await counters(fleet);
            const transitions = after.transitions - counted.transitions;
            const steps = after.steps - counted.steps;
            const trips = queries.reduce((n, q) => n + q.count, 0);
            rows.push([
              String(size),
              name,
              seconds.toFixed(1),
              answered.toFixed(1),
              String(transitions),
              (transitions / seconds).toFixed(1),
              (steps / seconds).toFixed(1),
              (trips / transitions).toFixed(0),
            ]);
            cpuRows.push([String(size), name, ...CPU_GROUPS.map((g) => (cpu[g] ?? 0).toFixed(1))]);
            const now = controlPlaneMemory(stack);
            const simulators = await fleet.stats(false);
            memoryRows.push([
              String(size),
              `${into} (${into === "deployed" ? "an agent connected each" : "no machine agent"})`,
              mib(now.workerd),
              perMachineKiB(now.workerd - before.workerd, size),
              mib(now.database),
              perMachineKiB(now.database - before.database, size),
              mib(simulators.rssBytes),
            ]);
          }
          totals.set(size, total);
          await checkInvariants(fleet, size);
        } catch (err) {
          const tail = stack.wranglerTail();
          if (tail.length) ctx.log(`last wrangler output:\n    ${tail.join("\n    ")}`);
          throw err;
        } finally {
          await fleet.stop();
          await served.stop();
        }
      });
    }
    ctx.table(
      ["machines", "phase", "wall s", "requests answered s", "transitions", "transitions/s", "steps/s", "round trips/transition"],
      rows,
    );
    ctx.log(
      `a transition is one change of a machine's lifecycle state (metal_transitions), two per machine in each phase; "requests answered": when the last of the phase's enroll, deploy or undeploy requests (${IN_FLIGHT} in flight) was answered; round trips are the Worker's and its Durable Objects' (the bench's own polling is not among them)`,
    );
    ctx.table(["machines", "phase", ...CPU_GROUPS.map((g) => `CPU s: ${g}`)], cpuRows);
    ctx.log(
      `CPU seconds (user + system) each group of processes spent in the phase: ${Object.entries(CPU_MEANING)
        .map(([g, meaning]) => `${g} = ${meaning}`)
        .join("; ")}`,
    );
    ctx.table(
      ["machines", "after the phase into", "workerd MiB", "workerd KiB/machine", "database MiB", "database KiB/machine", "simulators MiB"],
      memoryRows,
    );
    ctx.log(
      `memory: workerd's RSS (both its processes) and the database's (${ctx.databaseUrl ? "Postgres: the Pss of every postgres process, shared buffers counted once, and pgbouncer's RSS" : "PGlite: the bench process's RSS, which holds it"}); per machine, the growth since before the simulators started; the simulators' growth is apart`,
    );
    ctx.log("Walkthrough 1's invariants held over every machine: one attested wipe before each ready, no destructive command twice");
    const thousand = totals.get(1000);
    ctx.log(
      `1000 machines through the three phases: ${thousand === undefined ? "not run (BENCH_FLEET=1000)" : `${thousand.toFixed(1)} s ${target(`< ${IRONIC_FAKE_HARDWARE_1000_S} s, Ironic fake-hardware's here`, thousand < IRONIC_FAKE_HARDWARE_1000_S)}`}`,
    );
  },
};

const CPU_GROUPS = ["workerd", "database", "simulators", "bench and wrangler"] as const;
type CpuGroup = (typeof CPU_GROUPS)[number];
const CPU_MEANING: Record<CpuGroup, string> = {
  workerd: "the Worker and its Durable Objects",
  database: "Postgres's processes and pgbouncer, or on PGlite the bench process that serves it (with the bench's polling)",
  simulators: "the simulating processes (BMCs, disks, agents, the operator's requests)",
  "bench and wrangler": "wrangler dev's Node process and, on Postgres, the bench process",
};

/** CPU seconds so far of every process that takes part, by group. */
function cpuNow(simulators: number[], embeddedDatabase: boolean): Map<number, { group: CpuGroup; cpuSeconds: number }> {
  const now = new Map<number, { group: CpuGroup; cpuSeconds: number }>();
  const lanes = new Set(simulators);
  const add = (p: ProcessStat, group: CpuGroup) => now.set(p.pid, { group, cpuSeconds: p.cpuSeconds });
  for (const p of processStats()) {
    if (lanes.has(p.pid)) add(p, "simulators");
    else if (p.name === "workerd") add(p, "workerd");
    else if (p.name === "pgbouncer") add(p, "database");
    else if (p.pid === process.pid) add(p, embeddedDatabase ? "database" : "bench and wrangler");
    else add(p, "bench and wrangler");
  }
  if (!embeddedDatabase) for (const p of processesNamed("postgres")) add(p, "database");
  return now;
}

/** Each group's CPU seconds between two readings (a process that started meanwhile counts from 0). */
function cpuSince(
  before: Map<number, { cpuSeconds: number }>,
  after: Map<number, { group: CpuGroup; cpuSeconds: number }>,
): Partial<Record<CpuGroup, number>> {
  const spent: Partial<Record<CpuGroup, number>> = {};
  for (const [pid, p] of after) spent[p.group] = (spent[p.group] ?? 0) + p.cpuSeconds - (before.get(pid)?.cpuSeconds ?? 0);
  return spent;
}

/** workerd's and the database's memory now, in bytes. */
function controlPlaneMemory(stack: BenchStack): { workerd: number; database: number } {
  // PGlite's memory is this process's: collected first, so garbage is not counted as the database's.
  if (stack.embedded) collectGarbage();
  const tree = processTree();
  const sum = (name: string) => tree.filter((p) => p.name === name).reduce((n, p) => n + p.rssBytes, 0);
  const database = stack.embedded
    ? (tree.find((p) => p.pid === process.pid)?.rssBytes ?? 0)
    : processesNamed("postgres").reduce((n, p) => n + p.pssBytes, 0) + sum("pgbouncer");
  return { workerd: sum("workerd"), database };
}

const mib = (bytes: number) => (bytes / 2 ** 20).toFixed(0);
const perMachineKiB = (bytes: number, size: number) => (bytes / 1024 / size).toFixed(0);
