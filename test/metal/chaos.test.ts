// Crash safety of metal on the simulated site: the control plane dies at every transaction
// boundary of a deploy (metal.deploy.image-stream) and of a release (metal.release), once before
// the commit and once after it. The boundaries are the transactions of the workflow runner and
// the reconcilers (what the WorkflowDO and the cron run); a crash kills that process where it
// stood (ChaosPlan, testing/metal-sim-control-plane.ts) and the next one starts from
// Postgres. Every run must end in the right state, with each destructive command enqueued once
// per (workflow, step position, attempt) and run once, the BMC powered exactly as the profile
// asks, and each lifecycle event recorded once.
//
// Every boundary is covered, none sampled. The runs are spread over a few lanes (a simulated
// site with its own control plane, database and chaos plan, and one machine that alternates
// deploy and release), run side by side to keep the whole under two minutes.
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, expect, it, vi } from "vitest";
import { ChaosPlan, createMetalSim, type ChaosBoundary, type MetalSim, type SimMachine } from "better-compute/testing/metal";
import { createImageCache, simulatedDiskImage } from "../../testing/image-server.ts";
import { quietCrashReports } from "../support/quiet-crash-reports.ts";

const LANES = 4;
const BOUNDARIES: ChaosBoundary[] = ["before-commit", "after-commit"];
const DESTRUCTIVE = ["metal.bmc.power", "metal.ramdisk.wipe", "metal.ramdisk.writeImage"] as const;

type Phase = "deploy" | "release";
/** What a phase ends in and does, each exactly once. */
const PHASES = {
  deploy: {
    to: "deployed",
    events: ["deploy", "deployed"],
    // power.cycle, image.write, power.reboot.
    commands: { "metal.bmc.power": 2, "metal.ramdisk.wipe": 0, "metal.ramdisk.writeImage": 1 },
    // A ready machine is off: the cycle powers it on, the reboot is off and on.
    power: ["On", "Off", "On"],
  },
  release: {
    to: "ready",
    events: ["undeploy", "released"],
    // power.cycle, disk.wipe, power.off.
    commands: { "metal.bmc.power": 2, "metal.ramdisk.wipe": 1, "metal.ramdisk.writeImage": 0 },
    // A deployed machine is on: the cycle is off and on, then off.
    power: ["Off", "On", "Off"],
  },
} as const;

const cache = createImageCache();
const image = cache.put(simulatedDiskImage("a simulated host image\n".repeat(2000)));
let images: { url: string; stop(): Promise<void> };

interface Lane {
  sim: MetalSim;
  chaos: ChaosPlan;
  machine: SimMachine;
  node: string;
  /** The phase its machine is ready for. */
  next: Phase;
}
const lanes: Lane[] = [];

beforeAll(async () => {
  quietCrashReports();
  images = await cache.serve();
  await Promise.all(
    Array.from({ length: LANES }, async (_, n) => {
      const chaos = new ChaosPlan();
      const sim = await createMetalSim({ chaos, siteId: `chaos-${n}` });
      const lane: Lane = { sim, chaos, machine: sim.machines[0]!, node: `m-chaos-${n}`, next: "deploy" };
      lanes.push(lane);
      await sim.enroll(lane.machine, { id: lane.node });
      const ready = await sim.waitForState(lane.node, ["ready", "failed"]);
      expect(ready.state, JSON.stringify(ready.lastError)).toBe("ready");
    }),
  );
}, 60_000);

afterAll(async () => {
  await Promise.all(lanes.map((l) => l.sim.stop()));
  await images?.stop();
  vi.restoreAllMocks();
});

const rows = async <T>(sim: MetalSim, query: ReturnType<typeof sql>) => (await sim.store.db.execute(query)).rows as T[];

/**
 * Runs the lane's next phase, crashing at transaction `at` (counted from the API call) if given,
 * and checks what it left: the end state, and nothing destructive done twice. Answers how many
 * transactions the run made and whether the crash happened.
 */
async function run(lane: Lane, at?: number, boundary: ChaosBoundary = "after-commit"): Promise<{ transactions: number; hit: boolean }> {
  const { sim, chaos, machine, node } = lane;
  const phase = lane.next;
  const expected = PHASES[phase];
  const label = `${phase} of ${node}, crashed at transaction ${at === undefined ? "none" : `${at} ${boundary}`}`;
  const powerBefore = machine.bmc.powerHistory.length;
  const seenBefore = sim.commandsSeen.length;
  const disk = machine.disks.disks.get("/dev/sda")!;
  const wipesBefore = disk.wipes;
  const eventsBefore = (await rows<{ last: string }>(sim, sql`SELECT coalesce(max(id), 0)::text AS last FROM bc_events`))[0]!.last;

  if (at === undefined) chaos.reset();
  else chaos.arm(at, boundary);
  const { workflow } =
    phase === "deploy"
      ? await sim.call<{ workflow: string }>("metal.deploy", {
          node,
          profile: "metal.deploy.image-stream",
          input: { image: { url: `${images.url}/images/${image}`, sha256: image } },
        })
      : await sim.call<{ workflow: string }>("metal.undeploy", { node });
  const ended = await sim.waitForState(node, [expected.to, "failed"]).catch(async (err: Error) => {
    throw new Error(`${label}: ${err.message}; where it stood: ${JSON.stringify(await stoodAt(sim, workflow))}`);
  });
  const outcome = { transactions: chaos.count, hit: chaos.hit };
  chaos.reset();
  lane.next = phase === "deploy" ? "release" : "deploy";

  expect(ended, label).toMatchObject({ state: expected.to, workflow, maintenance: false, lastError: null });
  const [wf] = await rows<{ state: string }>(sim, sql`SELECT state FROM workflows WHERE id = ${workflow}`);
  expect(wf?.state, label).toBe("succeeded");

  // A crash is not a failure: no attempt failed.
  const attempts = await rows<{ position: number; attempt: number; state: string; command_id: string | null }>(
    sim,
    sql`SELECT position, attempt, state, command_id::text FROM workflow_steps WHERE workflow_id = ${workflow} ORDER BY position, attempt`,
  );
  expect(
    attempts.filter((a) => a.state !== "succeeded"),
    label,
  ).toEqual([]);
  const retried = attempts.some((a) => a.attempt > 1);

  // Every command of the workflow is keyed by its (workflow, position, attempt), is the one that
  // attempt records, and succeeded: one command per attempt, none left over.
  const commands = await rows<{ id: string; kind: string; key: string; state: string }>(
    sim,
    sql`SELECT id::text, kind, idempotency_key AS key, state FROM bc_commands WHERE origin = ${`workflow:${workflow}`} ORDER BY id`,
  );
  for (const command of commands) {
    const what = `${label}: ${command.kind} ${command.key}`;
    const [, position, attempt] = /^wf:.+:(\d+):(\d+)$/.exec(command.key) ?? [];
    expect(command.key, what).toBe(`wf:${workflow}:${position}:${attempt}`);
    expect(
      attempts.filter((a) => a.command_id === command.id).map((a) => [a.position, a.attempt]),
      what,
    ).toEqual([[Number(position), Number(attempt)]]);
    expect(command.state, what).toBe("succeeded");
  }

  // Each destructive kind: enqueued as often as the profile asks, and run that often by the agents.
  const seen = sim.commandsSeen.slice(seenBefore);
  for (const kind of DESTRUCTIVE) {
    const enqueued = commands.filter((c) => c.kind === kind).length;
    expect(seen.filter((c) => c.kind === kind).length, `${label}: ${kind} run by the agents`).toBe(enqueued);
    if (!retried) expect(enqueued, `${label}: ${kind} enqueued`).toBe(expected.commands[kind]);
  }
  if (!retried) expect(machine.bmc.powerHistory.slice(powerBefore), `${label}: the BMC's power changes`).toEqual(expected.power);
  if (phase === "deploy") expect(disk.sha256, label).toBe(image);
  else expect(disk.wipes - wipesBefore, `${label}: wipes`).toBe(1);

  // The lifecycle: each event of the phase once, with its workflow; the workflow's and the
  // machine's events once each.
  const history = await rows<{ event: string }>(
    sim,
    sql`SELECT event FROM metal_transitions WHERE node_id = ${node} AND workflow_id = ${workflow} ORDER BY id`,
  );
  expect(
    history.map((h) => h.event),
    label,
  ).toEqual(expected.events);
  const events = await rows<{ type: string; step: string | null; n: number }>(
    sim,
    sql`SELECT type, data->>'step' AS step, count(*)::int AS n FROM bc_events
        WHERE id > ${eventsBefore}::bigint AND subject IN (${`workflows/${workflow}`}, ${`metal/nodes/${node}`}) GROUP BY 1, 2`,
  );
  expect(
    events.filter((e) => e.n !== 1),
    `${label}: events recorded more than once`,
  ).toEqual([]);
  expect(
    events
      .filter((e) => e.type.startsWith("metal.node."))
      .map((e) => e.type)
      .sort(),
    label,
  ).toEqual(expected.events.map((e) => `metal.node.${e}`).sort());
  return outcome;
}

/** A stuck workflow's steps and commands, for the failure message. */
async function stoodAt(sim: MetalSim, workflow: string) {
  return {
    workflow: await rows(sim, sql`SELECT state, position, error FROM workflows WHERE id = ${workflow}`),
    steps: await rows(
      sim,
      sql`SELECT position, name, attempt, state, error, command_id::text FROM workflow_steps WHERE workflow_id = ${workflow} ORDER BY position, attempt`,
    ),
    commands: await rows(
      sim,
      sql`SELECT id::text, node_id, kind, state, error FROM bc_commands WHERE origin = ${`workflow:${workflow}`} ORDER BY id`,
    ),
  };
}

it("a deploy and a release crashed at every transaction boundary, before and after the commit, end right, with nothing done twice", async () => {
  const started = Date.now();
  // Clean runs count each phase's transactions: about 2 per step (begin and send, or wait for the
  // ramdisk to join: found at once, or after registering to be woken by its hello; a step's success
  // is one transaction with the next step's begin, or with the workflow's end) and the
  // reconciler's transition: about 15 for a deploy (6 steps), 13 for a release (5 steps). The wait makes the count vary by a transaction or two, so the fewest of
  // two clean runs is what every crashed run can reach.
  const first = lanes[0]!;
  const counts = { deploy: [] as number[], release: [] as number[] };
  for (let i = 0; i < 4; i++) counts[first.next].push((await run(first)).transactions);
  const clean = { deploy: Math.min(...counts.deploy), release: Math.min(...counts.release) };
  expect(clean.deploy).toBeGreaterThanOrEqual(15);
  expect(clean.release).toBeGreaterThanOrEqual(13);

  const cases: Record<Phase, { at: number; boundary: ChaosBoundary; tries: number }[]> = {
    deploy: BOUNDARIES.flatMap((boundary) => Array.from({ length: clean.deploy }, (_, i) => ({ at: i + 1, boundary, tries: 1 }))),
    release: BOUNDARIES.flatMap((boundary) => Array.from({ length: clean.release }, (_, i) => ({ at: i + 1, boundary, tries: 1 }))),
  };
  const covered: string[] = [];
  const missed: string[] = [];
  let failure: unknown;
  // Each lane takes the next case of the phase its machine is ready for.
  await Promise.all(
    lanes.map(async (lane) => {
      try {
        while (failure === undefined) {
          const phase = lane.next;
          const crash = cases[phase].shift();
          if (!crash) {
            if (cases.deploy.length + cases.release.length === 0) return;
            await run(lane); // none left for this phase: a clean run takes the machine round
            continue;
          }
          const { hit } = await run(lane, crash.at, crash.boundary);
          const name = `${phase}@${crash.at} ${crash.boundary}`;
          if (hit) covered.push(name);
          // The run made fewer transactions than the clean one (an agent was quicker than a
          // poll): not reached, so try again.
          else if (crash.tries < 3) cases[phase].push({ ...crash, tries: crash.tries + 1 });
          else missed.push(name);
        }
      } catch (err) {
        failure ??= err;
      }
    }),
  );
  if (failure !== undefined) throw failure;
  expect(missed, "boundaries no run reached").toEqual([]);
  expect(covered).toHaveLength(2 * (clean.deploy + clean.release));
  console.info(
    `metal chaos: ${covered.length} crashed runs (${clean.deploy} deploy and ${clean.release} release transactions, each before and after its commit) in ${((Date.now() - started) / 1000).toFixed(0)} s`,
  );
}, 300_000);
